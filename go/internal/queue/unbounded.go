package queue

import (
	"errors"
	"sync/atomic"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

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

// pageEnd returns the ring offset where the memory page that holds ring
// offset off-1 ends.
func (q *Queue) pageEnd(off uint32) uint32 {
	page := uintptr(unix.Getpagesize())
	base := uintptr(unsafe.Pointer(&q.ring[0]))
	return uint32((base+uintptr(off)+page-1)&^(page-1) - base)
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
