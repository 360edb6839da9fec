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
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/dtype"
	"github.com/zctipc/zctipc/go/fault"
	"github.com/zctipc/zctipc/go/header"
	"github.com/zctipc/zctipc/go/proc"
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

// Create makes a new segment named name (a random name if name is empty) for
// a C-contiguous array of type dt and shape shape, reserves all its pages,
// writes the header with a refcount of one, and maps it read-write. An
// existing file is never adopted: the error then wraps unix.EEXIST. When the
// directory is too small, the error wraps ErrOutOfSharedMemory and nothing is
// left behind.
//
// Under the FileDescriptor strategy the segment is a memfd handed to the
// broker, and it cannot be given a name.
//
// A file segment is made under a temporary name and renamed to its own once
// its header is written, so that no process ever attaches a half-made
// segment, and so that the tracker can tell what a creator that died left.
func Create(name string, kind header.Kind, dt dtype.DType, shape []int64) (*Segment, error) {
	hdr, err := header.New(kind, dt, shape)
	if err != nil {
		return nil, err
	}
	seg, _, err := create(name, hdr, 0, false)
	return seg, err
}

// CreateSparse makes a new unnamed segment of kind whose data region is size
// bytes of uint8, like Create, but reserves only the first reserve bytes of
// its data; Reserve reserves more. Reading or writing past the reserved bytes
// is not allowed: it could fault when the file system is full. It returns the
// segment's file descriptor too, which the caller closes. A memfd segment
// made so is not handed to the broker: only the processes the caller sends
// the descriptor to can map it.
func CreateSparse(kind header.Kind, size, reserve uint64) (*Segment, int, error) {
	if size > math.MaxInt64 {
		return nil, -1, fmt.Errorf("a segment of %d bytes: %w", size, unix.EINVAL)
	}
	hdr, err := header.New(kind, dtype.Uint8, []int64{int64(size)})
	if err != nil {
		return nil, -1, err
	}
	return create("", hdr, hdr.DataOffset+min(reserve, size), true)
}

// create makes a segment of header hdr, reserving its first reserve bytes
// (all of it when reserve is zero), and returns its fd too with keepFD.
func create(name string, hdr header.Header, reserve uint64, keepFD bool) (*Segment, int, error) {
	self, err := proc.Self()
	if err != nil {
		return nil, -1, err
	}
	hdr.Creator = self
	hdr.Refcount = 1
	var t Tracker
	if hdr.Kind != header.KindLedger {
		t = currentTracker()
	}
	hdr.Tracked = t != nil
	if reserve == 0 {
		reserve = hdr.SegmentSize()
	}
	if CurrentStrategy() == FileDescriptor {
		if name != "" {
			return nil, -1, fmt.Errorf("segment %q: under the file_descriptor strategy segments have no name; "+
				"create it without one and send it, or use the file_system strategy: %w", name, unix.EINVAL)
		}
		return createFD(hdr, reserve, t, keepFD)
	}
	random := name == ""
	for {
		full := RandomName()
		if !random {
			if full, err = FullName(name); err != nil {
				return nil, -1, err
			}
		}
		seg, fd, err := createFile(full, hdr, reserve, t, keepFD)
		if random && errors.Is(err, unix.EEXIST) {
			continue // 128 random bits collided with an existing name
		}
		return seg, fd, err
	}
}

// closeUnlessKept closes *fd unless keep, when err is nil.
func closeUnlessKept(fd *int, keep bool, err *error) {
	if *err != nil || !keep {
		unix.Close(*fd)
		*fd = -1
	}
}

