// Spare files: the pages of a large segment this process let go, kept for
// the next segment it makes.

package shm

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/header"
	"golang.org/x/sys/unix"
)

// Note on spare files.
//
// A new segment's pages cost more than the data written into them: tmpfs
// allocates and zeroes every 4 KiB page, and the first touch of each takes
// a fault (a 1 GiB segment takes about 0.8 s to make here, and a copy of
// 1 GiB about 0.05 s). So when the last count on a large tensor or table
// segment that this process made is given up here, with the last handle
// on it, the file is not unlinked but renamed to a temporary name that no
// process attaches, and kept with its mapping for spareTTL: the next
// tensor or table segment this process makes takes it, cut to size, and
// writes into pages already there and already mapped. The ledger records a
// spare as a file being made (shm.Tracker.Creating), so the cleanup daemon
// removes it if the process dies; it holds no count. ZCTIPC_MAP_CACHE=0
// turns spares off along with the mapping cache; a segment that cannot be
// made for want of memory drops the spares and tries again.

// Threat model: a spare is a file of this user's, under a temporary name in
// the segment directory, so any process of the user may truncate, grow,
// chmod, link, punch holes in, rename or remove it. Only its maker reuses
// it, and only when it is still the file (inode), name, size, mode, single
// link and full set of pages it left (intact); anything else is dropped, the new
// segment made from a fresh file (never refused as corrupt, never a
// SIGBUS: writes into it run under fault.Catch), and the file removed
// wherever in the directory it was renamed to (RemoveInode), by its maker
// or, when the maker died, by the sweeper of its ledger.

const (
	spareFrom = 1 << 20     // the smallest segment kept as a spare
	spareTTL  = time.Second // how long a spare waits for a new segment
	maxSpares = 2           // spares kept at once; a new one pushes out the oldest
)

// spare is a file kept for reuse, under a temporary name, mapped read-write.
type spare struct {
	fd      int
	key     fileKey
	tmp     string // its name in Dir()
	mem     []byte // its read-write mapping, as mapped (the file may have been cut shorter since)
	size    uint64 // the file's size
	tracker Tracker
	entry   int // its Creating record, or NoEntry
	since   time.Time
}

// spareable reports whether f, whose last handle is being closed, may become
// a spare when its count goes: a tensor or table this process made with all
// its pages reserved, large enough, with its name in a file system, and
// tracked (so that a crash leaves nothing). The caller holds registry.mu.
func (f *file) spareable() bool {
	kind := f.hdr.Kind
	return f.reserved && f.rw != nil && f.path != "" && f.pending == "" && f.tracker != nil && mapCache.Load() &&
		(kind == header.KindTensor || kind == header.KindTable) && finalizers[kind] == nil &&
		f.hdr.SegmentSize() >= spareFrom
}

