package queue_test

// Attacks on a put that hands counts over (PutSending; package buffer,
// Note [counts that wait]): its step runs its sends (a ticket armed) only
// once it put the record, whatever made it wait first (the lock, no room,
// pages a killed consumer left), and never for a put that returns an
// error.
//
// And on the put step's sends (plane.Send; package buffer, Note
// [counts that wait]) below PutSending: a put of many records runs the
// sends of those it commits and no others; a send of a ticket past its
// arena is refused before anything is done; a ticket arena whose file
// shrank faults before any count changes hands.

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/queue"
	"golang.org/x/sys/unix"
)

// tickets is an arena of n ticket words of a test's own, outside Go's
// heap (a plane.Send may hold no Go pointer), which a put's sends arm.
type tickets struct {
	mem   []byte
	arena plane.Arena
}

func newTickets(t *testing.T, n int) *tickets {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, (n*8+4095)&^4095, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, unix.Munmap(mem)) })
	return &tickets{mem: mem, arena: plane.NewArena(unsafe.Pointer(&mem[0]), 8, 0, uint32(n))}
}

// send returns the send of ticket i, with a nonce of its own.
func (k *tickets) send(i int) []plane.Send {
	return []plane.Send{plane.NewSend(nil, -1, &k.arena, uint32(i), uint64(i)<<1|1)}
}

