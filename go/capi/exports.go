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
	"strings"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/cuda"
	"github.com/zctipc/zctipc/go/internal/daemon"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/tensorref"
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

var segments = newTable[*shm.Segment]()

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

//export zct_segment_create
func zct_segment_create(name *C.zct_cchar, dt C.int32_t, ndim C.int32_t, shape *C.zct_cint64, out *C.zct_handle, info *C.zct_info) C.int {
	return createShaped(ndim, shape, out, info, func(dims []int64) (*shm.Segment, error) {
		return shm.Create(goString(name), header.KindTensor, dtype.DType(dt), dims)
	})
}

//export zct_table_create
func zct_table_create(name *C.zct_cchar, nbytes C.uint64_t, out *C.zct_handle, info *C.zct_info) C.int {
	return run(func() error {
		if out == nil || info == nil {
			return errNilArg
		}
		if nbytes > math.MaxInt64 {
			return fmt.Errorf("a table of %d bytes: %w", nbytes, unix.EINVAL)
		}
		seg, err := shm.Create(goString(name), header.KindTable, dtype.Uint8, []int64{int64(nbytes)})
		return segmentOut(seg, err, out, info)
	})
}

//export zct_segment_create_uninit
func zct_segment_create_uninit(name *C.zct_cchar, kind C.int32_t, dt C.int32_t, ndim C.int32_t, shape *C.zct_cint64, out *C.zct_handle, info *C.zct_info) C.int {
	return createShaped(ndim, shape, out, info, func(dims []int64) (*shm.Segment, error) {
		return shm.CreateUninitialized(goString(name), header.Kind(kind), dtype.DType(dt), dims)
	})
}

//export zct_segment_publish
func zct_segment_publish(h C.zct_handle) C.int {
	return with(segments, uint64(h), func(seg *shm.Segment) error { return seg.Publish() })
}

// createShaped runs an export that makes a segment of ndim dimensions of
// shape with create, and hands it to the caller.
func createShaped(ndim C.int32_t, shape *C.zct_cint64, out *C.zct_handle, info *C.zct_info, create func(dims []int64) (*shm.Segment, error)) C.int {
	return run(func() error {
		if out == nil || info == nil || ndim > 0 && shape == nil {
			return errNilArg
		}
		dims, err := dimsOf(ndim, shape)
		if err != nil {
			return err
		}
		seg, err := create(dims)
		return segmentOut(seg, err, out, info)
	})
}

// segmentOut hands a new segment to the caller.
func segmentOut(seg *shm.Segment, err error, out *C.zct_handle, info *C.zct_info) error {
	if err != nil {
		return err
	}
	*out = C.zct_handle(segments.put(seg))
	fillInfo(info, seg.Name(), seg.Header(), seg.Data(), false, seg.Header().SegmentSize())
	return nil
}

//export zct_segment_attach
func zct_segment_attach(name *C.zct_cchar, kind C.int32_t, readonly C.int32_t, out *C.zct_handle, info *C.zct_info) C.int {
	return run(func() error {
		if name == nil || out == nil || info == nil {
			return errNilArg
		}
		seg, err := shm.Attach(goString(name), header.Kind(kind), readonly != 0)
		if err != nil {
			return err
		}
		*out = C.zct_handle(segments.put(seg))
		fillInfo(info, seg.Name(), seg.Header(), seg.Data(), seg.ReadOnly(), seg.Header().SegmentSize())
		return nil
	})
}

//export zct_tensor_ref_attach
func zct_tensor_ref_attach(json *C.zct_cchar, length C.uint64_t, readonly C.int32_t, out *C.zct_handle, info *C.zct_info) C.int {
	return run(func() error {
		if json == nil || out == nil || info == nil {
			return errNilArg
		}
		ref, err := tensorref.Parse(C.GoBytes(unsafe.Pointer(json), C.int(min(uint64(length), 1<<20))))
		if err != nil {
			return err
		}
		seg, err := tensorref.Attach(ref, readonly != 0)
		if err != nil {
			return err
		}
		*out = C.zct_handle(segments.put(seg))
		fillInfo(info, seg.Name(), seg.Header(), seg.Data(), seg.ReadOnly(), seg.Header().SegmentSize())
		return nil
	})
}

