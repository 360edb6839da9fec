package daemon_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/daemon"
	"github.com/zctipc/zctipc/go/internal/daemontest"
	"github.com/zctipc/zctipc/go/internal/fdpass"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"github.com/zctipc/zctipc/go/internal/usersock"
	"golang.org/x/sys/unix"
)

// runDaemon runs zctipcd for dir in the foreground, with args, until the
// test ends, and waits until it answers.
func runDaemon(t *testing.T, dir string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(daemontest.Exe(t), append([]string{"-dir", dir, "-shm-dir", shm.Dir(), "-idle", "60s"}, args...)...)
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

func dialRaw(t *testing.T, dir string) *net.UnixConn {
	t.Helper()
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: filepath.Join(dir, daemon.SocketName), Net: "unixpacket"})
	require.NoError(t, err)
	return conn
}

func TestAStoppedDaemonHoldsNoClientHostage(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	d := runDaemon(t, dir)
	c, err := daemon.Dial(dir, daemon.Launcher{}, nil)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, d.Process.Signal(syscall.SIGSTOP))
	testenv.WaitStopped(t, d.Process.Pid)

	start := time.Now()
	_, err = c.Status()
	require.ErrorIs(t, err, daemon.ErrUnavailable, "a connected client")
	require.Contains(t, err.Error(), "did not answer")
	_, err = daemon.Dial(dir, daemon.Program(daemontest.Exe(t)), nil)
	require.ErrorIs(t, err, daemon.ErrUnavailable, "a new client, which may start a daemon")
	require.Less(t, time.Since(start), 10*time.Second, "each exchange has a deadline")

	require.NoError(t, d.Process.Signal(syscall.SIGCONT))
	_, err = c.Status()
	require.NoError(t, err, "the client reconnects once the daemon answers again")
}

func TestADaemonAtItsFileLimitGoesOnServing(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
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
			require.Contains(t, rep.Error, "zctipcd is at its limit of")
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
	testenv.Helpers["low-limit-client"] = func(args []string) error {
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
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	h := daemontest.StartClient(t, "low-limit-client", nil)
	h.Wait(t)
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
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
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
	h := daemontest.StartClient(t, "tracked-holder", nil)
	names := strings.Fields(h.ReadLine(t))
	time.Sleep(time.Second)
	st := daemontest.Status(t)
	require.Len(t, st.Clients, 1)
	require.True(t, st.Clients[0].Connected, "its connection is kept")
	testenv.Kill(t, h)
	daemontest.WaitGone(t, names[:3]...)
}

func TestADaemonSurvivesATruncatedLedger(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	d := runDaemon(t, dir)
	h := daemontest.StartClient(t, "tracked-holder", nil)
	names := strings.Fields(h.ReadLine(t))
	ledgerFile := filepath.Join(shm.Dir(), names[0])
	require.Eventually(t, func() bool { return len(daemontest.Status(t).Clients) == 1 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, os.Truncate(ledgerFile, 0), "a hostile same-user process shrinks the ledger")
	st := daemontest.Status(t) // reads the ledger's counts
	require.Equal(t, -1, st.Clients[0].Counts, "a ledger that faults has no count")
	testenv.Kill(t, h) // the daemon sweeps the shrunk ledger
	require.Eventually(t, func() bool { return daemontest.Status(t).Swept >= 1 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, d.Process.Signal(syscall.Signal(0)), "the daemon lives")
	require.NoFileExists(t, ledgerFile)
	// What the ledger held is the orphan collection's: one removes it.
	c, err := daemon.Dial(dir, daemon.Launcher{}, nil)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Collect(false)
	require.NoError(t, err)
	daemontest.WaitGone(t, names[1:3]...)
}

func TestADaemonRemakesADeletedSocket(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	d := runDaemon(t, dir)
	sock := filepath.Join(dir, daemon.SocketName)
	require.NoError(t, os.Remove(sock))
	require.Eventually(t, func() bool {
		st, err := os.Lstat(sock)
		return err == nil && st.Mode()&os.ModeSocket != 0
	}, 5*time.Second, 10*time.Millisecond, "the socket is made again")
	// A client that comes now reaches the same daemon, which sweeps it when
	// it is killed.
	h := daemontest.StartClient(t, "tracked-holder", nil)
	names := strings.Fields(h.ReadLine(t))
	require.Equal(t, d.Process.Pid, daemon.RunningPID(dir))
	testenv.Kill(t, h)
	daemontest.WaitGone(t, names[:3]...)
}

func init() {
	// low-limit-daemon runs zctipcd (its arguments) under an open-file limit
	// of 64 that it cannot raise: the limit is set in this process, which
	// then becomes the daemon, and a root test run first gives up the
	// capability that would let the daemon raise it again.
	testenv.Helpers["low-limit-daemon"] = func(args []string) error {
		runtime.LockOSThread() // the capability bounding set is the thread's, and so is execve
		if unix.Geteuid() == 0 {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_SYS_RESOURCE, 0, 0, 0); err != nil {
				return fmt.Errorf("prctl(PR_CAPBSET_DROP): %w", err)
			}
		}
		// syscall's Setrlimit, so that the exec keeps this limit rather than
		// the one this program started with.
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: 64, Max: 64}); err != nil {
			return fmt.Errorf("setrlimit: %w", err)
		}
		return syscall.Exec(args[0], args, os.Environ())
	}
}