// armed reports whether ticket i holds its nonce: its put ran its send.
func (k *tickets) armed(i int) bool {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&k.mem[i*8]))) == uint64(i)<<1|1
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
// room past head catches up and lands. A put that hands counts over must
// do the same, and run its sends once it lands: no consumer is left to
// wake a put that waited instead, and the queue is empty. (Such a put
// once looked for room without the put lock before it armed anything, and
// a look that said "wait" where the put would catch up left it waiting
// until its deadline, for ever with none, while a Put of the same record
// landed at once.)
func TestAPutSendingCatchesUpAfterAKilledConsumer(t *testing.T) {
	rec := bytesRecord(make([]byte, 4<<20)) // room past head, none past given_back
	t.Run("Put", func(t *testing.T) {
		q := sparseQueue(t)
		head := killedBeforeGiveBack(t, q)
		require.NoError(t, q.Put(rec, time.Now().Add(300*time.Millisecond)))
		require.Equal(t, head&^(2<<20-1), ringWord32(q, offGivenBack), "the put caught up")
	})
	t.Run("PutSending", func(t *testing.T) {
		q := sparseQueue(t)
		head := killedBeforeGiveBack(t, q)
		k := newTickets(t, 1)
		err := q.PutSending(rec, time.Now().Add(300*time.Millisecond), k.send(0))
		require.NoError(t, err, "a put that would catch up waited for a wake-up no one sends")
		require.True(t, k.armed(0), "the record is in the queue: its counts are sent")
		require.Equal(t, 1, qlen(t, q))
		require.Equal(t, head&^(2<<20-1), ringWord32(q, offGivenBack), "the put caught up")
	})
	t.Run("PutSendingContext", func(t *testing.T) {
		q := sparseQueue(t)
		killedBeforeGiveBack(t, q)
		k := newTickets(t, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		require.NoError(t, q.PutSendingContext(ctx, rec, k.send(0)), "a put that would catch up waited for a wake-up no one sends")
		require.True(t, k.armed(0))
	})
}

// A put that hands counts over into a full queue, or one whose lock
// another holds, has armed nothing while it waits, nor once its wait ended
// without a put; it arms its tickets as it lands.
func TestAPutSendingArmsNothingWhileItWaits(t *testing.T) {
	for _, why := range []string{"full", "locked"} {
		t.Run(why, func(t *testing.T) {
			q := mustQueue(t, 4096, 1)
			var release func()
			if why == "full" {
				require.NoError(t, q.Put(bytesRecord([]byte("full")), time.Now()))
				release = func() { _, err := getInto(t, q, make([]byte, 4096)); require.NoError(t, err) }
			} else {
				putLock := lockAt(q, 64)
				ok, err := putLock.TryLock()
				require.NoError(t, err)
				require.True(t, ok)
				release = func() { require.NoError(t, putLock.Unlock()) }
			}
			k := newTickets(t, 2)
			rec := bytesRecord([]byte("sent"))
			require.ErrorIs(t, q.PutSending(rec, time.Now().Add(20*time.Millisecond), k.send(0)), queue.ErrFull)
			require.False(t, k.armed(0), "a put that did not land armed its ticket")
			done := make(chan error, 1)
			go func() { done <- q.PutSending(rec, time.Time{}, k.send(1)) }()
			for range 5 {
				time.Sleep(2 * time.Millisecond)
				require.False(t, k.armed(1), "a waiting put armed its ticket")
			}
			release()
			require.NoError(t, <-done)
			require.True(t, k.armed(1), "a put that landed did not arm its ticket")
			require.False(t, k.armed(0))
		})
	}
}

// Many putters of records that hand counts over, on a queue of two
// messages, with deadlines that pass and contexts that are cancelled, and
// a consumer that takes now and then: the put lock is contended (Busy),
// the queue is full (Wait) and room comes. After every return, the counts
// are sent exactly when the record was put: the ticket is armed when the
// put returned no error, and untouched when it returned one.
func TestPutSendingSendsExactlyWhatItPuts(t *testing.T) {
	q := mustQueue(t, 4096, 2)
	const putters, each = 6, 40
	k := newTickets(t, putters*each)
	var mu sync.Mutex
	put := 0
	var wg sync.WaitGroup
	for i := range putters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for j := range each {
				n := i*each + j
				rec := bytesRecord([]byte{byte(i), byte(j)})
				var err error
				wait := time.Duration(rng.IntN(3)) * time.Millisecond
				switch rng.IntN(3) {
				case 0:
					err = q.PutSending(rec, time.Now().Add(wait), k.send(n))
				case 1:
					ctx, cancel := context.WithTimeout(context.Background(), wait)
					err = q.PutSendingContext(ctx, rec, k.send(n))
					cancel()
				default:
					ctx, cancel := context.WithCancel(context.Background())
					time.AfterFunc(wait, cancel)
					err = q.PutSendingContext(ctx, rec, k.send(n))
					cancel()
				}
				if k.armed(n) != (err == nil) {
					t.Errorf("putter %d, put %d: sent %v with error %v", i, j, k.armed(n), err)
					return
				}
				if err != nil && !errors.Is(err, queue.ErrFull) && !errors.Is(err, context.Canceled) &&
					!errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("putter %d, put %d: %v", i, j, err)
					return
				}
				if err == nil {
					mu.Lock()
					put++
					mu.Unlock()
				}
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
	t.Logf("%d of %d put", put, putters*each)
}

// parts returns n bytes records for the plane's put, record i carrying
// sends[i].
func parts(n int, sends func(i int) []plane.Send) []plane.Record {
	recs := make([]plane.Record, n)
	for i := range recs {
		rec := bytesRecord([]byte{byte(i), 1, 2, 3})
		prefix, payload := rec.Parts()
		recs[i] = plane.Record{Prefix: prefix, Payload: payload, Size: uint32(rec.Size()), Sends: sends(i)}
	}
	return recs
}

// A put of five records, each handing a count over, into a queue with
// room for three: the three it commits have their tickets armed, and the
// two that did not fit none (their counts are their senders' still).
func TestAPutOfManyRunsOnlyTheSendsOfThoseItCommits(t *testing.T) {
	q := mustQueue(t, 4096, 3)
	k := newTickets(t, 10)
	recs := parts(5, func(i int) []plane.Send {
		// Two counts a record: tickets 2i and 2i+1.
		return append(k.send(2*i), k.send(2*i+1)...)
	})
	var out plane.Out
	require.Equal(t, plane.OK, queue.PlaneOf(q).Put(recs, 0, &out))
	require.Equal(t, 3, plane.Count(&out))
	for i := range 10 {
		require.Equal(t, i < 6, k.armed(i), "ticket %d", i)
	}
	require.Equal(t, 3, qlen(t, q))
	// The rest, put again once there is room, arm theirs then.
	_, err := getInto(t, q, make([]byte, 4096))
	require.NoError(t, err)
	require.Equal(t, plane.OK, queue.PlaneOf(q).Put(recs[3:], 0, &out))
	require.Equal(t, 1, plane.Count(&out))
	require.True(t, k.armed(6) && k.armed(7))
	require.False(t, k.armed(8) || k.armed(9))
}

// A send whose ticket lies past its arena's slots, in any record of the
// put, is refused (Range) before anything is done: no record put, no
// ticket armed, the put lock free for the next put.
func TestASendPastItsArenaIsRefusedBeforeAnything(t *testing.T) {
	q := mustQueue(t, 4096, 0)
	k := newTickets(t, 4)
	past := plane.NewSend(nil, -1, &k.arena, 4, 99)
	small := plane.NewArena(unsafe.Pointer(&k.mem[0]), 4, 0, 4) // slots too small for a ticket
	tooSmall := plane.NewSend(nil, -1, &small, 0, 99)
	for _, bad := range []plane.Send{past, tooSmall} {
		recs := parts(3, func(i int) []plane.Send {
			if i == 2 {
				return append(k.send(i), bad)
			}
			return k.send(i)
		})
		var out plane.Out
		require.Equal(t, plane.Range, queue.PlaneOf(q).Put(recs, 0, &out))
		for i := range 4 {
			require.False(t, k.armed(i), "ticket %d", i)
		}
		require.Zero(t, qlen(t, q))
		err := q.PutSending(bytesRecord([]byte("x")), time.Now(), []plane.Send{bad})
		require.Error(t, err)
		require.Zero(t, qlen(t, q))
	}
	require.NoError(t, q.PutSending(bytesRecord([]byte("x")), time.Now(), k.send(3)), "the put lock is free")
	require.True(t, k.armed(3))
}

// A ticket arena whose file shrank under the put faults in the reads of
// its ticket words, before any send runs: a plain fault (not
// ErrSendsFaulted, whose counts would be lost), nothing put, no ticket of
// a mapped arena armed, and the put lock let go.
func TestAShrunkTicketArenaFaultsBeforeAnySend(t *testing.T) {
	q := mustQueue(t, 4096, 0)
	fd, err := unix.MemfdCreate("tickets", 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Ftruncate(fd, 4096))
	mem, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer func() { require.NoError(t, unix.Munmap(mem)) }()
	shrunk := plane.NewArena(unsafe.Pointer(&mem[0]), 8, 0, 4)
	require.NoError(t, unix.Ftruncate(fd, 0))
	k := newTickets(t, 2)
	// The good send first: it must not run when a later one faults.
	recs := parts(2, func(i int) []plane.Send {
		if i == 1 {
			return []plane.Send{plane.NewSend(nil, -1, &shrunk, 1, 5)}
		}
		return k.send(0)
	})
	var out plane.Out
	require.Equal(t, plane.Fault, queue.PlaneOf(q).Put(recs, 0, &out))
	_, _, what := plane.Need(&out)
	require.NotEqual(t, plane.InSends, what, "the fault came before any count changed hands")
	require.False(t, k.armed(0))
	require.Zero(t, qlen(t, q))
	err = q.PutSending(bytesRecord([]byte("x")), time.Now(), []plane.Send{plane.NewSend(nil, -1, &shrunk, 0, 5)})
	require.Error(t, err)
	require.NotErrorIs(t, err, queue.ErrSendsFaulted)
	require.Zero(t, qlen(t, q))
	require.NoError(t, q.PutSending(bytesRecord([]byte("x")), time.Now(), k.send(1)), "the put lock was let go")
	require.True(t, k.armed(1))
}
