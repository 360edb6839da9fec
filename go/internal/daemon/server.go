// Package daemon is the per-user cleanup daemon (zctipcd) and its client.
//
// Every process that uses the library keeps a ledger of the counts it holds
// (package ledger) and says hello to the daemon over a Unix socket in a 0700
// directory. The daemon checks each peer's uid with SO_PEERCRED and watches
// its ledger: when the process dies (its socket hangs up, or its pid and
// start time no longer match a live process), the daemon gives up the counts
// the ledger records, which removes the segments no one else holds and frees
// the pool slots. The daemon also keeps the file descriptors of memfd
// segments (the file_descriptor strategy) and hands them to the processes
// that attach them.
//
// One daemon runs per user and segment directory: it holds an flock on its
// directory's lock file. A daemon that was killed is replaced by the next
// client that finds no daemon; the new one finds the ledgers in the segment
// directory, sweeps those of dead processes, removes the orphans they left
// (package gc), and watches the rest. A daemon with nothing to watch exits
// after a while.
//
// # Robustness
//
// A client never waits on the daemon without a deadline (see Client), and
// the daemon never lets a client hold it: it raises its limit of open files
// at start, serves only as many connections at once as that limit leaves
// room for, and answers any other with the reason (the limit of connections
// or of open files) before closing it; accept errors are retried, never the
// end of accepting (usersock.Acceptor); a connection that says nothing for
// Options.Silent is closed (one that watches a ledger may stay silent: its hang-up
// is the news); a reply a client does not read within replyFor ends the
// connection. Ledgers and segments are memory other processes can shrink: a
// fault on them is an error in the log, never the daemon's death. A socket
// someone deleted is made again.
package daemon

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zctipc/zctipc/go/internal/fdpass"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/usersock"
	"github.com/zctipc/zctipc/go/internal/version"
	"golang.org/x/sys/unix"
)

// Timing of the daemon.
const (
	tick         = 100 * time.Millisecond // liveness checks of hung-up clients
	checkEvery   = time.Second            // liveness checks of the others
	collectEvery = 30 * time.Second       // orphan collections while anything is watched
	confirmAfter = time.Second            // between the two censuses of a collection
	// DefaultIdle is how long a daemon with nothing to watch waits before
	// it exits.
	DefaultIdle = 10 * time.Second
	// DefaultSilent bounds the wait for the next request of a connection
	// that watches no ledger.
	DefaultSilent = 30 * time.Second
	// replyFor bounds the write of one reply.
	replyFor = 5 * time.Second
)

// ErrRunning is returned by Serve when another daemon serves the directory.
var ErrRunning = errors.New("another zctipcd serves this directory")

// Options configure Serve.
type Options struct {
	Dir  string        // the runtime directory (usersock.RuntimeDir when empty)
	Idle time.Duration // DefaultIdle when zero
	// Silent closes a connection that watches no ledger after this long
	// without a request (DefaultSilent when zero).
	Silent time.Duration
	Log    io.Writer // os.Stderr when nil
}

// Server is a running daemon. It is safe for concurrent use: its
// connections are served by goroutines of their own.
type Server struct {
	dir     string
	self    proc.Identity
	idle    time.Duration
	silent  time.Duration
	log     *log.Logger
	started time.Time
	sock    string
	ln      *net.UnixListener // owned by the goroutine of Serve
	sockIno uint64            // the inode of the socket ln listens on

	mu         sync.Mutex
	collecting bool
	conns      int
	watches    map[string]*watch // by ledger name
	kept       map[string]*kept  // memfd segments, by name
	busy       time.Time         // when the daemon last had something to do
	collectAt  time.Time         // when an orphan collection is due
	stats      Status
	sweepWake  chan struct{}

	acc *usersock.Acceptor // its connections, at most connLimit at once
}

// Serve runs the daemon of opts.Dir until it has been idle for opts.Idle.
// It returns ErrRunning (wrapped, with the other daemon's pid) when another
// daemon serves the directory.
func Serve(opts Options) error {
	s := &Server{
		dir:       opts.Dir,
		idle:      opts.Idle,
		started:   time.Now(),
		watches:   map[string]*watch{},
		kept:      map[string]*kept{},
		sweepWake: make(chan struct{}, 1),
	}
	s.acc = &usersock.Acceptor{
		Name:  "zctipcd",
		Serve: s.serve,
		Refusal: func(reason error) []byte {
			b, _ := encode(errReply(reason))
			return b
		},
		Limit: s.connLimit,
		Logf:  func(format string, args ...any) { s.log.Printf(format, args...) },
	}
	if s.dir == "" {
		s.dir = usersock.RuntimeDir()
	}
	if s.idle <= 0 {
		s.idle = DefaultIdle
	}
	s.silent = opts.Silent
	if s.silent <= 0 {
		s.silent = DefaultSilent
	}
	w := opts.Log
	if w == nil {
		w = os.Stderr
	}
	s.log = log.New(w, fmt.Sprintf("zctipcd[%d] ", os.Getpid()), log.LstdFlags|log.Lmicroseconds)
	var err error
	if s.self, err = proc.Self(); err != nil {
		return err
	}
	if err := usersock.EnsureDir(s.dir); err != nil {
		return err
	}
	lockFD, err := lockDir(s.dir)
	if err != nil {
		return err
	}
	defer unix.Close(lockFD)
	limit, err := raiseFileLimit()
	if err != nil {
		s.log.Printf("open-file limit %d, not raised: %v", limit, err)
	}
	s.sock = filepath.Join(s.dir, SocketName)
	if err := s.listen(); err != nil {
		return err
	}
	shm.SetBroker(s)
	s.log.Printf("serving %s for segments in %s (open-file limit %d)", s.dir, shm.Dir(), limit)
	s.stats = Status{PID: s.self.PID, Version: version.Version, Dir: s.dir, ShmDir: shm.Dir()}
	s.busy = time.Now()

	// Recover: watch the ledgers of live processes that said hello to a
	// daemon that died, and collect at once what dead ones left.
	s.watchLive(true)
	s.collectAt = time.Now()
	s.loop()
	s.ln.Close() // removes the socket
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range s.kept {
		s.release(name)
	}
	s.log.Printf("idle for %v: exiting", s.idle)
	return nil
}

