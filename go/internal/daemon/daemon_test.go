package daemon_test

import (
	"bytes"
	"encoding/json"
	"fmt"
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
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/daemon"
	"github.com/zctipc/zctipc/go/internal/daemontest"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/fdpass"
	"github.com/zctipc/zctipc/go/internal/gc"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

func init() {
	// tracked-holder enables cleanup, then holds a segment of its own, a
	// pool slot, and (with an argument) a segment another process made;
	// it prints the names and waits to be killed.
	testenv.Helpers["tracked-holder"] = func(args []string) error {
		if _, err := daemon.Enable(daemon.Program(os.Getenv("ZCTIPC_TEST_DAEMON"))); err != nil {
			return err
		}
		seg, err := shm.Create("", header.KindTensor, dtype.Uint8, []int64{4096})
		if err != nil {
			return err
		}
		testenv.Fill(seg.Data())
		s, err := pool.Default().Alloc(1000, time.Time{})
		if err != nil {
			return err
		}
		ref := buffer.NewSlotRef(s)
		held := "-"
		if len(args) > 0 && args[0] != "" {
			other, err := shm.Attach(args[0], header.KindTensor, false)
			if err != nil {
				return err
			}
			held = other.Name()
		}
		fmt.Println(daemontest.LedgerOf(), seg.Name(), s.Arena().Name(), held)
		_, err = testenv.StdinLine()
		_ = ref
		return err
	}
}

func TestDaemonSweepsAKilledProcess(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	daemontest.WithRuntimeDir(t)
	h := daemontest.StartClient(t, "tracked-holder", nil)
	names := strings.Fields(h.ReadLine(t))
	ledgerFile, seg, arena := names[0], names[1], names[2]
	for _, n := range []string{ledgerFile, seg, arena} {
		require.FileExists(t, filepath.Join(shm.Dir(), n))
	}
	testenv.Kill(t, h)
	daemontest.WaitGone(t, ledgerFile, seg, arena)
	st := daemontest.Status(t)
	require.GreaterOrEqual(t, st.Swept, 1)
	require.GreaterOrEqual(t, st.Counts, 3, "its segment, its arena and its slot")
}

func TestDaemonRepairsTheCountsOfAKilledConsumer(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	daemontest.WithRuntimeDir(t)
	name := testenv.UniqueName(t)
	seg, err := shm.Create(name, header.KindTensor, dtype.Uint8, []int64{1 << 16})
	require.NoError(t, err)
	defer seg.Close()
	testenv.Fill(seg.Data())
	h := daemontest.StartClient(t, "tracked-holder", nil, name)
	names := strings.Fields(h.ReadLine(t))
	rc, err := seg.Refcount()
	require.NoError(t, err)
	require.EqualValues(t, 2, rc, "the consumer counts")
	testenv.Kill(t, h)
	daemontest.WaitGone(t, names[0], names[1], names[2])
	require.Eventually(t, func() bool { rc, _ := seg.Refcount(); return rc == 1 }, daemontest.SweepTimeout, 10*time.Millisecond,
		"the consumer's count is given up")
	require.FileExists(t, testenv.SegmentPath(name), "the producer's segment stays")
	data := append([]byte(nil), seg.Data()...)
	testenv.Fill(data)
	require.Equal(t, data, seg.Data(), "and its data is intact")
	// A second sweep changes nothing.
	self, err := proc.Self()
	require.NoError(t, err)
	rep, err := gc.Collect(self, gc.Options{Confirm: 50 * time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, rep.Removed)
	require.Empty(t, rep.Ledgers)
	rc, err = seg.Refcount()
	require.NoError(t, err)
	require.EqualValues(t, 1, rc)
}

func TestANewDaemonRecoversWhatAKilledOneLeft(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	a := daemontest.StartClient(t, "tracked-holder", nil)
	first := strings.Fields(a.ReadLine(t))
	b := daemontest.StartClient(t, "tracked-holder", nil)
	second := strings.Fields(b.ReadLine(t))
	pid := daemon.RunningPID(dir)
	require.NotZero(t, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return daemon.RunningPID(dir) == 0 }, daemontest.SweepTimeout, 5*time.Millisecond)
	testenv.Kill(t, a) // dies while no daemon runs
	time.Sleep(100 * time.Millisecond)
	for _, n := range first[:3] {
		require.FileExists(t, filepath.Join(shm.Dir(), n), "nobody cleaned up yet")
	}
	// The next daemon: sweeps the dead one, watches the live one.
	c, err := daemon.Dial(dir, daemon.Program(daemontest.Exe(t)), nil)
	require.NoError(t, err)
	defer c.Close()
	daemontest.WaitGone(t, first[:3]...)
	require.Eventually(t, func() bool {
		st, err := c.Status()
		return err == nil && len(st.Clients) == 1 && st.Clients[0].Ledger == second[0]
	}, daemontest.SweepTimeout, 10*time.Millisecond, "the live client is watched again")
	testenv.Kill(t, b)
	daemontest.WaitGone(t, second[:3]...)
}

func TestTwoDaemonsNeverServeOneDirectory(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	exe := daemontest.Exe(t)
	var outs [2]bytes.Buffer
	var cmds [2]*exec.Cmd
	for i := range cmds {
		cmds[i] = exec.Command(exe, "-dir", dir, "-idle", "300ms")
		cmds[i].Stderr = &outs[i]
	}
	for _, c := range cmds {
		require.NoError(t, c.Start())
	}
	for _, c := range cmds {
		require.NoError(t, c.Wait())
	}
	refused := 0
	for i := range outs {
		if strings.Contains(outs[i].String(), "another zctipcd serves this directory") {
			refused++
		}
	}
	require.Equal(t, 1, refused, "one daemon wins: %q / %q", outs[0].String(), outs[1].String())
}

// rawRequest sends one request with fds over a fresh connection and
// returns the reply.
func rawRequest(t *testing.T, conn *net.UnixConn, body []byte, fds ...int) daemon.Reply {
	t.Helper()
	require.NoError(t, fdpass.Send(conn, body, fds...))
	buf := make([]byte, 1<<16)
	n, got, err := fdpass.Recv(conn, buf, 1)
	require.NoError(t, err)
	for _, fd := range got {
		unix.Close(fd)
	}
	var rep daemon.Reply
	require.NoError(t, json.Unmarshal(buf[:n], &rep))
	return rep
}

func countFDs(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	require.NoError(t, err)
	return len(entries)
}

func TestDaemonRefusesHostileRequests(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	c, err := daemon.Dial(dir, daemon.Program(daemontest.Exe(t)), nil)
	require.NoError(t, err)
	defer c.Close()
	pid := daemon.RunningPID(dir)
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: filepath.Join(dir, daemon.SocketName), Net: "unixpacket"})
	require.NoError(t, err)
	defer conn.Close()
	// Another process's ledger cannot be passed off as the peer's.
	h := daemontest.StartClient(t, "tracked-holder", nil)
	other := strings.Fields(h.ReadLine(t))
	rep := rawRequest(t, conn, []byte(`{"op":"hello","ledger":"`+other[0]+`"}`))
	require.Contains(t, rep.Error, "belongs to pid")
	testenv.Kill(t, h)
	daemontest.WaitGone(t, other[:3]...)
	before := countFDs(t, pid)

	devnull := testenv.OpenFiles(t, 3)
	fake := shm.FDPrefix + "0123456789abcdef0123456789abcdef"
	cases := []struct {
		what, body, want string
		fds              []int
	}{
		{"a plain file as a memfd", `{"op":"put","name":"` + fake + `"}`, "not a sealed memfd", devnull[:1]},
		{"three descriptors", `{"op":"put","name":"` + fake + `"}`, "malformed file-descriptor message", devnull},
		{"a descriptor where none goes", `{"op":"status"}`, "a file descriptor came with", devnull[:1]},
		{"not JSON", `{"op":`, "bad request", nil},
		{"an unknown request", `{"op":"format-disk"}`, "unknown request", nil},
		{"a memfd nobody put", `{"op":"get","name":"` + fake + `"}`, "not known to zctipcd", nil},
		{"a ledger that does not exist", `{"op":"hello","ledger":"zctipc_nosuchledger"}`, "does not exist", nil},
	}
	for _, tc := range cases {
		rep := rawRequest(t, conn, []byte(tc.body), tc.fds...)
		require.Contains(t, rep.Error, tc.want, tc.what)
	}
	// At most as many: the killed helper's connection may close meanwhile.
	require.LessOrEqual(t, countFDs(t, pid), before, "the daemon kept no descriptor it was sent")
	_, err = c.Status()
	require.NoError(t, err, "and it still serves")
}

