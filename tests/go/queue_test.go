package gotests

import (
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
	"github.com/zctipc/zctipc/go/dtype"
	"github.com/zctipc/zctipc/go/lock"
	"github.com/zctipc/zctipc/go/message"
	"github.com/zctipc/zctipc/go/pool"
	"github.com/zctipc/zctipc/go/queue"
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
	helpers["queue-produce"] = func(args []string) error {
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
	helpers["queue-consume"] = func(args []string) error {
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
	helpers["queue-hold-get-lock"] = func(args []string) error {
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
	helpers["queue-block-in-get"] = func(args []string) error {
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
	const producers, consumers, each = 4, 4, 20000
	q := mustQueue(t, 64<<10, 0)
	var cons []*helper
	for range consumers {
		cons = append(cons, startHelper(t, "queue-consume", q.Segment().Name(), strconv.Itoa(producers)))
	}
	var prods []*helper
	for i := range producers {
		prods = append(prods, startHelper(t, "queue-produce", q.Segment().Name(), strconv.Itoa(i), strconv.Itoa(each)))
	}
	for _, p := range prods {
		p.wait(t)
	}
	for range consumers {
		require.NoError(t, q.Put(bytesRecord([]byte{0}), time.Time{}))
	}
	total := make([]int, producers)
	for _, c := range cons {
		line := c.readLine(t)
		var got [producers]int
		_, err := fmt.Sscan(line, &got[0], &got[1], &got[2], &got[3])
		require.NoError(t, err)
		for i := range got {
			total[i] += got[i]
		}
		c.wait(t)
	}
	for i := range total {
		require.Equal(t, each, total[i], "every message of producer %d taken exactly once", i)
	}
	require.Zero(t, qlen(t, q))
}

func TestQueueSurvivesKilledConsumers(t *testing.T) {
	q := mustQueue(t, 4096, 0)
	name := q.Segment().Name()
	for i := range 3 {
		require.NoError(t, q.Put(bytesRecord([]byte{byte(i), 0}), time.Time{}))
	}
	// One killed while it holds the consumers' lock, one while blocked.
	holder := startHelper(t, "queue-hold-get-lock", name)
	require.Equal(t, "holding", holder.readLine(t))
	_, err := get(t, q, time.Now().Add(30*time.Millisecond))
	require.ErrorIs(t, err, queue.ErrEmpty, "the live holder keeps the lock")
	require.NoError(t, holder.cmd.Process.Signal(syscall.SIGKILL))
	require.Error(t, holder.cmd.Wait())
	for i := range 3 {
		got, err := get(t, q, time.Now().Add(5*time.Second))
		require.NoError(t, err)
		require.Equal(t, byte(i), got[0], "no message lost to the killed holder")
	}

	blocked := startHelper(t, "queue-block-in-get", name)
	require.Equal(t, "waiting", blocked.readLine(t))
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, blocked.cmd.Process.Signal(syscall.SIGKILL))
	require.Error(t, blocked.cmd.Wait())
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
	p := pool.New(16 << 20)
	defer p.Close()
	q, err := queue.Create("", 4096, 0)
	require.NoError(t, err)
	s, err := p.Alloc(100, time.Time{})
	require.NoError(t, err)
	d := message.Descriptor{Kind: message.RefSlot, DType: dtype.Uint8, Shape: []int64{100}, Strides: []int64{1},
		Name: s.Arena().Name(), NBytes: 100, Slot: s.Index, Generation: s.Generation}
	rec := &message.Record{Type: message.TypeTensor, Descriptors: []message.Descriptor{d}}
	require.NoError(t, q.Put(rec, time.Time{})) // the slot's count goes with the message
	require.EqualValues(t, 1, p.Stats().SlotsInUse)
	require.NoError(t, q.Close())
	require.EqualValues(t, 0, p.Stats().SlotsInUse, "the queue's last holder gave up the count its message carried")
	require.False(t, exists(q.Segment().Name()))
}

func TestQueueRefusesBadSizes(t *testing.T) {
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
