package gotests

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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/daemon"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/fdpass"
	"github.com/zctipc/zctipc/go/internal/gc"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/ledger"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/usersock"
	"golang.org/x/sys/unix"
)

// sweepTimeout is how long the daemon may take to clean up after a death.
const sweepTimeout = 10 * time.Second

var daemonBuild struct {
	once sync.Once
	exe  string
	err  error
}

// daemonExe builds zctipcd once per test run and returns its path.
func daemonExe(t *testing.T) string {
	t.Helper()
	daemonBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "zctipcd-build-")
		if err != nil {
			daemonBuild.err = err
			return
		}
		exe := filepath.Join(dir, "zctipcd")
		out, err := exec.Command("go", "build", "-o", exe, "github.com/zctipc/zctipc/go/cmd/zctipcd").CombinedOutput()
		if err != nil {
			daemonBuild.err = fmt.Errorf("go build zctipcd: %v: %s", err, out)
			return
		}
		daemonBuild.exe = exe
	})
	require.NoError(t, daemonBuild.err)
	return daemonBuild.exe
}

// stopDaemon kills the daemon serving dir, if one does, and waits for it.
func stopDaemon(dir string) {
	pid := daemon.RunningPID(dir)
	if pid == 0 {
		return
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 200 && daemon.RunningPID(dir) != 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
}

// removeDaemonBuild removes what daemonExe built.
func removeDaemonBuild() {
	if daemonBuild.exe != "" {
		os.RemoveAll(filepath.Dir(daemonBuild.exe))
	}
}

// withRuntimeDir gives the test a runtime directory of its own, so that its
// daemon is its own, and stops that daemon after the test.
func withRuntimeDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	t.Setenv(usersock.RuntimeDirEnv, dir)
	t.Cleanup(func() { stopDaemon(dir) })
	return dir
}

// startClient runs a helper process that says hello to the daemon (starting
// it) and then runs the named helper body.
func startClient(t *testing.T, name string, env []string, args ...string) *helper {
	t.Helper()
	exe := daemonExe(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+name, helperEnv+"_ARGS="+strings.Join(args, "\x1f"),
		"ZCTIPC_TEST_DAEMON="+exe), env...)
	return runHelperCmd(t, cmd)
}

