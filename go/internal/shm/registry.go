package shm

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/header"
	"golang.org/x/sys/unix"
)

// Note on the mapping cache.
//
// When a process closes its last handle on a segment it drops its count at
// once, so the segment is unlinked on time, but it may keep the mapping for a
// while. A consumer that is handed the same segment again (a producer reusing
// its buffers, a model's weights sent to every step) then attaches it with
// one lstat and a compare-and-swap: no mmap, no page fault on the header, and
// no munmap, whose teardown of a large mapping costs milliseconds and slows
// what runs next. A cached mapping holds no count. It is unmapped when its
// segment has no holder left (checked every sweepEvery, so the memory of a
// dead segment is not pinned for longer), when it has been idle for cacheTTL,
// or when more than maxCached mappings are idle. ZCTIPC_MAP_CACHE=0 turns the
// cache off.

const (
	cacheTTL   = time.Second
	sweepEvery = 100 * time.Millisecond
	maxCached  = 64
)

// MapCacheEnv names the environment variable that turns the mapping cache off
// when set to "0".
const MapCacheEnv = "ZCTIPC_MAP_CACHE"

var mapCache atomic.Bool

func init() { mapCache.Store(os.Getenv(MapCacheEnv) != "0") }

// SetMapCache turns the mapping cache on or off and returns the previous
// setting. Turning it off unmaps what it holds.
func SetMapCache(on bool) bool {
	was := mapCache.Swap(on)
	if !on {
		registry.mu.Lock()
		evictIdle(time.Now(), true)
		expireSpares(time.Now(), true)
		registry.mu.Unlock()
	}
	return was
}

// fileKey identifies a file independently of its name, which may be unlinked
// and reused.
type fileKey struct{ dev, ino uint64 }

// file is one segment file mapped in this process, shared by all handles.
// Its fields after hdr are guarded by registry.mu.
type file struct {
	key      fileKey
	name     string
	path     string
	hdr      header.Header
	rw       []byte    // read-write mapping of the segment, or nil
	ro       []byte    // read-only mapping of the segment, or nil
	ctl      []byte    // read-write mapping of the fixed header, when rw is nil
	rc       *int64    // the shared refcount, in rw or ctl; set with the first mapping
	handles  int       // open Segments on this file
	counted  bool      // this process holds one count of the segment
	tracker  Tracker   // where that count is recorded, or nil
	entry    int       // its record there, or NoEntry
	idle     time.Time // when the last handle closed, for a cached mapping
	reserved bool      // this process made it with every page reserved
	pending  string    // the temporary path of a segment not yet published, or ""
}

// registry holds every file this process maps, so that each counts once in
// its segment's refcount, and the idle mappings of the cache.
var registry = struct {
	mu       sync.Mutex
	files    map[fileKey]*file
	byName   map[string]*file // the file last mapped under each name
	cached   int              // files with no handle, kept mapped
	spares   []*spare         // files kept for new segments (spare.go)
	sweeping bool             // a sweeper goroutine runs
}{files: map[fileKey]*file{}, byName: map[string]*file{}}

// register adds f to the registry. The caller holds registry.mu.
func register(f *file) {
	registry.files[f.key] = f
	registry.byName[f.name] = f
}

// forget removes f from the registry and unmaps it. The caller holds
// registry.mu.
func forget(f *file) error {
	unregister(f)
	return f.unmap()
}

// unregister takes f out of the registry, where it is still there. The
// caller holds registry.mu.
func unregister(f *file) {
	if registry.files[f.key] == f {
		delete(registry.files, f.key)
	}
	if registry.byName[f.name] == f {
		delete(registry.byName, f.name)
	}
}

// current reports whether the header in f's file is still the one f was
// mapped with: a file made into another segment (a spare reused, spare.go)
// has a new creation time. The caller holds registry.mu.
func (f *file) current() bool {
	m := f.rw
	if m == nil {
		m = f.ctl
	}
	if m == nil {
		m = f.ro
	}
	return m == nil || atomic.LoadInt64((*int64)(unsafe.Pointer(&m[header.CreatedOffset]))) == f.hdr.CreatedNS
}

