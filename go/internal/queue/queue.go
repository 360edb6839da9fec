// Package queue is a many-producer, many-consumer queue of messages in a
// shared segment: a ring of variable-sized records (package message).
//
// # Crash safety
//
// Producers take one lock and consumers another (package lock), and a lock
// whose holder was killed is taken over. Every change is committed with a
// single 64-bit store that moves both a byte position and a message count:
// (puts << 32 | tail) for producers, (gets << 32 | head) for consumers. A
// producer killed before its commit leaves nothing behind; a consumer killed
// before its commit leaves the message for the next consumer, and one killed
// after it has taken the message with it. No other message is lost or
// duplicated, and no count drifts.
//
// # Waiting
//
// A full queue or an empty one is waited on with futexes on sequence words
// that every put (or get) bumps, after the waiter registered itself; a
// signal interrupts the wait so that the caller's host can run its handler.
//
// # Unbounded queues
//
// A queue made with CreateUnbounded has a ring of MaxCapacity bytes whose
// memory comes and goes with its messages: a producer reserves the pages
// of a chunk before it writes into it (offReserved says how far), and the
// consumer whose get leaves chunks behind gives their pages back, after its
// commit and before it lets go of the get lock (offGivenBack says how far).
// A producer writes only up to offGivenBack plus the ring size, so it never
// writes into a chunk whose pages are being given back. A consumer killed
// between its commit and giving back leaves pages in use (the next get
// gives them back); a producer killed after reserving leaves pages that the
// next one uses. So an unbounded queue holds as many messages as /dev/shm
// has room for, up to a gibibyte of pickled bytes, and uses the memory of
// the messages it holds. Ring version 2 (earlier libraries) reserves and
// gives back whole chunks; this library writes version 3.
//
// # The warm window
//
// A ring whose every record took fresh pages would pay for reserving and
// giving back a page for every page of messages that pass. So a version 3
// ring treats the first WarmWindow bytes of every lap (the window) apart:
// consumers never give their pages back as they pass, and a producer whose
// record does not fit in what is reserved of the window past the tail, when
// the queue is empty, writes a skip record and goes on at the start of the
// next lap. The window's pages are reserved as records first need them
// (offWindow says how far), and the consumer that empties the queue
// rewinds it: with the put lock, if it is free, it writes and crosses a
// skip record to the next lap, and gives back the window's pages past the
// largest record put since the last rewind (offWindowNeed). So an empty
// queue holds a page or two, and one whose messages pass one at a time
// keeps the pages of one message, reused put after put. Only when messages
// pile up does the ring go past the window, reserving pages in steps of
// reserveStep that consumers give back as they pass. A consumer crosses a
// skip record as it comes to it; so does a producer that finds no room
// because of one (the consumers took nothing since), so that the positions
// a skip passes over never make an unbounded queue full.
//
// # Records wrap
//
// A record is written at its byte position modulo the ring size and, when
// it runs past the end of the ring, goes on at offset 0, so the ring wastes
// no byte: any record up to the ring size fits an empty ring. Records are
// 8-byte multiples in a ring whose size is a power of two, so a record's
// first 8 bytes (its size and descriptor count) never straddle the end.
package queue

import (
	"context"
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
)

// RangeError says that a record did not fit the caller's buffer, or had
// more descriptors than the caller takes; it was left in the queue.
type RangeError struct{ Need, Descriptors int }

func (e *RangeError) Error() string {
	return fmt.Sprintf("the next message needs a %d-byte buffer and room for %d descriptors", e.Need, e.Descriptors)
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
	chunk = 2 << 20
	// WarmWindow is the part of each lap of a version 3 ring whose pages
	// consumers do not give back as they pass (see The warm window).
	WarmWindow = chunk
	// reserveStep is the unit in which a version 3 ring reserves pages
	// past its warm window.
	reserveStep = 64 << 10
	// typeSkip marks a skip record: the rest of the lap is unused, and the
	// next record is at the start of the next lap. It is 8 bytes or more;
	// only its size and type are read.
	typeSkip = 0xFF
)

const (
	// recheckEvery bounds one sleep of a waiter.
	recheckEvery = time.Second
)

// Layout of a queue segment's data region (docs/format.md).
const (
	offCapacity     = 0   // u64 ring bytes, a power of two
	offMaxItems     = 8   // u64 most messages at once, 0 for no limit
	offRingVersion  = 16  // u32 how records are laid in the ring
	offPutLock      = 64  // lock.Size bytes
	offTail         = 96  // u64 puts << 32 | tail
	offReserved     = 104 // u32 ring versions 2 and 3: pages are reserved up to this position
	offWindow       = 108 // u32 ring version 3: the window's pages are reserved up to this ring offset
	offWindowNeed   = 112 // u32 ring version 3: the largest record put since the ring was last rewound
	offGetLock      = 128 // lock.Size bytes
	offHead         = 160 // u64 gets << 32 | head
	offGivenBack    = 168 // u32 ring versions 2 and 3: pages before this position were given back
	offDone         = 192 // u32 task_done calls
	offDataSeq      = 256 // u32 bumped on every put
	offDataWaiters  = 260 // u32
	offSpaceSeq     = 320 // u32 bumped on every get
	offSpaceWaiters = 324 // u32
	offJoinSeq      = 384 // u32 bumped when unfinished tasks reach zero
	offJoinWaiters  = 388 // u32
	ringAt          = 512
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
	sleeping := futex.NewSleeping()
	q.policy.Store(&sleeping)
	return q, nil
}

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

