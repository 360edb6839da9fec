package zctipc

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/zctipc/zctipc/go/buffer"
	"github.com/zctipc/zctipc/go/dtype"
	"github.com/zctipc/zctipc/go/header"
	"github.com/zctipc/zctipc/go/message"
	"github.com/zctipc/zctipc/go/shm"
	"golang.org/x/sys/unix"
)

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
// (NewTensor, AttachTensor) or memory another process sent through a Queue
// (a segment or a pool slot). It holds one count on that memory until Close.
type Tensor struct {
	data    []byte
	dt      DType
	shape   []int64
	strides []int64 // bytes
	name    string  // the segment, or the arena of a slot
	offset  uint64  // of data in the segment's data region, or in the slot
	seg     *shm.Segment
	ref     *buffer.Ref
}

// NewTensor creates a tensor segment of the given type and shape, zeroed.
// name gets the library prefix ("zctipc_"); an empty name makes a random
// one. An existing segment is never reused.
func NewTensor(name string, dt DType, shape ...int64) (*Tensor, error) {
	seg, err := shm.Create(name, header.KindTensor, dt, shape)
	if err != nil {
		return nil, err
	}
	return segmentTensor(seg), nil
}

// AttachTensor attaches the tensor segment name (with or without the
// prefix), read-only if asked.
func AttachTensor(name string, readOnly bool) (*Tensor, error) {
	seg, err := shm.Attach(name, header.KindTensor, readOnly)
	if err != nil {
		return nil, err
	}
	return segmentTensor(seg), nil
}

func segmentTensor(seg *shm.Segment) *Tensor {
	h := seg.Header()
	return &Tensor{data: seg.Data(), dt: h.DType, shape: h.Shape, strides: h.Strides, name: seg.Name(), seg: seg}
}

// received makes a Tensor of memory a message brought, owning its count.
func received(d *message.Descriptor) (*Tensor, error) {
	r, data, err := buffer.Adopt(d)
	if err != nil {
		return nil, err
	}
	return &Tensor{data: data[:d.NBytes:d.NBytes], dt: d.DType, shape: d.Shape, strides: d.Strides, name: d.Name,
		offset: d.Offset, ref: r}, nil
}

// Name returns the full name of the tensor's segment (or of the pool arena
// it lies in).
func (t *Tensor) Name() string { return t.name }

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dt }

// Shape returns the dimensions.
func (t *Tensor) Shape() []int64 { return t.shape }

// Strides returns the byte step of each dimension.
func (t *Tensor) Strides() []int64 { return t.strides }

// Bytes returns the tensor's memory, from its first element to the last
// byte an element can touch: shared, not a copy.
func (t *Tensor) Bytes() []byte { return t.data }

// Contiguous reports whether the elements are laid out in C order without
// gaps.
func (t *Tensor) Contiguous() bool {
	step := int64(t.dt.Size())
	for i := len(t.shape) - 1; i >= 0; i-- {
		if t.shape[i] != 1 && t.strides[i] != step {
			return false
		}
		step *= t.shape[i]
	}
	return true
}

// Element is a Go type that a tensor's elements can be viewed as.
type Element interface {
	~bool | ~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~float32 | ~float64 |
		~complex64 | ~complex128
}

// Values returns the elements of a C-contiguous tensor as a []T over the
// shared memory (unsafe.Slice: no copy). T must have the tensor's element
// size and kind (float32 for Float32, uint16 for Float16 and BFloat16 bits).
func Values[T Element](t *Tensor) ([]T, error) {
	var zero T
	if !matches(t.dt, any(zero)) {
		return nil, fmt.Errorf("a %s tensor viewed as %T: %w", t.dt, zero, unix.EINVAL)
	}
	if !t.Contiguous() {
		return nil, fmt.Errorf("a tensor of shape %v and strides %v is not C-contiguous: %w", t.shape, t.strides, unix.EINVAL)
	}
	n := 1
	for _, d := range t.shape {
		n *= int(d)
	}
	if n == 0 {
		return []T{}, nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&t.data[0])), n), nil
}

func matches(dt DType, v any) bool {
	switch v.(type) {
	case bool:
		return dt == Bool
	case int8:
		return dt == Int8
	case int16:
		return dt == Int16
	case int32:
		return dt == Int32
	case int64:
		return dt == Int64
	case uint8:
		return dt == Uint8
	case uint16:
		return dt == Uint16 || dt == Float16 || dt == BFloat16
	case uint32:
		return dt == Uint32
	case uint64:
		return dt == Uint64
	case float32:
		return dt == Float32
	case float64:
		return dt == Float64
	case complex64:
		return dt == Complex64
	case complex128:
		return dt == Complex128
	}
	return false
}

