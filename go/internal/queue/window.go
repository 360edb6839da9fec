package queue

import (
	"sync/atomic"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

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

// window returns the ring offset up to which the warm window's pages are
// reserved (at most WarmWindow, whatever the word says).
func (q *Queue) window() uint32 { return min(atomic.LoadUint32(q.u32(offWindow)), WarmWindow) }

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