// Put appends the record, waiting for room until deadline (forever when it
// is zero; not at all when it has passed). It returns ErrFull when there is
// no room by then, and ErrTooLarge when the record can never fit.
func (q *Queue) Put(rec *message.Record, deadline time.Time) error {
	if !q.guard.Enter() {
		return ErrClosed
	}
	defer q.guard.Leave()
	one := [1]*message.Record{rec}
	_, err := q.putMany(one[:], futex.Until{Deadline: deadline})
	return err
}

// PutMany appends records in order: it waits, as Put does, for room for the
// first, then appends as many of the others as fit at once, commits them
// with one store, and returns how many it appended.
func (q *Queue) PutMany(recs []*message.Record, deadline time.Time) (int, error) {
	if !q.guard.Enter() {
		return 0, ErrClosed
	}
	defer q.guard.Leave()
	return q.putMany(recs, futex.Until{Deadline: deadline})
}

// PutContext appends the record, waiting for room until ctx is done: its
// deadline (ErrFull), or its cancellation, which wakes the wait at once
// (ErrFull and ctx.Err()).
func (q *Queue) PutContext(ctx context.Context, rec *message.Record) error {
	if !q.guard.Enter() {
		return ErrClosed
	}
	defer q.guard.Leave()
	u, stop := q.until(ctx, offSpaceSeq, offSpaceWaiters)
	defer stop() // before Leave: Close waits for the wake
	_, err := q.putMany([]*message.Record{rec}, u)
	if errors.Is(err, ErrFull) {
		err = futex.Cause(ctx, err)
	}
	return err
}

// GetContext takes the next record into buf as Get does, waiting until ctx
// is done: its deadline (ErrEmpty), or its cancellation, which wakes the
// wait at once (ErrEmpty and ctx.Err()).
func (q *Queue) GetContext(ctx context.Context, buf []byte, maxDescriptors int) (int, error) {
	if !q.guard.Enter() {
		return 0, ErrClosed
	}
	defer q.guard.Leave()
	u, stop := q.until(ctx, offDataSeq, offDataWaiters)
	defer stop() // before Leave: Close waits for the wake
	n, size, err := q.getMany(buf, 1, maxDescriptors, u)
	if n == 0 {
		if errors.Is(err, ErrEmpty) {
			err = futex.Cause(ctx, err)
		}
		return 0, err
	}
	return size, err
}

// until returns the wait of ctx, and arranges for its cancellation to wake
// the waiters of the sequence word at seqOff; stop undoes that.
func (q *Queue) until(ctx context.Context, seqOff, waitersOff int) (futex.Until, func()) {
	return futex.WakeOnDone(ctx, func() { _ = q.signal(seqOff, waitersOff, 1<<30) })
}

// putMany appends records, in a call that entered.
func (q *Queue) putMany(recs []*message.Record, u futex.Until) (int, error) {
	if len(recs) == 0 {
		return 0, nil
	}
	for _, rec := range recs {
		if uint64(rec.Size()) > uint64(q.maxRecord) {
			return 0, fmt.Errorf("a message of %d bytes in a queue that takes %d: %w", rec.Size(), q.maxRecord, ErrTooLarge)
		}
	}
	if err := q.lock(q.putLock, u, ErrFull); err != nil {
		return 0, err
	}
	var puts, tail, gets, head uint32
	for {
		seen := atomic.LoadUint32(q.u32(offSpaceSeq))
		puts, tail = split(atomic.LoadUint64(q.u64(offTail)))
		gets, head = split(atomic.LoadUint64(q.u64(offHead)))
		if !q.sound(head, tail) {
			return 0, errors.Join(q.corrupt(head, tail), q.putLock.Unlock())
		}
		at, _ := q.skipTo(tail, head, puts-gets, uint32(recs[0].Size()))
		if q.room(at, head, puts-gets, uint32(recs[0].Size())) {
			break
		}
		if q.sparse && q.catchUp(head, u) {
			continue // pages a killed consumer left are given back: look again
		}
		if err := q.wait(q.putLock, offSpaceSeq, offSpaceWaiters, seen, u, ErrFull); err != nil {
			return 0, err
		}
	}
	if q.sparse {
		q.settleReserved(tail)
	}
	n := 0
	var reserveErr error
	for n < len(recs) {
		size := uint32(recs[n].Size())
		if q.warm {
			if tail, reserveErr = q.skip(tail, head, puts+uint32(n)-gets, size); reserveErr != nil {
				break
			}
		}
		if !q.room(tail, head, puts+uint32(n)-gets, size) {
			break
		}
		if q.sparse {
			if reserveErr = q.reserve(tail, tail+size); reserveErr != nil {
				break
			}
		}
		q.write(tail, recs[n])
		if q.warm && size > atomic.LoadUint32(q.u32(offWindowNeed)) {
			atomic.StoreUint32(q.u32(offWindowNeed), min(size, WarmWindow))
		}
		tail += size
		n++
	}
	atomic.StoreUint64(q.u64(offTail), uint64(puts+uint32(n))<<32|uint64(tail)) // commit
	if err := q.putLock.Unlock(); err != nil {
		return n, err
	}
	if n == 0 {
		return 0, reserveErr // out of shared memory for the first record
	}
	// Wake a consumer when the queue was empty; one that then leaves
	// messages behind wakes the next (see GetMany), so a busy queue makes
	// no wake-up call per message. gets may have moved since: waking when
	// it need not is harmless.
	if gets, _ := split(atomic.LoadUint64(q.u64(offHead))); gets == puts {
		return n, q.signal(offDataSeq, offDataWaiters, 1)
	}
	atomic.AddUint32(q.u32(offDataSeq), 1)
	return n, nil
}

