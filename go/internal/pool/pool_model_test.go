package pool_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

// poolCost is what one buffer of n bytes may cost a pool at most
// (pool.New's documented bound): its class's slot and a page of
// bookkeeping.
func poolCost(n uint64) uint64 {
	c, _ := pool.ClassOf(n)
	return pool.ClassSize(c) + pool.SlotOverhead
}

// TestPoolModel runs random sequences of allocations and frees, of sizes
// from 1 byte to limit/16, against a model of what is live: an allocation
// never fails while the live buffers and the request fit the limit less the
// documented overhead (a quarter of the limit for arenas of several slots,
// and poolCost per buffer), however the sizes came and went before (live
// bytes decide, not history); two live buffers never share bytes; a freed
// buffer's stale reference never takes a count; and when everything is
// freed, nothing is in use.
func TestPoolModel(t *testing.T) {
	testenv.SkipShort(t, "runs for seconds")
	for _, tc := range []struct {
		limit, maxLive uint64
		seed           uint64
	}{
		{64 << 20, 24 << 20, 1},
		{64 << 20, 24 << 20, 2},
		{64 << 20, 30 << 20, 3},
		{16 << 20, 6 << 20, 4},
		{128 << 20, 48 << 20, 5},
	} {
		t.Run(fmt.Sprint(tc.limit>>20, "MiB_seed", tc.seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(tc.seed, 0x9e3779b97f4a7c15))
			p := pool.New(tc.limit)
			defer func() { require.NoError(t, p.Close()) }()
			type live struct {
				s   pool.Slot
				n   uint64
				tag uint64
			}
			var held []live
			var liveBytes, liveCost uint64
			type ref struct {
				arena      string
				index, gen uint32
			}
			var stale []ref
			tags := uint64(0)
			failures := 0
			maxSize := tc.limit / 16
			for step := range 3000 {
				// Sizes spread over every class: uniform in their logarithm.
				n := uint64(1) << rng.UintN(uint(bitsOf(maxSize)))
				n = max(1, min(maxSize, n+rng.Uint64N(n)))
				free := len(held) > 0 && (liveBytes+n > tc.maxLive || rng.IntN(3) == 0)
				if free {
					i := rng.IntN(len(held))
					h := held[i]
					require.Equal(t, h.tag, binary.LittleEndian.Uint64(h.s.Data()), "step %d: a live buffer was handed out twice", step)
					require.NoError(t, h.s.Release())
					stale = append(stale, ref{h.s.Arena().Name(), h.s.Index, h.s.Generation})
					liveBytes -= h.n
					liveCost -= poolCost(h.n)
					held[i] = held[len(held)-1]
					held = held[:len(held)-1]
					continue
				}
				s, err := p.Alloc(n, time.Now())
				if tc.limit/4+liveCost+poolCost(n) <= tc.limit {
					require.NoError(t, err, "step %d: %d bytes with %d live in %d buffers, limit %d: %+v",
						step, n, liveBytes, len(held), tc.limit, p.Stats())
				}
				if err != nil {
					failures++
					continue
				}
				require.GreaterOrEqual(t, uint64(len(s.Data())), n)
				tags++
				binary.LittleEndian.PutUint64(s.Data(), tags)
				held = append(held, live{s, n, tags})
				liveBytes += n
				liveCost += poolCost(n)
			}
			for _, r := range stale {
				// A descriptor of a freed buffer: its arena may be gone, or
				// its slot free or handed out again at a later generation.
				s, err := pool.Adopt(r.arena, r.index, r.gen)
				if err == nil {
					_, err = s.AddRef()
				}
				if !errors.Is(err, unix.ENOENT) { // the arena was removed
					require.ErrorIs(t, err, pool.ErrStale, "a stale reference to slot %d of %s", r.index, r.arena)
				}
			}
			for _, h := range held {
				require.Equal(t, h.tag, binary.LittleEndian.Uint64(h.s.Data()))
				require.NoError(t, h.s.Release())
			}
			require.Zero(t, p.Stats().SlotsInUse)
			t.Logf("%d allocations refused (all past the bound)", failures)
		})
	}
}

func bitsOf(n uint64) int {
	b := 0
	for n > 0 {
		b++
		n >>= 1
	}
	return b
}
