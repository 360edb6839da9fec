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
	"unsafe"

	"github.com/zctipc/zctipc/go/dtype"
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
func Create(name string, kind header.Kind, dt dtype.DType, shape []int64) (*Segment, error) {
	hdr, err := header.New(kind, dt, shape)
	if err != nil {
		return nil, err
	}
	self, err := proc.Self()
	if err != nil {
		return nil, err
	}
	hdr.Creator = self
	hdr.Refcount = 1

	random := name == ""
	for {
		full := RandomName()
		if !random {
			if full, err = FullName(name); err != nil {
				return nil, err
			}
		}
		seg, err := create(full, hdr)
		if random && errors.Is(err, unix.EEXIST) {
			continue // 128 random bits collided with an existing name
		}
		return seg, err
	}
}

func create(name string, hdr header.Header) (seg *Segment, err error) {
	path := Dir() + "/" + name
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("segment %q already exists: %w", name, err)
		}
		return nil, fmt.Errorf("create segment %q in %s: %w", name, Dir(), err)
	}
	defer unix.Close(fd)
	defer func() {
		if err != nil { // leave nothing half-created behind
			if uerr := unix.Unlink(path); uerr != nil {
				err = errors.Join(err, fmt.Errorf("remove half-created segment %q: %w", name, uerr))
			}
		}
	}()
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return nil, fmt.Errorf("fchmod segment %q: %w", name, err)
	}
	size := hdr.SegmentSize()
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EFBIG) {
			return nil, outOfMemory(name, size, err)
		}
		return nil, fmt.Errorf("reserve %d bytes for segment %q: %w", size, name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat segment %q: %w", name, err)
	}
	mem, err := mmap(fd, size, true)
	if err != nil {
		return nil, fmt.Errorf("map segment %q: %w", name, err)
	}
	hdr.CreatedNS = time.Now().UnixNano()
	hdr.Encode(mem)
	f := &file{key: fileKey{st.Dev, st.Ino}, name: name, path: path, hdr: hdr, rw: mem, handles: 1, counted: true}
	f.rc = (*int64)(unsafe.Pointer(&mem[header.RefcountOffset]))
	registry.mu.Lock()
	register(f)
	registry.mu.Unlock()
	return &Segment{f: f, data: f.region(false)}, nil
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
	path := Dir() + "/" + full
	if seg := attachMapped(path, kind, readOnly, adopt); seg != nil {
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
// keeps in its mapping cache, when path still names that file and its owner
// and mode still pass: one lstat instead of opening, reading and mapping it
// again. Otherwise it returns nil and Attach takes the long way.
func attachMapped(path string, kind header.Kind, readOnly, adopt bool) *Segment {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	f := registry.byPath[path]
	if f == nil || kind != 0 && f.hdr.Kind != kind || !f.hasMapping(readOnly) {
		return nil
	}
	var st unix.Stat_t
	if unix.Lstat(path, &st) != nil || (fileKey{st.Dev, st.Ino}) != f.key || checkStat(&st, f.name) != nil {
		return nil
	}
	if f.hold(adopt) != nil {
		return nil // the segment is being removed: the long way says so
	}
	return &Segment{f: f, data: f.region(readOnly), readOnly: readOnly}
}

// openChecked opens segment full read-write and returns its fd, stat and
// validated header, after checking that it is of kind (any kind when zero).
// The caller closes the fd.
func openChecked(full, path string, kind header.Kind) (int, unix.Stat_t, header.Header, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, unix.Stat_t{}, header.Header{}, openError(full, err)
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
	s.f.counted = false
	_, err := s.f.dropRef()
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
		if !f.counted {
			continue
		}
		f.counted = false
		n++
		if _, err := f.dropRef(); err != nil {
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
	fd, err := unix.Open(Dir()+"/"+full, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Info{}, openError(full, err)
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
type Mapping struct{ f *file }

// Map maps segment name, which must be of the given kind, without counting
// this process as a holder. It checks the file and its header as Attach
// does, and refuses a segment whose count already reached zero.
func Map(name string, kind header.Kind) (*Mapping, error) {
	full, err := FullName(name)
	if err != nil {
		return nil, err
	}
	path := Dir() + "/" + full
	fd, st, hdr, err := openChecked(full, path, kind)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
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

// Data returns the data region.
func (m *Mapping) Data() []byte { return m.f.region(false) }

// Refcount returns the current value of the shared count.
func (m *Mapping) Refcount() int64 { return atomic.LoadInt64(m.f.rc) }

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
