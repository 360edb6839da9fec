package cuda

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zctipc/zctipc/go/internal/fdpass"
	"github.com/zctipc/zctipc/go/internal/usersock"
	"golang.org/x/sys/unix"
)

// A process that shares VMM allocations serves their file descriptors on
// a SOCK_SEQPACKET socket of its own, cuda-<pid>.sock in the user's 0700
// runtime directory: a consumer sends a share name and gets back the
// allocation's descriptor (SCM_RIGHTS) with its size and device, or an
// error. Peers of another uid are refused (SO_PEERCRED). A share name is
// "<pid>-<32 hex digits>": it says which process to ask.

// Note [VMM descriptors are served by their exporter, not by zctipcd]
//
// The daemon already brokers descriptors (memfd segments; see broker.go
// in package daemon), yet VMM allocations have a server of their own. They
// stay here because the broker could not tell when to let a VMM descriptor
// go, and a descriptor held too long holds GPU memory:
//
//   - The broker keeps a descriptor until the count in the segment's own
//     header reaches zero: it maps the segment when it is put (shm.MapFD)
//     and reads that count on every tick and on drop. It takes nothing
//     else: put wants a sealed memfd with a zctipc header whose creator is
//     the peer. A VMM allocation has no header and no shared count; who
//     holds it is known only to the CUDA driver in each process (the
//     handles and mappings that Free releases), and the daemon loads no
//     CUDA.
//   - A descriptor from cuMemExportToShareableHandle is itself a reference
//     to the allocation: the driver frees the memory only once every handle
//     on it, exported ones included, is released (cuMemRelease's documented
//     rule). A copy kept by the daemon would keep the GPU memory allocated
//     after its exporter freed it or died, for as long as the daemon kept
//     it, and by the first point the daemon has no sign to stop on.
//   - Here no descriptor outlives a request: serve exports a fresh one
//     (ExportFD), sends it and closes it. A name can be fetched only while
//     its exporter lives and shares it: Unshare, called before Free, takes
//     the name away; StopSharing closes the socket before exit; and the
//     listener of an exporter that was killed dies with it, so Fetch then
//     fails with ErrNotShared. An importer holds only what it imported,
//     and its own Free releases that.
//   - Sharing VMM memory needs no daemon: it works with crash cleanup off
//     or no zctipcd running. Through the broker it would not, and a missing
//     or wedged daemon would stop the GPU data path, not only cleanup.
//   - The reply here carries the allocation's size and resident device,
//     which Import needs; the broker's reply to get carries a descriptor
//     and nothing else.
//
// Moving these descriptors to the daemon would make it the owner of GPU
// memory lifetime that it cannot observe, and the change could be tested
// only on a GPU (the VMM tests in cuda_test.go skip without one).
// So the export window stays tied to the exporter's life.

// Note [The CUDA share server's threat model]
//
// Who can call: any process of this user can connect to cuda-<pid>.sock
// (the runtime directory is 0700; PeerOf refuses another uid where one
// could connect), as often as it likes, and then say nothing, send any
// bytes (a name it guessed, garbage, descriptors), stop or die at any step.
// The server runs inside a user's program (a training loop, a model
// server), so its descriptors and goroutines are that program's.
//
// What can be forged: the name asked for (only the exact 128-bit random
// names that Share handed out are served; an allocation already unshared
// is not), descriptors attached to the request (closed unread), and on
// the consumer's side the reply (Fetch refuses a malformed one and closes
// any descriptor that came with it, and never waits without a deadline).
//
// What must never happen: the producer runs out of descriptors because of
// its consumers, the server stops accepting while the producer lives, or a
// consumer waits for ever on a stopped, wedged or flooded producer. So the
// server keeps the daemon's rules (usersock.Acceptor): at most
// maxShareConns connections at once (fewer under a low open-file limit),
// any other refused with the reason; accept errors retried with back-off;
// a connection that has not asked within shareSilent closed; each reply
// written within shareSilent. Fetch bounds its whole exchange by fetchFor
// and names the producer's pid when it runs out.

// ErrNotShared means no live process shares an allocation by that name.
var ErrNotShared = fmt.Errorf("no such shared CUDA allocation: %w", unix.ENOENT)

