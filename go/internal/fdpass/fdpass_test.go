package fdpass_test

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/fdpass"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

func TestFDPassOneDescriptor(t *testing.T) {
	a, b := testenv.SocketPair(t)
	fds := testenv.OpenFiles(t, 1)
	require.NoError(t, fdpass.Send(a, []byte("hello"), fds[0]))
	buf := make([]byte, 64)
	n, got, err := fdpass.Recv(b, buf, 1)
	require.NoError(t, err)
	require.Equal(t, "hello", string(buf[:n]))
	require.Len(t, got, 1)
	var st1, st2 unix.Stat_t
	require.NoError(t, unix.Fstat(fds[0], &st1))
	require.NoError(t, unix.Fstat(got[0], &st2))
	require.Equal(t, st1.Ino, st2.Ino, "the same file arrived")
	flags, err := unix.FcntlInt(uintptr(got[0]), unix.F_GETFD, 0)
	require.NoError(t, err)
	require.NotZero(t, flags&unix.FD_CLOEXEC, "received descriptors are close-on-exec")
	unix.Close(got[0])
}

func TestFDPassRejectsExtraDescriptorsAndClosesThem(t *testing.T) {
	a, b := testenv.SocketPair(t)
	fds := testenv.OpenFiles(t, 3)
	before := fdpass.OpenFiles()
	require.NoError(t, fdpass.Send(a, []byte("three"), fds...))
	_, got, err := fdpass.Recv(b, make([]byte, 64), 1)
	require.ErrorIs(t, err, fdpass.ErrRejected)
	require.Contains(t, err.Error(), "3 file descriptors where at most 1")
	require.Nil(t, got)
	require.Equal(t, before, fdpass.OpenFiles(), "every descriptor that arrived was closed")
	// A descriptor where none is expected is refused too.
	require.NoError(t, fdpass.Send(a, []byte("one"), fds[0]))
	_, _, err = fdpass.Recv(b, make([]byte, 64), 0)
	require.ErrorIs(t, err, fdpass.ErrRejected)
	require.Equal(t, before, fdpass.OpenFiles())
}

func TestFDPassRejectsTruncatedControlData(t *testing.T) {
	a, b := testenv.SocketPair(t)
	// More than the receiver makes room for: the kernel cuts the control
	// data short and closes what did not fit; Recv closes the rest.
	fds := testenv.OpenFiles(t, 2*fdpass.MaxFDs+4)
	before := fdpass.OpenFiles()
	oob := unix.UnixRights(fds...)
	_, _, err := a.WriteMsgUnix([]byte("many"), oob, nil)
	require.NoError(t, err)
	_, got, err := fdpass.Recv(b, make([]byte, 64), 1)
	require.ErrorIs(t, err, fdpass.ErrRejected)
	require.Contains(t, err.Error(), "cut short")
	require.Nil(t, got)
	require.Equal(t, before, fdpass.OpenFiles())
}

func TestFDPassRejectsOtherControlMessages(t *testing.T) {
	a, b := testenv.SocketPair(t)
	cred := unix.UnixCredentials(&unix.Ucred{Pid: int32(os.Getpid()), Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())})
	_, _, err := a.WriteMsgUnix([]byte("creds"), cred, nil)
	require.NoError(t, err)
	// The receiver must ask for credentials to get them.
	raw, err := b.SyscallConn()
	require.NoError(t, err)
	require.NoError(t, raw.Control(func(fd uintptr) {
		require.NoError(t, unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1))
	}))
	_, _, err = fdpass.Recv(b, make([]byte, 64), 1)
	require.ErrorIs(t, err, fdpass.ErrRejected)
	require.Contains(t, err.Error(), "control message")
}

func TestFDPassRejectsTruncatedData(t *testing.T) {
	a, b := testenv.SocketPair(t)
	require.NoError(t, fdpass.Send(a, make([]byte, 100)))
	_, _, err := fdpass.Recv(b, make([]byte, 10), 1)
	require.ErrorIs(t, err, fdpass.ErrRejected)
	require.Contains(t, err.Error(), "longer than 10 bytes")
}

func init() {
	// fd-limit: at a soft RLIMIT_NOFILE that is full, receiving a descriptor
	// fails with an error that names the limit.
	testenv.Helpers["fd-limit"] = func(args []string) error {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		conn := func(fd int) *net.UnixConn {
			f := os.NewFile(uintptr(fd), "seqpacket")
			c, _ := net.FileConn(f)
			f.Close()
			return c.(*net.UnixConn)
		}
		a, b := conn(fds[0]), conn(fds[1])
		open := fdpass.OpenFiles()
		lim := unix.Rlimit{Cur: uint64(open + 1), Max: uint64(open + 64)}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			return err
		}
		// Send one descriptor, then fill the table to the limit.
		if err := fdpass.Send(a, []byte("x"), 0); err != nil {
			return err
		}
		for {
			if _, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
				break
			}
		}
		_, got, err := fdpass.Recv(b, make([]byte, 8), 1)
		if err == nil {
			return fmt.Errorf("received %v at the file limit", got)
		}
		os.Stdout.WriteString(err.Error() + "\n")
		raised, rerr := fdpass.RaiseLimit()
		os.Stdout.WriteString(strconv.FormatUint(raised, 10) + " " + strconv.FormatBool(rerr == nil) + "\n")
		return nil
	}
}

func TestFDPassAtTheFileLimitNamesIt(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	h := testenv.StartHelper(t, "fd-limit")
	msg := h.ReadLine(t)
	require.Contains(t, msg, "RLIMIT_NOFILE")
	require.Contains(t, msg, "ulimit -n")
	require.NotContains(t, msg, "ancdata")
	require.Regexp(t, `^\d+ true$`, h.ReadLine(t), "the soft limit can be raised to the hard one")
	h.Wait(t)
}
