// Package event is a flag in a shared segment that processes set, clear and
// wait for, as threading.Event and multiprocessing.Event do.
package event

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/guard"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/shm"
)

// ErrClosed means this handle on the event was closed, before the call or
// while it waited.
var ErrClosed = fmt.Errorf("event is closed: %w", shm.ErrClosed)

// Layout of an event segment's data region (docs/format.md).
const (
	offFlag    = 0 // u32 1 when set; waiters sleep on it while it is 0
	offWaiters = 4 // u32
	size       = 64
)

const (
	spinFor       = 20 * time.Microsecond
	recheckEvery  = time.Second
	cancelRecheck = 20 * time.Millisecond
)

// Event is an event segment attached in this process. It is safe for
// concurrent use: Close may be called while other goroutines wait, which
// then return ErrClosed.
type Event struct {
	guard guard.Guard
	seg   *shm.Segment
	flag  *uint32
	// interruptible makes Wait return futex.ErrInterrupted on a signal.
	interruptible bool
}

// Create makes an event, clear. An empty name makes a random one.
func Create(name string) (*Event, error) {
	seg, err := shm.Create(name, header.KindEvent, dtype.Uint8, []int64{size})
	if err != nil {
		return nil, err
	}
	return open(seg), nil
}

// Attach attaches the event segment name.
func Attach(name string) (*Event, error) {
	seg, err := shm.Attach(name, header.KindEvent, false)
	if err != nil {
		return nil, err
	}
	if len(seg.Data()) < size {
		return nil, errors.Join(header.ErrCorrupt, seg.Close())
	}
	return open(seg), nil
}

func open(seg *shm.Segment) *Event {
	return &Event{seg: seg, flag: (*uint32)(unsafe.Pointer(&seg.Data()[offFlag]))}
}

// SetInterruptible says whether a signal during Wait ends it with
// futex.ErrInterrupted (for a host that must run its handlers).
func (e *Event) SetInterruptible(on bool) { e.interruptible = on }

// Segment returns the event's segment.
func (e *Event) Segment() *shm.Segment { return e.seg }

// IsSet reports whether the event is set.
func (e *Event) IsSet() (bool, error) {
	if !e.guard.Enter() {
		return false, ErrClosed
	}
	defer e.guard.Leave()
	return e.isSet(), nil
}

func (e *Event) isSet() bool { return atomic.LoadUint32(e.flag) != 0 }

// Set sets the event and wakes every waiter.
func (e *Event) Set() error {
	if !e.guard.Enter() {
		return ErrClosed
	}
	defer e.guard.Leave()
	if atomic.SwapUint32(e.flag, 1) != 0 {
		return nil
	}
	if atomic.LoadUint32(e.waiters()) == 0 {
		return nil
	}
	_, err := futex.Wake(e.flag, math.MaxInt32)
	return err
}

// Clear clears the event.
func (e *Event) Clear() error {
	if !e.guard.Enter() {
		return ErrClosed
	}
	defer e.guard.Leave()
	atomic.StoreUint32(e.flag, 0)
	return nil
}

// Wait waits until the event is set or deadline passes (none when zero),
// and reports whether it is set.
func (e *Event) Wait(deadline time.Time) (bool, error) {
	if !e.guard.Enter() {
		return false, ErrClosed
	}
	defer e.guard.Leave()
	return e.wait(futex.Until{Deadline: deadline})
}

// WaitContext waits until the event is set or ctx is done, and reports
// whether it is set; a cancellation wakes the wait at once.
func (e *Event) WaitContext(ctx context.Context) (bool, error) {
	if !e.guard.Enter() {
		return false, ErrClosed
	}
	defer e.guard.Leave()
	u, stop := futex.WakeOnDone(ctx, e.wakeAll)
	defer stop() // before Leave: Close waits for the wake
	return e.wait(u)
}

// wait waits as Wait does, in a call that entered.
func (e *Event) wait(u futex.Until) (bool, error) {
	seq := futex.Seq{Word: e.flag, Waiters: e.waiters()}
	recheck := recheckEvery
	if u.Done != nil {
		// A cancellation wakes the sleeper, but cannot move the flag: one
		// that comes just before the sleep is seen at the next recheck.
		recheck = cancelRecheck
	}
	for !e.isSet() {
		if e.guard.Closed() {
			return false, ErrClosed
		}
		if u.Stopped() {
			return false, nil
		}
		// Sleep while the flag stays 0: Set moves it.
		err := seq.Sleep(0, futex.Policy{Spin: spinFor}, u.Deadline, recheck, e.interruptible)
		if errors.Is(err, futex.ErrTimeout) {
			return e.isSet(), nil
		}
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

func (e *Event) waiters() *uint32 { return (*uint32)(unsafe.Pointer(&e.seg.Data()[offWaiters])) }

// Close closes this process's handle on the event. A Wait in another
// goroutine returns ErrClosed; closing twice returns ErrClosed.
func (e *Event) Close() error {
	if !e.guard.Close(e.wakeAll) {
		return ErrClosed
	}
	return e.seg.Close()
}

// wakeAll wakes every waiter of the event, in any process, to look again.
// (The flag cannot move without setting the event, so a waiter that went to
// sleep just after the wake sees the close when its bounded sleep ends.)
func (e *Event) wakeAll() {
	_, _ = futex.Wake(e.flag, math.MaxInt32) // FUTEX_WAKE on mapped memory does not fail
}
