package gotests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/daemon"
	"github.com/zctipc/zctipc/go/fdpass"
	"github.com/zctipc/zctipc/go/shm"
	"github.com/zctipc/zctipc/go/usersock"
	"golang.org/x/sys/unix"
)

// runDaemon runs zctipcd for dir in the foreground, with args, until the
// test ends, and waits until it answers.
func runDaemon(t *testing.T, dir string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(daemonExe(t), append([]string{"-dir", dir, "-shm-dir", shm.Dir(), "-idle", "60s"}, args...)...)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := daemon.Dial(dir, daemon.Launcher{}, nil)
		if err == nil {
			c.Close()
			return cmd
		}
		require.True(t, time.Now().Before(deadline), "zctipcd did not come up: %v", err)
		time.Sleep(10 * time.Millisecond)
	}
}

// waitStopped waits until process pid is stopped: kill(SIGSTOP) returns
// before the process has taken the signal, and it may answer one more
// request meanwhile.
func waitStopped(t *testing.T, pid int) {
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

func dialRaw(t *testing.T, dir string) *net.UnixConn {
	t.Helper()
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: filepath.Join(dir, daemon.SocketName), Net: "unixpacket"})
	require.NoError(t, err)
	return conn
}

func TestAStoppedDaemonHoldsNoClientHostage(t *testing.T) {
	dir := withRuntimeDir(t)
	d := runDaemon(t, dir)
	c, err := daemon.Dial(dir, daemon.Launcher{}, nil)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, d.Process.Signal(syscall.SIGSTOP))
	waitStopped(t, d.Process.Pid)

	start := time.Now()
	_, err = c.Status()
	require.ErrorIs(t, err, daemon.ErrUnavailable, "a connected client")
	require.Contains(t, err.Error(), "did not answer")
	_, err = daemon.Dial(dir, daemon.Program(daemonExe(t)), nil)
	require.ErrorIs(t, err, daemon.ErrUnavailable, "a new client, which may start a daemon")
	require.Less(t, time.Since(start), 10*time.Second, "each exchange has a deadline")

	require.NoError(t, d.Process.Signal(syscall.SIGCONT))
	_, err = c.Status()
	require.NoError(t, err, "the client reconnects once the daemon answers again")
}

func TestADaemonAtItsFileLimitGoesOnServing(t *testing.T) {
	dir := withRuntimeDir(t)
	d := runDaemon(t, dir)
	low := unix.Rlimit{Cur: 64, Max: 64}
	require.NoError(t, unix.Prlimit(d.Process.Pid, unix.RLIMIT_NOFILE, &low, nil))

	// A flood of connections that say nothing: past the limit, the daemon
	// refuses new ones with an answer instead of stopping to accept.
	var flood []*net.UnixConn
	refused := 0
	for range 150 {
		conn := dialRaw(t, dir)
		flood = append(flood, conn)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
		buf := make([]byte, 4096)
		if n, _, err := fdpass.Recv(conn, buf, 0); err == nil && n > 0 {
			var rep daemon.Reply
			require.NoError(t, json.Unmarshal(buf[:n], &rep))
			require.Contains(t, rep.Error, "limit of open files")
			refused++
		}
	}
	require.Positive(t, refused, "some connections were refused, with the reason")
	for _, conn := range flood {
		conn.Close()
	}
	// With the flood gone, new clients are served, in bounded time.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := daemon.Dial(dir, daemon.Launcher{}, nil)
		if err == nil {
			st, err := c.Status()
			c.Close()
			require.NoError(t, err)
			require.Positive(t, st.Refused)
			break
		}
		require.True(t, time.Now().Before(deadline), "the daemon no longer serves: %v", err)
		time.Sleep(20 * time.Millisecond)
	}
}

