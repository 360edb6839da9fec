// Package ledger keeps, in shared memory, the list of counts a process
// holds on segments and pool slots, so that the cleanup daemon can give them
// up when the process dies without doing so itself (SIGKILL, the OOM
// killer).
//
// A ledger is a segment of kind ledger, created by its owner: a file in the
// segment directory under the file_system strategy, so that a daemon started
// after a crash finds it, or a memfd sent to the daemon under the
// file_descriptor strategy, so that nothing is ever left in a file system.
// Its header's creator fields say whose it is. Entries are written with
// plain stores, state last: recording and clearing a count costs no system
// call. The ledger is sparse: its pages are reserved as entries are needed,
// and readers read only the entries reserved so far.
//
// Note [never give up what was not taken]: a count is taken before its entry
// is written, and its entry is cleared before the count is given up or
// handed on, so a process killed in between leaks one count rather than
// making the daemon give up a count that was never there, which could remove
// memory still in use. (The daemon's orphan collection reclaims what leaks.)
// The daemon clears an entry, with a compare-and-swap, before it acts on it,
// so two sweepers never give up one count twice.
package ledger

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// Entry states.
const (
	Free     = plane.LedgerFree
	Creating = plane.LedgerCreating // a segment file being made under temporary name Name, to be renamed Final
	Segment  = plane.LedgerSegment  // one count on segment Name
	Slot     = plane.LedgerSlot     // one count on slot Index (of Generation) of arena Name
)

// Layout of a ledger's data region (the entries' own is the plane's,
// which writes them).
const (
	offCapacity    = 0  // u32 entries reserved so far
	offSweeperPID  = 8  // u32 the process sweeping the ledger, 0 until one does
	offSweeperTime = 16 // u64 its start time
	entriesAt      = plane.LedgerEntriesAt
	entrySize      = plane.LedgerEntrySize
	nameCap        = plane.LedgerNameCap
	firstEntries   = 64                     // reserved when the ledger is made
	MaxEntries     = plane.LedgerMaxEntries // the most counts one ledger records
	// Size is the size of a ledger's data region.
	Size = entriesAt + MaxEntries*entrySize
)

// Entry field offsets, as the plane writes them.
const (
	eState   = plane.LedgerEState    // u32
	eIndex   = plane.LedgerEIndex    // u32 slot index
	eGen     = plane.LedgerEGen      // u32 slot generation
	eNameLen = plane.LedgerENameLen  // u8
	eFinLen  = plane.LedgerEFinalLen // u8
	eDev     = plane.LedgerEDev      // u64 device of a Creating entry's temporary file, once made
	eIno     = plane.LedgerEIno      // u64 its inode, 0 until made
	eName    = plane.LedgerEName
	eFinal   = plane.LedgerEFinal
)

// Ledger is a process's own ledger. It is safe for concurrent use: its
// entries are recorded and dropped by the data plane (plane.Ledger), which
// keeps the free ones, so that the C ABI's calls that never enter Go record
// counts in it too; mu serializes growing it.
type Ledger struct {
	mu       sync.Mutex
	seg      *shm.Segment
	fd       int
	data     []byte
	capacity int // entries reserved; under mu
	c        *plane.Ledger
}

var current atomic.Pointer[Ledger]

// enabling serializes Enable, and holds the process's one plane.Ledger,
// made by the first Enable and moved to each ledger made after a Close:
// a count recorded under an earlier ledger (a light ref of the C ABI, which
// drops its entry in the ledger current when it is released) then drops
// an entry that is still its own, never one that records another count.
var enabling struct {
	sync.Mutex
	c *plane.Ledger
}

// Current returns the process's ledger, or nil when its counts are not
// recorded.
func Current() *Ledger { return current.Load() }

