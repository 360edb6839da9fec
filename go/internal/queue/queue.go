package queue

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/guard"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/lock"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// Errors of queue operations.
var (
	ErrFull  = errors.New("queue is full")
	ErrEmpty = errors.New("queue is empty")
	// ErrInterrupted means a signal arrived while waiting.
	ErrInterrupted = futex.ErrInterrupted
	// ErrTooLarge means a message does not fit in the queue at all.
	ErrTooLarge = fmt.Errorf("message is larger than the queue: %w", unix.EINVAL)
	// ErrTaskDone means task_done was called more often than there were
	// messages.
	ErrTaskDone = fmt.Errorf("task_done() called too many times: %w", unix.EINVAL)
	// ErrClosed means this handle on the queue was closed, before the call
	// or while it waited.
	ErrClosed = fmt.Errorf("queue is closed: %w", shm.ErrClosed)
	// ErrSendsFaulted means a put faulted in or after the sends of the
	// counts its record hands over (PutSending), once they may have left
	// the ledger: the record may be in the queue or not, and those counts
	// are lost rather than given up twice.
	ErrSendsFaulted = errors.New("the put faulted while handing its counts over, which are lost")
)

// RangeError says that a record did not fit the caller's buffer, or had
// more views than the caller takes (message.Views: its descriptors, or an
// inline record's array); it was left in the queue.
type RangeError struct{ Need, Views int }

func (e *RangeError) Error() string {
	return fmt.Sprintf("the next message needs a %d-byte buffer and room for %d views", e.Need, e.Views)
}

// Limits of the ring.
const (
	MinCapacity = 4 << 10
	MaxCapacity = 1 << 30
	// FallbackCapacity is the ring of an unbounded queue on a kernel that
	// cannot reserve pages on demand (before Linux 5.14): a bounded one.
	FallbackCapacity = 16 << 20
	// chunk is the unit in which an unbounded queue's ring pages are
	// given back (and reserved, in a ring of version 2).
	chunk = plane.Chunk
	// WarmWindow is the part of each lap of a version 3 ring whose pages
	// consumers do not give back as they pass (see The warm window).
	WarmWindow = plane.WarmWindow
	// typeSkip marks a skip record: the rest of the lap is unused, and the
	// next record is at the start of the next lap. It is 8 bytes or more;
	// only its size and type are read.
	typeSkip = plane.TypeSkip
)

// Layout of a queue segment's data region (docs/format.md), as the data
// plane has it (plane.h).
const (
	offCapacity     = plane.OffCapacity     // u64 ring bytes, a power of two
	offMaxItems     = plane.OffMaxItems     // u64 most messages at once, 0 for no limit
	offRingVersion  = plane.OffRingVersion  // u32 how records are laid in the ring
	offPutLock      = plane.OffPutLock      // lock.Size bytes
	offTail         = plane.OffTail         // u64 puts << 32 | tail
	offGetLock      = plane.OffGetLock      // lock.Size bytes
	offHead         = plane.OffHead         // u64 gets << 32 | head
	offGivenBack    = plane.OffGivenBack    // u32 ring versions 2 and 3: pages before this position were given back
	offDone         = plane.OffDone         // u32 task_done calls
	offDataSeq      = plane.OffDataSeq      // u32 bumped on every put
	offDataWaiters  = plane.OffDataWaiters  // u32
	offSpaceSeq     = plane.OffSpaceSeq     // u32 bumped on every get
	offSpaceWaiters = plane.OffSpaceWaiters // u32
	offJoinSeq      = plane.OffJoinSeq      // u32 bumped when unfinished tasks reach zero
	offJoinWaiters  = plane.OffJoinWaiters  // u32
	ringAt          = plane.RingAt
	// The words at plane.OffReserved, plane.OffWindow and
	// plane.OffWindowNeed (ring versions 2 and 3) only the plane reads.
)

// RingVersion is the ring layout this package writes and reads: version 1
// records wrap at the end of the ring (docs/format.md). Rings of zctipc
// 0.1.0 say 0 there and never wrapped a record; they are refused.
// SparseRingVersion marks the ring of an unbounded queue, whose pages are
// reserved and given back as messages come and go (see Unbounded queues):
// a library that does not know it refuses it rather than write into pages
// that are not there.
const (
	RingVersion       = 1
	SparseRingVersion = 2
	// WarmRingVersion marks the ring of an unbounded queue that keeps a
	// warm window and skips to the next lap (see The warm window).
	WarmRingVersion = 3
)

// ErrRingVersion means a queue's ring was laid out by another version.
var ErrRingVersion = fmt.Errorf("queue ring layout: %w", header.ErrVersion)

