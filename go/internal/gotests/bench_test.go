package gotests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/zctipc"
)

// BenchmarkAttach measures attaching a segment this process does not map
// yet (as a consumer does), and closing it again.
func BenchmarkAttach(b *testing.B) {
	for _, size := range []int64{1 << 20, 100 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			seg, err := shm.Create("", header.KindTensor, dtype.Uint8, []int64{size})
			if err != nil {
				b.Fatalf("Create: %v", err)
			}
			name := seg.Name()
			// An in-flight count keeps the segment while no handle is open.
			if _, err := seg.AddRef(); err != nil {
				b.Fatalf("AddRef: %v", err)
			}
			if err := seg.Close(); err != nil {
				b.Fatalf("Close: %v", err)
			}
			b.ResetTimer()
			for range b.N {
				s, err := shm.Attach(name, header.KindTensor, false)
				if err != nil {
					b.Fatalf("Attach: %v", err)
				}
				if err := s.Close(); err != nil {
					b.Fatalf("Close: %v", err)
				}
			}
			b.StopTimer()
			s, err := shm.Attach(name, header.KindTensor, false)
			if err != nil {
				b.Fatalf("Attach: %v", err)
			}
			if _, err := s.DropRef(); err != nil {
				b.Fatalf("DropRef: %v", err)
			}
			if err := s.Close(); err != nil {
				b.Fatalf("Close: %v", err)
			}
		})
	}
}

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
