package buffer_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/pool"
)

// A descriptor taken between Send's arm and a publish that then fails (by
// a record forged with its bytes, in the window before the publish) takes
// the count with it: Send fails with ErrTaken, and the caller's release of
// its ref, as every caller of a publish that failed does, gives up nothing
// of the taker's count, nor its ticket's slot; the ref describes nothing
// more. (The release gave up the count the taker held: its slot was freed
// under it, its segment's count dropped twice.) A queue put has no such
// window while it waits: its put step arms the ticket only once the record
// goes in (Note [counts that wait]; package handover's
// TestAForgedTakeWhileAPutWaitsTakesNothing).
func TestATicketTakenBeforeAFailedPublishIsTheTakers(t *testing.T) {
	for _, kind := range []string{"slot", "segment"} {
		t.Run(kind, func(t *testing.T) {
			p := pool.New(16 << 20)
			defer func() { require.NoError(t, p.Close()) }()
			r := newRef(t, p, kind)
			d, err := r.Describe(0, dtype.Uint8, []int64{64}, []int64{1}, 0)
			require.NoError(t, err)
			var taker *buffer.Ref
			failed := errors.New("the publish failed")
			sent, err := buffer.Send([]*buffer.Ref{r}, func() error {
				var terr error
				taker, _, terr = buffer.Adopt(&d)
				require.NoError(t, terr, "an armed ticket is taken")
				return failed
			})
			require.False(t, sent)
			require.ErrorIs(t, err, failed)
			require.ErrorIs(t, err, buffer.ErrTaken)
			before, err := taker.Holders()
			require.NoError(t, err)

			require.NoError(t, r.Release())
			n, err := taker.Holders()
			require.NoError(t, err)
			require.Equal(t, before, n, "the caller's release gave up the taker's count")
			_, err = r.Describe(0, dtype.Uint8, []int64{64}, []int64{1}, 0)
			require.ErrorIs(t, err, buffer.ErrTaken, "a ref whose count was taken describes it again")
			_, _, err = buffer.Adopt(&d)
			require.ErrorIs(t, err, buffer.ErrTaken, "a second take")
			require.NoError(t, taker.Release())
			require.Zero(t, p.Stats().SlotsInUse)
		})
	}
}
