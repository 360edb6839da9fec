package stream

import (
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/proc"
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

// TestAStaleReaderEvictedAsleepLeavesNoSleeperOnceKilled: a reader that
// held the writer back for the reader timeout while counted asleep (its
// process stopped in its sleep) is evicted, and its sleeper taken back
// then: once its process is killed, nothing is left counted for every
// publish to wake.
func TestAStaleReaderEvictedAsleepLeavesNoSleeperOnceKilled(t *testing.T) {
	s, err := Create("", Config{DType: dtype.Uint64, Shape: []int64{8}, Frames: 2, Readers: 1, Policy: Block,
		ReaderTimeout: 20 * time.Millisecond})
	require.NoError(t, err)
	defer s.Close()
	child := exec.Command("sleep", "60")
	require.NoError(t, child.Start())
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	pid := int64(child.Process.Pid)
	var start uint64
	require.Eventually(t, func() bool { start, err = proc.StartTime(pid); return err == nil }, 5*time.Second, time.Millisecond)

	slot, waiters := s.slot(0), u32(s.data, offDataWaiters)
	atomic.StoreUint64(u64(slot, rPID), uint64(pid))
	atomic.StoreUint64(u64(slot, rStart), start)
	atomic.StoreUint64(u64(slot, rPosition), 0)
	atomic.StoreInt64((*int64)(ptr(slot, rSeen)), nowNS()-int64(time.Second))
	atomic.StoreUint64(u64(slot, rWord), slotWord(pid, 1, slotActive))
	atomic.StoreUint32(u32(slot, rArmed), 1) // asleep, and stopped there
	atomic.AddUint32(waiters, 1)

	w, err := s.Writer()
	require.NoError(t, err)
	defer w.Close()
	for range 3 { // the third waits for the stale reader, and evicts it
		_, err = w.Look(time.Now().Add(10 * time.Second))
		require.NoError(t, err)
		require.NoError(t, w.Increment())
	}
	require.Equal(t, uint32(slotEvicted), state(atomic.LoadUint64(u64(slot, rWord))))
	require.Zero(t, atomic.LoadUint32(waiters), "the evicted reader's sleeper taken back")
	require.Zero(t, atomic.LoadUint32(u32(slot, rArmed)))
	require.NoError(t, child.Process.Kill())
	_ = child.Wait()
	for range 4 {
		_, err = w.Look(time.Now().Add(10 * time.Second))
		require.NoError(t, err)
		require.NoError(t, w.Increment())
	}
	require.Zero(t, atomic.LoadUint32(waiters))
}
