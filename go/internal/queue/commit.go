package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
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

// PutSending is Put of a record that hands counts over: the put step runs
// sends (plane.Send: each count's ledger entry dropped, its ticket armed)
// once it found room for rec, just before rec is visible, and a put that
// returns an error has run none, save one that faulted in them
// (ErrSendsFaulted). So a put that waits, for room or for the lock, waits
// with every count in the ledger (package buffer, Note [counts that wait]).
func (q *Queue) PutSending(rec *message.Record, deadline time.Time, sends []plane.Send) error {
	if !q.guard.Enter() {
		return ErrClosed
	}
	defer q.guard.Leave()
	one := [1]*message.Record{rec}
	_, err := q.putSending(one[:], futex.Until{Deadline: deadline}, sends)
	return err
}

// PutSendingContext is PutContext of a record that hands counts over, as
// PutSending.
func (q *Queue) PutSendingContext(ctx context.Context, rec *message.Record, sends []plane.Send) error {
	if !q.guard.Enter() {
		return ErrClosed
	}
	defer q.guard.Leave()
	u, stop := q.until(ctx, offSpaceSeq, offSpaceWaiters)
	defer stop() // before Leave: Close waits for the wake
	_, err := q.putSending([]*message.Record{rec}, u, sends)
	if errors.Is(err, ErrFull) {
		err = futex.Cause(ctx, err)
	}
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

// putMany appends records, in a call that entered: the data plane's put
// step (package plane), with the waits it asks for.
func (q *Queue) putMany(recs []*message.Record, u futex.Until) (int, error) {
	return q.putSending(recs, u, nil)
}

// putSending is putMany, whose step runs sends (the first record's) once
// it puts.
func (q *Queue) putSending(recs []*message.Record, u futex.Until, sends []plane.Send) (int, error) {
	if len(recs) == 0 {
		return 0, nil
	}
	parts := make([]plane.Record, len(recs))
	for i, rec := range recs {
		size := rec.Size()
		if uint64(size) > uint64(q.maxRecord) {
			return 0, fmt.Errorf("a message of %d bytes in a queue that takes %d: %w", size, q.maxRecord, ErrTooLarge)
		}
		prefix, payload := rec.Parts()
		parts[i] = plane.Record{Prefix: prefix, Payload: payload, Size: uint32(size)}
	}
	parts[0].Sends = sends
	flags := 0
	for {
		var out plane.Out
		r := q.p.Put(parts, flags, &out)
		flags = 0
		switch r {
		case plane.OK:
			return plane.Count(&out), nil
		case plane.Busy:
			if err := q.lock(q.putLock, u, ErrFull); err != nil {
				return 0, err
			}
			flags = plane.Locked
		case plane.CatchUp: // the put lock is ours still
			moved, err := q.catchUp(u)
			if err != nil {
				return 0, errors.Join(err, q.putLock.Unlock())
			}
			if !moved {
				if err := q.wait(q.putLock, offSpaceSeq, offSpaceWaiters, plane.Seen(&out), u, ErrFull); err != nil {
					return 0, err
				}
			}
			flags = plane.Locked // pages a killed consumer left were given back: look again
		case plane.Wait:
			if err := q.sleep(offSpaceSeq, offSpaceWaiters, plane.Seen(&out), u, ErrFull); err != nil {
				return 0, err
			}
		case plane.NoMemory:
			need, _, _ := plane.Need(&out)
			return 0, shm.ReserveFailed(uint64(need), unix.Errno(plane.Errno(&out)))
		default:
			return 0, q.stepError(r, &out)
		}
	}
}

// catchUp gives back, under the get lock, the chunks behind head that a
// consumer killed after its commit did not: a put calls it, holding the
// put lock, when its record does not fit. It reports whether it gave any
// back.
func (q *Queue) catchUp(u futex.Until) (bool, error) {
	if q.lock(q.getLock, u, ErrFull) != nil {
		return false, nil
	}
	var out plane.Out
	moved, r := q.p.CatchUp(&out)
	err := q.getLock.Unlock()
	if r != plane.OK {
		return false, errors.Join(q.stepError(r, &out), err)
	}
	return moved, err
}

// stepError is the error of a step of the data plane that failed.
func (q *Queue) stepError(r int, out *plane.Out) error {
	a, b, what := plane.Need(out)
	switch {
	case r == plane.Fault && what == plane.InSends:
		return fmt.Errorf("%w: %w", ErrSendsFaulted, &fault.Error{Addr: plane.Addr(out)})
	case r == plane.Fault:
		return &fault.Error{Addr: plane.Addr(out)}
	case r == plane.TooLarge:
		return fmt.Errorf("a message of %d bytes in a queue that takes %d: %w", a, q.maxRecord, ErrTooLarge)
	case r == plane.Corrupt && what == plane.BadSkip:
		return fmt.Errorf("queue %q: %w: a skip of %d bytes at %d", q.seg.Name(), header.ErrCorrupt, a, b)
	case r == plane.Corrupt && what == plane.BadRecord:
		return fmt.Errorf("queue %q: %w: a record of %d bytes", q.seg.Name(), header.ErrCorrupt, a)
	case r == plane.Corrupt:
		return q.corrupt(a, b)
	}
	return fmt.Errorf("queue %q: the data plane's step ended with %d: %w", q.seg.Name(), r, header.ErrCorrupt)
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

// getMany takes records, in a call that entered: the data plane's get
// step (package plane), with the waits it asks for.
func (q *Queue) getMany(buf []byte, maxRecords, maxViews int, u futex.Until) (int, int, error) {
	flags := 0
	for {
		var out plane.Out
		r := q.p.Get(buf, maxRecords, maxViews, flags, &out)
		flags = 0
		switch r {
		case plane.OK:
			filled, _ := plane.Filled(&out)
			return plane.Count(&out), filled, nil
		case plane.Busy:
			if err := q.lock(q.getLock, u, ErrEmpty); err != nil {
				return 0, 0, err
			}
			flags = plane.Locked
		case plane.Wait:
			if err := q.sleep(offDataSeq, offDataWaiters, plane.Seen(&out), u, ErrEmpty); err != nil {
				return 0, 0, err
			}
		case plane.Range:
			need, views, _ := plane.Need(&out)
			return 0, 0, &RangeError{Need: int(need), Views: int(views)}
		default:
			// A corrupt record after good ones: those are taken, and
			// everything up to the tail was dropped.
			filled, _ := plane.Filled(&out)
			return plane.Count(&out), filled, q.stepError(r, &out)
		}
	}
}
