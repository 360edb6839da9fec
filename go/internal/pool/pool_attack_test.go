package pool_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/shm"
)

// Buffers of 1 byte and of exactly a class's size get that class's slot,
// and one byte more the next class's: a buffer never gets a slot smaller
// than it asked for, and every byte of it is writable.
func TestPoolClassEdges(t *testing.T) {
	p := pool.New(256 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	for c := 0; c < 60; c++ {
		size := pool.ClassSize(c)
		for _, n := range []uint64{size, size + 1, 1} {
			got, ok := pool.ClassOf(n)
			require.True(t, ok)
			require.GreaterOrEqual(t, pool.ClassSize(got), n)
			if got > 0 {
				require.Less(t, pool.ClassSize(got-1), n, "the smallest class that holds %d bytes", n)
			}
		}
		if size > 1<<20 {
			continue
		}
		s, err := p.Alloc(size, time.Time{})
		require.NoError(t, err)
		require.Len(t, s.Data(), int(size))
		s.Data()[size-1] = 1
		require.NoError(t, s.Release())
	}
}

// A limit lowered below what is live refuses new arenas (ErrFull: what is
// live may come back) without touching the live buffers; once they are
// freed, buffers that fit the new limit are had again, and the pool never
// holds more than it.
func TestPoolLimitLoweredBelowWhatIsLive(t *testing.T) {
	p := pool.New(64 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	var live []pool.Slot
	for i := range 8 {
		s, err := p.Alloc(1<<20+uint64(i)*12345, time.Time{})
		require.NoError(t, err)
		s.Data()[0] = byte(i)
		live = append(live, s)
	}
	p.SetLimit(2 << 20)
	_, err := p.Alloc(3<<20, time.Now())
	require.True(t, errors.Is(err, pool.ErrFull) || errors.Is(err, pool.ErrNoRoom), "%v", err)
	require.ErrorIs(t, err, shm.ErrOutOfSharedMemory)
	for i, s := range live {
		require.Equal(t, byte(i), s.Data()[0], "a live buffer is untouched")
		require.NoError(t, s.Release())
	}
	s, err := p.Alloc(1<<20, time.Now().Add(5*time.Second))
	require.NoError(t, err, "freed buffers make room under the new limit")
	require.LessOrEqual(t, p.Stats().Reserved, uint64(2<<20))
	require.NoError(t, s.Release())
	_, err = p.Alloc(3<<20, time.Now())
	require.ErrorIs(t, err, pool.ErrNoRoom, "a buffer past the limit fails at once")
}
