package buffer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"golang.org/x/sys/unix"
)

// An array whose elements' bytes overflow 64 bits while its zero strides
// keep its extent to one element (a torch expand of 2^31 x 2^31 float32s:
// 2^64 bytes, past the 2^63 a descriptor counts)
// is the describer's bad argument (EINVAL, the C ABI's ZCT_E_INVALID), not
// a malformed message: ErrMalformed names bytes a get read.
func TestDescribeRefusesBytesThatOverflowAsABadArgument(t *testing.T) {
	p := pool.New(64 << 20)
	defer p.Close()
	s, err := p.Alloc(4096, time.Time{})
	require.NoError(t, err)
	ref := buffer.NewSlotRef(s)
	defer func() { require.NoError(t, ref.Release()) }()
	_, err = ref.Describe(0, dtype.Float32, []int64{1 << 31, 1 << 31}, []int64{0, 0}, 0)
	require.ErrorIs(t, err, unix.EINVAL)
	require.NotErrorIs(t, err, message.ErrMalformed)
	_, err = ref.Describe(0, dtype.Float32, []int64{1 << 29, 1 << 31}, []int64{0, 0}, 0)
	require.NoError(t, err, "2^63 bytes less one: a count")
}
