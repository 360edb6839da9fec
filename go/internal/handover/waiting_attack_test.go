package handover_test

// Attacks on a put that waits with the counts it hands over in the ledger
// (package buffer, Note [counts that wait]): a forged record with the
// waiting put's descriptor taken while the put waits for room, or for the
// put lock, and a queue closed under it.

import (
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/lock"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/queue"
)

// replayed returns descriptor d as a receiver of a forged record reads it:
// its bytes, decoded.
func replayed(t *testing.T, d message.Descriptor) message.Descriptor {
	t.Helper()
	rec := message.Record{Type: message.TypeTensor, Descriptors: []message.Descriptor{d}}
	raw := make([]byte, rec.Size())
	rec.Encode(raw)
	got, err := message.DecodeRecord(raw)
	require.NoError(t, err)
	return got.Descriptors[0]
}

// A put that waits for room has its tickets disarmed: a record replayed
// with its descriptor and taken meanwhile takes nothing (ErrTaken), and
// once room comes the put lands and its receiver is the one owner.
func TestAForgedTakeWhileAPutWaitsTakesNothing(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 4096, 1)
	bytesRecord(t, q, "full")
	rec, r := tensor(t, p, 3)
	forged := replayed(t, rec.Descriptors[0])
	done := make(chan error, 1)
	go func() {
		sent, err := handover.Put(q, rec, []*buffer.Ref{r}, time.Time{})
		if err == nil && !sent {
			err = errors.New("not sent, and no error")
		}
		done <- err
	}()
	for range 10 { // while it waits (or before it starts: the same)
		time.Sleep(2 * time.Millisecond)
		_, _, err := buffer.Adopt(&forged)
		require.ErrorIs(t, err, pool.ErrTaken, "a forged record took the count of a waiting put")
		require.ErrorIs(t, buffer.Drop(&forged), pool.ErrTaken, "nor gave it up")
		require.EqualValues(t, 1, p.Stats().SlotsInUse)
	}
	getRaw(t, q, 0)
	require.NoError(t, <-done)
	receivedOnce(t, q, p, &forged)
}

// A put that finds the put lock held by another putter (Busy) waits for
// the lock, as one that finds no room waits for room, without having armed
// anything: its put step runs the sends only once it holds the lock and
// found room (Note [counts that wait]). A forged record replayed with its
// descriptor and taken meanwhile takes nothing (ErrTaken), and the count
// stays in the sender's ledger. (Each try used to arm the ticket before it
// met the lock, and a forged take in that window took the count: the put
// then reported ErrTaken.) One whose wait ends without the lock puts
// nothing and leaves the count the caller's, to release; one that gets the
// lock lands, and its receiver is the one owner.
func TestATakeWhileAPutWaitsForTheLockTakesNothing(t *testing.T) {
	for _, lands := range []bool{false, true} {
		name := map[bool]string{false: "deadline", true: "lands"}[lands]
		t.Run(name, func(t *testing.T) {
			ledgerOn := withLedger(t)
			p := mustPool(t)
			q := mustQueue(t, 4096, 0)
			rec, r := tensor(t, p, 3)
			holds := ledgerOn(rec.Descriptors[0])
			forged := replayed(t, rec.Descriptors[0])
			putLock := lock.At(unsafe.Pointer(&q.Segment().Data()[64]))
			ok, err := putLock.TryLock()
			require.NoError(t, err)
			require.True(t, ok)
			type result struct {
				sent bool
				err  error
			}
			done := make(chan result, 1)
			deadline := time.Now().Add(200 * time.Millisecond)
			if lands {
				deadline = time.Time{}
			}
			go func() {
				sent, err := handover.Put(q, rec, []*buffer.Ref{r}, deadline)
				done <- result{sent, err}
			}()
			for range 5 { // while it waits for the lock (or before it starts: the same)
				time.Sleep(2 * time.Millisecond)
				_, _, err := buffer.Adopt(&forged)
				require.ErrorIs(t, err, pool.ErrTaken, "a forged record took the count of a put waiting for the lock")
				require.True(t, holds(), "the count of a put waiting for the lock left the ledger")
				require.EqualValues(t, 1, p.Stats().SlotsInUse)
			}
			if !lands {
				res := <-done
				require.NoError(t, putLock.Unlock())
				require.False(t, res.sent)
				require.ErrorIs(t, res.err, queue.ErrFull)
				require.Zero(t, qlen(t, q), "nothing was put")
				require.True(t, holds(), "the count of a put that did not send left the ledger")
				_, _, err = buffer.Adopt(&forged)
				require.ErrorIs(t, err, pool.ErrTaken, "the ticket of a put that did not send is armed")
				require.NoError(t, r.Release())
				require.False(t, holds())
				require.EqualValues(t, 0, p.Stats().SlotsInUse)
				return
			}
			require.NoError(t, putLock.Unlock())
			res := <-done
			require.NoError(t, res.err)
			require.True(t, res.sent)
			require.False(t, holds(), "a count the message holds is still in the ledger")
			receivedOnce(t, q, p, &forged)
		})
	}
}

// A queue closed while a put of a hand-off waits for room: the put returns
// ErrClosed and sends nothing, the count stays the caller's and in its
// ledger all the while, and its release leaves no slot in use.
func TestAQueueClosedWhileAPutWaitsLeavesTheCountsTheCallers(t *testing.T) {
	ledgerOn := withLedger(t)
	p := mustPool(t)
	q, err := queue.Create("", 4096, 1)
	require.NoError(t, err)
	bytesRecord(t, q, "full")
	rec, r := tensor(t, p, 9)
	d := rec.Descriptors[0]
	holds := ledgerOn(d)
	type result struct {
		sent bool
		err  error
	}
	done := make(chan result, 1)
	go func() {
		sent, err := handover.Put(q, rec, []*buffer.Ref{r}, time.Time{})
		done <- result{sent, err}
	}()
	time.Sleep(10 * time.Millisecond) // let it wait (not asserted)
	require.True(t, holds(), "the count a waiting put sends left the ledger")
	require.NoError(t, q.Close())
	res := <-done
	require.False(t, res.sent)
	require.ErrorIs(t, res.err, queue.ErrClosed)
	require.True(t, holds(), "the count of a put that did not send is not in the ledger")
	forged := replayed(t, d)
	_, _, err = buffer.Adopt(&forged)
	require.ErrorIs(t, err, pool.ErrTaken, "the ticket of a put that did not send is armed")
	require.NoError(t, r.Release())
	require.False(t, holds())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

// receivedOnce takes the hand-off at the head of q, whose receiver must be
// its count's only holder; forged, a copy of its descriptor, is then
// refused, and the receiver's release leaves no slot of p in use.
func receivedOnce(t *testing.T, q *queue.Queue, p *pool.Pool, forged *message.Descriptor) {
	t.Helper()
	m := take(t, q)
	require.NoError(t, m.Adopt())
	n, err := m.Views[0].Ref.Holders()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, _, err = buffer.Adopt(forged)
	require.ErrorIs(t, err, pool.ErrTaken, "the replay after the receiver's take")
	require.NoError(t, m.Release())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}
