// Package event is a flag in a shared segment that processes set, clear and
// wait for, as threading.Event and multiprocessing.Event do.
package event

import (
	"errors"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/dtype"
	"github.com/zctipc/zctipc/go/futex"
	"github.com/zctipc/zctipc/go/header"
	"github.com/zctipc/zctipc/go/shm"
)

// Layout of an event segment's data region (docs/format.md).
const (
	offFlag    = 0 // u32 1 when set; waiters sleep on it while it is 0
	offWaiters = 4 // u32
	size       = 64
)

const (
	spinFor      = 20 * time.Microsecond
	recheckEvery = time.Second
)

// Event is an event segment attached in this process.
type Event struct {
	seg  *shm.Segment
	flag *uint32
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
func (e *Event) IsSet() bool { return atomic.LoadUint32(e.flag) != 0 }

// Set sets the event and wakes every waiter.
func (e *Event) Set() error {
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
func (e *Event) Clear() { atomic.StoreUint32(e.flag, 0) }

// Wait waits until the event is set or deadline passes (none when zero),
// and reports whether it is set.
func (e *Event) Wait(deadline time.Time) (bool, error) {
	seq := futex.Seq{Word: e.flag, Waiters: e.waiters()}
	for !e.IsSet() {
		// Sleep while the flag stays 0: Set moves it.
		err := seq.Sleep(0, spinFor, deadline, recheckEvery, e.interruptible)
		if errors.Is(err, futex.ErrTimeout) {
			return e.IsSet(), nil
		}
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

func (e *Event) waiters() *uint32 { return (*uint32)(unsafe.Pointer(&e.seg.Data()[offWaiters])) }

// Close closes this process's handle on the event.
func (e *Event) Close() error { return e.seg.Close() }
