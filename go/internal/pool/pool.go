// Package pool allocates tensor buffers from arenas of shared memory, so that
// allocating and freeing a buffer in the steady state makes no system call
// and touches no new page.
//
// A Pool belongs to one process, which alone allocates from it. Its arenas
// are segments of kind arena, each cut into slots of one size class (quarter
// steps between powers of two, from 64 bytes to 3.5 GiB). Slots are handed
// out from a lock-free free stack in the arena; any process may free one,
// when the slot's cross-process refcount reaches zero, by pushing it back.
//
// Lifetime: the owner holds a count on each of its arenas, and every slot
// that is out of the free stack pins its arena with one more, so an arena
// outlives its owner as long as one of its slots is in use anywhere. Other
// processes map an arena once, without a count, when they first receive one
// of its slots, keep it mapped, and unmap it when its count reaches zero.
//
// The pool grows by adding arenas, up to a limit in bytes; at the limit it
// frees arenas with no slot in use, and an allocation waits for a slot to
// be freed, or fails (see Note [live bytes decide] for when it may). It fails at once when waiting cannot help: a buffer
// whose arena alone is larger than the limit, or a shared-memory file
// system too full for a new arena when no slot of the buffer's class is in
// use to come back.
package pool

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// Size classes.
const (
	minShift = 6
	maxShift = 31
	// NumClasses is the number of size classes.
	NumClasses = (maxShift - minShift + 1) * 4
)

// ClassSize returns the slot size of class c: 2^k times 1, 1.25, 1.5 or 1.75.
func ClassSize(c int) uint64 {
	return uint64(4+c%4) << (minShift + c/4) >> 2
}

// MaxSize is the size of the largest class; larger buffers need a segment of
// their own.
var MaxSize = ClassSize(NumClasses - 1)

// ClassOf returns the smallest class whose slots hold n bytes, and false when
// n is larger than MaxSize.
func ClassOf(n uint64) (int, bool) {
	if n <= 1<<minShift {
		return 0, true
	}
	if n > MaxSize {
		return 0, false
	}
	// n is in (2^(k-1), 2^k]: the classes of 2^(k-1) cover it.
	k := bits.Len64(n - 1)
	for c := (k - 1 - minShift) * 4; ; c++ {
		if ClassSize(c) >= n {
			return c, true
		}
	}
}

// Errors an allocation returns.
var (
	// ErrFull means the pool is at its limit and no slot was freed before
	// the deadline; one may be freed later.
	ErrFull = fmt.Errorf("pool is full: %w", shm.ErrOutOfSharedMemory)
	// ErrNoRoom means waiting cannot help: the buffer's arena is larger than
	// the pool's limit, or the shared-memory file system is full and no slot
	// of the class is in use to come back.
	ErrNoRoom = fmt.Errorf("no room for the buffer: %w", shm.ErrOutOfSharedMemory)
	// ErrTooLarge means the buffer is larger than the largest class.
	ErrTooLarge = fmt.Errorf("buffer is larger than the largest pool class: %w", unix.EINVAL)
	// ErrStale means a slot was freed, or handed out again, since the
	// reference to it was made.
	ErrStale = errors.New("stale slot reference")
)

// LimitEnv names the environment variable that sets the default limit of a
// pool: bytes, or a size with a unit (ParseSize); empty is unset. A value that
// is not a size is refused by every allocation, with the variable's name,
// until SetLimit.
// Note: the environment is the process's own (whoever starts it may set it);
// a typo must never be ignored silently, which left the default in force.
const LimitEnv = "ZCTIPC_POOL_LIMIT"

// Layout of an arena's data region.
const (
	offSlotSize = 0  // u64 bytes per slot
	offNSlots   = 8  // u32 slots
	offClass    = 12 // u32 size class
	offSlotsAt  = 16 // u64 where the slots start
	offPurpose  = 24 // u32 what the slots hold: purposeBuffers or purposeTickets
	// The words of the slot protocol, whose steps are the data plane's.
	offFreeHead  = plane.ArenaFreeHead  // u64: generation << 32 | (index + 1) of the first free slot
	offFreeSeq   = plane.ArenaFreeSeq   // u32 futex word, bumped on every free
	offWaiters   = plane.ArenaWaiters   // u32 owners waiting for a free slot
	offFreeCount = plane.ArenaFreeCount // i64 slots in the free stack
	offSlotTable = plane.ArenaSlotTable // nslots × slotMeta bytes
	slotMeta     = plane.SlotMeta       // i64 refcount, u32 next free (index + 1, 0 for none), u32 generation
	maxSlots     = 1 << 20
	arenaBytes   = 4 << 20  // the first arena of a class holds about this much
	arenaMax     = 64 << 20 // later ones double up to this
	// fallbackLimit is the pool limit when the file system cannot be asked.
	fallbackLimit = 4 << 30
)

// An arena's purpose (Note [a ticket arena is not a buffer's]).
const (
	purposeBuffers = 0 // the slots are buffers
	purposeTickets = 1 // the slots are tickets (ticket.go)
)

