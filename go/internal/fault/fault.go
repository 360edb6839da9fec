// Package fault turns a fault on mapped memory into an error.
//
// A process of the same user may shrink a segment file that others map
// (ftruncate on a file in /dev/shm); touching the pages past the new end
// then raises SIGBUS. Go's runtime treats a fault at a non-nil address as a
// fatal error unless the goroutine asked, with debug.SetPanicOnFault, for a
// panic instead. Catch asks, recovers that panic, and returns ErrFault, so
// that a hostile truncation is an error of the call that met it rather than
// the death of every process that maps the file. (memfd segments are
// sealed against shrinking; files in /dev/shm cannot be sealed.)
package fault

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync/atomic"
)

// ErrFault is wrapped by the errors of Catch: the memory of a mapping
// faulted, most likely because another process shrank the file.
var ErrFault = errors.New("shared memory faulted: another process shrank a segment file this process maps")

// Error is the fault Catch recovered from.
type Error struct {
	Addr uintptr // the faulting address, 0 when the runtime did not say
}

func (e *Error) Error() string { return fmt.Sprintf("%v (address %#x)", ErrFault, e.Addr) }

// Unwrap returns ErrFault.
func (e *Error) Unwrap() error { return ErrFault }

// Catch runs fn and returns its error, or an *Error when fn faulted on
// memory. Other panics go on.
func Catch(fn func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			if f, ok := asFault(r); ok {
				err = f
				return
			}
			panic(r)
		}
	}()
	return fn()
}

// Must panics with err, a fault met outside Go (a data plane step that
// reported one), as a Go access to the same memory would: Catch recovers
// it. It does nothing when err is nil.
func Must(err error) {
	if err != nil {
		panic(err)
	}
}

// asFault reports whether a recovered value is a memory fault.
func asFault(r any) (*Error, bool) {
	if f, ok := r.(*Error); ok {
		return f, true
	}
	re, ok := r.(runtime.Error)
	if !ok {
		return nil, false
	}
	if a, ok := re.(interface{ Addr() uintptr }); ok {
		return &Error{Addr: a.Addr()}, true
	}
	return nil, false
}

// LoadInt64 reads *p atomically, or reports the fault when its page is
// gone.
func LoadInt64(p *int64) (n int64, err error) {
	err = Catch(func() error {
		n = atomic.LoadInt64(p)
		return nil
	})
	return n, err
}