// runLowLimitDaemon runs zctipcd for dir with an open-file limit of 64 that
// it cannot raise, and waits until it answers.
func runLowLimitDaemon(t *testing.T, dir string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	all := append([]string{daemontest.Exe(t), "-dir", dir, "-shm-dir", shm.Dir(), "-idle", "60s"}, args...)
	cmd.Env = append(os.Environ(), testenv.HelperEnv+"=low-limit-daemon", testenv.HelperEnv+"_ARGS="+strings.Join(all, "\x1f"))
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	require.Eventually(t, func() bool {
		c, err := daemon.Dial(dir, daemon.Launcher{}, nil)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "zctipcd came up")
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", cmd.Process.Pid))
	require.NoError(t, err)
	require.Regexp(t, `Max open files\s+64\s+64`, string(limits), "the daemon runs at the low limit")
	return cmd
}

// serves requires that a new client of dir gets its status, in the bounded
// time a busy machine may need.
func serves(t *testing.T, dir string) daemon.Status {
	t.Helper()
	var st daemon.Status
	var last error
	ok := assert.Eventually(t, func() bool {
		c, err := daemon.Dial(dir, daemon.Launcher{}, nil)
		if err != nil {
			last = err
			return false
		}
		defer c.Close()
		st, last = c.Status()
		return last == nil
	}, 30*time.Second, 20*time.Millisecond)
	require.True(t, ok, "the daemon no longer serves a new client: %v", last)
	return st
}

func TestADaemonStartedAtALowFileLimitServesAfterABurst(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	runLowLimitDaemon(t, dir)
	for round := range 3 {
		// 150 clients at once, more than the daemon has descriptors for:
		// some say hello, some say nothing, each hangs up.
		var wg sync.WaitGroup
		for i := range 150 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: filepath.Join(dir, daemon.SocketName), Net: "unixpacket"})
				if err != nil {
					return // a full backlog may refuse some
				}
				defer conn.Close()
				if i%2 == 0 {
					fdpass.Send(conn, []byte(`{"op":"status"}`))
					conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
					fdpass.Recv(conn, make([]byte, 64<<10), 0)
				}
			}()
		}
		wg.Wait()
		st := serves(t, dir)
		t.Logf("round %d: %d refused so far", round, st.Refused)
	}
}

func TestADaemonAtItsLimitAnswersEveryNewClient(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	runLowLimitDaemon(t, dir)
	conns := testenv.Flood(t, filepath.Join(dir, daemon.SocketName), 150)
	// Each new client is served, or refused with the reason: never hung up
	// on without a word, never left waiting for its deadline.
	for range 5 {
		c, err := daemon.Dial(dir, daemon.Launcher{}, nil)
		if err == nil {
			c.Close()
			continue
		}
		require.ErrorIs(t, err, daemon.ErrUnavailable)
		require.ErrorContains(t, err, "zctipcd is at its limit of")
	}
	for _, c := range conns {
		c.Close()
	}
	st := serves(t, dir)
	require.Positive(t, st.Refused)
}

