package queue

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
)

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
func (q *Queue) GetContext(ctx context.Context, buf []byte, maxViews int) (int, error) {
	if !q.guard.Enter() {
		return 0, ErrClosed
	}
	defer q.guard.Leave()
	u, stop := q.until(ctx, offDataSeq, offDataWaiters)
	defer stop() // before Leave: Close waits for the wake
	n, size, err := q.getMany(buf, 1, maxViews, u)
	if n == 0 {
		if errors.Is(err, ErrEmpty) {
			err = futex.Cause(ctx, err)
		}
		return 0, err
	}
	return size, err
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

// Get takes the next record into buf and returns its size, waiting until
// deadline as Put does (ErrEmpty). A record larger than buf, or with more
// than maxViews views (message.Views), is left in the queue and reported
// as a *RangeError.
func (q *Queue) Get(buf []byte, maxViews int, deadline time.Time) (int, error) {
	n, size, err := q.GetMany(buf, 1, maxViews, deadline)
	if n == 0 {
		return 0, err
	}
	return size, err
}

// GetMany takes records into buf, one after another: it waits, as Get does,
// for the first, then takes up to maxRecords in all while they fit in buf
// and make maxViews views in all (message.Views: a taker is given one per
// descriptor, and one of an inline record's array), and commits them with
// one store. It returns how many records it took and the bytes they fill.
// A first record that does not fit is left and reported as a *RangeError.
func (q *Queue) GetMany(buf []byte, maxRecords, maxViews int, deadline time.Time) (int, int, error) {
	if !q.guard.Enter() {
		return 0, 0, ErrClosed
	}
	defer q.guard.Leave()
	return q.getMany(buf, maxRecords, maxViews, futex.Until{Deadline: deadline})
}

// getMany takes records, in a call that entered.
func (q *Queue) getMany(buf []byte, maxRecords, maxViews int, u futex.Until) (int, int, error) {
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
	n, filled, views := 0, 0, 0
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
		need := message.Views(q.ring[pos+4], int(*(*uint16)(unsafe.Pointer(&q.ring[pos+6]))))
		if filled+int(size) > len(buf) || views+need > maxViews {
			if n == 0 {
				return 0, 0, errors.Join(&RangeError{Need: int(size), Views: need}, q.getLock.Unlock())
			}
			break
		}
		q.read(head, size, buf[filled:])
		filled += int(size)
		views += need
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