// memory is an arena's segment: counted (the owner's) or only mapped.
type memory interface {
	Name() string
	Data() []byte
	AddRef() (int64, error)
	DropRef() (int64, error)
	Count() int64 // the segment's refcount now
	Unmap() error // gives up the mapping (and a count this process held)
	// RefcountWord is the count's word, mapped until Unmap, for the C
	// ABI's steps (Note [a ref made outside Go] in its handoff.c).
	RefcountWord() *int64
}

// owned is an arena segment this process created and counts on.
type owned struct{ *shm.Segment }

func (o owned) Count() int64 {
	n, err := o.Refcount()
	if err != nil {
		return 0
	}
	return n
}

func (o owned) Unmap() error { return o.Close() }

// Arena is one arena segment mapped in this process. It is safe for
// concurrent use: slots are taken and freed with atomic operations.
type Arena struct {
	mem      memory
	data     []byte
	base     uintptr      // address of data[0]
	view     plane.Arena  // its layout, for the slot protocol's steps (Note [a pool slot's steps in the plane])
	listed   plane.Listed // its entry in the C ABI's table of mapped arenas, while in the index
	slotSize uint64
	nslots   uint32
	class    int
	slotsAt  uint64
	tickets  bool // its slots are tickets, not buffers
	owned    bool
	closed   bool // out of the index, about to be unmapped; guarded by index
	// reservedTo is where the reserved pages of the data end (Note [slots
	// reserved when first used]); written by the owner, under its pool's mu.
	reservedTo atomic.Uint64
}

func (a *Arena) u64(off uint64) *uint64 { return (*uint64)(unsafe.Pointer(&a.data[off])) }
func (a *Arena) u32(off uint64) *uint32 { return (*uint32)(unsafe.Pointer(&a.data[off])) }
func (a *Arena) i64(off uint64) *int64  { return (*int64)(unsafe.Pointer(&a.data[off])) }

func (a *Arena) refcount(i uint32) *int64 { return a.i64(offSlotTable + uint64(i)*slotMeta) }
func (a *Arena) next(i uint32) *uint32    { return a.u32(offSlotTable + uint64(i)*slotMeta + 8) }
func (a *Arena) gen(i uint32) *uint32     { return a.u32(offSlotTable + uint64(i)*slotMeta + 12) }

// Name returns the name of the arena's segment.
func (a *Arena) Name() string { return a.mem.Name() }

// SlotData returns the bytes of slot i.
func (a *Arena) SlotData(i uint32) []byte {
	at := a.slotsAt + uint64(i)*a.slotSize
	return a.data[at : at+a.slotSize : at+a.slotSize]
}

// The slot protocol's steps on shared memory are the data plane's, in C
// (package plane, Note [a pool slot's steps in the plane]): package pool
// runs them through cgo, and the C ABI may run the same code without
// entering Go. A fault on the arena's memory (its file shrunk by another
// process) is then an error of the step, wrapping fault.ErrFault, rather
// than a panic in Go.

// pop takes a slot off the free stack.
func (a *Arena) pop() (uint32, bool, error) {
	i, ok, err := a.view.Pop()
	if err != nil {
		return 0, false, fmt.Errorf("arena %q: %w", a.Name(), err)
	}
	return i, ok, nil
}

// push puts slot i back on the free stack and wakes the owners waiting
// for a slot.
func (a *Arena) push(i uint32) error {
	if _, err := a.view.Push(i); err != nil {
		return fmt.Errorf("slot %d of arena %q: %w", i, a.Name(), err)
	}
	return nil
}

// Note [slots reserved when first used]: the kernel zeroes a page when it
// is reserved, which costs more than the bytes then copied into it, and a
// class's arenas grow by doubling: a state dict of 98 tensors (34 MB) made
// arenas of 102 MB, all reserved when made, and 38 ms of its first put's
// 54 went there. So an arena of several buffer slots reserves, when it is
// made, only its header and slot table, and the owner reserves a slot's
// pages (those of small slots lazyStep at a time) when it first hands the
// slot out; the pages a pool holds are then those of the slots it used,
// and a file system too full for them is the pool's out of memory, as for
// a new arena (tryAlloc). Only the owner hands slots out, under its pool's
// mu, so a high-water mark (reservedTo) says what is reserved, and a slot
// freed goes back on top of the free stack, above the slots never used.
// Other processes touch a slot's pages only while it is in use. A ticket
// arena is reserved whole when made (a take writes the first word of a
// ticket a descriptor names, which a stale or forged descriptor may name
// before it was ever handed out), as is an arena of one slot, and every
// arena on a kernel that cannot reserve pages on demand (before 5.14).

// lazyStep is the least an arena reserves at once after its table.
const lazyStep = 64 << 10

// slotEnd returns where slot i ends in the arena's data.
func (a *Arena) slotEnd(i uint32) uint64 { return a.slotsAt + (uint64(i)+1)*a.slotSize }