// room reports whether a record of size fits after tail, with items
// messages in the queue. In an unbounded queue it fits only before the
// pages given back so far, a ring's size on (see Unbounded queues).
func (q *Queue) room(tail, head, items, size uint32) bool {
	if q.sparse && !q.inWindow(tail, size) {
		// The window's pages are never given back: a record there needs only
		// the consumers to have taken what was there.
		head = atomic.LoadUint32(q.u32(offGivenBack))
	}
	return tail-head+size <= q.capacity && (q.maxItems == 0 || items < q.maxItems)
}

// inWindow reports whether a record of size at position at lies in the
// warm window of its lap.
func (q *Queue) inWindow(at, size uint32) bool {
	return q.warm && at&q.mask+size <= WarmWindow
}

// skip returns where a record of size goes in a version 3 ring: at tail,
// or, when it does not fit in the rest of the warm window and the queue is
// empty, at the start of the next lap, after a skip record written at
// tail. Under the put lock; the commit of the record publishes the skip.
func (q *Queue) skip(tail, head, items, size uint32) (uint32, error) {
	next, ok := q.skipTo(tail, head, items, size)
	if !ok {
		return tail, nil
	}
	off := tail & q.mask
	if err := q.reserve(tail, tail+8); err != nil {
		return tail, err
	}
	*(*uint32)(unsafe.Pointer(&q.ring[off])) = q.capacity - off
	*(*uint32)(unsafe.Pointer(&q.ring[off+4])) = typeSkip // and no descriptors
	return next, nil
}

// skipTo returns the start of the next lap and true when a record of size
// goes there rather than at tail (see skip).
func (q *Queue) skipTo(tail, head, items, size uint32) (uint32, bool) {
	off := tail & q.mask
	if !q.warm || head != tail || off == 0 || off+size <= q.window() || size > WarmWindow {
		return tail, false
	}
	next := tail + (q.capacity - off)
	if next-head+size > q.capacity || q.maxItems != 0 && items >= q.maxItems {
		return tail, false
	}
	return next, true
}

// Note [threat model of the ring words]: every process of the user that
// attached the queue reads and writes its words (tail, head, reserved,
// given_back, window, window_need) and its ring, and any of them may be
// killed between two stores. Those words are trusted to have been written
// by this protocol: a process that forges them can lose or corrupt
// messages, as it could by writing the ring. What must never happen
// between processes that follow it, killed or not: a page written before
// it was reserved (a SIGBUS on a full /dev/shm), a page that holds a
// message given back, a message lost or taken twice. Forged values are
// bounded where that costs nothing: window is read as at most WarmWindow,
// reserved further than a ring from the tail is reset, a record or skip
// whose size cannot be right is reported as corrupt, never followed out of
// the ring. Head and tail are read once into locals and checked (sound)
// before the ring is read or written at them: off the 8-byte grid, or more
// than a ring apart, they are reported as corrupt (a forged position near
// the ring's end used to index past it). A given_back ahead of head's
// chunk or more than a ring behind it is not followed: nothing is given
// back, so a forged one costs memory, never a message (it used to give
// back the pages of the whole ring, messages and all). What stays trusted:
// reserved and window within their bounds, which say that pages are
// reserved; a forged one lets a put write a page never reserved, which on
// a full /dev/shm faults as a truncated file does (the C ABI turns that
// into ZCT_E_CORRUPT).
//
// settleReserved brings an unbounded queue's reserved position up to tail,
// the committed tail, under the put lock, before the put writes anything.
//
// Positions are 32-bit and wrap every four laps, so two of them can be
// compared only while they are less than 2^31 apart. A skip to the next
// lap moves the tail by up to a ring without reserving anything, so the
// reserved position, left where it was, falls a lap behind with every skip:
// two skips later its comparison with the tail says it is ahead, and a
// producer writes pages it never reserved. Kept at the committed tail or
// ahead of it, it stays within a ring of the tail (a put moves the tail by
// a ring at most, and reserves no further than a ring past given_back), so
// every comparison of it is sound. It may then claim positions before the
// tail that were skipped and never reserved: none is written again before
// it is a lap further on. A value further than a ring from the tail either
// way is one that an earlier library let fall behind: it is set to tail.
func (q *Queue) settleReserved(tail uint32) {
	if reserved := atomic.LoadUint32(q.u32(offReserved)); reserved-tail > q.capacity {
		atomic.StoreUint32(q.u32(offReserved), tail)
	}
}

