package dtype_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
)

func TestDTypeNames(t *testing.T) {
	t.Parallel()
	for code := dtype.Bool; code <= dtype.Complex128; code++ {
		back, err := dtype.Parse(code.String())
		require.NoError(t, err)
		require.Equal(t, code, back)
		require.Positive(t, code.Size())
	}
	_, err := dtype.Parse("object")
	require.ErrorIs(t, err, dtype.ErrUnsupported)
	require.Zero(t, dtype.DType(200).Size())
}

// TestFromCode: every code of the table is its DType; a code of none is
// ErrUnsupported, never wrapped onto the type of its low 16 bits.
func TestFromCode(t *testing.T) {
	t.Parallel()
	for code := dtype.Bool; code <= dtype.Complex128; code++ {
		got, err := dtype.FromCode(int64(code))
		require.NoError(t, err)
		require.Equal(t, code, got)
	}
	for _, code := range []int64{
		0, -1, math.MinInt32, math.MaxInt32, 1 << 16, 1<<16 + int64(dtype.Float32), -1<<16 + int64(dtype.Float32),
		1<<32 + int64(dtype.Uint8), int64(dtype.Complex128) + 1, 0xFFFF, math.MinInt64, math.MaxInt64,
	} {
		got, err := dtype.FromCode(code)
		require.ErrorIs(t, err, dtype.ErrUnsupported, "code %d", code)
		require.Equal(t, dtype.Invalid, got, "code %d", code)
	}
}
