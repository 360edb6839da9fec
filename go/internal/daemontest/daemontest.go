// Package daemontest is what tests that run the cleanup daemon share: a
// zctipcd built once per test run, helper processes that start it, and
// waits for what it sweeps. Only tests import it; a test binary that uses
// it passes Cleanup to testenv.Main.
package daemontest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/daemon"
	"github.com/zctipc/zctipc/go/internal/ledger"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"github.com/zctipc/zctipc/go/internal/usersock"
)

// SweepTimeout is how long the daemon may take to clean up after a death.
const SweepTimeout = 10 * time.Second

// ExeEnv names, in a helper that StartClient started, the zctipcd to start.
const ExeEnv = "ZCTIPC_TEST_DAEMON"

var daemonBuild struct {
	once sync.Once
	exe  string
	err  error
}

// Exe builds zctipcd once per test run and returns its path.
func Exe(t *testing.T) string {
	t.Helper()
	daemonBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "zctipcd-build-")
		if err != nil {
			daemonBuild.err = err
			return
		}
		exe := filepath.Join(dir, "zctipcd")
		out, err := exec.Command("go", "build", "-o", exe, "github.com/zctipc/zctipc/go/cmd/zctipcd").CombinedOutput()
		if err != nil {
			daemonBuild.err = fmt.Errorf("go build zctipcd: %v: %s", err, out)
			return
		}
		daemonBuild.exe = exe
	})
	require.NoError(t, daemonBuild.err)
	return daemonBuild.exe
}

// Stop kills the daemon serving dir, if one does, and waits for it.
func Stop(dir string) {
	pid := daemon.RunningPID(dir)
	if pid == 0 {
		return
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 200 && daemon.RunningPID(dir) != 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
}

// Cleanup, at the end of a test run, stops the daemon of the run's runtime
// directory (one that a test started there) and removes what Exe built.
func Cleanup() error {
	Stop(usersock.RuntimeDir())
	if daemonBuild.exe != "" {
		return os.RemoveAll(filepath.Dir(daemonBuild.exe))
	}
	return nil
}

// WithRuntimeDir gives the test a runtime directory of its own, so that its
// daemon is its own, and stops that daemon after the test.
func WithRuntimeDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	t.Setenv(usersock.RuntimeDirEnv, dir)
	t.Cleanup(func() { Stop(dir) })
	return dir
}

// StartClient runs a helper process that says hello to the daemon
// (starting it: $ZCTIPC_TEST_DAEMON names Exe's zctipcd) and then runs the
// named helper body, with env added to its environment.
func StartClient(t *testing.T, name string, env []string, args ...string) *testenv.Helper {
	t.Helper()
	exe := Exe(t)
	return testenv.RunHelperCmd(t, testenv.HelperCmd(name, append([]string{ExeEnv + "=" + exe}, env...), args...))
}

// WaitGone waits until none of names is in the segment directory.
func WaitGone(t *testing.T, names ...string) {
	t.Helper()
	deadline := time.Now().Add(SweepTimeout)
	for {
		var left []string
		for _, n := range names {
			if _, err := os.Lstat(filepath.Join(shm.Dir(), n)); err == nil {
				left = append(left, n)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still there %v after %v: %v", SweepTimeout, left, DirNames(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// DirNames returns the names in the segment directory.
func DirNames(t *testing.T) []string {
	t.Helper()
	names, err := shm.List()
	require.NoError(t, err)
	return names
}

// LedgerOf returns the name of this process's ledger.
func LedgerOf() string { return ledger.Current().Name() }

// Status returns the status of the daemon of the runtime directory.
func Status(t *testing.T) daemon.Status {
	t.Helper()
	c, err := daemon.Dial(usersock.RuntimeDir(), daemon.Launcher{}, nil)
	require.NoError(t, err)
	defer c.Close()
	st, err := c.Status()
	require.NoError(t, err)
	return st
}
