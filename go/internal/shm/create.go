// Making new segments: a file made under a temporary name and renamed once
// its header is written, or a memfd; its pages reserved, so that a full
// directory is an error (ErrOutOfSharedMemory), never a SIGBUS.

package shm

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/proc"
	"golang.org/x/sys/unix"
)

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
	seg, _, err := create(name, hdr, 0, false, false)
	return seg, err
}

// CreateUninitialized is Create for a caller that writes every byte of the
// data itself: a large tensor or table segment may then be made from the
// pages of one this process let go (see spare.go), which still hold old
// data, rather than from fresh zeroed pages. kind is header.KindTensor or
// header.KindTable.
//
// The segment has no name in the file system until the caller, having
// written the data, calls Publish: no process can attach it (and see the
// old pages, or half of the data) before then. Closing it unpublished
// removes it.
func CreateUninitialized(name string, kind header.Kind, dt dtype.DType, shape []int64) (*Segment, error) {
	if kind != header.KindTensor && kind != header.KindTable {
		return nil, fmt.Errorf("an uninitialized segment of kind %d: only tensors and tables: %w", kind, unix.EINVAL)
	}
	hdr, err := header.New(kind, dt, shape)
	if err != nil {
		return nil, err
	}
	seg, _, err := create(name, hdr, 0, true, false)
	return seg, err
}

// Note [a name appears with its contents]: a name is what another process
// attaches, so a segment gets its name only once its contents are
// complete. A zeroed segment is complete when its header is written (a new
// file reads as zeros; a spare is zeroed before it is renamed); a segment
// made by CreateUninitialized is complete when its creator has written the
// data, so it stays under its temporary name (which no process attaches)
// until Publish.
//
// Threat model: only the creating process holds a handle on an unpublished
// segment, so only it can publish it. Another process of the user may
// rename, truncate or remove the temporary file meanwhile (it may do that
// to any segment); Publish then fails, or publishes what it renamed, but
// never gives the name to a file whose contents this process did not
// finish, and never replaces an existing name (RENAME_NOREPLACE).

// Publish gives a segment made by CreateUninitialized its name, once its
// data is written; it does nothing for a segment that has its name (or
// none: a memfd). It fails with an error wrapping unix.EEXIST when another
// segment took the name meanwhile; the segment then stays unpublished.
func (s *Segment) Publish() error {
	if s.closed.Load() {
		return ErrClosed
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	f := s.f
	if f.pending == "" {
		return nil
	}
	if err := rename(f.pending, f.path); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("segment %q already exists: %w", f.name, err)
		}
		return fmt.Errorf("publish segment %q in %s: %w", f.name, Dir(), err)
	}
	f.pending = ""
	if f.tracker != nil {
		f.tracker.Created(f.entry)
	}
	return nil
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
	return create("", hdr, hdr.DataOffset+min(reserve, size), false, true)
}

// CreatePartly makes a new segment named name (random when empty) like
// Create, but reserves only the first reserve bytes of its data: the
// caller reserves the rest as it uses it, with ReservePages, and must not
// touch a page it has not reserved (it could fault when the file system is
// full). Pages it no longer needs it gives back with ReleasePages.
func CreatePartly(name string, kind header.Kind, dt dtype.DType, shape []int64, reserve uint64) (*Segment, error) {
	hdr, err := header.New(kind, dt, shape)
	if err != nil {
		return nil, err
	}
	seg, _, err := create(name, hdr, hdr.DataOffset+min(max(reserve, 1), hdr.NBytes), false, false)
	return seg, err
}

// ReservePages reserves the memory pages that hold mem, a part of a
// segment's read-write mapping, so that touching them cannot fault for want
// of memory: it returns an error wrapping ErrOutOfSharedMemory instead.
// It needs Linux 5.14 (MADV_POPULATE_WRITE); see PagesOnDemand.
func ReservePages(mem []byte) error {
	return ReservePagesOf("(a queue's ring)", mem)
}

// ReserveFailed is the error of a reservation of n bytes of a queue's ring
// that failed with errno (as ReservePages reports it).
func ReserveFailed(n uint64, errno error) error {
	return outOfMemoryIf("(a queue's ring)", n, errno)
}

// ReservePagesOf is ReservePages for a part of the segment named name,
// which its error names.
func ReservePagesOf(name string, mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	start, end := pageSpan(mem, false)
	if err := madvise(start, end-start, unix.MADV_POPULATE_WRITE); err != nil {
		return outOfMemoryIf(name, uint64(len(mem)), err)
	}
	return nil
}

