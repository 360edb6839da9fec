package queue_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/lock"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/testenv"
)

func bytesRecord(payload []byte) *message.Record {
	return &message.Record{Type: message.TypeBytes, Payload: payload}
}

// get takes one record and returns its payload.
func get(t *testing.T, q *queue.Queue, deadline time.Time) ([]byte, error) {
	t.Helper()
	buf := make([]byte, q.Capacity())
	n, err := q.Get(buf, message.MaxDescriptors, deadline)
	if err != nil {
		return nil, err
	}
	rec, err := message.DecodeRecord(buf[:n])
	require.NoError(t, err)
	return rec.Payload, nil
}

// qlen returns the queue's message count.
func qlen(t *testing.T, q *queue.Queue) int {
	t.Helper()
	n, err := q.Len()
	require.NoError(t, err)
	return n
}

func mustQueue(t *testing.T, capacity, maxItems uint64) *queue.Queue {
	t.Helper()
	q, err := queue.Create("", capacity, maxItems)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	return q
}

func TestQueueOrderAndWrapAround(t *testing.T) {
	t.Parallel()
	q := mustQueue(t, 4096, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	next := 0
	for round := range 2000 {
		// Keep a few variable-sized messages in flight so that records
		// wrap around the small ring in every position.
		for qlen(t, q) < 3 {
			payload := make([]byte, 8+rng.IntN(700))
			binary.LittleEndian.PutUint64(payload, uint64(next))
			next++
			require.NoError(t, q.Put(bytesRecord(payload), time.Time{}))
		}
		got, err := get(t, q, time.Time{})
		require.NoError(t, err)
		require.EqualValues(t, round, binary.LittleEndian.Uint64(got), "FIFO")
	}
}

func TestQueueFullAndEmpty(t *testing.T) {
	q := mustQueue(t, 4096, 2)
	_, err := get(t, q, time.Now())
	require.ErrorIs(t, err, queue.ErrEmpty)
	start := time.Now()
	_, err = get(t, q, time.Now().Add(30*time.Millisecond))
	require.ErrorIs(t, err, queue.ErrEmpty)
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "a timeout is honoured")

	require.NoError(t, q.Put(bytesRecord([]byte("a")), time.Now()))
	require.NoError(t, q.Put(bytesRecord([]byte("b")), time.Now()))
	require.ErrorIs(t, q.Put(bytesRecord([]byte("c")), time.Now()), queue.ErrFull, "maxItems")
	require.Equal(t, 2, qlen(t, q))

	big := make([]byte, 5000)
	require.ErrorIs(t, q.Put(bytesRecord(big), time.Now()), queue.ErrTooLarge)

	small := make([]byte, 8)
	_, err = q.Get(small, 0, time.Now())
	var re *queue.RangeError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 24, re.Need)
	require.Equal(t, 2, qlen(t, q), "a message that did not fit stays")
}

func TestQueueBlockedGetWakesOnPut(t *testing.T) {
	q := mustQueue(t, 4096, 0)
	got := make(chan []byte)
	go func() {
		buf := make([]byte, 4096)
		n, err := q.Get(buf, 0, time.Time{})
		if err != nil {
			got <- nil
			return
		}
		rec, _ := message.DecodeRecord(buf[:n])
		got <- rec.Payload
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, q.Put(bytesRecord([]byte("wake")), time.Time{}))
	require.Equal(t, "wake", string(<-got))
}

func TestQueueTaskDoneAndJoin(t *testing.T) {
	t.Parallel()
	q := mustQueue(t, 4096, 0)
	require.ErrorIs(t, q.TaskDone(), queue.ErrTaskDone)
	require.NoError(t, q.Join(time.Now()))
	for range 3 {
		require.NoError(t, q.Put(bytesRecord([]byte("x")), time.Time{}))
	}
	n, err := q.Unfinished()
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.ErrorIs(t, q.Join(time.Now().Add(10*time.Millisecond)), queue.ErrFull)
	done := make(chan error)
	go func() { done <- q.Join(time.Time{}) }()
	for range 3 {
		_, err := get(t, q, time.Time{})
		require.NoError(t, err)
		require.NoError(t, q.TaskDone())
	}
	require.NoError(t, <-done)
	require.ErrorIs(t, q.TaskDone(), queue.ErrTaskDone)
}

