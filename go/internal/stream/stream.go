// Package stream is a ring of fixed-size frames in a shared segment, written
// by one writer and read by several readers, each of which sees every frame
// (publish-subscribe), without copies.
//
// Frames are slots of one size laid end to end, so a frame never wraps. The
// writer claims the next frame (Look), fills it in place, and publishes it
// (Increment); a reader looks at the next frame it has not read, in place,
// and releases it. Positions count frames from the start of the stream and
// never wrap. A slot table says which slot each frame in flight lives in:
// under Block the writer takes the slot released last, which is likely
// still in cache, so a ring deeper than the frames in flight costs no cache
// misses; under Overwrite frame p lives in slot p mod frames.
//
// # Backpressure
//
// Under Block the writer never claims a slot that a live reader has not
// released: it waits for the slowest reader. It keeps the minimum reader
// position it last read and refreshes it only when that minimum says the
// ring is full; positions only grow, so a stale minimum can make the writer
// refresh early but never over-reports free space. Under Overwrite the
// writer never waits: a reader that fell more than a ring behind skips to
// the oldest frame still whole and counts the frames it lost as dropped.
//
// A reader whose process died (pid and start time), or, with a reader
// timeout, that held the writer back for that long without being seen
// (Note [waiting is alive] in writer.go), stops holding the writer back:
// the writer takes its slot away when it finds itself waiting on it.
// An evicted reader that comes back rejoins, counting what it missed as
// dropped.
//
// # Whole frames
//
// The writer stores its claim before it hands out a slot and publishes a
// frame only on Increment, so a writer killed mid-frame publishes nothing.
// A reader checks, when it releases a frame, that the writer has not
// claimed that frame's slot again since; if it has (Overwrite, or an
// evicted reader) Increment reports the frame as not intact and counts it as
// dropped. (On amd64, stores are seen in order and loads are not reordered
// with loads, which this check relies on.)
package stream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/guard"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// Policy says what the writer does when the ring is full.
type Policy uint32

// Policies.
const (
	Block     Policy = 0 // wait for the slowest live reader
	Overwrite Policy = 1 // never wait; slow readers skip frames and count them
)

func (p Policy) String() string {
	switch p {
	case Block:
		return "block"
	case Overwrite:
		return "overwrite"
	}
	return fmt.Sprintf("policy(%d)", uint32(p))
}

// Limits.
const (
	MaxFrames  = 1 << 20
	MaxReaders = 64
	// MaxBytes bounds a stream's data region.
	MaxBytes = 1 << 40
)

// Errors of stream operations.
var (
	ErrFull  = errors.New("the stream's ring is full")
	ErrEmpty = errors.New("no frame to read yet")
	// ErrEnded means the stream was ended: a writer can write no more, and a
	// reader has read every frame.
	ErrEnded = fmt.Errorf("the stream has ended: %w", unix.EPIPE)
	// ErrInterrupted means a signal arrived while waiting.
	ErrInterrupted = futex.ErrInterrupted
	// ErrNoFrame means Increment was called with no frame looked at.
	ErrNoFrame = fmt.Errorf("no frame to increment past: call look first: %w", unix.EINVAL)
	// ErrClosed means the reader or writer was closed.
	ErrClosed = fmt.Errorf("the stream handle is closed: %w", shm.ErrClosed)
)

// Layout of a stream segment's data region (docs/format.md).
const (
	offFrameBytes  = 0                        // u64 bytes of one frame
	offStride      = 8                        // u64 bytes from one slot to the next
	offFrames      = 16                       // u32 slots in the ring
	offReaders     = 20                       // u32 reader slots
	offPolicy      = 24                       // u32
	offDType       = 28                       // u32 element type of a frame
	offNDim        = 32                       // u32 frame dimensions
	offTimeoutMS   = 36                       // u32 reader timeout in ms, 0 for none
	offRingAt      = 40                       // u64 where slot 0 starts
	offVersion     = 48                       // u32 the stream layout version
	offShape       = 64                       // i64 × header.MaxNDim
	offClaim       = plane.StreamClaim        // u64 frames the writer has claimed
	offPublished   = plane.StreamPublished    // u64 frames the writer has published
	offEnded       = plane.StreamEnded        // u32 1 once the stream has ended
	offWriterLock  = 344                      // lock.Size: the writer role
	offDataSeq     = plane.StreamDataSeq      // u32 bumped on every publish and at the end
	offDataWaiters = plane.StreamDataWaiters  // u32
	offSpaceSeq    = plane.StreamSpaceSeq     // u32 bumped when a reader moves past what the writer waits for
	offSpaceWaiter = plane.StreamSpaceWaiters // u32
	offWanted      = plane.StreamWanted       // u64 the position the writer waits for every reader to reach, 0 when it does not wait
	offDropped     = plane.StreamDropped      // u64 frames lost by all readers
	readersAt      = plane.StreamReadersAt
	readerSize     = plane.ReaderSize
)

