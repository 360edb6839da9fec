package plane_test

import (
	"encoding/binary"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/plane"
	"golang.org/x/sys/unix"
)

// ledgerMemory maps a ledger's whole data region, anonymous and private to
// the test: a plane.Ledger keeps its data for as long as the process lives.
func ledgerMemory(t testing.TB) []byte {
	t.Helper()
	d, err := unix.Mmap(-1, 0, plane.LedgerEntriesAt+plane.LedgerMaxEntries*plane.LedgerEntrySize,
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE|unix.MAP_NORESERVE)
	require.NoError(t, err)
	return d
}

func entryState(d []byte, n int) uint32 {
	at := plane.LedgerEntriesAt + n*plane.LedgerEntrySize
	return binary.LittleEndian.Uint32(d[at+plane.LedgerEState:])
}

// ledgerModel is what a ledger's free list must say: the entries under
// capacity that are not held are free, and no entry is handed out twice.
type ledgerModel struct {
	l        *plane.Ledger
	d        []byte
	capacity int
	held     map[int]uint32 // entry -> the index recorded in it
	order    []int          // held, in the order taken
}

func (m *ledgerModel) check(t testing.TB) {
	t.Helper()
	require.Equal(t, m.capacity-len(m.held), m.l.Free(), "free entries")
	for n := range m.capacity {
		if _, ok := m.held[n]; ok {
			require.Equal(t, uint32(plane.LedgerSlot), entryState(m.d, n), "held entry %d", n)
		} else {
			require.Equal(t, uint32(plane.LedgerFree), entryState(m.d, n), "free entry %d", n)
		}
	}
}

// step runs one operation chosen by op and arg on the ledger and on the
// model, and checks what the ledger answered.
func (m *ledgerModel) step(t testing.TB, op, arg byte, maxCap int) {
	t.Helper()
	switch op % 6 {
	case 0, 1: // record
		idx := uint32(op)<<8 | uint32(arg)
		n := m.l.Record(plane.LedgerSlot, "zctipc_arena", "", idx, 7)
		if len(m.held) == m.capacity {
			require.Equal(t, plane.LedgerFull, n, "a full ledger records nothing")
			return
		}
		require.GreaterOrEqual(t, n, 0)
		require.Less(t, n, m.capacity, "an entry past the reserved ones")
		_, twice := m.held[n]
		require.False(t, twice, "entry %d handed out twice", n)
		m.held[n] = idx
		m.order = append(m.order, n)
	case 2, 3: // drop a held entry
		if len(m.order) == 0 {
			return
		}
		i := int(arg) % len(m.order)
		n := m.order[i]
		m.order = append(m.order[:i], m.order[i+1:]...)
		delete(m.held, n)
		require.True(t, m.l.Drop(n))
	case 4: // drop an entry not held: again, never recorded, or out of range
		var n int
		switch arg % 4 {
		case 0:
			n = -1 - int(arg)
		case 1:
			n = plane.LedgerMaxEntries + int(arg)
		default:
			n = int(arg) % (m.capacity + 8)
		}
		if _, ok := m.held[n]; ok {
			return
		}
		require.False(t, m.l.Drop(n), "dropping entry %d, which no one holds", n)
	default: // grow
		c := min(m.capacity+int(arg)%64, maxCap)
		m.l.Grow(c)
		m.capacity = max(m.capacity, c)
	}
	require.Equal(t, m.capacity-len(m.held), m.l.Free(), "free entries after op %d", op%6)
}

// A ledger's free list under any sequence of records, drops (of held
// entries, and of entries no one holds: twice, never taken, out of range)
// and growths is the model's: no entry is handed out twice, a full ledger
// says so, and what was dropped is taken again.
func TestLedgerFreeListModel(t *testing.T) {
	d := ledgerMemory(t)
	m := &ledgerModel{l: plane.NewLedger(d, 4), d: d, capacity: 4, held: map[int]uint32{}}
	require.NotNil(t, m.l)
	seq := []byte{0, 0, 0, 0, 0, 2, 0, 4, 2, 4, 3, 4, 9, 0, 0, 0, 0, 0, 5, 20, 0, 1, 4, 5, 4, 6, 4, 7}
	for i := 0; i+1 < len(seq); i += 2 {
		m.step(t, seq[i], seq[i+1], 256)
	}
	m.check(t)
}

