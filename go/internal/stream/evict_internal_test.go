package stream

import (
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/zctipc/zctipc/go/internal/dtype"
)

// TestEvictingADeadReaderLosesNoNewSleeper: Note [evicting a dead reader].
// A reader died asleep in slot 0, which holds the writer back; while the
// writer evicts it, a new reader asks for slot 0 and goes to sleep. The new
// reader waits until the writer took the dead one's sleeper back and let
// the slot go, so that its own sleeper stays counted: before, it could take
// the slot in between, and the writer's take-back then removed its sleeper
// from the data word (a lost wake-up).
func TestEvictingADeadReaderLosesNoNewSleeper(t *testing.T) {
	s, err := Create("", Config{DType: dtype.Uint64, Shape: []int64{8}, Frames: 2, Readers: 1, Policy: Block})
	require.NoError(t, err)
	defer s.Close()
	child := exec.Command("true")
	require.NoError(t, child.Run())
	dead := int64(child.Process.Pid)

	slot, waiters := s.slot(0), u32(s.data, offDataWaiters)
	atomic.StoreUint64(u64(slot, rPID), uint64(dead))
	atomic.StoreUint64(u64(slot, rStart), 1)
	atomic.StoreUint64(u64(slot, rPosition), 0)
	atomic.StoreUint64(u64(slot, rWord), slotWord(dead, 1, slotActive))
	atomic.StoreUint32(u32(slot, rArmed), 1) // it died asleep
	atomic.AddUint32(waiters, 1)

	w, err := s.Writer()
	require.NoError(t, err)
	defer w.Close()
	for range 2 { // the ring is full: the dead reader holds the writer back
		_, err = w.Look(time.Time{})
		require.NoError(t, err)
		require.NoError(t, w.Increment())
	}

	var claimed atomic.Bool
	joined := make(chan *Reader, 1)
	failed := make(chan error, 1)
	held := 0
	evictingHook = func() {
		held++
		go func() {
			r, err := s.Reader(0)
			if err != nil {
				failed <- err
				return
			}
			claimed.Store(true)
			r.dataSeq().Arm() // and goes to sleep
			joined <- r
		}()
		time.Sleep(30 * time.Millisecond)
		require.False(t, claimed.Load(), "a reader took the slot while the writer held it")
	}
	defer func() { evictingHook = nil }()

	_, err = w.Look(time.Now().Add(10 * time.Second)) // evicts the dead reader: room
	require.NoError(t, err)
	require.Equal(t, 1, held)
	var r *Reader
	select {
	case r = <-joined:
	case err := <-failed:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("the new reader never took the slot")
	}
	defer r.Close()
	require.Equal(t, uint32(1), atomic.LoadUint32(waiters), "the new reader's sleeper is counted, the dead one's not")
	require.Equal(t, uint32(1), atomic.LoadUint32(u32(slot, rArmed)))
	r.dataSeq().Disarm()
	require.Zero(t, atomic.LoadUint32(waiters))
}