func init() {
	// low-limit-client lowers its soft limit of open files to 64 (and the
	// hard one too where it may not raise it: then the daemon cannot
	// either), then starts the daemon, which inherits the limit.
	helpers["low-limit-client"] = func(args []string) error {
		var lim unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			return err
		}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 64, Max: lim.Max}); err != nil {
			return err
		}
		c, err := daemon.Dial(usersock.RuntimeDir(), daemon.Program(os.Getenv("ZCTIPC_TEST_DAEMON")), nil)
		if err != nil {
			return err
		}
		defer c.Close()
		return nil
	}
}

func TestADaemonRaisesTheFileLimitItInherits(t *testing.T) {
	dir := withRuntimeDir(t)
	h := startClient(t, "low-limit-client", nil)
	h.wait(t)
	pid := daemon.RunningPID(dir)
	require.NotZero(t, pid)
	limits, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/limits")
	require.NoError(t, err)
	for _, line := range strings.Split(string(limits), "\n") {
		if strings.HasPrefix(line, "Max open files") {
			soft, err := strconv.Atoi(strings.Fields(line)[3])
			require.NoError(t, err)
			require.Greater(t, soft, 64, line)
			return
		}
	}
	t.Fatal("no open-file limit in /proc/PID/limits")
}

func TestADaemonClosesSilentConnections(t *testing.T) {
	dir := withRuntimeDir(t)
	runDaemon(t, dir, "-silent", "300ms")
	conn := dialRaw(t, dir)
	defer conn.Close()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	start := time.Now()
	n, _, err := fdpass.Recv(conn, make([]byte, 16), 0)
	if !errors.Is(err, io.EOF) {
		require.NoError(t, err)
		require.Zero(t, n, "the daemon hung up")
	}
	require.Less(t, time.Since(start), 3*time.Second)

	// A client that watches a ledger may stay silent for its whole life.
	h := startClient(t, "tracked-holder", nil)
	names := strings.Fields(h.readLine(t))
	time.Sleep(time.Second)
	st := status(t)
	require.Len(t, st.Clients, 1)
	require.True(t, st.Clients[0].Connected, "its connection is kept")
	kill(t, h)
	waitGone(t, names[:3]...)
}

func TestADaemonSurvivesATruncatedLedger(t *testing.T) {
	dir := withRuntimeDir(t)
	d := runDaemon(t, dir)
	h := startClient(t, "tracked-holder", nil)
	names := strings.Fields(h.readLine(t))
	ledgerFile := filepath.Join(shm.Dir(), names[0])
	require.Eventually(t, func() bool { return len(status(t).Clients) == 1 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, os.Truncate(ledgerFile, 0), "a hostile same-user process shrinks the ledger")
	st := status(t) // reads the ledger's counts
	require.Equal(t, -1, st.Clients[0].Counts, "a ledger that faults has no count")
	kill(t, h) // the daemon sweeps the shrunk ledger
	require.Eventually(t, func() bool { return status(t).Swept >= 1 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, d.Process.Signal(syscall.Signal(0)), "the daemon lives")
	require.NoFileExists(t, ledgerFile)
	// What the ledger held is the orphan collection's: one removes it.
	c, err := daemon.Dial(dir, daemon.Launcher{}, nil)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Collect(false)
	require.NoError(t, err)
	waitGone(t, names[1:3]...)
}

func TestADaemonRemakesADeletedSocket(t *testing.T) {
	dir := withRuntimeDir(t)
	d := runDaemon(t, dir)
	sock := filepath.Join(dir, daemon.SocketName)
	require.NoError(t, os.Remove(sock))
	require.Eventually(t, func() bool {
		st, err := os.Lstat(sock)
		return err == nil && st.Mode()&os.ModeSocket != 0
	}, 5*time.Second, 10*time.Millisecond, "the socket is made again")
	// A client that comes now reaches the same daemon, which sweeps it when
	// it is killed.
	h := startClient(t, "tracked-holder", nil)
	names := strings.Fields(h.readLine(t))
	require.Equal(t, d.Process.Pid, daemon.RunningPID(dir))
	kill(t, h)
	waitGone(t, names[:3]...)
}
