// Package shm creates, attaches and releases zctipc segments: files in
// /dev/shm that start with a header (package header) and carry a
// cross-process reference count.
//
// # Lifetime
//
// Every process that holds a segment counts once in the refcount of its
// header, however many times it attached it: a process maps each file once
// and counts its own handles locally. (It may keep a mapping for a while
// after its last handle closed, holding no count; see the note on the
// mapping cache.) The creator starts the count at one;
// Attach adds one for a process's first handle, and closing a process's last
// handle takes it away again. Whoever takes the count to zero unlinks the
// file. Zero is final: Attach never revives a segment whose count reached
// zero, so a name is never unlinked under a process that just attached it.
//
// AddRef and DropRef move the count on behalf of something other than a
// process, such as a message in flight that holds the segment until its
// receiver attaches.
//
// # Security
//
// Create uses O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600 whatever the umask, and
// never adopts an existing file. Attach refuses, before mapping anything, a
// file that is not a regular file, belongs to another user, or grants any
// permission to group or others; it then validates a private copy of the
// header and uses only that copy.
package shm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/header"
	"golang.org/x/sys/unix"
)

var (
	// ErrClosed is returned by the methods of a Segment that was closed.
	ErrClosed = errors.New("segment is closed")
	// ErrOutOfSharedMemory is returned when the segment directory cannot
	// hold a new segment. The error says how much was asked and how much is
	// free, and wraps unix.ENOSPC or unix.ENOMEM.
	ErrOutOfSharedMemory = errors.New("out of shared memory")
)

// Segment is one handle on a mapped segment. It is safe for concurrent use;
// Close must not race with the use of Data.
type Segment struct {
	f        *file
	data     []byte
	readOnly bool
	closed   atomic.Bool
}

// Name returns the full name of the segment, prefix included.
func (s *Segment) Name() string { return s.f.name }

// Header returns the validated header read when the segment was created or
// first attached. Its Refcount is that of that moment; see Refcount.
func (s *Segment) Header() header.Header { return s.f.hdr }

// ReadOnly reports whether this handle's data is mapped read-only.
func (s *Segment) ReadOnly() bool { return s.readOnly }

// Data returns the data region: NBytes bytes starting at DataOffset. It stays
// valid until the last handle on the segment in this process is closed.
func (s *Segment) Data() []byte { return s.data }

// Refcount returns the current value of the shared count.
func (s *Segment) Refcount() (int64, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	return atomic.LoadInt64(s.f.rc), nil
}

// RefcountWord returns the shared count's word in the mapped header, for
// the data plane's steps that change it outside Go: it stays mapped until
// the segment is closed.
func (s *Segment) RefcountWord() *int64 { return s.f.rc }

// AddRef adds one to the shared count on behalf of someone who will call
// DropRef later (a message in flight, say) and returns the new count.
func (s *Segment) AddRef() (int64, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	return s.f.addRef()
}

// DropRef takes away one count added by AddRef, here or in another process,
// and returns the new count. At zero the segment is unlinked.
func (s *Segment) DropRef() (int64, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	return s.f.dropRef()
}

// CheckNamed returns nil when the segment's name still names it, so that
// a process handed the name attaches this segment; otherwise an error
// wrapping unix.ENOENT: the name was removed (Unlink) or now names another
// file, or the segment was never published. A memfd segment has no name in
// a file system and always passes.
//
// Threat model: the name is the only way a receiver finds a file segment,
// and any process of the user may remove it or put another file under it.
// What must never happen is a message that carries a count on this segment
// under a name that leads elsewhere: a sender checks the name when it
// describes the segment and refuses to send it when the name is gone. A
// name removed after the check (by another process, a race the sender
// cannot close under the file_system strategy) makes the receiver's take
// fail with ENOENT; the file_descriptor strategy has no names to lose.
func (s *Segment) CheckNamed() error {
	if s.closed.Load() {
		return ErrClosed
	}
	registry.mu.Lock()
	path, pending, key := s.f.path, s.f.pending, s.f.key
	registry.mu.Unlock()
	if path == "" {
		return nil
	}
	if pending != "" {
		return fmt.Errorf("segment %q is not published yet: no process can attach it: %w", s.f.name, unix.ENOENT)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil || (fileKey{st.Dev, st.Ino}) != key {
		return fmt.Errorf("segment %q was unlinked: its name no longer names it, so no process can attach it "+
			"(send it before unlinking it, or under the file_descriptor strategy): %w", s.f.name, unix.ENOENT)
	}
	return nil
}

// Close closes the handle. When it was this process's last handle on the
// segment, this process's count is dropped, unlinking the segment if no one
// else holds it, and the mapping goes (or waits in the mapping cache). The
// data must not be used after the last handle is closed.
func (s *Segment) Close() error {
	if s.closed.Swap(true) {
		return ErrClosed
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return s.f.letGo()
}

// Dup returns another handle on the segment, which keeps it (and its
// mapping) as s does until it is closed.
func (s *Segment) Dup() (*Segment, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if err := s.f.hold(false); err != nil {
		return nil, err
	}
	return &Segment{f: s.f, data: s.data, readOnly: s.readOnly}, nil
}

// Release drops this process's count on the segment now, as Close of the
// last handle would, but keeps the mapping until the handles are closed.
func (s *Segment) Release() error {
	if s.closed.Load() {
		return ErrClosed
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if !s.f.counted {
		return nil
	}
	_, err := s.f.uncount()
	return err
}

// ReleaseAll drops this process's count on every segment it holds, as if
// every handle were closed, but leaves the memory mapped so that views that
// are still in use stay valid (the process is about to exit). It returns how
// many segments it released. Closing the handles later drops nothing more.
func ReleaseAll() (int, error) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	expireSpares(time.Now(), true)
	var errs []error
	n := 0
	for _, f := range registry.files {
		if !f.counted || f.hdr.Kind == header.KindLedger {
			continue // a ledger goes last, with its own Close
		}
		n++
		err := fault.Catch(func() error {
			_, err := f.uncount()
			return err
		})
		if errors.Is(err, fault.ErrFault) {
			// Another process shrank the file under its holders: what it
			// held is lost for all of them, and its name goes now.
			err = errors.Join(fmt.Errorf("segment %q: %w", f.name, err), f.unlinkIfSame())
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// Unlink removes the name of segment name now. Processes that hold it keep
// their mappings; the memory is freed when the last one is closed.
func Unlink(name string) error {
	full, err := FullName(name)
	if err != nil {
		return err
	}
	if IsFDName(full) {
		return fmt.Errorf("memfd segment %q has no name in a file system to remove: %w", full, unix.EINVAL)
	}
	if err := unix.Unlink(Dir() + "/" + full); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("segment %q does not exist in %s: %w", full, Dir(), err)
		}
		return fmt.Errorf("unlink segment %q: %w", full, err)
	}
	return nil
}