// reserve reserves the pages of an unbounded queue's ring for a record
// from position start to end, under the put lock: up to end rounded up to a
// chunk (version 2), or to a reserveStep past the warm window (version 3).
func (q *Queue) reserve(start, end uint32) error {
	off := start & q.mask
	if q.warm && off < WarmWindow {
		if err := q.growWindow(min(off+(end-start), WarmWindow)); err != nil {
			return err
		}
		if off+(end-start) <= WarmWindow {
			return nil
		}
	}
	reserved := atomic.LoadUint32(q.u32(offReserved))
	if int32(end-reserved) <= 0 {
		return nil
	}
	step := uint32(chunk)
	if q.warm {
		step = reserveStep
		if window := start - start&q.mask + WarmWindow; int32(window-reserved) > 0 {
			reserved = window // the lap's window is reserved for good
		}
	}
	upTo := (end + step - 1) &^ (step - 1)
	if err := q.pages(reserved, upTo, shm.ReservePages); err != nil {
		q.unreserve(reserved, upTo)
		return err
	}
	atomic.StoreUint32(q.u32(offReserved), upTo)
	if next := start - off + q.capacity; q.warm && int32(upTo-next) > 0 && upTo-next > q.window() {
		// The reservation ran on into the next lap's window: say so, so
		// that a rewind gives those pages back too.
		atomic.StoreUint32(q.u32(offWindow), min(upTo-next, WarmWindow))
	}
	return nil
}

// unreserve gives back, after a reservation from position from to to
// failed (a full file system), the pages it may have reserved before it
// did: no word claims them, and they would stay in use until the ring came
// round to them. Only pages wholly past from go, and of the next lap's
// window only those past window, which no record is in.
func (q *Queue) unreserve(from, to uint32) {
	lapEnd := from - from&q.mask + q.capacity
	if int32(to-lapEnd) <= 0 {
		_ = q.pages(from, to, q.releasePages)
		return
	}
	_ = q.pages(from, lapEnd, q.releasePages)
	if w := lapEnd + q.window(); int32(to-w) > 0 {
		_ = q.pages(w, to, q.releasePages)
	}
}

// window returns the ring offset up to which the warm window's pages are
// reserved (at most WarmWindow, whatever the word says).
func (q *Queue) window() uint32 { return min(atomic.LoadUint32(q.u32(offWindow)), WarmWindow) }

// pageEnd returns the ring offset where the memory page that holds ring
// offset off-1 ends.
func (q *Queue) pageEnd(off uint32) uint32 {
	page := uintptr(unix.Getpagesize())
	base := uintptr(unsafe.Pointer(&q.ring[0]))
	return uint32((base+uintptr(off)+page-1)&^(page-1) - base)
}

// growWindow reserves the warm window's pages up to ring offset to (at most
// WarmWindow), in steps of reserveStep, under the put lock.
func (q *Queue) growWindow(to uint32) error {
	w := q.window()
	if to <= w {
		return nil
	}
	upTo := min((to+reserveStep-1)&^(reserveStep-1), WarmWindow)
	if err := shm.ReservePages(q.ring[w:upTo]); err != nil {
		// It may have reserved part of them before it failed (a full file
		// system): no word claims those, so they go back.
		_ = shm.ReleasePages(q.ring[w:upTo])
		return err
	}
	atomic.StoreUint32(q.u32(offWindow), upTo)
	return nil
}

// rewind, for a consumer whose get left an unbounded queue of version 3
// empty at head, moves the ring on to the start of the next lap and gives
// back the window's pages past the largest record put since the last
// rewind (see The warm window). Under the get lock, after the commit; it
// takes the put lock only if it is free (a producer at work will find the
// queue as it is), and does nothing if a record came meanwhile.
//
// A skip record at head, committed as a producer's are, carries both
// positions over the rest of the lap: a process killed before head moves
// past it leaves it for the next consumer, who crosses it.
func (q *Queue) rewind(gets, head uint32) {
	off := head & q.mask
	if ok, err := q.putLock.TryLock(); !ok || err != nil {
		return
	}
	defer func() { _ = q.putLock.Unlock() }()
	puts, tail := split(atomic.LoadUint64(q.u64(offTail)))
	if tail != head || puts != gets {
		return
	}
	need := max(atomic.LoadUint32(q.u32(offWindowNeed)), message.RecordHeaderSize)
	q.settleReserved(tail)
	if off != 0 {
		if q.reserve(head, head+8) != nil {
			return // out of memory for the skip: leave the ring where it is
		}
		*(*uint32)(unsafe.Pointer(&q.ring[off])) = q.capacity - off
		*(*uint32)(unsafe.Pointer(&q.ring[off+4])) = typeSkip
		next := head + (q.capacity - off)
		atomic.StoreUint64(q.u64(offTail), uint64(puts)<<32|uint64(next)) // commit the skip
		atomic.StoreUint64(q.u64(offHead), uint64(gets)<<32|uint64(next)) // and cross it
		q.giveBackSkipped(head)
	}
	// Keep room for the largest record and the skip after it, to the end of
	// its page: the next rewind after such a record then reserves nothing.
	keep := min(q.pageEnd(need+8), WarmWindow)
	if w := q.window(); w > keep {
		// No record lies in the ring: the queue is empty and no producer
		// can write (the put lock is ours). The words go first: a process
		// killed before the pages go leaves pages in use that no word
		// claims (a producer reserves them again), never a word that claims
		// pages that are gone, which a producer would write unreserved.
		atomic.StoreUint32(q.u32(offWindow), keep)
		// Nothing is reserved past the tail now.
		_, tail := split(atomic.LoadUint64(q.u64(offTail)))
		atomic.StoreUint32(q.u32(offReserved), tail)
		// The page that straddles the window's end goes too: consumers
		// passing keep it, as its first bytes are the window's.
		_ = shm.ReleasePages(q.ring[keep:q.pageEnd(WarmWindow+1)])
	}
	atomic.StoreUint32(q.u32(offWindowNeed), 0)
}

