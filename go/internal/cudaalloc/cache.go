// Package cudaalloc is a caching allocator of shareable CUDA memory: every
// block it hands out lies in a VMM allocation (cuMemCreate with POSIX
// file-descriptor handles, package cuda) that another process can map by
// name, and blocks freed are kept for the next request of their kind, so a
// steady-state allocation makes no driver call.
//
// It is what torch's CUDAPluggableAllocator calls through libzctipc.so
// (zct_torch_alloc and zct_torch_free): from then on every torch CUDA tensor
// can be sent to another process by file descriptor.
//
// Blocks come in two kinds:
//
//   - small (up to SmallLimit bytes): rounded up to a power of two of at
//     least MinBlock, and carved out of slabs, each one allocation of at
//     least SlabSize bytes holding blocks of one size;
//   - large: rounded up to the device's granularity, one allocation each.
//
// A freed block is reused only for a request on the same device and stream,
// so work queued on one stream never overlaps work on another in the same
// memory (torch's caching allocator keeps the same rule). Cached memory goes
// back to the driver on Trim, or when the driver runs out of memory: then
// the request is tried once more.
package cudaalloc

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"sync"

	"github.com/zctipc/zctipc/go/internal/cuda"
	"golang.org/x/sys/unix"
)

const (
	// MinBlock is the smallest block, and the alignment of every block.
	MinBlock = 512
	// SmallLimit is the largest request served from a slab.
	SmallLimit = 1 << 20
	// SlabSize is the least size of a slab (rounded up to the granularity).
	SlabSize = 2 << 20
	// MaxRequest is the largest request (256 TiB): rounding it up to any
	// granularity cannot overflow.
	MaxRequest = 1 << 48
)

// ErrNotOurs means an address is not a block of this cache.
var ErrNotOurs = fmt.Errorf("not memory of zctipc's CUDA allocator: %w", unix.ENOENT)

// Stats says what a Cache holds.
type Stats struct {
	Segments  int    // allocations held (in use or cached)
	Reserved  uint64 // bytes of those allocations
	InUse     uint64 // bytes of blocks handed out
	Blocks    int    // blocks handed out
	Creates   uint64 // driver allocations made, ever
	Hits      uint64 // requests served without the driver, ever
	Trimmed   uint64 // allocations given back to the driver, ever
	Requested uint64 // requests, ever
}

// segment is one VMM allocation: a slab of equal blocks or one large block.
type segment struct {
	alloc  *cuda.Allocation
	stream uint64
	block  uint64   // the size of its blocks
	free   []uint64 // offsets of its free blocks
	used   int      // blocks handed out
	name   string   // its share name, once shared
}

func (s *segment) end() uint64 { return s.alloc.Ptr + s.alloc.Size }

// key says which requests a cached block may serve.
type key struct {
	device int
	stream uint64
	block  uint64
}

// Cache is a caching allocator; it is safe for concurrent use.
type Cache struct {
	mu          sync.Mutex
	segs        []*segment // by address
	avail       map[key][]*segment
	live        map[uint64]*segment // the address of each block handed out
	granularity map[int]uint64
	stats       Stats
}

// New returns an empty Cache.
func New() *Cache {
	return &Cache{avail: map[key][]*segment{}, live: map[uint64]*segment{}, granularity: map[int]uint64{}}
}

// blockSize is the size of the block that serves a request of size bytes.
func (c *Cache) blockSize(device int, size uint64) (uint64, error) {
	if size <= SmallLimit {
		return max(MinBlock, uint64(1)<<bits.Len64(size-1)), nil
	}
	g, err := c.granule(device)
	if err != nil {
		return 0, err
	}
	return (size + g - 1) / g * g, nil
}

func (c *Cache) granule(device int) (uint64, error) {
	if g, ok := c.granularity[device]; ok {
		return g, nil
	}
	g, err := cuda.Granularity(device)
	if err != nil {
		return 0, err
	}
	c.granularity[device] = g
	return g, nil
}

