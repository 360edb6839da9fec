package zctipc_test

import (
	"context"
	"testing"
	"time"

	"github.com/zctipc/zctipc/go/zctipc"
)

// BenchmarkCancelWakesGet measures the time from cancelling the context of
// a Get blocked on an empty queue to Get returning: the waker bumps the
// futex word rather than the call polling its context.
func BenchmarkCancelWakesGet(b *testing.B) {
	q, err := zctipc.NewQueue("", 1<<12)
	if err != nil {
		b.Fatalf("NewQueue: %v", err)
	}
	defer q.Close()
	var total time.Duration
	for range b.N {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan time.Time)
		go func() {
			_, _ = q.Get(ctx)
			done <- time.Now()
		}()
		time.Sleep(2 * time.Millisecond) // asleep on the futex by now
		start := time.Now()
		cancel()
		total += (<-done).Sub(start)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "us/wake")
}
