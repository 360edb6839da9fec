package queue_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
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
			q := boundedOrNot(t, unbounded)
			require.NoError(t, q.Put(&message.Record{Type: message.TypeBytes, Payload: []byte("before")}, time.Time{}))
			path := filepath.Join(shm.Dir(), q.Segment().Name())
			require.NoError(t, os.Truncate(path, 0)) // the hostile process

			err := q.Put(&message.Record{Type: message.TypeBytes, Payload: []byte("after")}, time.Time{})
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

// A queue's file cut after its words and the first page of its ring: a
// put or get whose record lies past the cut faults inside its step while
// it holds a lock (the get of an unbounded queue, both: it faults in the
// rewind that follows its commit). The step lets its locks go (Note [a
// step that faults lets its locks go] in package plane): a lock its own
// live process held would never be taken over, and every later call would
// wait for it, this process's own first. So each later call faults at
// once, as the first did, and the message before the cut is taken.
func TestAQueueCutUnderItsRingLetsItsLocksGo(t *testing.T) {
	const ringAt, page = 512, 4096
	payload := make([]byte, 1000)
	for _, unbounded := range []bool{false, true} {
		t.Run(map[bool]string{false: "bounded", true: "unbounded"}[unbounded], func(t *testing.T) {
			q := boundedOrNot(t, unbounded)
			data := q.Segment().Data()
			dataAt := q.Segment().Header().DataOffset
			locksFree := func(when string) {
				require.Zero(t, atomic.LoadUint32((*uint32)(unsafe.Pointer(&data[64]))), "the put lock, %s", when)
				require.Zero(t, atomic.LoadUint32((*uint32)(unsafe.Pointer(&data[128]))), "the get lock, %s", when)
			}
			// The cut falls at a record's end: the bounded queue's records
			// go on past it; the unbounded queue's one record is all there
			// is, and its rewind writes a skip record right at the cut.
			cut := (dataAt + ringAt + 2*page) &^ (page - 1)
			first := int(cut - dataAt - ringAt - message.RecordHeaderSize)
			require.NoError(t, q.Put(&message.Record{Type: message.TypeBytes, Payload: make([]byte, first)}, time.Time{}))
			if !unbounded {
				for range 10 {
					require.NoError(t, q.Put(&message.Record{Type: message.TypeBytes, Payload: payload}, time.Time{}))
				}
			}
			path := filepath.Join(shm.Dir(), q.Segment().Name())
			require.NoError(t, os.Truncate(path, int64(cut))) // the hostile process

			for i := range 3 {
				err := q.Put(&message.Record{Type: message.TypeBytes, Payload: payload}, time.Now().Add(time.Second))
				require.ErrorIs(t, err, fault.ErrFault, "put %d", i)
				locksFree("after a put that faulted")
			}
			buf := make([]byte, 1<<16)
			n, err := q.Get(buf, 0, time.Now().Add(time.Second))
			if unbounded {
				require.ErrorIs(t, err, fault.ErrFault, "the get whose rewind faulted")
			} else {
				require.NoError(t, err)
				require.Equal(t, cut-dataAt-ringAt, uint64(n), "the record before the cut")
			}
			locksFree("after the first get")
			for i := range 3 {
				_, err := q.Get(buf, 0, time.Now().Add(100*time.Millisecond))
				if unbounded {
					require.ErrorIs(t, err, queue.ErrEmpty, "get %d: the rewind's skip was never committed", i)
				} else {
					require.ErrorIs(t, err, fault.ErrFault, "get %d", i)
				}
				locksFree("after a get")
			}
			_ = fault.Catch(q.Close) // which may remove the file: its count lies before the cut
			if err := os.Remove(path); !errors.Is(err, fs.ErrNotExist) {
				require.NoError(t, err)
			}
		})
	}
}

// boundedOrNot makes an unbounded queue, or a bounded one of 64 KiB.
func boundedOrNot(t *testing.T, unbounded bool) *queue.Queue {
	t.Helper()
	var q *queue.Queue
	var err error
	if unbounded {
		q, err = queue.CreateUnbounded("", 0)
	} else {
		q, err = queue.Create("", 1<<16, 0)
	}
	require.NoError(t, err)
	return q
}
