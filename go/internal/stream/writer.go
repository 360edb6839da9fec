package stream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/lock"
	"github.com/zctipc/zctipc/go/internal/plane"
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
	calls // serialized, with the steps of the C ABI too (calls.hold)
	s     *Stream
	seg   *shm.Segment // the writer's own handle: the memory outlives the stream's
	role  lock.Mutex
	// c is the state the writer's steps (package plane) move: the frame
	// claimed and its slot, the next position, the slowest reader's
	// position when last read, and under Block the free slots.
	c *plane.Writer
	// final is the position c had when the writer closed (Position).
	final uint64
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
	frames := uint64(s.cfg.Frames)
	c := plane.NewWriter(ptr(s.data, 0), plane.WriterConfig{
		Frames:  s.cfg.Frames,
		Table:   s.table,
		Readers: s.cfg.Readers,
		Block:   s.cfg.Policy == Block,
		// The warm slots: Note [how far apart a writer reuses a slot].
		// When the ring is larger than the warm slots, the writer reads
		// the readers on every claim, so that the slots they released go
		// back among the warm ones at once.
		Refresh:       frames*s.stride > warmBytes(),
		WarmSlots:     int(min(frames, max(1, warmBytes()/s.stride))),
		ReaderTimeout: s.cfg.ReaderTimeout,
	}, published)
	w := &Writer{calls: calls{policy: futex.NewSleeping(), hold: c.Hold()}, s: s, seg: seg, role: role, c: c}
	if s.cfg.Policy == Block {
		if err := w.findFree(); err != nil {
			c.Free()
			return nil, errors.Join(err, role.Unlock(), seg.Close())
		}
	}
	return w, nil
}

// Plane returns the writer's state as the data plane's steps take it, for
// the C ABI to run them on (it lives until Close).
func (w *Writer) Plane() *plane.Writer { return w.c }

// findFree fills the free slots from the slot table: every slot but those
// of the frames readers have yet to release, which the writer notes as
// given (Note [the slots a writer takes back] in package plane's
// stream.c), each once. A reader more than a ring behind (one caught
// joining, or a forged position) holds no more than the ring: the table's
// entries of the frames before are those of the frames a ring later.
func (w *Writer) findFree() error {
	frames := uint64(w.s.cfg.Frames)
	held := make([]uint64, frames) // the position of the frame in each slot, plus one
	low, err := w.slowest()
	if err != nil {
		return err
	}
	next := w.c.Next() // slowest gives no more
	from := low
	if next-low > frames {
		from = next - frames
	}
	for p := from; p < next; p++ {
		i, err := w.s.slotOf(p)
		if err != nil {
			return err
		}
		if held[i] != 0 {
			return fmt.Errorf("stream %q: %w: frames %d and %d in flight both in slot %d",
				w.s.seg.Name(), header.ErrCorrupt, held[i]-1, p, i)
		}
		held[i] = p + 1
		w.c.SetGiven(p, i)
	}
	for i := len(held) - 1; i >= 0; i-- { // slot 0 on top
		if held[i] == 0 {
			w.c.PushCold(i)
		}
	}
	w.c.SetFreed(from)
	return nil
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
	for {
		var out plane.Out
		slot, res := w.c.Look(&out) // the data plane's step, the C ABI's too
		switch res {
		case plane.OK:
			return slot, nil
		case plane.Ended:
			return 0, ErrEnded
		case plane.Wait:
			if err := w.waitForRoom(u); err != nil {
				return 0, err
			}
		case plane.Corrupt:
			at, given, what := plane.Need(&out)
			switch what {
			case plane.NoFreeSlot:
				return 0, fmt.Errorf("stream %q: %w: no free slot with %d frames in flight",
					s.seg.Name(), header.ErrCorrupt, plane.Frame(&out))
			case plane.MovedSlot:
				return 0, fmt.Errorf("stream %q: %w: frame %d in slot %d, where its writer put it in slot %d",
					s.seg.Name(), header.ErrCorrupt, plane.Frame(&out), at, given)
			}
			return 0, s.pastTheRing(plane.Frame(&out), at)
		default:
			return 0, &fault.Error{Addr: plane.Addr(&out)}
		}
	}
}

// Increment publishes the frame claimed by Look.
func (w *Writer) Increment() error {
	if err := w.enter(); err != nil {
		return err
	}
	defer w.leave()
	var out plane.Out
	switch w.c.Increment(&out) { // the data plane's step, the C ABI's too
	case plane.OK:
		return nil
	case plane.NoFrame:
		return ErrNoFrame
	default:
		return &fault.Error{Addr: plane.Addr(&out)}
	}
}

