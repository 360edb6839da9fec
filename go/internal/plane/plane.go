// Package plane is the data plane: the steps that every message of a queue
// takes (put, get, the locks and sequence words they use, the spin and the
// poll of a wait, the codecs of an inline array and of a descriptor), the
// counts a hand-off carries (a pool slot's protocol, the table of the
// arenas a process maps, its ledger entries), a stream reader's look and
// release and a stream writer's claim and publish, written once in C. The
// Go packages call them through cgo; the C ABI calls them directly, so that
// a host that puts and gets through it never enters the Go runtime on the
// way (Note [a data plane the runtime never enters]).
//
// A step never waits. One that would (a lock another holds, no room, no
// message) says so, and the caller waits as it always did, in Go (package
// queue) or outside it (zct_sleep), then calls again.
package plane

/*
#include <stdlib.h>
#include "plane.h"
*/
import "C"

import (
	"runtime"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/fault"
)

// Note [a data plane the runtime never enters]. A call from C into Go that
// comes after the process has been idle for more than some tens of
// microseconds finds that the runtime's monitor thread (sysmon) went to
// sleep and took the thread's processor back; getting a processor wakes
// the monitor (exitsyscallTryGetP, one futex wake-up and one more thread
// to run), before the call does any work. Measured here with Go 1.26.8 and
// 1.27.3 alike: 1.5 wake-ups of the monitor for each call that comes after
// 1 ms of idling, 2.4 after 20 ms. A put whose consumer is asleep pays it
// on the producer's side before the consumer's wake-up, and a consumer
// that slept outside Go pays it again before it holds the message. The
// steps every message takes are therefore C, compiled into the library by
// cgo: the C ABI's calls that do not wait run them without entering Go,
// and package queue runs the same code through cgo, so the protocol has
// one implementation. Go keeps everything that happens once per queue or
// once per wait: opening and closing, the layout's checks, waiting and
// taking over a lock whose holder died.

// Results of a step (plane.h).
const (
	OK        = C.ZP_OK
	Busy      = C.ZP_BUSY
	Wait      = C.ZP_WAIT
	CatchUp   = C.ZP_CATCH_UP
	Corrupt   = C.ZP_CORRUPT
	NoMemory  = C.ZP_NO_MEMORY
	Range     = C.ZP_RANGE
	Fault     = C.ZP_FAULT
	TooLarge  = C.ZP_TOO_LARGE
	Locked    = C.ZP_LOCKED
	BadWords  = C.ZP_BAD_POSITIONS
	BadSkip   = C.ZP_BAD_SKIP
	BadRecord = C.ZP_BAD_RECORD
	InSends   = C.ZP_IN_SENDS
)

// Layout of a queue's data region (docs/format.md), as plane.h has it.
const (
	OffCapacity     = C.ZP_OFF_CAPACITY
	OffMaxItems     = C.ZP_OFF_MAX_ITEMS
	OffRingVersion  = C.ZP_OFF_RING_VERSION
	OffPutLock      = C.ZP_OFF_PUT_LOCK
	OffTail         = C.ZP_OFF_TAIL
	OffReserved     = C.ZP_OFF_RESERVED
	OffWindow       = C.ZP_OFF_WINDOW
	OffWindowNeed   = C.ZP_OFF_WINDOW_NEED
	OffGetLock      = C.ZP_OFF_GET_LOCK
	OffHead         = C.ZP_OFF_HEAD
	OffGivenBack    = C.ZP_OFF_GIVEN_BACK
	OffDone         = C.ZP_OFF_DONE
	OffDataSeq      = C.ZP_OFF_DATA_SEQ
	OffDataWaiters  = C.ZP_OFF_DATA_WAITERS
	OffSpaceSeq     = C.ZP_OFF_SPACE_SEQ
	OffSpaceWaiters = C.ZP_OFF_SPACE_WAITERS
	OffJoinSeq      = C.ZP_OFF_JOIN_SEQ
	OffJoinWaiters  = C.ZP_OFF_JOIN_WAITERS
	RingAt          = C.ZP_RING_AT
	// Chunk, WarmWindow, ReserveStep and TypeSkip are package queue's
	// chunk, WarmWindow, reserveStep and typeSkip.
	Chunk       = C.ZP_CHUNK
	WarmWindow  = C.ZP_WARM_WINDOW
	ReserveStep = C.ZP_RESERVE_STEP
	TypeSkip    = C.ZP_TYPE_SKIP
)

// Queue is a queue as the plane sees it, in C memory so that the C ABI may
// hold it between calls: New makes it, Free lets it go once no step runs.
type Queue C.zp_queue

