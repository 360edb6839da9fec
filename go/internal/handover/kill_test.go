package handover_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/gc"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/ledger"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/testenv"
)

func init() {
	// handover-forward-waiting keeps a ledger, takes the tensor message of
	// queue args[0] (a count on a slot of another process's pool), and
	// forwards it into queue args[1], which is full: it prints "waiting"
	// and waits for room until it is killed.
	testenv.Helpers["handover-forward-waiting"] = func(args []string) error {
		if _, err := ledger.Enable(); err != nil {
			return err
		}
		in, err := queue.Attach(args[0])
		if err != nil {
			return err
		}
		out, err := queue.Attach(args[1])
		if err != nil {
			return err
		}
		buf := make([]byte, 4096)
		n, err := in.Get(buf, message.MaxDescriptors, time.Now().Add(10*time.Second))
		if err != nil {
			return err
		}
		var m handover.Message
		if err := m.Decode(buf[:n]); err != nil {
			return err
		}
		if err := m.Adopt(); err != nil {
			return err
		}
		r := m.Views[0].Ref
		d, err := r.Describe(0, dtype.Float32, []int64{4}, []int64{4}, 0)
		if err != nil {
			return err
		}
		fmt.Println("waiting")
		rec := &message.Record{Type: message.TypeTensor, Descriptors: []message.Descriptor{d}}
		_, err = handover.Put(out, rec, []*buffer.Ref{r}, time.Time{})
		return errors.Join(errors.New("the put into a full queue returned"), err)
	}
}

// A forwarder killed while its put of a hand-off waits for room on a full
// queue: the count it was sending is in its ledger (package buffer, Note
// [counts that wait]), so the sweep of its ledger gives it up, and the
// pool's owner ends with no slot in use. (The count left the ledger before
// the wait, and the slot stayed in use for as long as its pool lived.)
func TestAForwarderKilledWhileItsPutWaitsLeaksNoSlot(t *testing.T) {
	p := mustPool(t)
	in := mustQueue(t, 4096, 0)
	out := mustQueue(t, 4096, 1)
	bytesRecord(t, out, "full")
	putTensor(t, p, in, 2)
	h := testenv.StartHelper(t, "handover-forward-waiting", in.Segment().Name(), out.Segment().Name())
	require.Equal(t, "waiting", h.ReadLine(t))
	time.Sleep(20 * time.Millisecond) // let it wait (not asserted: a kill before the wait must leak nothing either)
	testenv.Kill(t, h)
	require.EqualValues(t, 1, p.Stats().SlotsInUse, "the killed forwarder's count")
	self, err := proc.Self()
	require.NoError(t, err)
	rep, err := gc.Collect(self, gc.Options{Confirm: 20 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, rep.Ledgers, 1, "the forwarder's ledger was swept")
	require.EqualValues(t, 0, p.Stats().SlotsInUse, "the count of a killed put that waited leaked")
	require.Equal(t, 1, qlen(t, out), "nothing was put")
	require.Zero(t, qlen(t, in))
}
