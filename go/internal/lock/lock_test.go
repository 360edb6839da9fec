package lock_test

import (
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/lock"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
)

// lockSegment returns a segment with a lock at 0 and a counter at 64.
func lockSegment(t *testing.T, name string) (*shm.Segment, lock.Mutex, *int64) {
	var seg *shm.Segment
	var err error
	if name == "" {
		seg, err = shm.Create("", header.KindTensor, dtype.Uint8, []int64{128})
	} else {
		seg, err = shm.Attach(name, header.KindTensor, false)
	}
	require.NoError(t, err)
	d := seg.Data()
	return seg, lock.At(unsafe.Pointer(&d[0])), (*int64)(unsafe.Pointer(&d[64]))
}

func init() {
	testenv.Helpers["lock-count"] = func(args []string) error {
		n, _ := strconv.Atoi(args[1])
		seg, err := shm.Attach(args[0], header.KindTensor, false)
		if err != nil {
			return err
		}
		d := seg.Data()
		m, counter := lock.At(unsafe.Pointer(&d[0])), (*int64)(unsafe.Pointer(&d[64]))
		for range n {
			if _, err := m.Lock(time.Time{}); err != nil {
				return err
			}
			*counter++ // a plain read-modify-write: only the lock makes it exact
			if err := m.Unlock(); err != nil {
				return err
			}
		}
		return seg.Close()
	}
	testenv.Helpers["lock-and-hang"] = func(args []string) error {
		seg, err := shm.Attach(args[0], header.KindTensor, false)
		if err != nil {
			return err
		}
		d := seg.Data()
		if _, err := lock.At(unsafe.Pointer(&d[0])).Lock(time.Time{}); err != nil {
			return err
		}
		fmt.Println("locked")
		select {} // killed here
	}
}

func TestLockExcludesAcrossProcessesAndGoroutines(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	seg, m, counter := lockSegment(t, "")
	defer seg.Close()
	const procs, each = 4, 5000
	workers := make([]*testenv.Helper, procs)
	for i := range workers {
		workers[i] = testenv.StartHelper(t, "lock-count", seg.Name(), strconv.Itoa(each))
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				_, err := m.Lock(time.Time{})
				if err != nil {
					t.Error(err)
					return
				}
				*counter++
				if err := m.Unlock(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, w := range workers {
		w.Wait(t)
	}
	require.EqualValues(t, (procs+2)*each, *counter)
}

func TestLockHeldByAKilledProcessIsTakenOver(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	seg, m, _ := lockSegment(t, "")
	defer seg.Close()
	h := testenv.StartHelper(t, "lock-and-hang", seg.Name())
	require.Equal(t, "locked", h.ReadLine(t))

	_, err := m.Lock(time.Now().Add(50 * time.Millisecond))
	require.ErrorIs(t, err, lock.ErrTimeout, "a live holder keeps the lock")

	require.NoError(t, h.Cmd.Process.Signal(syscall.SIGKILL))
	require.Error(t, h.Cmd.Wait())
	// The killed helper still counts as a holder of the segment; repairing
	// that is the cleanup daemon's work, not the lock's.
	_, err = seg.DropRef()
	require.NoError(t, err)
	recovered, err := m.Lock(time.Now().Add(5 * time.Second))
	require.NoError(t, err)
	require.True(t, recovered, "the lock of a dead holder is taken over, and the taker is told")
	require.NoError(t, m.Unlock())
	recovered, err = m.Lock(time.Time{})
	require.NoError(t, err)
	require.False(t, recovered)
	require.NoError(t, m.Unlock())
}