// Params are what a Queue is made of: the layout's values, checked by the
// caller, and this process's identity for the locks.
type Params struct {
	Data               unsafe.Pointer // the data region, mapped for as long as the Queue lives
	Capacity, MaxItems uint32
	MaxRecord          uint32
	Sparse, Warm       bool
	PageSize           int
	PID                uint32
	StartTime          uint64
}

// New makes a Queue.
func New(p Params) *Queue {
	q := (*C.zp_queue)(C.calloc(1, C.sizeof_zp_queue))
	q.data = (*C.uint8_t)(p.Data)
	q.capacity = C.uint32_t(p.Capacity)
	q.mask = C.uint32_t(p.Capacity - 1)
	q.max_items = C.uint32_t(p.MaxItems)
	q.max_record = C.uint32_t(p.MaxRecord)
	q.sparse = b32(p.Sparse)
	q.warm = b32(p.Warm)
	q.page = C.uint32_t(p.PageSize)
	q.pid = C.uint32_t(p.PID)
	q.start = C.uint64_t(p.StartTime)
	return (*Queue)(q)
}

func b32(b bool) C.uint32_t {
	if b {
		return 1
	}
	return 0
}

// Free lets q go.
func (q *Queue) Free() { C.free(unsafe.Pointer(q)) }

// Out is what a step reports besides its result (zp_out).
type Out = C.zp_out

// Seen is the word's value to sleep on after Wait or CatchUp.
func Seen(o *Out) uint32 { return uint32(o.seen) }

// Count is the records a step put or took.
func Count(o *Out) int { return int(o.n) }

// Filled is the bytes a get filled, and the views its records make.
func Filled(o *Out) (int, int) { return int(o.filled), int(o.views) }

// Need is what a Range, TooLarge or Corrupt step met: sizes, or positions
// (BadWords), and which check failed (Corrupt).
func Need(o *Out) (uint32, uint32, int) { return uint32(o.need), uint32(o.need_views), int(o.what) }

// Errno is the error number of a NoMemory step.
func Errno(o *Out) int { return int(o.err) }

// Addr is the address a Fault step faulted at.
func Addr(o *Out) uintptr { return uintptr(o.addr) }

// Record is one record to put: prefix (its header and descriptors,
// encoded) then payload, size bytes in all (rounded up to 8), and the
// counts it hands over (Sends).
type Record struct {
	Prefix  []byte
	Payload []byte
	Size    uint32
	Sends   []Send
}

// Send is a count a record hands over (zp_send): the put step drops its
// ledger entry and arms its ticket once it found room for the record, just
// before the record is visible, and a put that puts nothing leaves both as
// they were (package buffer, Note [counts that wait]). It holds no Go
// pointer.
type Send C.zp_send

// NewSend returns the send of a count recorded at entry of l (nil, or a
// negative entry: none) whose ticket is slot of ticket arena t (nil: none)
// with nonce.
func NewSend(l *Ledger, entry int, t *Arena, slot uint32, nonce uint64) Send {
	s := Send{l: (*C.zp_ledger)(l), entry: C.int32_t(entry), tslot: C.uint32_t(slot), nonce: C.uint64_t(nonce)}
	if t != nil {
		s.t = C.zp_arena(*t)
	}
	return s
}

