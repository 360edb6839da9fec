// Package testenv is what the tests of zctipc's Go packages share: a test
// binary's private segment directory, the helper processes that
// cross-process tests run, and small helpers around segments, sockets and
// processes. Only tests import it.
//
// # A directory of one's own
//
// Main runs a package's tests with a segment directory of their own on
// /dev/shm's tmpfs (gotest-zctipc-PID-*, not a name of the library's:
// the Python tests, which may run beside these, count zctipc_ and zctipc-
// names as theirs), a runtime directory of their own, and cleanup off (the
// tests choose when a process keeps a ledger). The directory must be empty
// when the tests end. A run that was killed (a fuzz worker when fuzzing
// ends, a run that timed out) leaves its directory; the next run removes
// those whose process is gone.
//
// # Helper processes
//
// Cross-process tests re-run the test binary as a helper process: Main
// runs the helper named by $ZCTIPC_TEST_HELPER instead of the tests. A
// package registers its helpers in Helpers (from an init function) and
// starts one with StartHelper.
//
// It imports only packages shm and usersock of zctipc, so that the
// in-package tests of the others (package pool's) may use it.
package testenv

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/usersock"
	"golang.org/x/sys/unix"
)

// HelperEnv names the helper a test binary runs instead of its tests;
// HelperEnv+"_ARGS" holds the helper's arguments.
const HelperEnv = "ZCTIPC_TEST_HELPER"

// DirPattern is the pattern of the segment directories Main makes.
const DirPattern = "/dev/shm/gotest-zctipc-*-*"

// Helpers are the functions a helper process can run, by name. Each gets
// the helper's arguments and reports through stdout; a non-nil error
// fails it. Packages add theirs from init functions.
var Helpers = map[string]func(args []string) error{}

// Main runs m's tests (or, in a helper process, the helper) with a segment
// directory and a runtime directory of their own, and exits. atExit runs
// after the tests, before the check that the segment directory is empty:
// what gives up this process's own segments (pool.CloseTickets, say) or
// stops what the tests started.
func Main(m *testing.M, atExit ...func() error) {
	if name := os.Getenv(HelperEnv); name != "" {
		os.Exit(runHelper(name))
	}
	removeDeadRuns()
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
	for _, fn := range atExit {
		if err := fn(); err != nil {
			fmt.Fprintln(os.Stderr, "at exit:", err)
			code = 1
		}
	}
	os.RemoveAll(runtimeDir)
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
	dirs, _ := filepath.Glob(DirPattern)
	for _, dir := range dirs {
		fields := strings.Split(filepath.Base(dir), "-")
		pid, err := strconv.Atoi(fields[2])
		if err == nil && syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(dir)
		}
	}
}

func runHelper(name string) int {
	fn, ok := Helpers[name]
	if !ok {
		fmt.Fprintln(os.Stderr, "no helper named", name)
		return 2
	}
	if err := fn(strings.Split(os.Getenv(HelperEnv+"_ARGS"), "\x1f")); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	return 0
}

// Helper is a running helper process with a line-oriented stdin and stdout.
type Helper struct {
	Cmd *exec.Cmd
	Out *bufio.Scanner // its stdout, read line by line
	in  *bufio.Writer
}

// StartHelper runs the helper name with args in a new process.
func StartHelper(t *testing.T, name string, args ...string) *Helper {
	t.Helper()
	return StartHelperEnv(t, name, nil, args...)
}

// StartHelperEnv runs the helper name with args in a new process whose
// environment has env added.
func StartHelperEnv(t *testing.T, name string, env []string, args ...string) *Helper {
	t.Helper()
	return RunHelperCmd(t, HelperCmd(name, env, args...))
}

// HelperCmd is the command that runs the helper name with args, with env
// added to the environment.
func HelperCmd(name string, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), HelperEnv+"="+name, HelperEnv+"_ARGS="+strings.Join(args, "\x1f")), env...)
	return cmd
}