// Position returns the number of frames this writer has published (a
// closed writer keeps the number it had).
func (w *Writer) Position() uint64 {
	if err := w.enter(); err != nil {
		w.mu.Lock() // Close wrote final under it
		defer w.mu.Unlock()
		return w.final
	}
	defer w.leave()
	return w.c.Next()
}

// Close gives up the writer role; a frame claimed and not published is not
// published. The stream goes on: another writer may take over. A Look
// waiting in another goroutine returns ErrClosed, and a host thread asleep
// outside Go (ArmWait) wakes; closing twice returns ErrClosed.
func (w *Writer) Close() (err error) {
	if !w.guard.Close(w.s.wakeAll) {
		return ErrClosed
	}
	// What the writer holds in this process goes even when the shared
	// memory faults under the close (a file shrunk: the caller's
	// fault.Catch says so), as Reader.Close's does.
	w.mu.Lock()
	w.final = w.c.Next()
	defer func() {
		w.c.Free() // no call runs on it now: Go's waited out, the C ABI's table let it go first
		w.c, w.hold = nil, nil
		w.mu.Unlock()
		err = errors.Join(err, w.seg.Close())
	}()
	w.sleepers = 0
	w.armed.Release(0, w.s.spaceSeq())
	w.unwant()
	return w.role.Unlock()
}

// slowest reads the live readers' positions (the data plane's step): the
// lowest, or the next frame when none is live, which the writer keeps.
func (w *Writer) slowest() (uint64, error) {
	var out plane.Out
	if low, res := w.c.Slowest(&out); res == plane.OK {
		return low, nil
	}
	return 0, &fault.Error{Addr: plane.Addr(&out)}
}

// waitForRoom waits until every live reader has released the frame in the
// slot of w.next, evicting the readers that died or, with a reader timeout,
// were not seen for that long.
func (w *Writer) waitForRoom(u futex.Until) error {
	s := w.s
	frames := uint64(s.cfg.Frames)
	need := w.c.Next() - frames + 1 // every reader must be at least here
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
		low, err := w.slowest()
		if err != nil {
			return err
		}
		if low >= need {
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
	if next := w.c.Next(); w.s.cfg.Policy == Block && next >= frames {
		// Stored before the word is read: a reader that moves after the
		// host looked sees it and bumps the word.
		atomic.StoreUint64(u64(w.s.data, offWanted), next-frames+1)
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
		gone := readerGone(slot, word)
		if !stale && !gone {
			continue
		}
		if gone {
			evicted = w.evictGone(slot, word) || evicted
			continue
		}
		// A reader that is alive but stale: its sleepers are taken back
		// first, so that none stays counted if its process dies evicted
		// (the writer looks only at active slots). Its disarm then finds
		// them taken and leaves the word alone; one it arms before the
		// eviction below stays counted, and it takes that back itself.
		s.takeBackSleepers(slot)
		evict := slotWord(slotPID(word), generation(word), slotEvicted)
		if atomic.CompareAndSwapUint64(u64(slot, rWord), word, evict) {
			evicted = true
		}
	}
	return evicted
}

// Note [evicting a dead reader]. The writer takes back the sleepers a
// reader whose process died left counted (Note [a dead party's sleepers]
// in package futex). Were the slot evicted first, a new reader could take
// it, take those sleepers back itself and go to sleep, before the writer
// came to take back what the slot then counts: the new reader's own
// sleeper, whose wake-up would be lost until its recheck. So the writer
// holds the slot as a joining reader would, under its own pid, while it
// takes them back, and only then leaves it evicted; a reader that finds a
// slot joining waits for it a moment (Reader.claim). A writer killed in
// between leaves a joining slot of a dead process, which a reader takes.

// evictingHook, when set (by tests), runs while the writer holds the slot
// of a dead reader it evicts.
var evictingHook func()

// evictGone evicts the reader of slot, whose word was word and whose
// process is gone, as Note [evicting a dead reader] says, and reports
// whether it did (another took the slot first).
func (w *Writer) evictGone(slot []byte, word uint64) bool {
	held := slotWord(int64(os.Getpid()), generation(word)+1, slotJoining)
	if !atomic.CompareAndSwapUint64(u64(slot, rWord), word, held) {
		return false
	}
	if evictingHook != nil {
		evictingHook()
	}
	w.s.takeBackSleepers(slot)
	atomic.StoreUint64(u64(slot, rWord), slotWord(slotPID(word), generation(held), slotEvicted))
	return true
}

// readerGone reports whether the process holding a reader slot is gone.
func readerGone(slot []byte, word uint64) bool {
	recorded := proc.Identity{
		PID:       int64(atomic.LoadUint64(u64(slot, rPID))),
		StartTime: atomic.LoadUint64(u64(slot, rStart)),
	}
	return proc.Gone(slotPID(word), recorded)
}
