package queue_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
)

// peekAll peeks from cursor until the queue has nothing more, returning the
// payloads seen, the messages missed and the cursor to go on from.
func peekAll(t *testing.T, q *queue.Queue, cursor uint64) ([]string, uint32, uint64) {
	t.Helper()
	buf := make([]byte, 4096)
	var seen []string
	var missed uint32
	for {
		p, err := q.Peek(cursor, buf)
		missed += p.Missed
		cursor = p.Next
		if errors.Is(err, queue.ErrEmpty) {
			return seen, missed, cursor
		}
		require.NoError(t, err)
		rec, err := message.DecodeRecord(buf[:p.Size])
		require.NoError(t, err)
		seen = append(seen, string(rec.Payload))
	}
}

func TestQueuePeekShowsWhatWaitsAndTakesNothing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		bounded bool
	}{{"bounded", true}, {"unbounded", false}} {
		t.Run(tc.name, func(t *testing.T) {
			var q *queue.Queue
			var err error
			if tc.bounded {
				q, err = queue.Create("", 4096, 0)
			} else {
				q, err = queue.CreateUnbounded("", 0)
			}
			require.NoError(t, err)
			defer func() { require.NoError(t, q.Close()) }()
			for _, s := range []string{"one", "two", "three"} {
				require.NoError(t, q.Put(bytesRecord([]byte(s)), time.Time{}))
			}
			seen, missed, end := peekAll(t, q, queue.PeekOldest)
			require.Equal(t, []string{"one", "two", "three"}, seen)
			require.Zero(t, missed)
			require.Equal(t, 3, qlen(t, q), "peeking took nothing")

			// Consumers take two: a bounded ring still holds their bytes
			// (no producer wrote over them), an unbounded one may not.
			for range 2 {
				_, err := q.Get(make([]byte, 64), 0, time.Time{})
				require.NoError(t, err)
			}
			seen, missed, _ = peekAll(t, q, queue.PeekOldest)
			require.Equal(t, []string{"three"}, seen, "the oldest message in the queue")
			require.Zero(t, missed)

			require.NoError(t, q.Put(bytesRecord([]byte("four")), time.Time{}))
			seen, missed, _ = peekAll(t, q, end)
			require.Equal(t, []string{"four"}, seen, "a cursor goes on where it stopped")
			require.Zero(t, missed)

			_, _, next := peekAll(t, q, queue.PeekNewest)
			require.NoError(t, q.Put(bytesRecord(make([]byte, 1000)), time.Time{}))
			p, err := q.Peek(next, make([]byte, 64))
			var re *queue.RangeError
			require.ErrorAs(t, err, &re)
			require.Equal(t, 1000+message.RecordHeaderSize, re.Need)
			require.Equal(t, next, p.At, "asked again at the same record")
			_, err = q.Peek(p.Next, make([]byte, 64))
			require.ErrorIs(t, err, queue.ErrEmpty, "or passed over")
		})
	}
}

func TestQueuePeekCountsWhatConsumersTookFirst(t *testing.T) {
	q, err := queue.CreateUnbounded("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	_, _, cursor := peekAll(t, q, queue.PeekOldest)
	buf := make([]byte, 64)
	for round := range 20 { // each get empties the queue, which skips to the next lap
		require.NoError(t, q.Put(bytesRecord([]byte{byte(round)}), time.Time{}))
		_, err := q.Get(buf, 0, time.Time{})
		require.NoError(t, err)
	}
	seen, missed, _ := peekAll(t, q, cursor)
	require.Empty(t, seen)
	require.Equal(t, uint32(20), missed, "laps apart, the counts say how many passed")
}

// TestQueuePeekNeverShowsWhatNoRecordWas peeks in a loop while consumers
// take every record as soon as it is put: each record's bytes all say its
// number, so a copy of anything but the record shows two numbers.
func TestQueuePeekNeverShowsWhatNoRecordWas(t *testing.T) {
	for _, tc := range []struct {
		name    string
		bounded bool
	}{{"bounded", true}, {"unbounded", false}} {
		t.Run(tc.name, func(t *testing.T) {
			var q *queue.Queue
			var err error
			if tc.bounded {
				q, err = queue.Create("", 16<<10, 0)
			} else {
				q, err = queue.CreateUnbounded("", 0)
			}
			require.NoError(t, err)
			defer func() { require.NoError(t, q.Close()) }()
			const total = 20000
			var taken atomic.Int64
			var wg sync.WaitGroup
			// The consumers start once the peeker has seen a record, so that
			// a loaded machine cannot let them take every record first.
			firstSeen := make(chan struct{})
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-firstSeen
					buf := make([]byte, 4096)
					for n := 0; ; n++ {
						if n%64 == 0 {
							time.Sleep(50 * time.Microsecond) // now and then a few records wait
						}
						_, err := q.Get(buf, 0, time.Now().Add(time.Second))
						if errors.Is(err, queue.ErrEmpty) {
							return
						}
						if err != nil {
							t.Errorf("Get: %v", err)
							return
						}
						taken.Add(1)
					}
				}()
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := range total {
					b := byte(i%251 + 1)
					payload := make([]byte, 8+8*(i%60))
					for j := range payload {
						payload[j] = b
					}
					if err := q.Put(bytesRecord(payload), time.Time{}); err != nil {
						t.Errorf("Put: %v", err)
						return
					}
				}
			}()
			buf := make([]byte, 4096)
			cursor, seen, missed := queue.PeekOldest, 0, uint32(0)
		peeking:
			for {
				p, err := q.Peek(cursor, buf)
				missed += p.Missed
				cursor = p.Next
				switch {
				case errors.Is(err, queue.ErrEmpty):
					select {
					case <-done:
						break peeking
					default:
						continue
					}
				case err != nil:
					require.NoError(t, err, "Peek")
				}
				rec, err := message.DecodeRecord(buf[:p.Size])
				require.NoError(t, err)
				for _, c := range rec.Payload {
					require.Equal(t, rec.Payload[0], c, "a record peeked whole")
				}
				if seen == 0 {
					close(firstSeen)
				}
				seen++
			}
			wg.Wait()
			require.Equal(t, int64(total), taken.Load(), "the consumers took every record")
			require.Positive(t, seen)
			require.LessOrEqual(t, seen+int(missed), total)
			t.Logf("peeked %d, missed %d of %d", seen, missed, total)
		})
	}
}