func init() {
	testenv.Helpers["queue-produce"] = func(args []string) error {
		id, _ := strconv.Atoi(args[1])
		n, _ := strconv.Atoi(args[2])
		q, err := queue.Attach(args[0])
		if err != nil {
			return err
		}
		payload := make([]byte, 16)
		for seq := range n {
			binary.LittleEndian.PutUint64(payload, uint64(id))
			binary.LittleEndian.PutUint64(payload[8:], uint64(seq))
			if err := q.Put(bytesRecord(payload), time.Time{}); err != nil {
				return err
			}
		}
		return q.Close()
	}
	// queue-consume takes messages until it sees the stop message (a
	// 1-byte payload), checking that each producer's messages come in
	// order, and prints how many of each producer it took.
	testenv.Helpers["queue-consume"] = func(args []string) error {
		producers, _ := strconv.Atoi(args[1])
		q, err := queue.Attach(args[0])
		if err != nil {
			return err
		}
		last := make([]int64, producers)
		counts := make([]int, producers)
		for i := range last {
			last[i] = -1
		}
		buf := make([]byte, q.Capacity())
		for {
			n, err := q.Get(buf, 0, time.Time{})
			if err != nil {
				return err
			}
			rec, err := message.DecodeRecord(buf[:n])
			if err != nil {
				return err
			}
			if len(rec.Payload) == 1 {
				break
			}
			id := binary.LittleEndian.Uint64(rec.Payload)
			seq := int64(binary.LittleEndian.Uint64(rec.Payload[8:]))
			if seq <= last[id] {
				return fmt.Errorf("producer %d: message %d after %d", id, seq, last[id])
			}
			last[id] = seq
			counts[id]++
		}
		for _, c := range counts {
			fmt.Print(c, " ")
		}
		fmt.Println()
		return q.Close()
	}
	testenv.Helpers["queue-hold-get-lock"] = func(args []string) error {
		q, err := queue.Attach(args[0])
		if err != nil {
			return err
		}
		m := lock.At(unsafe.Pointer(&q.Segment().Data()[128]))
		if _, err := m.Lock(time.Time{}); err != nil {
			return err
		}
		fmt.Println("holding")
		select {}
	}
	testenv.Helpers["queue-block-in-get"] = func(args []string) error {
		q, err := queue.Attach(args[0])
		if err != nil {
			return err
		}
		fmt.Println("waiting")
		_, err = q.Get(make([]byte, 4096), 0, time.Time{})
		return err
	}
}

func TestQueueManyProducersManyConsumers(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	const producers, consumers, each = 4, 4, 20000
	q := mustQueue(t, 64<<10, 0)
	var cons []*testenv.Helper
	for range consumers {
		cons = append(cons, testenv.StartHelper(t, "queue-consume", q.Segment().Name(), strconv.Itoa(producers)))
	}
	var prods []*testenv.Helper
	for i := range producers {
		prods = append(prods, testenv.StartHelper(t, "queue-produce", q.Segment().Name(), strconv.Itoa(i), strconv.Itoa(each)))
	}
	for _, p := range prods {
		p.Wait(t)
	}
	for range consumers {
		require.NoError(t, q.Put(bytesRecord([]byte{0}), time.Time{}))
	}
	total := make([]int, producers)
	for _, c := range cons {
		line := c.ReadLine(t)
		var got [producers]int
		_, err := fmt.Sscan(line, &got[0], &got[1], &got[2], &got[3])
		require.NoError(t, err)
		for i := range got {
			total[i] += got[i]
		}
		c.Wait(t)
	}
	for i := range total {
		require.Equal(t, each, total[i], "every message of producer %d taken exactly once", i)
	}
	require.Zero(t, qlen(t, q))
}

