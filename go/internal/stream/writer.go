package stream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/lock"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// ErrWriterBusy means another live process is the stream's writer.
var ErrWriterBusy = fmt.Errorf("the stream already has a writer: %w", unix.EBUSY)

// takeWriterFor bounds how long Writer waits for the writer role: long
// enough to take it over from a writer that died.
const takeWriterFor = 200 * time.Millisecond

// Writer is the stream's one writer, in this process. It is safe for
// concurrent use: its calls are serialized, and goroutines that share it
// share the frame claimed (Look, then Increment, whoever calls it). Close
// may be called while another goroutine waits in Look, which then returns
// ErrClosed.
type Writer struct {
	calls   // serialized: they move next and claimed
	s       *Stream
	seg     *shm.Segment // the writer's own handle: the memory outlives the stream's
	role    lock.Mutex
	claimed bool   // a frame is claimed and not yet published
	slot    int    // the slot of the frame claimed
	next    uint64 // the position of the next frame to claim
	minPos  uint64 // the slowest reader's position when last read
	// Under Block, the slots no frame in flight holds: the warm ones, at
	// most warmSlots, released most recently, oldest first; the cold ones,
	// which the writer takes while fewer than warmSlots are warm. freed is
	// the position below which every frame's slot was put back.
	warm  slotQueue
	cold  []int
	freed uint64
	// blockedFor is the position the writer last waited for every reader
	// to reach, and blockedSince when it began to (ns, as rSeen): a reader
	// holds the writer back only from then (Note [waiting is alive]).
	blockedFor   uint64
	blockedSince int64
	// armed counts the host's sleeps outside Go on the space word
	// (ArmWait); sleepers is the same count, read under calls.mu, while
	// which the writer keeps saying what it waits for (offWanted).
	armed    futex.Armed
	sleepers int
}

// slotQueue is a first-in first-out queue of slots, at most a ring's worth.
type slotQueue struct {
	slots []int // len is the ring's frames
	head  int
	n     int
}

func (q *slotQueue) push(i int) {
	q.slots[(q.head+q.n)%len(q.slots)] = i
	q.n++
}

func (q *slotQueue) pop() int {
	i := q.slots[q.head]
	q.head = (q.head + 1) % len(q.slots)
	q.n--
	return i
}

// warmBytes bounds the slots the writer keeps in circulation while readers
// keep up. Reusing a slot that a reader released a moment ago writes lines
// still in that reader's core's cache (each one fetched from it), and going
// round the whole ring writes lines long gone to memory; a few megabytes
// apart is past a core's L2 cache and inside the shared L3.
const warmBytes = 4 << 20

// Writer makes this process the stream's writer. When the writer before it
// died, it takes the role over, and the frame that writer had claimed but
// not published is never published.
func (s *Stream) Writer() (*Writer, error) {
	if !s.guard.Enter() {
		return nil, ErrClosed
	}
	defer s.guard.Leave()
	seg, err := s.seg.Dup()
	if err != nil {
		return nil, err
	}
	role := lock.At(unsafe.Pointer(&s.data[offWriterLock]))
	if _, err := role.Lock(time.Now().Add(takeWriterFor)); err != nil {
		if errors.Is(err, lock.ErrTimeout) {
			err = fmt.Errorf("%w (pid %d)", ErrWriterBusy, role.Holder())
		}
		return nil, errors.Join(err, seg.Close())
	}
	// A claim the writer before left unpublished stays claimed: a reader of
	// the frame that slot held must still see it as overwritten.
	published := atomic.LoadUint64(u64(s.data, offPublished))
	w := &Writer{calls: calls{policy: futex.NewSleeping()}, s: s, seg: seg, role: role, next: published}
	w.minPos = w.slowest()
	if s.cfg.Policy == Block {
		if err := w.findFree(); err != nil {
			return nil, errors.Join(err, role.Unlock(), seg.Close())
		}
	}
	return w, nil
}

// findFree fills the free list from the slot table: every slot but those of
// the frames readers have yet to release.
func (w *Writer) findFree() error {
	held := make([]bool, w.s.cfg.Frames)
	w.warm = slotQueue{slots: make([]int, w.s.cfg.Frames)}
	for p := w.minPos; p < w.next; p++ {
		i, err := w.s.slotOf(p)
		if err != nil {
			return err
		}
		held[i] = true
	}
	for i := len(held) - 1; i >= 0; i-- { // slot 0 on top
		if !held[i] {
			w.cold = append(w.cold, i)
		}
	}
	w.freed = w.minPos
	return nil
}

// warmSlots is how many free slots the writer keeps warm.
func (w *Writer) warmSlots() int {
	return int(min(uint64(w.s.cfg.Frames), max(1, warmBytes/w.s.stride)))
}

// release puts the slots of the frames every reader has passed back among
// the warm ones, and the warm ones beyond warmSlots, oldest first, among
// the cold ones.
func (w *Writer) release() error {
	for ; w.freed < w.minPos; w.freed++ {
		i, err := w.s.slotOf(w.freed)
		if err != nil {
			return err
		}
		if w.warm.n == w.warmSlots() {
			w.cold = append(w.cold, w.warm.pop())
		}
		w.warm.push(i)
	}
	return nil
}

