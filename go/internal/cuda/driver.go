// Package cuda shares CUDA device memory between processes, through the
// CUDA driver, which it loads with dlopen on first use: nothing of CUDA is
// needed to build it, and on a machine without a driver every call returns
// an error wrapping ErrUnavailable while the rest of zctipc works.
//
// Two routes: legacy IPC (cuIpcGetMemHandle on the base of an allocation,
// opened with cuIpcOpenMemHandle, with interprocess events so that the
// consumer waits for the producer's stream work) and the VMM route
// (cuMemCreate with POSIX file-descriptor handles, exported with
// cuMemExportToShareableHandle, passed with SCM_RIGHTS, imported and mapped
// with cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap and
// cuMemSetAccess).
//
// Driver calls need a current context: each call runs on a locked OS thread
// with the device's primary context (the one the CUDA runtime, and so torch,
// CuPy and JAX, use) made current, and the thread's previous context put
// back afterwards.
package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "driver.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"
)

// ErrUnavailable means there is no usable CUDA driver or device here.
var ErrUnavailable = errors.New("CUDA is unavailable")

// LibraryEnv names the environment variable that makes the package load
// another driver library than libcuda.so.1 (the tests' stand-in on machines
// without a GPU). It is read once, on first use.
const LibraryEnv = "ZCTIPC_CUDA_LIBRARY"

// ErrDriver is wrapped by every error the CUDA driver returned (an *Error).
var ErrDriver = errors.New("CUDA driver error")

// ErrOutOfMemory is wrapped by an *OutOfMemory: a device had not the memory
// an allocation asked for.
var ErrOutOfMemory = errors.New("out of GPU memory")

// cudaErrorOutOfMemory is CUDA_ERROR_OUT_OF_MEMORY.
const cudaErrorOutOfMemory = 2

// OutOfMemory says that device Device could not give Asked bytes: Free of
// its Total were free when it refused. It is an ErrOutOfMemory, and an
// ErrDriver through the driver's error.
type OutOfMemory struct {
	Device      int
	Asked       uint64
	Free, Total uint64
	Err         error // the driver's refusal
}

func (e *OutOfMemory) Error() string {
	return fmt.Sprintf("CUDA device %d is out of memory: %d bytes asked, %d of %d free (%v)", e.Device, e.Asked, e.Free, e.Total, e.Err)
}

// Unwrap makes an *OutOfMemory both ErrOutOfMemory and the driver's error.
func (e *OutOfMemory) Unwrap() []error { return []error{ErrOutOfMemory, e.Err} }

// Error is a CUDA driver error.
type Error struct {
	Call   string
	Result int
	Text   string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: CUDA error %d: %s", e.Call, e.Result, e.Text) }

// Unwrap makes every *Error an ErrDriver.
func (e *Error) Unwrap() error { return ErrDriver }

func check(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Result: int(r), Text: C.GoString(C.zct_cuErrorString(r))}
}

var (
	loadOnce sync.Once
	loadErr  error
	devices  int
	version  int
)

// load opens the driver and initializes it, once per process.
func load() error {
	loadOnce.Do(func() {
		path := os.Getenv(LibraryEnv)
		if path == "" {
			path = "libcuda.so.1"
		}
		cpath := C.CString(path)
		defer C.free(unsafe.Pointer(cpath))
		if why := C.zct_cuda_load(cpath); why != nil {
			loadErr = fmt.Errorf("%w: %s", ErrUnavailable, C.GoString(why))
			return
		}
		if err := check("cuInit", C.zct_cuInit()); err != nil {
			loadErr = fmt.Errorf("%w: %w", ErrUnavailable, err)
			return
		}
		var v, n C.int
		if err := errors.Join(check("cuDriverGetVersion", C.zct_cuDriverGetVersion(&v)),
			check("cuDeviceGetCount", C.zct_cuDeviceGetCount(&n))); err != nil {
			loadErr = fmt.Errorf("%w: %w", ErrUnavailable, err)
			return
		}
		if n == 0 {
			loadErr = fmt.Errorf("%w: the driver sees no device", ErrUnavailable)
			return
		}
		version, devices = int(v), int(n)
	})
	return loadErr
}

// Available returns nil when CUDA can be used here, else an error wrapping
// ErrUnavailable that says why.
func Available() error { return load() }

// Devices returns the number of CUDA devices.
func Devices() (int, error) {
	if err := load(); err != nil {
		return 0, err
	}
	return devices, nil
}

// DriverVersion returns the driver's CUDA version (12040 for 12.4).
func DriverVersion() (int, error) {
	if err := load(); err != nil {
		return 0, err
	}
	return version, nil
}

var (
	ctxMu    sync.Mutex
	contexts = map[int]C.CUcontext{}
)

// device returns nil when the driver is loaded and ordinal names one of
// its devices.
func device(ordinal int) error {
	if err := load(); err != nil {
		return err
	}
	if ordinal < 0 || ordinal >= devices {
		return fmt.Errorf("CUDA device %d: there are %d: %w", ordinal, devices, ErrUnavailable)
	}
	return nil
}

// onDevice runs fn on a locked OS thread with the primary context of device
// ordinal current, and puts the thread's context back afterwards.
func onDevice(ordinal int, fn func() error) error {
	if err := device(ordinal); err != nil {
		return err
	}
	ctxMu.Lock()
	ctx, ok := contexts[ordinal]
	if !ok {
		if err := check("cuDevicePrimaryCtxRetain", C.zct_cuPrimaryCtx(C.int(ordinal), &ctx)); err != nil {
			ctxMu.Unlock()
			return err
		}
		contexts[ordinal] = ctx
	}
	ctxMu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var prev C.CUcontext
	if err := check("cuCtxGetCurrent", C.zct_cuCtxGetCurrent(&prev)); err != nil {
		return err
	}
	if err := check("cuCtxSetCurrent", C.zct_cuCtxSetCurrent(ctx)); err != nil {
		return err
	}
	err := fn()
	return errors.Join(err, check("cuCtxSetCurrent", C.zct_cuCtxSetCurrent(prev)))
}