// LayoutVersion is the stream layout this package writes and reads: version
// 1 keeps a slot table after the reader slots, which says the slot of each
// frame in flight (docs/format.md). Streams of zctipc 0.1.0 say 0 there,
// and kept frame p in slot p mod frames; they are refused.
const LayoutVersion = 1

// ErrLayoutVersion means a stream was laid out by another version.
var ErrLayoutVersion = fmt.Errorf("stream layout: %w", header.ErrVersion)

// Reader slot fields, from the start of the slot.
const (
	rWord     = plane.ReaderWordAt     // u64 pid << 32 | generation << 2 | state
	rPosition = plane.ReaderPositionAt // u64 next frame to read
	rStart    = 16                     // u64 the reader's process start time, written after its claim
	rPID      = 24                     // i64 the pid that start time belongs to
	rSeen     = plane.ReaderSeenAt     // i64 when the reader was last seen, CLOCK_REALTIME ns
	rDropped  = plane.ReaderDroppedAt  // u64 frames this reader lost
	rReceived = plane.ReaderReceivedAt // u64 frames this reader took whole
	rArmed    = plane.ReaderArmedAt    // u32 this reader's sleepers among the data word's
)

// Reader slot states.
const (
	slotFree    = 0
	slotActive  = 1
	slotEvicted = 2
)

const (
	// recheckEvery bounds one sleep: wake-ups lost with killed processes
	// are made up for, and the writer looks at readers that hold it back.
	recheckEvery = 100 * time.Millisecond
	// checkLivenessEvery is how often a waiting writer checks the processes
	// of the readers it waits on.
	checkLivenessEvery = 50 * time.Millisecond
)

// Config describes a stream.
type Config struct {
	DType  dtype.DType
	Shape  []int64 // of one frame
	Frames int     // slots in the ring, at least 2
	// Readers is the number of reader slots, 1 to MaxReaders.
	Readers int
	Policy  Policy
	// ReaderTimeout, when positive, lets a writer evict a reader that held
	// it back for that long without being seen (at millisecond
	// resolution); waiting for frames is being alive.
	ReaderTimeout time.Duration
}

// Stream is a stream segment attached in this process. It is safe for
// concurrent use; its readers and writers keep the memory mapped after the
// Stream is closed.
type Stream struct {
	guard      guard.Guard
	seg        *shm.Segment
	data       []byte
	cfg        Config
	frameBytes uint64
	stride     uint64
	ringAt     uint64
	table      uint64 // where the slot table starts
	// interruptible makes waits return ErrInterrupted on a signal.
	interruptible bool
}

// SetInterruptible says whether a signal during a wait ends the call with
// ErrInterrupted (for a host that must run its handlers) or is waited out.
func (s *Stream) SetInterruptible(on bool) { s.interruptible = on }

// frameLayout returns the bytes of a frame and the slot stride: frames are
// 64-byte aligned, and page-aligned once they are a page or more.
func frameLayout(dt dtype.DType, shape []int64) (uint64, uint64, error) {
	n, ok := header.ByteCount(shape, dt.Size())
	if !ok {
		return 0, 0, fmt.Errorf("a frame of shape %v overflows: %w", shape, unix.EINVAL)
	}
	align := uint64(64)
	if n >= 4096 {
		align = 4096
	}
	if n > MaxBytes {
		return 0, 0, fmt.Errorf("a frame of %d bytes: the limit is %d: %w", n, uint64(MaxBytes), unix.EINVAL)
	}
	return n, max(align, (n+align-1)/align*align), nil
}

// tableAt is where the slot table starts: one u32 per frame of the ring.
func tableAt(readers int) uint64 { return readersAt + uint64(readers)*readerSize }

func ringOffset(readers, frames int) uint64 {
	return (tableAt(readers) + 4*uint64(frames) + 4095) / 4096 * 4096
}