// giveBack gives back the pages of the chunks an unbounded queue's
// consumers have left behind, up to head's chunk; under the get lock,
// after the commit that left them. A version 3 ring keeps its warm window,
// and has nothing to give back past the pages it reserved.
func (q *Queue) giveBack(head uint32) {
	from, to := atomic.LoadUint32(q.u32(offGivenBack)), head&^(chunk-1)
	if from == to {
		return
	}
	if to-from > q.capacity {
		// given_back is never ahead of head's chunk, nor a ring behind it:
		// a forged value. Give back nothing (pages stay in use, none that
		// holds a message or that a producer counts on goes) and go on
		// from head.
		from = to
	}
	// A failure keeps the pages in use: nothing is lost.
	if !q.warm {
		_ = q.pages(from, to, q.releasePages)
	} else {
		for at := from; int32(to-at) > 0; {
			lap := at - at&q.mask
			if at-lap < WarmWindow {
				at = lap + WarmWindow
				continue
			}
			end := lap + q.capacity
			if int32(end-to) > 0 {
				end = to
			}
			_ = q.pages(at, end, q.releasePages)
			at = end
		}
	}
	atomic.StoreUint32(q.u32(offGivenBack), to)
}

// giveBackSkipped gives back, for a consumer (or catchUp) that crossed the
// skip record at position at, the pages of its lap: those before it as
// giveBack does, and past it only those the skip's own reservation took,
// since no record is ever written past a skip in its lap; then given_back
// moves to the next lap. (Releasing the rest of the lap, most of a
// gibibyte of pages never reserved, would cost a system call that walks it
// for every skip.) Under the get lock, after the commit that crossed it.
func (q *Queue) giveBackSkipped(at uint32) {
	q.giveBack(at)
	off := at & q.mask
	if off >= WarmWindow { // WarmWindow is a chunk: given_back is in the same lap, past the window
		// To the end of the page the skip's reservation ended in: nothing
		// lies past it in this lap, and the next lap's producers write only
		// before given_back's offset.
		page := uint32(unix.Getpagesize())
		upTo := min((at+8+reserveStep-1)&^(reserveStep-1)+page, at-off+q.capacity)
		_ = q.pages(at&^(chunk-1), upTo, q.releasePages)
	}
	atomic.StoreUint32(q.u32(offGivenBack), at-off+q.capacity)
}

// catchUp gives back, under the get lock, the chunks behind head that a
// consumer killed after its commit did not: a producer calls it, holding the
// put lock, when a record does not fit. It reports whether it gave any back.
func (q *Queue) catchUp(head uint32, u futex.Until) bool {
	_, tail := split(atomic.LoadUint64(q.u64(offTail)))
	if atomic.LoadUint32(q.u32(offGivenBack)) == head&^(chunk-1) && (head == tail || !q.skipAt(head)) {
		return false
	}
	if q.lock(q.getLock, u, ErrFull) != nil {
		return false
	}
	word := atomic.LoadUint64(q.u64(offHead))
	gets, head := split(word)
	before := atomic.LoadUint32(q.u32(offGivenBack))
	if !q.sound(head, tail) {
		_ = q.getLock.Unlock()
		return false // the put that called reports it
	}
	if head != tail && q.skipAt(head) && q.capacity-head&q.mask <= tail-head { // tail is still ours: the put lock is held
		// Cross a skip record the consumers have not come to (see The warm
		// window): it is no message.
		head = q.crossSkip(gets, head)
	}
	q.giveBack(head)
	_ = q.getLock.Unlock()
	return atomic.LoadUint32(q.u32(offGivenBack)) != before || atomic.LoadUint64(q.u64(offHead)) != word
}

// sound reports whether head and tail, as read from the queue's words,
// can be a queue's: on the 8-byte grid, and tail at most a ring past head.
// Other values were forged (Note [threat model of the ring words]): a call
// that met them reports the queue corrupt rather than read or write at
// them.
func (q *Queue) sound(head, tail uint32) bool {
	return head%8 == 0 && tail%8 == 0 && tail-head <= q.capacity
}

