package zctipc

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/guard"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/stream"
	"github.com/zctipc/zctipc/go/internal/tensorref"
	"golang.org/x/sys/unix"
)

// Errors callers branch on, with errors.Is.
var (
	// ErrClosed is returned by the methods of a closed (or nil) object, and
	// by calls blocked on one when it was closed.
	ErrClosed = shm.ErrClosed
	// ErrFull means a queue (or a stream ring) had no room before the
	// context was done.
	ErrFull = queue.ErrFull
	// ErrEmpty means nothing came before the context was done.
	ErrEmpty = queue.ErrEmpty
	// ErrEnded means the stream has ended.
	ErrEnded = stream.ErrEnded
	// ErrMismatch means a TensorRef does not describe its segment.
	ErrMismatch = tensorref.ErrMismatch
)

// nilErr is the error of a method called on a nil object.
func nilErr(what string) error { return fmt.Errorf("a nil *zctipc.%s: %w", what, ErrClosed) }

// DType is an element type (docs/format.md's codes).
type DType = dtype.DType

// The element types.
const (
	Bool       = dtype.Bool
	Int8       = dtype.Int8
	Int16      = dtype.Int16
	Int32      = dtype.Int32
	Int64      = dtype.Int64
	Uint8      = dtype.Uint8
	Uint16     = dtype.Uint16
	Uint32     = dtype.Uint32
	Uint64     = dtype.Uint64
	Float16    = dtype.Float16
	Float32    = dtype.Float32
	Float64    = dtype.Float64
	BFloat16   = dtype.BFloat16
	Complex64  = dtype.Complex64
	Complex128 = dtype.Complex128
)

// Tensor is an n-dimensional array in shared memory: a segment of its own
// (NewTensor, AttachTensor, AttachRef) or memory another process sent
// through a Queue (a segment or a pool slot); or a small array that came
// inside a Queue message, copied into this process's memory (its Name is
// "(inline)"; it has no segment or TensorRef, and PutTensor sends it inline
// again). What came from Python keeps the Python type it came as (a torch
// tensor goes on as a torch tensor). It holds one count on that
// memory until Close. It is safe for concurrent use; its type, shape and
// name stay readable after Close, its memory does not.
type Tensor struct {
	guard   guard.Guard
	data    []byte
	dt      DType
	shape   []int64
	strides []int64 // bytes
	name    string  // the segment, or the arena of a slot
	offset  uint64  // of data in the segment's data region, or in the slot
	flags   uint8   // a message's flags, kept when it is sent on: the Python type to rebuild, read-only
	seg     *shm.Segment
	ref     *buffer.Ref
}

// NewTensor creates a tensor segment of the given type and shape, zeroed.
// name gets the library prefix ("zctipc_"); an empty name makes a random
// one. An existing segment is never reused.
func NewTensor(name string, dt DType, shape ...int64) (*Tensor, error) {
	startCleanup()
	seg, err := shm.Create(name, header.KindTensor, dt, shape)
	if err != nil {
		return nil, err
	}
	return segmentTensor(seg), nil
}

// AttachTensor attaches the tensor segment name (with or without the
// prefix), read-only if asked.
func AttachTensor(name string, readOnly bool) (*Tensor, error) {
	startCleanup()
	seg, err := shm.Attach(name, header.KindTensor, readOnly)
	if err != nil {
		return nil, err
	}
	return segmentTensor(seg), nil
}

// TensorRef is a tensor segment described in a stable JSON form that any
// language can be handed (docs/format.md): Tensor.Ref makes one, AttachRef
// attaches it, Python's SharedTensor.ref() and zctipc.attach_ref do the
// same there.
type TensorRef = tensorref.Ref

// AttachRef attaches the tensor segment r names, after checking r against
// its header: a ref whose dtype, shape, strides, offset, bytes, id or kind
// differ from the segment's is refused with ErrMismatch, never read as
// another type.
func AttachRef(r TensorRef) (*Tensor, error) {
	startCleanup()
	seg, err := tensorref.Attach(r, false)
	if err != nil {
		return nil, err
	}
	return segmentTensor(seg), nil
}

// ParseRef decodes a TensorRef's JSON.
func ParseRef(data []byte) (TensorRef, error) { return tensorref.Parse(data) }

func segmentTensor(seg *shm.Segment) *Tensor {
	h := seg.Header()
	return &Tensor{data: seg.Data(), dt: h.DType, shape: h.Shape, strides: h.Strides, name: seg.Name(), seg: seg}
}

// received makes a Tensor of memory a message brought, owning its count
// (a view that handover adopted).
func received(v *handover.View) *Tensor {
	return &Tensor{data: v.Data, dt: v.DType, shape: v.Shape, strides: v.Strides, name: v.Name, offset: v.Offset,
		ref: v.Ref, flags: v.Flags}
}