// keepSpare turns f, whose count just reached zero and which has no handle
// left, into a spare: it reports false, having changed nothing, when that
// cannot be done (the caller then removes f). The caller holds registry.mu.
func keepSpare(f *file) bool {
	t := currentTracker()
	if t == nil {
		return false
	}
	fd, err := unix.Open(f.path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || (fileKey{st.Dev, st.Ino}) != f.key || uint64(st.Size) != f.hdr.SegmentSize() {
		unix.Close(fd)
		return false
	}
	tmp := randomName(TmpPrefix)
	tmpPath := Dir() + "/" + tmp
	entry := t.Creating(tmp, f.name)
	t.Opened(entry, f.key.dev, f.key.ino)
	if rename(f.path, tmpPath) != nil {
		t.Dropped(entry)
		unix.Close(fd)
		return false
	}
	if unix.Lstat(tmpPath, &st) != nil || (fileKey{st.Dev, st.Ino}) != f.key {
		// Another file took the name between the check and the rename: it
		// goes back.
		_ = rename(tmpPath, f.path)
		t.Dropped(entry)
		unix.Close(fd)
		return false
	}
	sp := &spare{fd: fd, key: f.key, tmp: tmp, mem: f.rw, size: uint64(st.Size), tracker: t, entry: entry, since: time.Now()}
	f.rw = nil
	if err := forget(f); err != nil {
		fmt.Fprintln(os.Stderr, "zctipc:", err)
	}
	registry.spares = append(registry.spares, sp)
	for len(registry.spares) > maxSpares {
		registry.spares[0].drop()
		registry.spares = registry.spares[1:]
	}
	startSweeper()
	return true
}

// takeSpare removes from the spares and returns the smallest one that holds
// size bytes, or nil.
func takeSpare(size uint64) *spare {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	best := -1
	for i, sp := range registry.spares {
		if sp.size >= size && (best < 0 || sp.size < registry.spares[best].size) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	sp := registry.spares[best]
	registry.spares = append(registry.spares[:best], registry.spares[best+1:]...)
	return sp
}

// expireSpares drops the spares older than spareTTL, or all of them, and
// returns how many it dropped. The caller holds registry.mu.
func expireSpares(now time.Time, all bool) int {
	kept := registry.spares[:0]
	n := 0
	for _, sp := range registry.spares {
		if all || now.Sub(sp.since) > spareTTL {
			sp.drop()
			n++
		} else {
			kept = append(kept, sp)
		}
	}
	clear(registry.spares[len(kept):])
	registry.spares = kept
	return n
}

// DropSpares removes the spare files this process keeps and returns how many
// there were.
func DropSpares() int {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return expireSpares(time.Now(), true)
}

// drop removes the spare's file and unmaps it.
func (sp *spare) drop() {
	if err := sp.unlink(); err != nil {
		fmt.Fprintln(os.Stderr, "zctipc: remove spare segment file:", err)
	}
	sp.release()
}

// unlink removes the spare's file: under its temporary name, or wherever in
// the segment directory another process renamed it.
func (sp *spare) unlink() error {
	var st unix.Stat_t
	if unix.Lstat(Dir()+"/"+sp.tmp, &st) == nil && (fileKey{st.Dev, st.Ino}) == sp.key {
		return unlinkKey(Dir()+"/"+sp.tmp, sp.key)
	}
	_, err := RemoveInode(sp.key.dev, sp.key.ino)
	return err
}

// intact reports whether the spare's file is still as this process left
// it: under its temporary name and no other (a second name, a hard link,
// would keep the new segment's pages after its own name goes), of the size
// it was given with every page of it there (a hole punched in it would be
// filled by the new segment's writes, which fault when the file system is
// full), and of mode 0600 (attachers refuse any other).
func (sp *spare) intact() bool {
	var st, lst unix.Stat_t
	return unix.Fstat(sp.fd, &st) == nil && (fileKey{st.Dev, st.Ino}) == sp.key && uint64(st.Size) == sp.size &&
		st.Nlink == 1 && st.Mode == unix.S_IFREG|0o600 && uint64(st.Blocks)*512 >= sp.size &&
		unix.Lstat(Dir()+"/"+sp.tmp, &lst) == nil && (fileKey{lst.Dev, lst.Ino}) == sp.key
}

// RemoveInode removes the file of the segment directory that is inode ino
// of device dev, whatever its name now, and reports whether there was one:
// a spare or a half-made segment that another process renamed away still
// goes with its maker.
func RemoveInode(dev, ino uint64) (bool, error) {
	ents, err := os.ReadDir(Dir())
	if err != nil {
		return false, fmt.Errorf("read segment directory %s: %w", Dir(), err)
	}
	key := fileKey{dev, ino}
	for _, e := range ents {
		var st unix.Stat_t
		path := Dir() + "/" + e.Name()
		if unix.Lstat(path, &st) != nil || (fileKey{st.Dev, st.Ino}) != key || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if err := unlinkKey(path, key); err != nil {
			return false, err
		}
		return true, nil
	}
	return false, nil
}

// release unmaps the spare, closes its file and forgets its record.
func (sp *spare) release() {
	if err := unix.Munmap(sp.mem); err != nil {
		fmt.Fprintln(os.Stderr, "zctipc: unmap spare segment file:", err)
	}
	unix.Close(sp.fd)
	sp.tracker.Dropped(sp.entry)
}

// unlinkKey removes path if it is still the file key.
func unlinkKey(path string, key fileKey) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil || (fileKey{st.Dev, st.Ino}) != key {
		return nil
	}
	if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// reuse makes segment name of header hdr from the spare, in place of a new
// file: cut to size, its header written, its data zeroed and the file
// renamed to name, or with uninit left unzeroed under its temporary name
// for Publish (Note [a name appears with its contents]). It returns the
// spare's fd with keepFD. On an error the spare is removed.
func (sp *spare) reuse(name string, hdr header.Header, t Tracker, uninit, keepFD bool) (seg *Segment, fd int, err error) {
	entry := t.Creating(sp.tmp, name)
	t.Opened(entry, sp.key.dev, sp.key.ino)
	sp.tracker.Dropped(sp.entry)
	sp.tracker, sp.entry = t, entry
	tmpPath := Dir() + "/" + sp.tmp
	defer func() {
		if err != nil {
			err = errors.Join(err, sp.unlink())
			sp.release()
		}
	}()
	if !sp.intact() {
		// Another process of the user truncated or renamed it: its pages
		// are no longer all there, and it is not reused (the caller makes
		// a fresh file).
		return nil, -1, fmt.Errorf("spare segment file %q was changed by another process: %w", sp.tmp, unix.ENOENT)
	}
	size := hdr.SegmentSize()
	mem := sp.mem
	if size < sp.size {
		if err = unix.Ftruncate(sp.fd, int64(size)); err != nil {
			return nil, -1, fmt.Errorf("size segment %q: %w", name, err)
		}
		sp.size = size
		// The mapping keeps its length: the pages past the new end are
		// gone from the file, and nothing reads past the data the header
		// describes. Unmapping the tail instead would leave a mapping
		// that no longer matches what unix.Munmap is later given, which
		// would then unmap whatever the address space put there since.
	}
	err = fault.Catch(func() error {
		clear(mem[:hdr.DataOffset])
		if !uninit {
			clear(mem[hdr.DataOffset:size])
		}
		hdr.CreatedNS = time.Now().UnixNano()
		hdr.Refcount = 0
		hdr.Encode(mem)
		// The count goes in last, atomically: a process that read the
		// header of the segment this file was, and adds to the count only
		// once it is above zero, then sees the new creation time
		// (file.hold).
		hdr.Refcount = 1
		atomic.StoreInt64((*int64)(unsafe.Pointer(&mem[header.RefcountOffset])), 1)
		return nil
	})
	if err != nil {
		// Truncated by another process meanwhile: a fresh file instead.
		return nil, -1, fmt.Errorf("spare segment file %q: %w: %w", sp.tmp, err, unix.ENOENT)
	}
	path := Dir() + "/" + name
	pending, err := publishUnless(uninit, tmpPath, path, name, t, entry)
	if err != nil {
		return nil, -1, err
	}
	fd = sp.fd
	if !keepFD {
		unix.Close(fd)
		fd = -1
	}
	seg = newFile(sp.key, name, path, hdr, mem, t, entry)
	seg.f.reserved = true
	seg.f.pending = pending
	return seg, fd, nil
}
