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
// at start; at the limit it answers a new connection with an error and
// closes it rather than stop accepting; a connection that says nothing for
// Options.Silent is closed (one that watches a ledger may stay silent: its hang-up
// is the news); a reply a client does not read within replyFor ends the
// connection. Ledgers and segments are memory other processes can shrink: a
// fault on them is an error in the log, never the daemon's death. A socket
// someone deleted is made again.
package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zctipc/zctipc/go/fault"
	"github.com/zctipc/zctipc/go/fdpass"
	"github.com/zctipc/zctipc/go/gc"
	"github.com/zctipc/zctipc/go/header"
	"github.com/zctipc/zctipc/go/ledger"
	"github.com/zctipc/zctipc/go/proc"
	_ "github.com/zctipc/zctipc/go/queue" // a queue's finalizer, for queues the daemon removes
	"github.com/zctipc/zctipc/go/shm"
	"github.com/zctipc/zctipc/go/version"
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
	// acceptPause is how long accept waits after a failure, such as having
	// no descriptor left for a new connection.
	acceptPause = 10 * time.Millisecond
)

// ErrRunning is returned by Serve when another daemon serves the directory.
var ErrRunning = errors.New("another zctipcd serves this directory")

// Options configure Serve.
type Options struct {
	Dir  string        // the runtime directory (RuntimeDir when empty)
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
}

// watch is a client's ledger.
type watch struct {
	name   string
	owner  proc.Identity
	m      *shm.Mapping
	conns  int       // connections that said hello with it
	hungUp time.Time // when the last one closed
	memfd  bool
}