// inlineTensor makes a Tensor of a small array that came inside its
// message: a copy in this process's memory, which no other process holds.
func inlineTensor(in *message.Inline) *Tensor {
	return &Tensor{data: bytes.Clone(in.Data), dt: in.DType, shape: in.Shape, strides: in.Strides(), name: "(inline)", flags: in.Flags}
}

// errZeroTensor is the error of a Tensor that no constructor made (every
// one names its tensor): it holds no memory, and closing it would hide
// the mistake, as os.File's nil receiver does not.
var errZeroTensor = fmt.Errorf("a zero zctipc.Tensor, made by neither NewTensor, AttachTensor, AttachRef nor Queue.Get: %w", unix.EINVAL)

// enter starts a call that touches the tensor's memory; the caller defers
// t.guard.Leave.
func (t *Tensor) enter() error {
	if t == nil {
		return nilErr("Tensor")
	}
	if t.name == "" {
		return errZeroTensor
	}
	if !t.guard.Enter() {
		return fmt.Errorf("tensor %s: %w", t.name, ErrClosed)
	}
	return nil
}

// Name returns the full name of the tensor's segment (or of the pool arena
// it lies in).
func (t *Tensor) Name() string {
	if t == nil {
		return ""
	}
	return t.name
}

// DType returns the element type.
func (t *Tensor) DType() DType {
	if t == nil {
		return 0
	}
	return t.dt
}

// Shape returns the dimensions.
func (t *Tensor) Shape() []int64 {
	if t == nil {
		return nil
	}
	return slices.Clone(t.shape)
}

// Strides returns the byte step of each dimension.
func (t *Tensor) Strides() []int64 {
	if t == nil {
		return nil
	}
	return slices.Clone(t.strides)
}

// Contiguous reports whether the elements are laid out in C order without
// gaps (a tensor with no elements is, as NumPy says).
func (t *Tensor) Contiguous() bool {
	if t == nil {
		return false
	}
	if slices.Contains(t.shape, 0) {
		return true
	}
	step := int64(t.dt.Size())
	for i := len(t.shape) - 1; i >= 0; i-- {
		if t.shape[i] != 1 && t.strides[i] != step {
			return false
		}
		step *= t.shape[i]
	}
	return true
}

// Bytes returns the tensor's memory, from its first element to the last
// byte an element can touch: shared, not a copy, and valid until Close.
func (t *Tensor) Bytes() ([]byte, error) {
	if err := t.enter(); err != nil {
		return nil, err
	}
	defer t.guard.Leave()
	return t.data, nil
}

// Element is a Go type that a tensor's elements can be viewed as.
type Element interface {
	~bool | ~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~float32 | ~float64 |
		~complex64 | ~complex128
}

// Values returns the elements of a C-contiguous tensor as a []T over the
// shared memory (no copy), valid until Close. T must have the tensor's
// element size and kind (float32, or a type whose underlying type is
// float32, for Float32; uint16 for Float16 and BFloat16 bits).
func Values[T Element](t *Tensor) ([]T, error) {
	if err := t.enter(); err != nil {
		return nil, err
	}
	defer t.guard.Leave()
	if !t.Contiguous() {
		return nil, fmt.Errorf("a tensor of shape %v and strides %v is not C-contiguous: %w", t.shape, t.strides, unix.EINVAL)
	}
	n := 1
	for _, d := range t.shape {
		n *= int(d)
	}
	return view[T](t.data, t.dt, n)
}

// view returns n elements of type T (which must match dt) at the start of
// b.
func view[T Element](b []byte, dt DType, n int) ([]T, error) {
	var zero T
	if !matches(dt, any(zero)) {
		return nil, fmt.Errorf("%s elements viewed as %T: %w", dt, zero, unix.EINVAL)
	}
	if n == 0 {
		return []T{}, nil
	}
	if uintptr(len(b)) < uintptr(n)*unsafe.Sizeof(zero) {
		return nil, fmt.Errorf("%d elements of %T in %d bytes: %w", n, zero, len(b), unix.EINVAL)
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n), nil
}

func matches(dt DType, v any) bool {
	switch reflect.TypeOf(v).Kind() { // the kind, so that named types fit as Element allows
	case reflect.Bool:
		return dt == Bool
	case reflect.Int8:
		return dt == Int8
	case reflect.Int16:
		return dt == Int16
	case reflect.Int32:
		return dt == Int32
	case reflect.Int64:
		return dt == Int64
	case reflect.Uint8:
		return dt == Uint8
	case reflect.Uint16:
		return dt == Uint16 || dt == Float16 || dt == BFloat16
	case reflect.Uint32:
		return dt == Uint32
	case reflect.Uint64:
		return dt == Uint64
	case reflect.Float32:
		return dt == Float32
	case reflect.Float64:
		return dt == Float64
	case reflect.Complex64:
		return dt == Complex64
	case reflect.Complex128:
		return dt == Complex128
	}
	return false
}

