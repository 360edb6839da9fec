package queue

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/lock"
	"golang.org/x/sys/unix"
)

const (
	// recheckEvery bounds one sleep of a waiter.
	recheckEvery = time.Second
)

// until returns the wait of ctx, and arranges for its cancellation to wake
// the waiters of the sequence word at seqOff; stop undoes that.
func (q *Queue) until(ctx context.Context, seqOff, waitersOff int) (futex.Until, func()) {
	return futex.WakeOnDone(ctx, func() { _ = q.signal(seqOff, waitersOff, 1<<30) })
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
