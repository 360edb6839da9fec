package pool_test

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestPoolAllocLeavingHugeLeave: a leave near 2^64 leaves more than any
// file system holds, so a buffer that needs new pages is refused (the sum
// of the buffer's bytes and leave must not wrap round to a small number),
// and the boundary is exact: new pages while the buffer and leave fit in
// what is free, none once they do not (Note [leaving room]).
func TestPoolAllocLeavingHugeLeave(t *testing.T) {
	testenv.SkipShort(t, "waits for the pool's sweeper")
	testenv.SegmentsOnTmpfs(t, "size=16m")
	const size = 1 << 20
	for _, leave := range []uint64{math.MaxUint64, math.MaxUint64 - size + 1, math.MaxUint64 - size/2, 1 << 63, 1 << 32, 1<<32 - 1, 1 << 31} {
		p := pool.New(1 << 30)
		_, err := p.AllocLeaving(size, leave, time.Time{})
		require.ErrorIs(t, err, pool.ErrNoRoom, "leave %d", leave)
		require.NoError(t, p.Close())
	}
	p := pool.New(1 << 30)
	defer p.Close()
	free := freeBytes(t)
	_, err := p.AllocLeaving(size, free-size+1, time.Time{})
	require.ErrorIs(t, err, pool.ErrNoRoom, "one byte short")
	s, err := p.AllocLeaving(size, free-size, time.Time{})
	require.NoError(t, err, "the buffer and leave fit exactly")
	require.NoError(t, s.Release())
}

// TestPoolForgedSlotNeverHandedOut: a descriptor naming a slot of a lazily
// reserved arena that was never handed out (its pages not reserved, on a
// file system with no room left for them) is refused as stale, whatever
// generation it names, and nothing touches the slot's bytes: no fault
// (Note [slots reserved when first used]).
func TestPoolForgedSlotNeverHandedOut(t *testing.T) {
	testenv.SkipShort(t, "waits for the pool's sweeper")
	if !shm.PagesOnDemand() {
		t.Skip("this kernel cannot reserve pages on demand (before Linux 5.14): arenas are reserved whole")
	}
	dir := testenv.SegmentsOnTmpfs(t, "size=8m")
	const size = 1 << 20
	p := pool.New(1 << 30)
	defer p.Close()
	s, err := p.Alloc(size, time.Time{})
	require.NoError(t, err)
	defer s.Release()
	name := s.Arena().Name()
	// Someone else takes every page left.
	f, err := os.Create(filepath.Join(dir, "someone-else"))
	require.NoError(t, err)
	defer f.Close()
	for n := int64(freeBytes(t)); n > 0; n -= 4096 {
		if unix.Fallocate(int(f.Fd()), 0, 0, n) == nil {
			break
		}
	}
	require.Less(t, freeBytes(t), uint64(size))
	for _, gen := range []uint32{0, 1, 2, math.MaxUint32} {
		for _, slot := range []uint32{1, 2, 3} {
			_, err := pool.Adopt(name, slot, gen)
			require.ErrorIs(t, err, pool.ErrStale, "slot %d generation %d", slot, gen)
		}
	}
	// Nor is one found by address: Find adds no count to a free slot.
	never := s.Arena().SlotData(2)
	_, _, ok := pool.Find(uintptr(unsafe.Pointer(unsafe.SliceData(never))), 8)
	require.False(t, ok, "a slot never handed out is no buffer")
	// The owner's next slot finds no pages: an error, not a fault.
	_, err = p.Alloc(size, time.Now())
	require.ErrorIs(t, err, shm.ErrOutOfSharedMemory)
}
