package zctipc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/zctipc"
	"golang.org/x/sys/unix"
)

type (
	namedBool       bool
	namedInt8       int8
	namedInt16      int16
	namedInt32      int32
	namedInt64      int64
	namedUint8      uint8
	namedUint16     uint16
	namedUint32     uint32
	namedUint64     uint64
	namedFloat32    float32
	namedFloat64    float64
	namedComplex64  complex64
	namedComplex128 complex128
)

// valuesOf views x as []T and reports the view's length, or the error.
func valuesOf[T zctipc.Element](x *zctipc.Tensor) (int, error) {
	v, err := zctipc.Values[T](x)
	return len(v), err
}

// Values takes a named type of every element kind, for exactly the dtypes
// of its kind and size, and refuses it for every other.
func TestAPIValuesOfNamedTypesOfEveryKind(t *testing.T) {
	t.Parallel()
	views := []struct {
		name string
		fits []zctipc.DType
		view func(*zctipc.Tensor) (int, error)
	}{
		{"bool", []zctipc.DType{zctipc.Bool}, valuesOf[namedBool]},
		{"int8", []zctipc.DType{zctipc.Int8}, valuesOf[namedInt8]},
		{"int16", []zctipc.DType{zctipc.Int16}, valuesOf[namedInt16]},
		{"int32", []zctipc.DType{zctipc.Int32}, valuesOf[namedInt32]},
		{"int64", []zctipc.DType{zctipc.Int64}, valuesOf[namedInt64]},
		{"uint8", []zctipc.DType{zctipc.Uint8}, valuesOf[namedUint8]},
		{"uint16", []zctipc.DType{zctipc.Uint16, zctipc.Float16, zctipc.BFloat16}, valuesOf[namedUint16]},
		{"uint32", []zctipc.DType{zctipc.Uint32}, valuesOf[namedUint32]},
		{"uint64", []zctipc.DType{zctipc.Uint64}, valuesOf[namedUint64]},
		{"float32", []zctipc.DType{zctipc.Float32}, valuesOf[namedFloat32]},
		{"float64", []zctipc.DType{zctipc.Float64}, valuesOf[namedFloat64]},
		{"complex64", []zctipc.DType{zctipc.Complex64}, valuesOf[namedComplex64]},
		{"complex128", []zctipc.DType{zctipc.Complex128}, valuesOf[namedComplex128]},
	}
	dtypes := []zctipc.DType{zctipc.Bool, zctipc.Int8, zctipc.Int16, zctipc.Int32, zctipc.Int64, zctipc.Uint8,
		zctipc.Uint16, zctipc.Uint32, zctipc.Uint64, zctipc.Float16, zctipc.Float32, zctipc.Float64, zctipc.BFloat16,
		zctipc.Complex64, zctipc.Complex128}
	for _, dt := range dtypes {
		for _, shape := range [][]int64{{3}, {0}, {2, 0}} {
			x, err := zctipc.NewTensor("", dt, shape...)
			require.NoError(t, err, "NewTensor %v %v", dt, shape)
			for _, v := range views {
				n, err := v.view(x)
				fits := false
				for _, f := range v.fits {
					fits = fits || f == dt
				}
				if !fits {
					require.ErrorIs(t, err, unix.EINVAL, "%s over %v", v.name, dt)
					continue
				}
				require.NoError(t, err, "%s over %v %v", v.name, dt, shape)
				want := int64(1)
				for _, d := range shape {
					want *= d
				}
				require.EqualValues(t, want, n)
			}
			require.NoError(t, x.Close())
		}
	}
}

// Every method of a zero or closed object returns an error (never panics,
// never blocks).
func TestAPIZeroAndClosedObjectsAreErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	closed := func(err error) bool { return errors.Is(err, zctipc.ErrClosed) || errors.Is(err, unix.EINVAL) }
	queueCalls := func(q *zctipc.Queue) []error {
		_, lerr := q.Len()
		_, gerr := q.Get(ctx)
		x, err := zctipc.NewTensor("", zctipc.Float32, 2)
		require.NoError(t, err)
		defer x.Close()
		return []error{q.SetWait(zctipc.Polling), lerr, q.Wait(ctx), q.PutBytes(ctx, []byte("x")),
			q.PutTensor(ctx, x), gerr, q.Close()}
	}
	streamCalls := func(s *zctipc.Stream) []error {
		_, perr := s.Published()
		_, rerr := s.Readers()
		_, werr := s.Writer()
		_, rderr := s.Reader(-1)
		return []error{perr, rerr, werr, rderr, s.End(), s.Close()}
	}
	tensorCalls := func(x *zctipc.Tensor) []error {
		_, berr := x.Bytes()
		_, verr := zctipc.Values[float32](x)
		_, cerr := x.Refcount()
		_, rerr := x.Ref()
		return []error{berr, verr, cerr, rerr, x.Unlink(), x.Close()}
	}
	var nilQueue *zctipc.Queue
	var nilStream *zctipc.Stream
	var nilTensor *zctipc.Tensor
	for name, errs := range map[string][]error{
		"zero Queue":  queueCalls(&zctipc.Queue{}),
		"nil Queue":   queueCalls(nilQueue),
		"zero Stream": streamCalls(&zctipc.Stream{}),
		"nil Stream":  streamCalls(nilStream),
		"zero Tensor": tensorCalls(&zctipc.Tensor{}),
		"nil Tensor":  tensorCalls(nilTensor),
		"closed Queue": func() []error {
			q, err := zctipc.NewQueue("", 1<<16)
			require.NoError(t, err)
			require.NoError(t, q.Close())
			return queueCalls(q)
		}(),
		"closed Stream": func() []error {
			s, err := zctipc.NewStream("", zctipc.StreamConfig{DType: zctipc.Float32, Shape: []int64{4}, Frames: 2, Readers: 1})
			require.NoError(t, err)
			require.NoError(t, s.Close())
			return streamCalls(s)
		}(),
		"closed Tensor": func() []error {
			x, err := zctipc.NewTensor("", zctipc.Float32, 2)
			require.NoError(t, err)
			require.NoError(t, x.Close())
			return tensorCalls(x)
		}(),
	} {
		for i, err := range errs {
			require.True(t, closed(err), "%s: call %d: %v", name, i, err)
		}
	}
	var zw zctipc.StreamWriter
	var zr zctipc.StreamReader
	_, err := zw.Look(ctx)
	require.True(t, closed(err), "zero StreamWriter: %v", err)
	require.True(t, closed(zw.Close()))
	_, err = zr.Look(ctx)
	require.True(t, closed(err), "zero StreamReader: %v", err)
	require.True(t, closed(zr.Close()))
}
