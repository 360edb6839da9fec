// Package gotests tests the zctipc Go packages from the outside, as their
// users see them.
//
// Cross-process tests re-run this test binary as a helper process: TestMain
// runs the helper named by $ZCTIPC_TEST_HELPER instead of the tests. Every
// run gets its own segment directory on /dev/shm's tmpfs, which must be
// empty when the run ends.
package gotests

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/usersock"
)

const helperEnv = "ZCTIPC_TEST_HELPER"

// helpers are the functions a helper process can run, by name. Each gets the
// helper's arguments and reports through stdout; a non-nil error fails it.
var helpers = map[string]func(args []string) error{}

func TestMain(m *testing.M) {
	if name := os.Getenv(helperEnv); name != "" {
		os.Exit(runHelper(name))
	}
	removeDeadRuns()
	// Not a name of the library's (zctipc_, zctipc-): the Python tests,
	// which may run beside these, count those as theirs.
	dir, err := os.MkdirTemp("/dev/shm", fmt.Sprintf("gotest-zctipc-%d-", os.Getpid()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "make segment directory:", err)
		os.Exit(2)
	}
	os.Setenv(shm.DirEnv, dir)
	runtimeDir, err := os.MkdirTemp("", "zctipc-gotest-run-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "make runtime directory:", err)
		os.Exit(2)
	}
	os.Setenv(usersock.RuntimeDirEnv, runtimeDir)
	// The tests choose when this process and its helpers keep a ledger;
	// package zctipc's default (on) is tested in a program of its own.
	os.Setenv("ZCTIPC_CLEANUP", "0")
	code := m.Run()
	if err := pool.CloseTickets(); err != nil { // the ticket arenas of the descriptors this process sent
		fmt.Fprintln(os.Stderr, "close ticket arenas:", err)
		code = 1
	}
	stopDaemon(runtimeDir)
	os.RemoveAll(runtimeDir)
	removeDaemonBuild()
	for _, dir := range []string{examplesDir, filepath.Dir(mockPath)} {
		if dir != "" && dir != "." {
			os.RemoveAll(dir)
		}
	}
	left, err := os.ReadDir(dir)
	if err == nil && len(left) > 0 {
		for _, e := range left {
			fmt.Fprintln(os.Stderr, "leaked segment:", e.Name())
		}
		code = 1
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, "remove segment directory:", err)
		code = 1
	}
	os.Exit(code)
}

// removeDeadRuns removes the segment directories of test runs whose
// process is gone: a fuzz worker is killed when fuzzing ends, and a run that
// timed out never cleaned up.
func removeDeadRuns() {
	dirs, _ := filepath.Glob("/dev/shm/gotest-zctipc-*-*")
	for _, dir := range dirs {
		fields := strings.Split(filepath.Base(dir), "-")
		pid, err := strconv.Atoi(fields[2])
		if err == nil && syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(dir)
		}
	}
}

func runHelper(name string) int {
	fn, ok := helpers[name]
	if !ok {
		fmt.Fprintln(os.Stderr, "no helper named", name)
		return 2
	}
	if err := fn(strings.Split(os.Getenv(helperEnv+"_ARGS"), "\x1f")); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	return 0
}

// helper is a running helper process with a line-oriented stdin and stdout.
type helper struct {
	cmd *exec.Cmd
	in  *bufio.Writer
	out *bufio.Scanner
}

// startHelper runs the helper name with args in a new process.
func startHelper(t *testing.T, name string, args ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+name, helperEnv+"_ARGS="+strings.Join(args, "\x1f"))
	return runHelperCmd(t, cmd)
}

// runHelperCmd starts cmd, a helper process, and connects to it.
func runHelperCmd(t *testing.T, cmd *exec.Cmd) *helper {
	t.Helper()
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return &helper{cmd: cmd, in: bufio.NewWriter(stdin), out: bufio.NewScanner(stdout)}
}

// readLine returns the helper's next line of output.
func (h *helper) readLine(t *testing.T) string {
	t.Helper()
	require.True(t, h.out.Scan(), "helper exited early: %v", h.out.Err())
	return h.out.Text()
}

func (h *helper) send(t *testing.T, line string) {
	t.Helper()
	_, err := h.in.WriteString(line + "\n")
	require.NoError(t, err)
	require.NoError(t, h.in.Flush())
}

// wait waits for the helper to exit and requires success.
func (h *helper) wait(t *testing.T) {
	t.Helper()
	require.NoError(t, h.cmd.Wait())
}

// stdinLine reads one line of a helper's stdin.
var stdin = bufio.NewScanner(os.Stdin)

func stdinLine() (string, error) {
	if !stdin.Scan() {
		return "", fmt.Errorf("stdin closed: %v", stdin.Err())
	}
	return stdin.Text(), nil
}
