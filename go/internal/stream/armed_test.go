package stream_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/stream"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestStreamWriterSleepOutsideGo: a writer that waits for room arms the
// space word and sleeps with the futex call alone; a reader that releases
// the frame it waits for wakes it (the writer says what it waits for
// until it disarms, even across a look that does not wait), and a close
// wakes it and takes its arm back.
func TestStreamWriterSleepOutsideGo(t *testing.T) {
	s, err := stream.Create("", stream.Config{DType: dtype.Uint64, Shape: []int64{8}, Frames: 2, Readers: 1, Policy: stream.Block})
	require.NoError(t, err)
	defer s.Close()
	r := mustReader(t, s, -1)
	defer r.Close()
	w := mustWriter(t, s)
	for range 2 {
		_, err = w.Look(time.Time{})
		require.NoError(t, err)
		require.NoError(t, w.Increment())
	}
	word, seen, err := w.ArmWait()
	require.NoError(t, err)
	_, err = w.Look(time.Now()) // look again: no room
	require.ErrorIs(t, err, stream.ErrFull)
	go func() {
		time.Sleep(20 * time.Millisecond)
		if _, err := r.Look(time.Time{}); err == nil {
			_, _ = r.Increment()
		}
	}()
	for atomic.LoadUint32(word) == seen {
		require.NoError(t, testenv.RawSleep(word, seen, 30*time.Second))
	}
	require.NoError(t, w.DisarmWait())
	require.ErrorIs(t, w.DisarmWait(), unix.EINVAL, "nothing armed")
	_, err = w.Look(time.Now())
	require.NoError(t, err, "the reader made room")
	require.NoError(t, w.Increment())

	word, seen, err = w.ArmWait()
	require.NoError(t, err)
	woke := make(chan error, 1)
	go func() { woke <- testenv.RawSleep(word, seen, 30*time.Second) }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, w.Close())
	select {
	case err := <-woke:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("close did not wake the sleeper")
	}
	require.ErrorIs(t, w.DisarmWait(), stream.ErrClosed)
}