// Queue is a queue segment attached in this process. It is safe for
// concurrent use: Close may be called while other goroutines are blocked in
// Put or Get, which then return ErrClosed.
type Queue struct {
	guard    guard.Guard
	seg      *shm.Segment
	data     []byte
	ring     []byte
	capacity uint32
	mask     uint32
	maxItems uint32
	// sparse: ring version 2, whose pages come and go (see Unbounded
	// queues); maxRecord is the largest record that fits.
	sparse    bool
	maxRecord uint32
	// warm: ring version 3, sparse with a warm window.
	warm    bool
	putLock lock.Mutex
	getLock lock.Mutex
	// interruptible makes a wait return ErrInterrupted on a signal, for
	// hosts (Python) that must run their signal handlers; otherwise a
	// signal (the Go runtime's own preemption signals, say) is waited out.
	interruptible bool
	// policy is how this handle's calls wait (SetWait).
	policy atomic.Pointer[futex.Policy]
	// armed counts the host's sleeps outside Go (ArmWait).
	armed futex.Armed
	// p is the queue as the data plane sees it (package plane); nil for
	// a Queue that only walks a ring (Descriptors).
	p *plane.Queue
}

// SetWait says how this handle's calls wait for messages or room: by
// default a short spin, then a sleep (futex.Sleeping); futex.Policy{Poll:
// true, Spin: -1} polls without sleeping, taking a core while it waits.
func (q *Queue) SetWait(p futex.Policy) error {
	if !q.guard.Enter() {
		return ErrClosed
	}
	defer q.guard.Leave()
	q.policy.Store(&p)
	return nil
}

// SetInterruptible says whether a signal during a wait ends the call with
// ErrInterrupted (for a host that must run its handlers) or is waited out
// (the default).
func (q *Queue) SetInterruptible(on bool) { q.interruptible = on }

// Create makes a queue segment whose ring holds capacity bytes (rounded up
// to a power of two) and at most maxItems messages (0: no limit). An empty
// name makes a random one.
func Create(name string, capacity, maxItems uint64) (*Queue, error) {
	if capacity > MaxCapacity || maxItems > 1<<30 {
		return nil, fmt.Errorf("queue of %d bytes and %d messages: the limits are %d and %d: %w",
			capacity, maxItems, MaxCapacity, 1<<30, unix.EINVAL)
	}
	capacity = max(MinCapacity, uint64(1)<<bits.Len64(capacity-1))
	seg, err := shm.Create(name, header.KindQueue, dtype.Uint8, []int64{int64(ringAt + capacity)})
	if err != nil {
		return nil, err
	}
	initialize(seg.Data(), capacity, maxItems, RingVersion)
	return openOrClose(seg)
}

// CreateUnbounded makes a queue that holds as many messages as shared
// memory has room for (at most maxItems, 0: no limit): a ring of
// MaxCapacity bytes whose pages are reserved as messages come and given
// back as they go. On a kernel that cannot reserve pages on demand (before
// Linux 5.14) it makes a queue of FallbackCapacity bytes instead.
func CreateUnbounded(name string, maxItems uint64) (*Queue, error) {
	if !shm.PagesOnDemand() {
		return Create(name, FallbackCapacity, maxItems)
	}
	if maxItems > 1<<30 {
		return nil, fmt.Errorf("queue of %d messages: the limit is %d: %w", maxItems, 1<<30, unix.EINVAL)
	}
	seg, err := shm.CreatePartly(name, header.KindQueue, dtype.Uint8, []int64{ringAt + MaxCapacity}, ringAt)
	if err != nil {
		return nil, err
	}
	initialize(seg.Data(), MaxCapacity, maxItems, WarmRingVersion)
	return openOrClose(seg)
}

// initialize writes the layout of a new queue's data region.
func initialize(d []byte, capacity, maxItems uint64, version uint32) {
	*(*uint64)(unsafe.Pointer(&d[offCapacity])) = capacity
	*(*uint64)(unsafe.Pointer(&d[offMaxItems])) = maxItems
	*(*uint32)(unsafe.Pointer(&d[offRingVersion])) = version
}

// Attach attaches the queue segment name; Adopt does so with a count that
// a message in flight carried (see shm.Adopt).
func Attach(name string) (*Queue, error) {
	seg, err := shm.Attach(name, header.KindQueue, false)
	if err != nil {
		return nil, err
	}
	return openOrClose(seg)
}

// Adopt attaches the queue segment name, taking over a count that a
// message in flight carried.
func Adopt(name string) (*Queue, error) {
	seg, err := shm.Adopt(name, header.KindQueue)
	if err != nil {
		return nil, err
	}
	return openOrClose(seg)
}

func openOrClose(seg *shm.Segment) (*Queue, error) {
	q, err := open(seg)
	if err != nil {
		return nil, errors.Join(err, seg.Close())
	}
	return q, nil
}

