// Watching clients: their ledgers, swept when their process dies, and the
// orphan collections that find what a dead process could not record.

package daemon

import (
	"errors"
	"fmt"
	"time"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/gc"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/ledger"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// watch is a client's ledger.
type watch struct {
	name   string
	owner  proc.Identity
	m      *shm.Mapping
	conns  int       // connections that said hello with it
	hungUp time.Time // when the last one closed
	memfd  bool
}

// sweepDead sweeps the ledgers of watched processes that died: those whose
// connection hung up, or all with full.
func (s *Server) sweepDead(full bool) {
	s.mu.Lock()
	var dead []*watch
	for name, w := range s.watches {
		// A process whose /proc entry cannot be read (the daemon has no
		// descriptor left) is not dead: it is looked at again next time.
		if (full || w.conns == 0) && proc.Dead(w.owner) {
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
