package shm_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

func TestCheckMemfdRefusesOtherFiles(t *testing.T) {
	t.Parallel()
	name := shm.FDPrefix + "0123456789abcdef0123456789abcdef"
	// A plain file.
	f, err := os.CreateTemp("", "notmemfd")
	require.NoError(t, err)
	defer os.Remove(f.Name())
	defer f.Close()
	require.ErrorIs(t, shm.CheckMemfd(int(f.Fd()), name), unix.EACCES)
	// A memfd that is not sealed.
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.ErrorIs(t, shm.CheckMemfd(fd, name), unix.EACCES)
	// Sealed, but named otherwise.
	_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
	require.NoError(t, err)
	require.ErrorIs(t, shm.CheckMemfd(fd, shm.FDPrefix+"ffffffffffffffffffffffffffffffff"), unix.EACCES)
	require.NoError(t, shm.CheckMemfd(fd, name))
}
