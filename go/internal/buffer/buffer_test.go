package buffer_test

import (
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// A described buffer is attached with a count of its own each time, while
// whoever described it holds it; once every holder let go, attaching it
// fails with ENOENT and revives nothing.
func TestAttachDescribedSlot(t *testing.T) {
	p := pool.New(64 << 20)
	defer p.Close()
	s, err := p.Alloc(4096, time.Time{})
	require.NoError(t, err)
	copy(s.Data(), "described")
	ref := buffer.NewSlotRef(s)
	d, err := ref.Describe(0, dtype.Uint8, []int64{9}, []int64{1}, 0)
	require.NoError(t, err)

	a, data, err := buffer.Attach(&d)
	require.NoError(t, err)
	require.Equal(t, "described", string(data))
	b, _, err := buffer.Attach(&d)
	require.NoError(t, err)
	n, err := ref.Holders()
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "the describer's count and one per attach")

	require.NoError(t, a.Release())
	require.NoError(t, ref.Release())
	c, data, err := buffer.Attach(&d)
	require.NoError(t, err, "b still holds it")
	require.Equal(t, "described", string(data))
	require.NoError(t, b.Release())
	n, err = c.Holders()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.NoError(t, c.Release())
	_, _, err = buffer.Attach(&d)
	require.ErrorIs(t, err, unix.ENOENT)
}

func TestAttachDescribedSegment(t *testing.T) {
	seg, err := shm.Create("", header.KindTensor, dtype.Uint8, []int64{64})
	require.NoError(t, err)
	copy(seg.Data(), "segment")
	ref, off, ok, err := buffer.Find(uintptr(unsafe.Pointer(&seg.Data()[0])), 64)
	require.NoError(t, err)
	require.True(t, ok)
	d, err := ref.Describe(off, dtype.Uint8, []int64{7}, []int64{1}, 0)
	require.NoError(t, err)
	require.NoError(t, ref.Release())

	a, data, err := buffer.Attach(&d)
	require.NoError(t, err)
	require.Equal(t, "segment", string(data))
	require.NoError(t, a.Release())
	name := seg.Name()
	require.NoError(t, seg.Close()) // the last holder: the file goes
	_, _, err = buffer.Attach(&d)
	require.ErrorIs(t, err, unix.ENOENT, "segment %s", name)

	bad := d
	bad.Offset = 1 << 20
	_, _, err = buffer.Attach(&bad)
	require.Error(t, err)
}

// An array of a dtype zctipc does not know is refused as such when it is
// described (dtype.ErrUnsupported, the C ABI's ZCT_E_DTYPE), never sent.
func TestDescribeRefusesAnUnknownDType(t *testing.T) {
	_, err := describable(t).Describe(0, dtype.DType(999), []int64{4}, []int64{1}, 0)
	require.ErrorIs(t, err, dtype.ErrUnsupported)
}

// describable returns a count on a new pool slot, given up
// when the test ends.
func describable(t *testing.T) *buffer.Ref {
	t.Helper()
	p := pool.New(64 << 20)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	ref := newRef(t, p, "slot")
	t.Cleanup(func() { require.NoError(t, ref.Release()) })
	return ref
}

// An array whose elements' bytes overflow 64 bits while its zero strides
// keep its extent to one element (a torch expand of 2^31 x 2^31 float32s:
// 2^64 bytes, past the 2^63 a descriptor counts)
// is the describer's bad argument (EINVAL, the C ABI's ZCT_E_INVALID), not
// a malformed message: ErrMalformed names bytes a get read.
func TestDescribeRefusesBytesThatOverflowAsABadArgument(t *testing.T) {
	ref := describable(t)
	_, err := ref.Describe(0, dtype.Float32, []int64{1 << 31, 1 << 31}, []int64{0, 0}, 0)
	require.ErrorIs(t, err, unix.EINVAL)
	require.NotErrorIs(t, err, message.ErrMalformed)
	_, err = ref.Describe(0, dtype.Float32, []int64{1 << 29, 1 << 31}, []int64{0, 0}, 0)
	require.NoError(t, err, "2^63 bytes less one: a count")
}
