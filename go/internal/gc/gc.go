// Package gc finds the library's segments, says who holds each, and removes
// those that no live process holds: the engine of `zctipc ls`, `zctipc gc`
// and the cleanup daemon's recovery.
//
// Who holds a segment is read from three places: the ledgers of live
// processes (package ledger), the messages waiting in live queues, and the
// creator, who counts as a holder while it lives. A segment held by none of
// them is an orphan: its holders died without giving up their counts, in one
// of the short windows that the ledger cannot cover, or they never recorded
// them. Because a process may be between taking a count and recording it,
// an orphan is removed only when two censuses some time apart agree on it,
// with the same file and the same count.
package gc

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/ledger"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// Ages below which a file is left alone even without a holder: a segment
// being made has no valid header yet, and a temporary file lives while its
// pages are reserved, which takes a while for a large one.
const (
	tmpAge     = 10 * time.Second
	invalidAge = 60 * time.Second
)

// Segment is what a census learns of one library file.
type Segment struct {
	Name         string
	Size         int64
	Dev, Ino     uint64
	ModTime      time.Time
	Header       header.Header   // valid when Err is nil
	Err          error           // why the file is not a valid segment
	CreatorAlive bool            // false only when /proc says its creator has exited
	Holders      []proc.Identity // live processes whose ledgers hold it
	Messages     int             // descriptors in live queues that name it
}

// Ledger is a ledger that a census read.
type Ledger struct {
	Name    string
	Owner   proc.Identity
	Alive   bool // false only when /proc says its owner has exited
	Entries []ledger.Entry
}

// Census is a snapshot of the library's files.
type Census struct {
	Segments []Segment
	Ledgers  []Ledger
	Taken    time.Time
	// Held gives, for each queue, the names its messages hold a count on
	// (a name once per count): what its removal gives up.
	Held map[string][]string
}

// Source adds to a census what is not in the segment directory: the cleanup
// daemon's memfd segments and the ledgers it was sent.
type Source struct {
	Names   []string                             // memfd segments to read through the broker
	Ledgers func(func(name string, data []byte)) // calls fn on each ledger it holds
}

// Take reads the segment directory (and src) and returns what it holds.
func Take(src Source) (*Census, error) {
	names, err := shm.List()
	if err != nil {
		return nil, err
	}
	names = append(names, src.Names...)
	c := &Census{Taken: time.Now(), Held: map[string][]string{}}
	byName := map[string]int{}
	for _, name := range names {
		s, ok := stat(name)
		if !ok {
			continue // gone meanwhile
		}
		if s.Err == nil && s.Header.Kind == header.KindLedger {
			if l, ok := readLedger(name, s.Header.Creator); ok {
				c.Ledgers = append(c.Ledgers, l)
			}
		}
		byName[s.Name] = len(c.Segments)
		c.Segments = append(c.Segments, s)
	}
	if src.Ledgers != nil {
		src.Ledgers(func(name string, data []byte) {
			for _, l := range c.Ledgers {
				if l.Name == name {
					return
				}
			}
			var owner proc.Identity
			if i, ok := byName[name]; ok {
				owner = c.Segments[i].Header.Creator
			}
			c.Ledgers = append(c.Ledgers, Ledger{Name: name, Owner: owner, Alive: !proc.Dead(owner), Entries: ledger.Entries(data)})
		})
	}
	// Holders: the entries of live ledgers.
	for _, l := range c.Ledgers {
		if !l.Alive {
			continue
		}
		for _, e := range l.Entries {
			// A Creating entry names the temporary file, held while it
			// is made; a Slot entry names the arena.
			if i, ok := byName[e.Name]; ok {
				c.Segments[i].Holders = append(c.Segments[i].Holders, l.Owner)
			}
		}
	}
	// Messages: the descriptors waiting in queues that someone holds.
	for _, s := range c.Segments {
		if s.Err != nil || s.Header.Kind != header.KindQueue || s.Header.Refcount <= 0 {
			continue
		}
		m, err := shm.Map(s.Name, header.KindQueue)
		if err != nil {
			continue
		}
		// The queue may change while it is read: a torn record only hides
		// messages, which a second census sees.
		_ = queue.Descriptors(m.Data(), func(d *message.Descriptor) error {
			for _, name := range []string{d.Name, d.Ticket.Arena} { // its ticket's arena is held too
				if i, ok := byName[name]; ok {
					c.Segments[i].Messages++
					c.Held[s.Name] = append(c.Held[s.Name], name)
				}
			}
			return nil
		})
		m.Unmap()
	}
	return c, nil
}

