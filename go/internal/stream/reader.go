package stream

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// ErrNoSlot means every reader slot of the stream is held by a live reader
// (or the one asked for is).
var ErrNoSlot = fmt.Errorf("no free reader slot: %w", unix.EBUSY)

// slotJoining is the state of a slot while a reader sets it up, or while
// the writer evicts a dead one; the writer ignores it.
const slotJoining = 3

// joinWait bounds how long a reader waits for a slot that another holds
// joining before it calls the slot taken.
const joinWait = 200 * time.Millisecond

// Reader is one reader of a stream, in this process: one position in it.
// It is safe for concurrent use: its calls are serialized, so goroutines
// that share a Reader share its position (a frame one of them looked at is
// released by the next Increment, whoever calls it). Close may be called
// while another goroutine waits in Look, which then returns ErrClosed.
type Reader struct {
	calls // serialized, with the steps of the C ABI too (calls.hold)
	s     *Stream
	seg   *shm.Segment // the reader's own handle: the memory outlives the stream's
	index int
	slot  []byte
	// c is the state the reader's steps (package plane) move: the slot word
	// it holds, the next frame's position, the frame it looks at.
	c     *plane.Reader
	self  proc.Identity
	armed futex.Armed // the host's sleeps outside Go (ArmWait)
}

// Reader joins the stream as the reader of slot index, or of the first free
// slot when index is negative. A slot is free when no reader holds it, or
// the process that held it is gone. The reader starts at the next frame
// published.
func (s *Stream) Reader(index int) (*Reader, error) {
	if !s.guard.Enter() {
		return nil, ErrClosed
	}
	defer s.guard.Leave()
	self, err := proc.Self()
	if err != nil {
		return nil, err
	}
	if index >= s.cfg.Readers {
		return nil, fmt.Errorf("reader slot %d: the stream has %d (0 to %d): %w",
			index, s.cfg.Readers, s.cfg.Readers-1, unix.EINVAL)
	}
	seg, err := s.seg.Dup()
	if err != nil {
		return nil, err
	}
	r := &Reader{calls: calls{policy: futex.NewSleeping()}, s: s, seg: seg, self: self}
	if index >= 0 {
		if r.claim(index) {
			return r, nil
		}
		err = fmt.Errorf("reader slot %d is held by pid %d: %w",
			index, slotPID(atomic.LoadUint64(s.slotWord(index))), ErrNoSlot)
	} else {
		for i := range s.cfg.Readers {
			if r.claim(i) {
				return r, nil
			}
		}
		err = fmt.Errorf("all %d reader slots of the stream are held by live readers "+
			"(make it with more readers): %w", s.cfg.Readers, ErrNoSlot)
	}
	return nil, errors.Join(err, seg.Close())
}

// claim takes slot i if it is free, and reports whether it did.
func (r *Reader) claim(i int) bool {
	slot := r.s.slot(i)
	word := u64(slot, rWord)
	joinBy := time.Time{}
	for {
		w := atomic.LoadUint64(word)
		switch state(w) {
		case slotActive, slotJoining, slotEvicted:
			// Evicted readers may come back: only their death frees the slot.
			if readerGone(slot, w) {
				break
			}
			// A slot joining is held for a moment (a reader setting it up,
			// or the writer evicting a dead one: Note [evicting a dead
			// reader] in writer.go): wait for it a little.
			if state(w) != slotJoining {
				return false
			}
			if joinBy.IsZero() {
				joinBy = time.Now().Add(joinWait)
			} else if time.Now().After(joinBy) {
				return false
			}
			time.Sleep(50 * time.Microsecond)
			continue
		}
		joining := slotWord(r.self.PID, generation(w)+1, slotJoining)
		if atomic.CompareAndSwapUint64(word, w, joining) {
			r.s.takeBackSleepers(slot) // of a reader that died armed, if it did
			r.index, r.slot = i, slot
			r.c = plane.NewReader(ptr(r.s.data, 0), ptr(slot, 0), r.s.cfg.Frames, r.s.table)
			r.hold = r.c.Hold()
			atomic.StoreUint64(u64(slot, rDropped), 0)
			atomic.StoreUint64(u64(slot, rReceived), 0)
			r.activate(joining)
			return true
		}
	}
}