// topReserved reports whether the slot on top of the free stack has its
// pages reserved (Note [slots reserved when first used]).
func (a *Arena) topReserved() bool {
	top := uint32(atomic.LoadUint64(a.u64(offFreeHead)))
	return top != 0 && top <= a.nslots && a.slotEnd(top-1) <= a.reservedTo.Load()
}

// noPages is the error of a slot whose pages the file system had no room
// for (Note [slots reserved when first used]).
type noPages struct{ err error }

func (e noPages) Error() string { return e.err.Error() }
func (e noPages) Unwrap() error { return e.err }

// reserve reserves the pages of slot i, and of the slots before it, if
// they are not yet (Note [slots reserved when first used]).
func (a *Arena) reserve(i uint32) error {
	end, reserved := a.slotEnd(i), a.reservedTo.Load()
	if end <= reserved {
		return nil
	}
	upTo := min(max(end, reserved+lazyStep), uint64(len(a.data)))
	if err := shm.ReservePagesOf(a.Name(), a.data[reserved:upTo]); err != nil {
		// Pages it reserved before it failed stay reserved, unclaimed,
		// until the arena goes: a slot taken later reserves them again.
		return noPages{err}
	}
	a.reservedTo.Store(upTo)
	return nil
}

// take allocates a slot: off the free stack, its pages reserved, a new
// generation, a count of one, and a pin on the arena; a ticket's word zero
// (Note [a count is taken once]). The steps are one call of the plane's
// (zp_pool_take) while the slot's pages are reserved already.
func (a *Arena) take() (Slot, bool, error) {
	i, g, r, err := a.view.Take(a.mem.RefcountWord(), a.reservedTo.Load(), a.tickets)
	switch {
	case err != nil && i == math.MaxUint32:
		return Slot{}, false, fmt.Errorf("arena %q: %w", a.Name(), err)
	case err != nil:
		// The memory faulted: the slot stays out of the stack, whose
		// words are gone with the file.
		return Slot{}, false, fmt.Errorf("slot %d of arena %q: %w", i, a.Name(), err)
	case r == plane.OK:
		return Slot{arena: a, Index: i, Generation: g}, true, nil
	case r == plane.PoolReserve:
		return a.handOut(i)
	case r == plane.PoolUnpinned:
		return a.pinned(i, g)
	}
	return Slot{}, false, nil // the stack is empty
}

// handOut hands out slot i, popped and not yet reserved, as take does.
func (a *Arena) handOut(i uint32) (Slot, bool, error) {
	if err := a.reserve(i); err != nil {
		return Slot{}, false, errors.Join(err, a.push(i))
	}
	g, _, err := a.view.HandOut(i) // i is below nslots: the stack gave it
	if err != nil {
		return Slot{}, false, fmt.Errorf("slot %d of arena %q: %w", i, a.Name(), err)
	}
	return a.pinned(i, g)
}

// pinned pins the arena for slot i, handed out as generation g, or gives
// the slot back when its segment is going.
func (a *Arena) pinned(i, g uint32) (Slot, bool, error) {
	if _, err := a.mem.AddRef(); err != nil {
		return Slot{}, false, errors.Join(err, a.push(i))
	}
	if a.tickets {
		if _, err := a.view.ArmTicket(i, 0); err != nil { // a slot keeps the bytes it had
			s := Slot{arena: a, Index: i, Generation: g}
			return Slot{}, false, errors.Join(fmt.Errorf("ticket %d of arena %q: %w", i, a.Name(), err), s.Release())
		}
	}
	return Slot{arena: a, Index: i, Generation: g}, true, nil
}

// inUse returns the number of slots out of the free stack.
func (a *Arena) inUse() int64 {
	return int64(a.nslots) - atomic.LoadInt64(a.i64(offFreeCount))
}

// Slot is one count on a slot of an arena: the holder releases it, or hands
// it on, once. It is a value: copies name the same count.
type Slot struct {
	arena      *Arena
	Index      uint32
	Generation uint32
}

// Arena returns the arena of s.
func (s Slot) Arena() *Arena { return s.arena }

// Data returns the bytes of the slot.
func (s Slot) Data() []byte { return s.arena.SlotData(s.Index) }

// Holders returns the slot's count: how many holders it has, anywhere.
func (s Slot) Holders() int64 { return atomic.LoadInt64(s.arena.refcount(s.Index)) }

// addRefRaced, when set (by tests), runs in AddRef between its check of
// the generation and its compare-and-swap of the count: the C step waits
// there (plane.ParkAddRef) while it runs.
var addRefRaced func()

