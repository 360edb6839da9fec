// Mappings that hold no count of their own, for memory whose life other
// counts keep: the arenas of pool slots, and the ledgers and memfd segments
// the daemon watches and keeps.

package shm

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/header"
	"golang.org/x/sys/unix"
)

// Mapping is a segment mapped read-write without counting this process as a
// holder, for memory whose life other counts keep (the slots of a pool
// arena pin their arena). Its owner unmaps it once the count reached zero.
// Its methods are safe for concurrent use; Unmap must not race with the
// use of Data.
type Mapping struct{ f *file }

// Map maps segment name, which must be of the given kind, without counting
// this process as a holder. It checks the file and its header as Attach
// does, and refuses a segment whose count already reached zero.
func Map(name string, kind header.Kind) (*Mapping, error) {
	full, err := FullName(name)
	if err != nil {
		return nil, err
	}
	path := pathOf(full)
	fd, st, hdr, err := openChecked(full, path, kind)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return mapChecked(fd, st, hdr, full, path)
}

// MapFD maps, as Map does, the memfd segment name of kind (any kind when
// zero) behind fd, which stays the caller's, after checking the descriptor
// as one received from another process.
func MapFD(fd int, name string, kind header.Kind) (*Mapping, error) {
	if err := CheckMemfd(fd, name); err != nil {
		return nil, err
	}
	st, hdr, err := readHeader(fd, name)
	if err == nil && kind != 0 && hdr.Kind != kind {
		err = fmt.Errorf("segment %q holds a %s, not a %s: %w", name, hdr.Kind, kind, unix.EINVAL)
	}
	if err != nil {
		return nil, err
	}
	return mapChecked(fd, st, hdr, name, "")
}

func mapChecked(fd int, st unix.Stat_t, hdr header.Header, full, path string) (*Mapping, error) {
	f := &file{key: fileKey{st.Dev, st.Ino}, name: full, path: path, hdr: hdr}
	if err := f.mapFor(fd, false); err != nil {
		return nil, errors.Join(fmt.Errorf("map segment %q: %w", full, err), f.unmap())
	}
	if atomic.LoadInt64(f.rc) <= 0 {
		return nil, errors.Join(fmt.Errorf("segment %q is being removed: %w", full, unix.ENOENT), f.unmap())
	}
	return &Mapping{f: f}, nil
}

// Name returns the full name of the segment.
func (m *Mapping) Name() string { return m.f.name }

// Header returns the segment's validated header.
func (m *Mapping) Header() header.Header { return m.f.hdr }

// Data returns the data region.
func (m *Mapping) Data() []byte { return m.f.region(false) }

// Refcount returns the current value of the shared count; 0 when the
// segment's header is gone (another process shrank the file).
func (m *Mapping) Refcount() int64 {
	n, err := fault.LoadInt64(m.f.rc)
	if err != nil {
		return 0
	}
	return n
}

// RefcountWord returns the shared count's word in the mapped header, for
// the data plane's steps that change it outside Go: it stays mapped until
// Unmap.
func (m *Mapping) RefcountWord() *int64 { return m.f.rc }

// AddRef adds one to the shared count unless it reached zero.
func (m *Mapping) AddRef() (int64, error) { return m.f.addRef() }

// DropRef takes one from the shared count, unlinking the segment at zero.
func (m *Mapping) DropRef() (int64, error) { return m.f.dropRef() }

// Unmap unmaps the segment; its data must not be used afterwards.
func (m *Mapping) Unmap() error { return m.f.unmap() }
