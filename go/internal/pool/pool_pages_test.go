package pool_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

// arenaResident returns the bytes of memory the file of arena name holds.
func arenaResident(t *testing.T, name string) int64 {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Stat(filepath.Join(shm.Dir(), name), &st), "Stat")
	return st.Blocks * 512
}

// freeBytes returns the free bytes of the segment directory's file system.
func freeBytes(t *testing.T) uint64 {
	t.Helper()
	var fs unix.Statfs_t
	require.NoError(t, unix.Statfs(shm.Dir(), &fs), "Statfs")
	return fs.Bavail * uint64(fs.Bsize)
}

// TestPoolArenaReservesSlotsAsTheyAreUsed: an arena of several buffer
// slots holds the pages of the slots handed out, not of all of them
// (Note [slots reserved when first used]); a slot freed and taken again
// reserves nothing more, and every byte of a slot handed out is writable.
func TestPoolArenaReservesSlotsAsTheyAreUsed(t *testing.T) {
	if !shm.PagesOnDemand() {
		t.Skip("this kernel cannot reserve pages on demand (before Linux 5.14): arenas are reserved whole")
	}
	const size = 1 << 20 // the first arena of the class holds four
	p := pool.New(1 << 30)
	defer p.Close()
	first, err := p.Alloc(size, time.Time{})
	require.NoError(t, err)
	name := first.Arena().Name()
	require.Less(t, arenaResident(t, name), int64(2*size), "one slot of four reserved")
	held := []pool.Slot{first}
	for range 3 {
		s, err := p.Alloc(size, time.Time{})
		require.NoError(t, err)
		require.Equal(t, name, s.Arena().Name(), "the same arena")
		held = append(held, s)
	}
	all := arenaResident(t, name)
	require.GreaterOrEqual(t, all, int64(4*size), "every slot handed out is reserved")
	for _, s := range held {
		for i := range s.Data() {
			s.Data()[i] = 1
		}
		require.NoError(t, s.Release())
	}
	for range 4 {
		s, err := p.Alloc(size, time.Time{})
		require.NoError(t, err)
		require.Equal(t, name, s.Arena().Name())
		defer s.Release()
	}
	require.Equal(t, all, arenaResident(t, name), "slots used before reserve nothing more")

	// Small slots reserve a step at a time, not the whole arena.
	small, err := p.Alloc(100, time.Time{})
	require.NoError(t, err)
	defer small.Release()
	require.Less(t, arenaResident(t, small.Arena().Name()), int64(2<<20), "an arena of 4 MiB of small slots")
}

// TestPoolAllocLeavingRoom: AllocLeaving takes new pages only while leave
// bytes stay free, and a slot used before whatever is free (Note [leaving
// room]); without room it fails at once, ErrNoRoom when no slot of the
// class is in use and ErrFull when one is.
func TestPoolAllocLeavingRoom(t *testing.T) {
	testenv.SkipShort(t, "waits for the pool's sweeper")
	testenv.SegmentsOnTmpfs(t, "size=16m")
	const size = 1 << 20
	p := pool.New(1 << 30)
	defer p.Close()
	free := freeBytes(t)
	_, err := p.AllocLeaving(size, free, time.Time{}) // no deadline: it must not wait
	require.ErrorIs(t, err, pool.ErrNoRoom)
	require.ErrorIs(t, err, shm.ErrOutOfSharedMemory)
	require.Contains(t, err.Error(), shm.Dir())
	require.Equal(t, free, freeBytes(t), "nothing reserved")

	s, err := p.AllocLeaving(size, 4*size, time.Time{})
	require.NoError(t, err, "room for the slot and 4 MiB more")
	require.NoError(t, s.Release())
	free = freeBytes(t)
	s, err = p.AllocLeaving(size, free, time.Time{})
	require.NoError(t, err, "a slot used before takes no new pages")
	_, err = p.AllocLeaving(size, free, time.Now().Add(50*time.Millisecond))
	require.ErrorIs(t, err, pool.ErrFull, "a slot of the class is in use: it comes back")
	require.NoError(t, s.Release())
}

// TestPoolSlotPagesOnAFullFileSystem: on a file system too full for the
// pages of the next slot of an arena, Alloc fails as for a new arena
// (ErrFull while slots of the class are in use, an out-of-memory error that
// names the directory) and never faults; the slots handed out stay
// writable, and one given back is taken again.
func TestPoolSlotPagesOnAFullFileSystem(t *testing.T) {
	testenv.SkipShort(t, "waits for the pool's sweeper")
	dir := testenv.SegmentsOnTmpfs(t, "size=8m")
	const size = 1 << 20
	p := pool.New(1 << 30)
	defer p.Close()
	var held []pool.Slot
	for {
		s, err := p.Alloc(size, time.Now())
		if err != nil {
			require.ErrorIs(t, err, shm.ErrOutOfSharedMemory)
			require.ErrorIs(t, err, pool.ErrFull)
			require.Contains(t, err.Error(), dir)
			break
		}
		held = append(held, s)
		require.Less(t, len(held), 8, "an 8 MiB file system holds fewer than eight 1 MiB slots and their arenas")
	}
	require.GreaterOrEqual(t, len(held), 4)
	for _, s := range held {
		for i := range s.Data() {
			s.Data()[i] = 2
		}
	}
	require.NoError(t, held[0].Release())
	again, err := p.Alloc(size, time.Now())
	require.NoError(t, err, "the slot given back")
	require.NoError(t, again.Release())
	for _, s := range held[1:] {
		require.NoError(t, s.Release())
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.NotEmpty(t, entries, "the arenas stay while the pool holds them")
}
