// Package guard lets an object be closed by one goroutine while others are
// still calling it.
//
// An object over shared memory must not unmap that memory while a call is
// reading it, and a call blocked on a futex must not sleep through the
// close. A Guard counts the calls in flight: Close marks the object closed
// (calls that start afterwards fail at once), runs a wake function that
// makes blocked calls look again (they see the mark and return), and waits
// until the last call in flight has left. Only then may the closer free
// what the calls touch.
package guard

import (
	"sync"
	"sync/atomic"
)

// Guard counts the calls in flight on one object. The zero value is an open
// guard. It is safe for concurrent use.
type Guard struct {
	mu     sync.RWMutex
	closed atomic.Bool
	// settled is held by CloseAndRelease from before it marks the guard
	// closed until its release is done: a call that sees the mark waits on
	// it before it reports the close.
	settled sync.RWMutex
}

// Enter starts a call: it reports false, and the call must fail, once the
// object is closed (or being closed). A call that entered must Leave.
func (g *Guard) Enter() bool {
	if g.closed.Load() {
		g.settle()
		return false
	}
	g.mu.RLock()
	if g.closed.Load() {
		g.mu.RUnlock()
		g.settle()
		return false
	}
	return true
}

// Leave ends a call that Enter started. Once the object is closed by
// CloseAndRelease, it returns only after the release is done, so that a
// call that reports the close reports a finished one.
func (g *Guard) Leave() {
	g.mu.RUnlock()
	if g.closed.Load() {
		g.settle()
	}
}

// settle waits until a CloseAndRelease in progress has released.
func (g *Guard) settle() {
	g.settled.RLock()
	//lint:ignore SA2001 the critical section is empty on purpose: waiting was the point
	g.settled.RUnlock()
}

// Closed reports whether Close was called. A blocked call checks it each
// time it wakes, after it has read the word it sleeps on.
func (g *Guard) Closed() bool { return g.closed.Load() }

// Close marks the object closed, calls wake (which makes every blocked call
// wake and check Closed), and returns once no call is in flight. It reports
// false, without waiting, when the object was already closed. It must not be
// called from inside a call that entered.
func (g *Guard) Close(wake func()) bool {
	if g.closed.Swap(true) {
		return false
	}
	if wake != nil {
		wake()
	}
	g.mu.Lock() // waits out the calls in flight, which hold it shared
	//lint:ignore SA2001 the critical section is empty on purpose: taking the lock was the point
	g.mu.Unlock()
	return true
}

// CloseAndRelease closes as Close does and then calls release, the freeing
// of what the calls touch, before any call that saw the close (in Enter,
// or blocked and woken) returns: a caller told that the object is closed
// finds it released. It reports false, once the first close is done, when
// the object was already closed. Calls must not nest: an inner Leave would
// wait for a release that waits for the outer call.
func (g *Guard) CloseAndRelease(wake func(), release func() error) (bool, error) {
	g.settled.Lock()
	defer g.settled.Unlock()
	if !g.Close(wake) {
		return false, nil
	}
	return true, release()
}
