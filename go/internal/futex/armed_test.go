package futex_test

import (
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/zctipc/zctipc/go/internal/fault"
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

// TestDeadPartysSleepersModel: a model of one word's sleepers, some of a
// party that counts its own (Seq.Mine) and some of others. Random arms and
// disarms of both, the party's death (its arms then never come back) with
// a TakeBack, and, for a party that was only evicted alive, TakeBack while
// it still holds arms it later takes back itself: the waiter count always
// holds at least the live sleepers' arms (none of them is skipped by a
// signal), never wraps below zero, and once every live arm is taken back
// holds only the dead party's arms made after its TakeBack (none).
func TestDeadPartysSleepersModel(t *testing.T) {
	t.Parallel()
	for seed := int64(0); seed < 300; seed++ {
		rng := rand.New(rand.NewSource(seed))
		var word, waiters, mine uint32
		party := futex.Seq{Word: &word, Waiters: &waiters, Mine: &mine}
		other := futex.Seq{Word: &word, Waiters: &waiters}
		partyArms, otherArms := 0, 0 // armed and not yet taken back by their own
		dead := false
		for range rng.Intn(80) {
			switch k := rng.Intn(6); {
			case k == 0 && !dead:
				party.Arm()
				partyArms++
			case k == 1 && !dead && partyArms > 0:
				party.Disarm()
				partyArms--
			case k == 2:
				other.Arm()
				otherArms++
			case k == 3 && otherArms > 0:
				other.Disarm()
				otherArms--
			case k == 4 && !dead && rng.Intn(4) == 0:
				dead = true // killed: its arms stay, until TakeBack
			case k == 5:
				futex.TakeBack(&waiters, &mine)
				if dead {
					partyArms = 0
				}
			}
			w := atomic.LoadUint32(&waiters)
			require.GreaterOrEqual(t, w, uint32(otherArms), "seed %d: a live sleeper would be skipped", seed)
			require.Less(t, w, uint32(1<<20), "seed %d: wrapped below zero", seed)
		}
		for ; otherArms > 0; otherArms-- {
			other.Disarm()
		}
		if !dead {
			for ; partyArms > 0; partyArms-- {
				party.Disarm()
			}
		}
		futex.TakeBack(&waiters, &mine) // the party's slot, taken by the next
		require.Zero(t, atomic.LoadUint32(&waiters), "seed %d", seed)
	}
}

// TestTakeBackOfAForgedCount: a count of the party's own larger than the
// word's sleepers takes them all and no more.
func TestTakeBackOfAForgedCount(t *testing.T) {
	t.Parallel()
	waiters, mine := uint32(2), uint32(1<<31)
	futex.TakeBack(&waiters, &mine)
	require.Zero(t, waiters)
	require.Zero(t, mine)
}

// TestACountOnShrunkMemoryIsAFault: the counts are the data plane's C
// steps; when another process shrank the file they lie in, an arm, a
// disarm and a take-back each end in the caller's fault.Catch as an
// ErrFault, as an access in Go would, and never kill the process.
func TestACountOnShrunkMemoryIsAFault(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "words"))
	require.NoError(t, err)
	defer f.Close()
	page := os.Getpagesize()
	require.NoError(t, f.Truncate(int64(page)))
	mem, err := unix.Mmap(int(f.Fd()), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	word := (*uint32)(unsafe.Pointer(&mem[0]))
	waiters := (*uint32)(unsafe.Pointer(&mem[4]))
	mine := (*uint32)(unsafe.Pointer(&mem[8]))
	s := futex.Seq{Word: word, Waiters: waiters, Mine: mine}
	s.Arm()
	require.Equal(t, uint32(1), *waiters)
	require.NoError(t, f.Truncate(0)) // the hostile process

	for what, call := range map[string]func(){
		"arm":       func() { s.Arm() },
		"disarm":    s.Disarm,
		"take back": func() { futex.TakeBack(waiters, mine) },
	} {
		err := fault.Catch(func() error { call(); return nil })
		require.ErrorIs(t, err, fault.ErrFault, what)
	}
}

// TestArmedModelConcurrent: goroutines of one handle arm and disarm its
// words at random, each keeping its own arms in balance (a disarm of an
// arm it holds is never refused, whoever's arm the handle takes back), in
// rounds; after each round the counts on the words, and a party's own
// count (Seq.Mine), equal the model's sum of the arms not taken back, and
// Release at the end leaves none.
func TestArmedModelConcurrent(t *testing.T) {
	t.Parallel()
	const goroutines, rounds, ops = 6, 20, 300
	var words, waiters, mine [2]uint32
	seqs := [2]futex.Seq{{Word: &words[0], Waiters: &waiters[0]}, {Word: &words[1], Waiters: &waiters[1], Mine: &mine[1]}}
	var armed futex.Armed
	local := make([][2]int, goroutines)
	for round := range rounds {
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewSource(int64(round*goroutines + g)))
				for range ops {
					i := rng.Intn(2)
					if rng.Intn(2) == 0 {
						armed.Arm(i, seqs[i])
						local[g][i]++
					} else if local[g][i] > 0 {
						if !armed.Disarm(i, seqs[i]) {
							t.Errorf("round %d: a disarm of an arm held was refused", round)
							return
						}
						local[g][i]--
					}
				}
			}()
		}
		wg.Wait()
		for i := range 2 {
			model := 0
			for g := range goroutines {
				model += local[g][i]
			}
			require.Equal(t, uint32(model), atomic.LoadUint32(&waiters[i]), "round %d word %d", round, i)
		}
		require.Equal(t, atomic.LoadUint32(&waiters[1]), atomic.LoadUint32(&mine[1]), "round %d", round)
	}
	for i := range 2 {
		armed.Release(i, seqs[i])
		require.Zero(t, atomic.LoadUint32(&waiters[i]))
	}
	require.Zero(t, atomic.LoadUint32(&mine[1]))
}