// take returns the free slot for the next frame: the warm one released
// longest ago once there are warmSlots of them, and a cold one before
// (while the writer starts, or when readers fall behind), so that a slot
// comes round again only after warmSlots others.
func (w *Writer) take() (int, bool) {
	if w.warm.n > 0 && (w.warm.n >= w.warmSlots() || len(w.cold) == 0) {
		return w.warm.pop(), true
	}
	if n := len(w.cold); n > 0 {
		i := w.cold[n-1]
		w.cold = w.cold[:n-1]
		return i, true
	}
	return 0, false
}

// Look claims the next frame and returns its slot, waiting for room until
// deadline under Block (none when zero; a past deadline does not wait). It
// returns ErrFull when the deadline passed, ErrEnded once the stream ended.
// Looking again before Increment returns the same slot.
func (w *Writer) Look(deadline time.Time) (int, error) {
	return w.wait(context.Background(), w.s, deadline, w.look, ErrFull)
}

// LookContext is Look, waiting until ctx is done: its deadline (ErrFull),
// or its cancellation, which wakes the wait at once (ErrFull and
// ctx.Err()).
func (w *Writer) LookContext(ctx context.Context) (int, error) {
	return w.wait(ctx, w.s, time.Time{}, w.look, ErrFull)
}

func (w *Writer) look(u futex.Until) (int, error) {
	s := w.s
	frames := uint64(s.cfg.Frames)
	if w.claimed {
		return w.slot, nil
	}
	if s.ended() {
		return 0, ErrEnded
	}
	w.slot = int(w.next % frames)
	if s.cfg.Policy == Block {
		// When the ring is larger than the warm slots, read the readers on
		// every claim, so that the slots they released go back among the
		// warm ones at once.
		if w.next >= w.minPos+frames || frames*s.stride > warmBytes {
			w.minPos = w.slowest()
		}
		if w.next >= w.minPos+frames {
			if err := w.waitForRoom(u); err != nil {
				return 0, err
			}
		}
		if err := w.release(); err != nil {
			return 0, err
		}
		slot, ok := w.take()
		if !ok { // a corrupt table: a slot held twice
			return 0, fmt.Errorf("stream %q: %w: no free slot with %d frames in flight",
				s.seg.Name(), header.ErrCorrupt, w.next-w.minPos)
		}
		w.slot = slot
		s.setSlot(w.next, w.slot)
	}
	// The claim is stored before the slot is handed out: readers of the
	// frame this slot held learn that it is being overwritten.
	if claim := u64(s.data, offClaim); atomic.LoadUint64(claim) < w.next+1 {
		atomic.StoreUint64(claim, w.next+1)
	}
	w.claimed = true
	return w.slot, nil
}

// Increment publishes the frame claimed by Look.
func (w *Writer) Increment() error {
	if err := w.enter(); err != nil {
		return err
	}
	defer w.leave()
	if !w.claimed {
		return ErrNoFrame
	}
	w.claimed = false
	w.next++
	atomic.StoreUint64(u64(w.s.data, offPublished), w.next)
	return w.s.dataSeq().Signal(math.MaxInt32)
}

// Position returns the number of frames this writer has published (a
// closed writer keeps the number it had).
func (w *Writer) Position() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next
}

// Close gives up the writer role; a frame claimed and not published is not
// published. The stream goes on: another writer may take over. A Look
// waiting in another goroutine returns ErrClosed, and a host thread asleep
// outside Go (ArmWait) wakes; closing twice returns ErrClosed.
func (w *Writer) Close() error {
	if !w.guard.Close(w.s.wakeAll) {
		return ErrClosed
	}
	w.armed.Release(0, w.s.spaceSeq())
	w.sleepers = 0
	w.unwant()
	return errors.Join(w.role.Unlock(), w.seg.Close())
}

// slowest returns the lowest position of the live readers (the next frame
// when there is none).
func (w *Writer) slowest() uint64 {
	low := w.next
	for i := range w.s.cfg.Readers {
		slot := w.s.slot(i)
		if state(atomic.LoadUint64(u64(slot, rWord))) == slotActive {
			low = min(low, atomic.LoadUint64(u64(slot, rPosition)))
		}
	}
	return low
}

