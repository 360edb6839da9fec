package proc_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

func init() {
	if os.Getenv(testenv.HelperEnv) == "leader-exits" {
		// Keeps the main goroutine on the main thread (the thread group's
		// leader), which the helper ends.
		runtime.LockOSThread()
	}
	// leader-exits ends its main thread (the thread group's leader) while
	// another thread runs on: /proc shows the process as a zombie, yet it
	// runs and holds its mappings. It prints "leader exited" once /proc
	// shows it so, and exits when a line comes on stdin.
	testenv.Helpers["leader-exits"] = func([]string) error {
		if unix.Gettid() != os.Getpid() {
			return errors.New("not on the main thread")
		}
		// The ended thread's P stays held: a garbage collection would wait
		// for it for ever.
		debug.SetGCPercent(-1)
		runtime.GOMAXPROCS(4)
		go func() {
			for !strings.Contains(string(must(os.ReadFile("/proc/self/stat"))), ") Z ") {
				time.Sleep(time.Millisecond)
			}
			fmt.Println("leader exited")
			_, _ = testenv.StdinLine()
			os.Exit(0)
		}()
		unix.RawSyscall(unix.SYS_EXIT, 0, 0, 0) // this thread only
		return errors.New("still here")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A process whose main thread (the thread group's leader) has ended while
// its other threads run shows as a zombie in /proc/PID/stat, yet it runs,
// holds its mappings and may hold a lock (a C program whose main calls
// pthread_exit): it is not dead, and its claims, recorded or not, are not
// gone. Once it is killed it is dead.
func TestProcAZombieLeaderWithRunningThreadsIsAlive(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	h := testenv.StartHelper(t, "leader-exits")
	require.Equal(t, "leader exited", h.ReadLine(t))
	pid := int64(h.Cmd.Process.Pid)
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	require.Contains(t, string(stat), ") Z ", "the leader shows as a zombie")
	start, err := proc.StartTime(pid)
	require.NoError(t, err)
	id := proc.Identity{PID: pid, StartTime: start}

	l, err := proc.Check(id)
	require.NoError(t, err)
	require.Equal(t, proc.Running, l)
	require.False(t, proc.Dead(id))
	require.False(t, proc.Gone(pid, id), "a recorded claim of a live process")
	require.False(t, proc.Gone(pid, proc.Identity{}), "an unrecorded claim of a live process")
	require.True(t, proc.Dead(proc.Identity{PID: pid, StartTime: start + 1}), "another start time")
	require.True(t, proc.Gone(pid, proc.Identity{PID: pid, StartTime: start + 1}), "another start time")

	// Killed, not yet reaped: every thread is gone, and so is it.
	require.NoError(t, h.Cmd.Process.Signal(syscall.SIGKILL))
	require.Eventually(t, func() bool { return proc.Dead(id) }, 10*time.Second, time.Millisecond)
	require.True(t, proc.Gone(pid, id))
	require.True(t, proc.Gone(pid, proc.Identity{}))
	_ = h.Cmd.Wait()
}

// A helper that ends its leader and then exits on its own (a line on
// stdin) is dead once reaped, and a zombie until then.
func TestProcAZombieLeaderWhoseThreadsExitIsDead(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	h := testenv.StartHelper(t, "leader-exits")
	require.Equal(t, "leader exited", h.ReadLine(t))
	pid := int64(h.Cmd.Process.Pid)
	start, err := proc.StartTime(pid)
	require.NoError(t, err)
	id := proc.Identity{PID: pid, StartTime: start}
	require.False(t, proc.Dead(id))
	h.Send(t, "exit")
	require.Eventually(t, func() bool { return proc.Dead(id) && proc.Gone(pid, proc.Identity{}) }, 10*time.Second, time.Millisecond)
	h.Wait(t)
	require.True(t, proc.Dead(id))
}

// A stopped process runs again when continued, and a traced one when its
// tracer lets it: neither is dead. Killed, a stopped one is.
func TestProcStoppedAndTracedProcessesAreAlive(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	cmd := exec.Command("sleep", "60")
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := int64(cmd.Process.Pid)
	start, err := proc.StartTime(pid)
	require.NoError(t, err)
	id := proc.Identity{PID: pid, StartTime: start}

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	require.Eventually(t, func() bool { return state(t, pid) == 'T' }, 10*time.Second, time.Millisecond)
	require.False(t, proc.Dead(id), "stopped")
	require.False(t, proc.Gone(pid, id), "stopped")
	require.False(t, proc.Gone(pid, proc.Identity{}), "stopped")
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))

	// Traced: a thread locked to this goroutine traces it (ptrace
	// requests must come from the tracer's thread).
	done := make(chan error, 1)
	resume := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := unix.PtraceSeize(int(pid)); err != nil {
			done <- fmt.Errorf("seize: %w", err)
			return
		}
		if err := unix.PtraceInterrupt(int(pid)); err != nil {
			done <- err
			return
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(int(pid), &ws, unix.WALL, nil); err != nil {
			done <- err
			return
		}
		done <- nil
		<-resume
		done <- unix.PtraceDetach(int(pid))
	}()
	require.NoError(t, <-done)
	require.Equal(t, byte('t'), state(t, pid))
	require.False(t, proc.Dead(id), "traced")
	require.False(t, proc.Gone(pid, id), "traced")
	require.False(t, proc.Gone(pid, proc.Identity{}), "traced")
	close(resume)
	require.NoError(t, <-done)

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	require.Eventually(t, func() bool { return proc.Dead(id) }, 10*time.Second, time.Millisecond, "stopped and killed")
	require.True(t, proc.Gone(pid, proc.Identity{}))
}

func state(t *testing.T, pid int64) byte {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	return raw[strings.LastIndexByte(string(raw), ')')+2]
}

// Pids that no process can have, or that name no process, are gone; pid 1
// (init of this namespace) is not.
func TestProcOddPids(t *testing.T) {
	one, err := proc.StartTime(1)
	require.NoError(t, err)
	require.False(t, proc.Dead(proc.Identity{PID: 1, StartTime: one}))
	require.False(t, proc.Gone(1, proc.Identity{}))
	require.False(t, proc.Gone(1, proc.Identity{PID: 1, StartTime: one}))
	require.True(t, proc.Gone(1, proc.Identity{PID: 1, StartTime: one + 1}))

	pidMax, err := os.ReadFile("/proc/sys/kernel/pid_max")
	require.NoError(t, err)
	max, err := strconv.ParseInt(strings.TrimSpace(string(pidMax)), 10, 64)
	require.NoError(t, err)
	for _, pid := range []int64{0, -1, -1 << 31, max, max + 1, 1 << 31, 1<<32 + 1, 1<<63 - 1} {
		if pid == max && syscall.Kill(int(pid), 0) != syscall.ESRCH {
			continue // someone has it
		}
		require.True(t, proc.Gone(pid, proc.Identity{}), "pid %d", pid)
		require.True(t, proc.Dead(proc.Identity{PID: pid, StartTime: 1}), "pid %d", pid)
	}
}

// A process whose name holds spaces, parentheses and a newline has its
// start time and state read from after the last ')'.
func TestProcOddNames(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	dir := t.TempDir()
	sleep, err := exec.LookPath("sleep")
	require.NoError(t, err)
	for _, name := range []string{") Z 1 (", "a b\nc) Z", "((", "))", ") X "} {
		link := filepath.Join(dir, name)
		require.NoError(t, os.Symlink(sleep, link))
		cmd := exec.Command(link, "60")
		require.NoError(t, cmd.Start())
		pid := int64(cmd.Process.Pid)
		require.Eventually(t, func() bool { // exec'd, named
			raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			return err == nil && string(raw) == name[:min(len(name), 15)]+"\n"
		}, 10*time.Second, time.Millisecond, "%q", name)
		start, err := proc.StartTime(pid)
		require.NoError(t, err, "%q", name)
		id := proc.Identity{PID: pid, StartTime: start}
		require.False(t, proc.Dead(id), "%q", name)
		require.False(t, proc.Gone(pid, proc.Identity{}), "%q", name)
		require.NoError(t, cmd.Process.Kill())
		require.Eventually(t, func() bool { return proc.Dead(id) }, 10*time.Second, time.Millisecond, "%q", name)
		require.True(t, proc.Gone(pid, proc.Identity{}), "%q", name)
		_ = cmd.Wait()
		require.True(t, proc.Dead(id), "%q", name)
	}
}