// Create makes a stream segment. An empty name makes a random one.
func Create(name string, cfg Config) (*Stream, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	frameBytes, stride, err := frameLayout(cfg.DType, cfg.Shape)
	if err != nil {
		return nil, err
	}
	ringAt := ringOffset(cfg.Readers, cfg.Frames)
	hi, size := bits.Mul64(stride, uint64(cfg.Frames))
	if hi != 0 || size > MaxBytes-ringAt {
		return nil, fmt.Errorf("a ring of %d frames of %d bytes: the limit is %d bytes: %w",
			cfg.Frames, frameBytes, uint64(MaxBytes), unix.EINVAL)
	}
	seg, err := shm.Create(name, header.KindStream, dtype.Uint8, []int64{int64(ringAt + size)})
	if err != nil {
		return nil, err
	}
	d := seg.Data()
	*u64(d, offFrameBytes) = frameBytes
	*u64(d, offStride) = stride
	*u32(d, offFrames) = uint32(cfg.Frames)
	*u32(d, offReaders) = uint32(cfg.Readers)
	*u32(d, offPolicy) = uint32(cfg.Policy)
	*u32(d, offDType) = uint32(cfg.DType)
	*u32(d, offNDim) = uint32(len(cfg.Shape))
	*u32(d, offTimeoutMS) = uint32(cfg.ReaderTimeout.Milliseconds())
	*u64(d, offRingAt) = ringAt
	*u32(d, offVersion) = LayoutVersion
	for i, n := range cfg.Shape {
		*u64(d, offShape+8*i) = uint64(n)
	}
	for i := range cfg.Frames { // frame p starts in slot p mod frames
		*u32(d, int(tableAt(cfg.Readers))+4*i) = uint32(i)
	}
	s, err := open(seg)
	if err != nil {
		return nil, errors.Join(err, seg.Release())
	}
	return s, nil
}

func (c *Config) check() error {
	switch {
	case c.Frames < 2 || c.Frames > MaxFrames:
		return fmt.Errorf("a stream of %d frames: it takes 2 to %d: %w", c.Frames, MaxFrames, unix.EINVAL)
	case c.Readers < 1 || c.Readers > MaxReaders:
		return fmt.Errorf("a stream for %d readers: it takes 1 to %d: %w", c.Readers, MaxReaders, unix.EINVAL)
	case c.Policy != Block && c.Policy != Overwrite:
		return fmt.Errorf("unknown stream policy %d: %w", uint32(c.Policy), unix.EINVAL)
	case len(c.Shape) > header.MaxNDim:
		return fmt.Errorf("a frame of %d dimensions: the limit is %d: %w", len(c.Shape), header.MaxNDim, unix.EINVAL)
	case c.ReaderTimeout < 0 || c.ReaderTimeout.Milliseconds() > math.MaxUint32:
		return fmt.Errorf("reader timeout %v: it takes 0 (none) to %d ms: %w", c.ReaderTimeout, uint32(math.MaxUint32), unix.EINVAL)
	}
	if err := c.DType.Check(); err != nil {
		return err
	}
	for _, n := range c.Shape {
		if n < 0 {
			return fmt.Errorf("frame shape %v has a negative dimension: %w", c.Shape, unix.EINVAL)
		}
	}
	return nil
}

// Attach attaches the stream segment name.
func Attach(name string) (*Stream, error) {
	seg, err := shm.Attach(name, header.KindStream, false)
	if err != nil {
		return nil, err
	}
	s, err := open(seg)
	if err != nil {
		return nil, errors.Join(err, seg.Close())
	}
	return s, nil
}

// open checks the layout that the creator wrote.
func open(seg *shm.Segment) (*Stream, error) {
	d := seg.Data()
	l, err := layoutOf(d)
	if err != nil {
		return nil, fmt.Errorf("stream %q: %w", seg.Name(), err)
	}
	return &Stream{seg: seg, data: d, cfg: l.cfg, frameBytes: l.frameBytes, stride: l.stride, ringAt: l.ringAt,
		table: tableAt(l.cfg.Readers)}, nil
}

// layout is what a stream's layout words say, checked.
type layout struct {
	cfg                        Config
	frameBytes, stride, ringAt uint64
}

