package ledger

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// enabled makes this process's ledger for one test, and closes it after.
func enabled(t *testing.T) *Ledger {
	t.Helper()
	l, err := Enable()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	return l
}

// What the ledger records is what a reader of its memory finds, field by
// field, past the entries it was made with (it grows), and a dropped entry
// is gone from it and taken again before the ledger grows once more.
func TestEntriesAreWhatWasRecorded(t *testing.T) {
	l := enabled(t)
	const n = 3*firstEntries + 5
	want := map[int]Entry{}
	for i := range n {
		var e int
		if i%2 == 0 {
			e = l.HoldSlot("zctipc_arena", uint32(i), uint32(1000+i))
			want[e] = Entry{Number: e, State: Slot, Name: "zctipc_arena", Index: uint32(i), Gen: uint32(1000 + i)}
		} else {
			e = l.HoldSegment("zctipc_seg")
			want[e] = Entry{Number: e, State: Segment, Name: "zctipc_seg"}
		}
		require.NotEqual(t, shm.NoEntry, e)
	}
	require.Equal(t, 4*firstEntries, l.capacity)
	got := map[int]Entry{}
	for _, e := range Entries(l.data) {
		got[e.Number] = e
	}
	require.Equal(t, want, got)

	for e := range want {
		if e%3 == 0 {
			l.Drop(e)
			delete(want, e)
		}
	}
	require.Len(t, Entries(l.data), len(want))
	for range 3*firstEntries + 5 - len(want) {
		e := l.HoldSegment("zctipc_again")
		_, held := want[e]
		require.False(t, held, "entry %d handed out twice", e)
		want[e] = Entry{}
	}
	require.Equal(t, 4*firstEntries, l.capacity, "the dropped entries are taken before the ledger grows")
	for e := range want {
		l.Drop(e)
	}
	require.Empty(t, Entries(l.data))
}

// A Creating entry says where its file was made, then becomes its final
// name's Segment entry.
func TestACreatingEntryBecomesItsSegment(t *testing.T) {
	l := enabled(t)
	tr := tracker{l}
	e := tr.Creating("zctipc_tmp", "zctipc_final")
	tr.Opened(e, 7, 9)
	require.Equal(t, []Entry{{Number: e, State: Creating, Name: "zctipc_tmp", Final: "zctipc_final", Dev: 7, Ino: 9}},
		Entries(l.data))
	tr.Created(e)
	got := Entries(l.data)
	require.Len(t, got, 1)
	require.Equal(t, uint32(Segment), got[0].State)
	require.Equal(t, "zctipc_final", got[0].Name)
	tr.Dropped(e)
	require.Empty(t, Entries(l.data))
}

// Threads that record and drop at once never share an entry, and leave the
// ledger with every entry free.
func TestConcurrentRecordsNeverShareAnEntry(t *testing.T) {
	l := enabled(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	held := map[int]bool{}
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := []int{}
			for i := range 2000 {
				if i%3 == 2 && len(mine) > 0 {
					e := mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					mu.Lock()
					delete(held, e)
					mu.Unlock()
					l.Drop(e)
					continue
				}
				e := l.HoldSlot("zctipc_a", uint32(w), uint32(i))
				require.NotEqual(t, shm.NoEntry, e)
				mu.Lock()
				require.False(t, held[e], "entry %d recorded twice", e)
				held[e] = true
				mu.Unlock()
				mine = append(mine, e)
			}
			for _, e := range mine {
				mu.Lock()
				delete(held, e)
				mu.Unlock()
				l.Drop(e)
			}
		}()
	}
	wg.Wait()
	require.Empty(t, Entries(l.data))
	require.Equal(t, l.capacity, l.c.Free())
}

// A ledger whose file another process shrank records nothing, and neither
// recording nor dropping faults the process.
func TestAShrunkLedgerRecordsNothing(t *testing.T) {
	l := enabled(t)
	kept := l.HoldSegment("zctipc_before")
	require.NotEqual(t, shm.NoEntry, kept)
	full, err := shm.FullName(l.Name())
	require.NoError(t, err)
	require.NoError(t, unix.Truncate(filepath.Join(shm.Dir(), full), 0)) // the hostile process
	require.Equal(t, shm.NoEntry, l.HoldSlot("zctipc_after", 1, 2))
	tr := tracker{l}
	tr.Opened(kept, 1, 2)
	tr.Created(kept)
	l.Drop(kept)
}

// A count recorded under a ledger that was closed, and dropped after
// another was made, drops its own entry: no entry of the new ledger is
// given out while it is held, and the new ledger's records stay.
func TestADropAcrossLedgersClearsNoOtherRecord(t *testing.T) {
	first, err := Enable()
	require.NoError(t, err)
	old := first.HoldSlot("zctipc_old", 1, 1)
	require.NotEqual(t, shm.NoEntry, old)
	require.NoError(t, first.Close())
	second := enabled(t)
	var mine []int
	for i := range 3 * firstEntries {
		e := second.HoldSlot("zctipc_new", uint32(i), 2)
		require.NotEqual(t, shm.NoEntry, e)
		require.NotEqual(t, old, e, "an entry still held under the old ledger")
		mine = append(mine, e)
	}
	first.Drop(old)
	require.Len(t, Entries(second.data), len(mine))
	for _, e := range mine {
		second.Drop(e)
	}
	require.Empty(t, Entries(second.data))
	require.Equal(t, second.capacity, second.c.Free())
}
