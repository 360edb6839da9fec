package queue_test

// Attacks on a put that hands counts over (PutHanding; package buffer,
// Note [counts that wait]): its look for room without the put lock
// (plane's zp_room) against what the put itself would do, and the pairing
// of its Send and Unsend around its attempts.

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/queue"
)

// handing counts a PutHanding's Send and Unsend calls, and checks that
// they alternate, starting with Send.
type handing struct {
	mu            sync.Mutex
	sends, unsend int
	bad           string
}

func (h *handing) h() queue.Handing {
	return queue.Handing{
		Send: func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.sends != h.unsend {
				h.bad = "Send twice without an Unsend between"
			}
			h.sends++
		},
		Unsend: func() error {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.sends != h.unsend+1 {
				h.bad = "Unsend of counts not sent"
			}
			h.unsend++
			return nil
		},
	}
}

// sent reports whether the counts are out (sent and not taken back).
func (h *handing) sent() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sends > h.unsend
}

// sparseQueue returns a small queue with a version 2 ring (an unbounded
// queue's layout whose pages come and go, without the warm window), of 8
// MiB: the smallest ring that layout takes, so that it fills quickly.
func sparseQueue(t *testing.T) *queue.Queue {
	t.Helper()
	const size = 8 << 20
	creator, err := queue.Create("", size, 0)
	require.NoError(t, err)
	v := (*uint32)(unsafe.Pointer(&creator.Segment().Data()[16]))
	*v = queue.SparseRingVersion // before any other process opens it
	q, err := queue.Attach(creator.Segment().Name())
	require.NoError(t, creator.Close())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	require.True(t, q.Unbounded())
	return q
}

// A consumer killed between the commit of its get (the head word) and the
// store of given_back leaves pages behind head that only a put's catch-up
// gives back (zp_catch_up): a put that finds no room past given_back but
// room past head catches up and lands. A put that hands counts over looks
// for room first (zp_room) without the put lock; that look must not say
// "wait" where the put would catch up, since no consumer is left to wake
// it: the queue is empty, and the put waited until its deadline (for ever
// with none) while a Put with the same record landed at once.
// killedBeforeGiveBack leaves q, a sparseQueue, empty as a consumer killed
// between the commit of its get and its give_back does: head moved on
// past a 5 MiB message, given_back where it was. It returns head.
func killedBeforeGiveBack(t *testing.T, q *queue.Queue) uint32 {
	t.Helper()
	require.NoError(t, q.Put(bytesRecord(make([]byte, 5<<20)), time.Now()))
	before := ringWord32(q, offGivenBack)
	_, err := getInto(t, q, make([]byte, 6<<20))
	require.NoError(t, err)
	require.NotEqual(t, before, ringWord32(q, offGivenBack), "the get gave pages back")
	binary.LittleEndian.PutUint32(q.Segment().Data()[offGivenBack:], before)
	require.Zero(t, qlen(t, q), "an empty queue")
	return ringWord32(q, offHeadWord)
}

// A consumer killed between the commit of its get (the head word) and the
// store of given_back leaves pages behind head that only a put's catch-up
// gives back (zp_catch_up): a put that finds no room past given_back but
// room past head catches up and lands. A put that hands counts over looks
// for room first (zp_room) without the put lock; that look must not say
// "wait" where the put would catch up, since no consumer is left to wake
// it: the queue is empty, and the put waited until its deadline (for ever
// with none) while a Put of the same record landed at once.
func TestAPutHandingCatchesUpAfterAKilledConsumer(t *testing.T) {
	rec := bytesRecord(make([]byte, 4<<20)) // room past head, none past given_back
	t.Run("Put", func(t *testing.T) {
		q := sparseQueue(t)
		head := killedBeforeGiveBack(t, q)
		require.NoError(t, q.Put(rec, time.Now().Add(300*time.Millisecond)))
		require.Equal(t, head&^(2<<20-1), ringWord32(q, offGivenBack), "the put caught up")
	})
	t.Run("PutHanding", func(t *testing.T) {
		q := sparseQueue(t)
		head := killedBeforeGiveBack(t, q)
		var h handing
		err := q.PutHanding(rec, time.Now().Add(300*time.Millisecond), h.h())
		require.NoError(t, err, "a put that would catch up waited for a wake-up no one sends")
		require.Empty(t, h.bad)
		require.True(t, h.sent(), "the record is in the queue: its counts are sent")
		require.Equal(t, 1, qlen(t, q))
		require.Equal(t, head&^(2<<20-1), ringWord32(q, offGivenBack), "the put caught up")
	})
	t.Run("PutHandingContext", func(t *testing.T) {
		q := sparseQueue(t)
		killedBeforeGiveBack(t, q)
		var h handing
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		require.NoError(t, q.PutHandingContext(ctx, rec, h.h()), "a put that would catch up waited for a wake-up no one sends")
		require.Empty(t, h.bad)
		require.True(t, h.sent())
	})
}

