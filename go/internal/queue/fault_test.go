package queue_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
)

// A queue whose file another process of the user shrank: the data plane's
// steps fault inside C, and the calls of the Go API return the fault as an
// error (Note [a data plane the runtime never enters] in package plane),
// while a fault in Go code still panics into fault.Catch as before: the
// plane's handler hands every SIGBUS that is not its own to the runtime's.
func TestAShrunkQueueFaultsIntoAnError(t *testing.T) {
	for _, unbounded := range []bool{false, true} {
		t.Run(map[bool]string{false: "bounded", true: "unbounded"}[unbounded], func(t *testing.T) {
			var q *queue.Queue
			var err error
			if unbounded {
				q, err = queue.CreateUnbounded("", 0)
			} else {
				q, err = queue.Create("", 1<<16, 0)
			}
			require.NoError(t, err)
			require.NoError(t, q.Put(&message.Record{Type: message.TypeBytes, Payload: []byte("before")}, time.Time{}))
			path := filepath.Join(shm.Dir(), q.Segment().Name())
			require.NoError(t, os.Truncate(path, 0)) // the hostile process

			err = q.Put(&message.Record{Type: message.TypeBytes, Payload: []byte("after")}, time.Time{})
			require.ErrorIs(t, err, fault.ErrFault, "a put")
			_, err = q.Get(make([]byte, 4096), 0, time.Now())
			require.ErrorIs(t, err, fault.ErrFault, "a get")

			// The runtime's own handling of a fault in Go code is intact.
			data := q.Segment().Data()
			var sink uint64
			err = fault.Catch(func() error {
				sink = *(*uint64)(unsafe.Pointer(&data[0]))
				return nil
			})
			require.ErrorIs(t, err, fault.ErrFault, "a read in Go (it read %d)", sink)
			// Its count lay in the file: Close meets the fault in Go, as it did
			// before the plane; what is left goes with the file.
			_ = fault.Catch(q.Close)
			require.NoError(t, os.Remove(path))
		})
	}
}
