package gc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/daemontest"
	"github.com/zctipc/zctipc/go/internal/gc"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"github.com/zctipc/zctipc/go/zctipc"
)

func init() {
	// queue-holding-tensor makes a tensor and a queue, puts the tensor in
	// the queue (the message holds a count on it), lets go of its own
	// handle on the tensor unless told to keep it, prints both names and
	// waits to be killed. It keeps no ledger.
	testenv.Helpers["queue-holding-tensor"] = func(args []string) error {
		x, err := zctipc.NewTensor("", zctipc.Int64, 1000)
		if err != nil {
			return err
		}
		q, err := zctipc.NewQueue("", 1<<16)
		if err != nil {
			return err
		}
		if err := q.PutTensor(context.Background(), x); err != nil {
			return err
		}
		fmt.Println(q.Name(), x.Name())
		_, err = testenv.StdinLine()
		return err
	}
}

// A process killed while its queue held a count on its tensor leaves both:
// one `zctipc gc` removes both (the queue's removal gives up what its
// messages held, and the collection goes on), and its dry run lists both.
func TestCollectRemovesWhatRemovedQueuesHeldInOnePass(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	self, err := proc.Self()
	require.NoError(t, err)
	h := testenv.StartHelper(t, "queue-holding-tensor")
	names := strings.Fields(h.ReadLine(t))
	require.Len(t, names, 2)
	testenv.Kill(t, h)
	for _, n := range names {
		require.True(t, testenv.Exists(n), n)
	}
	dry, err := gc.Collect(self, gc.Options{DryRun: true})
	require.NoError(t, err)
	require.Subset(t, removedNames(dry), names, "the dry run lists what the collection removes")
	for _, n := range names {
		require.True(t, testenv.Exists(n), "a dry run removes nothing: %s", n)
	}
	before := daemontest.DirNames(t)
	rep, err := gc.Collect(self, gc.Options{Confirm: 20 * time.Millisecond})
	require.NoError(t, err)
	for _, n := range names {
		require.False(t, testenv.Exists(n), "%s is still there after one collection: %+v", n, rep)
	}
	after := map[string]bool{}
	for _, n := range daemontest.DirNames(t) {
		after[n] = true
	}
	var gone []string
	for _, n := range before {
		if !after[n] {
			gone = append(gone, n)
		}
	}
	require.ElementsMatch(t, gone, removedNames(dry), "the dry run listed exactly what went (the queue, the tensor, the ticket arena)")
	require.ElementsMatch(t, gone, removedNames(rep), "the collection reports what went")
}
