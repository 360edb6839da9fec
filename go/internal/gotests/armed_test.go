package gotests

import (
	"errors"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/stream"
	"golang.org/x/sys/unix"
)

// rawSleep sleeps on word as a host does outside Go (zct_sleep): the futex
// call alone.
func rawSleep(word *uint32, seen uint32, timeout time.Duration) error {
	ts := unix.NsecToTimespec(int64(timeout))
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), 0, uintptr(seen),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
	if errno != 0 && errno != unix.EAGAIN {
		return errno
	}
	return nil
}

// TestArmedModel: a model of a handle's arms. Random arms, disarms and a
// close, in any order, keep the shared waiter count equal to the arms not
// taken back, refuse a disarm with nothing armed, and leave nothing counted
// after Release.
func TestArmedModel(t *testing.T) {
	for seed := int64(0); seed < 200; seed++ {
		rng := rand.New(rand.NewSource(seed))
		var words, waiters [4]uint32
		var armed futex.Armed
		model := [4]int{}
		for range rng.Intn(60) {
			i := rng.Intn(4)
			s := futex.Seq{Word: &words[i], Waiters: &waiters[i]}
			if rng.Intn(2) == 0 {
				require.Equal(t, words[i], armed.Arm(i, s))
				model[i]++
			} else {
				require.Equal(t, model[i] > 0, armed.Disarm(i, s), "seed %d", seed)
				if model[i] > 0 {
					model[i]--
				}
			}
			for j := range 4 {
				require.Equal(t, uint32(model[j]), atomic.LoadUint32(&waiters[j]), "seed %d word %d", seed, j)
			}
		}
		for i := range 4 {
			armed.Release(i, futex.Seq{Word: &words[i], Waiters: &waiters[i]})
			require.Zero(t, atomic.LoadUint32(&waiters[i]), "seed %d", seed)
			require.False(t, armed.Disarm(i, futex.Seq{Word: &words[i], Waiters: &waiters[i]}))
		}
	}
}

// TestQueueSleepOutsideGo: a consumer that arms the data word and sleeps
// with the futex call alone is woken by a put, and a close wakes it and
// takes its arm back; disarming after the close is refused as closed.
func TestQueueSleepOutsideGo(t *testing.T) {
	q, err := queue.Create("", 4096, 0)
	require.NoError(t, err)
	defer q.Close()
	word, seen, err := q.ArmWait(queue.WaitData)
	require.NoError(t, err)
	_, err = q.Get(make([]byte, 256), 0, time.Now()) // look again: nothing
	require.ErrorIs(t, err, queue.ErrEmpty)
	go func() {
		time.Sleep(20 * time.Millisecond)
		rec := message.Record{Type: 1, Payload: []byte("x")}
		_ = q.Put(&rec, time.Time{})
	}()
	for atomic.LoadUint32(word) == seen {
		require.NoError(t, rawSleep(word, seen, 30*time.Second))
	}
	require.NoError(t, q.DisarmWait(queue.WaitData, false))
	require.ErrorIs(t, q.DisarmWait(queue.WaitData, false), unix.EINVAL, "nothing armed")
	_, err = q.Get(make([]byte, 256), 0, time.Now())
	require.NoError(t, err)

	other, err := queue.Attach(q.Segment().Name())
	require.NoError(t, err)
	defer other.Close()
	word, seen, err = other.ArmWait(queue.WaitData)
	require.NoError(t, err)
	woke := make(chan error, 1)
	go func() { woke <- rawSleep(word, seen, 30*time.Second) }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, other.Close())
	select {
	case err := <-woke:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("close did not wake the sleeper")
	}
	require.True(t, errors.Is(other.DisarmWait(queue.WaitData, false), queue.ErrClosed))
	_, _, err = q.ArmWait(-1)
	require.ErrorIs(t, err, unix.EINVAL)
}

// TestStreamWriterSleepOutsideGo: a writer that waits for room arms the
// space word and sleeps with the futex call alone; a reader that releases
// the frame it waits for wakes it (the writer says what it waits for
// until it disarms, even across a look that does not wait), and a close
// wakes it and takes its arm back.
func TestStreamWriterSleepOutsideGo(t *testing.T) {
	s, err := stream.Create("", stream.Config{DType: dtype.Uint64, Shape: []int64{8}, Frames: 2, Readers: 1, Policy: stream.Block})
	require.NoError(t, err)
	defer s.Close()
	r, err := s.Reader(-1)
	require.NoError(t, err)
	defer r.Close()
	w, err := s.Writer()
	require.NoError(t, err)
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
		require.NoError(t, rawSleep(word, seen, 30*time.Second))
	}
	require.NoError(t, w.DisarmWait())
	require.ErrorIs(t, w.DisarmWait(), unix.EINVAL, "nothing armed")
	_, err = w.Look(time.Now())
	require.NoError(t, err, "the reader made room")
	require.NoError(t, w.Increment())

	word, seen, err = w.ArmWait()
	require.NoError(t, err)
	woke := make(chan error, 1)
	go func() { woke <- rawSleep(word, seen, 30*time.Second) }()
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

// TestQueueEmptiedWakesEverySpaceSleeper: a get that leaves the queue empty
// wakes every thread asleep on the space word, not one (Note [an empty
// queue wakes every space sleeper]): a readiness watcher asleep there
// beside a producer waiting for room sees the queue emptied, whichever of
// them one wake-up would have gone to.
func TestQueueEmptiedWakesEverySpaceSleeper(t *testing.T) {
	for _, sleepers := range []int{1, 2, 5} {
		q, err := queue.Create("", 4096, 0)
		require.NoError(t, err)
		rec := message.Record{Type: 1, Payload: []byte("x")}
		require.NoError(t, q.Put(&rec, time.Time{}))
		woke := make(chan time.Duration, sleepers)
		armed := make(chan struct{}, sleepers)
		for range sleepers {
			word, seen, err := q.ArmWait(queue.WaitSpace)
			require.NoError(t, err)
			go func() {
				armed <- struct{}{}
				start := time.Now()
				for atomic.LoadUint32(word) == seen && time.Since(start) < 10*time.Second {
					_ = rawSleep(word, seen, 10*time.Second)
				}
				woke <- time.Since(start)
			}()
		}
		for range sleepers {
			<-armed
		}
		time.Sleep(50 * time.Millisecond) // asleep in the futex call
		_, err = q.Get(make([]byte, 256), 0, time.Now())
		require.NoError(t, err, "Get")
		for range sleepers {
			select {
			case d := <-woke:
				require.Less(t, d, 5*time.Second, "%d sleepers: one woke only by its timeout", sleepers)
			case <-time.After(15 * time.Second):
				t.Fatalf("%d sleepers: one never woke", sleepers)
			}
		}
		for range sleepers {
			require.NoError(t, q.DisarmWait(queue.WaitSpace, false))
		}
		require.NoError(t, q.Close())
	}
}