func init() {
	// memfd-holder makes, under the file_descriptor strategy, a tensor
	// segment, a pool slot and a queue, prints their names, and waits.
	testenv.Helpers["memfd-holder"] = func(args []string) error {
		if _, err := daemon.Enable(daemon.Program(os.Getenv("ZCTIPC_TEST_DAEMON"))); err != nil {
			return err
		}
		seg, err := shm.Create("", header.KindTensor, dtype.Uint8, []int64{1 << 16})
		if err != nil {
			return err
		}
		testenv.Fill(seg.Data())
		s, err := pool.Default().Alloc(1000, time.Time{})
		if err != nil {
			return err
		}
		_ = buffer.NewSlotRef(s)
		q, err := queue.Create("", 1<<16, 0)
		if err != nil {
			return err
		}
		defer q.Close()
		fmt.Println(daemontest.LedgerOf(), seg.Name(), s.Arena().Name())
		_, err = testenv.StdinLine()
		return err
	}
	// memfd-reader attaches a memfd segment by name (through the daemon)
	// and prints the digest of its data.
	testenv.Helpers["memfd-reader"] = func(args []string) error {
		if _, err := daemon.Enable(daemon.Program(os.Getenv("ZCTIPC_TEST_DAEMON"))); err != nil {
			return err
		}
		seg, err := shm.Attach(args[0], header.KindTensor, true)
		if err != nil {
			return err
		}
		fmt.Println(testenv.Digest(seg.Data()), fdpass.OpenFiles())
		_, err = testenv.StdinLine()
		return err
	}
}

