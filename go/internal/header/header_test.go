package header_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/headertest"
	"golang.org/x/sys/unix"
)

func TestHeaderNew(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		dt      dtype.DType
		shape   []int64
		strides []int64
		nbytes  uint64
		offset  uint64
	}{
		{"scalar", dtype.Float64, nil, []int64{}, 8, 128},
		{"empty", dtype.Float32, []int64{0}, []int64{4}, 0, 192},
		{"empty inner", dtype.Int16, []int64{3, 0, 2}, []int64{4, 4, 2}, 0, 192},
		{"matrix", dtype.Float32, []int64{2, 3}, []int64{12, 4}, 24, 192},
		{"bfloat16", dtype.BFloat16, []int64{5}, []int64{2}, 10, 192},
		{"max ndim", dtype.Uint8, make([]int64, header.MaxNDim), make([]int64, header.MaxNDim), 0, 640},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := header.New(header.KindTensor, tt.dt, tt.shape)
			require.NoError(t, err)
			if tt.name == "max ndim" {
				tt.strides = h.Strides // all dimensions 0: strides are the itemsize
			}
			require.Equal(t, tt.strides, h.Strides)
			require.Equal(t, tt.nbytes, h.NBytes)
			require.Equal(t, tt.offset, h.DataOffset)
			buf := make([]byte, h.SegmentSize())
			h.Encode(buf)
			back, err := header.Decode(buf, uint64(len(buf)))
			require.NoError(t, err)
			require.Equal(t, h.Strides, back.Strides)
			require.Equal(t, h.NBytes, back.NBytes)
		})
	}
}

func TestHeaderNewRefusesBadArguments(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		kind  header.Kind
		dt    dtype.DType
		shape []int64
		want  error
	}{
		{"unknown dtype", header.KindTensor, 99, []int64{1}, dtype.ErrUnsupported},
		{"invalid dtype", header.KindTensor, dtype.Invalid, []int64{1}, dtype.ErrUnsupported},
		{"no kind", 0, dtype.Uint8, []int64{1}, unix.EINVAL},
		{"ndim over limit", header.KindTensor, dtype.Uint8, make([]int64, header.MaxNDim+1), unix.EINVAL},
		{"negative dimension", header.KindTensor, dtype.Uint8, []int64{2, -1}, unix.EINVAL},
		{"overflowing shape", header.KindTensor, dtype.Int64, []int64{1 << 61, 16}, unix.EINVAL},
		{"overflow only with itemsize", header.KindTensor, dtype.Complex128, []int64{math.MaxInt64 / 8}, unix.EINVAL},
		// Every kind but a tensor holds uint8 in one dimension (format.md).
		{"a table of float32", header.KindTable, dtype.Float32, []int64{4}, unix.EINVAL},
		{"a table in two dimensions", header.KindTable, dtype.Uint8, []int64{2, 3}, unix.EINVAL},
		{"a table in no dimension", header.KindTable, dtype.Uint8, nil, unix.EINVAL},
		{"a queue of int8", header.KindQueue, dtype.Int8, []int64{4096}, unix.EINVAL},
		{"an arena of bool", header.KindArena, dtype.Bool, []int64{4096}, unix.EINVAL},
		{"a table of an unknown dtype", header.KindTable, 99, []int64{4}, dtype.ErrUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := header.New(tt.kind, tt.dt, tt.shape)
			require.ErrorIs(t, err, tt.want)
		})
	}
}

// TestHeaderNewKindsOtherThanTensor: every kind but a tensor takes uint8
// in one dimension, and is a C-contiguous array of it.
func TestHeaderNewKindsOtherThanTensor(t *testing.T) {
	t.Parallel()
	for _, kind := range []header.Kind{header.KindArena, header.KindQueue, header.KindStream, header.KindTable, header.KindLedger, header.KindEvent} {
		h, err := header.New(kind, dtype.Uint8, []int64{100})
		require.NoError(t, err, kind.String())
		require.Equal(t, []int64{1}, h.Strides)
		require.EqualValues(t, 100, h.NBytes)
	}
}

func TestHeaderChecksumCoversOnlyFixedFields(t *testing.T) {
	t.Parallel()
	h, buf := headertest.SegmentBytes(t, dtype.Float32, []int64{2, 3})
	before := header.Checksum(buf)
	le.PutUint64(buf[header.RefcountOffset:], 77) // the refcount changes while shared
	require.Equal(t, before, header.Checksum(buf))
	got, err := header.Decode(buf, uint64(len(buf)))
	require.NoError(t, err)
	require.EqualValues(t, 77, got.Refcount)
	buf[h.Len()-1] ^= 1 // the last stride byte is covered
	require.NotEqual(t, before, header.Checksum(buf))
}
