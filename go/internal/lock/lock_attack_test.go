package lock_test

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/lock"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

func init() {
	if os.Getenv(testenv.HelperEnv) == "lock-then-leader-exits" {
		// Keeps the main goroutine on the main thread (the thread group's
		// leader), which the helper ends.
		runtime.LockOSThread()
	}
	// lock-then-leader-exits takes the lock from another thread, then ends
	// its main thread (the thread group's leader): /proc shows the process
	// as a zombie while the thread that holds the lock runs on. It prints
	// "locked" once /proc shows it so; told "unlock", it lets the lock go,
	// prints "unlocked" and exits.
	testenv.Helpers["lock-then-leader-exits"] = func(args []string) error {
		if unix.Gettid() != os.Getpid() {
			return errors.New("not on the main thread")
		}
		// The ended thread's P stays held: a garbage collection would wait
		// for it for ever.
		debug.SetGCPercent(-1)
		runtime.GOMAXPROCS(4)
		go func() {
			fail := func(err error) { fmt.Println(err); os.Exit(1) }
			seg, err := shm.Attach(args[0], header.KindTensor, false)
			if err != nil {
				fail(err)
			}
			d := seg.Data()
			m := lock.At(unsafe.Pointer(&d[0]))
			if _, err := m.Lock(time.Time{}); err != nil {
				fail(err)
			}
			for {
				stat, err := os.ReadFile("/proc/self/stat")
				if err != nil {
					fail(err)
				}
				if strings.Contains(string(stat), ") Z ") {
					break
				}
				time.Sleep(time.Millisecond)
			}
			fmt.Println("locked")
			if _, err := testenv.StdinLine(); err != nil {
				fail(err)
			}
			if err := m.Unlock(); err != nil {
				fail(err)
			}
			if err := seg.Close(); err != nil {
				fail(err)
			}
			fmt.Println("unlocked")
			os.Exit(0)
		}()
		unix.RawSyscall(unix.SYS_EXIT, 0, 0, 0) // this thread only
		return errors.New("still here")
	}
}

// A holder whose main thread (the thread group's leader) has ended while
// the thread that holds the lock runs on shows as a zombie in /proc, yet
// it is alive and may still write what the lock guards (a C program whose
// main calls pthread_exit): its lock is not taken over. Killed, it is.
func TestLockHeldByAProcessWhoseLeaderEndedIsNotTakenOver(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	seg, m, _ := lockSegment(t, "")
	defer seg.Close()

	h := testenv.StartHelper(t, "lock-then-leader-exits", seg.Name())
	require.Equal(t, "locked", h.ReadLine(t))
	require.EqualValues(t, h.Cmd.Process.Pid, m.Holder())
	_, err := m.Lock(time.Now().Add(200 * time.Millisecond))
	require.ErrorIs(t, err, lock.ErrTimeout, "a live holder keeps the lock")
	h.Send(t, "unlock")
	require.Equal(t, "unlocked", h.ReadLine(t))
	h.Wait(t)
	recovered, err := m.Lock(time.Now().Add(5 * time.Second))
	require.NoError(t, err)
	require.False(t, recovered, "let go, not taken over")
	require.NoError(t, m.Unlock())

	h = testenv.StartHelper(t, "lock-then-leader-exits", seg.Name())
	require.Equal(t, "locked", h.ReadLine(t))
	require.NoError(t, h.Cmd.Process.Signal(syscall.SIGKILL))
	// Not reaped yet: a zombie, and its lock is taken over all the same.
	recovered, err = m.Lock(time.Now().Add(5 * time.Second))
	require.NoError(t, err)
	require.True(t, recovered, "the lock of a killed holder is taken over")
	require.NoError(t, m.Unlock())
	require.Error(t, h.Cmd.Wait())
	_, err = seg.DropRef() // the killed helper's
	require.NoError(t, err)
}