// ErrBusy means the process that shares an allocation serves as many
// consumers as it may at once: try again later.
var ErrBusy = fmt.Errorf("the CUDA share server is at its limit of connections: %w", unix.EAGAIN)

// Deadlines and limits of sharing by name.
const (
	// shareSilent bounds how long the server waits for a consumer's
	// request, and the write of its reply.
	shareSilent = 5 * time.Second
	// fetchFor bounds a consumer's whole exchange with the server.
	fetchFor = 5 * time.Second
	// maxShareConns bounds the connections served at once.
	maxShareConns = 64
)

type server struct {
	ln     *net.UnixListener
	path   string
	acc    *usersock.Acceptor
	mu     sync.Mutex
	shared map[string]*Allocation
}

// shareLimit returns how many connections the server serves at once: each
// takes up to three descriptors of the program it runs in (the connection,
// the peer's /proc entry, the exported allocation), so no more than a
// sixteenth of its open-file limit.
func shareLimit() int {
	return max(min(maxShareConns, usersock.FileLimit(1024)/16), 2)
}

var (
	serveMu sync.Mutex
	serving *server
)

func socketPath(pid int) string {
	return filepath.Join(usersock.RuntimeDir(), "cuda-"+strconv.Itoa(pid)+".sock")
}

// Share makes the allocation fetchable by other processes of this user and
// returns its share name.
func (a *Allocation) Share() (string, error) {
	s, err := startServer()
	if err != nil {
		return "", err
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	name := strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
	s.mu.Lock()
	s.shared[name] = a
	s.mu.Unlock()
	return name, nil
}

// Unshare stops serving name (when the allocation is freed).
func Unshare(name string) {
	serveMu.Lock()
	s := serving
	serveMu.Unlock()
	if s != nil {
		s.mu.Lock()
		delete(s.shared, name)
		s.mu.Unlock()
	}
}

// StopSharing closes this process's socket and removes it (the process is
// about to exit); allocations already fetched stay valid.
func StopSharing() error {
	serveMu.Lock()
	defer serveMu.Unlock()
	if serving == nil {
		return nil
	}
	s := serving
	serving = nil
	return errors.Join(s.ln.Close(), ignoreMissing(os.Remove(s.path)))
}

func ignoreMissing(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

func startServer() (*server, error) {
	serveMu.Lock()
	defer serveMu.Unlock()
	if serving != nil {
		return serving, nil
	}
	dir := usersock.RuntimeDir()
	if err := usersock.EnsureDir(dir); err != nil {
		return nil, err
	}
	path := socketPath(os.Getpid())
	_ = os.Remove(path) // a socket left by a process that had our pid
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("serve CUDA allocations on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	s := &server{ln: ln, path: path, shared: map[string]*Allocation{}}
	s.acc = &usersock.Acceptor{
		Name:    fmt.Sprintf("the CUDA share server of pid %d", os.Getpid()),
		Serve:   s.serve,
		Refusal: func(reason error) []byte { return []byte("error: " + reason.Error()) },
		Limit:   shareLimit,
	}
	go s.acc.Run(ln)
	serving = s
	return s, nil
}

func (s *server) serve(c *net.UnixConn) {
	_, err := usersock.PeerOf(c)
	if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
		s.acc.Refuse(c, s.acc.NoFiles())
		return
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(shareSilent)); err != nil {
		return
	}
	if err != nil { // another user's process (where one could connect)
		_ = fdpass.Send(c, []byte("error: "+err.Error()))
		return
	}
	buf := make([]byte, 256)
	n, fds, err := fdpass.Recv(c, buf, 0) // a silent consumer is closed at the deadline
	if err != nil {
		if errors.Is(err, fdpass.ErrRejected) {
			_ = fdpass.Send(c, []byte("error: "+err.Error()))
		}
		return
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	s.mu.Lock()
	a := s.shared[string(buf[:n])]
	s.mu.Unlock()
	if a == nil {
		_ = fdpass.Send(c, []byte("error: "+ErrNotShared.Error()))
		return
	}
	fd, err := a.ExportFD()
	if err != nil {
		_ = fdpass.Send(c, []byte("error: "+err.Error()))
		return
	}
	defer unix.Close(fd)
	_ = fdpass.Send(c, []byte(fmt.Sprintf("ok %d %d", a.Size, a.Resident)), fd)
}

// Fetch asks the process that shares name for the allocation's descriptor,
// and returns it with the allocation's size and device; the caller closes
// the descriptor. The exchange has a deadline (fetchFor): a stopped or
// wedged producer makes Fetch fail with an error that names its pid and
// wraps ETIMEDOUT; one that serves too many consumers at once, with ErrBusy;
// one that hangs up without an answer (it died, or stopped sharing, after
// it accepted), with ErrNotShared, as one that is gone already.
func Fetch(name string) (fd int, size uint64, resident int, err error) {
	pidText, _, ok := strings.Cut(name, "-")
	pid, perr := strconv.Atoi(pidText)
	if !ok || perr != nil || pid <= 0 {
		return -1, 0, 0, fmt.Errorf("%q is not a CUDA share name: %w", name, unix.EINVAL)
	}
	deadline := time.Now().Add(fetchFor)
	dialer := net.Dialer{Deadline: deadline}
	conn, err := dialer.Dial("unixpacket", socketPath(pid))
	if err != nil {
		return -1, 0, 0, fmt.Errorf("%w (%s: the process %d that shared it is gone?): %w", ErrNotShared, name, pid, err)
	}
	c := conn.(*net.UnixConn)
	defer c.Close()
	timedOut := func(err error) error {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("fetch %s: the process %d that shares it did not answer within %v: "+
				"it is stopped, wedged or overloaded: %w", name, pid, fetchFor, unix.ETIMEDOUT)
		}
		return fmt.Errorf("fetch %s from process %d: %w", name, pid, err)
	}
	if err := c.SetDeadline(deadline); err != nil {
		return -1, 0, 0, err
	}
	buf := make([]byte, 1024)
	// A server that refused the connection answered and hung up: the send
	// fails with EPIPE, or the read with ECONNRESET, before the answer is
	// read.
	sendErr := fdpass.Send(c, []byte(name))
	n, fds, err := fdpass.Recv(c, buf, 1)
	if errors.Is(err, unix.ECONNRESET) {
		n, fds, err = fdpass.Recv(c, buf, 1)
	}
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, unix.ECONNRESET): // ECONNRESET: read again above
		// Hung up without an answer: the producer died (or stopped
		// sharing) after it accepted, before it answered.
		return -1, 0, 0, fmt.Errorf("%w (%s: the process %d that shared it hung up without an answer: "+
			"it exited or stopped sharing)", ErrNotShared, name, pid)
	case err != nil:
		return -1, 0, 0, timedOut(err)
	case sendErr != nil && n == 0:
		return -1, 0, 0, timedOut(sendErr)
	}
	reply := string(buf[:n])
	if msg, isErr := strings.CutPrefix(reply, "error: "); isErr {
		for _, fd := range fds {
			unix.Close(fd)
		}
		switch {
		case strings.Contains(msg, ErrNotShared.Error()):
			return -1, 0, 0, fmt.Errorf("%s: %w", name, ErrNotShared)
		case strings.Contains(msg, "at its limit"):
			return -1, 0, 0, fmt.Errorf("fetch %s: %s: %w", name, msg, ErrBusy)
		}
		return -1, 0, 0, fmt.Errorf("fetch %s from process %d: %s", name, pid, msg)
	}
	if _, serr := fmt.Sscanf(reply, "ok %d %d", &size, &resident); serr != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return -1, 0, 0, fmt.Errorf("a malformed reply %q for %s: %w", reply, name, fdpass.ErrRejected)
	}
	return fds[0], size, resident, nil
}

// ImportShared fetches the allocation shared as name and maps it for device
// mapping here (negative: the device it lives on).
func ImportShared(name string, mapping int) (*Allocation, error) {
	fd, size, resident, err := Fetch(name)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if mapping < 0 {
		mapping = resident
	}
	return Import(fd, size, resident, mapping)
}
