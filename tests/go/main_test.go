// Package gotests tests zctipc across the C ABI: libzctipc.so built as
// setup.py builds it, its exports against the hand-written zctipc.h, and C
// programs (testdata/*.c) that use it. The Go packages' own tests sit
// beside them, under go/; these need none of them, only the library and
// the variables documented in the README.
//
// Every run gets its own segment directory on /dev/shm's tmpfs, which must
// be empty when the run ends.
package gotests

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

func TestMain(m *testing.M) {
	removeDeadRuns()
	// Not a name of the library's (zctipc_, zctipc-): the Python tests,
	// which may run beside these, count those as theirs.
	dir, err := os.MkdirTemp("/dev/shm", fmt.Sprintf("gotest-zctipc-%d-", os.Getpid()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "make segment directory:", err)
		os.Exit(2)
	}
	os.Setenv("ZCTIPC_SHM_DIR", dir)
	runtimeDir, err := os.MkdirTemp("", "zctipc-gotest-run-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "make runtime directory:", err)
		os.Exit(2)
	}
	os.Setenv("ZCTIPC_RUNTIME_DIR", runtimeDir)
	// The C programs keep no ledger: cleanup is tested elsewhere.
	os.Setenv("ZCTIPC_CLEANUP", "0")
	code := m.Run()
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
// process is gone: a run that timed out never cleaned up.
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

var nameCounter struct {
	sync.Mutex
	n int
}

// uniqueName returns a segment name no other test uses.
func uniqueName(t *testing.T) string {
	nameCounter.Lock()
	defer nameCounter.Unlock()
	nameCounter.n++
	clean := regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "_")
	return fmt.Sprintf("gotest_%s_%d_%d", clean, os.Getpid(), nameCounter.n)
}
