package handover_test

// Attacks on a put that waits with the counts it hands over in the ledger
// (package buffer, Note [counts that wait]): a forged record with the
// waiting put's descriptor taken while the put waits, and in the window
// of one of its tries.

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
	m := take(t, q)
	require.NoError(t, m.Adopt())
	n, err := m.Views[0].Ref.Holders()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, _, err = buffer.Adopt(&forged)
	require.ErrorIs(t, err, pool.ErrTaken, "the replay after the receiver's take")
	require.NoError(t, m.Release())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

// A forged record taken in the window of one try of a put (its ticket
// armed, the put lock found held by another putter: Busy) takes the
// count: the put then reports ErrTaken and puts nothing, and the caller's
// release of its ref, as every caller of a put that did not send does,
// gives up nothing of the count the forger holds now.
func TestATakeInATrysWindowIsReportedAndNotGivenUpTwice(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 4096, 0)
	rec, r := tensor(t, p, 3)
	forged := replayed(t, rec.Descriptors[0])
	putLock := lock.At(unsafe.Pointer(&q.Segment().Data()[64]))
	ok, err := putLock.TryLock()
	require.NoError(t, err)
	require.True(t, ok)
	var forger *buffer.Ref
	var ferr error
	sent, err := buffer.SendWaiting([]*buffer.Ref{r}, func(send func(), unsend func() error) error {
		return q.PutHanding(rec, time.Now().Add(time.Second), queue.Handing{
			Send: func() {
				send()
				if forger == nil && ferr == nil {
					forger, _, ferr = buffer.Adopt(&forged) // in the try's window
				}
			},
			Unsend: unsend,
		})
	})
	require.NoError(t, putLock.Unlock())
	require.NoError(t, ferr, "the forged record was taken while the ticket was armed")
	require.False(t, sent)
	require.ErrorIs(t, err, pool.ErrTaken)
	require.Zero(t, qlen(t, q), "nothing was put")
	n, herr := forger.Holders()
	require.NoError(t, herr)
	require.EqualValues(t, 1, n)

	_ = r.Release() // the caller's, as for any put that did not send; it may say why
	n, herr = forger.Holders()
	require.NoError(t, herr)
	require.EqualValues(t, 1, n, "the caller's release gave up the count the forger holds")
	require.EqualValues(t, 1, p.Stats().SlotsInUse)
	require.NoError(t, forger.Release())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
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