// Put runs the put step for recs (zp_put): Fault with InSends (Need's
// third value) when it faulted once the counts of its sends may have left
// the ledger (plane.h, ZP_IN_SENDS).
func (q *Queue) Put(recs []Record, flags int, out *Out) int {
	if len(recs) == 1 {
		// The common case, without pinning: pointers passed as arguments
		// stay put for the call.
		r := &recs[0]
		var sends *C.zp_send
		if len(r.Sends) > 0 {
			sends = (*C.zp_send)(&r.Sends[0])
		}
		return int(C.zp_put1((*C.zp_queue)(q), first(r.Prefix), C.uint32_t(len(r.Prefix)), first(r.Payload),
			C.uint64_t(len(r.Payload)), C.uint32_t(r.Size), sends, C.int32_t(len(r.Sends)), C.int32_t(flags), out))
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	cr := make([]C.zp_record, 0, len(recs))
	for i := range recs {
		r := &recs[i]
		c := C.zp_record{prefix_len: C.uint32_t(len(r.Prefix)), payload_len: C.uint64_t(len(r.Payload)), size: C.uint32_t(r.Size)}
		if len(r.Prefix) > 0 {
			pin.Pin(&r.Prefix[0])
			c.prefix = unsafe.Pointer(&r.Prefix[0])
		}
		if len(r.Payload) > 0 {
			pin.Pin(&r.Payload[0])
			c.payload = unsafe.Pointer(&r.Payload[0])
		}
		if len(r.Sends) > 0 {
			pin.Pin(&r.Sends[0])
			c.sends = (*C.zp_send)(&r.Sends[0])
			c.nsends = C.int32_t(len(r.Sends))
		}
		cr = append(cr, c)
	}
	if len(cr) == 0 {
		return OK
	}
	return int(C.zp_put((*C.zp_queue)(q), &cr[0], C.int32_t(len(cr)), C.int32_t(flags), out))
}

// first returns the address of b's first byte, or nil.
func first(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// Get runs the get step into buf (zp_get).
func (q *Queue) Get(buf []byte, maxRecords, maxViews, flags int, out *Out) int {
	return int(C.zp_get((*C.zp_queue)(q), first(buf), C.uint64_t(len(buf)), C.int32_t(maxRecords), C.int32_t(maxViews), C.int32_t(flags), out))
}

// CatchUp runs zp_catch_up, with both locks held: whether it gave back
// anything.
func (q *Queue) CatchUp(out *Out) (bool, int) {
	var moved C.int32_t
	r := C.zp_catch_up((*C.zp_queue)(q), &moved, out)
	return moved != 0, int(r)
}

// TryLock takes the lock whose words are at p if it is free (zp_try_lock);
// an error when its memory faulted.
func TryLock(p unsafe.Pointer, pid uint32, start uint64) (bool, error) {
	switch C.zp_try_lock((*C.uint32_t)(p), C.uint32_t(pid), C.uint64_t(start)) {
	case OK:
		return true, nil
	case Busy:
		return false, nil
	}
	return false, &fault.Error{Addr: uintptr(p)}
}

// Unlock lets the lock at p go (zp_unlock); an error when its memory
// faulted.
func Unlock(p unsafe.Pointer) error {
	if C.zp_unlock((*C.uint32_t)(p)) != OK {
		return &fault.Error{Addr: uintptr(p)}
	}
	return nil
}

// Spin looks at word for d, yielding the CPU between looks (zp_spin):
// whether it moved from seen, or its memory faulted.
func Spin(word *uint32, seen uint32, d time.Duration) bool {
	return C.zp_spin((*C.uint32_t)(unsafe.Pointer(word)), C.uint32_t(seen), C.int64_t(d), 0) != Wait
}

// Poll is Spin keeping the CPU between looks (zp_spin's poll).
func Poll(word *uint32, seen uint32, d time.Duration) bool {
	return C.zp_spin((*C.uint32_t)(unsafe.Pointer(word)), C.uint32_t(seen), C.int64_t(d), 1) != Wait
}

// Signal bumps word and wakes up to n of its sleepers (zp_signal); an
// error when its memory faulted.
func Signal(word, waiters *uint32, n int) error {
	if C.zp_signal((*C.uint32_t)(unsafe.Pointer(word)), (*C.uint32_t)(unsafe.Pointer(waiters)), C.int32_t(n)) != OK {
		return &fault.Error{Addr: uintptr(unsafe.Pointer(word))}
	}
	return nil
}

// Sleepers, on a sequence word's waiters and a party's own count mine (nil
// when none): package futex's Note [a dead party's sleepers], as the C
// steps count them (zp_sleepers). Each fails only when the memory faulted.

// CountSleeper counts one sleeper.
func CountSleeper(waiters, mine *uint32) error {
	return sleepers(C.ZP_COUNT, waiters, mine, 0)
}

// UncountSleepers takes back n sleepers: what mine still has of them,
// when there is a mine, and never below zero.
func UncountSleepers(waiters, mine *uint32, n uint32) error {
	return sleepers(C.ZP_UNCOUNT, waiters, mine, n)
}

// TakeBackSleepers takes every sleeper mine counts out of waiters, for a
// party that died armed.
func TakeBackSleepers(waiters, mine *uint32) error {
	return sleepers(C.ZP_TAKE_BACK, waiters, mine, 0)
}

func sleepers(op C.int32_t, waiters, mine *uint32, n uint32) error {
	r := C.zp_sleepers(op, (*C.uint32_t)(unsafe.Pointer(waiters)), (*C.uint32_t)(unsafe.Pointer(mine)), C.uint32_t(n))
	if r != OK {
		return &fault.Error{Addr: uintptr(unsafe.Pointer(waiters))}
	}
	return nil
}
