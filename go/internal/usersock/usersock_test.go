package usersock_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"testing/quick"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"github.com/zctipc/zctipc/go/internal/usersock"
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
	t.Parallel()
	a, b := testenv.SocketPair(t)
	self, err := proc.Self()
	require.NoError(t, err)
	for _, c := range []*net.UnixConn{a, b} {
		got, err := usersock.PeerOf(c)
		require.NoError(t, err, "PeerOf")
		require.Equal(t, self, got, "a socket pair has this process at both ends")
	}
}

// An Acceptor, driven by random sequences of connections and hang-ups,
// against a model: a connection is served while fewer than the limit are,
// and refused with the reason otherwise; hang-ups give the room back.
func TestAcceptorKeepsItsLimitAgainstAModel(t *testing.T) {
	const limit = 3
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	require.NoError(t, err)
	a := &usersock.Acceptor{
		Name: "the test server",
		Serve: func(c *net.UnixConn) { // answers "served" to each message until the hang-up
			defer c.Close()
			buf := make([]byte, 64)
			for {
				if n, err := c.Read(buf); err != nil || n == 0 {
					return
				}
				if _, err := c.Write([]byte("served")); err != nil {
					return
				}
			}
		},
		Refusal: func(reason error) []byte { return []byte("refused: " + reason.Error()) },
		Limit:   func() int { return limit },
	}
	done := make(chan struct{})
	go func() { a.Run(ln); close(done) }()
	defer func() { ln.Close(); <-done }()

	refusals := 0
	check := func(ops []uint8) bool {
		var open []*net.UnixConn
		defer func() {
			for _, c := range open {
				c.Close()
			}
			require.Eventually(t, func() bool { return a.Open() == 0 }, 10*time.Second, time.Millisecond)
		}()
		for _, op := range ops {
			// The server sees a hang-up a moment after it happens.
			require.Eventually(t, func() bool { return a.Open() == len(open) }, 10*time.Second, time.Millisecond)
			if op%3 == 0 && len(open) > 0 { // a client hangs up
				i := int(op/3) % len(open)
				open[i].Close()
				open = append(open[:i], open[i+1:]...)
				continue
			}
			c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
			require.NoError(t, err)
			c.Write([]byte("hello")) // fails with EPIPE when refused and closed already
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 256)
			n, err := c.Read(buf)
			if errors.Is(err, unix.ECONNRESET) { // the refusal waits behind the reset
				n, err = c.Read(buf)
			}
			require.NoError(t, err)
			if len(open) < limit {
				require.Equal(t, "served", string(buf[:n]))
				open = append(open, c)
				continue
			}
			require.Equal(t, "refused: the test server is at its limit of 3 connections; try again later: "+
				unix.EAGAIN.Error(), string(buf[:n]))
			refusals++
			c.Close()
		}
		return true
	}
	require.NoError(t, quick.Check(check, &quick.Config{MaxCount: 30}))
	require.Equal(t, refusals, a.Refused())
	require.Positive(t, refusals)
}
