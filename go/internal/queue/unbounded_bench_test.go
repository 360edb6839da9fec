package queue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
)

// BenchmarkUnboundedPutGet: one put and one get of a message on an
// unbounded queue, the queue emptied by every get (the warm window's case),
// and with a few messages in flight.
func BenchmarkUnboundedPutGet(b *testing.B) {
	for _, size := range []int{1 << 10, 1 << 20} {
		for _, inFlight := range []int{0, 4} {
			b.Run(fmt.Sprintf("%dB-inflight%d", size, inFlight), func(b *testing.B) {
				q, err := queue.CreateUnbounded("", 0)
				if err != nil {
					b.Fatal(err)
				}
				defer q.Close()
				rec := bytesRecord(make([]byte, size))
				buf := make([]byte, size+64)
				for range inFlight {
					if err := q.Put(rec, time.Now()); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				for range b.N {
					if err := q.Put(rec, time.Now()); err != nil {
						b.Fatal(err)
					}
					if _, err := q.Get(buf, message.MaxDescriptors, time.Now()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