// Dropping one entry twice, or one that was never recorded, changes
// nothing: the entry is not handed out to two recorders at once, and the
// free list never holds more entries than the ledger has (it has room for
// LedgerMaxEntries).
func TestLedgerDropOfAnEntryNotHeldChangesNothing(t *testing.T) {
	d := ledgerMemory(t)
	l := plane.NewLedger(d, 2)
	a := l.Record(plane.LedgerSlot, "zctipc_a", "", 1, 1)
	require.True(t, l.Drop(a))
	require.False(t, l.Drop(a), "a second drop")
	require.False(t, l.Drop(1), "entry 1 was never recorded")
	require.Equal(t, 2, l.Free())
	x := l.Record(plane.LedgerSlot, "zctipc_x", "", 2, 2)
	y := l.Record(plane.LedgerSlot, "zctipc_y", "", 3, 3)
	require.NotEqual(t, x, y, "two holders share one entry")
	require.Equal(t, plane.LedgerFull, l.Record(plane.LedgerSlot, "zctipc_z", "", 4, 4))
}

// Threads that record until the ledger is full, grow it and drop at once
// never share an entry, and end with every entry free.
func TestLedgerGrowthRacingRecords(t *testing.T) {
	d := ledgerMemory(t)
	l := plane.NewLedger(d, 1)
	h := newHolders()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []int
			for i := range 3000 {
				if w == 0 && i%50 == 0 {
					l.Grow(1 + i/10) // growth under the others' records
				}
				if i%3 == 2 && len(mine) > 0 {
					h.drop(t, l, mine[0])
					mine = mine[1:]
					continue
				}
				if n := h.record(t, l, "zctipc_g", w, i); n != plane.LedgerFull {
					mine = append(mine, n)
				}
			}
			for _, n := range mine {
				h.drop(t, l, n)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 1+2950/10, l.Free(), "every entry the last growth reserved is free")
}

// holders says which ledger entries a test's goroutines hold, so that an
// entry handed to two holders at once fails the test.
type holders struct {
	mu   sync.Mutex
	held map[int]bool
}

func newHolders() *holders { return &holders{held: map[int]bool{}} }

// record records an entry in l for worker w's i-th count and returns it,
// or LedgerFull.
func (h *holders) record(t *testing.T, l *plane.Ledger, name string, w, i int) int {
	n := l.Record(plane.LedgerSlot, name, "", uint32(w), uint32(i))
	if n == plane.LedgerFull {
		return n
	}
	require.GreaterOrEqual(t, n, 0)
	h.mu.Lock()
	twice := h.held[n]
	h.held[n] = true
	h.mu.Unlock()
	require.False(t, twice, "entry %d held by two", n)
	return n
}

// drop drops entry n, which must have been held.
func (h *holders) drop(t *testing.T, l *plane.Ledger, n int) {
	h.mu.Lock()
	delete(h.held, n)
	h.mu.Unlock()
	require.True(t, l.Drop(n))
}

// A growth past LedgerMaxEntries stops there, and a full ledger of every
// entry, dropped twice over, still hands each entry to one recorder.
func TestLedgerAtItsMost(t *testing.T) {
	d := ledgerMemory(t)
	l := plane.NewLedger(d, plane.LedgerMaxEntries+100)
	require.Equal(t, plane.LedgerMaxEntries, l.Free())
	l.Grow(1 << 30)
	require.Equal(t, plane.LedgerMaxEntries, l.Free())
	for n := range plane.LedgerMaxEntries {
		require.False(t, l.Drop(n), "entry %d is free", n) // would overflow the free list
	}
	require.Equal(t, plane.LedgerMaxEntries, l.Free())
	seen := make([]bool, plane.LedgerMaxEntries)
	for range plane.LedgerMaxEntries {
		n := l.Record(plane.LedgerSlot, "zctipc_m", "", 0, 0)
		require.GreaterOrEqual(t, n, 0)
		require.False(t, seen[n], "entry %d twice", n)
		seen[n] = true
	}
	require.Equal(t, plane.LedgerFull, l.Record(plane.LedgerSlot, "zctipc_m", "", 0, 0))
}

// FuzzLedgerFreeList runs the model over sequences of operations.
func FuzzLedgerFreeList(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 2, 0, 4, 2, 4, 2, 5, 30, 0, 0})
	f.Add([]byte{5, 63, 0, 1, 0, 2, 0, 3, 3, 1, 3, 1, 4, 1, 4, 3, 4, 0})
	d := ledgerMemory(f)
	// One ledger for the whole run (a plane.Ledger is never freed): each
	// input starts from where the last left it, every entry free.
	m := &ledgerModel{l: plane.NewLedger(d, 1), d: d, capacity: 1, held: map[int]uint32{}}
	f.Fuzz(func(t *testing.T, ops []byte) {
		defer func() {
			for _, n := range m.order {
				m.l.Drop(n)
			}
			m.held, m.order = map[int]uint32{}, nil
		}()
		for i := 0; i+1 < len(ops) && i < 4000; i += 2 {
			m.step(t, ops[i], ops[i+1], 1024)
		}
		m.check(t)
	})
}