// layoutOf reads the layout words of a stream's data region d, which its
// creator wrote once, and checks them (docs/format.md, "Streams"): the
// configuration, and the frame bytes, slot stride and ring offset it makes,
// which must fill d. Its errors wrap header.ErrCorrupt, or ErrLayoutVersion.
// The dtype word is a u32: a code past 16 bits is none, never its low half.
func layoutOf(d []byte) (layout, error) {
	bad := func(what string) error { return fmt.Errorf("%w: %s", header.ErrCorrupt, what) }
	if len(d) < readersAt {
		return layout{}, bad(fmt.Sprintf("%d bytes", len(d)))
	}
	if v := *u32(d, offVersion); v != LayoutVersion {
		return layout{}, fmt.Errorf("%w %d (this library reads %d)", ErrLayoutVersion, v, LayoutVersion)
	}
	ndim := *u32(d, offNDim)
	if ndim > header.MaxNDim {
		return layout{}, bad(fmt.Sprintf("%d dimensions", ndim))
	}
	dt, err := dtype.FromCode(int64(*u32(d, offDType)))
	if err != nil {
		return layout{}, bad(err.Error())
	}
	cfg := Config{
		DType:         dt,
		Shape:         make([]int64, ndim),
		Frames:        int(*u32(d, offFrames)),
		Readers:       int(*u32(d, offReaders)),
		Policy:        Policy(*u32(d, offPolicy)),
		ReaderTimeout: time.Duration(*u32(d, offTimeoutMS)) * time.Millisecond,
	}
	for i := range cfg.Shape {
		cfg.Shape[i] = int64(*u64(d, offShape+8*i))
	}
	if err := cfg.check(); err != nil {
		return layout{}, bad(err.Error())
	}
	frameBytes, stride, err := frameLayout(cfg.DType, cfg.Shape)
	if err != nil {
		return layout{}, bad(err.Error())
	}
	ringAt := ringOffset(cfg.Readers, cfg.Frames)
	if *u64(d, offFrameBytes) != frameBytes || *u64(d, offStride) != stride || *u64(d, offRingAt) != ringAt ||
		uint64(len(d)) != ringAt+stride*uint64(cfg.Frames) {
		return layout{}, bad(fmt.Sprintf("%d frames of %d bytes do not fill %d bytes", cfg.Frames, frameBytes, len(d)))
	}
	return layout{cfg: cfg, frameBytes: frameBytes, stride: stride, ringAt: ringAt}, nil
}

// slotOf returns the slot that frame p was published in (for a frame in
// flight), checked against the ring.
func (s *Stream) slotOf(p uint64) (int, error) {
	i := atomic.LoadUint32(u32(s.data, int(s.table+4*(p%uint64(s.cfg.Frames)))))
	if int(i) >= s.cfg.Frames {
		return 0, s.pastTheRing(p, i)
	}
	return int(i), nil
}

// pastTheRing is the error of a slot table that puts frame p in slot i,
// past the ring.
func (s *Stream) pastTheRing(p uint64, i uint32) error {
	return fmt.Errorf("stream %q: %w: frame %d in slot %d of %d", s.seg.Name(), header.ErrCorrupt, p, i, s.cfg.Frames)
}

func u32(d []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&d[off])) }
func u64(d []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&d[off])) }

// Segment returns the stream's segment.
func (s *Stream) Segment() *shm.Segment { return s.seg }

// Config returns the stream's configuration.
func (s *Stream) Config() Config { return s.cfg }

// FrameBytes returns the bytes of one frame.
func (s *Stream) FrameBytes() uint64 { return s.frameBytes }

// Frame returns the memory of slot i.
func (s *Stream) Frame(i int) []byte {
	at := s.ringAt + uint64(i)*s.stride
	return s.data[at : at+s.frameBytes : at+s.frameBytes]
}

// FrameOffset returns where slot i starts in the data region.
func (s *Stream) FrameOffset(i int) uint64 { return s.ringAt + uint64(i)*s.stride }

// calls are the calls in flight on a reader or a writer: serialized, and
// waited out by Close (guard).
type calls struct {
	guard  guard.Guard
	mu     sync.Mutex
	policy futex.Policy // how waiting calls wait (SetWait)
	// hold, the busy word of a reader's or a writer's state in C memory,
	// is held by each call too: the C ABI runs their steps on it without
	// this mutex.
	hold *plane.Hold
}

// SetWait says how the endpoint's calls wait, a reader's for frames and a
// writer's for room: by default futex.Sleeping; futex.Policy{Poll: true,
// Spin: -1} polls without sleeping, taking a core while it waits.
func (c *calls) SetWait(p futex.Policy) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	c.policy = p
	return nil
}

// enter starts a call: it fails once the endpoint is closed, and waits for
// the call before it. The caller defers leave.
func (c *calls) enter() error {
	if !c.guard.Enter() {
		return ErrClosed
	}
	c.mu.Lock()
	if c.hold != nil {
		c.hold.Enter()
	}
	return nil
}

func (c *calls) leave() {
	if c.hold != nil {
		c.hold.Leave()
	}
	c.mu.Unlock()
	c.guard.Leave()
}

