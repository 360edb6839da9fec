package queue_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

// Offsets of an unbounded queue's ring words in its data region
// (docs/format.md, "Queues").
const (
	offTailWord  = 96
	offReserved  = 104
	offHeadWord  = 160
	offGivenBack = 168
)

func ringWord32(q *queue.Queue, off int) uint32 {
	return binary.LittleEndian.Uint32(q.Segment().Data()[off:])
}

// fillDir fills the file system of dir but for about leave bytes with a
// file of its own, and returns a function that removes it.
func fillDir(t *testing.T, dir string, leave int64) func() {
	t.Helper()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(dir, &st), "Statfs")
	free := int64(st.Bavail) * st.Bsize
	require.Greater(t, free, leave)
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	require.NoError(t, err)
	require.NoError(t, unix.Fallocate(int(f.Fd()), 0, 0, free-leave), "Fallocate")
	require.NoError(t, f.Close())
	removed := false
	remove := func() {
		if !removed {
			removed = true
			require.NoError(t, os.Remove(path))
		}
	}
	t.Cleanup(remove)
	return remove
}

// putNoFault puts rec, turning a fault (SIGBUS on a page the ring never
// reserved) into a test failure rather than a crash of the test binary.
func putNoFault(t *testing.T, q *queue.Queue, payload []byte) (err error) {
	t.Helper()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Put wrote a page it never reserved: %v", r)
		}
	}()
	// A deadline, not none: a consumer killed holding the put or get lock
	// is taken over by the put, which a put that does not wait may not
	// reach within its brief wait on a loaded machine (it said "queue is
	// full"). On an unbounded queue the put fails only for want of pages.
	return q.Put(bytesRecord(payload), time.Now().Add(10*time.Second))
}

// TestUnboundedQueueReservesPastTwoToThe31: a put that does not fit the
// rest of the warm window on an empty queue skips a lap, so a few puts take
// the tail past 2^31, a lap or more ahead of the reserved position. A
// record past the window must still reserve its pages first: on a full file
// system the put fails with ErrOutOfSharedMemory (it used to write pages it
// never reserved, and die of SIGBUS), and once there is room the queue
// takes it.
func TestUnboundedQueueReservesPastTwoToThe31(t *testing.T) {
	dir := testenv.SegmentsOnTmpfs(t, "size=8m")
	q, err := queue.CreateUnbounded("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	buf := make([]byte, 4<<20)
	payload := patterned(1, 1536<<10)
	for range 8 {
		if ringWord32(q, offTailWord) >= 1<<31 {
			break
		}
		require.NoError(t, q.Put(bytesRecord(payload), time.Now()))
		got, err := getInto(t, q, buf)
		require.NoError(t, err)
		require.Equal(t, payload, got)
	}
	require.GreaterOrEqual(t, ringWord32(q, offTailWord), uint32(1<<31), "the tail went past 2^31")

	removeFiller := fillDir(t, dir, 512<<10)
	big := patterned(2, 3<<20) // past the window: needs pages of its own
	err = putNoFault(t, q, big)
	require.ErrorIs(t, err, shm.ErrOutOfSharedMemory)
	require.Zero(t, qlen(t, q))

	removeFiller()
	require.NoError(t, putNoFault(t, q, big), "the queue is usable once there is room")
	got, err := getInto(t, q, buf)
	require.NoError(t, err)
	require.Equal(t, big, got)
}

// TestUnboundedQueueEmptyOrDrainedHoldsAFewPages: an unbounded queue's
// memory is that of its messages. Made, it holds a page or two; emptied
// after a burst in its warm window or past it, it gives the window back
// down to its largest recent message; a queue whose messages pass one at a
// time keeps the pages of that message (its warm window) from one to the
// next.
func TestUnboundedQueueEmptyOrDrainedHoldsAFewPages(t *testing.T) {
	const fewPages = 4 << 12
	q, err := queue.CreateUnbounded("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	require.LessOrEqual(t, resident(t, q), int64(fewPages), "a new queue")

	buf := make([]byte, 2<<20)
	seq := uint64(0)
	burst := func(n, size int) {
		for range n {
			require.NoError(t, q.Put(bytesRecord(patterned(seq, size)), time.Now()))
			seq++
		}
		for i := range n {
			got, err := getInto(t, q, buf)
			require.NoError(t, err)
			require.Equal(t, patterned(seq-uint64(n-i), size), got)
		}
	}
	burst(1000, 1<<10) // 1 MB, in the window
	require.LessOrEqual(t, resident(t, q), int64(fewPages), "drained after a burst in the window")
	burst(300, 16<<10) // 4.8 MB, past it
	require.LessOrEqual(t, resident(t, q), int64(fewPages+recordSize(16<<10)),
		"drained after a burst past the window: the pages of its largest message")
	burst(1, 1<<10)
	require.LessOrEqual(t, resident(t, q), int64(fewPages), "drained after one message")

	// One large message at a time: its pages stay, put after put.
	for range 20 {
		burst(1, 1<<20)
	}
	require.GreaterOrEqual(t, resident(t, q), int64(1<<20), "the window keeps the pages of the message that passes")
	require.LessOrEqual(t, resident(t, q), int64(1<<20+fewPages))
	burst(1, 100)
	require.LessOrEqual(t, resident(t, q), int64(fewPages), "and gives them back once smaller ones pass")
}