// AddRef adds a count to the slot, which must still be the generation s was
// made for, and returns a Slot for the new count.
//
// Note [a count for one generation]: the count and the generation are two
// words, so the slot can be released and handed out again between the
// check of the generation and the compare-and-swap of the count: the count
// would then be added to the new generation's buffer, which its new owner
// would find held by a stranger. The generation is read again after the
// count is added; when it moved, the count added is the new generation's,
// and it is given back as any holder of it would give it back (the last
// one frees the slot), and AddRef fails with ErrStale. The check, the
// compare-and-swap and the second read are one step of the data plane
// (zp_pool_add_ref), which says which generation the count landed on;
// giving a stale one back is Release.
//
// Threat model: any process of the user may call AddRef with a Slot made
// from a descriptor it read (a stale or replayed one included). What must
// never happen is a count that outlives its check: a count on a
// generation other than s.Generation, or a slot revived from zero.
func (s Slot) AddRef() (Slot, error) {
	if raced := addRefRaced; raced != nil {
		return s.addRefRacing(raced)
	}
	return s.addRef()
}

func (s Slot) addRef() (Slot, error) {
	a := s.arena
	g, r, err := a.view.AddRef(s.Index, s.Generation)
	switch {
	case err != nil:
		return Slot{}, fmt.Errorf("slot %d of arena %q: %w", s.Index, a.Name(), err)
	case r == plane.PoolMoved:
		// The count is generation g's (Note [a count for one generation]).
		err := Slot{arena: a, Index: s.Index, Generation: g}.Release()
		return Slot{}, errors.Join(fmt.Errorf("slot %d of arena %q was handed out again: %w", s.Index, a.Name(), ErrStale), err)
	case r != plane.OK: // stale, or a slot past the arena (Range), which no Slot made here names
		return Slot{}, fmt.Errorf("slot %d of arena %q: %w", s.Index, a.Name(), ErrStale)
	}
	return s, nil
}

// addRefRacing is AddRef with raced run while its step waits between its
// check and its compare-and-swap (tests: addRefRaced).
func (s Slot) addRefRacing(raced func()) (Slot, error) {
	plane.ParkAddRef(s.arena.refcount(s.Index))
	type result struct {
		s   Slot
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := s.addRef()
		done <- result{got, err}
	}()
	for !plane.AddRefParked() {
		select {
		case r := <-done: // its check failed: it never came to the exchange
			plane.ResumeAddRef()
			return r.s, r.err
		default:
			time.Sleep(time.Millisecond)
		}
	}
	raced()
	plane.ResumeAddRef()
	r := <-done
	return r.s, r.err
}

// Release gives up the count. The last one frees the slot and unpins its
// arena, which is removed when nothing else holds it.
func (s Slot) Release() error { return s.ReleaseRecorded(nil, shm.NoEntry) }

// ReleaseRecorded is Release of a count that ledger entry entry of l
// records: the entry is dropped first, in the same call into the plane
// (zp_slot_release).
func (s Slot) ReleaseRecorded(l *plane.Ledger, entry int) error {
	a := s.arena
	unpin, r, err := a.view.ReleaseRecorded(a.mem.RefcountWord(), s.Index, l, entry)
	switch {
	case err != nil:
		return fmt.Errorf("slot %d of arena %q: %w", s.Index, a.Name(), err)
	case r != plane.OK: // stale, or a slot past the arena (Range), which no Slot made here names
		return fmt.Errorf("slot %d of arena %q released more often than held: %w", s.Index, a.Name(), ErrStale)
	case !unpin:
		return nil
	}
	// The step pushed the slot back on the free stack, and its pin on the
	// arena may be the last: Go's to give up, which removes the segment.
	_, err = a.mem.DropRef()
	return err
}

// Note [live bytes decide]: an arena of several slots stays while one of
// its slots is in use, so one small buffer can pin megabytes that no other
// class can use; with a hundred classes, what a pool held in the past,
// rather than what it holds now, would decide whether an allocation fits
// (a pool at a 128 MiB limit refused buffers with 25 MiB live). So the
// arenas of several slots together hold at most a quarter of the limit
// (slabShare); past that, a buffer gets an arena of one slot, which goes
// as soon as the buffer is freed and the room is needed: before it fails,
// an allocation frees every arena with no slot in use and tries again.
// Hence the bound: an allocation of n bytes does not fail for want of room
// while limit/4 + the sum, over the buffers in use and the request, of
// (ClassSize(ClassOf(size)) + SlotOverhead) is at most the limit; a class
// size is less than 1.25 times the bytes asked (and at least 64).

// Threat model: only the owner allocates, under p.mu, so the bound holds
// against anything its own callers do; another process of the user can
// hold a slot for ever (its arena then stays, as the bound counts it) or
// write the arena's free stack (then a slot may be refused or handed out
// twice, as any write into the user's memory can do). What must never
// happen is the pool growing past its limit: every arena made is counted
// in reserved before it is used.

// slabShare is the part of the limit that arenas of several slots may
// hold together: limit / slabShare.
const slabShare = 4

// SlotOverhead bounds the bookkeeping of an arena of one slot beyond the
// slot: its slot table, rounded to a page (Note [live bytes decide]).
const SlotOverhead = 4096

