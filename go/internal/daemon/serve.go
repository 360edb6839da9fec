// Serving one connection: reading its requests, answering each (handle),
// and writing the replies, under the deadlines that keep a client from
// holding the daemon.

package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"time"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/fdpass"
	"github.com/zctipc/zctipc/go/internal/gc"
	"github.com/zctipc/zctipc/go/internal/ledger"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/usersock"
	"github.com/zctipc/zctipc/go/internal/version"
	"golang.org/x/sys/unix"
)

// serve answers the requests of one client.
func (s *Server) serve(c *net.UnixConn) {
	peer, err := usersock.PeerOf(c)
	if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
		// Telling who the peer is takes a descriptor (its /proc entry):
		// say why rather than hang up without a word.
		s.acc.Refuse(c, s.acc.NoFiles())
		return
	}
	defer c.Close()
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

// status describes the daemon.
func (s *Server) status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Refused = s.acc.Refused()
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