func (q *Queue) corrupt(head, tail uint32) error {
	return fmt.Errorf("queue %q: %w: head %d and tail %d", q.seg.Name(), header.ErrCorrupt, head, tail)
}

// onlySkip reports whether the queue holds a skip record at head and
// nothing after it (head and tail sound).
func (q *Queue) onlySkip(head, tail uint32) bool {
	return q.skipAt(head) && head+(q.capacity-head&q.mask) == tail
}

// crossSkip moves head past the skip record there, counting no message,
// and gives back the pages of its lap (giveBackSkipped); under the get
// lock. It returns the new head.
func (q *Queue) crossSkip(gets, head uint32) uint32 {
	next := head + (q.capacity - head&q.mask)
	atomic.StoreUint64(q.u64(offHead), uint64(gets)<<32|uint64(next))
	q.giveBackSkipped(head)
	return next
}

// skipAt reports whether the record at position at is a skip record; the
// caller knows that a record is there.
func (q *Queue) skipAt(at uint32) bool {
	pos := at & q.mask
	return q.warm && pos%8 == 0 && q.ring[pos+4] == typeSkip && *(*uint32)(unsafe.Pointer(&q.ring[pos])) == q.capacity-pos
}

// pages applies fn to the ring's memory between positions from and to
// (from before to, less than a ring apart), in two parts when it wraps.
func (q *Queue) pages(from, to uint32, fn func([]byte) error) error {
	n := to - from
	if n > q.capacity {
		n = q.capacity
	}
	pos := from & q.mask
	if pos+n <= q.capacity {
		return fn(q.ring[pos : pos+n])
	}
	return errors.Join(fn(q.ring[pos:]), fn(q.ring[:pos+n-q.capacity]))
}

// releasePages gives back the pages wholly inside mem, a part of the ring,
// and, when mem runs to the ring's end, the ring's last page too: the bytes
// of that page past the ring are past the end of the file, never used.
func (q *Queue) releasePages(mem []byte) error {
	if len(mem) > 0 && unsafe.SliceData(mem) == &q.ring[len(q.ring)-len(mem)] {
		ring := q.ring[:len(q.ring):len(q.ring)]
		end := q.pageEnd(uint32(len(ring)))
		mem = unsafe.Slice(unsafe.SliceData(mem), uint32(len(mem))+end-uint32(len(ring)))
	}
	return shm.ReleasePages(mem)
}

// write encodes rec at byte position at, going on at offset 0 when it runs
// past the end of the ring.
func (q *Queue) write(at uint32, rec *message.Record) {
	pos, size := at&q.mask, uint32(rec.Size())
	if pos+size <= q.capacity {
		rec.Encode(q.ring[pos : pos+size])
		return
	}
	buf := make([]byte, size) // once per lap of the ring at most
	rec.Encode(buf)
	copy(q.ring[0:], buf[copy(q.ring[pos:], buf):])
}

// read copies the record of size bytes at byte position at into dst.
func (q *Queue) read(at, size uint32, dst []byte) {
	pos := at & q.mask
	n := copy(dst[:size], q.ring[pos:min(pos+size, q.capacity)])
	copy(dst[n:size], q.ring[:size-uint32(n)])
}

// Get takes the next record into buf and returns its size, waiting until
// deadline as Put does (ErrEmpty). A record larger than buf, or with more
// than maxDescriptors descriptors, is left in the queue and reported as a
// *RangeError.
func (q *Queue) Get(buf []byte, maxDescriptors int, deadline time.Time) (int, error) {
	n, size, err := q.GetMany(buf, 1, maxDescriptors, deadline)
	if n == 0 {
		return 0, err
	}
	return size, err
}

// GetMany takes records into buf, one after another: it waits, as Get does,
// for the first, then takes up to maxRecords in all while they fit in buf
// and hold maxDescriptors descriptors in all, and commits them with one
// store. It returns how many records it took and the bytes they fill. A
// first record that does not fit is left and reported as a *RangeError.
func (q *Queue) GetMany(buf []byte, maxRecords, maxDescriptors int, deadline time.Time) (int, int, error) {
	if !q.guard.Enter() {
		return 0, 0, ErrClosed
	}
	defer q.guard.Leave()
	return q.getMany(buf, maxRecords, maxDescriptors, futex.Until{Deadline: deadline})
}

