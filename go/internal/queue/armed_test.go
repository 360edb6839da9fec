package queue_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

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
		require.NoError(t, testenv.RawSleep(word, seen, 30*time.Second))
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
	go func() { woke <- testenv.RawSleep(word, seen, 30*time.Second) }()
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
					_ = testenv.RawSleep(word, seen, 10*time.Second)
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
