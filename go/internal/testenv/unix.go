package testenv

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// SocketPair returns two connected SOCK_SEQPACKET Unix sockets.
func SocketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "seqpacket")
		c, err := net.FileConn(f)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// OpenFiles opens n files and returns their descriptors, closed after the
// test.
func OpenFiles(t *testing.T, n int) []int {
	t.Helper()
	var fds []int
	for range n {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		fds = append(fds, fd)
	}
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	return fds
}

// Flood opens n connections to the socket at path that say nothing, and
// closes them when the test ends.
func Flood(t *testing.T, path string, n int) []*net.UnixConn {
	t.Helper()
	var conns []*net.UnixConn
	for range n {
		conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
		require.NoError(t, err)
		conns = append(conns, conn)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns
}

// WaitStopped waits until process pid is stopped: kill(SIGSTOP) returns
// before the process has taken the signal, and it may answer one more
// request meanwhile.
func WaitStopped(t *testing.T, pid int) {
	t.Helper()
	require.Eventually(t, func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		return len(fields) > 0 && fields[0] == "T"
	}, 5*time.Second, time.Millisecond, "pid %d stopped", pid)
}

// RawSleep sleeps on word as a host does outside Go (zct_sleep): the futex
// call alone.
func RawSleep(word *uint32, seen uint32, timeout time.Duration) error {
	ts := unix.NsecToTimespec(int64(timeout))
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), 0, uintptr(seen),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
	if errno != 0 && errno != unix.EAGAIN {
		return errno
	}
	return nil
}