// AdviseHugePages asks that mem, a part of a segment's read-write mapping
// whose pages are reserved later (ReservePages), be filled with huge pages
// where the file system allows them when asked (see reserveMapped). It
// is only advice: a kernel without transparent huge pages ignores it.
func AdviseHugePages(mem []byte) {
	if len(mem) < hugeFrom {
		return
	}
	start, end := pageSpan(mem, false)
	_ = madvise(start, end-start, unix.MADV_HUGEPAGE) // EINVAL without transparent huge pages
}

// ReleasePages gives back to the file system the memory pages that lie
// wholly inside mem, a part of a segment's read-write mapping; they read
// as zeros afterwards, in every process. Pages that mem only partly covers
// are kept.
func ReleasePages(mem []byte) error {
	start, end := pageSpan(mem, true)
	if end <= start {
		return nil
	}
	return madvise(start, end-start, unix.MADV_REMOVE)
}

// madvise advises on the n bytes of mapped memory at addr, page-aligned
// addresses of a mapping that stays mapped for the call.
func madvise(addr, n uintptr, advice int) error {
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, addr, n, uintptr(advice)); errno != 0 {
		return errno
	}
	return nil
}

// pageSpan returns the page-aligned addresses that cover mem (inner: that
// lie inside it).
func pageSpan(mem []byte, inner bool) (uintptr, uintptr) {
	page := uintptr(unix.Getpagesize())
	start := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	end := start + uintptr(len(mem))
	if inner {
		return (start + page - 1) &^ (page - 1), end &^ (page - 1)
	}
	return start &^ (page - 1), (end + page - 1) &^ (page - 1)
}

var onDemand = sync.OnceValue(func() bool {
	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return false
	}
	defer unix.Munmap(mem)
	return unix.Madvise(mem, unix.MADV_POPULATE_WRITE) == nil
})

// PagesOnDemand reports whether this kernel reserves pages on demand
// (ReservePages works: Linux 5.14 and later).
func PagesOnDemand() bool { return onDemand() }

// create makes a segment of header hdr, reserving its first reserve bytes
// (all of it when reserve is zero), and returns its fd too with keepFD. With
// uninit the caller writes all the data, which may then start out as old
// data of this process rather than zeros.
func create(name string, hdr header.Header, reserve uint64, uninit, keepFD bool) (*Segment, int, error) {
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
	retried := false
	for {
		full := RandomName()
		if !random {
			if full, err = FullName(name); err != nil {
				return nil, -1, err
			}
		}
		var seg *Segment
		var fd int
		sp := spareFor(hdr, reserve, t)
		if sp != nil {
			seg, fd, err = sp.reuse(full, hdr, t, uninit, keepFD)
		} else {
			seg, fd, err = createFile(full, hdr, reserve, t, uninit, keepFD)
		}
		switch {
		case sp != nil && errors.Is(err, unix.ENOENT):
			continue // the spare was removed (zctipc gc by hand): another, or a new file
		case random && errors.Is(err, unix.EEXIST):
			continue // 128 random bits collided with an existing name
		case errors.Is(err, ErrOutOfSharedMemory) && !retried && DropSpares() > 0:
			retried = true // the spares' pages are free now
			continue
		}
		return seg, fd, err
	}
}

// spareFor takes a spare file for a new segment of header hdr, when it is a
// large tensor or table with all its pages reserved, made with a tracker.
func spareFor(hdr header.Header, reserve uint64, t Tracker) *spare {
	size := hdr.SegmentSize()
	if t == nil || reserve < size || size < spareFrom || hdr.Kind != header.KindTensor && hdr.Kind != header.KindTable {
		return nil
	}
	return takeSpare(size)
}

// closeUnlessKept closes *fd unless keep, when err is nil.
func closeUnlessKept(fd *int, keep bool, err *error) {
	if *err != nil || !keep {
		unix.Close(*fd)
		*fd = -1
	}
}

// createFile makes file segment name: a temporary file, reserved, mapped and
// written, then renamed, or with unpublished left for Publish to rename.
func createFile(name string, hdr header.Header, reserve uint64, t Tracker, unpublished, keepFD bool) (seg *Segment, fd int, err error) {
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
	pending, err := publishUnless(unpublished, tmpPath, path, name, t, entry)
	if err != nil {
		return nil, fd, err
	}
	stall(hdr.Kind, "create-rename")
	seg = newFile(fileKey{st.Dev, st.Ino}, name, path, hdr, mem, t, entry)
	seg.f.reserved = reserve >= hdr.SegmentSize()
	seg.f.pending = pending
	return seg, fd, nil
}

