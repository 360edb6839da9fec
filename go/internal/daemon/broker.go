// The fd broker: memfd segments (the file_descriptor strategy) that the
// daemon keeps for the processes that attach them, until their count
// reaches zero.

package daemon

import (
	"fmt"

	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// kept is a memfd segment the daemon holds for others to fetch.
type kept struct {
	fd int
	m  *shm.Mapping
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
