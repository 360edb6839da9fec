package pool_test

import (
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

func TestPoolClasses(t *testing.T) {
	require.EqualValues(t, 64, pool.ClassSize(0))
	require.EqualValues(t, 80, pool.ClassSize(1))
	require.EqualValues(t, 128, pool.ClassSize(4))
	prev := uint64(0)
	for c := range pool.NumClasses {
		size := pool.ClassSize(c)
		require.Greater(t, size, prev, "class sizes grow")
		require.Zero(t, size%16)
		prev = size
	}
	for _, n := range []uint64{0, 1, 64, 65, 100, 4096, 4097, 1 << 20, 1<<30 + 1, pool.MaxSize} {
		c, ok := pool.ClassOf(n)
		require.True(t, ok, "ClassOf(%d)", n)
		require.GreaterOrEqual(t, pool.ClassSize(c), n)
		if c > 0 {
			require.Less(t, pool.ClassSize(c-1), n, "ClassOf(%d) is the smallest that fits", n)
		}
	}
	_, ok := pool.ClassOf(pool.MaxSize + 1)
	require.False(t, ok)
}

func TestPoolReusesFreedSlots(t *testing.T) {
	p := pool.New(64 << 20)
	defer p.Close()
	s, err := p.Alloc(1000, time.Time{})
	require.NoError(t, err)
	require.Len(t, s.Data(), 1024)
	s.Data()[0] = 42
	require.NoError(t, s.Release())
	require.Error(t, s.Release(), "a count is given up once")
	again, err := p.Alloc(1000, time.Time{})
	require.NoError(t, err)
	require.Equal(t, s.Index, again.Index, "the freed slot is reused")
	require.Equal(t, s.Generation+1, again.Generation)
	require.EqualValues(t, 42, again.Data()[0], "warm memory, not re-zeroed")
	_, err = s.AddRef()
	require.ErrorIs(t, err, pool.ErrStale, "a count on an older generation is refused")
	st := p.Stats()
	require.Equal(t, 1, st.Arenas)
	require.EqualValues(t, 1, st.SlotsInUse)
	require.NoError(t, again.Release())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

func TestPoolFullWaitsOrFails(t *testing.T) {
	const size = 1 << 20
	p := pool.New(3 << 20) // room for the arenas of a few 1 MiB slots
	defer p.Close()
	var held []pool.Slot
	for {
		s, err := p.Alloc(size, time.Now())
		if err != nil {
			require.ErrorIs(t, err, pool.ErrFull)
			require.ErrorIs(t, err, shm.ErrOutOfSharedMemory, "a full pool is out of shared memory to its callers")
			require.Contains(t, err.Error(), pool.LimitEnv)
			break
		}
		held = append(held, s)
	}
	require.NotEmpty(t, held)
	released := make(chan error)
	go func() {
		time.Sleep(50 * time.Millisecond)
		released <- held[0].Release()
	}()
	s, err := p.Alloc(size, time.Now().Add(5*time.Second))
	require.NoError(t, err, "a slot freed while waiting is taken")
	require.NoError(t, <-released)
	for _, h := range append(held[1:], s) {
		require.NoError(t, h.Release())
	}
	// Idle arenas of one class make room for another at the limit.
	big, err := p.Alloc(2<<20, time.Now())
	require.NoError(t, err)
	require.NoError(t, big.Release())
}

func TestPoolImpossibleIsAnErrorAtOnce(t *testing.T) {
	p := pool.New(8 << 20)
	defer p.Close()
	for _, n := range []uint64{16 << 20, 2 << 30} {
		start := time.Now()
		_, err := p.Alloc(n, time.Time{}) // no deadline: waiting could never end
		require.ErrorIs(t, err, pool.ErrNoRoom, "%d bytes in a pool of 8 MiB", n)
		require.NotErrorIs(t, err, pool.ErrFull)
		require.ErrorIs(t, err, shm.ErrOutOfSharedMemory)
		require.Contains(t, err.Error(), "8.0 MiB")
		require.Less(t, time.Since(start), time.Second)
	}
	// What fits the limit once the slots in use come back waits instead.
	s, err := p.Alloc(6<<20, time.Time{})
	require.NoError(t, err)
	start := time.Now()
	_, err = p.Alloc(6<<20, time.Now().Add(100*time.Millisecond))
	require.ErrorIs(t, err, pool.ErrFull)
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "it waited for the deadline")
	require.NoError(t, s.Release())
}

func TestPoolTooLarge(t *testing.T) {
	t.Parallel()
	p := pool.New(1 << 30)
	defer p.Close()
	_, err := p.Alloc(pool.MaxSize+1, time.Time{})
	require.ErrorIs(t, err, pool.ErrTooLarge)
}

func TestPoolFind(t *testing.T) {
	p := pool.New(64 << 20)
	defer p.Close()
	s, err := p.Alloc(256, time.Time{})
	require.NoError(t, err)
	addr := uintptr(unsafe.Pointer(&s.Data()[16]))
	found, off, ok := pool.Find(addr, 32)
	require.True(t, ok)
	require.EqualValues(t, 16, off)
	require.Equal(t, s.Index, found.Index)
	_, _, ok = pool.Find(addr, 1024)
	require.False(t, ok, "a range past the slot is not in it")
	require.NoError(t, found.Release())
	require.NoError(t, s.Release())
	_, _, ok = pool.Find(addr, 8)
	require.False(t, ok, "a free slot holds nothing to find")
}

func init() {
	testenv.Helpers["slot-adopt"] = func(args []string) error {
		index, _ := strconv.ParseUint(args[1], 10, 32)
		gen, _ := strconv.ParseUint(args[2], 10, 32)
		s, err := pool.Adopt(args[0], uint32(index), uint32(gen))
		if err != nil {
			return err
		}
		fmt.Println(s.Data()[3])
		s.Data()[4] = 99
		return s.Release()
	}
	testenv.Helpers["slot-owner"] = func(args []string) error {
		p := pool.New(64 << 20)
		s, err := p.Alloc(100, time.Time{})
		if err != nil {
			return err
		}
		s.Data()[0] = 7
		fmt.Println(s.Arena().Name(), s.Index, s.Generation)
		_, err = shm.ReleaseAll() // exits as a process does: its counts go, its slot stays pinned
		return err
	}
}

func TestPoolSlotCrossesProcesses(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	p := pool.New(64 << 20)
	defer p.Close()
	s, err := p.Alloc(64, time.Time{})
	require.NoError(t, err)
	s.Data()[3] = 11
	sent, err := s.AddRef() // the count the message carries
	require.NoError(t, err)
	h := testenv.StartHelper(t, "slot-adopt", sent.Arena().Name(), strconv.Itoa(int(sent.Index)), strconv.Itoa(int(sent.Generation)))
	require.Equal(t, "11", h.ReadLine(t))
	h.Wait(t)
	require.EqualValues(t, 99, s.Data()[4], "writes in the other process are seen here")
	require.EqualValues(t, 1, p.Stats().SlotsInUse, "the receiver gave up the count it adopted")
	require.NoError(t, s.Release())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

func TestPoolArenaOutlivesItsOwner(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	h := testenv.StartHelper(t, "slot-owner")
	var name string
	var index, gen uint32
	_, err := fmt.Sscan(h.ReadLine(t), &name, &index, &gen)
	require.NoError(t, err)
	h.Wait(t)
	require.True(t, testenv.Exists(name), "a slot in use pins its arena after the owner left")
	s, err := pool.Adopt(name, index, gen)
	require.NoError(t, err)
	require.EqualValues(t, 7, s.Data()[0])
	require.NoError(t, s.Release())
	require.False(t, testenv.Exists(name), "the last slot released removes the arena")
}

func TestParseSize(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want uint64
	}{
		{"0", 0}, {"4096", 4096}, {"512M", 512 << 20}, {"512m", 512 << 20}, {"512MiB", 512 << 20},
		{"512MB", 512 << 20}, {"2G", 2 << 30}, {"1.5GiB", 3 << 29}, {"64k", 64 << 10}, {"1T", 1 << 40},
		{" 8 KiB ", 8 << 10}, {"100b", 100},
	} {
		got, err := pool.ParseSize(c.in)
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got, c.in)
	}
	for _, bad := range []string{"", "M", "512X", "-1", "1e3", "1.2.3G", "99999999999999999999", "20000000T", "G512"} {
		_, err := pool.ParseSize(bad)
		require.ErrorIs(t, err, unix.EINVAL, bad)
	}
}