// Refcount returns how many holders the tensor's memory has, in every
// process.
func (t *Tensor) Refcount() (int64, error) {
	if err := t.enter(); err != nil {
		return 0, err
	}
	defer t.guard.Leave()
	switch {
	case t.seg != nil:
		return t.seg.Refcount()
	case t.ref != nil:
		return t.ref.Holders()
	}
	return 1, nil // a copy that came inside its message
}

// Close gives up the tensor's count; the memory goes when no process holds
// it. It waits for calls in flight on t; afterwards the memory methods
// return ErrClosed, and slices from Bytes and Values must not be used.
// Closing twice returns ErrClosed; closing a zero Tensor (one no
// constructor made), an error wrapping EINVAL.
func (t *Tensor) Close() error {
	if t == nil {
		return nilErr("Tensor")
	}
	if t.name == "" {
		return errZeroTensor
	}
	if !t.guard.Close(nil) {
		return fmt.Errorf("tensor %s: %w", t.name, ErrClosed)
	}
	switch {
	case t.seg != nil:
		return t.seg.Close()
	case t.ref != nil:
		return t.ref.Release()
	}
	return nil
}

// Unlink removes the tensor's segment name now; holders keep the memory.
// A receiver finds a segment by its name, so PutTensor refuses it afterwards.
func (t *Tensor) Unlink() error {
	if err := t.enter(); err != nil {
		return err
	}
	defer t.guard.Leave()
	if t.seg == nil {
		return fmt.Errorf("a tensor received in a pool buffer or inline has no segment of its own to unlink: %w", unix.EINVAL)
	}
	return shm.Unlink(t.seg.Name())
}

// Ref returns t's TensorRef: only a tensor that is the whole tensor of a
// segment of its own has one (memory received in a pool buffer can be
// handed on in a Queue).
func (t *Tensor) Ref() (TensorRef, error) {
	if err := t.enter(); err != nil {
		return TensorRef{}, err
	}
	defer t.guard.Leave()
	seg := t.seg
	if seg == nil && t.ref != nil {
		seg = t.ref.Segment()
	}
	if seg == nil {
		return TensorRef{}, fmt.Errorf("a tensor in a pool buffer has no segment to name; send it in a queue: %w", unix.EINVAL)
	}
	r := tensorref.Of(seg.Name(), seg.Header())
	if r.DType != t.dt.String() || !slices.Equal(r.Shape, t.shape) || !slices.Equal(r.Strides, t.strides) || t.offset != 0 {
		return TensorRef{}, fmt.Errorf("tensor %s is a view of part of its segment, which a TensorRef cannot name: %w", t.name, unix.EINVAL)
	}
	return r, nil
}

// inlineRecord returns the record that sends t inside itself: when it has
// no elements (no memory to describe: its type and shape travel, as an
// inline array of no bytes, as Python sends an empty array), or when it
// came inline (its memory is this process's own copy, which no other
// process can map: it goes on as it came, a small array). The caller has
// entered t, and puts the record before it leaves.
func (t *Tensor) inlineRecord() (message.Record, bool, error) {
	n, ok := header.ByteCount(t.shape, t.dt.Size())
	if !ok || (n != 0 && (t.seg != nil || t.ref != nil)) || uint64(len(t.data)) < n {
		return message.Record{}, false, nil
	}
	rec, err := handover.Inline(t.dt, t.flags, t.shape, t.data[:n]) // an inline tensor is C-contiguous
	return rec, true, err
}

// describe returns the descriptor of t and the ref whose count it carries.
// The caller has entered t.
func (t *Tensor) describe() (message.Descriptor, *buffer.Ref, error) {
	if len(t.data) == 0 {
		return message.Descriptor{}, nil, fmt.Errorf("an empty tensor has no memory to send: %w", unix.EINVAL)
	}
	r, off, ok, err := buffer.Find(uintptr(unsafe.Pointer(&t.data[0])), uint64(len(t.data)))
	if err != nil {
		return message.Descriptor{}, nil, err
	}
	if !ok {
		return message.Descriptor{}, nil, fmt.Errorf("tensor %s is not zctipc memory: %w", t.name, unix.EINVAL)
	}
	d, err := r.Describe(off, t.dt, t.shape, t.strides, t.flags)
	if err != nil {
		return message.Descriptor{}, nil, errors.Join(err, r.Release())
	}
	return d, r, nil
}
