// Package shm creates, attaches and releases zctipc segments: files in
// /dev/shm that start with a header (package header) and carry a
// cross-process reference count.
//
// # Lifetime
//
// Every process that holds a segment counts once in the refcount of its
// header, however many times it attached it: a process maps each file once
// and counts its own handles locally. The creator starts the count at one;
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
	"sync"
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

// fileKey identifies a file independently of its name, which may be unlinked
// and reused.
type fileKey struct{ dev, ino uint64 }

// file is one segment file mapped in this process, shared by all handles.
type file struct {
	key      fileKey
	name     string
	path     string
	hdr      header.Header
	rw       []byte // read-write mapping of the segment, or nil
	ro       []byte // read-only mapping of the segment, or nil
	ctl      []byte // read-write mapping of the fixed header, when rw is nil
	rc       *int64 // the shared refcount, in rw or ctl; set with the first mapping
	handles  int    // open Segments on this file; guarded by registry.mu
	released bool   // this process's count was already dropped (ReleaseAll)
}

// registry holds every file this process has mapped, so that each counts
// once in its segment's refcount.
var registry = struct {
	mu    sync.Mutex
	files map[fileKey]*file
}{files: map[fileKey]*file{}}

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
	f := &file{key: fileKey{st.Dev, st.Ino}, name: name, path: path, hdr: hdr, rw: mem, handles: 1}
	f.rc = (*int64)(unsafe.Pointer(&mem[header.RefcountOffset]))
	registry.mu.Lock()
	registry.files[f.key] = f
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
	full, err := FullName(name)
	if err != nil {
		return nil, err
	}
	path := Dir() + "/" + full
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, openError(full, err)
	}
	defer unix.Close(fd)
	st, hdr, err := readHeader(fd, full)
	if err != nil {
		return nil, err
	}
	if kind != 0 && hdr.Kind != kind {
		return nil, fmt.Errorf("segment %q holds a %s, not a %s: %w", full, hdr.Kind, kind, unix.EINVAL)
	}
	key := fileKey{st.Dev, st.Ino}

	registry.mu.Lock()
	defer registry.mu.Unlock()
	f := registry.files[key]
	if f != nil && f.released {
		return nil, fmt.Errorf("segment %q was released by this process (release_all): %w", full, unix.ENOENT)
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
	if fresh {
		if _, err := f.addRef(); err != nil {
			return nil, errors.Join(err, f.unmap())
		}
		registry.files[key] = f
	}
	f.handles++
	return &Segment{f: f, data: f.region(readOnly), readOnly: readOnly}, nil
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
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return st, header.Header{}, fmt.Errorf("segment %q is not a regular file: %w", name, unix.EACCES)
	}
	if euid := uint32(unix.Geteuid()); st.Uid != euid {
		return st, header.Header{}, fmt.Errorf("segment %q belongs to uid %d, not to this user (uid %d): %w", name, st.Uid, euid, unix.EACCES)
	}
	if st.Mode&0o077 != 0 {
		return st, header.Header{}, fmt.Errorf("segment %q has mode %#o, which lets group or others in (zctipc segments are 0600): %w", name, st.Mode&0o777, unix.EACCES)
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

// mapFor makes sure f has the mapping a handle with readOnly needs. The caller
// holds registry.mu.
func (f *file) mapFor(fd int, readOnly bool) error {
	size := f.hdr.SegmentSize()
	var err error
	switch {
	case !readOnly && f.rw == nil:
		f.rw, err = mmap(fd, size, true)
	case readOnly && f.ro == nil:
		f.ro, err = mmap(fd, size, false)
	}
	if err == nil && f.rc == nil {
		ctl := f.rw
		if ctl == nil {
			if f.ctl, err = mmap(fd, header.FixedSize, true); err != nil {
				return err
			}
			ctl = f.ctl
		}
		f.rc = (*int64)(unsafe.Pointer(&ctl[header.RefcountOffset]))
	}
	return err
}

// region returns the data region of the mapping a handle with readOnly uses.
// The caller holds registry.mu or owns f alone.
func (f *file) region(readOnly bool) []byte {
	m := f.rw
	if readOnly {
		m = f.ro
	}
	h := &f.hdr
	return m[h.DataOffset : h.DataOffset+h.NBytes : h.DataOffset+h.NBytes]
}

func mmap(fd int, size uint64, writable bool) ([]byte, error) {
	if size > math.MaxInt {
		return nil, unix.EFBIG
	}
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE
	}
	return unix.Mmap(fd, 0, int(size), prot, unix.MAP_SHARED)
}

func (f *file) unmap() error {
	var errs []error
	for _, m := range []*[]byte{&f.rw, &f.ro, &f.ctl} {
		if *m != nil {
			if err := unix.Munmap(*m); err != nil {
				errs = append(errs, fmt.Errorf("unmap segment %q: %w", f.name, err))
			}
			*m = nil
		}
	}
	f.rc = nil
	return errors.Join(errs...)
}

// addRef adds one to the shared count unless it already reached zero.
func (f *file) addRef() (int64, error) {
	rc := f.rc
	for {
		n := atomic.LoadInt64(rc)
		if n <= 0 {
			return n, fmt.Errorf("segment %q is being removed (refcount %d): %w", f.name, n, unix.ENOENT)
		}
		if atomic.CompareAndSwapInt64(rc, n, n+1) {
			return n + 1, nil
		}
	}
}

// dropRef takes one from the shared count and unlinks the file when the
// count reaches zero.
func (f *file) dropRef() (int64, error) {
	n := atomic.AddInt64(f.rc, -1)
	switch {
	case n == 0:
		return 0, f.unlinkIfSame()
	case n < 0:
		return n, fmt.Errorf("segment %q: refcount fell to %d: %w", f.name, n, header.ErrCorrupt)
	}
	return n, nil
}

// unlinkIfSame removes the file's name unless it was already removed or now
// names a different file.
func (f *file) unlinkIfSame() error {
	var st unix.Stat_t
	if err := unix.Lstat(f.path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("stat segment %q: %w", f.name, err)
	}
	if (fileKey{st.Dev, st.Ino}) != f.key {
		return nil
	}
	if err := unix.Unlink(f.path); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unlink segment %q: %w", f.name, err)
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
// segment, the segment is unmapped and this process's count is dropped,
// unlinking the segment if no one else holds it. The data must not be used
// after the last handle is closed.
func (s *Segment) Close() error {
	if s.closed.Swap(true) {
		return ErrClosed
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	f := s.f
	if f.handles--; f.handles > 0 {
		return nil
	}
	delete(registry.files, f.key)
	var err error
	if !f.released {
		_, err = f.dropRef()
	}
	return errors.Join(err, f.unmap())
}

// ReleaseAll drops this process's count on every segment it holds, as if
// every handle were closed, but leaves the memory mapped so that views that
// are still in use stay valid (the process is about to exit). It returns how
// many segments it released. Later Closes only unmap.
func ReleaseAll() (int, error) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	var errs []error
	n := 0
	for _, f := range registry.files {
		if f.released {
			continue
		}
		f.released = true
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