// wait runs look, a waiting call of the endpoint of s, until ctx is done
// (its cancellation wakes s's waiters) or deadline passes (none when zero);
// a wait that ends so says why ctx ended beside timeoutErr.
func (c *calls) wait(ctx context.Context, s *Stream, deadline time.Time, look func(futex.Until) (int, error),
	timeoutErr error) (int, error) {
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.leave()
	u, stop := s.until(ctx)
	defer stop()
	if !deadline.IsZero() {
		u.Deadline = deadline
	}
	slot, err := look(u)
	if errors.Is(err, timeoutErr) {
		err = futex.Cause(ctx, err)
	}
	return slot, err
}

// Stats are a stream's counts.
type Stats struct {
	Published uint64 // frames published so far
	Dropped   uint64 // frames all readers together lost
	Readers   int    // readers that hold a slot
	Ended     bool
}

// Stats returns the stream's counts (ErrClosed once it is closed).
func (s *Stream) Stats() (Stats, error) {
	if !s.guard.Enter() {
		return Stats{}, ErrClosed
	}
	defer s.guard.Leave()
	st := Stats{
		Published: atomic.LoadUint64(u64(s.data, offPublished)),
		Dropped:   atomic.LoadUint64(u64(s.data, offDropped)),
		Ended:     s.ended(),
	}
	for i := range s.cfg.Readers {
		if state(atomic.LoadUint64(s.slotWord(i))) == slotActive {
			st.Readers++
		}
	}
	return st, nil
}

func (s *Stream) ended() bool { return atomic.LoadUint32(u32(s.data, offEnded)) != 0 }

// End ends the stream: the writer can publish no more, readers read what
// was published and then get ErrEnded, and every waiter wakes.
func (s *Stream) End() error {
	if !s.guard.Enter() {
		return ErrClosed
	}
	defer s.guard.Leave()
	atomic.StoreUint32(u32(s.data, offEnded), 1)
	return errors.Join(s.dataSeq().Signal(math.MaxInt32), s.spaceSeq().Signal(math.MaxInt32))
}

// Close closes this process's handle on the stream; its readers and writers
// go on. Closing twice returns ErrClosed.
func (s *Stream) Close() error {
	if !s.guard.Close(nil) {
		return ErrClosed
	}
	return s.seg.Close()
}

// until returns the wait of ctx, and arranges for its cancellation to wake
// the stream's waiters; stop undoes that.
func (s *Stream) until(ctx context.Context) (futex.Until, func()) {
	return futex.WakeOnDone(ctx, s.wakeAll)
}

// wakeAll wakes every waiter of the stream, in any process: they look
// again (a spurious wake-up to those of other processes).
func (s *Stream) wakeAll() {
	_ = s.dataSeq().Signal(math.MaxInt32) // FUTEX_WAKE on mapped memory does not fail
	_ = s.spaceSeq().Signal(math.MaxInt32)
}

func (s *Stream) dataSeq() futex.Seq {
	return futex.Seq{Word: u32(s.data, offDataSeq), Waiters: u32(s.data, offDataWaiters)}
}

// takeBackSleepers takes the sleepers that the reader of slot counted on
// the data word out of its count, for a reader whose process died (Note
// [a dead party's sleepers] in package futex).
func (s *Stream) takeBackSleepers(slot []byte) {
	futex.TakeBack(u32(s.data, offDataWaiters), u32(slot, rArmed))
}

func (s *Stream) spaceSeq() futex.Seq {
	return futex.Seq{Word: u32(s.data, offSpaceSeq), Waiters: u32(s.data, offSpaceWaiter)}
}

func (s *Stream) sleep(seq futex.Seq, seen uint32, p futex.Policy, u futex.Until, timeoutErr error) error {
	if u.Stopped() {
		return timeoutErr
	}
	err := seq.Sleep(seen, p, u.Deadline, recheckEvery, s.interruptible)
	if errors.Is(err, futex.ErrTimeout) {
		return timeoutErr
	}
	return err
}

func (s *Stream) slot(i int) []byte {
	at := readersAt + i*readerSize
	return s.data[at : at+readerSize]
}

func (s *Stream) slotWord(i int) *uint64 { return u64(s.slot(i), rWord) }

func slotWord(pid int64, gen uint32, st uint32) uint64 {
	return uint64(pid)<<32 | uint64(gen&(1<<30-1))<<2 | uint64(st)
}

func state(w uint64) uint32      { return uint32(w & 3) }
func generation(w uint64) uint32 { return uint32(w>>2) & (1<<30 - 1) }
func slotPID(w uint64) int64     { return int64(w >> 32) }

func nowNS() int64 { return time.Now().UnixNano() }

func ptr(d []byte, off int) unsafe.Pointer { return unsafe.Pointer(&d[off]) }