// RunHelperCmd starts cmd, a helper process, and connects to it.
func RunHelperCmd(t *testing.T, cmd *exec.Cmd) *Helper {
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
	return &Helper{Cmd: cmd, Out: bufio.NewScanner(stdout), in: bufio.NewWriter(stdin)}
}

// ReadLine returns the helper's next line of output.
func (h *Helper) ReadLine(t *testing.T) string {
	t.Helper()
	require.True(t, h.Out.Scan(), "helper exited early: %v", h.Out.Err())
	return h.Out.Text()
}

// Send writes line to the helper's stdin.
func (h *Helper) Send(t *testing.T, line string) {
	t.Helper()
	_, err := h.in.WriteString(line + "\n")
	require.NoError(t, err)
	require.NoError(t, h.in.Flush())
}

// Wait waits for the helper to exit and requires success.
func (h *Helper) Wait(t *testing.T) {
	t.Helper()
	require.NoError(t, h.Cmd.Wait())
}

// Exit tells a helper that holds something until told ("exit") to let go
// of it, and waits for it to exit.
func (h *Helper) Exit(t *testing.T) {
	t.Helper()
	h.Send(t, "exit")
	h.Wait(t)
}

// Kill kills the helper h and waits for it.
func Kill(t *testing.T, h *Helper) {
	t.Helper()
	require.NoError(t, h.Cmd.Process.Kill())
	_ = h.Cmd.Wait()
}

// stdin reads the lines of a helper's stdin.
var stdin = bufio.NewScanner(os.Stdin)

// StdinLine reads one line of a helper's stdin.
func StdinLine() (string, error) {
	if !stdin.Scan() {
		return "", fmt.Errorf("stdin closed: %v", stdin.Err())
	}
	return stdin.Text(), nil
}

var nameCounter struct {
	sync.Mutex
	n int
}

// UniqueName returns a segment name no other test uses.
func UniqueName(t *testing.T) string {
	nameCounter.Lock()
	defer nameCounter.Unlock()
	nameCounter.n++
	clean := regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "_")
	return fmt.Sprintf("gotest_%s_%d_%d", clean, os.Getpid(), nameCounter.n)
}

// SegmentPath returns the path of segment name (with or without its
// prefix) in the segment directory.
func SegmentPath(name string) string {
	if !strings.HasPrefix(name, shm.Prefix) {
		name = shm.Prefix + name
	}
	return filepath.Join(shm.Dir(), name)
}

// Exists reports whether segment name is in the segment directory.
func Exists(name string) bool {
	_, err := os.Lstat(SegmentPath(name))
	return err == nil
}

// Fill writes the golden data pattern into b.
func Fill(b []byte) {
	for i := range b {
		b[i] = byte(i % 251)
	}
}

// Digest returns the SHA-256 of b in hex.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// SegmentsOnTmpfs puts the test's segments on a new tmpfs mounted with
// opts ("size=1m", ...) and returns its directory; without root it skips.
// The unmount waits for mappings let go late (a pool's arenas are unmapped
// by its sweeper, within a couple of seconds of their last count).
func SegmentsOnTmpfs(t *testing.T, opts string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, opts+",mode=0700"), "mount")
	t.Cleanup(func() {
		err := unix.Unmount(dir, 0)
		for deadline := time.Now().Add(10 * time.Second); errors.Is(err, unix.EBUSY) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			err = unix.Unmount(dir, 0)
		}
		require.NoError(t, err, "Unmount")
	})
	t.Setenv(shm.DirEnv, dir)
	return dir
}

// Mapped reports whether this process maps a file whose path contains name.
func Mapped(t *testing.T, name string) bool {
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	return strings.Contains(string(maps), name)
}

// ModuleRoot returns the directory of go.mod, found from the working
// directory (a package's, in a test) up; the working directory where there
// is none.
func ModuleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return "."
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

// SkipShort skips the test under -short, as `make gounit` runs the unit
// tests alone, in seconds; why says what this test does beyond them
// ("crosses processes", "runs the cleanup daemon", "runs for seconds").
func SkipShort(t *testing.T, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("%s: not with -short", why)
	}
}