// Enable makes the process's ledger, under the strategy in force, and has
// package shm record in it the counts this process takes from now on. It
// returns the existing ledger when there is one.
func Enable() (*Ledger, error) {
	enabling.Lock()
	defer enabling.Unlock()
	if l := current.Load(); l != nil {
		return l, nil
	}
	seg, fd, err := shm.CreateSparse(header.KindLedger, Size, entriesAt+firstEntries*entrySize)
	if err != nil {
		return nil, fmt.Errorf("create the ledger of this process: %w", err)
	}
	l := &Ledger{seg: seg, fd: fd, data: seg.Data()}
	n := firstEntries
	if enabling.c == nil {
		if enabling.c = plane.NewLedger(l.data, 0); enabling.c == nil {
			return nil, errors.Join(fmt.Errorf("create the ledger of this process: %w", unix.ENOMEM), l.remove())
		}
	} else {
		enabling.c.Move(l.data)
		if n = max(n, enabling.c.Capacity()); n > firstEntries {
			// Out of shared memory, an entry past the reserved ones
			// faults when written: its count goes unrecorded.
			_ = seg.Reserve(fd, uint64(entriesAt+n*entrySize))
		}
	}
	l.c = enabling.c
	l.setCapacity(n)
	current.Store(l)
	plane.SetCurrent(l.c)
	shm.SetTracker(tracker{l})
	return l, nil
}

// setCapacity frees the entries up to n, whose pages are reserved. The
// caller holds mu, or is the ledger's maker.
func (l *Ledger) setCapacity(n int) {
	l.capacity = n
	atomic.StoreUint32(u32(l.data, offCapacity), uint32(n))
	l.c.Grow(n)
}

// Name returns the name of the ledger's segment.
func (l *Ledger) Name() string { return l.seg.Name() }

// FD returns the ledger's file descriptor (a memfd's is sent to the daemon).
func (l *Ledger) FD() int { return l.fd }

// Close stops recording and removes the ledger; the process gave up its
// counts first (it is about to exit).
func (l *Ledger) Close() error {
	enabling.Lock()
	defer enabling.Unlock()
	if !current.CompareAndSwap(l, nil) {
		return nil
	}
	plane.SetCurrent(nil)
	shm.SetTracker(nil)
	return l.remove()
}

func (l *Ledger) remove() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var err error
	if !shm.IsFDName(l.seg.Name()) {
		err = shm.Unlink(l.seg.Name())
	}
	unix.Close(l.fd)
	l.fd = -1
	// The mapping stays: a release racing with Close may still write an
	// entry, and the memory goes with the process.
	return err
}

func u32(d []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&d[off])) }
func u64(d []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&d[off])) }

func entry(d []byte, n int) []byte {
	at := entriesAt + n*entrySize
	return d[at : at+entrySize : at+entrySize]
}

// record writes an entry, state last (plane.Ledger.Record), and returns
// its number, or shm.NoEntry when the ledger is full, the name does not
// fit, or the ledger's memory faulted.
func (l *Ledger) record(state uint32, name, final string, index, gen uint32) int {
	if l == nil || len(name) > nameCap || len(final) > nameCap {
		return shm.NoEntry
	}
	for {
		n := l.c.Record(state, name, final, index, gen)
		if n >= 0 {
			return n
		}
		if n != plane.LedgerFull || !l.Grow() {
			return shm.NoEntry
		}
	}
}

// Grow reserves twice the entries, unless another call did since the
// ledger was last found full, and reports whether there may be one free.
func (l *Ledger) Grow() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c.Free() > 0 {
		return true // grown by another call meanwhile, or an entry dropped
	}
	if l.fd < 0 || l.capacity >= MaxEntries {
		return false
	}
	n := min(2*l.capacity, MaxEntries)
	if l.seg.Reserve(l.fd, uint64(entriesAt+n*entrySize)) != nil {
		return false // out of shared memory: the count goes unrecorded
	}
	l.setCapacity(n)
	return true
}

// HoldSegment records one count on segment name.
func (l *Ledger) HoldSegment(name string) int { return l.record(Segment, name, "", 0, 0) }

// HoldSlot records one count on a slot.
func (l *Ledger) HoldSlot(arena string, index, gen uint32) int {
	return l.record(Slot, arena, "", index, gen)
}

