// Counts given up without a handle, and what runs when the last one goes:
// a kind's finalizer, DropRef of a message thrown away, and Reclaim of a
// segment whose holders died.

package shm

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/zctipc/zctipc/go/internal/header"
	"golang.org/x/sys/unix"
)

// finalizers run when a segment of their kind loses its last count, while
// it is still mapped, before it is unlinked.
var finalizers [8]func(data []byte) error

// OnLastRelease registers fn to run, in whichever process takes the count of
// a segment of kind to zero, on its data before the segment is unlinked (a
// queue releases what its messages still hold).
func OnLastRelease(kind header.Kind, fn func(data []byte) error) {
	finalizers[kind] = fn
}

// DropRef takes away one count of segment name that was added for the
// caller (by a message in flight) without attaching it: for messages that
// are thrown away. It takes no lock of this package, so a finalizer may
// call it.
func DropRef(name string, kind header.Kind) error {
	m, err := Map(name, kind)
	if err != nil {
		return err
	}
	_, err = m.DropRef()
	return errors.Join(err, m.Unmap())
}

// Reclaim removes segment name, which no live process holds although its
// count says otherwise (its holders died without giving their counts up), if
// it is still the file with inode ino and its count is still rc: the count
// goes to zero in one compare-and-swap, so that nobody can attach it any
// more, the segment's finalizer runs (a queue gives up what its messages
// hold) and the name is removed. It reports whether it removed the segment.
func Reclaim(name string, ino uint64, rc int64) (bool, error) {
	full, err := FullName(name)
	if err != nil {
		return false, err
	}
	path := pathOf(full)
	fd, st, hdr, err := openChecked(full, path, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	if st.Ino != ino {
		return false, nil
	}
	f := &file{key: fileKey{st.Dev, st.Ino}, name: full, path: path, hdr: hdr}
	if err := f.mapFor(fd, false); err != nil {
		return false, errors.Join(fmt.Errorf("map segment %q: %w", full, err), f.unmap())
	}
	defer f.unmap()
	switch n := atomic.LoadInt64(f.rc); {
	case n <= 0 && rc <= 0:
		// A release that took the count to zero died before it removed the
		// name.
		return true, f.unlinkIfSame()
	case n != rc || !atomic.CompareAndSwapInt64(f.rc, rc, 0):
		return false, nil
	}
	return true, f.remove()
}
