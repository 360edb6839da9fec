package cuda

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/zctipc/zctipc/go/fdpass"
	"github.com/zctipc/zctipc/go/usersock"
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
// only on a GPU (the VMM tests in tests/go/cuda_test.go skip without one).
// So the export window stays tied to the exporter's life.

// ErrNotShared means no live process shares an allocation by that name.
var ErrNotShared = fmt.Errorf("no such shared CUDA allocation: %w", unix.ENOENT)

type server struct {
	ln     *net.UnixListener
	path   string
	mu     sync.Mutex
	shared map[string]*Allocation
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
	serving = &server{ln: ln, path: path, shared: map[string]*Allocation{}}
	go serving.accept()
	return serving, nil
}

func (s *server) accept() {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return
		}
		go s.serve(c)
	}
}

func (s *server) serve(c *net.UnixConn) {
	defer c.Close()
	if _, err := usersock.PeerOf(c); err != nil {
		_ = fdpass.Send(c, []byte("error: "+err.Error()))
		return
	}
	buf := make([]byte, 256)
	n, fds, err := fdpass.Recv(c, buf, 0)
	if err != nil {
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
// the descriptor.
func Fetch(name string) (fd int, size uint64, resident int, err error) {
	pidText, _, ok := strings.Cut(name, "-")
	pid, perr := strconv.Atoi(pidText)
	if !ok || perr != nil || pid <= 0 {
		return -1, 0, 0, fmt.Errorf("%q is not a CUDA share name: %w", name, unix.EINVAL)
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socketPath(pid), Net: "unixpacket"})
	if err != nil {
		return -1, 0, 0, fmt.Errorf("%w (%s: the process that shared it is gone?): %w", ErrNotShared, name, err)
	}
	defer c.Close()
	if err := fdpass.Send(c, []byte(name)); err != nil {
		return -1, 0, 0, err
	}
	buf := make([]byte, 1024)
	n, fds, err := fdpass.Recv(c, buf, 1)
	if err != nil {
		return -1, 0, 0, err
	}
	reply := string(buf[:n])
	if msg, isErr := strings.CutPrefix(reply, "error: "); isErr {
		for _, fd := range fds {
			unix.Close(fd)
		}
		if strings.Contains(msg, ErrNotShared.Error()) {
			return -1, 0, 0, fmt.Errorf("%s: %w", name, ErrNotShared)
		}
		return -1, 0, 0, errors.New(msg)
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
