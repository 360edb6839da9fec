// Package futex waits on and wakes 32-bit words in memory shared between
// processes (futex(2) without FUTEX_PRIVATE_FLAG).
package futex

import (
	"errors"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Errors Wait returns besides nil.
var (
	// ErrTimeout means the timeout passed first.
	ErrTimeout = errors.New("futex wait timed out")
	// ErrInterrupted means a signal arrived; the caller's host may have a
	// handler to run (Python's Ctrl-C) before waiting again.
	ErrInterrupted = errors.New("futex wait interrupted by a signal")
)

const (
	futexWait = 0 // FUTEX_WAIT, shared between processes
	futexWake = 1 // FUTEX_WAKE, shared between processes
)

// Wait sleeps while *addr == val, until a Wake on addr, the timeout (none if
// negative), or a signal. It returns nil when woken or when *addr no longer
// held val (callers re-check their condition), ErrTimeout when the timeout
// passed, and ErrInterrupted when a signal arrived.
func Wait(addr *uint32, val uint32, timeout time.Duration) error {
	var ts *unix.Timespec
	if timeout >= 0 {
		t := unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(ts)), 0, 0)
	switch errno {
	case 0, unix.EAGAIN:
		return nil
	case unix.ETIMEDOUT:
		return ErrTimeout
	case unix.EINTR:
		return ErrInterrupted
	}
	return errno
}

// Wake wakes up to n waiters on addr and returns how many it woke.
func Wake(addr *uint32, n int) (int, error) {
	woken, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(n), 0, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(woken), nil
}