// Pool is the allocator of one process. It is safe for concurrent use.
type Pool struct {
	mu       sync.Mutex
	arenas   [NumClasses][]*Arena
	limit    uint64
	reserved uint64
	limitErr error  // why the limit the environment gave was refused; every Alloc returns it until SetLimit
	slabs    uint64 // bytes of arenas of several slots, part of reserved
	first    uint64 // the bytes of a class's first arena; 0: arenaBytes
	tickets  bool   // a pool of tickets (ticket.go), whose arenas say so
}

var (
	defaultPool     *Pool
	defaultPoolOnce sync.Once
)

// New returns an empty pool that may hold limit bytes of arenas.
func New(limit uint64) *Pool { return &Pool{limit: limit} }

// Default returns the process's pool, limited by $ZCTIPC_POOL_LIMIT or to
// half of the shared-memory file system.
func Default() *Pool {
	defaultPoolOnce.Do(func() {
		limit := uint64(fallbackLimit)
		var fs unix.Statfs_t
		if unix.Statfs(shm.Dir(), &fs) == nil {
			limit = fs.Blocks * uint64(fs.Bsize) / 2
		}
		var limitErr error
		// Empty means unset, as an empty PYTHON* variable does: what
		// ZCTIPC_POOL_LIMIT=$UNSET leaves is no limit given, not a typo.
		if v := os.Getenv(LimitEnv); strings.TrimSpace(v) != "" {
			if n, err := ParseSize(v); err == nil {
				limit = n
			} else {
				limitErr = fmt.Errorf("%s=%q: %w", LimitEnv, v, err)
			}
		}
		defaultPool = New(limit)
		defaultPool.limitErr = limitErr
	})
	return defaultPool
}

// sizeUnits are the units ParseSize takes, in bytes: binary, as Docker's
// --shm-size and the kernel's size= mount option read them.
var sizeUnits = map[string]uint64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}

// ParseSize reads a size in bytes: a whole number of bytes, or a number
// (a fraction too, rounded down to whole bytes) with a unit K, M, G or T
// (or KiB, MiB, GiB, TiB; KB... read the same; any case), as in "512M" or
// "1.5GiB". Anything else is unix.EINVAL.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(t)
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := sizeUnits[unit]
	if !ok || num == "" {
		return 0, fmt.Errorf("not a size (bytes, or a number with K, M, G or T, or KiB, MiB, GiB or TiB): %w", unix.EINVAL)
	}
	if n, err := strconv.ParseUint(num, 10, 64); err == nil {
		if n > math.MaxUint64/mult {
			return 0, fmt.Errorf("a size past 2^64 bytes: %w", unix.EINVAL)
		}
		return n * mult, nil
	}
	// A fraction is of a unit: a byte count is whole ("0.5" is not a size,
	// where it read as 0 bytes, a limit that refuses every buffer).
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || f < 0 || mult == 1 {
		return 0, fmt.Errorf("not a size (bytes, or a number with K, M, G or T, or KiB, MiB, GiB or TiB): %w", unix.EINVAL)
	}
	bytes := f * float64(mult)
	if bytes >= math.MaxUint64 {
		return 0, fmt.Errorf("a size past 2^64 bytes: %w", unix.EINVAL)
	}
	return uint64(bytes), nil
}

// Close gives up the pool's arenas: each goes when the last of its slots in
// use (here or anywhere) is released. Until then this process keeps them
// mapped, as it keeps other processes' arenas. The pool must not allocate
// afterwards.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for c := range p.arenas {
		for _, a := range p.arenas[c] {
			if err := a.mem.(owned).Release(); err != nil {
				errs = append(errs, err)
			}
			retire(a)
		}
		p.arenas[c] = nil
	}
	p.reserved, p.slabs = 0, 0
	return errors.Join(errs...)
}

// Trim gives back the arenas of the pool with no slot in use, here or
// anywhere: their pages go back to the file system, and the next buffers
// of their classes are made in new ones.
func (p *Pool) Trim() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.trim(math.MaxUint64)
}

// SetLimit sets the most bytes of arenas the pool may hold. A limit below
// what the pool holds frees its idle arenas now, and the others as their
// buffers are freed (at the next allocation), until it holds no more.
func (p *Pool) SetLimit(limit uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limit = limit
	p.limitErr = nil
	if err := p.trim(0); err != nil {
		fmt.Fprintln(os.Stderr, "zctipc:", err)
	}
}

// Stats describes a pool.
type Stats struct {
	Arenas      int
	Reserved    uint64 // bytes of arena segments
	Limit       uint64
	SlotsInUse  int64 // slots out of the free stacks: held here or anywhere
	BytesInUse  uint64
	SlotsByName map[string]int64 // arena name to slots in use
}

// Stats returns a snapshot of the pool.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Stats{Limit: p.limit, Reserved: p.reserved, SlotsByName: map[string]int64{}}
	for c := range p.arenas {
		for _, a := range p.arenas[c] {
			n := a.inUse()
			st.Arenas++
			st.SlotsInUse += n
			st.BytesInUse += uint64(n) * a.slotSize
			st.SlotsByName[a.Name()] = n
		}
	}
	return st
}

