package futex_test

import (
	"math/rand"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/futex"
)

// TestArmedModel: a model of a handle's arms. Random arms, disarms and a
// close, in any order, keep the shared waiter count equal to the arms not
// taken back, refuse a disarm with nothing armed, and leave nothing counted
// after Release.
func TestArmedModel(t *testing.T) {
	t.Parallel()
	for seed := int64(0); seed < 200; seed++ {
		rng := rand.New(rand.NewSource(seed))
		var words, waiters [4]uint32
		var armed futex.Armed
		model := [4]int{}
		for range rng.Intn(60) {
			i := rng.Intn(4)
			s := futex.Seq{Word: &words[i], Waiters: &waiters[i]}
			if rng.Intn(2) == 0 {
				require.Equal(t, words[i], armed.Arm(i, s))
				model[i]++
			} else {
				require.Equal(t, model[i] > 0, armed.Disarm(i, s), "seed %d", seed)
				if model[i] > 0 {
					model[i]--
				}
			}
			for j := range 4 {
				require.Equal(t, uint32(model[j]), atomic.LoadUint32(&waiters[j]), "seed %d word %d", seed, j)
			}
		}
		for i := range 4 {
			armed.Release(i, futex.Seq{Word: &words[i], Waiters: &waiters[i]})
			require.Zero(t, atomic.LoadUint32(&waiters[i]), "seed %d", seed)
			require.False(t, armed.Disarm(i, futex.Seq{Word: &words[i], Waiters: &waiters[i]}))
		}
	}
}