// getMany takes records, in a call that entered.
func (q *Queue) getMany(buf []byte, maxRecords, maxDescriptors int, u futex.Until) (int, int, error) {
	if err := q.lock(q.getLock, u, ErrEmpty); err != nil {
		return 0, 0, err
	}
	var gets, head, tail uint32
	for {
		seen := atomic.LoadUint32(q.u32(offDataSeq))
		gets, head = split(atomic.LoadUint64(q.u64(offHead)))
		_, tail = split(atomic.LoadUint64(q.u64(offTail)))
		if head != tail && !q.sound(head, tail) {
			return 0, 0, errors.Join(q.corrupt(head, tail), q.getLock.Unlock())
		}
		if head != tail && !q.onlySkip(head, tail) {
			break
		}
		if head != tail {
			// A skip record and nothing after it: a consumer killed in its
			// rewind, between the commit of the skip and the store that
			// crosses it, left it. Cross it; the queue is empty still.
			q.crossSkip(gets, head)
			continue
		}
		if err := q.wait(q.getLock, offDataSeq, offDataWaiters, seen, u, ErrEmpty); err != nil {
			return 0, 0, err
		}
	}
	n, filled, descriptors := 0, 0, 0
	skipped, crossed := uint32(0), false // the skip record this get crossed
	for n < maxRecords && head != tail {
		pos := head & q.mask
		size := *(*uint32)(unsafe.Pointer(&q.ring[pos]))
		if q.warm && q.ring[pos+4] == typeSkip {
			if size != q.capacity-pos || size > tail-head {
				atomic.StoreUint64(q.u64(offHead), uint64(gets+uint32(n))<<32|uint64(tail))
				return n, filled, errors.Join(fmt.Errorf("queue %q: %w: a skip of %d bytes at %d", q.seg.Name(), header.ErrCorrupt, size, pos), q.getLock.Unlock())
			}
			skipped, crossed = head, true
			head += size // to the next lap: no message
			continue
		}
		if size < message.RecordHeaderSize || size%8 != 0 || size > tail-head || pos%8 != 0 {
			// A record that cannot be one: drop everything up to the tail
			// rather than read out of bounds.
			atomic.StoreUint64(q.u64(offHead), uint64(gets+uint32(n))<<32|uint64(tail))
			return n, filled, errors.Join(fmt.Errorf("queue %q: %w: a record of %d bytes", q.seg.Name(), header.ErrCorrupt, size), q.getLock.Unlock())
		}
		ndesc := int(*(*uint16)(unsafe.Pointer(&q.ring[pos+6])))
		if filled+int(size) > len(buf) || descriptors+ndesc > maxDescriptors {
			if n == 0 {
				return 0, 0, errors.Join(&RangeError{Need: int(size), Descriptors: ndesc}, q.getLock.Unlock())
			}
			break
		}
		q.read(head, size, buf[filled:])
		filled += int(size)
		descriptors += ndesc
		head += size
		n++
	}
	atomic.StoreUint64(q.u64(offHead), uint64(gets+uint32(n))<<32|uint64(head)) // commit
	if crossed {
		q.giveBackSkipped(skipped)
	}
	if q.sparse {
		q.giveBack(head)
	}
	if q.warm && n > 0 && head == tail {
		q.rewind(gets+uint32(n), head)
	}
	if err := q.getLock.Unlock(); err != nil {
		return n, filled, err
	}
	// Messages left behind: wake the next waiting consumer (the cascade of
	// PutMany's single wake-up).
	puts, _ := split(atomic.LoadUint64(q.u64(offTail)))
	if puts != gets+uint32(n) {
		if err := q.signal(offDataSeq, offDataWaiters, 1); err != nil {
			return n, filled, err
		}
		return n, filled, q.signal(offSpaceSeq, offSpaceWaiters, 1)
	}
	// Note [an empty queue wakes every space sleeper]: a host thread that
	// watches for messages (Python's readiness thread) sleeps on the space
	// word while the queue holds some, to see it emptied; with a producer
	// asleep there too (waiting for room), one wake-up could go to the
	// producer, and the watcher slept on past the get that emptied the
	// queue, missing the put after it, which wakes only data sleepers. A
	// get that leaves the queue empty wakes them all.
	return n, filled, q.signal(offSpaceSeq, offSpaceWaiters, 1<<30)
}

// WaitNonEmpty returns once the queue holds a message, without taking it,
// waiting until deadline as Get does (ErrEmpty). Another consumer may take
// the message first: it says that a Get would have found one, for a
// caller that waits on many things at once (a readiness file descriptor).
func (q *Queue) WaitNonEmpty(deadline time.Time) error {
	if !q.guard.Enter() {
		return ErrClosed
	}
	defer q.guard.Leave()
	return q.waitNonEmpty(futex.Until{Deadline: deadline})
}

// WaitNonEmptyContext waits as WaitNonEmpty does until ctx is done: its
// deadline (ErrEmpty), or its cancellation, which wakes the wait at once
// (ErrEmpty and ctx.Err()).
func (q *Queue) WaitNonEmptyContext(ctx context.Context) error {
	if !q.guard.Enter() {
		return ErrClosed
	}
	defer q.guard.Leave()
	u, stop := q.until(ctx, offDataSeq, offDataWaiters)
	defer stop() // before Leave: Close waits for the wake
	err := q.waitNonEmpty(u)
	if errors.Is(err, ErrEmpty) {
		err = futex.Cause(ctx, err)
	}
	return err
}