// Alloc returns a slot of at least n bytes, with a count of one. When the
// pool is full it waits for a slot to be freed until deadline (not at all
// when deadline is in the past; forever when it is zero), then returns
// ErrFull. When waiting cannot help it returns ErrNoRoom at once. The slot
// keeps the bytes it had: it is not zeroed.
func (p *Pool) Alloc(n uint64, deadline time.Time) (Slot, error) {
	return p.AllocLeaving(n, 0, deadline)
}

// Note [leaving room]: a sender that can send a buffer's bytes another
// way when the pool has none (pickled inside its message, which a zctipc
// queue carries in its ring, in the same file system) must not take the
// file system's last pages for its buffers: a receiver that keeps what
// it got (a list of results) would then hold them all, and the message
// that carries the next buffer's bytes in band would find no room, for
// ever. So such a sender asks for a buffer leaving room: a slot whose
// pages are reserved is always its to take, but new pages (a slot never
// used, or a new arena) only while leave bytes stay free in the file
// system besides them. Under the file_descriptor strategy the pool's
// arenas are memfds, outside the directory, and leave is not looked at.

// AllocLeaving is Alloc for a slot that takes new pages of the file system
// only while leave bytes stay free there (Note [leaving room]); without
// them it returns ErrFull when a slot of the class is in use (it comes
// back with its pages), else ErrNoRoom. Alloc is AllocLeaving with leave 0.
func (p *Pool) AllocLeaving(n, leave uint64, deadline time.Time) (Slot, error) {
	c, ok := ClassOf(n)
	if !ok {
		return Slot{}, fmt.Errorf("%d bytes: %w", n, ErrTooLarge)
	}
	for {
		s, waitOn, err := p.tryAlloc(c, leave)
		if err == nil || !errors.Is(err, ErrFull) {
			return s, err
		}
		wait := 10 * time.Millisecond
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return Slot{}, err
			}
			wait = min(wait, left)
		}
		if waitOn == nil {
			time.Sleep(wait)
			continue
		}
		// Counted as every sleeper is, so that a count another process
		// forged neither wraps round to 0 (a lost wake-up) nor below it.
		freed := futex.Seq{Word: waitOn.u32(offFreeSeq), Waiters: waitOn.u32(offWaiters)}
		seen := freed.Arm()
		if !waitOn.topReserved() { // a slot never used may be free: it is not the one waited for
			if werr := futex.Wait(freed.Word, seen, wait); werr != nil && !errors.Is(werr, futex.ErrTimeout) && !errors.Is(werr, futex.ErrInterrupted) {
				freed.Disarm()
				return Slot{}, werr
			}
		}
		freed.Disarm()
	}
}

// tryAlloc takes a slot of class c from an arena, or a new arena. When the
// pool is full it returns ErrFull and the arena whose frees to wait for.
func (p *Pool) tryAlloc(c int, leave uint64) (Slot, *Arena, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.limitErr != nil {
		return Slot{}, nil, p.limitErr
	}
	if p.reserved > p.limit {
		// The limit was lowered below what the pool held: the arenas
		// idle since go before any is used again.
		if err := p.trim(0); err != nil {
			return Slot{}, nil, err
		}
	}
	s, waitOn, err := p.takeOrGrow(c, leave)
	var short noPages
	if !errors.As(err, &short) {
		return s, waitOn, err
	}
	// No room for a slot's pages (Note [slots reserved when first used]),
	// or not leaving enough (Note [leaving room]): give back the idle
	// arenas, as grow does, and look again.
	before := p.reserved
	if terr := p.trim(math.MaxUint64); terr != nil {
		return Slot{}, nil, errors.Join(err, terr)
	}
	if p.reserved < before {
		if s, waitOn, err = p.takeOrGrow(c, leave); !errors.As(err, &short) {
			return s, waitOn, err
		}
	}
	return Slot{}, p.last(c), p.noRoom(c, short.err)
}

// noRoom is the error of a slot of class c that found no room in the file
// system (why says how): ErrFull when a slot of the class is in use (it
// comes back with its pages), else ErrNoRoom. The caller holds p.mu.
func (p *Pool) noRoom(c int, why error) error {
	if p.classInUse(c) {
		return fmt.Errorf("%w: %w", ErrFull, why)
	}
	return fmt.Errorf("%w: nothing this pool holds can free more: %w", ErrNoRoom, why)
}

// leaves reports whether the file system has n bytes free and leave more
// (Note [leaving room]).
func leaves(n, leave uint64) bool {
	if leave == 0 || shm.CurrentStrategy() == shm.FileDescriptor {
		return true
	}
	var fs unix.Statfs_t
	if unix.Statfs(shm.Dir(), &fs) != nil {
		return true // the file system says when it is full
	}
	// Not n+leave >= ...: a leave near 2^64 (all of it, say) wraps the sum
	// round to a small number, which left room for anything.
	free := fs.Bavail * uint64(fs.Bsize)
	return free >= n && free-n >= leave
}