// open checks the layout that the creator wrote.
func open(seg *shm.Segment) (*Queue, error) {
	d := seg.Data()
	if len(d) < ringAt {
		return nil, fmt.Errorf("queue %q: %w: %d bytes", seg.Name(), header.ErrCorrupt, len(d))
	}
	capacity := *(*uint64)(unsafe.Pointer(&d[offCapacity]))
	maxItems := *(*uint64)(unsafe.Pointer(&d[offMaxItems]))
	if capacity < MinCapacity || capacity > MaxCapacity || capacity&(capacity-1) != 0 || uint64(len(d)) != ringAt+capacity || maxItems > 1<<30 {
		return nil, fmt.Errorf("queue %q: %w: a %d-byte ring in %d bytes", seg.Name(), header.ErrCorrupt, capacity, len(d))
	}
	v := *(*uint32)(unsafe.Pointer(&d[offRingVersion]))
	if v != RingVersion && v != SparseRingVersion && v != WarmRingVersion {
		return nil, fmt.Errorf("queue %q: %w %d (this library reads %d to %d)", seg.Name(), ErrRingVersion, v,
			RingVersion, WarmRingVersion)
	}
	sparse := v == SparseRingVersion || v == WarmRingVersion
	if sparse && capacity < 4*chunk {
		return nil, fmt.Errorf("queue %q: %w: a %d-byte unbounded ring", seg.Name(), header.ErrCorrupt, capacity)
	}
	maxRecord := uint32(capacity)
	if sparse {
		maxRecord -= chunk // a chunk's pages may be on their way back
	}
	q := &Queue{
		seg: seg, data: d, ring: d[ringAt:],
		capacity: uint32(capacity), mask: uint32(capacity - 1), maxItems: uint32(maxItems),
		sparse: sparse, maxRecord: maxRecord, warm: v == WarmRingVersion,
		putLock: lock.At(unsafe.Pointer(&d[offPutLock])),
		getLock: lock.At(unsafe.Pointer(&d[offGetLock])),
	}
	self, err := proc.Self()
	if err != nil {
		return nil, err
	}
	q.p = plane.New(plane.Params{
		Data: unsafe.Pointer(&d[0]), Capacity: uint32(capacity), MaxItems: uint32(maxItems), MaxRecord: maxRecord,
		Sparse: sparse, Warm: q.warm, PageSize: unix.Getpagesize(), PID: uint32(self.PID), StartTime: self.StartTime,
	})
	sleeping := futex.NewSleeping()
	q.policy.Store(&sleeping)
	return q, nil
}

// Plane returns the queue as the data plane sees it, for the C ABI's steps
// that run without Go: valid until Close, which the caller must not let
// begin while one of them runs.
func (q *Queue) Plane() *plane.Queue { return q.p }

func (q *Queue) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&q.data[off])) }

func (q *Queue) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&q.data[off])) }

// Segment returns the queue's segment.
func (q *Queue) Segment() *shm.Segment { return q.seg }

// Capacity returns the size of the largest record: the ring's size, less a
// chunk for an unbounded queue.
func (q *Queue) Capacity() int { return int(q.maxRecord) }

// Unbounded reports whether the queue's ring uses the memory of the
// messages it holds (CreateUnbounded) rather than all of it at once.
func (q *Queue) Unbounded() bool { return q.sparse }

// MaxItems returns the most messages the queue holds at once (0: no limit).
func (q *Queue) MaxItems() int { return int(q.maxItems) }

func split(word uint64) (count, pos uint32) { return uint32(word >> 32), uint32(word) }

// Len returns the number of messages in the queue now.
func (q *Queue) Len() (int, error) {
	if !q.guard.Enter() {
		return 0, ErrClosed
	}
	defer q.guard.Leave()
	return q.len(), nil
}

func (q *Queue) len() int {
	puts, _ := split(atomic.LoadUint64(q.u64(offTail)))
	gets, _ := split(atomic.LoadUint64(q.u64(offHead)))
	return int(int32(puts - gets))
}

// Room returns the size of the largest record a put would find room for
// now (0 when the message limit is reached). Others may change it.
func (q *Queue) Room() (int, error) {
	if !q.guard.Enter() {
		return 0, ErrClosed
	}
	defer q.guard.Leave()
	puts, tail := split(atomic.LoadUint64(q.u64(offTail)))
	gets, head := split(atomic.LoadUint64(q.u64(offHead)))
	if q.maxItems != 0 && puts-gets >= q.maxItems {
		return 0, nil
	}
	if q.sparse {
		head = atomic.LoadUint32(q.u32(offGivenBack))
	}
	return int(min(q.capacity-min(tail-head, q.capacity), q.maxRecord)), nil
}

