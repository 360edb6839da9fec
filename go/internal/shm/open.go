// Opening an existing segment and the checks every open makes (a regular
// file of this user, mode 0600, a valid header read into a private copy):
// Attach and Adopt, and Stat, which only reads the header.

package shm

import (
	"errors"
	"fmt"

	"github.com/zctipc/zctipc/go/internal/header"
	"golang.org/x/sys/unix"
)

// Attach maps the existing segment name (with or without the prefix) and
// counts this process as one of its holders, unless it already holds it.
// Unless kind is zero, the segment must be of that kind. With readOnly the
// data is mapped PROT_READ. The error wraps unix.ENOENT when there is no such
// segment or it is being removed, unix.EACCES when its owner or mode is
// wrong, unix.EINVAL when it has another kind, and the header package's
// errors when its header is not valid.
func Attach(name string, kind header.Kind, readOnly bool) (*Segment, error) {
	return attach(name, kind, readOnly, false)
}

// Adopt attaches segment name read-write as Attach does, but takes over a
// count that was added for the caller (by a message in flight) instead of
// adding one; when this process already counts as a holder, that count is
// dropped instead.
func Adopt(name string, kind header.Kind) (*Segment, error) {
	return attach(name, kind, false, true)
}

func attach(name string, kind header.Kind, readOnly, adopt bool) (*Segment, error) {
	full, err := FullName(name)
	if err != nil {
		return nil, err
	}
	path := pathOf(full)
	if seg := attachMapped(full, kind, readOnly, adopt); seg != nil {
		return seg, nil
	}
	fd, st, hdr, err := openChecked(full, path, kind)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	key := fileKey{st.Dev, st.Ino}

	registry.mu.Lock()
	defer registry.mu.Unlock()
	f := registry.files[key]
	if f != nil && f.hdr.CreatedNS != hdr.CreatedNS {
		// The file was let go and made into another segment (a spare
		// reused): what this process keeps of it is stale.
		f.retire()
		f = nil
	}
	fresh := f == nil
	if fresh {
		f = &file{key: key, name: full, path: path, hdr: hdr}
	}
	if err := f.mapFor(fd, readOnly); err != nil {
		err = fmt.Errorf("map segment %q: %w", full, err)
		if fresh {
			err = errors.Join(err, f.unmap())
		}
		return nil, err
	}
	if err := f.hold(adopt); err != nil {
		if fresh {
			err = errors.Join(err, f.unmap())
		}
		return nil, err
	}
	if fresh {
		register(f)
	}
	return &Segment{f: f, data: f.region(readOnly), readOnly: readOnly}, nil
}

// attachMapped returns a new handle on a file this process maps already, or
// keeps in its mapping cache, when its name still names that file and its
// owner and mode still pass: one lstat instead of opening, reading and
// mapping it again (none for a memfd, whose name is never reused).
// Otherwise it returns nil and Attach takes the long way.
func attachMapped(name string, kind header.Kind, readOnly, adopt bool) *Segment {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	f := registry.byName[name]
	if f == nil || kind != 0 && f.hdr.Kind != kind || !f.hasMapping(readOnly) || !f.current() {
		return nil
	}
	var st unix.Stat_t
	if f.path != "" && (unix.Lstat(f.path, &st) != nil || (fileKey{st.Dev, st.Ino}) != f.key || checkStat(&st, f.name) != nil) {
		return nil
	}
	if f.hold(adopt) != nil {
		return nil // the segment is being removed: the long way says so
	}
	return &Segment{f: f, data: f.region(readOnly), readOnly: readOnly}
}

// pathOf returns the path of segment full, or "" for a memfd segment.
func pathOf(full string) string {
	if IsFDName(full) {
		return ""
	}
	return Dir() + "/" + full
}

// openFD opens segment full (at path) read-write: the file, or a descriptor
// of the memfd from the broker.
func openFD(full, path string) (int, error) {
	if path == "" {
		b, err := currentBroker()
		if err != nil {
			return -1, fmt.Errorf("segment %q: %w", full, err)
		}
		fd, err := b.Fetch(full)
		if err != nil {
			return -1, err
		}
		if err := CheckMemfd(fd, full); err != nil {
			return -1, errors.Join(err, unix.Close(fd))
		}
		return fd, nil
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, openError(full, err)
	}
	return fd, nil
}

// Note [the header read is the name's]: a file opened by its name may be
// let go and made into another segment (a spare reused, spare.go) before
// its header is read: renamed to a temporary name, its header rewritten
// whole and valid, its count set to one, and its data written, or being
// written, for another name. So a header read through a descriptor opened
// by name is that name's only if the name still names the file after the
// read: openChecked checks it with one lstat and opens the name again when
// it does not. A file's creation time is never given to another segment,
// so a caller that then counts itself a holder and finds the same creation
// time (file.hold) holds the very segment that the name named, complete
// (Note [a name appears with its contents] in create.go).
//
// Threat model: any process of the user may rename, replace or rewrite a
// segment file between the open, the read and the lstat (it may do that to
// any segment). What must never happen is that a header read from one
// segment is used as another name's, so that an attacher counts and maps
// another segment, or one still being written, under the name it asked for.
// A name that keeps changing under the open costs at most maxOpenTries opens,
// then a not-found error.

