package proc_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

func TestProcIdentity(t *testing.T) {
	self, err := proc.Self()
	require.NoError(t, err)
	require.EqualValues(t, os.Getpid(), self.PID)
	require.Positive(t, self.StartTime)

	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	start, err := proc.StartTime(int64(cmd.Process.Pid))
	require.NoError(t, err)
	child := proc.Identity{PID: int64(cmd.Process.Pid), StartTime: start}
	for _, tc := range []struct {
		name string
		id   proc.Identity
		want proc.Liveness
	}{
		{"itself", self, proc.Running},
		{"a child", child, proc.Running},
		{"a reused pid is another process", proc.Identity{PID: self.PID, StartTime: self.StartTime + 1}, proc.Exited},
		{"no pid", proc.Identity{}, proc.Exited},
		{"a pid no process has", proc.Identity{PID: 1<<22 + 4321, StartTime: 1}, proc.Exited},
	} {
		l, err := proc.Check(tc.id)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, l, tc.name)
		require.Equal(t, tc.want == proc.Exited, proc.Dead(tc.id), tc.name)
	}

	// A claim of the running child's pid, recorded or not yet, is not gone.
	require.False(t, proc.Gone(child.PID, child), "a recorded claim of a running process")
	require.False(t, proc.Gone(child.PID, proc.Identity{}), "an unrecorded claim of a running process")

	// Killed and not yet waited for, the child is a zombie: it holds no
	// mappings, so it is dead, and its claims are gone, recorded or not
	// (its parent may never reap it: one blocked behind the lock it held).
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	require.Eventually(t, func() bool { return proc.Dead(child) }, 10*time.Second, time.Millisecond, "a zombie")
	require.True(t, proc.Gone(child.PID, child), "a recorded claim of a zombie")
	require.True(t, proc.Gone(child.PID, proc.Identity{}), "an unrecorded claim of a zombie")
	require.Error(t, cmd.Wait())
	l, err := proc.Check(child)
	require.NoError(t, err)
	require.Equal(t, proc.Exited, l)
	_, err = proc.StartTime(int64(cmd.Process.Pid))
	require.ErrorIs(t, err, unix.ESRCH)
}

func init() {
	// check-at-limit checks the process its argument names (pid and start
	// time) after taking every descriptor it may open, and prints
	// "<liveness> <dead> <gone> <error>".
	testenv.Helpers["check-at-limit"] = func(args []string) error {
		pid, err := strconv.ParseInt(args[0], 10, 64)
		if err != nil {
			return err
		}
		start, err := strconv.ParseUint(args[1], 10, 64)
		if err != nil {
			return err
		}
		id := proc.Identity{PID: pid, StartTime: start}
		for {
			_, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if errors.Is(err, unix.EMFILE) {
				break
			}
			if err != nil {
				return err
			}
		}
		l, err := proc.Check(id)
		fmt.Println(l, proc.Dead(id), proc.Gone(pid, id), errors.Is(err, unix.EMFILE))
		return nil
	}
}

// A process that has no descriptor left cannot read /proc: that is no
// news of a death, and a live process is not taken for dead (its counts,
// ledger or lock would be given up under it); a dead one is not taken for
// dead either, until /proc can be read again.
func TestProcAProcessAtItsFileLimitTakesNoProcessForDead(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	cmd := exec.Command("sleep", "60")
	require.NoError(t, cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	start, err := proc.StartTime(int64(cmd.Process.Pid))
	require.NoError(t, err)
	h := testenv.StartHelper(t, "check-at-limit", strconv.Itoa(cmd.Process.Pid), strconv.FormatUint(start, 10))
	require.Equal(t, "unknown false false true", h.ReadLine(t), "a live process, unreadable")
	h.Wait(t)

	require.NoError(t, cmd.Process.Kill())
	require.Error(t, cmd.Wait())
	h = testenv.StartHelper(t, "check-at-limit", strconv.Itoa(cmd.Process.Pid), strconv.FormatUint(start, 10))
	require.Equal(t, "unknown false false true", h.ReadLine(t), "a dead process, unreadable")
	h.Wait(t)
}
