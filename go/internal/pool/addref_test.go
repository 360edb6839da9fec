package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAddRefRacingAReallocation releases a slot and hands it out again
// between AddRef's check of the generation and its compare-and-swap: the
// count must not land on the new generation's buffer.
func TestAddRefRacingAReallocation(t *testing.T) {
	p := New(64 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	old, err := p.Alloc(100, time.Now())
	require.NoError(t, err)
	var reused Slot
	addRefRaced = func() {
		addRefRaced = nil
		require.NoError(t, old.Release())
		reused, err = p.Alloc(100, time.Now())
		require.NoError(t, err)
	}
	defer func() { addRefRaced = nil }()
	_, err = old.AddRef()
	require.ErrorIs(t, err, ErrStale, "a count for a generation that is gone")
	require.Equal(t, old.Index, reused.Index, "the same slot, handed out again")
	require.NotEqual(t, old.Generation, reused.Generation)
	require.EqualValues(t, 1, reused.Holders(), "the new generation has its owner's count only")
	require.NoError(t, reused.Release())
	require.EqualValues(t, 0, reused.Holders())
}