// publishUnless renames the new file at tmpPath to path, the name of segment
// name, and records it as made, unless unpublished: it then returns tmpPath,
// where the file waits for Publish.
func publishUnless(unpublished bool, tmpPath, path, name string, t Tracker, entry int) (string, error) {
	if unpublished {
		return tmpPath, nil
	}
	if err := rename(tmpPath, path); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return "", fmt.Errorf("segment %q already exists: %w", name, err)
		}
		return "", fmt.Errorf("create segment %q in %s: %w", name, Dir(), err)
	}
	if t != nil {
		t.Created(entry)
	}
	return "", nil
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
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, fmt.Errorf("size segment %q: %w", name, err)
	}
	mem, err := reserveMapped(fd, name, hdr.Kind, size, reserve)
	if err != nil {
		return nil, err
	}
	hdr.CreatedNS = time.Now().UnixNano()
	hdr.Encode(mem)
	return mem, nil
}

// hugeFrom is the size from which a segment asks for huge pages.
const hugeFrom = 2 << 20

// reserveMapped reserves the first reserve bytes of the new file behind fd,
// already size bytes long, and maps all of it. The creator writes the data,
// so its page tables are filled at once when every page is reserved, rather
// than one fault per page. A large segment reserves its pages through a mapping
// advised to use huge pages (MADV_HUGEPAGE, then MADV_POPULATE_WRITE): a
// file system that allows them when asked (tmpfs huge=advise, memfd with
// shmem_enabled advise) then fills it with 2 MiB pages, one fault and one
// zeroing each, which makes a new large segment several times cheaper;
// reserving with fallocate would take small pages there.
func reserveMapped(fd int, name string, kind header.Kind, size, reserve uint64) ([]byte, error) {
	if reserve >= size && size >= hugeFrom && PagesOnDemand() {
		var st unix.Statfs_t
		if err := unix.Fstatfs(fd, &st); err == nil && st.Blocks > 0 && size/uint64(st.Bsize) > st.Bavail {
			return nil, outOfMemory(name, size, unix.ENOSPC) // it cannot fit: say so before mapping it
		}
		mem, err := mmapFlags(fd, size, true, 0)
		if err != nil {
			return nil, fmt.Errorf("map segment %q: %w", name, err)
		}
		start, end := pageSpan(mem, false)
		_ = madvise(start, end-start, unix.MADV_HUGEPAGE) // EINVAL without transparent huge pages
		if err = madvise(start, end-start, unix.MADV_POPULATE_WRITE); err != nil {
			return nil, errors.Join(outOfMemoryIf(name, size, err), unix.Munmap(mem))
		}
		stall(kind, "create-reserve")
		return mem, nil
	}
	if err := reserveRange(fd, name, 0, min(reserve, size)); err != nil {
		return nil, err
	}
	stall(kind, "create-reserve")
	mem, err := mmapFlags(fd, size, true, populateIf(reserve >= size))
	if err != nil {
		return nil, fmt.Errorf("map segment %q: %w", name, err)
	}
	return mem, nil
}

// outOfMemoryIf says that populating pages failed for want of memory (a
// full file system faults, which MADV_POPULATE_WRITE reports as EFAULT).
func outOfMemoryIf(name string, n uint64, err error) error {
	if errors.Is(err, unix.EFAULT) { // the fault that touching the page would take
		return outOfMemory(name, n, unix.ENOSPC)
	}
	if errors.Is(err, unix.ENOMEM) {
		return outOfMemory(name, n, err)
	}
	return fmt.Errorf("reserve %d bytes for segment %q: %w", n, name, err)
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
		free = FormatBytes(fs.Bavail * uint64(fs.Bsize))
		total = FormatBytes(fs.Blocks * uint64(fs.Bsize))
	}
	return fmt.Errorf("%w: segment %q needs %s (%d bytes) but %s has %s free of %s; "+
		"give a container more with docker run --shm-size=<size>, or grow the mount with "+
		"mount -o remount,size=<size> %s: %w",
		ErrOutOfSharedMemory, name, FormatBytes(size), size, dir, free, total, dir, cause)
}

// FormatBytes returns n bytes as people read them: "512 B", "64.0 KiB",
// "1.5 GiB".
func FormatBytes(n uint64) string {
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