// activate makes the slot, which this reader holds in state joining or
// evicted, active again, at the next frame published.
func (r *Reader) activate(held uint64) {
	slot := r.slot
	atomic.StoreUint64(u64(slot, rStart), r.self.StartTime)
	atomic.StoreUint64(u64(slot, rPID), uint64(r.self.PID))
	atomic.StoreInt64((*int64)(ptr(slot, rSeen)), nowNS())
	published := atomic.LoadUint64(u64(r.s.data, offPublished))
	atomic.StoreUint64(u64(slot, rPosition), published)
	r.c.SetWord(slotWord(r.self.PID, generation(held), slotActive))
	atomic.StoreUint64(u64(slot, rWord), r.c.Word())
	// Read the position again now that the writer sees this reader: a
	// writer that read the readers before could claim frames up to a ring
	// past the position it saw, but not past this one.
	r.c.SetPos(atomic.LoadUint64(u64(r.s.data, offPublished)))
	atomic.StoreUint64(u64(slot, rPosition), r.c.Pos())
}

// dataSeq is the stream's data word, with this reader's count of its
// sleepers on it (Note [a dead party's sleepers] in package futex).
func (r *Reader) dataSeq() futex.Seq {
	s := r.s.dataSeq()
	s.Mine = u32(r.slot, rArmed)
	return s
}

// Plane returns the reader's state as the data plane's steps take it, for
// the C ABI to run them on (it lives until Close).
func (r *Reader) Plane() *plane.Reader { return r.c }

// Index returns the reader's slot.
func (r *Reader) Index() int { return r.index }

// ReaderStats are a reader's counts.
type ReaderStats struct {
	Position uint64 // the next frame this reader reads
	Received uint64 // frames it took whole
	Dropped  uint64 // frames it lost
}

// Stats returns the reader's counts (ErrClosed once it is closed).
func (r *Reader) Stats() (ReaderStats, error) {
	if err := r.enter(); err != nil {
		return ReaderStats{}, err
	}
	defer r.leave()
	return ReaderStats{
		Position: r.c.Pos(),
		Received: atomic.LoadUint64(u64(r.slot, rReceived)),
		Dropped:  atomic.LoadUint64(u64(r.slot, rDropped)),
	}, nil
}

// Look returns the slot of the next frame, waiting for the writer to
// publish it until deadline (none when zero; a past deadline does not wait).
// It returns ErrEmpty when the deadline passed, ErrEnded when the stream
// ended and every frame was read. Looking again before Increment returns the
// same slot.
func (r *Reader) Look(deadline time.Time) (int, error) {
	return r.wait(context.Background(), r.s, deadline, r.look, ErrEmpty)
}

// LookContext is Look, waiting until ctx is done: its deadline (ErrEmpty),
// or its cancellation, which wakes the wait at once (ErrEmpty and
// ctx.Err()).
func (r *Reader) LookContext(ctx context.Context) (int, error) {
	return r.wait(ctx, r.s, time.Time{}, r.look, ErrEmpty)
}

func (r *Reader) look(u futex.Until) (int, error) {
	s := r.s
	data := r.dataSeq()
	for {
		var out plane.Out
		slot, res := r.c.Look(&out) // the data plane's step, the C ABI's too
		switch res {
		case plane.OK:
			return slot, nil
		case plane.Rejoin:
			if err := r.rejoinIfEvicted(); err != nil {
				return 0, err
			}
			continue
		case plane.Ended:
			return 0, ErrEnded
		case plane.Corrupt:
			at, _, _ := plane.Need(&out)
			return 0, s.pastTheRing(r.c.Pos(), at)
		case plane.Fault:
			return 0, &fault.Error{Addr: plane.Addr(&out)}
		}
		if !u.Deadline.IsZero() && !time.Now().Before(u.Deadline) {
			return 0, ErrEmpty
		}
		if r.guard.Closed() {
			return 0, ErrClosed
		}
		if err := s.sleep(data, plane.Seen(&out), r.policy, u, ErrEmpty); err != nil {
			return 0, err
		}
	}
}

// Increment releases the frame Look returned, and reports whether it was
// whole: false when the writer claimed its slot again while the reader
// looked (it lapped the reader under Overwrite, or evicted it), in which
// case the frame counts as dropped.
func (r *Reader) Increment() (bool, error) {
	if err := r.enter(); err != nil {
		return false, err
	}
	defer r.leave()
	return r.increment()
}

