package queue_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/testenv"
)

// TestQueuePackageCloseWhileEveryCallWaits: the same for package queue's
// own calls, Join and the batch calls among them.
func TestQueuePackageCloseWhileEveryCallWaits(t *testing.T) {
	q, err := queue.Create("", 4096, 1)
	require.NoError(t, err)
	name := q.Segment().Name()
	require.NoError(t, q.Put(bytesRecord([]byte("held")), time.Now())) // full (one message), and Join waits
	e, err := queue.Create("", 4096, 0)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	call := func(what string, fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(); !errors.Is(err, queue.ErrClosed) {
				errs <- fmt.Errorf("%s returned %v, not ErrClosed", what, err)
			}
		}()
	}
	buf := make([]byte, 4096)
	for range 4 {
		call("Put", func() error { return q.Put(bytesRecord([]byte("x")), time.Time{}) })
		call("PutMany", func() error {
			_, err := q.PutMany([]*message.Record{bytesRecord(nil), bytesRecord(nil)}, time.Time{})
			return err
		})
		call("Join", func() error { return q.Join(time.Time{}) })
		call("Get", func() error { _, err := e.Get(buf[:0:0], 0, time.Time{}); return err })
		call("GetMany", func() error { _, _, err := e.GetMany(make([]byte, 64), 4, 0, time.Time{}); return err })
		call("WaitNonEmpty", func() error { return e.WaitNonEmpty(time.Time{}) })
	}
	time.Sleep(5 * time.Millisecond) // let them block (not asserted)
	require.NoError(t, q.Close())
	require.NoError(t, e.Close())
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.ErrorIs(t, q.Close(), queue.ErrClosed)
	require.ErrorIs(t, q.TaskDone(), queue.ErrClosed)
	_, err = q.Room()
	require.ErrorIs(t, err, queue.ErrClosed)
	require.False(t, testenv.Exists(name))
}
