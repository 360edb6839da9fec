package zctipc_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"github.com/zctipc/zctipc/go/zctipc"
)

// TestQueueCloseReleasesBeforeBlockedGetsReturn: goroutines blocked in Get
// wake when another closes the queue, and the ErrClosed they return comes
// after Close gave up this process's count: the queue, held by this handle
// only, is gone by then. (Get used to return as soon as it left the call,
// while Close had yet to release.)
func TestQueueCloseReleasesBeforeBlockedGetsReturn(t *testing.T) {
	for round := range 20 {
		q, err := zctipc.NewQueue("", 1<<12)
		require.NoError(t, err)
		name := q.Name()
		const getters = 16
		var started, done sync.WaitGroup
		seen := make(chan error, getters)
		for range getters {
			started.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				started.Done()
				_, err := q.Get(context.Background())
				if !errors.Is(err, zctipc.ErrClosed) {
					seen <- err
					return
				}
				if testenv.Exists(name) {
					seen <- errors.New("Get returned ErrClosed while the queue was still held")
				}
			}()
		}
		started.Wait()
		closed := make(chan error, 1)
		go func() { closed <- q.Close() }()
		done.Wait()
		require.NoError(t, <-closed, "round %d", round)
		close(seen)
		for err := range seen {
			require.NoError(t, err, "round %d", round)
		}
		require.False(t, testenv.Exists(name))
		require.ErrorIs(t, q.Close(), zctipc.ErrClosed, "closing twice")
	}
}