// createFile makes file segment name: a temporary file, reserved, mapped and
// written, then renamed.
func createFile(name string, hdr header.Header, reserve uint64, t Tracker, keepFD bool) (seg *Segment, fd int, err error) {
	tmp := randomName(TmpPrefix)
	tmpPath := Dir() + "/" + tmp
	entry := NoEntry
	if t != nil {
		entry = t.Creating(tmp, name)
	}
	fd, err = unix.Open(tmpPath, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		if t != nil {
			t.Dropped(entry)
		}
		return nil, -1, fmt.Errorf("create segment %q in %s: %w", name, Dir(), err)
	}
	defer closeUnlessKept(&fd, keepFD, &err)
	var mem []byte
	defer func() {
		if err == nil {
			return
		}
		// Leave nothing half-created behind, then forget the entry.
		if mem != nil {
			err = errors.Join(err, unix.Munmap(mem))
		}
		if uerr := unix.Unlink(tmpPath); uerr != nil && !errors.Is(uerr, unix.ENOENT) {
			err = errors.Join(err, fmt.Errorf("remove half-created segment %q: %w", name, uerr))
		}
		if t != nil {
			t.Dropped(entry)
		}
	}()
	var st unix.Stat_t
	if err = unix.Fstat(fd, &st); err != nil {
		return nil, fd, fmt.Errorf("fstat segment %q: %w", name, err)
	}
	if t != nil {
		t.Opened(entry, st.Dev, st.Ino)
	}
	stall(hdr.Kind, "create-open")
	if mem, err = prepare(fd, name, &hdr, reserve); err != nil {
		return nil, fd, err
	}
	path := Dir() + "/" + name
	if err = rename(tmpPath, path); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fd, fmt.Errorf("segment %q already exists: %w", name, err)
		}
		return nil, fd, fmt.Errorf("create segment %q in %s: %w", name, Dir(), err)
	}
	stall(hdr.Kind, "create-rename")
	if t != nil {
		t.Created(entry)
	}
	return newFile(fileKey{st.Dev, st.Ino}, name, path, hdr, mem, t, entry), fd, nil
}

// createFD makes a memfd segment and hands it to the broker, unless the
// caller keeps its fd.
func createFD(hdr header.Header, reserve uint64, t Tracker, keepFD bool) (seg *Segment, fd int, err error) {
	var b Broker
	if !keepFD {
		if b, err = currentBroker(); err != nil {
			return nil, -1, err
		}
	}
	name := randomName(FDPrefix)
	if fd, err = createMemfd(name); err != nil {
		return nil, -1, err
	}
	defer closeUnlessKept(&fd, keepFD, &err)
	var mem []byte
	defer func() {
		if err != nil && mem != nil {
			err = errors.Join(err, unix.Munmap(mem))
		}
	}()
	if mem, err = prepare(fd, name, &hdr, reserve); err != nil {
		return nil, fd, err
	}
	var st unix.Stat_t
	if err = unix.Fstat(fd, &st); err != nil {
		return nil, fd, fmt.Errorf("fstat segment %q: %w", name, err)
	}
	if err = seal(fd, name); err != nil {
		return nil, fd, err
	}
	entry := NoEntry
	if b != nil {
		// Recorded before the broker has it: an entry for a name the broker
		// never got is given up as nothing.
		if t != nil {
			entry = t.Holding(name)
		}
		if err = b.Put(name, fd); err != nil {
			if t != nil {
				t.Dropped(entry)
			}
			return nil, fd, fmt.Errorf("hand memfd segment %q to the cleanup daemon: %w", name, err)
		}
	}
	return newFile(fileKey{st.Dev, st.Ino}, name, "", hdr, mem, t, entry), fd, nil
}

// prepare sizes and reserves the new file behind fd, maps it and writes
// its header.
func prepare(fd int, name string, hdr *header.Header, reserve uint64) ([]byte, error) {
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return nil, fmt.Errorf("fchmod segment %q: %w", name, err)
	}
	size := hdr.SegmentSize()
	if reserve < size {
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			return nil, fmt.Errorf("size segment %q: %w", name, err)
		}
	}
	if err := reserveRange(fd, name, 0, min(reserve, size)); err != nil {
		return nil, err
	}
	stall(hdr.Kind, "create-reserve")
	// The creator writes the data: its page tables are filled at once when
	// every page is reserved, rather than one fault per page.
	mem, err := mmapFlags(fd, size, true, populateIf(reserve >= size))
	if err != nil {
		return nil, fmt.Errorf("map segment %q: %w", name, err)
	}
	hdr.CreatedNS = time.Now().UnixNano()
	hdr.Encode(mem)
	return mem, nil
}

// reserveRange allocates the pages of bytes [off, off+n) of the file behind
// fd, so that touching them never faults for want of memory.
func reserveRange(fd int, name string, off, n uint64) error {
	if n == 0 {
		return nil
	}
	if err := unix.Fallocate(fd, 0, int64(off), int64(n)); err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EFBIG) {
			return outOfMemory(name, n, err)
		}
		return fmt.Errorf("reserve %d bytes for segment %q: %w", n, name, err)
	}
	return nil
}

// rename gives the file at from the name to, unless to exists.
func rename(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	// A file system without RENAME_NOREPLACE: link fails on an existing
	// name as well.
	if err := unix.Link(from, to); err != nil {
		return err
	}
	return unix.Unlink(from)
}

