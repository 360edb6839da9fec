package dtype_test

import (
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