// Unfinished returns the messages put and not yet marked done.
func (q *Queue) Unfinished() (int, error) {
	if !q.guard.Enter() {
		return 0, ErrClosed
	}
	defer q.guard.Leave()
	return q.unfinished(), nil
}

func (q *Queue) unfinished() int {
	puts, _ := split(atomic.LoadUint64(q.u64(offTail)))
	return int(int32(puts - atomic.LoadUint32(q.u32(offDone))))
}

// TaskDone marks one message done, for Join.
func (q *Queue) TaskDone() error {
	if !q.guard.Enter() {
		return ErrClosed
	}
	defer q.guard.Leave()
	done := q.u32(offDone)
	for {
		puts, _ := split(atomic.LoadUint64(q.u64(offTail)))
		d := atomic.LoadUint32(done)
		if puts == d {
			return ErrTaskDone
		}
		if atomic.CompareAndSwapUint32(done, d, d+1) {
			if puts == d+1 {
				return q.signal(offJoinSeq, offJoinWaiters, 1<<30)
			}
			return nil
		}
	}
}

// Join waits until every message put was marked done, until deadline
// (ErrFull when it passed).
func (q *Queue) Join(deadline time.Time) error {
	if !q.guard.Enter() {
		return ErrClosed
	}
	defer q.guard.Leave()
	for {
		seen := atomic.LoadUint32(q.u32(offJoinSeq))
		if q.unfinished() == 0 {
			return nil
		}
		if err := q.sleep(offJoinSeq, offJoinWaiters, seen, futex.Until{Deadline: deadline}, ErrFull); err != nil {
			return err
		}
	}
}

// Close closes this process's handle on the queue. Calls blocked in other
// goroutines wake and return ErrClosed, but only once Close has let the
// segment go (after the last of them left it): a goroutine told ErrClosed
// finds this process's count on the queue given up. Host threads asleep
// outside Go (ArmWait) wake too, and their sleeps stop counting. Closing
// twice returns ErrClosed.
func (q *Queue) Close() error {
	closed, err := q.guard.CloseAndRelease(q.wakeAll, func() error {
		for which, s := range waitWords {
			q.armed.Release(which, q.seq(s[0], s[1]))
		}
		q.p.Free()
		return q.seg.Close()
	})
	if !closed {
		return ErrClosed
	}
	return err
}

func init() { shm.OnLastRelease(header.KindQueue, drain) }

// drain gives up the counts that the messages still in a queue carry, when
// the last holder of the queue lets it go.
func drain(data []byte) error { return Descriptors(data, buffer.Drop) }

// Descriptors calls fn on every descriptor of the messages in the queue
// whose data region is data, oldest first: the counts those messages hold.
// The queue must not change meanwhile, or the walk may see torn records,
// which it reports as corrupt rather than follow.
func Descriptors(data []byte, fn func(*message.Descriptor) error) error {
	if len(data) < ringAt {
		return nil
	}
	capacity := *(*uint64)(unsafe.Pointer(&data[offCapacity]))
	if capacity < MinCapacity || capacity > MaxCapacity || capacity&(capacity-1) != 0 || uint64(len(data)) != ringAt+capacity {
		return nil // not a queue we can read; nothing to release
	}
	v := *(*uint32)(unsafe.Pointer(&data[offRingVersion]))
	if v != RingVersion && v != SparseRingVersion && v != WarmRingVersion {
		return nil
	}
	q := &Queue{data: data, ring: data[ringAt:], capacity: uint32(capacity), mask: uint32(capacity - 1), warm: v == WarmRingVersion}
	_, head := split(atomic.LoadUint64(q.u64(offHead)))
	_, tail := split(atomic.LoadUint64(q.u64(offTail)))
	var errs []error
	if head%8 != 0 || tail%8 != 0 {
		return fmt.Errorf("%w: head %d and tail %d in a queue", header.ErrCorrupt, head, tail)
	}
	for head != tail && tail-head <= q.capacity {
		size := *(*uint32)(unsafe.Pointer(&q.ring[head&q.mask]))
		if q.skipAt(head) && size <= tail-head {
			head += size
			continue
		}
		if size < message.RecordHeaderSize || size%8 != 0 || size > tail-head {
			return errors.Join(append(errs, fmt.Errorf("%w: a record of %d bytes in a queue", header.ErrCorrupt, size))...)
		}
		buf := make([]byte, size)
		q.read(head, size, buf)
		rec, err := message.DecodeRecord(buf)
		if err != nil {
			errs = append(errs, err)
		}
		for i := range rec.Descriptors {
			if err := fn(&rec.Descriptors[i]); err != nil {
				errs = append(errs, err)
			}
		}
		head += size
	}
	return errors.Join(errs...)
}