func TestMemfdStrategyLeavesNothingWhateverDies(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	dir := daemontest.WithRuntimeDir(t)
	before := daemontest.DirNames(t)
	env := []string{shm.StrategyEnv + "=file_descriptor"}
	h := daemontest.StartClient(t, "memfd-holder", env)
	names := strings.Fields(h.ReadLine(t))
	for _, n := range names {
		require.True(t, shm.IsFDName(n), "%s is a memfd", n)
	}
	r := daemontest.StartClient(t, "memfd-reader", env, names[1])
	want := make([]byte, 1<<16)
	testenv.Fill(want)
	fields := strings.Fields(r.ReadLine(t))
	require.Equal(t, testenv.Digest(want), fields[0], "the reader maps the producer's memfd")
	require.Equal(t, before, daemontest.DirNames(t), "nothing in the segment directory")
	c, err := daemon.Dial(dir, daemon.Launcher{}, nil)
	require.NoError(t, err)
	defer c.Close()
	st, err := c.Status()
	require.NoError(t, err)
	require.Len(t, st.Segments, 3, "the daemon keeps the tensor, the arena and the queue")
	testenv.Kill(t, h)
	testenv.Kill(t, r)
	require.Eventually(t, func() bool {
		st, err := c.Status()
		return err == nil && len(st.Segments) == 0 && len(st.Clients) == 0
	}, daemontest.SweepTimeout, 10*time.Millisecond, "every count given up, every memfd let go")
	require.Equal(t, before, daemontest.DirNames(t))
}

func init() {
	// stalled-create enables cleanup and makes a segment with the stall
	// point of $ZCTIPC_TEST_STALL, where it stops until it is killed.
	testenv.Helpers["stalled-create"] = func(args []string) error {
		if _, err := daemon.Enable(daemon.Program(os.Getenv("ZCTIPC_TEST_DAEMON"))); err != nil {
			return err
		}
		fmt.Println(daemontest.LedgerOf())
		_, err := shm.Create(args[0], header.KindTensor, dtype.Uint8, []int64{1 << 20})
		return err
	}
}

func TestACreatorKilledHalfWayLeavesNothing(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	daemontest.WithRuntimeDir(t)
	for _, point := range []string{"create-open", "create-reserve", "create-rename"} {
		t.Run(point, func(t *testing.T) {
			name := testenv.UniqueName(t)
			h := daemontest.StartClient(t, "stalled-create", []string{shm.StallEnv + "=" + point}, name)
			led := h.ReadLine(t)
			// Wait for the file the stall leaves: temporary, or renamed.
			require.Eventually(t, func() bool {
				for _, n := range daemontest.DirNames(t) {
					if strings.HasPrefix(n, shm.TmpPrefix) || n == shm.Prefix+name {
						return true
					}
				}
				return false
			}, daemontest.SweepTimeout, 5*time.Millisecond)
			testenv.Kill(t, h)
			daemontest.WaitGone(t, led, shm.Prefix+name)
			require.Eventually(t, func() bool {
				for _, n := range daemontest.DirNames(t) {
					if strings.HasPrefix(n, shm.TmpPrefix) {
						return false
					}
				}
				return true
			}, daemontest.SweepTimeout, 10*time.Millisecond, "no temporary file is left")
		})
	}
}

// The daemon's log never grows past about twice MaxLogBytes: a full log
// becomes daemon.log.1, and nothing written is lost in the move.
func TestDaemonLogIsCapped(t *testing.T) {
	path := filepath.Join(t.TempDir(), daemon.LogName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	require.NoError(t, err)
	fd, err := unix.Dup(int(f.Fd()))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	defer unix.Close(fd)
	log := daemon.NewLog(path, fd)
	line := []byte(strings.Repeat("x", 999) + "\n")
	n := 3*daemon.MaxLogBytes/len(line) + 1
	for range n {
		_, err := log.Write(line)
		require.NoError(t, err)
	}
	cur, err := os.Stat(path)
	require.NoError(t, err)
	old, err := os.Stat(path + ".1")
	require.NoError(t, err)
	require.LessOrEqual(t, cur.Size(), int64(daemon.MaxLogBytes))
	require.LessOrEqual(t, old.Size(), int64(daemon.MaxLogBytes))
	require.Zero(t, (cur.Size()+old.Size())%int64(len(line)), "only whole lines move")
	require.Greater(t, cur.Size(), int64(0))
}
