package gotests

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/proc"
	"github.com/zctipc/zctipc/go/usersock"
	"golang.org/x/sys/unix"
)

func TestRuntimeDirFollowsItsVariable(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(usersock.RuntimeDirEnv, dir+"/x/../run/")
	require.Equal(t, filepath.Join(dir, "run"), usersock.RuntimeDir())
}

func TestEnsureDir(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, dir string)
		refused bool
	}{
		{name: "missing, with its parent", prepare: func(t *testing.T, dir string) {}},
		{name: "already 0700", prepare: func(t *testing.T, dir string) {
			require.NoError(t, os.MkdirAll(dir, 0o700))
		}},
		{name: "open to the group", refused: true, prepare: func(t *testing.T, dir string) {
			require.NoError(t, os.MkdirAll(dir, 0o700))
			require.NoError(t, os.Chmod(dir, 0o750))
		}},
		{name: "a link to a directory", refused: true, prepare: func(t *testing.T, dir string) {
			target := t.TempDir()
			require.NoError(t, os.MkdirAll(filepath.Dir(dir), 0o700))
			require.NoError(t, os.Symlink(target, dir))
		}},
		{name: "a file", refused: true, prepare: func(t *testing.T, dir string) {
			require.NoError(t, os.MkdirAll(filepath.Dir(dir), 0o700))
			require.NoError(t, os.WriteFile(dir, nil, 0o600))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "parent", "run")
			tc.prepare(t, dir)
			err := usersock.EnsureDir(dir)
			if tc.refused {
				require.ErrorIs(t, err, unix.EACCES, "EnsureDir")
				return
			}
			require.NoError(t, err, "EnsureDir")
			var st unix.Stat_t
			require.NoError(t, unix.Lstat(dir, &st))
			require.Equal(t, uint32(unix.S_IFDIR|0o700), st.Mode&(unix.S_IFMT|0o777))
		})
	}
}

func TestPeerOfNamesTheProcessAtTheOtherEnd(t *testing.T) {
	a, b := socketPair(t)
	self, err := proc.Self()
	require.NoError(t, err)
	for _, c := range []*net.UnixConn{a, b} {
		got, err := usersock.PeerOf(c)
		require.NoError(t, err, "PeerOf")
		require.Equal(t, self, got, "a socket pair has this process at both ends")
	}
}
