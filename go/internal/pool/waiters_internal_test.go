package pool

import (
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAWaiterOverAForgedFullCountStaysCounted: an arena's count of the
// owners waiting for a free slot, forged to 2^32-1 by another process,
// does not wrap round to 0 when a waiter counts itself (a free, which
// wakes only when the count is not 0, would then leave it to its timeout).
func TestAWaiterOverAForgedFullCountStaysCounted(t *testing.T) {
	const size = 1 << 20
	p := New(3 << 20)
	defer p.Close()
	var held []Slot
	for {
		s, err := p.Alloc(size, time.Now())
		if err != nil {
			require.ErrorIs(t, err, ErrFull)
			break
		}
		held = append(held, s)
	}
	require.NotEmpty(t, held)
	defer func() {
		for _, s := range held {
			require.NoError(t, s.Release())
		}
	}()
	c, ok := ClassOf(size)
	require.True(t, ok)
	p.mu.Lock()
	arenas := append([]*Arena(nil), p.arenas[c]...)
	p.mu.Unlock()
	for _, a := range arenas {
		atomic.StoreUint32(a.u32(offWaiters), math.MaxUint32)
	}
	done := make(chan error, 1)
	go func() {
		_, err := p.Alloc(size, time.Now().Add(300*time.Millisecond))
		done <- err
	}()
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		for _, a := range arenas {
			require.NotZero(t, atomic.LoadUint32(a.u32(offWaiters)), "a waiter's count wrapped round to 0")
		}
	}
	require.ErrorIs(t, <-done, ErrFull)
}
