package futex_test

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/futex"
)

// TestADisarmAfterAForgedTakeBackDoesNotWrap: a party armed (one sleeper
// on the word, one in its count), then a forged count of another party's,
// taken back, takes that sleeper from the word. The party's disarm, and a
// release of its arms, must leave the word at zero, not wrap it round to
// 2^32-1 (every signal would make a system call for nobody after that).
func TestADisarmAfterAForgedTakeBackDoesNotWrap(t *testing.T) {
	t.Parallel()
	var word, waiters, mine uint32
	party := futex.Seq{Word: &word, Waiters: &waiters, Mine: &mine}
	party.Arm()
	forged := uint32(1 << 31)
	futex.TakeBack(&waiters, &forged)
	require.Zero(t, atomic.LoadUint32(&waiters))
	party.Disarm()
	require.Zero(t, atomic.LoadUint32(&waiters), "wrapped round")
	require.Zero(t, atomic.LoadUint32(&mine))

	var a futex.Armed
	a.Arm(0, party)
	a.Arm(0, party)
	forged = 1 << 31
	futex.TakeBack(&waiters, &forged)
	a.Release(0, party)
	require.Zero(t, atomic.LoadUint32(&waiters), "wrapped round")
}

// TestAnArmOverAForgedFullCountStaysCounted: a count forged to 2^32 - 1
// (by another process writing the segment file) must not wrap round to 0
// when a sleeper counts itself: a signal wakes only when the count is not
// 0, and the sleeper would sleep to its timeout. Held at 2^32 - 1, the
// forgery costs only wake-ups for nobody; a disarm after it never wraps.
func TestAnArmOverAForgedFullCountStaysCounted(t *testing.T) {
	t.Parallel()
	var word uint32
	waiters, mine := uint32(1<<32-1), uint32(1<<32-1)
	for _, s := range []futex.Seq{{Word: &word, Waiters: &waiters}, {Word: &word, Waiters: &waiters, Mine: &mine}} {
		atomic.StoreUint32(&waiters, 1<<32-1)
		atomic.StoreUint32(&mine, 1<<32-1)
		s.Arm()
		require.NotZero(t, atomic.LoadUint32(&waiters), "the sleeper is not counted: a signal skips it")
		var a futex.Armed
		a.Arm(0, s)
		require.NotZero(t, atomic.LoadUint32(&waiters))
		require.True(t, a.Disarm(0, s))
		s.Disarm()
		require.LessOrEqual(t, atomic.LoadUint32(&waiters), uint32(1<<32-1))
		require.Greater(t, atomic.LoadUint32(&waiters), uint32(1<<31), "wrapped round")
	}
}