func (r *Reader) increment() (bool, error) {
	var out plane.Out
	switch whole, res := r.c.Increment(&out); res { // the data plane's step, the C ABI's too
	case plane.OK:
		return whole, nil
	case plane.NoFrame:
		return false, ErrNoFrame
	default:
		return false, &fault.Error{Addr: plane.Addr(&out)}
	}
}

// Next releases the frame looked at, if any, and looks at the next one: one
// call per frame for a reader that goes through them in order. whole is
// what Increment said of the frame released (true when none was).
func (r *Reader) Next(deadline time.Time) (slot int, whole bool, err error) {
	if err := r.enter(); err != nil {
		return 0, false, err
	}
	defer r.leave()
	whole = true
	if r.c.Looking() {
		if whole, err = r.increment(); err != nil {
			return 0, whole, err
		}
	}
	slot, err = r.look(futex.Until{Deadline: deadline})
	return slot, whole, err
}

func (r *Reader) drop(n uint64) {
	atomic.AddUint64(u64(r.slot, rDropped), n)
	atomic.AddUint64(u64(r.s.data, offDropped), n)
}

// rejoinIfEvicted takes the slot back when the writer evicted this reader,
// counting the frames it skips as dropped.
func (r *Reader) rejoinIfEvicted() error {
	word := u64(r.slot, rWord)
	w := atomic.LoadUint64(word)
	if w == r.c.Word() {
		return nil
	}
	if w != slotWord(r.self.PID, generation(r.c.Word()), slotEvicted) {
		return fmt.Errorf("reader slot %d was taken over (pid %d): %w", r.index, slotPID(w), ErrNoSlot)
	}
	joining := slotWord(r.self.PID, generation(w)+1, slotJoining)
	if !atomic.CompareAndSwapUint64(word, w, joining) {
		return fmt.Errorf("reader slot %d changed while rejoining: %w", r.index, ErrNoSlot)
	}
	from := r.c.Pos()
	r.activate(joining)
	if r.c.Pos() > from {
		r.drop(r.c.Pos() - from)
	}
	return nil
}

// ArmWait counts the calling host thread among the sleepers on the
// stream's data word, and returns the word and the value to sleep on, for
// a sleep outside Go (Note [sleeping outside Go] in package futex): the
// host looks again (a Look that does not wait) and sleeps only if it still
// must, then calls DisarmWait. A sleep on the word after Close fails or
// ends, and never faults.
func (r *Reader) ArmWait() (*uint32, uint32, error) {
	if !r.guard.Enter() {
		return nil, 0, ErrClosed
	}
	defer r.guard.Leave()
	s := r.dataSeq()
	return s.Word, r.armed.Arm(0, s), nil
}

// DisarmWait takes back an ArmWait; one with no ArmWait before it is
// refused.
func (r *Reader) DisarmWait() error {
	if !r.guard.Enter() {
		return ErrClosed
	}
	defer r.guard.Leave()
	if !r.armed.Disarm(0, r.dataSeq()) {
		return fmt.Errorf("the reader's wait word was not armed: %w", unix.EINVAL)
	}
	return nil
}

// Close leaves the stream: the slot is free for another reader, and the
// writer no longer waits for this one. A Look waiting in another goroutine
// returns ErrClosed, and a host thread asleep outside Go (ArmWait) wakes;
// closing twice returns ErrClosed. What the reader holds in this process
// (its state in C memory, its mapping) goes even when the shared memory
// faults under the close (a file shrunk: the caller's fault.Catch says so).
func (r *Reader) Close() (err error) {
	if !r.guard.Close(r.s.wakeAll) {
		return ErrClosed
	}
	defer func() {
		r.c.Free() // no call runs on it now: Go's waited out, the C ABI's table let it go first
		err = errors.Join(err, r.seg.Close())
	}()
	r.armed.Release(0, r.dataSeq())
	word := u64(r.slot, rWord)
	w := atomic.LoadUint64(word)
	if slotPID(w) == r.self.PID && (w == r.c.Word() || state(w) == slotEvicted) {
		atomic.CompareAndSwapUint64(word, w, slotWord(0, generation(w), slotFree))
	}
	if atomic.LoadUint64(u64(r.s.data, offWanted)) != 0 {
		return r.s.spaceSeq().Signal(1)
	}
	return nil
}