// TestParseSizeAttacks holds what a mistyped or hostile ZCTIPC_POOL_LIMIT
// may be: each is a size read exactly, or EINVAL; never a limit the user did
// not write (a fraction of a byte read as 0, which refused every buffer).
func TestParseSizeAttacks(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want uint64
	}{
		{"0", 0}, {"512m", 512 << 20}, {" 512M ", 512 << 20}, {"9999999T", 9999999 << 40},
		{"18446744073709551615", math.MaxUint64}, {".5K", 512}, {"5.G", 5 << 30}, {"\t1 g\n", 1 << 30},
		{"16777215T", 16777215 << 40},
	} {
		got, err := pool.ParseSize(c.in)
		require.NoError(t, err, "%q", c.in)
		require.Equal(t, c.want, got, "%q", c.in)
	}
	for _, bad := range []string{
		"", " ", "K", "-1", "+1", "1e9", "1E9", "1.5.5G", ".", ".G", "0x10", "1_000", "inf", "NaN", "Infinity",
		"18446744073709551616", "16777216T", "184467440737095516150.5", "0.5", "1.5", "1.5b", "0.5B",
		"1 2", "1GG", "1Gi", "G", "１G",
	} {
		_, err := pool.ParseSize(bad)
		require.ErrorIs(t, err, unix.EINVAL, "%q", bad)
	}
}