// takeOrGrow takes a slot of class c from an arena, first of those whose
// pages are reserved (Note [slots reserved when first used]), or from a
// new arena, while leave bytes stay free (Note [leaving room]); as
// tryAlloc, and noPages when a slot's pages had no room. The caller holds
// p.mu.
func (p *Pool) takeOrGrow(c int, leave uint64) (Slot, *Arena, error) {
	for _, reserved := range [2]bool{true, false} {
		if !reserved && !leaves(ClassSize(c), leave) {
			return Slot{}, nil, noPages{fmt.Errorf("%w: a %s buffer would leave less than %s free in %s",
				shm.ErrOutOfSharedMemory, shm.FormatBytes(ClassSize(c)), shm.FormatBytes(leave), shm.Dir())}
		}
		arenas := p.arenas[c]
		for i := len(arenas) - 1; i >= 0; i-- {
			if reserved && !arenas[i].topReserved() {
				continue
			}
			s, ok, err := arenas[i].take()
			if errors.Is(err, unix.ENOENT) {
				// This process let the arena go (shm.ReleaseAll, as a process
				// about to exit does): its file is gone, so the pool forgets it
				// and goes on with another. Buffers still in use in it stay
				// mapped until they are released.
				p.forget(c, arenas[i])
				continue
			}
			if ok || err != nil {
				return s, nil, err
			}
		}
	}
	a, err := p.grow(c)
	if err != nil {
		return Slot{}, p.last(c), err
	}
	s, _, err := a.take()
	return s, nil, err
}

// last returns the newest arena of class c, or nil. The caller holds p.mu.
func (p *Pool) last(c int) *Arena {
	if arenas := p.arenas[c]; len(arenas) > 0 {
		return arenas[len(arenas)-1]
	}
	return nil
}

// grow adds an arena for class c, freeing idle arenas of other classes to
// stay under the limit. The caller holds p.mu. It returns ErrFull when the
// arenas in use fill the limit (their slots may come back), and ErrNoRoom
// when no arena can be had by waiting.
func (p *Pool) grow(c int) (*Arena, error) {
	size := ClassSize(c)
	if least := arenaSize(size, 1); least > p.limit {
		// Raising the limit helps only if the file system has the room: when
		// it has not, its free space is the limit to name.
		var fs unix.Statfs_t
		if unix.Statfs(shm.Dir(), &fs) == nil && least > fs.Bavail*uint64(fs.Bsize) {
			return nil, fmt.Errorf("%w: a %s buffer needs an arena of %s, more than the %s free in %s "+
				"(make it larger: docker run --shm-size, or the tmpfs's size= mount option)", ErrNoRoom,
				shm.FormatBytes(size), shm.FormatBytes(least), shm.FormatBytes(fs.Bavail*uint64(fs.Bsize)), shm.Dir())
		}
		return nil, fmt.Errorf("%w: a %s buffer needs an arena of %s, more than the pool's limit of %s "+
			"(raise it with zctipc.set_pool_limit or %s)", ErrNoRoom, shm.FormatBytes(size), shm.FormatBytes(least),
			shm.FormatBytes(p.limit), LimitEnv)
	}
	first := uint64(arenaBytes)
	if p.first != 0 {
		first = p.first
	}
	target := min(first<<len(p.arenas[c]), arenaMax)
	nslots := max(1, min(target/size, maxSlots))
	if nslots > 1 && p.slabs+arenaSize(size, nslots) > p.limit/slabShare {
		// Note [live bytes decide]: past its share, an arena of one slot.
		nslots = 1
		for n := uint64(2); n <= target/size && p.slabs+arenaSize(size, n) <= p.limit/slabShare; n *= 2 {
			nslots = n
		}
	}
	need := arenaSize(size, nslots)
	if p.reserved+need > p.limit {
		if err := p.trim(need); err != nil {
			return nil, err
		}
		for nslots > 1 && p.reserved+arenaSize(size, nslots) > p.limit {
			nslots /= 2
		}
		need = arenaSize(size, nslots)
		if p.reserved+need > p.limit {
			// Every arena left has slots in use: when they come back, the
			// arenas go and the buffer fits.
			return nil, fmt.Errorf("%w: %s of arenas in use, the limit is %s (%s)", ErrFull,
				shm.FormatBytes(p.reserved), shm.FormatBytes(p.limit), LimitEnv)
		}
	}
	a, err := newArena(c, size, uint32(nslots), p.tickets)
	if errors.Is(err, shm.ErrOutOfSharedMemory) {
		// The file system is full: give back the idle arenas, and try the
		// smallest arena that holds the buffer.
		if terr := p.trim(math.MaxUint64); terr != nil {
			return nil, errors.Join(err, terr)
		}
		nslots = 1
		need = arenaSize(size, nslots)
		a, err = newArena(c, size, uint32(nslots), p.tickets)
	}
	if err != nil {
		if errors.Is(err, shm.ErrOutOfSharedMemory) {
			if p.classInUse(c) {
				return nil, fmt.Errorf("%w: %w", ErrFull, err) // a slot of the class comes back
			}
			return nil, fmt.Errorf("%w: nothing this pool holds can free more: %w", ErrNoRoom, err)
		}
		return nil, err
	}
	p.arenas[c] = append(p.arenas[c], a)
	p.reserved += need
	if nslots > 1 {
		p.slabs += need
	}
	addToIndex(a)
	return a, nil
}

