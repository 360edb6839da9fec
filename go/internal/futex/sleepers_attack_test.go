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