// Refcount returns how many holders the tensor's memory has, in every
// process.
func (t *Tensor) Refcount() (int64, error) {
	if t.seg != nil {
		return t.seg.Refcount()
	}
	return t.ref.Holders()
}

// Close gives up the tensor's count; the memory goes when no process holds
// it. The tensor must not be used afterwards.
func (t *Tensor) Close() error {
	switch {
	case t.seg != nil:
		return t.seg.Close()
	case t.ref != nil:
		return t.ref.Release()
	}
	return nil
}

// Unlink removes the tensor's segment name now; holders keep the memory.
func (t *Tensor) Unlink() error {
	if t.seg == nil {
		return fmt.Errorf("a tensor received in a pool buffer has no segment of its own to unlink: %w", unix.EINVAL)
	}
	return shm.Unlink(t.seg.Name())
}

// describe returns the descriptor of t and the ref whose count it carries.
func (t *Tensor) describe() (message.Descriptor, *buffer.Ref, error) {
	if len(t.data) == 0 {
		return message.Descriptor{}, nil, errors.New("an empty tensor has no memory to send")
	}
	r, off, ok, err := buffer.Find(uintptr(unsafe.Pointer(&t.data[0])), uint64(len(t.data)))
	if err != nil {
		return message.Descriptor{}, nil, err
	}
	if !ok {
		return message.Descriptor{}, nil, fmt.Errorf("tensor %s is not zctipc memory: %w", t.name, unix.EINVAL)
	}
	d, err := r.Describe(off, t.dt, t.shape, t.strides, 0)
	if err != nil {
		return message.Descriptor{}, nil, errors.Join(err, r.Release())
	}
	return d, r, nil
}

// TensorRef is a tensor's description in a stable JSON form that any
// language can be handed: the segment that holds it and where.
type TensorRef struct {
	ID      string  `json:"id"`      // the segment name without the prefix
	Segment string  `json:"segment"` // the full segment name
	DType   string  `json:"dtype"`   // "float32", ...
	Shape   []int64 `json:"shape"`
	Strides []int64 `json:"strides"` // bytes
	Offset  uint64  `json:"offset"`  // of the first element in the segment's data region
	NBytes  uint64  `json:"nbytes"`  // bytes from Offset the tensor may touch
	Device  string  `json:"device"`  // "cpu"
}

// Ref returns t's TensorRef. Only a tensor with a segment of its own has
// one (memory received in a pool buffer can be handed on in a Queue).
func (t *Tensor) Ref() (TensorRef, error) {
	if t.seg == nil {
		return TensorRef{}, fmt.Errorf("a tensor in a pool buffer has no segment to name; send it in a queue: %w", unix.EINVAL)
	}
	return TensorRef{ID: strings.TrimPrefix(t.name, shm.Prefix), Segment: t.name, DType: t.dt.String(),
		Shape: t.shape, Strides: t.strides, Offset: t.offset, NBytes: uint64(len(t.data)), Device: "cpu"}, nil
}

// AttachRef attaches the tensor a TensorRef describes, checking the
// description against the segment.
func AttachRef(r TensorRef) (*Tensor, error) {
	if r.Device != "" && r.Device != "cpu" {
		return nil, fmt.Errorf("a tensor on device %q: only cpu tensors live in segments: %w", r.Device, unix.EINVAL)
	}
	dt, err := dtype.Parse(r.DType)
	if err != nil {
		return nil, err
	}
	d := message.Descriptor{Kind: message.RefSegment, DType: dt, Shape: r.Shape, Strides: r.Strides, Name: r.Segment,
		Offset: r.Offset, NBytes: r.NBytes}
	if err := d.Check(); err != nil {
		return nil, err
	}
	seg, err := shm.Attach(r.Segment, header.KindTensor, false)
	if err != nil {
		return nil, err
	}
	data := seg.Data()
	if r.Offset > uint64(len(data)) || r.NBytes > uint64(len(data))-r.Offset {
		return nil, errors.Join(fmt.Errorf("%w: %d bytes at %d do not fit segment %s", header.ErrCorrupt, r.NBytes, r.Offset,
			r.Segment), seg.Close())
	}
	return &Tensor{data: data[r.Offset : r.Offset+r.NBytes], dt: dt, shape: r.Shape, strides: r.Strides, name: seg.Name(),
		offset: r.Offset, seg: seg}, nil
}