// Plane returns the ledger as the data plane keeps it, for the sequences
// that record or drop an entry in the same call as they move a count
// (Note [a hand-off's steps in one call] in package plane); nil for a nil
// ledger, which records nothing.
func (l *Ledger) Plane() *plane.Ledger {
	if l == nil {
		return nil
	}
	return l.c
}

// Recorded returns the entry that a sequence of the plane recorded for a
// count on a slot: entry itself, or, when the ledger was full, one
// recorded here after growing it (HoldSlot); shm.NoEntry when the count
// went unrecorded.
func (l *Ledger) Recorded(entry int, arena string, index, gen uint32) int {
	switch {
	case entry >= 0:
		return entry
	case entry == plane.LedgerFull:
		return l.HoldSlot(arena, index, gen)
	}
	return shm.NoEntry
}

// Drop clears entry n, before its count is given up or handed on.
func (l *Ledger) Drop(n int) {
	if l == nil || n == shm.NoEntry {
		return
	}
	l.c.Drop(n)
}

// tracker makes a ledger package shm's Tracker.
type tracker struct{ l *Ledger }

func (t tracker) Creating(tmp, final string) int { return t.l.record(Creating, tmp, final, 0, 0) }
func (t tracker) Holding(name string) int        { return t.l.HoldSegment(name) }
func (t tracker) Dropped(n int)                  { t.l.Drop(n) }

func (t tracker) Opened(n int, dev, ino uint64) {
	if n != shm.NoEntry {
		t.l.c.Opened(n, dev, ino)
	}
}

func (t tracker) Created(n int) {
	if n != shm.NoEntry {
		t.l.c.Created(n)
	}
}

// Entry is one record of a ledger, as another process reads it.
type Entry struct {
	Number     int
	State      uint32
	Name       string // the segment, the arena, or the temporary file
	Final      string // Creating: the name the file was to get
	Index, Gen uint32 // Slot
	Dev, Ino   uint64 // Creating: the temporary file, Ino 0 until made
}

// Entries returns the entries of the ledger whose data region is d that are
// not free. The owner may change them while they are read: a reader that
// must be sure of an entry claims it with Take.
func Entries(d []byte) []Entry {
	if len(d) < entriesAt {
		return nil
	}
	n := min(int(atomic.LoadUint32(u32(d, offCapacity))), (len(d)-entriesAt)/entrySize)
	var out []Entry
	for i := range n {
		e := entry(d, i)
		state := atomic.LoadUint32(u32(e, eState))
		if state == Free || state > Slot {
			continue
		}
		out = append(out, Entry{
			Number: i,
			State:  state,
			Name:   string(e[eName : eName+min(int(e[eNameLen]), nameCap)]),
			Final:  string(e[eFinal : eFinal+min(int(e[eFinLen]), nameCap)]),
			Index:  atomic.LoadUint32(u32(e, eIndex)),
			Gen:    atomic.LoadUint32(u32(e, eGen)),
			Dev:    atomic.LoadUint64(u64(e, eDev)),
			Ino:    atomic.LoadUint64(u64(e, eIno)),
		})
	}
	return out
}

// Take clears entry e of the ledger whose data region is d, if it is still
// in the state e was read in, and reports whether this caller did: only the
// one that takes an entry acts on it.
func Take(d []byte, e Entry) bool {
	return atomic.CompareAndSwapUint32(u32(entry(d, e.Number), eState), e.State, Free)
}

// Claim makes self the sweeper of the ledger whose data region is d, unless
// a live process other than self is: two sweepers never sweep one ledger at
// once (and Take keeps them from giving up a count twice even so).
func Claim(d []byte, self proc.Identity) bool {
	pid := u32(d, offSweeperPID)
	for {
		cur := atomic.LoadUint32(pid)
		if cur != 0 && int64(cur) != self.PID {
			other := proc.Identity{PID: int64(cur), StartTime: atomic.LoadUint64(u64(d, offSweeperTime))}
			if !proc.Dead(other) { // alive, or /proc cannot tell
				return false
			}
		}
		if atomic.CompareAndSwapUint32(pid, cur, uint32(self.PID)) {
			atomic.StoreUint64(u64(d, offSweeperTime), self.StartTime)
			return true
		}
	}
}
