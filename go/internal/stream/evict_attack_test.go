package stream

import (
	"errors"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/zctipc/zctipc/go/internal/dtype"
)

// deadReaderIn makes slot i's reader a process that died asleep at
// position 0, holding the writer back.
func deadReaderIn(t *testing.T, s *Stream, i int) int64 {
	child := exec.Command("true")
	require.NoError(t, child.Run())
	dead := int64(child.Process.Pid)
	slot := s.slot(i)
	atomic.StoreUint64(u64(slot, rPID), uint64(dead))
	atomic.StoreUint64(u64(slot, rStart), 1)
	atomic.StoreUint64(u64(slot, rPosition), 0)
	atomic.StoreUint64(u64(slot, rWord), slotWord(dead, 1, slotActive))
	atomic.StoreUint32(u32(slot, rArmed), 1)
	atomic.AddUint32(u32(s.data, offDataWaiters), 1)
	return dead
}

// TestAWriterStoppedInAnEvictionHoldsTheSlotOnlyForAMoment: Note [evicting
// a dead reader]. A writer stopped while it holds a dead reader's slot
// joining (here: its hook does not return) keeps a reader asking for that
// slot out with ErrNoSlot after a moment, not for ever; a reader asking
// for any slot takes another; once the writer goes on, the slot is free
// and the dead reader's sleeper is gone.
func TestAWriterStoppedInAnEvictionHoldsTheSlotOnlyForAMoment(t *testing.T) {
	s, err := Create("", Config{DType: dtype.Uint64, Shape: []int64{8}, Frames: 2, Readers: 2, Policy: Block})
	require.NoError(t, err)
	defer s.Close()
	deadReaderIn(t, s, 0)
	w, err := s.Writer()
	require.NoError(t, err)
	defer w.Close()
	for range 2 {
		_, err = w.Look(time.Time{})
		require.NoError(t, err)
		require.NoError(t, w.Increment())
	}

	inside, goOn := make(chan struct{}), make(chan struct{})
	evictingHook = func() {
		close(inside)
		<-goOn
	}
	defer func() { evictingHook = nil }()
	looked := make(chan error, 1)
	go func() {
		_, err := w.Look(time.Now().Add(30 * time.Second))
		looked <- err
	}()
	<-inside
	_, err = s.Reader(0)
	require.ErrorIs(t, err, ErrNoSlot, "a slot held joining by a live writer is refused")
	other, err := s.Reader(-1)
	require.NoError(t, err)
	require.Equal(t, 1, other.Index())
	_, err = s.Reader(-1)
	require.ErrorIs(t, err, ErrNoSlot)
	close(goOn)
	require.NoError(t, <-looked)
	require.NoError(t, w.Increment())

	r, err := s.Reader(0)
	require.NoError(t, err)
	require.Zero(t, atomic.LoadUint32(u32(s.data, offDataWaiters)), "the dead reader's sleeper was taken back")
	require.NoError(t, r.Close())
	require.NoError(t, other.Close())
}

// TestASlotHeldJoiningByAGoneProcessIsTakenAtOnce: a writer killed while
// it held a dead reader's slot joining leaves the slot under its own pid,
// with the dead reader's identity beside it: a reader takes it (the
// writer's pid is gone), and takes the sleepers back.
func TestASlotHeldJoiningByAGoneProcessIsTakenAtOnce(t *testing.T) {
	s, err := Create("", Config{DType: dtype.Uint64, Shape: []int64{8}, Frames: 2, Readers: 1, Policy: Block})
	require.NoError(t, err)
	defer s.Close()
	deadReaderIn(t, s, 0)
	writer := exec.Command("true")
	require.NoError(t, writer.Run())
	slot := s.slot(0)
	atomic.StoreUint64(u64(slot, rWord), slotWord(int64(writer.Process.Pid), 2, slotJoining))

	r, err := s.Reader(0)
	require.NoError(t, err)
	require.Zero(t, atomic.LoadUint32(u32(s.data, offDataWaiters)))
	require.Zero(t, atomic.LoadUint32(u32(slot, rArmed)))
	require.NoError(t, r.Close())
}

// TestReadersRacingAnEvictionNeverShareTheSlot: readers of this process
// ask for slot 0 again and again while the writer evicts its dead reader:
// at most one holds it at a time, the writer goes on, and once they left no
// sleeper is counted.
func TestReadersRacingAnEvictionNeverShareTheSlot(t *testing.T) {
	for range 20 {
		s, err := Create("", Config{DType: dtype.Uint64, Shape: []int64{8}, Frames: 2, Readers: 1, Policy: Block})
		require.NoError(t, err)
		deadReaderIn(t, s, 0)
		w, err := s.Writer()
		require.NoError(t, err)
		for range 2 {
			_, err = w.Look(time.Time{})
			require.NoError(t, err)
			require.NoError(t, w.Increment())
		}
		var holders atomic.Int32
		errs := make(chan error, 4)
		for range 4 {
			go func() {
				for {
					r, err := s.Reader(0)
					if errors.Is(err, ErrNoSlot) {
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					if holders.Add(1) != 1 {
						errs <- errors.New("two readers hold one slot")
					}
					arm := r.dataSeq()
					arm.Arm()
					arm.Disarm()
					holders.Add(-1)
					errs <- r.Close()
					return
				}
			}()
		}
		_, err = w.Look(time.Now().Add(30 * time.Second))
		require.NoError(t, err)
		for range 4 {
			require.NoError(t, <-errs)
		}
		require.Zero(t, atomic.LoadUint32(u32(s.data, offDataWaiters)))
		require.NoError(t, w.Close())
		require.NoError(t, s.Close())
	}
}
