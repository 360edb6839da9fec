// Command capi is the export layer of libzctipc.so: the functions of
// zctipc.h, each a thin translation between C arguments and the Go packages.
//
// Build it with go build -buildmode=c-shared. Every export runs its body
// through run, which refuses calls once the library is poisoned, recovers
// panics and turns errors into statuses; Go objects cross the boundary only
// as handles.
package main

/*
#include <stdlib.h>
#include "internal.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"os"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/cuda"
	"github.com/zctipc/zctipc/go/internal/daemon"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/usersock"
	"github.com/zctipc/zctipc/go/internal/version"
	"golang.org/x/sys/unix"
)

func main() {}

func init() {
	// Go copied the environment when the process started; a host such as
	// Python may have set zctipc's variables since, before loading us.
	for _, name := range []string{shm.DirEnv, shm.MapCacheEnv, shm.StrategyEnv, shm.StallEnv,
		usersock.RuntimeDirEnv, daemon.IdleEnv, "XDG_RUNTIME_DIR"} {
		cname := C.CString(name)
		value := C.getenv(cname)
		C.free(unsafe.Pointer(cname))
		var err error
		if value != nil {
			err = os.Setenv(name, C.GoString(value))
		} else {
			err = os.Unsetenv(name)
		}
		if err != nil {
			panic(err) // only for a name with '=' or NUL, which these are not
		}
	}
	shm.SetMapCache(os.Getenv(shm.MapCacheEnv) != "0")
	shm.InitStall()
	if err := shm.InitStrategy(); err != nil {
		fmt.Fprintln(os.Stderr, "zctipc:", err) // the default strategy stays
	}
}

//export zct_abi_version
func zct_abi_version() C.int { return C.ZCT_ABI_VERSION }

// versionString lives as long as the library.
var versionString = C.CString(version.Version)

// zct_version is a Go export, not a C function, so that a call waits for
// the Go runtime (and this package's variables) to be initialized: a C
// function could run before, and see nothing.
//
//export zct_version
func zct_version() *C.zct_cchar { return versionString }

// copyOut writes s and a NUL into buf, and its length into *length; when
// buf cannot hold it, only the length, and errRange.
func copyOut(s string, buf *C.char, capacity C.uint64_t, length *C.uint64_t) error {
	if length == nil || capacity > 0 && buf == nil {
		return errNilArg
	}
	*length = C.uint64_t(len(s))
	if uint64(capacity) <= uint64(len(s)) {
		return errRange
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), capacity)
	dst[copy(dst, s)] = 0
	return nil
}

//export zct_release_all
func zct_release_all(count *C.int64_t) C.int {
	return run(func() error {
		rerr := releaseRefs() // first: slots pin arenas that ReleaseAll lets go
		n, err := shm.ReleaseAll()
		err = errors.Join(rerr, err, cuda.StopSharing())
		if count != nil {
			*count = C.int64_t(n)
		}
		if err != nil {
			return err
		}
		return nil
	})
}

// copyName writes a segment name into a name field, NUL-terminated.
func copyName(dst *[C.ZCT_NAME_CAP]C.char, name string) {
	n := copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), C.ZCT_NAME_CAP-1), name)
	dst[n] = 0
}

// dimsOf copies a shape of ndim dimensions from C.
func dimsOf(ndim C.int32_t, shape *C.zct_cint64) ([]int64, error) {
	if ndim < 0 || ndim > header.MaxNDim {
		return nil, fmt.Errorf("ndim %d is outside 0..%d: %w", ndim, header.MaxNDim, unix.EINVAL)
	}
	dims := make([]int64, ndim)
	if ndim > 0 {
		for i, d := range unsafe.Slice((*C.int64_t)(unsafe.Pointer(shape)), ndim) {
			dims[i] = int64(d)
		}
	}
	return dims, nil
}

func goString(s *C.zct_cchar) string {
	if s == nil {
		return ""
	}
	return C.GoString((*C.char)(unsafe.Pointer(s)))
}

// deadline turns a timeout in milliseconds into a deadline: -1 (or any
// negative) is no deadline, 0 is now. A timeout too long to add to the
// clock (past 292 years: INT64_MAX, say) is no deadline either; it used to
// wrap to a time in the past, and the call did not wait at all.
func deadline(timeoutMS C.int64_t) time.Time {
	switch {
	case timeoutMS < 0 || timeoutMS > math.MaxInt64/C.int64_t(time.Millisecond):
		return time.Time{}
	case timeoutMS == 0:
		return expired // the clock is not read for a call that does not wait
	}
	return time.Now().Add(time.Duration(timeoutMS) * time.Millisecond)
}

// expired is a deadline that has passed.
var expired = time.Unix(0, 1)

func boolInt(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}