// kept is a memfd segment the daemon holds for others to fetch.
type kept struct {
	fd int
	m  *shm.Mapping
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
	if s.dir == "" {
		s.dir = RuntimeDir()
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
	if err := EnsureDir(s.dir); err != nil {
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
	go s.accept(ln)
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

// accept serves each connection of ln in its own goroutine, until ln
// closes. Out of descriptors, it refuses the connection that waits (a
// spare descriptor makes room to accept it and say why) and goes on.
func (s *Server) accept(ln *net.UnixListener) {
	spare, _ := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	defer func() {
		if spare >= 0 {
			unix.Close(spare)
		}
	}()
	for {
		c, err := ln.AcceptUnix()
		if err == nil {
			go s.serve(c)
			continue
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
			if spare >= 0 {
				unix.Close(spare)
				spare = -1
				if c, err := ln.AcceptUnix(); err == nil {
					s.refuse(c, fmt.Errorf("zctipcd is at its limit of open files: %w", unix.EMFILE))
				}
				spare, _ = unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			}
		} else {
			s.log.Printf("accept: %v", err)
		}
		time.Sleep(acceptPause)
	}
}

// refuse answers a connection's first request with err and closes it.
func (s *Server) refuse(c *net.UnixConn, err error) {
	defer c.Close()
	s.mu.Lock()
	s.stats.Refused++
	s.mu.Unlock()
	rep := errReply(err)
	s.reply(c, &rep, -1)
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

// sweepDead sweeps the ledgers of watched processes that died: those whose
// connection hung up, or all with full.
func (s *Server) sweepDead(full bool) {
	s.mu.Lock()
	var dead []*watch
	for name, w := range s.watches {
		if (full || w.conns == 0) && !proc.Alive(w.owner) {
			dead = append(dead, w)
			delete(s.watches, name)
		}
	}
	s.mu.Unlock()
	for _, w := range dead {
		var res ledger.Result
		err := fault.Catch(func() (err error) {
			res, err = gc.SweepLedger(w.m.Data(), s.self)
			return err
		})
		if !w.memfd {
			if uerr := shm.Unlink(w.name); uerr != nil && !errors.Is(uerr, unix.ENOENT) {
				err = errors.Join(err, uerr)
			}
		}
		w.m.Unmap()
		s.log.Printf("pid %d died: gave up %d segment counts and %d slot counts, removed %d half-made files",
			w.owner.PID, res.Segments, res.Slots, res.Files)
		if err != nil {
			s.log.Printf("sweeping pid %d: %v", w.owner.PID, err)
		}
		s.mu.Lock()
		s.stats.Swept++
		s.stats.Counts += res.Segments + res.Slots
		// What a dead process could not record is found by a collection.
		s.collectAt = time.Now().Add(confirmAfter)
		s.mu.Unlock()
	}
}

// collect sweeps the ledgers of dead processes that the daemon does not
// watch, removes the orphans that two censuses agree on, and starts
// watching the ledgers of live processes found in the segment directory.
func (s *Server) collect() {
	defer func() {
		s.mu.Lock()
		s.collecting = false
		s.mu.Unlock()
	}()
	var rep gc.Report
	err := fault.Catch(func() (err error) {
		rep, err = gc.Collect(s.self, gc.Options{TrackedOnly: true, Confirm: confirmAfter, Source: s.source()})
		return err
	})
	if err != nil {
		s.log.Printf("collect: %v", err)
	}
	for _, name := range rep.Ledgers {
		s.log.Printf("swept the ledger %s of a dead process", name)
	}
	for _, r := range rep.Removed {
		s.log.Printf("removed %s (%s): %s", r.Name, r.Kind, r.Reason)
	}
	s.mu.Lock()
	s.stats.Collected += len(rep.Removed)
	s.stats.Swept += len(rep.Ledgers)
	s.stats.Counts += rep.Swept.Segments + rep.Swept.Slots
	s.mu.Unlock()
	s.watchLive(false)
}

// watchLive watches the ledger files of live processes in the segment
// directory that the daemon does not watch yet; at start, it counts them
// as recovered.
func (s *Server) watchLive(start bool) {
	c, err := gc.Take(s.source())
	if err != nil {
		s.log.Printf("census: %v", err)
		return
	}
	for _, l := range c.Ledgers {
		if !l.Alive || s.watchFile(l.Name, l.Owner) != nil {
			continue
		}
		if start {
			s.mu.Lock()
			s.stats.Recovered++
			s.mu.Unlock()
			s.log.Printf("watching pid %d, found by its ledger %s", l.Owner.PID, l.Name)
		}
	}
}

// source tells a census about the daemon's memfd segments and ledgers.
func (s *Server) source() gc.Source {
	s.mu.Lock()
	names := make([]string, 0, len(s.kept))
	for name := range s.kept {
		names = append(names, name)
	}
	s.mu.Unlock()
	return gc.Source{
		Names: names,
		Ledgers: func(fn func(string, []byte)) {
			s.mu.Lock()
			var ws []*watch
			for _, w := range s.watches {
				ws = append(ws, w)
			}
			s.mu.Unlock()
			for _, w := range ws {
				if err := fault.Catch(func() error { fn(w.name, w.m.Data()); return nil }); err != nil {
					s.log.Printf("reading the ledger %s: %v", w.name, err)
				}
			}
		},
	}
}

// watchFile watches the ledger file name of a live process that did not
// say hello (it did to a daemon that died).
func (s *Server) watchFile(name string, owner proc.Identity) error {
	s.mu.Lock()
	_, ok := s.watches[name]
	s.mu.Unlock()
	if ok {
		return errors.New("watched")
	}
	m, err := shm.Map(name, header.KindLedger)
	if err != nil {
		return err
	}
	return s.addWatch(&watch{name: name, owner: owner, m: m}, false)
}

// addWatch adds w, or counts one more connection on the watch of its
// ledger, with conn.
func (s *Server) addWatch(w *watch, conn bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.watches[w.name]; ok {
		w.m.Unmap()
		w = old
	} else {
		s.watches[w.name] = w
	}
	if conn {
		w.conns++
	}
	return nil
}

// release closes a kept memfd segment. The caller holds s.mu.
func (s *Server) release(name string) {
	k, ok := s.kept[name]
	if !ok {
		return
	}
	delete(s.kept, name)
	k.m.Unmap()
	unix.Close(k.fd)
}

// The daemon is the broker of memfd segments within its own process.

// Put is refused: the daemon makes no segments.
func (s *Server) Put(name string, fd int) error { return unix.EINVAL }

// Fetch returns a duplicate of the descriptor of a kept segment.
func (s *Server) Fetch(name string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.kept[name]
	if !ok {
		return -1, notKept(name)
	}
	return unix.FcntlInt(uintptr(k.fd), unix.F_DUPFD_CLOEXEC, 0)
}

// Drop releases a kept segment whose count reached zero.
func (s *Server) Drop(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k, ok := s.kept[name]; ok && k.m.Refcount() <= 0 {
		s.release(name)
	}
}

func notKept(name string) error {
	return fmt.Errorf("memfd segment %q is not known to zctipcd: it was released, or the daemon "+
		"restarted since it was made: %w", name, unix.ENOENT)
}

// serve answers the requests of one client.
func (s *Server) serve(c *net.UnixConn) {
	defer c.Close()
	peer, err := PeerOf(c)
	if err != nil {
		s.log.Printf("refused a connection: %v", err)
		return
	}
	s.mu.Lock()
	s.conns++
	s.mu.Unlock()
	var hello []string // ledgers this connection said hello with
	defer func() {
		s.mu.Lock()
		s.conns--
		for _, name := range hello {
			if w, ok := s.watches[name]; ok {
				w.conns--
				w.hungUp = time.Now()
			}
		}
		s.mu.Unlock()
		select { // check the client's liveness now rather than at the next tick
		case s.sweepWake <- struct{}{}:
		default:
		}
	}()
	buf := make([]byte, maxMessage)
	for {
		// A connection that watches a ledger may stay silent for its
		// process's life; any other must speak up.
		var until time.Time
		if len(hello) == 0 {
			until = time.Now().Add(s.silent)
		}
		if err := c.SetReadDeadline(until); err != nil {
			return
		}
		n, fds, err := fdpass.Recv(c, buf, 1)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				s.log.Printf("pid %d said nothing for %v: closed its connection", peer.PID, s.silent)
				return
			}
			if errors.Is(err, fdpass.ErrRejected) {
				s.log.Printf("pid %d: %v", peer.PID, err)
				if s.reply(c, &Reply{Error: err.Error(), Errno: int(unix.EINVAL)}, -1) == nil {
					continue
				}
			}
			return
		}
		if n == 0 {
			closeFDs(fds)
			return // end of stream
		}
		var req Request
		fd := -1
		if len(fds) == 1 {
			fd = fds[0]
		}
		var rep Reply
		var out = -1
		if err := json.Unmarshal(buf[:n], &req); err != nil {
			rep = errReply(fmt.Errorf("bad request: %w", unix.EINVAL))
		} else if err := fault.Catch(func() error {
			out, rep = s.handle(peer, &req, fd, &hello)
			return nil
		}); err != nil {
			s.log.Printf("pid %d: %q: %v", peer.PID, req.Op, err)
			out, rep = -1, errReply(err)
		}
		if fd >= 0 {
			unix.Close(fd) // handle duplicated what it keeps
		}
		if s.reply(c, &rep, out) != nil {
			return
		}
	}
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// errReply returns the reply that reports err (an empty one for nil).
func errReply(err error) Reply {
	if err == nil {
		return Reply{}
	}
	r := Reply{Error: err.Error()}
	var errno unix.Errno
	if errors.As(err, &errno) {
		r.Errno = int(errno)
	}
	return r
}

func (s *Server) reply(c *net.UnixConn, r *Reply, fd int) error {
	if err := c.SetWriteDeadline(time.Now().Add(replyFor)); err != nil {
		return err
	}
	b, err := encode(r)
	if err != nil {
		b, _ = encode(errReply(err))
		fd = -1
	}
	if fd >= 0 {
		return fdpass.Send(c, b, fd)
	}
	return fdpass.Send(c, b)
}

// PeerOf returns the identity of the process at the other end of c, after
// checking that it runs as this user.
func PeerOf(c *net.UnixConn) (proc.Identity, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return proc.Identity{}, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return proc.Identity{}, err
	}
	if cerr != nil {
		return proc.Identity{}, cerr
	}
	if cred.Uid != uint32(unix.Geteuid()) {
		return proc.Identity{}, fmt.Errorf("peer pid %d runs as uid %d, not as this user: %w", cred.Pid, cred.Uid, unix.EACCES)
	}
	start, err := proc.StartTime(int64(cred.Pid))
	if err != nil {
		return proc.Identity{}, err
	}
	return proc.Identity{PID: int64(cred.Pid), StartTime: start}, nil
}

// handle answers one request; fd is the descriptor that came with it (the
// caller closes it), and the returned descriptor, when not -1, goes with
// the reply.
func (s *Server) handle(peer proc.Identity, req *Request, fd int, hello *[]string) (int, Reply) {
	wantFD := req.Op == OpPut || req.Op == OpHello && shm.IsFDName(req.Ledger)
	if fd >= 0 && !wantFD {
		return -1, errReply(fmt.Errorf("a file descriptor came with a %q request: %w", req.Op, unix.EINVAL))
	}
	switch req.Op {
	case OpHello:
		if req.Ledger == "" { // a client with nothing to watch (zctipc ls)
			return -1, Reply{Status: &Status{PID: s.self.PID, Version: version.Version}}
		}
		if err := s.hello(peer, req.Ledger, fd); err != nil {
			return -1, errReply(err)
		}
		*hello = append(*hello, req.Ledger)
		return -1, Reply{Status: &Status{PID: s.self.PID, Version: version.Version}}
	case OpPut:
		return -1, errReply(s.put(peer, req.Name, fd))
	case OpGet:
		s.mu.Lock()
		defer s.mu.Unlock()
		k, ok := s.kept[req.Name]
		if !ok {
			return -1, errReply(notKept(req.Name))
		}
		return k.fd, Reply{}
	case OpDrop:
		s.Drop(req.Name)
		return -1, Reply{}
	case OpStatus:
		st := s.status()
		return -1, Reply{Status: &st}
	case OpGC:
		rep, err := gc.Collect(s.self, gc.Options{DryRun: req.DryRun, Confirm: 200 * time.Millisecond, Source: s.source()})
		s.mu.Lock()
		if !req.DryRun {
			s.stats.Collected += len(rep.Removed)
		}
		s.mu.Unlock()
		r := errReply(err)
		r.Report = &rep
		return -1, r
	}
	return -1, errReply(fmt.Errorf("unknown request %q: %w", req.Op, unix.EINVAL))
}

// hello starts watching a client's ledger: the file named, or the memfd fd.
func (s *Server) hello(peer proc.Identity, name string, fd int) error {
	var m *shm.Mapping
	var err error
	memfd := shm.IsFDName(name)
	switch {
	case memfd && fd < 0:
		return fmt.Errorf("a memfd ledger came without its descriptor: %w", unix.EINVAL)
	case memfd:
		m, err = shm.MapFD(fd, name, header.KindLedger)
	default:
		m, err = shm.Map(name, header.KindLedger)
	}
	if err != nil {
		return err
	}
	if owner := m.Header().Creator; owner != peer {
		m.Unmap()
		return fmt.Errorf("ledger %q belongs to pid %d, not to the peer (pid %d): %w", name, owner.PID, peer.PID, unix.EACCES)
	}
	return s.addWatch(&watch{name: name, owner: peer, m: m, memfd: memfd}, true)
}

// put keeps the memfd segment name that the peer made.
func (s *Server) put(peer proc.Identity, name string, fd int) error {
	if fd < 0 {
		return fmt.Errorf("memfd segment %q came without its descriptor: %w", name, unix.EINVAL)
	}
	if !shm.IsFDName(name) {
		return fmt.Errorf("%q is not the name of a memfd segment: %w", name, unix.EINVAL)
	}
	m, err := shm.MapFD(fd, name, 0)
	if err != nil {
		return err
	}
	if m.Header().Creator != peer {
		m.Unmap()
		return fmt.Errorf("memfd segment %q was made by pid %d, not by the peer (pid %d): %w", name, m.Header().Creator.PID, peer.PID, unix.EACCES)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		m.Unmap()
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.kept[name]; ok {
		m.Unmap()
		unix.Close(dup)
		return fmt.Errorf("memfd segment %q is already kept: %w", name, unix.EEXIST)
	}
	s.kept[name] = &kept{fd: dup, m: m}
	return nil
}

// status describes the daemon.
func (s *Server) status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Uptime = time.Since(s.started).Seconds()
	for _, w := range s.watches {
		counts := -1 // a ledger that faults (shrunk by someone) has no count to show
		fault.Catch(func() error { counts = len(ledger.Entries(w.m.Data())); return nil })
		st.Clients = append(st.Clients, Watched{PID: w.owner.PID, Ledger: w.name, Connected: w.conns > 0, Counts: counts})
	}
	sort.Slice(st.Clients, func(i, j int) bool { return st.Clients[i].PID < st.Clients[j].PID })
	for name := range s.kept {
		st.Segments = append(st.Segments, name)
	}
	sort.Strings(st.Segments)
	return st
}
