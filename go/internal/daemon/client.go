package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zctipc/zctipc/go/internal/fdpass"
	"github.com/zctipc/zctipc/go/internal/gc"
	"github.com/zctipc/zctipc/go/internal/ledger"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/usersock"
	"github.com/zctipc/zctipc/go/internal/version"
	"golang.org/x/sys/unix"
)

// IdleEnv names the environment variable that sets, in seconds, how long a
// daemon that a client starts waits idle before it exits.
const IdleEnv = "ZCTIPC_DAEMON_IDLE"

// Deadlines of a client.
const (
	// connectFor bounds how long a client tries to reach a daemon it
	// started.
	connectFor = 5 * time.Second
	// answerFor bounds one exchange with the daemon: a stopped or wedged
	// daemon makes the call fail with ErrUnavailable, never hang.
	answerFor = 2 * time.Second
	// collectFor bounds an exchange that runs an orphan collection.
	collectFor = 60 * time.Second
)

// Client is a process's connection to its daemon, which it reconnects (and
// restarts the daemon) when the daemon went away. It is the process's
// broker of memfd segments. It is safe for concurrent use; every exchange
// with the daemon has a deadline.
type Client struct {
	dir    string
	launch Launcher // how to start a daemon when none runs
	led    *ledger.Ledger

	mu   sync.Mutex
	conn *net.UnixConn
	pid  int64 // the daemon's
	buf  []byte
}

// Dial connects to the daemon of dir and says hello with led (when not
// nil), first starting one with l when none runs (none with the zero
// Launcher).
func Dial(dir string, l Launcher, led *ledger.Ledger) (*Client, error) {
	c := &Client{dir: dir, launch: l, led: led, buf: make([]byte, maxMessage)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.connect(); err != nil {
		return nil, err
	}
	return c, nil
}

// DaemonPID returns the pid of the daemon the client last reached.
func (c *Client) DaemonPID() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pid
}

// connect reaches the daemon, starting it when needed, and says hello. The
// caller holds c.mu.
func (c *Client) connect() error {
	if err := usersock.EnsureDir(c.dir); err != nil {
		return err
	}
	path := filepath.Join(c.dir, SocketName)
	dialer := net.Dialer{Timeout: answerFor}
	deadline := time.Now().Add(connectFor)
	var started time.Time
	wait := time.Millisecond
	for {
		conn, err := dialer.Dial("unixpacket", path)
		if err == nil {
			c.conn = conn.(*net.UnixConn)
			if err = c.hello(); err == nil {
				return nil
			}
			conn.Close()
			c.conn = nil
			if !retryable(err) {
				if errors.Is(err, ErrUnavailable) {
					return err
				}
				return fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
		}
		if c.launch.Path == "" {
			return fmt.Errorf("%w: none serves %s: %w", ErrUnavailable, c.dir, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s did not come up in %v for %s: %w; see %s",
				ErrUnavailable, c.launch.Path, connectFor, c.dir, err, filepath.Join(c.dir, LogName))
		}
		if time.Since(started) > 500*time.Millisecond {
			started = time.Now()
			if serr := c.start(); serr != nil {
				return serr
			}
		}
		time.Sleep(wait)
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// retryable reports whether err means the daemon went away.
func retryable(err error) bool {
	return errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPIPE) ||
		errors.Is(err, unix.ECONNRESET) || errors.Is(err, errHungUp)
}

var errHungUp = errors.New("zctipcd hung up")

// ErrUnavailable is wrapped by the errors of a client that cannot reach a
// daemon.
var ErrUnavailable = errors.New("the cleanup daemon zctipcd is unavailable")

// start launches the daemon, detached: the daemon starts itself again in a
// new session and exits, so that it is nobody's child.
func (c *Client) start() error {
	args := []string{"-detach", "-dir", c.dir, "-shm-dir", shm.Dir()}
	if v := os.Getenv(IdleEnv); v != "" {
		args = append(args, "-idle", v+"s")
	}
	cmd := exec.Command(c.launch.Path, args...)
	cmd.Env = append([]string{}, c.launch.Env...) // all else it needs is in its arguments
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: start %s: %w: %s", ErrUnavailable, c.launch.Path, err, out)
	}
	return nil
}

// hello tells the daemon which ledger to watch. The caller holds c.mu.
func (c *Client) hello() error {
	req := Request{Op: OpHello, Version: version.Version}
	fd := -1
	if c.led != nil {
		req.Ledger = c.led.Name()
		if shm.IsFDName(req.Ledger) {
			fd = c.led.FD()
		}
	}
	rep, _, err := c.roundTrip(&req, fd)
	if err != nil {
		return err
	}
	if rep.Status != nil {
		c.pid = rep.Status.PID
	}
	return nil
}

// roundTrip sends one request and reads its reply, with the descriptor that
// came with it (or -1). The caller holds c.mu.
func (c *Client) roundTrip(req *Request, fd int) (*Reply, int, error) {
	b, err := encode(req)
	if err != nil {
		return nil, -1, err
	}
	var fds []int
	if fd >= 0 {
		fds = []int{fd}
	}
	limit := answerFor
	if req.Op == OpGC {
		limit = collectFor
	}
	if err := c.conn.SetDeadline(time.Now().Add(limit)); err != nil {
		return nil, -1, err
	}
	if err := fdpass.Send(c.conn, b, fds...); err != nil {
		if rep := c.refusal(); rep != nil { // it answered before it hung up
			return rep, -1, rep.err()
		}
		return nil, -1, c.timedOut(err, limit)
	}
	want := 0
	if req.Op == OpGet {
		want = 1
	}
	n, got, err := fdpass.Recv(c.conn, c.buf, want)
	if err != nil {
		if rep := c.refusal(); rep != nil { // ECONNRESET comes before the answer that waits
			return rep, -1, rep.err()
		}
		return nil, -1, c.timedOut(err, limit)
	}
	if n == 0 {
		closeFDs(got)
		return nil, -1, errHungUp
	}
	var rep Reply
	if err := json.Unmarshal(c.buf[:n], &rep); err != nil {
		closeFDs(got)
		return nil, -1, fmt.Errorf("bad reply from zctipcd: %w", err)
	}
	out := -1
	if len(got) == 1 {
		out = got[0]
	}
	if err := rep.err(); err != nil {
		if out >= 0 {
			unix.Close(out)
		}
		return &rep, -1, err
	}
	return &rep, out, nil
}

// refusal returns the reply that waits on a connection the daemon closed
// (the reason it refused the connection), or nil: a daemon that refuses a
// connection answers it and hangs up, and the client's send then fails
// with EPIPE, or its read with ECONNRESET, before it reads the answer. The
// caller holds c.mu.
func (c *Client) refusal() *Reply {
	raw, err := c.conn.SyscallConn()
	if err != nil {
		return nil
	}
	n := -1
	raw.Read(func(fd uintptr) bool {
		n, _, _ = unix.Recvfrom(int(fd), c.buf, unix.MSG_DONTWAIT)
		return true
	})
	var rep Reply
	if n <= 0 || json.Unmarshal(c.buf[:n], &rep) != nil || rep.Error == "" {
		return nil
	}
	return &rep
}

// timedOut turns a deadline that passed into ErrUnavailable, naming the
// daemon that did not answer. The caller holds c.mu.
func (c *Client) timedOut(err error, limit time.Duration) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	c.conn.Close() // a late reply would answer the next request
	c.conn = nil
	return fmt.Errorf("%w: zctipcd (pid %d) of %s did not answer within %v: it is stopped, wedged or "+
		"overloaded (see %s)", ErrUnavailable, RunningPID(c.dir), c.dir, limit, filepath.Join(c.dir, LogName))
}