// lockDir takes the directory's lock, which the daemon holds for its life.
func lockDir(dir string) (int, error) {
	path := filepath.Join(dir, LockName)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", path, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		buf := make([]byte, 32)
		n, _ := unix.Pread(fd, buf, 0)
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return -1, fmt.Errorf("%w (pid %s)", ErrRunning, strings.TrimSpace(string(buf[:max(n, 0)])))
		}
		return -1, fmt.Errorf("lock %s: %w", path, err)
	}
	pid := strconv.Itoa(os.Getpid()) + "\n"
	if err := unix.Ftruncate(fd, 0); err == nil {
		unix.Pwrite(fd, []byte(pid), 0)
	}
	return fd, nil
}

// RunningPID returns the pid of the daemon serving dir, or 0 when none
// does.
func RunningPID(dir string) int {
	fd, err := unix.Open(filepath.Join(dir, LockName), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	if unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB) == nil {
		return 0 // nobody holds it
	}
	buf := make([]byte, 32)
	n, _ := unix.Pread(fd, buf, 0)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(buf[:max(n, 0)])))
	return pid
}

// raiseFileLimit raises the soft limit of open files to the hard one, and
// the hard one too where the daemon may (a client started under a low
// limit hands it down). It returns the limit in force.
func raiseFileLimit() (uint64, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Max < wantFiles {
		if unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: wantFiles, Max: wantFiles}) == nil {
			return wantFiles, nil
		}
	}
	return fdpass.RaiseLimit()
}

// wantFiles is the open-file limit the daemon asks for when its hard limit
// is lower.
const wantFiles = 1 << 16

// listen makes the socket and serves it: each connection in its own
// goroutine, until the listener closes. The caller is Serve's goroutine.
func (s *Server) listen() error {
	if err := os.Remove(s.sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the stale socket %s: %w", s.sock, err)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: s.sock, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.sock, err)
	}
	var st unix.Stat_t
	if err := errors.Join(os.Chmod(s.sock, 0o600), unix.Lstat(s.sock, &st)); err != nil {
		ln.Close()
		return err
	}
	s.ln, s.sockIno = ln, st.Ino
	go s.acc.Run(ln)
	return nil
}

// keepSocket makes the socket again when it was deleted or replaced: a
// client that cannot connect would start a daemon that cannot serve.
func (s *Server) keepSocket() {
	var st unix.Stat_t
	if err := unix.Lstat(s.sock, &st); err == nil && st.Ino == s.sockIno && st.Mode&unix.S_IFMT == unix.S_IFSOCK {
		return
	}
	old := s.ln
	old.SetUnlinkOnClose(false) // the name is no longer its own
	old.Close()
	if err := s.listen(); err != nil {
		s.log.Printf("the socket %s went away and could not be made again: %v", s.sock, err)
		s.ln = old // closed: the next check tries again
		return
	}
	s.log.Printf("the socket %s went away: made it again", s.sock)
}

// reserveFiles is how many descriptors the daemon keeps for its own work
// (reading /proc, mapping ledgers, censuses, its log) beside those of its
// connections and of the memfd segments it keeps.
const reserveFiles = 32

// connLimit returns how many connections the daemon serves at once: what
// its open-file limit leaves after its reserve and the descriptors of the
// segments it keeps (see Note [Serving a socket that any process of the
// user may flood] in package usersock).
func (s *Server) connLimit() int {
	s.mu.Lock()
	kept := len(s.kept)
	s.mu.Unlock()
	return max(usersock.FileLimit(1024)-reserveFiles-kept, 1)
}

// loop checks the watched processes and the kept segments, runs orphan
// collections when due, and returns once the daemon has been idle long
// enough.
func (s *Server) loop() {
	t := time.NewTicker(tick)
	defer t.Stop()
	lastFull := time.Now()
	for {
		select {
		case <-t.C:
		case <-s.sweepWake:
		}
		now := time.Now()
		full := now.Sub(lastFull) >= checkEvery
		if full {
			lastFull = now
			s.keepSocket()
		}
		s.sweepDead(full)
		s.mu.Lock()
		for name, k := range s.kept {
			if k.m.Refcount() <= 0 {
				s.release(name)
			}
		}
		if s.conns > 0 || len(s.watches) > 0 || len(s.kept) > 0 {
			s.busy = now
			if s.collectAt.IsZero() {
				s.collectAt = now.Add(collectEvery)
			}
		}
		if !s.collecting && !s.collectAt.IsZero() && now.After(s.collectAt) {
			s.collecting = true
			s.collectAt = time.Time{}
			go s.collect()
		}
		idle := now.Sub(s.busy) > s.idle && s.collectAt.IsZero() && !s.collecting
		s.mu.Unlock()
		if idle {
			return
		}
	}
}