// TestPoolLimitErrorsNameSmallSizes: a pool whose limit is 0 (ZCTIPC_POOL_LIMIT=0)
// refuses a small buffer naming its bytes, where every size read "0.0 MiB".
func TestPoolLimitErrorsNameSmallSizes(t *testing.T) {
	t.Parallel()
	p := pool.New(0)
	defer p.Close()
	_, err := p.Alloc(1, time.Time{})
	require.ErrorIs(t, err, pool.ErrNoRoom)
	require.NotContains(t, err.Error(), "0.0 MiB")
	require.Contains(t, err.Error(), "a 64 B buffer")
	require.Contains(t, err.Error(), "limit of 0 B")
}

// TestAPoolGoesOnAfterReleaseAll: a process that let every segment go
// (shm.ReleaseAll, zct_release_all, zctipc.cleanup_all_segments) and goes on
// allocating gets buffers from new arenas; it was refused for ever ("being
// removed") by the arenas it let go, and so was every descriptor's ticket.
func TestAPoolGoesOnAfterReleaseAll(t *testing.T) {
	p := pool.New(64 << 20)
	defer p.Close()
	s, err := p.Alloc(100, time.Time{})
	require.NoError(t, err)
	require.NoError(t, s.Release())
	_, err = shm.ReleaseAll()
	require.NoError(t, err)
	s2, err := p.Alloc(100, time.Time{})
	require.NoError(t, err, "Alloc after ReleaseAll")
	require.NotEqual(t, s.Arena().Name(), s2.Arena().Name())
	require.NoError(t, s2.Release())
	tk, err := pool.NewTicket()
	require.NoError(t, err, "NewTicket after ReleaseAll")
	require.NoError(t, tk.Cancel())
}
