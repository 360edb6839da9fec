package zctipc_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/zctipc"
	"golang.org/x/sys/unix"
)

// A tensor with no elements travels as any other: its type and shape
// arrive, and its values are an empty slice.
func TestAPIAnEmptyTensorIsPutAndGot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q, err := zctipc.NewQueue("", 1<<16)
	require.NoError(t, err)
	defer q.Close()
	for _, shape := range [][]int64{{0, 5}, {0}, {5, 0, 3}} {
		x, err := zctipc.NewTensor("", zctipc.Float32, shape...)
		require.NoError(t, err, "NewTensor %v", shape)
		require.NoError(t, q.PutTensor(ctx, x), "PutTensor %v", shape)
		require.NoError(t, x.Close())
		m, err := q.Get(ctx)
		require.NoError(t, err)
		require.NotNil(t, m.Tensor)
		require.Equal(t, zctipc.Float32, m.Tensor.DType())
		require.Equal(t, shape, m.Tensor.Shape())
		v, err := zctipc.Values[float32](m.Tensor)
		require.NoError(t, err)
		require.Empty(t, v)
		require.NoError(t, m.Tensor.Close())
	}
}

// An empty bytes message is told from a message of another kind: its
// Bytes are an empty slice, not nil.
func TestAPIAnEmptyBytesMessageArrivesAsEmptyBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q, err := zctipc.NewQueue("", 1<<16)
	require.NoError(t, err)
	defer q.Close()
	for _, b := range [][]byte{nil, {}, {7}} {
		require.NoError(t, q.PutBytes(ctx, b))
		m, err := q.Get(ctx)
		require.NoError(t, err)
		require.NotNil(t, m.Bytes, "a bytes message of %d bytes", len(b))
		require.Len(t, m.Bytes, len(b))
		require.Nil(t, m.Tensor)
		require.Nil(t, m.Pickle)
	}
}

type celsius float32

// Values takes a named type whose underlying type fits, as Element allows.
func TestAPIValuesOfANamedType(t *testing.T) {
	t.Parallel()
	x, err := zctipc.NewTensor("", zctipc.Float32, 3)
	require.NoError(t, err)
	defer x.Close()
	v, err := zctipc.Values[celsius](x)
	require.NoError(t, err)
	v[1] = 21.5
	f, err := zctipc.Values[float32](x)
	require.NoError(t, err)
	require.Equal(t, []float32{0, 21.5, 0}, f)
	type kelvin float64
	_, err = zctipc.Values[kelvin](x)
	require.ErrorIs(t, err, unix.EINVAL, "a named type of another size")
}

// A zero Tensor, made by no constructor, is an error to close or use.
func TestAPIAZeroTensorIsAnError(t *testing.T) {
	t.Parallel()
	var x zctipc.Tensor
	require.ErrorIs(t, x.Close(), unix.EINVAL)
	require.ErrorContains(t, (&zctipc.Tensor{}).Close(), "zero zctipc.Tensor")
	_, err := x.Bytes()
	require.ErrorIs(t, err, unix.EINVAL)
	_, err = zctipc.Values[float32](&x)
	require.ErrorIs(t, err, unix.EINVAL)
	q, err := zctipc.NewQueue("", 1<<16)
	require.NoError(t, err)
	defer q.Close()
	require.ErrorIs(t, q.PutTensor(context.Background(), &x), unix.EINVAL)
}