// waitGone waits until none of names is in the segment directory.
func waitGone(t *testing.T, names ...string) {
	t.Helper()
	deadline := time.Now().Add(sweepTimeout)
	for {
		var left []string
		for _, n := range names {
			if _, err := os.Lstat(filepath.Join(shm.Dir(), n)); err == nil {
				left = append(left, n)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still there %v after %v: %v", sweepTimeout, left, dirNames(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func dirNames(t *testing.T) []string {
	t.Helper()
	names, err := shm.List()
	require.NoError(t, err)
	return names
}

func kill(t *testing.T, h *helper) {
	t.Helper()
	require.NoError(t, h.cmd.Process.Kill())
	_ = h.cmd.Wait()
}

func init() {
	// tracked-holder enables cleanup, then holds a segment of its own, a
	// pool slot, and (with an argument) a segment another process made;
	// it prints the names and waits to be killed.
	helpers["tracked-holder"] = func(args []string) error {
		if _, err := daemon.Enable(daemon.Program(os.Getenv("ZCTIPC_TEST_DAEMON"))); err != nil {
			return err
		}
		seg, err := shm.Create("", header.KindTensor, dtype.Uint8, []int64{4096})
		if err != nil {
			return err
		}
		fill(seg.Data())
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
		fmt.Println(ledgerOf(), seg.Name(), s.Arena().Name(), held)
		_, err = stdinLine()
		_ = ref
		return err
	}
}

// ledgerOf returns the name of this process's ledger.
func ledgerOf() string { return ledger.Current().Name() }

func TestDaemonSweepsAKilledProcess(t *testing.T) {
	withRuntimeDir(t)
	h := startClient(t, "tracked-holder", nil)
	names := strings.Fields(h.readLine(t))
	ledgerFile, seg, arena := names[0], names[1], names[2]
	for _, n := range []string{ledgerFile, seg, arena} {
		require.FileExists(t, filepath.Join(shm.Dir(), n))
	}
	kill(t, h)
	waitGone(t, ledgerFile, seg, arena)
	st := status(t)
	require.GreaterOrEqual(t, st.Swept, 1)
	require.GreaterOrEqual(t, st.Counts, 3, "its segment, its arena and its slot")
}

// status returns the status of the test's daemon.
func status(t *testing.T) daemon.Status {
	t.Helper()
	c, err := daemon.Dial(usersock.RuntimeDir(), daemon.Launcher{}, nil)
	require.NoError(t, err)
	defer c.Close()
	st, err := c.Status()
	require.NoError(t, err)
	return st
}

func TestDaemonRepairsTheCountsOfAKilledConsumer(t *testing.T) {
	withRuntimeDir(t)
	name := uniqueName(t)
	seg, err := shm.Create(name, header.KindTensor, dtype.Uint8, []int64{1 << 16})
	require.NoError(t, err)
	defer seg.Close()
	fill(seg.Data())
	h := startClient(t, "tracked-holder", nil, name)
	names := strings.Fields(h.readLine(t))
	rc, err := seg.Refcount()
	require.NoError(t, err)
	require.EqualValues(t, 2, rc, "the consumer counts")
	kill(t, h)
	waitGone(t, names[0], names[1], names[2])
	require.Eventually(t, func() bool { rc, _ := seg.Refcount(); return rc == 1 }, sweepTimeout, 10*time.Millisecond,
		"the consumer's count is given up")
	require.FileExists(t, segmentPath(name), "the producer's segment stays")
	data := append([]byte(nil), seg.Data()...)
	fill(data)
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
	dir := withRuntimeDir(t)
	a := startClient(t, "tracked-holder", nil)
	first := strings.Fields(a.readLine(t))
	b := startClient(t, "tracked-holder", nil)
	second := strings.Fields(b.readLine(t))
	pid := daemon.RunningPID(dir)
	require.NotZero(t, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return daemon.RunningPID(dir) == 0 }, sweepTimeout, 5*time.Millisecond)
	kill(t, a) // dies while no daemon runs
	time.Sleep(100 * time.Millisecond)
	for _, n := range first[:3] {
		require.FileExists(t, filepath.Join(shm.Dir(), n), "nobody cleaned up yet")
	}
	// The next daemon: sweeps the dead one, watches the live one.
	c, err := daemon.Dial(dir, daemon.Program(daemonExe(t)), nil)
	require.NoError(t, err)
	defer c.Close()
	waitGone(t, first[:3]...)
	require.Eventually(t, func() bool {
		st, err := c.Status()
		return err == nil && len(st.Clients) == 1 && st.Clients[0].Ledger == second[0]
	}, sweepTimeout, 10*time.Millisecond, "the live client is watched again")
	kill(t, b)
	waitGone(t, second[:3]...)
}

func TestTwoDaemonsNeverServeOneDirectory(t *testing.T) {
	dir := withRuntimeDir(t)
	exe := daemonExe(t)
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
	dir := withRuntimeDir(t)
	c, err := daemon.Dial(dir, daemon.Program(daemonExe(t)), nil)
	require.NoError(t, err)
	defer c.Close()
	pid := daemon.RunningPID(dir)
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: filepath.Join(dir, daemon.SocketName), Net: "unixpacket"})
	require.NoError(t, err)
	defer conn.Close()
	// Another process's ledger cannot be passed off as the peer's.
	h := startClient(t, "tracked-holder", nil)
	other := strings.Fields(h.readLine(t))
	rep := rawRequest(t, conn, []byte(`{"op":"hello","ledger":"`+other[0]+`"}`))
	require.Contains(t, rep.Error, "belongs to pid")
	kill(t, h)
	waitGone(t, other[:3]...)
	before := countFDs(t, pid)

	devnull := openFiles(t, 3)
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
	helpers["memfd-holder"] = func(args []string) error {
		if _, err := daemon.Enable(daemon.Program(os.Getenv("ZCTIPC_TEST_DAEMON"))); err != nil {
			return err
		}
		seg, err := shm.Create("", header.KindTensor, dtype.Uint8, []int64{1 << 16})
		if err != nil {
			return err
		}
		fill(seg.Data())
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
		fmt.Println(ledgerOf(), seg.Name(), s.Arena().Name())
		_, err = stdinLine()
		return err
	}
	// memfd-reader attaches a memfd segment by name (through the daemon)
	// and prints the digest of its data.
	helpers["memfd-reader"] = func(args []string) error {
		if _, err := daemon.Enable(daemon.Program(os.Getenv("ZCTIPC_TEST_DAEMON"))); err != nil {
			return err
		}
		seg, err := shm.Attach(args[0], header.KindTensor, true)
		if err != nil {
			return err
		}
		fmt.Println(digest(seg.Data()), fdpass.OpenFiles())
		_, err = stdinLine()
		return err
	}
}

func TestMemfdStrategyLeavesNothingWhateverDies(t *testing.T) {
	dir := withRuntimeDir(t)
	before := dirNames(t)
	env := []string{shm.StrategyEnv + "=file_descriptor"}
	h := startClient(t, "memfd-holder", env)
	names := strings.Fields(h.readLine(t))
	for _, n := range names {
		require.True(t, shm.IsFDName(n), "%s is a memfd", n)
	}
	r := startClient(t, "memfd-reader", env, names[1])
	want := make([]byte, 1<<16)
	fill(want)
	fields := strings.Fields(r.readLine(t))
	require.Equal(t, digest(want), fields[0], "the reader maps the producer's memfd")
	require.Equal(t, before, dirNames(t), "nothing in the segment directory")
	c, err := daemon.Dial(dir, daemon.Launcher{}, nil)
	require.NoError(t, err)
	defer c.Close()
	st, err := c.Status()
	require.NoError(t, err)
	require.Len(t, st.Segments, 3, "the daemon keeps the tensor, the arena and the queue")
	kill(t, h)
	kill(t, r)
	require.Eventually(t, func() bool {
		st, err := c.Status()
		return err == nil && len(st.Segments) == 0 && len(st.Clients) == 0
	}, sweepTimeout, 10*time.Millisecond, "every count given up, every memfd let go")
	require.Equal(t, before, dirNames(t))
}

