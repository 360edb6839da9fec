// Package cudatest runs the CUDA code of zctipc where there is no GPU: it
// builds the stand-in driver of tests/cuda/mockcuda.c once per test run
// ("device memory" is host memory in memfds) and starts helper processes
// that load it. Only tests import it; a test binary that uses it passes
// Cleanup to testenv.Main.
package cudatest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/cuda"
	"github.com/zctipc/zctipc/go/internal/testenv"
)

// The stand-in driver, built once per test run.
var (
	mockOnce sync.Once
	mockPath string
	mockErr  error
)

// MockDriver builds the stand-in driver and returns its path.
func MockDriver(t *testing.T) string {
	t.Helper()
	mockOnce.Do(func() {
		dir, err := os.MkdirTemp("", "zctipc-mockcuda-")
		if err != nil {
			mockErr = err
			return
		}
		mockPath = filepath.Join(dir, "libcuda.so.1")
		src := filepath.Join(testenv.ModuleRoot(), "tests", "cuda", "mockcuda.c")
		out, err := exec.Command("gcc", "-shared", "-fPIC", "-O1", "-o", mockPath, src).CombinedOutput()
		if err != nil {
			mockErr = fmt.Errorf("build the stand-in driver: %v: %s", err, out)
		}
	})
	require.NoError(t, mockErr)
	return mockPath
}

// Cleanup, at the end of a test run, removes what MockDriver built.
func Cleanup() error {
	if mockPath == "" {
		return nil
	}
	return os.RemoveAll(filepath.Dir(mockPath))
}

// HostBytes views "device memory" of the stand-in driver, which is host
// memory.
func HostBytes(ptr, n uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), uintptr(ptr))), n)
}

// StartMockHelper runs a helper that uses the stand-in driver.
func StartMockHelper(t *testing.T, name string, args ...string) *testenv.Helper {
	t.Helper()
	return testenv.StartHelperEnv(t, name, []string{cuda.LibraryEnv + "=" + MockDriver(t)}, args...)
}
