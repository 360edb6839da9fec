package main

/*
#include "zctipc.h"
#include "internal.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/cuda"
	"github.com/zctipc/zctipc/go/internal/daemon"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/stream"
	"golang.org/x/sys/unix"
)

// statuses maps the errors callers branch on to the status codes of
// zctipc.h, most specific first.
var statuses = []struct {
	err    error
	status C.int
}{
	{errBadHandle, C.ZCT_E_CLOSED},
	{errRange, C.ZCT_E_RANGE},
	{daemon.ErrUnavailable, C.ZCT_E_NO_DAEMON},
	{cuda.ErrUnavailable, C.ZCT_E_NO_CUDA},
	{cuda.ErrOutOfMemory, C.ZCT_E_CUDA_OOM},
	{cuda.ErrDriver, C.ZCT_E_CUDA},
	{cuda.ErrNotShared, C.ZCT_E_NOT_FOUND},
	{cuda.ErrBusy, C.ZCT_E_BUSY}, // its errno (EAGAIN) tells it from a stream's (EBUSY)
	{shm.ErrNoBroker, C.ZCT_E_NO_DAEMON},
	{queue.ErrFull, C.ZCT_E_FULL},
	{pool.ErrFull, C.ZCT_E_FULL},
	{stream.ErrFull, C.ZCT_E_FULL},
	{stream.ErrEmpty, C.ZCT_E_EMPTY},
	{stream.ErrEnded, C.ZCT_E_ENDED},
	{stream.ErrClosed, C.ZCT_E_CLOSED},
	{stream.ErrNoSlot, C.ZCT_E_BUSY},
	{stream.ErrWriterBusy, C.ZCT_E_BUSY},
	{queue.ErrEmpty, C.ZCT_E_EMPTY},
	{futex.ErrInterrupted, C.ZCT_E_INTERRUPTED},
	{message.ErrMalformed, C.ZCT_E_CORRUPT},
	{fault.ErrFault, C.ZCT_E_CORRUPT},
	{pool.ErrTaken, C.ZCT_E_TAKEN},
	{pool.ErrStale, C.ZCT_E_CORRUPT},
	{shm.ErrClosed, C.ZCT_E_CLOSED},
	{shm.ErrOutOfSharedMemory, C.ZCT_E_NO_SPACE},
	{header.ErrNotZctipc, C.ZCT_E_NOT_ZCTIPC},
	{header.ErrVersion, C.ZCT_E_VERSION},
	{header.ErrCorrupt, C.ZCT_E_CORRUPT},
	{dtype.ErrUnsupported, C.ZCT_E_DTYPE},
	{unix.ENOENT, C.ZCT_E_NOT_FOUND},
	{unix.EEXIST, C.ZCT_E_EXISTS},
	{unix.EACCES, C.ZCT_E_PERMISSION},
	{unix.EPERM, C.ZCT_E_PERMISSION},
	{unix.EINVAL, C.ZCT_E_INVALID},
}

var (
	errBadHandle = errors.New("invalid or closed handle")
	errRange     = errors.New("output buffer too small")
	errNilArg    = fmt.Errorf("a required pointer argument is NULL: %w", unix.EINVAL)
)

// badCount reports a count argument out of its range, which is a bad
// argument as a NULL pointer is, but not one.
func badCount(arg string, n C.int32_t, least, most int) error {
	return fmt.Errorf("%s is %d: it must be from %d to %d: %w", arg, n, least, most, unix.EINVAL)
}

// dtypeOf is the dtype that a C caller's code names, or an error wrapping
// dtype.ErrUnsupported (ZCT_E_DTYPE) for a code zctipc does not know
// (dtype.FromCode: a negative code, or one past 16 bits, among them).
func dtypeOf(dt C.int32_t) (dtype.DType, error) { return dtype.FromCode(int64(dt)) }

// poisoned is set once an export recovered from a panic: the library's state
// may be inconsistent, so every later call fails cleanly instead.
var poisoned atomic.Bool

// fail records err as the calling thread's last error and returns its status.
func fail(err error) C.int {
	if fe, ok := err.(*fault.Error); ok { // a fault of the export itself: name its segment
		if name, ok := shm.NameAt(fe.Addr); ok {
			err = fmt.Errorf("%w: segment %q", err, name)
		}
	}
	status := C.int(C.ZCT_E_OS)
	for _, s := range statuses {
		if errors.Is(err, s.err) {
			status = s.status
			break
		}
	}
	var errno unix.Errno
	errors.As(err, &errno)
	setLastError(err.Error(), int(errno))
	return status
}

func setLastError(msg string, errno int) {
	C.zct_set_last_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)), C.int(errno))
}

// enter returns a failing status when the library is poisoned.
func enter() (C.int, bool) {
	if poisoned.Load() {
		setLastError("libzctipc is poisoned by an earlier internal error; restart the process", 0)
		return C.ZCT_E_POISONED, false
	}
	return C.ZCT_OK, true
}

// recoverPanic turns a panic in an export into ZCT_E_INTERNAL and poisons the
// library: a panic must never unwind into C.
func recoverPanic(status *C.int) {
	if r := recover(); r != nil {
		poisoned.Store(true)
		C.zct_fast_poison()
		stack := debug.Stack()
		fmt.Fprintf(os.Stderr, "libzctipc: internal error: %v\n%s", r, stack)
		setLastError(fmt.Sprintf("libzctipc internal error: %v (the library is now poisoned; the stack was printed to stderr)", r), 0)
		*status = C.ZCT_E_INTERNAL
	}
}

// run runs the body of an export: it refuses the call once the library is
// poisoned, turns a fault on mapped memory (a segment another process
// shrank) into ZCT_E_CORRUPT, any other panic into ZCT_E_INTERNAL (and
// poisons the library), and an error into its status and the thread's last
// error.
// cInt is C's int, the status every export returns, for the files of this
// package that do not use cgo themselves.
type cInt = C.int

func run(body func() error) (status C.int) {
	defer recoverPanic(&status)
	if status, ok := enter(); !ok {
		return status
	}
	if err := fault.Catch(body); err != nil {
		return fail(err)
	}
	return C.ZCT_OK
}
