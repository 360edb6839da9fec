package handover_test

// A put of a hand-off that times out, again and again, then lands with the
// same refs: each failed put ran no send (the counts in the ledger, their
// tickets unarmed), so the one that lands sends each count once, and the
// receiver is its one owner.

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/queue"
)

func TestAPutThatTimesOutThenLandsSendsEachCountOnce(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 4096, 1)
	bytesRecord(t, q, "full")
	rec1, r1 := tensor(t, p, 1)
	rec2, r2 := tensor(t, p, 5)
	rec := &message.Record{Type: message.TypePickle, Payload: []byte("two"), Descriptors: append(rec1.Descriptors, rec2.Descriptors...)}
	refs := []*buffer.Ref{r1, r2}
	forged := replayed(t, rec.Descriptors[1])
	for range 5 {
		sent, err := handover.Put(q, rec, refs, time.Now().Add(time.Millisecond))
		require.False(t, sent)
		require.ErrorIs(t, err, queue.ErrFull)
		for _, r := range refs {
			n, err := r.Holders()
			require.NoError(t, err)
			require.EqualValues(t, 1, n, "the count is the caller's still")
		}
		_, _, err = buffer.Adopt(&forged)
		require.ErrorIs(t, err, pool.ErrTaken, "a ticket of a put that timed out was armed")
	}
	getRaw(t, q, 0)
	sent, err := handover.Put(q, rec, refs, time.Now().Add(time.Second))
	require.NoError(t, err)
	require.True(t, sent)
	require.EqualValues(t, 2, p.Stats().SlotsInUse)
	m := take(t, q)
	require.NoError(t, m.Adopt())
	for _, v := range m.Views {
		n, err := v.Ref.Holders()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the receiver is the one owner")
	}
	require.NoError(t, m.Release())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}