func TestQueueSurvivesKilledConsumers(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	q := mustQueue(t, 4096, 0)
	name := q.Segment().Name()
	for i := range 3 {
		require.NoError(t, q.Put(bytesRecord([]byte{byte(i), 0}), time.Time{}))
	}
	// One killed while it holds the consumers' lock, one while blocked.
	holder := testenv.StartHelper(t, "queue-hold-get-lock", name)
	require.Equal(t, "holding", holder.ReadLine(t))
	_, err := get(t, q, time.Now().Add(30*time.Millisecond))
	require.ErrorIs(t, err, queue.ErrEmpty, "the live holder keeps the lock")
	require.NoError(t, holder.Cmd.Process.Signal(syscall.SIGKILL))
	require.Error(t, holder.Cmd.Wait())
	for i := range 3 {
		got, err := get(t, q, time.Now().Add(5*time.Second))
		require.NoError(t, err)
		require.Equal(t, byte(i), got[0], "no message lost to the killed holder")
	}

	blocked := testenv.StartHelper(t, "queue-block-in-get", name)
	require.Equal(t, "waiting", blocked.ReadLine(t))
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, blocked.Cmd.Process.Signal(syscall.SIGKILL))
	require.Error(t, blocked.Cmd.Wait())
	require.NoError(t, q.Put(bytesRecord([]byte("after")), time.Time{}))
	got, err := get(t, q, time.Now().Add(5*time.Second))
	require.NoError(t, err)
	require.Equal(t, "after", string(got))

	// Both killed helpers still count as holders of the queue; repairing
	// that is the cleanup daemon's work.
	for range 2 {
		_, err := q.Segment().DropRef()
		require.NoError(t, err)
	}
}

func TestQueueLastHolderReleasesWhatMessagesHold(t *testing.T) {
	for name, create := range map[string]func() (*queue.Queue, error){
		"bounded":   func() (*queue.Queue, error) { return queue.Create("", 4096, 0) },
		"unbounded": func() (*queue.Queue, error) { return queue.CreateUnbounded("", 0) },
	} {
		t.Run(name, func(t *testing.T) {
			p := pool.New(16 << 20)
			defer p.Close()
			q, err := create()
			require.NoError(t, err)
			s, err := p.Alloc(100, time.Time{})
			require.NoError(t, err)
			d := message.Descriptor{Kind: message.RefSlot, DType: dtype.Uint8, Shape: []int64{100}, Strides: []int64{1},
				Name: s.Arena().Name(), NBytes: 100, Slot: s.Index, Generation: s.Generation}
			tk, err := pool.NewTicket()
			require.NoError(t, err)
			tk.Arm() // sent: the queue's drain takes it
			d.Ticket = message.Ticket{Arena: tk.Slot.Arena().Name(), Slot: tk.Slot.Index, Generation: tk.Slot.Generation, Nonce: tk.Nonce}
			rec := &message.Record{Type: message.TypeTensor, Descriptors: []message.Descriptor{d}}
			require.NoError(t, q.Put(rec, time.Time{})) // the slot's count goes with the message
			require.EqualValues(t, 1, p.Stats().SlotsInUse)
			require.NoError(t, q.Close())
			require.EqualValues(t, 0, p.Stats().SlotsInUse, "the queue's last holder gave up the count its message carried")
			require.False(t, testenv.Exists(q.Segment().Name()))
		})
	}
}

func TestQueueRefusesBadSizes(t *testing.T) {
	t.Parallel()
	_, err := queue.Create("", queue.MaxCapacity+1, 0)
	require.True(t, errors.Is(err, syscall.EINVAL))
	q := mustQueue(t, 100, 0)
	require.Equal(t, queue.MinCapacity, q.Capacity(), "rounded up to the minimum")
}