// maxOpenTries bounds how often openChecked opens a name whose file changed
// while it was being opened.
const maxOpenTries = 4

// openChecked opens segment full read-write and returns its fd, stat and
// validated header, after checking that it is of kind (any kind when zero)
// and that the name still names the file whose header it read (Note [the
// header read is the name's]). The caller closes the fd.
func openChecked(full, path string, kind header.Kind) (int, unix.Stat_t, header.Header, error) {
	for tries := 1; ; tries++ {
		fd, err := openFD(full, path)
		if err != nil {
			return -1, unix.Stat_t{}, header.Header{}, err
		}
		st, hdr, err := readHeader(fd, full)
		// An invalid header may be one being rewritten: the file was let go
		// after it was opened and is becoming a new segment under a
		// temporary name, or became one and has the name again.
		rewritten := err != nil && (errors.Is(err, header.ErrNotZctipc) || errors.Is(err, header.ErrVersion) || errors.Is(err, header.ErrCorrupt))
		if path != "" && (err == nil || rewritten) {
			named := namesFile(path, st)
			if !named || rewritten {
				if cerr := unix.Close(fd); cerr != nil {
					return -1, st, hdr, fmt.Errorf("close segment %q: %w", full, cerr)
				}
				if tries < maxOpenTries {
					continue
				}
				if named {
					return -1, st, hdr, err
				}
				return -1, st, hdr, fmt.Errorf("segment %q was removed while it was opened: %w", full, unix.ENOENT)
			}
		}
		if err == nil && kind != 0 && hdr.Kind != kind {
			err = fmt.Errorf("segment %q holds a %s, not a %s: %w", full, hdr.Kind, kind, unix.EINVAL)
		}
		if err != nil {
			return -1, st, hdr, errors.Join(err, unix.Close(fd))
		}
		return fd, st, hdr, nil
	}
}

// namesFile reports whether path names the file of stat st now.
func namesFile(path string, st unix.Stat_t) bool {
	var now unix.Stat_t
	return unix.Lstat(path, &now) == nil && (fileKey{now.Dev, now.Ino}) == (fileKey{st.Dev, st.Ino})
}

func openError(name string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("segment %q does not exist in %s: %w", name, Dir(), err)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("segment %q is a symbolic link, which zctipc never follows: %w", name, unix.EACCES)
	}
	return fmt.Errorf("open segment %q: %w", name, err)
}

// readHeader checks the file behind fd (regular, ours, mode 0600) and returns
// its stat and its validated header, read into a private buffer.
func readHeader(fd int, name string) (unix.Stat_t, header.Header, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return st, header.Header{}, fmt.Errorf("fstat segment %q: %w", name, err)
	}
	if err := checkStat(&st, name); err != nil {
		return st, header.Header{}, err
	}
	buf := make([]byte, min(st.Size, header.MaxSize))
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return st, header.Header{}, fmt.Errorf("read header of segment %q: %w", name, err)
	}
	hdr, err := header.Decode(buf[:n], uint64(st.Size))
	if err != nil {
		return st, header.Header{}, fmt.Errorf("segment %q: %w", name, err)
	}
	return st, hdr, nil
}

// checkStat refuses a file that is not a regular file, belongs to another
// user, or lets group or others in.
func checkStat(st *unix.Stat_t, name string) error {
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("segment %q is not a regular file: %w", name, unix.EACCES)
	}
	if euid := uint32(unix.Geteuid()); st.Uid != euid {
		return fmt.Errorf("segment %q belongs to uid %d, not to this user (uid %d): %w", name, st.Uid, euid, unix.EACCES)
	}
	if st.Mode&0o077 != 0 {
		return fmt.Errorf("segment %q has mode %#o, which lets group or others in (zctipc segments are 0600): %w", name, st.Mode&0o777, unix.EACCES)
	}
	return nil
}

// Info describes a segment file without attaching it.
type Info struct {
	Name   string
	Size   int64 // bytes in the file
	Header header.Header
}

// Stat reads and validates the header of segment name without mapping it or
// counting as a holder; Header.Refcount is the count at that moment.
func Stat(name string) (Info, error) {
	full, err := FullName(name)
	if err != nil {
		return Info{}, err
	}
	fd, err := openFD(full, pathOf(full))
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(fd)
	st, hdr, err := readHeader(fd, full)
	if err != nil {
		return Info{}, err
	}
	return Info{Name: full, Size: st.Size, Header: hdr}, nil
}
