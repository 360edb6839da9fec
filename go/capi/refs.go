package main

/*
#include "internal.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"golang.org/x/sys/unix"
)

var refs = newTable[*buffer.Ref]()

// Note [refs on their way out]: a ref handed to a put or an encode is the
// call's from the moment it starts: its handle leaves the table (claim),
// so that no other thread's call (a release, a second put of the same
// handle) can give up or send again a count that is on its way into a
// message. A put that fails hands the refs back under the handles they had
// (restore): zctipc.h promises the caller still holds them.

// claim takes the refs of handles out of the table for a send; on failure
// none is taken.
func claim(handles []uint64) ([]*buffer.Ref, error) {
	rs := make([]*buffer.Ref, len(handles))
	for i, h := range handles {
		r, err := refs.take(h)
		if err != nil {
			restore(handles[:i], rs[:i])
			return nil, err
		}
		rs[i] = r
	}
	return rs, nil
}

// restore puts back the refs of a send that failed, under their handles.
func restore(handles []uint64, rs []*buffer.Ref) {
	for i, h := range handles {
		refs.restore(h, rs[i])
	}
}

// describe makes the descriptor of a view that the caller filled in, of
// the memory of r (the ref it names).
func describe(r *buffer.Ref, v *C.zct_view) (message.Descriptor, error) {
	return describeArray(r, uint64(v.offset), v.dtype, v.ndim, &v.shape[0], &v.strides[0], v.flags)
}

// describeArray is the descriptor of the array of dtype dt, ndim
// dimensions of shape and byte strides, at offset in r's memory.
func describeArray(r *buffer.Ref, offset uint64, dt, ndim C.int32_t, shape, strides *C.int64_t, flags C.int32_t) (message.Descriptor, error) {
	if ndim < 0 || ndim > header.MaxNDim || flags < 0 || flags > 7 {
		return message.Descriptor{}, fmt.Errorf("a view with ndim %d and flags %d: %w", ndim, flags, unix.EINVAL)
	}
	dims := make([]int64, 2*ndim)
	sh, st := dims[:ndim], dims[ndim:]
	if ndim > 0 {
		cs, ct := unsafe.Slice(shape, ndim), unsafe.Slice(strides, ndim)
		for i := range sh {
			sh[i], st[i] = int64(cs[i]), int64(ct[i])
			if sh[i] < 0 || st[i] < 0 {
				return message.Descriptor{}, fmt.Errorf("a view with shape %v and strides %v: %w", cs, ct, unix.EINVAL)
			}
		}
	}
	d, err := dtypeOf(dt)
	if err != nil {
		return message.Descriptor{}, err
	}
	return r.Describe(offset, d, sh, st, uint8(flags))
}

// fillView writes an array a message brought into v, under the ref handle
// h (0 for one without a count).
func fillView(v *C.zct_view, h uint64, a *handover.View) {
	*v = C.zct_view{}
	v.ref = C.zct_handle(h)
	v.data = unsafe.Pointer(unsafe.SliceData(a.Data))
	v.offset = C.uint64_t(a.Offset)
	v.nbytes = C.uint64_t(len(a.Data))
	for i := range a.Shape {
		v.shape[i], v.strides[i] = C.int64_t(a.Shape[i]), C.int64_t(a.Strides[i])
	}
	v.dtype = C.int32_t(a.DType)
	v.ndim = C.int32_t(len(a.Shape))
	v.kind = C.int32_t(a.Kind)
	v.flags = C.int32_t(a.Flags)
}

// fillInline writes an inline record's array into v: a view with no ref
// (ZCT_REF_INLINE), offset bytes from the start of the get's buffer.
func fillInline(v *C.zct_view, in *message.Inline, offset int) {
	*v = C.zct_view{}
	v.data = unsafe.Pointer(unsafe.SliceData(in.Data))
	v.offset = C.uint64_t(offset)
	v.nbytes = C.uint64_t(len(in.Data))
	var strides [header.MaxNDim]int64
	in.CStrides(strides[:len(in.Shape)])
	for i := range in.Shape {
		v.shape[i], v.strides[i] = C.int64_t(in.Shape[i]), C.int64_t(strides[i])
	}
	v.dtype = C.int32_t(in.DType)
	v.ndim = C.int32_t(len(in.Shape))
	v.kind = C.ZCT_REF_INLINE
	v.flags = C.int32_t(in.Flags)
}

// fillViews lets fill write total views into the views_cap views at
// views, once it checked that they fit: the queue's gets count them
// (message.Views), so a view that does not fit is a bug, which errRange
// reports rather than write past the caller's views.
func fillViews(views *C.zct_view, viewsCap C.int32_t, total int, fill func([]C.zct_view)) error {
	if total > int(viewsCap) {
		return fmt.Errorf("%d views for room for %d: %w", total, viewsCap, errRange)
	}
	if total > 0 {
		fill(unsafe.Slice(views, total))
	}
	return nil
}

// fillMessage writes the views of m, adopted, into out (m.NumViews() of
// them), each ref under a new handle; start is where m lies in the buffer
// it was taken into, in which its inline array lies.
func fillMessage(out []C.zct_view, m *handover.Message, start int) int {
	if m.Type == message.TypeInline {
		fillInline(&out[0], &m.Inline, start+m.InlineAt)
		return 1
	}
	for j := range m.Views {
		fillView(&out[j], refs.put(m.Views[j].Ref), &m.Views[j])
	}
	return len(m.Views)
}

//export zct_ref_find
func zct_ref_find(addr *C.zct_cvoid, nbytes C.uint64_t, ref *C.zct_handle, offset *C.uint64_t) C.int {
	return run(func() error {
		if ref == nil || offset == nil {
			return errNilArg
		}
		r, off, ok, err := buffer.Find(uintptr(unsafe.Pointer(addr)), uint64(nbytes))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("the %d bytes at %p are not zctipc memory: %w", nbytes, addr, unix.ENOENT)
		}
		*ref = C.zct_handle(refs.put(r))
		*offset = C.uint64_t(off)
		return nil
	})
}

//export zct_memory_holds
func zct_memory_holds(addr *C.zct_cvoid, nbytes C.uint64_t) C.int {
	held := false
	status := run(func() error {
		held = buffer.Holds(uintptr(unsafe.Pointer(addr)), uint64(nbytes))
		return nil
	})
	if status != C.ZCT_OK || !held {
		return status
	}
	return 1
}

//export zct_ref_holders
func zct_ref_holders(ref C.zct_handle, count *C.int64_t) C.int {
	return run(func() error {
		if count == nil {
			return errNilArg
		}
		r, err := refs.get(uint64(ref))
		if err != nil {
			return err
		}
		n, err := r.Holders()
		*count = C.int64_t(n)
		return err
	})
}

// zctipc_go_ref_release is zct_ref_release (handoff.c) for a ref of Go's
// table.
//
//export zctipc_go_ref_release
func zctipc_go_ref_release(ref C.zct_handle) C.int {
	return closing(refs, uint64(ref), func(r *buffer.Ref) error {
		return r.Release()
	})
}

//export zct_ref_segment
func zct_ref_segment(ref C.zct_handle, segment *C.zct_handle, info *C.zct_info) C.int {
	return run(func() error {
		if segment == nil || info == nil {
			return errNilArg
		}
		r, err := refs.get(uint64(ref))
		if err != nil {
			return err
		}
		seg := r.Segment()
		if seg == nil {
			return fmt.Errorf("a pool slot is not a segment of its own: %w", unix.EINVAL)
		}
		if _, err := refs.take(uint64(ref)); err != nil {
			return err
		}
		*segment = C.zct_handle(segments.put(seg))
		fillInfo(info, seg.Name(), seg.Header(), seg.Data(), seg.ReadOnly(), seg.Header().SegmentSize())
		return nil
	})
}

//export zct_ref_encode
func zct_ref_encode(view *C.zct_cview, buf unsafe.Pointer, capacity C.uint64_t, length *C.uint64_t) C.int {
	return run(func() error {
		d, r, err := describeInto(view, buf, capacity, length)
		if err != nil {
			return err
		}
		// The bytes can always be written: the ref is the encode's for good
		// (Note [refs on their way out]).
		if _, err := refs.take(uint64(view.ref)); err != nil {
			return err
		}
		_, err = buffer.Send([]*buffer.Ref{r}, func() error {
			d.Encode(unsafe.Slice((*byte)(buf), capacity))
			return nil
		})
		return err
	})
}

// describeInto is the descriptor of view, for the encoders that write it
// into the capacity bytes at buf: *length receives its size, and a buf too
// small is errRange.
func describeInto(view *C.zct_cview, buf unsafe.Pointer, capacity C.uint64_t, length *C.uint64_t) (message.Descriptor, *buffer.Ref, error) {
	if view == nil || length == nil || capacity > 0 && buf == nil {
		return message.Descriptor{}, nil, errNilArg
	}
	r, err := refs.get(uint64(view.ref))
	if err != nil {
		return message.Descriptor{}, nil, err
	}
	d, err := describe(r, (*C.zct_view)(unsafe.Pointer(view)))
	if err != nil {
		return d, nil, err
	}
	*length = C.uint64_t(d.Size())
	if uint64(capacity) < uint64(d.Size()) {
		return d, nil, errRange
	}
	return d, r, nil
}

//export zct_ref_decode
func zct_ref_decode(buf *C.zct_cvoid, length C.uint64_t, view *C.zct_view) C.int {
	return viewOne(buf, length, view, buffer.Adopt)
}

//export zct_ref_describe
func zct_ref_describe(view *C.zct_cview, buf unsafe.Pointer, capacity C.uint64_t, length *C.uint64_t) C.int {
	return run(func() error {
		d, _, err := describeInto(view, buf, capacity, length)
		if err == nil {
			d.Encode(unsafe.Slice((*byte)(buf), capacity))
		}
		return err
	})
}

//export zct_ref_attach
func zct_ref_attach(buf *C.zct_cvoid, length C.uint64_t, view *C.zct_view) C.int {
	return viewOne(buf, length, view, buffer.Attach)
}

// viewOne fills view with the memory of the one descriptor that the length
// bytes at buf hold, and a new handle of the count that open (buffer.Adopt
// or buffer.Attach) gives on it.
func viewOne(buf *C.zct_cvoid, length C.uint64_t, view *C.zct_view, open func(*message.Descriptor) (*buffer.Ref, []byte, error)) C.int {
	return run(func() error {
		if view == nil || length > 0 && buf == nil {
			return errNilArg
		}
		d, err := decodeOne(buf, length)
		if err != nil {
			return err
		}
		r, data, err := open(&d)
		if err != nil {
			return err
		}
		a := handover.ViewOf(r, data, &d)
		fillView(view, refs.put(r), &a)
		return nil
	})
}

// decodeOne decodes the one descriptor that the length bytes at buf hold.
func decodeOne(buf *C.zct_cvoid, length C.uint64_t) (message.Descriptor, error) {
	raw := C.GoBytes(unsafe.Pointer(buf), C.int(min(uint64(length), 1<<16)))
	d, n, err := message.DecodeDescriptor(raw)
	if err != nil {
		return d, err
	}
	if n != len(raw) {
		return d, fmt.Errorf("%w: %d bytes after the descriptor", message.ErrMalformed, len(raw)-n)
	}
	return d, nil
}

// releaseRefs releases every ref this process still has, at exit: each on
// its own, so that one in a segment another process shrank does not keep
// the others.
func releaseRefs() error {
	var errs []error
	for h := uint64(C.zct_light_ref_any()); h != 0; h = uint64(C.zct_light_ref_any()) {
		if r, ok := claimLight(h); ok { // another thread's release may take it first
			errs = append(errs, fault.Catch(r.Release))
		}
	}
	for _, r := range refs.drain() {
		errs = append(errs, fault.Catch(r.Release))
	}
	return errors.Join(errs...)
}