// waitNonEmpty waits for a message, in a call that entered.
func (q *Queue) waitNonEmpty(u futex.Until) error {
	for woken := false; ; woken = true {
		seen := atomic.LoadUint32(q.u32(offDataSeq))
		if q.len() > 0 {
			if woken {
				// A put wakes one waiter when the queue was empty; this one
				// takes nothing, so it passes the wake-up on to a consumer.
				return q.signal(offDataSeq, offDataWaiters, 1)
			}
			return nil
		}
		if err := q.sleep(offDataSeq, offDataWaiters, seen, u, ErrEmpty); err != nil {
			return err
		}
	}
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

// lock takes m until u's deadline; a timeout is reported as timeoutErr. A
// free lock is taken without reading the clock.
func (q *Queue) lock(m lock.Mutex, u futex.Until, timeoutErr error) error {
	if ok, err := m.TryLock(); ok || err != nil {
		return err
	}
	deadline := u.Deadline
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		deadline = time.Now().Add(time.Millisecond) // a non-blocking call still waits out a brief lock
	}
	if _, err := m.Lock(deadline); err != nil {
		if errors.Is(err, lock.ErrTimeout) {
			return timeoutErr
		}
		return err
	}
	return nil
}

// wait releases m, sleeps on the sequence word at seqOff until it moves
// from seen or u ends, and takes m again.
func (q *Queue) wait(m lock.Mutex, seqOff, waitersOff int, seen uint32, u futex.Until, timeoutErr error) error {
	if err := m.Unlock(); err != nil {
		return err
	}
	if err := q.sleep(seqOff, waitersOff, seen, u, timeoutErr); err != nil {
		return err
	}
	return q.lock(m, u, timeoutErr)
}

// seq returns the sequence word at seqOff with its waiters at waitersOff.
func (q *Queue) seq(seqOff, waitersOff int) futex.Seq {
	return futex.Seq{Word: q.u32(seqOff), Waiters: q.u32(waitersOff)}
}

// sleep waits for the sequence word at seqOff to move from seen, after a
// short spin, and for at most recheckEvery: a wake-up meant for a consumer
// that was killed before passing it on is then made up for.
func (q *Queue) sleep(seqOff, waitersOff int, seen uint32, u futex.Until, timeoutErr error) error {
	if q.guard.Closed() {
		return ErrClosed
	}
	if u.Stopped() || !u.Deadline.IsZero() && !time.Now().Before(u.Deadline) {
		return timeoutErr // a call that does not wait does not spin either
	}
	err := q.seq(seqOff, waitersOff).Sleep(seen, *q.policy.Load(), u.Deadline, recheckEvery, q.interruptible)
	if errors.Is(err, futex.ErrTimeout) {
		return timeoutErr
	}
	return err
}

// signal bumps the sequence word at seqOff and wakes up to n waiters.
func (q *Queue) signal(seqOff, waitersOff int, n int) error {
	return q.seq(seqOff, waitersOff).Signal(n)
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
		return q.seg.Close()
	})
	if !closed {
		return ErrClosed
	}
	return err
}

// Words a host may sleep on outside Go (ArmWait).
const (
	WaitData  = 0 // bumped by every put: a message may be there
	WaitSpace = 1 // bumped by every get: room may be there
	WaitJoin  = 2 // bumped when every message was marked done
)

// waitWords are the sequence words and waiter counts of WaitData,
// WaitSpace and WaitJoin.
var waitWords = [...][2]int{{offDataSeq, offDataWaiters}, {offSpaceSeq, offSpaceWaiters}, {offJoinSeq, offJoinWaiters}}

// ArmWait counts the calling host thread among the sleepers on the word
// which names, and returns the word and the value to sleep on, for a sleep
// outside Go (Note [sleeping outside Go] in package futex): the host looks
// again (a get or put that does not wait) and sleeps only if it still must,
// then calls DisarmWait. The word stays valid while the handle is open; a
// sleep on it after Close fails or ends, and never faults.
func (q *Queue) ArmWait(which int) (*uint32, uint32, error) {
	if which < 0 || which >= len(waitWords) {
		return nil, 0, fmt.Errorf("queue wait word %d: %w", which, unix.EINVAL)
	}
	if !q.guard.Enter() {
		return nil, 0, ErrClosed
	}
	defer q.guard.Leave()
	s := q.seq(waitWords[which][0], waitWords[which][1])
	return s.Word, q.armed.Arm(which, s), nil
}

// DisarmWait takes back an ArmWait of which. passOn says that the sleeper
// was woken and takes no message: when messages are there, a consumer is
// woken in its place (a put wakes one sleeper, and this one may have been
// it). A DisarmWait with no ArmWait before it is refused.
func (q *Queue) DisarmWait(which int, passOn bool) error {
	if which < 0 || which >= len(waitWords) {
		return fmt.Errorf("queue wait word %d: %w", which, unix.EINVAL)
	}
	if !q.guard.Enter() {
		return ErrClosed
	}
	defer q.guard.Leave()
	if !q.armed.Disarm(which, q.seq(waitWords[which][0], waitWords[which][1])) {
		return fmt.Errorf("queue wait word %d was not armed: %w", which, unix.EINVAL)
	}
	if passOn && which == WaitData && q.len() > 0 {
		return q.signal(offDataSeq, offDataWaiters, 1)
	}
	return nil
}

// wakeAll wakes every waiter of the queue, in any process: they look again
// (a spurious wake-up to those of other processes).
func (q *Queue) wakeAll() {
	for _, s := range waitWords {
		_ = q.signal(s[0], s[1], 1<<30) // FUTEX_WAKE on mapped memory does not fail
	}
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