// call sends a request, reconnecting once when the daemon went away.
func (c *Client) call(req *Request, fd int) (*Reply, int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		if c.conn == nil {
			if err := c.connect(); err != nil {
				return nil, -1, err
			}
		}
		rep, out, err := c.roundTrip(req, fd)
		if err == nil || attempt > 0 || !retryable(err) {
			return rep, out, err
		}
		if c.conn != nil {
			c.conn.Close()
			c.conn = nil
		}
	}
}

// Put hands a new memfd segment to the daemon.
func (c *Client) Put(name string, fd int) error {
	_, _, err := c.call(&Request{Op: OpPut, Name: name}, fd)
	return err
}

// Fetch returns a descriptor of memfd segment name, from the daemon.
func (c *Client) Fetch(name string) (int, error) {
	_, fd, err := c.call(&Request{Op: OpGet, Name: name}, -1)
	if err == nil && fd < 0 {
		err = fmt.Errorf("zctipcd sent no descriptor for segment %q: %w", name, unix.EPROTO)
	}
	return fd, err
}

// Drop tells the daemon that the count of memfd segment name reached zero.
func (c *Client) Drop(name string) { c.call(&Request{Op: OpDrop, Name: name}, -1) }

// Status returns the daemon's status.
func (c *Client) Status() (Status, error) {
	rep, _, err := c.call(&Request{Op: OpStatus}, -1)
	if err != nil {
		return Status{}, err
	}
	if rep.Status == nil {
		return Status{}, fmt.Errorf("zctipcd sent no status: %w", unix.EPROTO)
	}
	return *rep.Status, nil
}

// Close closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// The process's own cleanup: its ledger and its client.
var current atomic.Pointer[Client]

// Enable makes this process record its counts in a ledger and says hello to
// the user's daemon, starting one with l when none runs (none with the zero
// Launcher: the ledger then waits for the next daemon to find it). The
// daemon becomes the broker of memfd segments. It returns the client, or the
// error of reaching the daemon (the ledger is kept either way).
func Enable(l Launcher) (*Client, error) {
	if c := current.Load(); c != nil {
		return c, nil
	}
	if _, err := fdpass.RaiseLimit(); err != nil {
		// Not fatal: receiving descriptors at the limit fails with an error
		// that names it.
		fmt.Fprintln(os.Stderr, "zctipc: cannot raise RLIMIT_NOFILE:", err)
	}
	led, err := ledger.Enable()
	if err != nil {
		return nil, err
	}
	c, err := Dial(usersock.RuntimeDir(), l, led)
	if err != nil {
		return nil, err
	}
	if !current.CompareAndSwap(nil, c) {
		c.Close()
		return current.Load(), nil
	}
	shm.SetBroker(c)
	return c, nil
}

// Current returns the process's client, or nil.
func Current() *Client { return current.Load() }

// Disable removes the process's ledger and closes its client, once it gave
// up its counts (at exit).
func Disable() error {
	var errs []error
	if l := ledger.Current(); l != nil {
		errs = append(errs, l.Close())
	}
	if c := current.Swap(nil); c != nil {
		shm.SetBroker(nil)
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// Collect asks the daemon to sweep the ledgers of dead processes and remove
// the segments that no live process holds (only report them with dryRun).
func (c *Client) Collect(dryRun bool) (gc.Report, error) {
	rep, _, err := c.call(&Request{Op: OpGC, DryRun: dryRun}, -1)
	if rep == nil || rep.Report == nil {
		return gc.Report{}, err
	}
	return *rep.Report, err
}