// newFile registers a file this process just created, with the creator's
// count and one handle, and returns that handle.
func newFile(key fileKey, name, path string, hdr header.Header, mem []byte, t Tracker, entry int) *Segment {
	f := &file{key: key, name: name, path: path, hdr: hdr, rw: mem, handles: 1, counted: true, tracker: t, entry: entry}
	f.rc = (*int64)(unsafe.Pointer(&mem[header.RefcountOffset]))
	registry.mu.Lock()
	register(f)
	registry.mu.Unlock()
	return &Segment{f: f, data: f.region(false)}
}

// Reserve reserves the pages of the segment's data up to byte n of it, for
// a segment made with CreateSparse; fd is the one CreateSparse returned.
func (s *Segment) Reserve(fd int, n uint64) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return reserveRange(fd, s.f.name, s.f.hdr.DataOffset, min(n, s.f.hdr.NBytes))
}

func outOfMemory(name string, size uint64, cause error) error {
	dir := Dir()
	var fs unix.Statfs_t
	free, total := "unknown", "unknown"
	if unix.Statfs(dir, &fs) == nil {
		free = formatBytes(fs.Bavail * uint64(fs.Bsize))
		total = formatBytes(fs.Blocks * uint64(fs.Bsize))
	}
	return fmt.Errorf("%w: segment %q needs %s (%d bytes) but %s has %s free of %s; "+
		"give a container more with docker run --shm-size=<size>, or grow the mount with "+
		"mount -o remount,size=<size> %s: %w",
		ErrOutOfSharedMemory, name, formatBytes(size), size, dir, free, total, dir, cause)
}

func formatBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, suffix := float64(n), "KMGTPE"
	i := -1
	for v >= unit && i < len(suffix)-1 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, suffix[i])
}

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
	if f == nil || kind != 0 && f.hdr.Kind != kind || !f.hasMapping(readOnly) {
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

// openChecked opens segment full read-write and returns its fd, stat and
// validated header, after checking that it is of kind (any kind when zero).
// The caller closes the fd.
func openChecked(full, path string, kind header.Kind) (int, unix.Stat_t, header.Header, error) {
	fd, err := openFD(full, path)
	if err != nil {
		return -1, unix.Stat_t{}, header.Header{}, err
	}
	st, hdr, err := readHeader(fd, full)
	if err == nil && kind != 0 && hdr.Kind != kind {
		err = fmt.Errorf("segment %q holds a %s, not a %s: %w", full, hdr.Kind, kind, unix.EINVAL)
	}
	if err != nil {
		return -1, st, hdr, errors.Join(err, unix.Close(fd))
	}
	return fd, st, hdr, nil
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

// AddRef adds one to the shared count unless it reached zero.
func (m *Mapping) AddRef() (int64, error) { return m.f.addRef() }

// DropRef takes one from the shared count, unlinking the segment at zero.
func (m *Mapping) DropRef() (int64, error) { return m.f.dropRef() }

// Unmap unmaps the segment; its data must not be used afterwards.
func (m *Mapping) Unmap() error { return m.f.unmap() }

// Find returns a new handle on the tensor segment whose data holds the n
// bytes at addr, with their offset in the data region, when this process has
// it open. The handle holds no count of its own (the process already
// counts); AddRef adds one to hand on.
func Find(addr uintptr, n uint64) (*Segment, uint64, bool) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	for _, f := range registry.files {
		if f.handles == 0 || f.hdr.Kind != header.KindTensor {
			continue
		}
		for _, readOnly := range []bool{false, true} {
			if !f.hasMapping(readOnly) {
				continue
			}
			data := f.region(readOnly)
			if len(data) == 0 {
				continue
			}
			base := uintptr(unsafe.Pointer(&data[0]))
			if addr >= base && uint64(addr-base)+n <= uint64(len(data)) {
				f.handles++
				return &Segment{f: f, data: data, readOnly: readOnly}, uint64(addr - base), true
			}
		}
	}
	return nil, 0, false
}

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

// NameAt returns the name of the segment whose mapping in this process
// holds addr, for error messages; false when none does.
func NameAt(addr uintptr) (string, bool) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	for _, f := range registry.files {
		for _, m := range [][]byte{f.rw, f.ro, f.ctl} {
			if len(m) > 0 {
				base := uintptr(unsafe.Pointer(&m[0]))
				if addr >= base && addr-base < uintptr(len(m)) {
					return f.name, true
				}
			}
		}
	}
	return "", false
}