func init() {
	// raw-daemon-client connects to the daemon and goes as far as its
	// argument says: "connect", "request" (a status request, unread), or
	// "answer" (the answer read). It prints the step it reached, then waits
	// for a line and prints what the connection holds: "reply" for an
	// unread answer, and "closed" once the daemon hung up.
	testenv.Helpers["raw-daemon-client"] = func(args []string) error {
		conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: filepath.Join(usersock.RuntimeDir(), daemon.SocketName), Net: "unixpacket"})
		if err != nil {
			return err
		}
		defer conn.Close()
		buf := make([]byte, 64<<10)
		if args[0] != "connect" {
			if err := fdpass.Send(conn, []byte(`{"op":"status"}`)); err != nil {
				return err
			}
		}
		if args[0] == "answer" {
			if _, _, err := fdpass.Recv(conn, buf, 0); err != nil {
				return err
			}
		}
		fmt.Println(args[0])
		if _, err := testenv.StdinLine(); err != nil {
			return err
		}
		conn.SetReadDeadline(time.Now().Add(time.Minute))
		for {
			n, _, err := fdpass.Recv(conn, buf, 0)
			if errors.Is(err, io.EOF) || err == nil && n == 0 {
				fmt.Println("closed")
				return nil
			}
			if err != nil {
				return err
			}
			fmt.Println("reply")
		}
	}
}

// Clients stopped (SIGSTOP) at each step of an exchange hold nothing: the
// daemon serves others meanwhile, and closes their connections once they
// said nothing for the silent period.
func TestADaemonServesWhileClientsAreStoppedMidExchange(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	runDaemon(t, dir, "-silent", "300ms")
	steps := []string{"connect", "request", "answer"}
	var stopped []*testenv.Helper
	for _, step := range steps {
		for range 3 {
			h := testenv.StartHelper(t, "raw-daemon-client", step)
			require.Equal(t, step, h.ReadLine(t))
			require.NoError(t, h.Cmd.Process.Signal(syscall.SIGSTOP))
			testenv.WaitStopped(t, h.Cmd.Process.Pid)
			stopped = append(stopped, h)
		}
	}
	serves(t, dir)
	for i, h := range stopped {
		require.NoError(t, h.Cmd.Process.Signal(syscall.SIGCONT))
		h.Send(t, "go on")
		if steps[i/3] == "request" {
			require.Equal(t, "reply", h.ReadLine(t), "the answer waited for the stopped client")
		}
		require.Equal(t, "closed", h.ReadLine(t), "the silent connection was closed")
		h.Wait(t)
	}
	serves(t, dir)
}

// Clients killed (SIGKILL) at each step of an exchange leave a daemon that
// serves the next one.
func TestADaemonServesAfterClientsAreKilledMidExchange(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	runDaemon(t, dir)
	for _, step := range []string{"connect", "request", "answer"} {
		for range 3 {
			h := testenv.StartHelper(t, "raw-daemon-client", step)
			require.Equal(t, step, h.ReadLine(t))
			testenv.Kill(t, h)
		}
		serves(t, dir)
	}
}

// A daemon that cannot read /proc (no descriptor left) has no news of a
// death: it gives up no count of a live process.
func TestADaemonWithNoDescriptorLeftSweepsNoLiveProcess(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	d := runDaemon(t, dir)
	h := daemontest.StartClient(t, "tracked-holder", nil)
	names := strings.Fields(h.ReadLine(t))
	require.Eventually(t, func() bool { return len(daemontest.Status(t).Clients) == 1 }, 5*time.Second, 10*time.Millisecond)
	var was unix.Rlimit
	require.NoError(t, unix.Prlimit(d.Process.Pid, unix.RLIMIT_NOFILE, nil, &was))
	require.NoError(t, unix.Prlimit(d.Process.Pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 3, Max: was.Max}, nil))
	time.Sleep(3 * time.Second) // three full checks of the watched processes
	require.NoError(t, unix.Prlimit(d.Process.Pid, unix.RLIMIT_NOFILE, &was, nil))
	st := serves(t, dir)
	require.Zero(t, st.Swept, "a live process was taken for dead")
	for _, n := range names[:3] {
		require.FileExists(t, filepath.Join(shm.Dir(), n))
	}
	testenv.Kill(t, h)
	daemontest.WaitGone(t, names[:3]...)
}