func TestQueueBatches(t *testing.T) {
	q := mustQueue(t, 4096, 0)
	var recs []*message.Record
	for i := range 200 {
		recs = append(recs, bytesRecord([]byte{byte(i), 1, 2, 3, 4, 5, 6, 7, 8}))
	}
	n, err := q.PutMany(recs, time.Time{})
	require.NoError(t, err)
	require.Less(t, n, 200, "a 4 KiB ring does not hold 200 records of 32 bytes")
	require.Positive(t, n)
	require.Equal(t, n, qlen(t, q))

	buf := make([]byte, 4096)
	got, filled, err := q.GetMany(buf, 10, 0, time.Time{})
	require.NoError(t, err)
	require.Equal(t, 10, got)
	at := 0
	for i := range got {
		size := int(binary.LittleEndian.Uint32(buf[at:]))
		rec, err := message.DecodeRecord(buf[at : at+size])
		require.NoError(t, err)
		require.EqualValues(t, i, rec.Payload[0])
		at += size
	}
	require.Equal(t, filled, at)

	rest, _, err := q.GetMany(buf, 1000, 0, time.Now())
	require.NoError(t, err)
	require.Equal(t, n-10, rest)
	_, _, err = q.GetMany(buf, 1000, 0, time.Now())
	require.ErrorIs(t, err, queue.ErrEmpty)

	// The rest goes in once there is room again, in order.
	m, err := q.PutMany(recs[n:], time.Time{})
	require.NoError(t, err)
	payload, err := get(t, q, time.Time{})
	require.NoError(t, err)
	require.EqualValues(t, n, payload[0])
	require.Positive(t, m)
}

func TestQueueWaitNonEmpty(t *testing.T) {
	q := mustQueue(t, 4096, 0)
	start := time.Now()
	require.ErrorIs(t, q.WaitNonEmpty(time.Now().Add(30*time.Millisecond)), queue.ErrEmpty)
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "a timeout is honoured")
	require.NoError(t, q.Put(bytesRecord([]byte("a")), time.Time{}))
	require.NoError(t, q.WaitNonEmpty(time.Now()), "a message is there")
	require.Equal(t, 1, qlen(t, q), "and was not taken")
	_, err := get(t, q, time.Now())
	require.NoError(t, err)

	// Cancelled while blocked: woken at once.
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() { errs <- q.WaitNonEmptyContext(ctx) }()
	time.Sleep(30 * time.Millisecond)
	cancel()
	require.ErrorIs(t, <-errs, context.Canceled)
}

func TestQueueWaitNonEmptyPassesTheWakeUpOn(t *testing.T) {
	// A put into an empty queue wakes one waiter. When that is a waiter
	// that takes nothing, a Get blocked beside it must still wake, at once
	// rather than at its periodic re-check. A round in which the Get was
	// woken first (the waiter was not yet asleep, on a loaded machine)
	// shows nothing: the waiter then finds the queue empty again and times
	// out. Rounds go on until three showed the pass.
	q := mustQueue(t, 4096, 0)
	passed := 0
	for round := 0; passed < 3; round++ {
		require.Less(t, round, 30, "the waiter never slept before the Get")
		waited := make(chan error, 1)
		go func() { waited <- q.WaitNonEmpty(time.Now().Add(time.Second)) }()
		time.Sleep(20 * time.Millisecond) // the waiter sleeps first
		got := make(chan time.Time, 1)
		go func() {
			_, err := get(t, q, time.Now().Add(5*time.Second))
			if err == nil {
				got <- time.Now()
			}
			close(got)
		}()
		time.Sleep(20 * time.Millisecond)
		put := time.Now()
		require.NoError(t, q.Put(bytesRecord([]byte{byte(round)}), time.Time{}))
		at, ok := <-got
		require.True(t, ok, "the Get took the message")
		require.Less(t, at.Sub(put), 500*time.Millisecond, "round %d: the Get woke with the put", round)
		if err := <-waited; err == nil {
			passed++
		} else {
			require.ErrorIs(t, err, queue.ErrEmpty)
		}
	}
}

func TestQueueWaitNonEmptyEndsWithClose(t *testing.T) {
	q, err := queue.Create("", 4096, 0)
	require.NoError(t, err)
	errs := make(chan error, 1)
	go func() { errs <- q.WaitNonEmpty(time.Time{}) }()
	time.Sleep(30 * time.Millisecond)
	require.NoError(t, q.Close())
	require.ErrorIs(t, <-errs, queue.ErrClosed)
}

// resident returns the bytes of memory a segment file uses.
func resident(t *testing.T, q *queue.Queue) int64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(testenv.SegmentPath(q.Segment().Name()), &st))
	return st.Blocks * 512
}

