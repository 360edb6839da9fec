package plane_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/plane"
)

// Attacks on a ledger moved to another data region (zp_ledger_move, as a
// process's one plane ledger is moved to each ledger file it makes): an
// entry recorded before the move and dropped after it, dropped twice, and
// records and drops of other threads while the moves go on.

// An entry recorded before a move is its recorder's after it: no one else
// is handed it, its drop after the move clears only its own number in the
// new region (which records nothing there), and a second drop changes
// nothing.
func TestLedgerDropAfterAMove(t *testing.T) {
	d1, d2 := ledgerMemory(t), ledgerMemory(t)
	l := plane.NewLedger(d1, 4)
	old := l.Record(plane.LedgerSlot, "zctipc_old", "", 1, 1)
	require.GreaterOrEqual(t, old, 0)
	l.Move(d2)
	mine := map[int]bool{}
	for range 3 {
		n := l.Record(plane.LedgerSlot, "zctipc_new", "", 2, 2)
		require.GreaterOrEqual(t, n, 0)
		require.NotEqual(t, old, n, "an entry held across the move handed out again")
		require.Equal(t, uint32(plane.LedgerSlot), entryState(d2, n), "a record after the move is in the new region")
		mine[n] = true
	}
	require.Equal(t, plane.LedgerFull, l.Record(plane.LedgerSlot, "zctipc_new", "", 2, 2))
	require.True(t, l.Drop(old))
	require.False(t, l.Drop(old), "a second drop after the move")
	for n := range mine {
		require.Equal(t, uint32(plane.LedgerSlot), entryState(d2, n), "the drop cleared another's record")
	}
	require.Equal(t, uint32(plane.LedgerSlot), entryState(d1, old), "the old region is no longer written")
	n := l.Record(plane.LedgerSlot, "zctipc_again", "", 3, 3)
	require.Equal(t, old, n, "the dropped entry is free again, once")
	require.Equal(t, plane.LedgerFull, l.Record(plane.LedgerSlot, "zctipc_new", "", 2, 2))
	for m := range mine {
		require.True(t, l.Drop(m))
	}
	require.True(t, l.Drop(n))
	require.Equal(t, 4, l.Free())
}

// Threads record and drop while another moves the ledger back and forth
// and grows it: no entry is ever held by two, every drop of a held entry
// succeeds once, and every entry ends free.
func TestLedgerRecordsDuringMoves(t *testing.T) {
	regions := [][]byte{ledgerMemory(t), ledgerMemory(t), ledgerMemory(t)}
	l := plane.NewLedger(regions[0], 8)
	h := newHolders()
	stop := make(chan struct{})
	var mover sync.WaitGroup
	mover.Add(1)
	go func() {
		defer mover.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			l.Move(regions[i%len(regions)])
			if i%100 == 0 {
				l.Grow(8 + i/100)
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []int
			for i := range 4000 {
				if i%2 == 1 && len(mine) > 0 {
					h.drop(t, l, mine[len(mine)-1])
					mine = mine[:len(mine)-1]
					continue
				}
				if n := h.record(t, l, "zctipc_m", w, i); n != plane.LedgerFull {
					mine = append(mine, n)
				}
			}
			for _, n := range mine {
				h.drop(t, l, n)
			}
		}()
	}
	wg.Wait()
	close(stop)
	mover.Wait()
	require.Equal(t, l.Capacity(), l.Free(), "every entry is free at the end")
}