// waitForRoom waits until every live reader has released the frame in the
// slot of w.next, evicting the readers that died or, with a reader timeout,
// were not seen for that long.
func (w *Writer) waitForRoom(u futex.Until) error {
	s := w.s
	frames := uint64(s.cfg.Frames)
	need := w.next - frames + 1 // every reader must be at least here
	space := s.spaceSeq()
	wanted := u64(s.data, offWanted)
	defer w.unwant()
	if need != w.blockedFor || w.blockedSince == 0 {
		w.blockedFor, w.blockedSince = need, nowNS()
	}
	var checked time.Time
	for {
		// Say what we wait for before reading the positions: a reader that
		// moves after we read it then sees it and wakes us.
		atomic.StoreUint64(wanted, need)
		seen := space.Load()
		if w.minPos = w.slowest(); w.minPos >= need {
			return nil
		}
		if s.ended() {
			return ErrEnded
		}
		if w.guard.Closed() {
			return ErrClosed
		}
		if time.Since(checked) >= checkLivenessEvery {
			checked = time.Now()
			if w.evictStale(need) {
				continue
			}
		}
		if !u.Deadline.IsZero() && !time.Now().Before(u.Deadline) {
			return ErrFull
		}
		if err := s.sleep(space, seen, w.policy, u, ErrFull); err != nil {
			return err
		}
	}
}

// unwant says that the writer no longer waits for room, unless a host
// thread armed for room still sleeps outside Go (ArmWait): readers that
// move past what it waits for must go on waking it.
func (w *Writer) unwant() {
	if w.sleepers == 0 {
		atomic.StoreUint64(u64(w.s.data, offWanted), 0)
	}
}

// ArmWait counts the calling host thread among the sleepers on the
// stream's space word, which readers bump as they move past the position
// the writer waits for, and returns the word and the value to sleep on,
// for a sleep outside Go (Note [sleeping outside Go] in package futex).
// Until DisarmWait the writer says that it waits for every reader to
// release the slot of its next frame, so that the readers wake it. The
// host then looks again (a Look that does not wait) and sleeps only if it
// still must, then calls DisarmWait; it looks again now and then even
// when not woken, since only a Look evicts the readers that died or, with
// a reader timeout, stopped. A sleep on the word after Close fails or
// ends, and never faults.
//
// Threat model: any code of the process may call it through the C ABI,
// with a writer's handle; calls are serialized with the writer's others.
// What it stores (the position waited for) is a hint to readers, who
// only wake the writer for it; a reader process that forges it or the
// word only wakes the writer, which looks again.
func (w *Writer) ArmWait() (*uint32, uint32, error) {
	if err := w.enter(); err != nil {
		return nil, 0, err
	}
	defer w.leave()
	frames := uint64(w.s.cfg.Frames)
	if w.s.cfg.Policy == Block && w.next >= frames {
		// Stored before the word is read: a reader that moves after the
		// host looked sees it and bumps the word.
		atomic.StoreUint64(u64(w.s.data, offWanted), w.next-frames+1)
	}
	w.sleepers++
	space := w.s.spaceSeq()
	return space.Word, w.armed.Arm(0, space), nil
}

// DisarmWait takes back an ArmWait; one with no ArmWait before it is
// refused.
func (w *Writer) DisarmWait() error {
	if err := w.enter(); err != nil {
		return err
	}
	defer w.leave()
	if !w.armed.Disarm(0, w.s.spaceSeq()) {
		return fmt.Errorf("the writer's wait word was not armed: %w", unix.EINVAL)
	}
	w.sleepers--
	w.unwant()
	return nil
}

// Note [waiting is alive]. A reader's seen time moves when it takes or
// releases a frame, not while it waits for one: a reader that waited three
// seconds for the writer was seen three seconds ago. Judged by that alone,
// it was evicted the moment the writer filled the ring, before it could
// wake (a reader with a 1 s timeout, waiting in read(), lost 32 frames). A
// reader can hold the writer back only once the writer waits for it, so
// its time without being seen counts from the later of its seen time and
// the moment this writer began to wait for the position it has not
// reached (blockedSince): one that waited is evicted only after a whole
// timeout more without moving. The writer keeps that moment across its
// calls, which a host makes one short wait after another.

// evictStale takes their slots from the readers behind need whose process
// died or that held the writer back for the reader timeout without being
// seen (Note [waiting is alive]), and reports whether it evicted any.
func (w *Writer) evictStale(need uint64) bool {
	s := w.s
	timeout := s.cfg.ReaderTimeout.Nanoseconds()
	now := nowNS()
	evicted := false
	for i := range s.cfg.Readers {
		slot := s.slot(i)
		word := atomic.LoadUint64(u64(slot, rWord))
		if state(word) != slotActive || atomic.LoadUint64(u64(slot, rPosition)) >= need {
			continue
		}
		seen := max(int64(atomic.LoadUint64(u64(slot, rSeen))), w.blockedSince)
		stale := timeout > 0 && now-seen > timeout
		if !stale && !readerGone(slot, word) {
			continue
		}
		evict := slotWord(slotPID(word), generation(word), slotEvicted)
		if atomic.CompareAndSwapUint64(u64(slot, rWord), word, evict) {
			evicted = true
		}
	}
	return evicted
}

// readerGone reports whether the process holding a reader slot is gone.
func readerGone(slot []byte, word uint64) bool {
	recorded := proc.Identity{
		PID:       int64(atomic.LoadUint64(u64(slot, rPID))),
		StartTime: atomic.LoadUint64(u64(slot, rStart)),
	}
	return proc.Gone(slotPID(word), recorded)
}