func TestUnboundedQueueUsesTheMemoryOfWhatItHolds(t *testing.T) {
	testenv.SkipShort(t, "runs for seconds")
	q, err := queue.CreateUnbounded("", 0)
	require.NoError(t, err)
	buf := make([]byte, 1<<20)
	defer func() { require.NoError(t, q.Close()) }()
	require.True(t, q.Unbounded())
	require.Greater(t, q.Capacity(), 512<<20, "it takes messages of hundreds of megabytes")
	require.LessOrEqual(t, resident(t, q), int64(queue.WarmWindow+64<<10), "an empty queue uses its warm window")

	// With no consumer, it takes far more than a bounded queue's 16 MiB.
	payload := make([]byte, 100<<10)
	const held = 1000 // 100 MB
	for i := range held {
		binary.LittleEndian.PutUint64(payload, uint64(i))
		require.NoError(t, q.Put(bytesRecord(payload), time.Now()), "put %d", i)
	}
	require.Equal(t, held, qlen(t, q))
	require.Greater(t, resident(t, q), int64(held*100<<10))
	for i := range held {
		got, err := getInto(t, q, buf)
		require.NoError(t, err)
		require.EqualValues(t, i, binary.LittleEndian.Uint64(got))
	}
	require.Less(t, resident(t, q), int64(8<<20), "what its consumers took went back")

	// Two laps of the ring, a few messages in flight: the memory in use
	// stays that of the messages, and every one arrives whole.
	rng := rand.New(rand.NewPCG(3, 4))
	next, taken := 0, 0
	var peak int64
	for taken < 2*(1<<30)/(200<<10) {
		for qlen(t, q) < 8 {
			p := make([]byte, 8+rng.IntN(400<<10))
			binary.LittleEndian.PutUint64(p, uint64(next))
			p[len(p)-1] = byte(next)
			next++
			require.NoError(t, q.Put(bytesRecord(p), time.Now()))
		}
		got, err := getInto(t, q, buf)
		require.NoError(t, err)
		require.EqualValues(t, taken, binary.LittleEndian.Uint64(got))
		require.Equal(t, byte(taken), got[len(got)-1])
		taken++
		if taken%500 == 0 {
			peak = max(peak, resident(t, q))
		}
	}
	require.Less(t, peak, int64(24<<20), "8 messages of at most 400 KiB, and the chunks they lie in")

	require.ErrorIs(t, q.Put(bytesRecord(make([]byte, q.Capacity())), time.Now()), queue.ErrTooLarge)
}