func init() {
	// untracked-orphan makes a segment without a ledger and exits without
	// letting go of it, as a process that is killed does.
	helpers["untracked-orphan"] = func(args []string) error {
		seg, err := shm.Create(args[0], header.KindTensor, dtype.Uint8, []int64{64})
		if err != nil {
			return err
		}
		fmt.Println(seg.Name())
		os.Exit(0)
		return nil
	}
}

func TestCollectRemovesOrphansAndDebris(t *testing.T) {
	self, err := proc.Self()
	require.NoError(t, err)
	orphan := uniqueName(t)
	h := startHelper(t, "untracked-orphan", orphan)
	full := h.readLine(t)
	h.wait(t)
	// Debris of creations that died half-way: old enough to be dead, and
	// one that may still be in progress.
	old := time.Now().Add(-time.Hour)
	oldTmp := filepath.Join(shm.Dir(), shm.TmpPrefix+"00000000000000000000000000000001")
	newTmp := filepath.Join(shm.Dir(), shm.TmpPrefix+"00000000000000000000000000000002")
	junk := filepath.Join(shm.Dir(), shm.Prefix+"junk_"+strconv.Itoa(os.Getpid()))
	for _, p := range []string{oldTmp, newTmp, junk} {
		require.NoError(t, os.WriteFile(p, []byte("half"), 0o600))
	}
	require.NoError(t, os.Chtimes(oldTmp, old, old))
	require.NoError(t, os.Chtimes(junk, old, old))
	defer os.Remove(newTmp)

	// The daemon's rule leaves alone what an untracked process made.
	rep, err := gc.Collect(self, gc.Options{TrackedOnly: true, DryRun: true})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{filepath.Base(oldTmp), filepath.Base(junk)}, removedNames(rep))
	// A dry run removes nothing.
	rep, err = gc.Collect(self, gc.Options{DryRun: true})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{full, filepath.Base(oldTmp), filepath.Base(junk)}, removedNames(rep))
	require.FileExists(t, segmentPath(orphan))
	rep, err = gc.Collect(self, gc.Options{Confirm: 20 * time.Millisecond})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{full, filepath.Base(oldTmp), filepath.Base(junk)}, removedNames(rep))
	require.NoFileExists(t, segmentPath(orphan))
	require.NoFileExists(t, oldTmp)
	require.FileExists(t, newTmp, "a creation that may be in progress stays")
	for _, r := range rep.Removed {
		if r.Name == full {
			require.Contains(t, r.Reason, "no live holder")
		}
	}
}

func removedNames(rep gc.Report) []string {
	var out []string
	for _, r := range rep.Removed {
		out = append(out, r.Name)
	}
	return out
}

func init() {
	// stalled-create enables cleanup and makes a segment with the stall
	// point of $ZCTIPC_TEST_STALL, where it stops until it is killed.
	helpers["stalled-create"] = func(args []string) error {
		if _, err := daemon.Enable(daemon.Program(os.Getenv("ZCTIPC_TEST_DAEMON"))); err != nil {
			return err
		}
		fmt.Println(ledgerOf())
		_, err := shm.Create(args[0], header.KindTensor, dtype.Uint8, []int64{1 << 20})
		return err
	}
}

func TestACreatorKilledHalfWayLeavesNothing(t *testing.T) {
	withRuntimeDir(t)
	for _, point := range []string{"create-open", "create-reserve", "create-rename"} {
		t.Run(point, func(t *testing.T) {
			name := uniqueName(t)
			h := startClient(t, "stalled-create", []string{shm.StallEnv + "=" + point}, name)
			led := h.readLine(t)
			// Wait for the file the stall leaves: temporary, or renamed.
			require.Eventually(t, func() bool {
				for _, n := range dirNames(t) {
					if strings.HasPrefix(n, shm.TmpPrefix) || n == shm.Prefix+name {
						return true
					}
				}
				return false
			}, sweepTimeout, 5*time.Millisecond)
			kill(t, h)
			waitGone(t, led, shm.Prefix+name)
			require.Eventually(t, func() bool {
				for _, n := range dirNames(t) {
					if strings.HasPrefix(n, shm.TmpPrefix) {
						return false
					}
				}
				return true
			}, sweepTimeout, 10*time.Millisecond, "no temporary file is left")
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