// classInUse reports whether an arena of class c has a slot in use. The
// caller holds p.mu.
func (p *Pool) classInUse(c int) bool {
	for _, a := range p.arenas[c] {
		if a.inUse() > 0 {
			return true
		}
	}
	return false
}

// trim frees arenas with no slot in use until need more bytes fit under the
// limit, or none is left to free (every idle one when need is more than
// the limit). The caller holds p.mu.
func (p *Pool) trim(need uint64) error {
	var errs []error
	for c := range p.arenas {
		p.arenas[c] = slices.DeleteFunc(p.arenas[c], func(a *Arena) bool {
			if need <= p.limit && p.reserved <= p.limit-need {
				return false
			}
			// Idle means no pin besides the owner's count, rather than a full
			// free stack: a release pushes its slot before it unpins. Only the
			// owner pins, under p.mu, so it stays idle while we hold it.
			if a.mem.Count() != 1 {
				return false
			}
			// Dropping the owner's count removes it; other processes unmap
			// their mappings when they see the count at zero.
			p.reserved -= arenaSize(a.slotSize, uint64(a.nslots))
			if a.nslots > 1 {
				p.slabs -= arenaSize(a.slotSize, uint64(a.nslots))
			}
			removeFromIndex(a)
			if err := a.mem.Unmap(); err != nil {
				errs = append(errs, err)
			}
			return true
		})
	}
	return errors.Join(errs...)
}

// forget takes arena a of class c, whose segment this process no longer
// holds, out of the pool and of the address index (its buffers are no longer
// sent by descriptor: no receiver could open it). The caller holds p.mu.
func (p *Pool) forget(c int, a *Arena) {
	p.arenas[c] = slices.DeleteFunc(p.arenas[c], func(b *Arena) bool { return b == a })
	p.reserved -= arenaSize(a.slotSize, uint64(a.nslots))
	if a.nslots > 1 {
		p.slabs -= arenaSize(a.slotSize, uint64(a.nslots))
	}
	removeFromIndex(a)
}

func arenaSize(slotSize, nslots uint64) uint64 {
	return slotsOffset(slotSize, nslots) + slotSize*nslots
}

func slotsOffset(slotSize, nslots uint64) uint64 {
	align := uint64(64)
	if slotSize >= 4096 {
		align = 4096
	}
	return (offSlotTable + nslots*slotMeta + align - 1) &^ (align - 1)
}

// newArena creates an arena segment for class c with all its slots free,
// of tickets or of buffers.
func newArena(c int, size uint64, nslots uint32, tickets bool) (*Arena, error) {
	dataSize := arenaSize(size, uint64(nslots))
	slotsAt := slotsOffset(size, uint64(nslots))
	reserved := dataSize
	var seg *shm.Segment
	var err error
	if !tickets && nslots > 1 && shm.PagesOnDemand() {
		// Note [slots reserved when first used]
		reserved = slotsAt
		seg, err = shm.CreatePartly("", header.KindArena, dtype.Uint8, []int64{int64(dataSize)}, slotsAt)
		if err == nil {
			shm.AdviseHugePages(seg.Data()[slotsAt:])
		}
	} else {
		seg, err = shm.Create("", header.KindArena, dtype.Uint8, []int64{int64(dataSize)})
	}
	if err != nil {
		return nil, err
	}
	a := &Arena{mem: owned{seg}, data: seg.Data(), slotSize: size, nslots: nslots, class: c,
		slotsAt: slotsAt, tickets: tickets, owned: true}
	a.reservedTo.Store(reserved)
	a.base = uintptr(unsafe.Pointer(&a.data[0]))
	a.view = plane.NewArena(unsafe.Pointer(&a.data[0]), size, slotsAt, nslots)
	if tickets {
		le32(a.data[offPurpose:], purposeTickets)
	}
	le64(a.data[offSlotSize:], size)
	le32(a.data[offNSlots:], nslots)
	le32(a.data[offClass:], uint32(c))
	le64(a.data[offSlotsAt:], a.slotsAt)
	for i := range nslots - 1 {
		*a.next(i) = i + 2
	}
	*a.next(nslots - 1) = 0
	*a.i64(offFreeCount) = int64(nslots)
	atomic.StoreUint64(a.u64(offFreeHead), 1)
	return a, nil
}

func le64(b []byte, v uint64) { *(*uint64)(unsafe.Pointer(&b[0])) = v }
func le32(b []byte, v uint32) { *(*uint32)(unsafe.Pointer(&b[0])) = v }
