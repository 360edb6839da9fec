package main

/*
#include "internal.h"
*/
import "C"

import (
	"fmt"
	"math"
	"strings"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/tensorref"
	"golang.org/x/sys/unix"
)

var segments = newTable[*shm.Segment]()

//export zct_segment_create
func zct_segment_create(name *C.zct_cchar, dt C.int32_t, ndim C.int32_t, shape *C.zct_cint64, out *C.zct_handle, info *C.zct_info) C.int {
	return createShaped(ndim, shape, out, info, func(dims []int64) (*shm.Segment, error) {
		d, err := dtypeOf(dt)
		if err != nil {
			return nil, err
		}
		return shm.Create(goString(name), header.KindTensor, d, dims)
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
		d, err := dtypeOf(dt)
		if err != nil {
			return nil, err
		}
		return shm.CreateUninitialized(goString(name), header.Kind(kind), d, dims)
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