// retire takes f, whose file became another segment, out of the registry:
// a cached mapping is unmapped; one that handles still use stays until they
// close. The caller holds registry.mu.
func (f *file) retire() {
	unregister(f)
	if f.handles == 0 && !f.idle.IsZero() {
		registry.cached--
		f.idle = time.Time{}
		if err := f.unmap(); err != nil {
			fmt.Fprintln(os.Stderr, "zctipc:", err)
		}
	}
}

// hold opens one more handle on f, counting this process as a holder first
// if it is not one. With adopt, the caller brings a count of its own, which
// becomes this process's, or is dropped when the process already has one.
// The caller holds registry.mu.
func (f *file) hold(adopt bool) error {
	switch {
	case adopt && f.counted:
		if _, err := f.dropRef(); err != nil {
			return err
		}
	case adopt:
		f.count()
	case !f.counted:
		if _, err := f.addRef(); err != nil {
			return err
		}
		if !f.current() {
			// The count reached zero and the file became another segment
			// (a spare reused, spare.go) after this process read its
			// header: the count just added is that segment's, and goes
			// back.
			return errors.Join(fmt.Errorf("segment %q was removed: %w", f.name, unix.ENOENT), f.dropOthers())
		}
		f.count()
	}
	if f.handles == 0 && !f.idle.IsZero() {
		registry.cached--
		f.idle = time.Time{}
	}
	f.handles++
	return nil
}

// letGo closes one handle on f. The last one drops this process's count and
// then caches the mapping, or unmaps it when the segment has no holder left
// or the cache is off. The caller holds registry.mu.
func (f *file) letGo() error {
	if f.handles--; f.handles > 0 {
		return nil
	}
	var err error
	kept := false
	if f.counted {
		spare := f.spareable() // before unrecord forgets the tracker
		f.unrecord()
		// The count lies in the file, which another process may have shrunk
		// under its holders: the fault says so, and the mapping goes all the
		// same (what it held is lost for all of them).
		err = fault.Catch(func() error {
			n, err := f.decrement()
			if n == 0 {
				if kept = spare && keepSpare(f); !kept {
					err = f.remove()
				}
			}
			return err
		})
		if kept {
			return nil
		}
		if errors.Is(err, fault.ErrFault) {
			return errors.Join(fmt.Errorf("segment %q: %w", f.name, err), forget(f))
		}
	}
	if n, ferr := fault.LoadInt64(f.rc); !mapCache.Load() || ferr != nil || n <= 0 || registry.files[f.key] != f {
		return errors.Join(err, forget(f))
	}
	f.idle = time.Now()
	registry.cached++
	if registry.cached > maxCached {
		err = errors.Join(err, evictOldest())
	}
	startSweeper()
	return err
}

// startSweeper starts the sweeper unless it runs. The caller holds
// registry.mu.
func startSweeper() {
	if !registry.sweeping {
		registry.sweeping = true
		go sweep()
	}
}

// sweep unmaps cached mappings whose segment died or that idled too long,
// and removes spares that waited too long; it ends when the cache and the
// spares are empty, and runs only while there is something in them.
func sweep() {
	for {
		time.Sleep(sweepEvery)
		registry.mu.Lock()
		now := time.Now()
		evictIdle(now, false)
		expireSpares(now, false)
		done := registry.cached == 0 && len(registry.spares) == 0
		if done {
			registry.sweeping = false
		}
		registry.mu.Unlock()
		if done {
			return
		}
	}
}

// evictIdle unmaps the cached files whose segment has no holder left, that
// idled past cacheTTL, or all of them. The caller holds registry.mu.
func evictIdle(now time.Time, all bool) {
	for _, f := range registry.files {
		if f.handles != 0 {
			continue
		}
		if n, err := fault.LoadInt64(f.rc); all || err != nil || n <= 0 || now.Sub(f.idle) > cacheTTL {
			registry.cached--
			if err := forget(f); err != nil {
				// munmap fails only for a bad range, which these are not.
				fmt.Fprintln(os.Stderr, "zctipc:", err)
			}
		}
	}
}

// evictOldest unmaps the cached file that idled longest. The caller holds
// registry.mu.
func evictOldest() error {
	var oldest *file
	for _, f := range registry.files {
		if f.handles == 0 && (oldest == nil || f.idle.Before(oldest.idle)) {
			oldest = f
		}
	}
	if oldest == nil {
		return nil
	}
	registry.cached--
	return forget(oldest)
}