//export zct_segment_info
func zct_segment_info(h C.zct_handle, info *C.zct_info) C.int {
	return run(func() error {
		if info == nil {
			return errNilArg
		}
		seg, err := segments.get(uint64(h))
		if err != nil {
			return err
		}
		hdr := seg.Header()
		if hdr.Refcount, err = seg.Refcount(); err != nil {
			return err
		}
		fillInfo(info, seg.Name(), hdr, seg.Data(), seg.ReadOnly(), hdr.SegmentSize())
		return nil
	})
}

//export zct_segment_refcount
func zct_segment_refcount(h C.zct_handle, out *C.int64_t) C.int {
	if out == nil { // reading a count into nowhere is a mistake; addref and dropref may ignore theirs
		return fail(errNilArg)
	}
	return segmentCount(h, out, (*shm.Segment).Refcount)
}

//export zct_segment_addref
func zct_segment_addref(h C.zct_handle, out *C.int64_t) C.int {
	return segmentCount(h, out, (*shm.Segment).AddRef)
}

//export zct_segment_dropref
func zct_segment_dropref(h C.zct_handle, out *C.int64_t) C.int {
	return segmentCount(h, out, (*shm.Segment).DropRef)
}

// segmentCount runs one of the refcount methods on the segment behind h.
func segmentCount(h C.zct_handle, out *C.int64_t, op func(*shm.Segment) (int64, error)) C.int {
	return with(segments, uint64(h), func(seg *shm.Segment) error {
		n, err := op(seg)
		if err != nil {
			return err
		}
		if out != nil {
			*out = C.int64_t(n)
		}
		return nil
	})
}

//export zct_segment_close
func zct_segment_close(h C.zct_handle) C.int {
	return closing(segments, uint64(h), func(seg *shm.Segment) error {
		return seg.Close()
	})
}

//export zct_segment_unlink
func zct_segment_unlink(name *C.zct_cchar) C.int {
	return run(func() error {
		if name == nil {
			return errNilArg
		}
		return shm.Unlink(goString(name))
	})
}

//export zct_segment_stat
func zct_segment_stat(name *C.zct_cchar, info *C.zct_info) C.int {
	return run(func() error {
		if name == nil || info == nil {
			return errNilArg
		}
		st, err := shm.Stat(goString(name))
		if err != nil {
			return err
		}
		fillInfo(info, st.Name, st.Header, nil, false, uint64(st.Size))
		return nil
	})
}

//export zct_segment_list
func zct_segment_list(buf *C.char, capacity C.uint64_t, length *C.uint64_t) C.int {
	return run(func() error {
		names, err := shm.List()
		if err != nil {
			return err
		}
		return copyOut(strings.Join(names, "\n"), buf, capacity, length)
	})
}

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

//export zct_header_decode
func zct_header_decode(buf *C.zct_cvoid, length C.uint64_t, fileSize C.uint64_t, info *C.zct_info) C.int {
	return run(func() error {
		if info == nil || length > 0 && buf == nil {
			return errNilArg
		}
		// A private copy: the bytes may belong to another process.
		raw := C.GoBytes(unsafe.Pointer(buf), C.int(min(uint64(length), header.MaxSize)))
		hdr, err := header.Decode(raw, uint64(fileSize))
		if err != nil {
			return err
		}
		fillInfo(info, "", hdr, nil, false, uint64(fileSize))
		return nil
	})
}

// fillInfo writes a header, a name and where the data is mapped into info.
func fillInfo(info *C.zct_info, name string, hdr header.Header, data []byte, readOnly bool, fileSize uint64) {
	*info = C.zct_info{}
	if data != nil {
		info.data = unsafe.Pointer(unsafe.SliceData(data))
	}
	info.nbytes = C.uint64_t(hdr.NBytes)
	info.data_offset = C.uint64_t(hdr.DataOffset)
	info.file_size = C.uint64_t(fileSize)
	for i := range hdr.Shape {
		info.shape[i] = C.int64_t(hdr.Shape[i])
		info.strides[i] = C.int64_t(hdr.Strides[i])
	}
	info.creator_pid = C.int64_t(hdr.Creator.PID)
	info.creator_start_time = C.uint64_t(hdr.Creator.StartTime)
	info.created_ns = C.int64_t(hdr.CreatedNS)
	info.refcount = C.int64_t(hdr.Refcount)
	info.dtype = C.int32_t(hdr.DType)
	info.ndim = C.int32_t(len(hdr.Shape))
	info.kind = C.int32_t(hdr.Kind)
	if readOnly {
		info.readonly = 1
	}
	copyName(&info.name, name)
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
