// Package tensorref is the TensorRef: a tensor segment described in a
// stable JSON form that any language can be handed (docs/format.md,
// "TensorRef"), its one parser, and its one check against the segment.
package tensorref

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// Ref describes the tensor of a tensor segment: which segment, and the
// array it holds, as the segment's header says.
type Ref struct {
	ID      string  `json:"id"`      // the segment name without the prefix
	Segment string  `json:"segment"` // the full segment name
	DType   string  `json:"dtype"`   // "float32", ...
	Shape   []int64 `json:"shape"`
	Strides []int64 `json:"strides"` // bytes
	Offset  uint64  `json:"offset"`  // of the first element in the segment's data region: 0
	NBytes  uint64  `json:"nbytes"`  // bytes from Offset the tensor may touch: all of the data region
	Device  string  `json:"device"`  // "cpu"
}

// ErrMismatch is wrapped by the errors of a ref that does not describe its
// segment.
var ErrMismatch = fmt.Errorf("the TensorRef does not describe its segment: %w", unix.EINVAL)

// Of returns the ref of the tensor segment whose name and header are given.
func Of(name string, h header.Header) Ref {
	return Ref{ID: strings.TrimPrefix(name, shm.Prefix), Segment: name, DType: h.DType.String(), Shape: h.Shape,
		Strides: h.Strides, Offset: 0, NBytes: h.NBytes, Device: "cpu"}
}

// Parse decodes a ref's JSON; shape, strides and the segment are required,
// a missing device means "cpu".
func Parse(data []byte) (Ref, error) {
	var raw struct {
		Ref
		Shape   *[]int64 `json:"shape"`
		Strides *[]int64 `json:"strides"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return Ref{}, fmt.Errorf("a TensorRef is a JSON object: %w: %w", err, unix.EINVAL)
	}
	if raw.Shape == nil || raw.Strides == nil || raw.Ref.Segment == "" || raw.Ref.DType == "" {
		return Ref{}, fmt.Errorf("a TensorRef needs segment, dtype, shape and strides: %w", unix.EINVAL)
	}
	r := raw.Ref
	r.Shape, r.Strides = *raw.Shape, *raw.Strides
	if r.Device == "" {
		r.Device = "cpu"
	}
	return r, nil
}

// Check compares r with the header of the segment it names (name is its
// full name): the same segment, element type, shape and strides, the whole
// data region from offset 0, on the CPU. A segment is never read as a type
// or shape other than its own.
func (r Ref) Check(name string, h header.Header) error {
	dt, err := dtype.Parse(r.DType)
	if err != nil {
		return err
	}
	var problems []string
	if r.Device != "cpu" {
		problems = append(problems, fmt.Sprintf("device %q (segments hold cpu tensors)", r.Device))
	}
	if h.Kind != header.KindTensor {
		problems = append(problems, fmt.Sprintf("a %s segment (a TensorRef names a tensor segment)", h.Kind))
	}
	if r.ID != "" && r.ID != strings.TrimPrefix(name, shm.Prefix) {
		problems = append(problems, fmt.Sprintf("id %q for segment %q", r.ID, name))
	}
	if dt != h.DType {
		problems = append(problems, fmt.Sprintf("dtype %s where the segment holds %s", dt, h.DType))
	}
	if !slices.Equal(r.Shape, h.Shape) || !slices.Equal(r.Strides, h.Strides) {
		problems = append(problems, fmt.Sprintf("shape %v and strides %v where the segment holds %v and %v",
			r.Shape, r.Strides, h.Shape, h.Strides))
	}
	if r.Offset != 0 || r.NBytes != h.NBytes {
		problems = append(problems, fmt.Sprintf("%d bytes at offset %d where the segment holds %d at 0",
			r.NBytes, r.Offset, h.NBytes))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w %s: %s", ErrMismatch, name, strings.Join(problems, "; "))
	}
	return nil
}

// Attach attaches the segment r names (read-only if asked) after checking
// r against its header.
func Attach(r Ref, readOnly bool) (*shm.Segment, error) {
	seg, err := shm.Attach(r.Segment, 0, readOnly)
	if err != nil {
		return nil, err
	}
	if err := r.Check(seg.Name(), seg.Header()); err != nil {
		return nil, errors.Join(err, seg.Close())
	}
	return seg, nil
}