// mapFor makes sure f has the mapping a handle with readOnly needs. The caller
// holds registry.mu or owns f alone.
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

// hasMapping reports whether f has the mapping a handle with readOnly needs.
func (f *file) hasMapping(readOnly bool) bool {
	if readOnly {
		return f.ro != nil
	}
	return f.rw != nil
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
	return mmapFlags(fd, size, writable, 0)
}

// populateIf returns MAP_POPULATE when cond holds.
func populateIf(cond bool) int {
	if cond {
		return unix.MAP_POPULATE
	}
	return 0
}

func mmapFlags(fd int, size uint64, writable bool, flags int) ([]byte, error) {
	if size > math.MaxInt {
		return nil, unix.EFBIG
	}
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE
	}
	return unix.Mmap(fd, 0, int(size), prot, unix.MAP_SHARED|flags)
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
	// f.rc is left dangling rather than cleared: a release racing to its
	// last atomic op may still read the field (the count says when the
	// memory may go, and the race detector cannot see atomics on it).
	return errors.Join(errs...)
}

// count makes this process a holder of f, with the count it just took,
// and records that count with the tracker. The caller holds registry.mu.
func (f *file) count() {
	f.counted = true
	f.tracker, f.entry = nil, NoEntry
	if t := currentTracker(); t != nil && f.hdr.Kind != header.KindLedger {
		f.tracker, f.entry = t, t.Holding(f.name)
	}
}

// uncount gives up this process's count on f, clearing the tracker's record
// of it first. The caller holds registry.mu.
func (f *file) uncount() (int64, error) {
	f.unrecord()
	return f.dropRef()
}

// unrecord marks this process as no longer a holder of f and clears the
// tracker's record of its count, before the count is given up. The caller
// holds registry.mu.
func (f *file) unrecord() {
	f.counted = false
	if f.tracker != nil && f.entry != NoEntry {
		f.tracker.Dropped(f.entry)
	}
	f.tracker, f.entry = nil, NoEntry
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
	n, err := f.decrement()
	if n == 0 {
		return 0, f.remove()
	}
	return n, err
}

// dropOthers gives back a count that this process added to f's file after
// the file became another segment (a spare reused, spare.go), whose name
// this process does not know: its creator may have let it go meanwhile, and
// when this count was its last, the file is removed under whatever name it
// has (its own, or the temporary one of a segment never published), or it
// would stay in the directory with no holder. A reused file is a tensor or
// table, which have no finalizer. The caller holds registry.mu.
//
// Threat model: only this process's own count is given back, once. The
// file is removed only when that count was the last, so no holder loses
// it; RemoveInode removes only a regular file of the segment directory with
// that device and inode, whatever another process of the user named it.
func (f *file) dropOthers() error {
	n, err := f.decrement()
	if n == 0 && f.path != "" {
		_, rerr := RemoveInode(f.key.dev, f.key.ino)
		err = errors.Join(err, rerr)
	}
	return err
}

// decrement takes one from the shared count and returns what is left.
func (f *file) decrement() (int64, error) {
	n := atomic.AddInt64(f.rc, -1)
	if n < 0 {
		return n, fmt.Errorf("segment %q: refcount fell to %d: %w", f.name, n, header.ErrCorrupt)
	}
	return n, nil
}

// remove runs the finalizer of f's kind on its data, then removes its name:
// its count reached zero. It may run under registry.mu, so a finalizer must
// not take it.
func (f *file) remove() error {
	var err error
	if fn := finalizers[f.hdr.Kind]; fn != nil {
		err = fn(f.region(f.rw == nil))
	}
	return errors.Join(err, f.unlinkIfSame())
}

// unlinkIfSame removes the file's name unless it was already removed or now
// names a different file. A memfd has no name: the broker lets it go.
func (f *file) unlinkIfSame() error {
	if f.path == "" {
		if b, err := currentBroker(); err == nil {
			b.Drop(f.name)
		}
		return nil
	}
	path := f.path
	if f.pending != "" {
		path = f.pending // never published: its name was never its own
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("stat segment %q: %w", f.name, err)
	}
	if (fileKey{st.Dev, st.Ino}) != f.key {
		return nil
	}
	if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unlink segment %q: %w", f.name, err)
	}
	return nil
}