// stat reads one file of the census; false when it is gone.
func stat(name string) (Segment, bool) {
	s := Segment{Name: name}
	if strings.HasPrefix(name, shm.TmpPrefix) {
		s.Err = errors.New("a segment being made")
		return s, statFile(&s)
	}
	info, err := shm.Stat(name)
	if errors.Is(err, unix.ENOENT) {
		return s, false
	}
	if !statFile(&s) && !shm.IsFDName(name) {
		return s, false
	}
	if err != nil {
		s.Err = err
		return s, true
	}
	s.Size, s.Header = info.Size, info.Header
	s.CreatorAlive = !proc.Dead(info.Header.Creator)
	if shm.IsFDName(name) {
		s.ModTime = time.Unix(0, info.Header.CreatedNS)
	}
	return s, true
}

// statFile fills in the file's size, identity and time; false when it is
// gone.
func statFile(s *Segment) bool {
	var st unix.Stat_t
	if shm.IsFDName(s.Name) || unix.Lstat(shm.Dir()+"/"+s.Name, &st) != nil {
		return false
	}
	s.Size, s.Dev, s.Ino = st.Size, st.Dev, st.Ino
	s.ModTime = time.Unix(st.Mtim.Unix())
	return true
}

// readLedger reads the entries of ledger name, created by owner.
func readLedger(name string, owner proc.Identity) (Ledger, bool) {
	m, err := shm.Map(name, header.KindLedger)
	if err != nil {
		return Ledger{}, false
	}
	defer m.Unmap()
	return Ledger{Name: name, Owner: owner, Alive: !proc.Dead(owner), Entries: ledger.Entries(m.Data())}, true
}

// Options say what Collect may remove.
type Options struct {
	// DryRun reports what would be removed and removes nothing.
	DryRun bool
	// TrackedOnly leaves alone the segments whose creator kept no ledger:
	// processes that do not record their counts may still hold them.
	TrackedOnly bool
	// Confirm is the time between the two censuses that must agree on an
	// orphan.
	Confirm time.Duration
	// Source adds the daemon's memfd segments and ledgers.
	Source Source
}

// Removal is one file that Collect removed (or would remove).
type Removal struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	Size   int64  `json:"size"`
	Reason string `json:"reason"`
}

// Report says what Collect did.
type Report struct {
	Swept   ledger.Result `json:"swept"`   // counts given up for dead processes
	Ledgers []string      `json:"ledgers"` // ledgers of dead processes, swept and removed
	Removed []Removal     `json:"removed"` // orphans and debris
	Kept    int           `json:"kept"`    // segments left
}

// Collect sweeps the ledgers of dead processes, then removes the segments
// that no live process holds and the debris of creations that died
// half-way. self is the identity that claims ledgers.
func Collect(self proc.Identity, opts Options) (Report, error) {
	var rep Report
	var errs []error
	first, err := Take(opts.Source)
	if err != nil {
		return rep, err
	}
	for _, l := range first.Ledgers {
		if l.Alive {
			continue
		}
		rep.Ledgers = append(rep.Ledgers, l.Name)
		if opts.DryRun {
			continue
		}
		res, err := sweepFile(l.Name, self)
		rep.Swept.Add(res)
		errs = append(errs, err)
	}
	if !opts.DryRun && len(rep.Ledgers) > 0 {
		if first, err = Take(opts.Source); err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
	}
	total := len(first.Segments) - len(first.Ledgers)
	if opts.DryRun {
		// Note [what removed queues held]: the same closure, computed.
		for _, c := range closure(first, opts) {
			rep.Removed = append(rep.Removed, removal(c))
		}
		rep.Kept = total - len(rep.Removed)
		sort.Slice(rep.Removed, func(i, j int) bool { return rep.Removed[i].Name < rep.Removed[j].Name })
		return rep, errors.Join(errs...)
	}
	for round := 0; ; round++ {
		candidates, err := confirmed(first, opts)
		if err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
		drained := false
		for _, c := range candidates {
			removed, err := remove(c.seg)
			if removed {
				rep.Removed = append(rep.Removed, removal(c))
				drained = drained || len(first.Held[c.seg.Name]) > 0
			}
			if err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, err)
			}
		}
		if !drained || round == maxRounds-1 {
			break
		}
		// Note [what removed queues held]: another round.
		next, err := Take(opts.Source)
		if err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
		rep.Removed = append(rep.Removed, goneWith(first, next, candidates)...)
		first = next
	}
	rep.Kept = total - len(rep.Removed)
	sort.Slice(rep.Removed, func(i, j int) bool { return rep.Removed[i].Name < rep.Removed[j].Name })
	return rep, errors.Join(errs...)
}