func TestUnboundedQueueCyclesThroughItsWarmWindow(t *testing.T) {
	q, err := queue.CreateUnbounded("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	buf := make([]byte, 1<<20)
	window := int64(queue.WarmWindow)
	// A consumer that keeps up: 20 laps of the window, and never a page
	// past it.
	payload := make([]byte, 16<<10)
	for i := range 20 * queue.WarmWindow / len(payload) {
		binary.LittleEndian.PutUint64(payload, uint64(i))
		require.NoError(t, q.Put(bytesRecord(payload), time.Now()))
		got, err := getInto(t, q, buf)
		require.NoError(t, err)
		require.EqualValues(t, i, binary.LittleEndian.Uint64(got))
		require.Len(t, got, len(payload))
	}
	require.LessOrEqual(t, resident(t, q), window+64<<10, "the window's pages, over and over")
	// One that falls behind: the ring goes past the window, and back to it
	// once the consumer has caught up; every message arrives in order.
	next, taken := 0, 0
	put := func() {
		binary.LittleEndian.PutUint64(payload, uint64(next))
		next++
		require.NoError(t, q.Put(bytesRecord(payload), time.Now()))
	}
	take := func() {
		got, err := getInto(t, q, buf)
		require.NoError(t, err)
		require.EqualValues(t, taken, binary.LittleEndian.Uint64(got))
		taken++
	}
	for range 3 {
		for range 300 { // 4.8 MB: past the window
			put()
		}
		require.Greater(t, resident(t, q), window+2<<20)
		for qlen(t, q) > 0 {
			take()
		}
		for range 2 * queue.WarmWindow / len(payload) {
			put()
			take()
		}
		require.LessOrEqual(t, resident(t, q), window+2<<20, "back in the window, the rest given back")
	}
	require.Equal(t, next, taken)
}

func TestUnboundedQueueAcrossProcessesAndAttach(t *testing.T) {
	t.Parallel()
	q, err := queue.CreateUnbounded("", 3)
	require.NoError(t, err)
	buf := make([]byte, 1<<10)
	defer func() { require.NoError(t, q.Close()) }()
	other, err := queue.Attach(q.Segment().Name())
	require.NoError(t, err)
	defer func() { require.NoError(t, other.Close()) }()
	require.True(t, other.Unbounded())
	for i := range 3 {
		require.NoError(t, q.Put(bytesRecord([]byte{byte(i)}), time.Now()))
	}
	require.ErrorIs(t, q.Put(bytesRecord([]byte{3}), time.Now()), queue.ErrFull, "maxItems still bounds it")
	got, err := getInto(t, other, buf)
	require.NoError(t, err)
	require.Equal(t, []byte{0}, got)
}

// getInto takes one record into buf, without waiting, and returns its
// payload.
func getInto(t *testing.T, q *queue.Queue, buf []byte) ([]byte, error) {
	t.Helper()
	n, err := q.Get(buf, message.MaxDescriptors, time.Now())
	if err != nil {
		return nil, err
	}
	rec, err := message.DecodeRecord(buf[:n])
	require.NoError(t, err)
	return rec.Payload, nil
}

func TestQueueRoom(t *testing.T) {
	t.Parallel()
	q := mustQueue(t, 4096, 3)
	room := func() int {
		n, err := q.Room()
		require.NoError(t, err)
		return n
	}
	require.Equal(t, 4096, room())
	require.NoError(t, q.Put(bytesRecord(make([]byte, 1000)), time.Now()))
	require.Equal(t, 4096-1016, room())
	require.NoError(t, q.Put(bytesRecord(make([]byte, 4096-1016-16-16)), time.Now()))
	require.Equal(t, 16, room())
	require.ErrorIs(t, q.Put(bytesRecord([]byte{1}), time.Now()), queue.ErrFull, "a 24-byte record does not fit")
	require.NoError(t, q.Put(bytesRecord(nil), time.Now()), "a 16-byte one does")
	require.Equal(t, 0, room(), "three messages: the limit")

	u, err := queue.CreateUnbounded("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, u.Close()) }()
	n, err := u.Room()
	require.NoError(t, err)
	require.Equal(t, u.Capacity(), n)
}

// TestUnboundedQueueProducerCrossesASkipNoConsumerCameTo: right after a put
// that skipped to the next lap, with no get since, a producer fills the
// window and goes on past it: the skipped positions never make the queue
// full (docs/format.md, ring version 3). The consumer that empties the
// queue rewinds it only when the producers' lock is free: here it is held,
// as a producer at work would, so the producer skips.
func TestUnboundedQueueProducerCrossesASkipNoConsumerCameTo(t *testing.T) {
	q, err := queue.CreateUnbounded("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	data := q.Segment().Data()
	tail := func() uint32 { return uint32(binary.LittleEndian.Uint64(data[96:])) } // puts << 32 | tail
	putLock := lock.At(unsafe.Pointer(&data[64]))
	buf := make([]byte, 1<<20)
	payload := make([]byte, 48<<10)
	next, taken := 0, 0
	put := func() {
		binary.LittleEndian.PutUint64(payload, uint64(next))
		next++
		require.NoError(t, q.Put(bytesRecord(payload), time.Now()), "put %d", next-1)
	}
	take := func() {
		ok, err := putLock.TryLock()
		require.NoError(t, err)
		require.True(t, ok)
		got, err := getInto(t, q, buf)
		require.NoError(t, putLock.Unlock())
		require.NoError(t, err)
		require.EqualValues(t, taken, binary.LittleEndian.Uint64(got))
		taken++
	}
	skipped := false
	for range 10 * queue.WarmWindow / len(payload) {
		before := tail() &^ (1<<30 - 1)
		put()
		if tail()&^(1<<30-1) != before { // the record went to the next lap
			skipped = true
			break
		}
		take()
	}
	require.True(t, skipped, "a put skipped to the next lap")
	for range 200 { // 9.6 MB, with the skip still at the head
		put()
	}
	for taken < next {
		take()
	}
}
