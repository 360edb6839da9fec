package ledger

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/shm"
)

// forgedEntry writes entry n of d as another process of the user may.
func forgedEntry(d []byte, n int, state uint32, name, final string, nameLen, finalLen byte, index, gen uint32, ino uint64) {
	e := entry(d, n)
	binary.LittleEndian.PutUint32(e[eIndex:], index)
	binary.LittleEndian.PutUint32(e[eGen:], gen)
	binary.LittleEndian.PutUint64(e[eIno:], ino)
	e[eNameLen], e[eFinLen] = nameLen, finalLen
	copy(e[eName:eName+nameCap], name)
	copy(e[eFinal:eFinal+nameCap], final)
	binary.LittleEndian.PutUint32(e[eState:], state)
}

// A ledger forged by another process (a header that claims more entries
// than the region has, states past the last, name lengths past the
// field, entries naming segments and arenas that do not exist, slots of
// stale generations, Creating entries whose names are not temporary ones,
// or whose final name escapes the directory) is swept without a crash and
// gives up no count: each entry names nothing this sweep may act on.
func TestAForgedLedgerGivesUpNothing(t *testing.T) {
	const n = 16
	d := make([]byte, entriesAt+n*entrySize)
	binary.LittleEndian.PutUint32(d[offCapacity:], ^uint32(0)) // past the region
	long := strings.Repeat("z", nameCap)
	forgedEntry(d, 0, 99, "zctipc_x", "", 8, 0, 0, 0, 0)                                                     // no such state
	forgedEntry(d, 1, Segment, long, "", 255, 0, 0, 0, 0)                                                    // a name length past the field
	forgedEntry(d, 2, Segment, "zctipc_"+strings.Repeat("0", 32), "", 39, 0, 0, 0, 0)                        // no such segment
	forgedEntry(d, 3, Slot, "zctipc_"+strings.Repeat("1", 32), "", 39, 0, 5, 7, 0)                           // no such arena
	forgedEntry(d, 4, Slot, "", "", 0, 0, 1<<31, 1<<31, 0)                                                   // no name at all
	forgedEntry(d, 5, Creating, "zctipc_not_tmp", "zctipc_x", 14, 8, 0, 0, 0)                                // not a temporary name
	forgedEntry(d, 6, Creating, shm.TmpPrefix+strings.Repeat("a", 32), "../../etc/passwd", 39, 16, 0, 0, 42) // final escapes
	forgedEntry(d, 7, Segment, "../"+long, "", 255, 0, 0, 0, 0)                                              // a path
	forgedEntry(d, n-1, Slot, "zctipc_last", "", 11, 0, 0, 0, 0)                                             // the region's last entry
	entries := Entries(d)
	require.Len(t, entries, 8)
	for _, e := range entries {
		require.LessOrEqual(t, len(e.Name), nameCap)
		require.LessOrEqual(t, len(e.Final), nameCap)
	}
	res, _ := Sweep(d) // errors name what was forged; none stops the sweep
	require.Equal(t, Result{}, res)
	require.Empty(t, Entries(d), "each entry is taken once, and cleared")
	res, err := Sweep(d)
	require.NoError(t, err)
	require.Equal(t, Result{}, res)
	require.Nil(t, Entries(d[:entriesAt-1]), "a region shorter than its header")
}