// Note [what removed queues held]: a queue's messages hold counts on the
// tensors they carry, so a tensor whose creator died is no orphan while a
// queue holds it; removing the queue gives those counts up (its last
// release drains it), and the tensor may then be an orphan, or gone. So a
// collection that removed a queue holding messages takes another census
// and goes on (at most maxRounds rounds), and reports what the drain
// removed as well; a dry run, which removes nothing, computes the same
// closure on its one census: it takes away the messages (and the counts)
// of each queue it would remove, until nothing more would go.

// Threat model: a queue's records are written by any process of the user,
// so Held may name any segment. The real drain gives up a count only for a
// descriptor whose ticket it takes (Note [a count is taken once] in package
// pool), so a forged or replayed record gives up nothing; the dry run's
// closure may then list a segment that the collection keeps, but never
// one that a live process holds (orphanReason still decides). The rounds
// are bounded, whatever the records say.

// maxRounds bounds the rounds of a collection.
const maxRounds = 8

// confirmed returns the orphans of census c that a second census, opts.Confirm
// later, agrees on (all of them when opts.Confirm is zero).
func confirmed(c *Census, opts Options) ([]candidate, error) {
	candidates := orphans(c, opts)
	if opts.Confirm <= 0 || len(candidates) == 0 {
		return candidates, nil
	}
	time.Sleep(opts.Confirm)
	second, err := Take(opts.Source)
	if err != nil {
		return nil, err
	}
	again := map[string]candidate{}
	for _, c := range orphans(second, opts) {
		again[c.seg.Name] = c
	}
	out := candidates[:0]
	for _, c := range candidates {
		if o, ok := again[c.seg.Name]; ok && o.seg.Ino == c.seg.Ino && o.seg.Header.Refcount == c.seg.Header.Refcount {
			out = append(out, c)
		}
	}
	return out, nil
}

// goneWith returns, as removals, the segments of census before that the
// queues removed (of candidates) held and that census after no longer
// has: their last count went with the drain.
func goneWith(before, after *Census, candidates []candidate) []Removal {
	present := map[string]bool{}
	for _, s := range after.Segments {
		present[s.Name] = true
	}
	listed := map[string]bool{}
	for _, c := range candidates {
		listed[c.seg.Name] = true
	}
	var out []Removal
	for _, c := range candidates {
		for _, name := range before.Held[c.seg.Name] {
			if present[name] || listed[name] {
				continue
			}
			listed[name] = true
			for _, s := range before.Segments {
				if s.Name == name {
					out = append(out, removal(candidate{s, drainedReason}))
				}
			}
		}
	}
	return out
}

const drainedReason = "its last count was held by a message of a removed queue"