// Many putters of records that hand counts over, on a queue of two
// messages, with deadlines that pass and contexts that are cancelled, and
// a consumer that takes now and then: the put lock is contended (Busy),
// the queue is full (Wait) and room comes. After every return, the counts
// are sent exactly when the record was put: Send and Unsend alternate,
// and an error leaves them taken back.
func TestPutHandingSendsExactlyWhatItPuts(t *testing.T) {
	q := mustQueue(t, 4096, 2)
	const putters, each = 6, 40
	var mu sync.Mutex
	put, unsends := 0, 0
	var wg sync.WaitGroup
	for i := range putters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for j := range each {
				var h handing
				rec := bytesRecord([]byte{byte(i), byte(j)})
				var err error
				wait := time.Duration(rng.IntN(3)) * time.Millisecond
				switch rng.IntN(3) {
				case 0:
					err = q.PutHanding(rec, time.Now().Add(wait), h.h())
				case 1:
					ctx, cancel := context.WithTimeout(context.Background(), wait)
					err = q.PutHandingContext(ctx, rec, h.h())
					cancel()
				default:
					ctx, cancel := context.WithCancel(context.Background())
					time.AfterFunc(wait, cancel)
					err = q.PutHandingContext(ctx, rec, h.h())
					cancel()
				}
				if h.bad != "" {
					t.Errorf("putter %d, put %d: %s", i, j, h.bad)
					return
				}
				if h.sent() != (err == nil) {
					t.Errorf("putter %d, put %d: sent %v with error %v", i, j, h.sent(), err)
					return
				}
				if err != nil && !errors.Is(err, queue.ErrFull) && !errors.Is(err, context.Canceled) &&
					!errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("putter %d, put %d: %v", i, j, err)
					return
				}
				mu.Lock()
				if err == nil {
					put++
				}
				unsends += h.unsend
				mu.Unlock()
			}
		}()
	}
	stop := make(chan struct{})
	// Another putter, holding the put lock now and then: a put that found
	// room finds the lock held (Busy) and waits for it.
	held := make(chan error)
	go func() {
		putLock := lockAt(q, 64)
		for {
			select {
			case <-stop:
				held <- nil
				return
			default:
			}
			ok, err := putLock.TryLock()
			if err != nil {
				held <- err
				return
			}
			if ok {
				time.Sleep(500 * time.Microsecond)
				if err := putLock.Unlock(); err != nil {
					held <- err
					return
				}
			}
			time.Sleep(500 * time.Microsecond)
		}
	}()
	got := make(chan int)
	go func() {
		n := 0
		buf := make([]byte, 4096)
		for {
			select {
			case <-stop:
				for {
					if _, err := q.Get(buf, 0, time.Now()); err != nil {
						got <- n
						return
					}
					n++
				}
			default:
			}
			if _, err := q.Get(buf, 0, time.Now().Add(time.Millisecond)); err == nil {
				n++
			}
		}
	}()
	wg.Wait()
	close(stop)
	require.NoError(t, <-held)
	require.Equal(t, put, <-got, "every put that reported success put one record")
	t.Logf("%d of %d put, %d counts taken back", put, putters*each, unsends)
}
