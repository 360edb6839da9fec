package zctipc_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"github.com/zctipc/zctipc/go/zctipc"
)

// TestQueueCloseWhileManyWaitInEveryCall: goroutines blocked in every
// waiting call of a queue (Get and Wait on an empty one; PutBytes and
// PutTensor on a full one), others calling it in a loop, and two Closes at
// once from two more. Every blocked call returns ErrClosed, exactly one
// Close succeeds, every call after it returns ErrClosed, nothing panics,
// the queues are gone, and the tensor a refused PutTensor was sending
// holds only its own count again.
func TestQueueCloseWhileManyWaitInEveryCall(t *testing.T) {
	for round := range 10 {
		empty, err := zctipc.NewQueue("", 4096)
		require.NoError(t, err)
		full, err := zctipc.NewQueue("", 4096)
		require.NoError(t, err)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			err := full.PutBytes(ctx, make([]byte, 1000))
			cancel()
			if errors.Is(err, zctipc.ErrFull) {
				break
			}
			require.NoError(t, err)
		}
		tensor, err := zctipc.NewTensor("", zctipc.Float32, 16)
		require.NoError(t, err)

		const each = 6
		var wg sync.WaitGroup
		errs := make(chan error, 8*each)
		started := make(chan struct{}, 8*each)
		call := func(what string, fn func() error) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				started <- struct{}{}
				if err := fn(); !errors.Is(err, zctipc.ErrClosed) {
					errs <- fmt.Errorf("%s returned %v, not ErrClosed", what, err)
				}
			}()
		}
		bg := context.Background()
		for range each {
			call("Get", func() error { _, err := empty.Get(bg); return err })
			call("Wait", func() error { return empty.Wait(bg) })
			call("PutBytes", func() error { return full.PutBytes(bg, make([]byte, 2000)) })
			call("PutTensor", func() error { return full.PutTensor(bg, tensor) })
		}
		// Callers that come and go while the queues close, leaving the
		// empty one empty and the full one full.
		stop := make(chan struct{})
		var loops sync.WaitGroup
		for _, q := range []*zctipc.Queue{empty, full} {
			loops.Add(1)
			go func() {
				defer loops.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, _ = q.Len()
					_ = q.SetWait(zctipc.Sleeping)
					ctx, cancel := context.WithTimeout(bg, time.Microsecond)
					if q == empty {
						_, _ = q.Get(ctx)
					} else {
						_ = q.PutBytes(ctx, make([]byte, 2000))
					}
					cancel()
				}
			}()
		}
		for range 4 * each {
			<-started
		}
		time.Sleep(5 * time.Millisecond) // let them block (not asserted)
		names := []string{empty.Name(), full.Name()}
		closes := make(chan error, 4)
		for _, q := range []*zctipc.Queue{empty, full, empty, full} {
			go func() { closes <- q.Close() }()
		}
		wg.Wait()
		close(stop)
		loops.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err, "round %d", round)
		}
		ok := 0
		for range 4 {
			if err := <-closes; err == nil {
				ok++
			} else {
				require.ErrorIs(t, err, zctipc.ErrClosed, "round %d", round)
			}
		}
		require.Equal(t, 2, ok, "one Close of each queue succeeds")
		for _, name := range names {
			require.False(t, testenv.Exists(name), "round %d: queue %s left", round, name)
		}
		for _, q := range []*zctipc.Queue{empty, full} {
			_, err := q.Len()
			require.ErrorIs(t, err, zctipc.ErrClosed)
			require.ErrorIs(t, q.PutBytes(bg, nil), zctipc.ErrClosed)
			_, err = q.Get(bg)
			require.ErrorIs(t, err, zctipc.ErrClosed)
			require.ErrorIs(t, q.Wait(bg), zctipc.ErrClosed)
			require.ErrorIs(t, q.SetWait(zctipc.Polling), zctipc.ErrClosed)
		}
		n, err := tensor.Refcount()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "round %d: a refused PutTensor gave back the count it took", round)
		require.NoError(t, tensor.Close())
	}
}
