package gotests

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/cuda"
	"golang.org/x/sys/unix"
)

// requireGPU skips a test, saying why, where CUDA cannot be used.
func requireGPU(t *testing.T) {
	t.Helper()
	if err := cuda.Available(); err != nil {
		t.Skipf("no GPU: %v", err)
	}
}

func TestCudaAvailabilityIsReportedAndCallsFailClearly(t *testing.T) {
	err := cuda.Available()
	if err == nil {
		n, err := cuda.Devices()
		require.NoError(t, err)
		require.Positive(t, n)
		return
	}
	require.ErrorIs(t, err, cuda.ErrUnavailable)
	t.Logf("CUDA unavailable here: %v", err)
	_, err = cuda.Devices()
	require.ErrorIs(t, err, cuda.ErrUnavailable)
	_, err = cuda.Alloc(0, 1<<20)
	require.ErrorIs(t, err, cuda.ErrUnavailable)
	_, err = cuda.ExportMemory(0x7f0000000000, 0)
	require.ErrorIs(t, err, cuda.ErrUnavailable)
	_, err = cuda.Granularity(0)
	require.ErrorIs(t, err, cuda.ErrUnavailable)
}

func TestCudaFetchRefusesBadNames(t *testing.T) {
	_, _, _, err := cuda.Fetch("not-a-name")
	require.ErrorIs(t, err, unix.EINVAL)
	_, _, _, err = cuda.Fetch(fmt.Sprintf("%d-%032x", 1<<22+12345, 1))
	require.ErrorIs(t, err, cuda.ErrNotShared, "nobody serves it")
}

// A VMM allocation shared by one process is mapped by another.
func TestCudaVMMAcrossProcesses(t *testing.T) {
	requireGPU(t)
	a, err := cuda.Alloc(0, 3<<20)
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Free()) }()
	g, err := cuda.Granularity(0)
	require.NoError(t, err)
	require.Zero(t, a.Size%g, "rounded up to the granularity")
	name, err := a.Share()
	require.NoError(t, err)
	h := startHelper(t, "cuda-import", name)
	require.Equal(t, fmt.Sprintf("mapped %d", a.Size), h.readLine(t))
	h.wait(t)
	cuda.Unshare(name)
	_, _, _, err = cuda.Fetch(name)
	require.ErrorIs(t, err, cuda.ErrNotShared)
}

func init() {
	helpers["cuda-import"] = func(args []string) error {
		fd, size, resident, err := cuda.Fetch(args[0])
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		a, err := cuda.Import(fd, size, resident, resident)
		if err != nil {
			return err
		}
		if a.Ptr == 0 {
			return errors.New("mapped at 0")
		}
		fmt.Fprintf(os.Stdout, "mapped %d\n", a.Size)
		return a.Free()
	}
}