// Alloc returns the address of a block of at least size bytes on device,
// for work on stream (0: the legacy default stream). A request of 0 bytes
// gets address 0.
func (c *Cache) Alloc(device int, size, stream uint64) (uint64, error) {
	if device < 0 {
		return 0, fmt.Errorf("CUDA device %d: %w", device, unix.EINVAL)
	}
	if size == 0 {
		return 0, nil
	}
	if size > MaxRequest {
		return 0, fmt.Errorf("an allocation of %d bytes, more than %d: %w", size, uint64(MaxRequest), unix.EINVAL)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Requested++
	block, err := c.blockSize(device, size)
	if err != nil {
		return 0, err
	}
	k := key{device, stream, block}
	if segs := c.avail[k]; len(segs) > 0 {
		c.stats.Hits++
		return c.take(k, segs[len(segs)-1]), nil
	}
	s, err := c.create(device, block, stream)
	if errors.Is(err, cuda.ErrOutOfMemory) && c.trim(device) > 0 {
		s, err = c.create(device, block, stream)
	}
	if err != nil {
		return 0, err
	}
	return c.take(k, s), nil
}

// create makes a segment for blocks of block bytes and lists it as
// available. The caller holds c.mu.
func (c *Cache) create(device int, block, stream uint64) (*segment, error) {
	size := block
	if block <= SmallLimit {
		size = SlabSize
	}
	a, err := cuda.Alloc(device, size)
	if err != nil {
		return nil, err
	}
	c.stats.Creates++
	s := &segment{alloc: a, stream: stream, block: block}
	for off := a.Size / block * block; off > 0; off -= block {
		s.free = append(s.free, off-block) // the lowest offset is handed out first
	}
	i := sort.Search(len(c.segs), func(i int) bool { return c.segs[i].alloc.Ptr > a.Ptr })
	c.segs = append(c.segs, nil)
	copy(c.segs[i+1:], c.segs[i:])
	c.segs[i] = s
	k := key{device, stream, block}
	c.avail[k] = append(c.avail[k], s)
	return s, nil
}

// take hands out a free block of s, listed as available under k. The caller
// holds c.mu.
func (c *Cache) take(k key, s *segment) uint64 {
	off := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.used++
	if len(s.free) == 0 {
		segs := c.avail[k]
		for i, x := range segs {
			if x == s {
				c.avail[k] = append(segs[:i], segs[i+1:]...)
				break
			}
		}
	}
	ptr := s.alloc.Ptr + off
	c.live[ptr] = s
	c.stats.Blocks++
	c.stats.InUse += s.block
	return ptr
}

// Free gives back the block at ptr, to be reused by requests on the stream
// it was allocated for.
func (c *Cache) Free(ptr uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.live[ptr]
	if !ok {
		return fmt.Errorf("free of %#x: %w", ptr, ErrNotOurs)
	}
	delete(c.live, ptr)
	c.stats.Blocks--
	c.stats.InUse -= s.block
	s.used--
	s.free = append(s.free, ptr-s.alloc.Ptr)
	if len(s.free) == 1 {
		k := key{s.alloc.Device, s.stream, s.block}
		c.avail[k] = append(c.avail[k], s)
	}
	return nil
}

// Trim gives every cached allocation that holds no block in use back to the
// driver (device < 0: of every device) and returns how many it gave back.
// Processes that mapped one keep their mapping: the memory goes when the
// last of them unmaps it.
func (c *Cache) Trim(device int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.trim(device)
}

// trim is Trim; the caller holds c.mu. A block is cached as soon as its
// user frees it, while kernels queued before may still use it, and unmapping
// does not wait for them: so each device whose allocations go is
// synchronized first. A failure to free is not fatal to a cache: the
// allocation is dropped from it either way, since its handle can no longer
// be trusted.
func (c *Cache) trim(device int) int {
	idle := func(s *segment) bool { return s.used == 0 && (device < 0 || s.alloc.Device == device) }
	synced := map[int]bool{}
	for _, s := range c.segs {
		if d := s.alloc.Device; idle(s) && !synced[d] {
			synced[d] = true
			_ = cuda.Synchronize(d)
		}
	}
	kept := c.segs[:0]
	for _, s := range c.segs {
		if !idle(s) {
			kept = append(kept, s)
			continue
		}
		if s.name != "" {
			cuda.Unshare(s.name)
		}
		_ = s.alloc.Free()
		c.stats.Trimmed++
	}
	n := len(c.segs) - len(kept)
	clear(c.segs[len(kept):])
	c.segs = kept
	for k, segs := range c.avail {
		if segs = slices.DeleteFunc(segs, idle); len(segs) == 0 {
			delete(c.avail, k)
		} else {
			c.avail[k] = segs
		}
	}
	return n
}

// Shared is where a block lies, for another process: the share name of the
// allocation that holds it (cuda.ImportShared maps it) and the address's
// offset in it.
type Shared struct {
	Name   string
	Offset uint64
	Size   uint64 // of the allocation
	Device int
}

// Share makes the allocation that holds address ptr (any address inside a
// block in use) fetchable by other processes of this user, and says where
// ptr lies in it.
func (c *Cache) Share(ptr uint64) (Shared, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.segs), func(i int) bool { return c.segs[i].end() > ptr })
	if i == len(c.segs) || ptr < c.segs[i].alloc.Ptr || c.segs[i].used == 0 {
		return Shared{}, fmt.Errorf("%#x: %w", ptr, ErrNotOurs)
	}
	s := c.segs[i]
	if s.name == "" {
		name, err := s.alloc.Share()
		if err != nil { // not ErrNotOurs, whatever its errno
			return Shared{}, fmt.Errorf("share the allocation that holds %#x: %v: %w", ptr, err, unix.EIO)
		}
		s.name = name
	}
	return Shared{Name: s.name, Offset: ptr - s.alloc.Ptr, Size: s.alloc.Size, Device: s.alloc.Device}, nil
}

// Stats returns what the cache holds and has done.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stats
	st.Segments = len(c.segs)
	for _, s := range c.segs {
		st.Reserved += s.alloc.Size
	}
	return st
}