// closure returns what a collection would remove on census c: its
// orphans, then what the removed queues' messages held that becomes an
// orphan, or loses its last count, without them (Note [what removed
// queues held]).
func closure(c *Census, opts Options) []candidate {
	out := orphans(c, opts)
	gone := map[string]bool{}
	var queue []string
	for _, o := range out {
		gone[o.seg.Name] = true
		queue = append(queue, o.seg.Name)
	}
	byName := map[string]int{}
	segs := slices.Clone(c.Segments)
	for i, s := range segs {
		byName[s.Name] = i
	}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		for _, held := range c.Held[name] {
			i, ok := byName[held]
			if !ok || gone[held] {
				continue
			}
			s := &segs[i]
			s.Messages--
			s.Header.Refcount--
			reason := ""
			if s.Header.Refcount <= 0 {
				reason = drainedReason
			} else if s.Messages <= 0 {
				reason = orphanReason(c, *s, opts)
			}
			if reason != "" {
				gone[held] = true
				out = append(out, candidate{*s, reason})
				queue = append(queue, held)
			}
		}
	}
	return out
}

// removal describes candidate c as a Removal.
func removal(c candidate) Removal {
	kind := "file"
	if c.seg.Err == nil {
		kind = c.seg.Header.Kind.String()
	}
	return Removal{Name: c.seg.Name, Kind: kind, Size: c.seg.Size, Reason: c.reason}
}

type candidate struct {
	seg    Segment
	reason string
}

// orphans returns the files of census c that no live process holds, with
// the reason.
func orphans(c *Census, opts Options) []candidate {
	var out []candidate
	for _, s := range c.Segments {
		if reason := orphanReason(c, s, opts); reason != "" {
			out = append(out, candidate{s, reason})
		}
	}
	return out
}

// orphanReason says why s may be removed, or "" when it may not.
func orphanReason(c *Census, s Segment, opts Options) string {
	age := c.Taken.Sub(s.ModTime)
	switch {
	case len(s.Holders) > 0:
		return ""
	case strings.HasPrefix(s.Name, shm.TmpPrefix):
		if age < tmpAge {
			return ""
		}
		return "a segment whose creator died while making it"
	case s.Err != nil:
		if age < invalidAge || shm.IsFDName(s.Name) {
			return ""
		}
		return fmt.Sprintf("not a valid segment (%v)", s.Err)
	case s.Header.Kind == header.KindLedger:
		return "" // swept first, or alive
	case s.Header.Refcount <= 0:
		return "its count reached zero but it was not removed"
	case s.CreatorAlive:
		return ""
	case s.Messages > 0:
		return ""
	case opts.TrackedOnly && !s.Header.Tracked:
		return ""
	}
	return fmt.Sprintf("no live holder (creator pid %d exited, refcount %d)", s.Header.Creator.PID, s.Header.Refcount)
}

// remove removes an orphan, if it is still the file the census saw.
func remove(s Segment) (bool, error) {
	if s.Err != nil {
		var st unix.Stat_t
		path := shm.Dir() + "/" + s.Name
		if unix.Lstat(path, &st) != nil || st.Ino != s.Ino {
			return false, nil
		}
		if err := unix.Unlink(path); err != nil {
			return false, fmt.Errorf("remove %q: %w", s.Name, err)
		}
		return true, nil
	}
	if shm.IsFDName(s.Name) {
		return shm.Reclaim(s.Name, 0, s.Header.Refcount)
	}
	return shm.Reclaim(s.Name, s.Ino, s.Header.Refcount)
}

// sweepFile claims and sweeps the ledger file name of a dead process, then
// removes it.
func sweepFile(name string, self proc.Identity) (ledger.Result, error) {
	m, err := shm.Map(name, header.KindLedger)
	if errors.Is(err, unix.ENOENT) {
		return ledger.Result{}, nil
	}
	if err != nil {
		return ledger.Result{}, err
	}
	defer m.Unmap()
	if !proc.Dead(m.Header().Creator) || !ledger.Claim(m.Data(), self) {
		return ledger.Result{}, nil
	}
	res, err := ledger.Sweep(m.Data())
	if uerr := shm.Unlink(name); uerr != nil && !errors.Is(uerr, unix.ENOENT) {
		err = errors.Join(err, uerr)
	}
	return res, err
}

// SweepLedger claims and sweeps the ledger of a dead process whose data the
// caller maps (a memfd ledger sent to the daemon).
func SweepLedger(data []byte, self proc.Identity) (ledger.Result, error) {
	if !ledger.Claim(data, self) {
		return ledger.Result{}, nil
	}
	return ledger.Sweep(data)
}
