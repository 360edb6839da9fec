package stream

import (
	"fmt"
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/lock"
	"golang.org/x/sys/unix"
)

// Note [peeking at a stream]: an observer (zctipc tail) copies frames
// without joining as a reader: it holds no reader slot, so it never holds
// the writer back (under Block the writer waits only for readers) and never
// takes a slot a reader needs; it writes no word of the stream. Without a
// slot it has no claim on a frame's memory, so it copies the frame and then
// checks that the writer took the frame's slot for no other frame since:
//
//   - The writer stores its claim before it writes a slot, and records a
//     frame's slot in the table before it claims the frame. A copy followed
//     by a claim at most a ring past the frame saw no write of frame
//     pos + frames (under Overwrite, the only frame that reuses the slot;
//     a reader checks the same).
//   - Under Block the writer may give the slot to any later frame once
//     every reader passed the frame (at once with no reader). So the table
//     entries of the frames claimed after it, read after the copy, must
//     name other slots; the claim, read again after them, must still be at
//     most a ring past the frame, so that those entries were not yet
//     rewritten for the frames a ring on. A writer that took the role over
//     may write a frame whose claim its dead predecessor stored: the entry
//     it records first is among those read.
//   - The table entry of the frame itself is read before the copy, while
//     published is below pos + frames: the writer records the slot of frame
//     pos + frames only once it published the frame before that. So under
//     Block the oldest frame an observer may read is published - frames + 1,
//     one later than a reader may (a reader's slot keeps the writer from
//     recording the next lap's entry).
//
// This relies on stores being seen in order and loads not being reordered
// with loads, as the readers' check does (amd64). A frame that fails the
// check was overwritten: the observer counts it as missed and goes on.

// PeekLatest asks Peek for the frame published last.
const PeekLatest uint64 = math.MaxUint64

// peekAttempts bounds one call: while the writer overwrites every frame
// before it is copied, Peek says ErrEmpty, and the caller asks again later.
const peekAttempts = 4096

// Peek copies frame pos (PeekLatest: the frame published last) into buf,
// which holds at least FrameBytes, without joining as a reader (Note
// [peeking at a stream]), and returns the position of the frame copied:
// pos, or a later one when the writer overwrote pos first. It returns
// ErrEmpty when frame pos is not published yet (or the writer overwrote
// every frame before it could be copied, many times over), ErrEnded when
// the stream ended before it, each with the position to ask for again. It
// is safe for concurrent use.
func (s *Stream) Peek(pos uint64, buf []byte) (got uint64, err error) {
	if !s.guard.Enter() {
		return pos, ErrClosed
	}
	defer s.guard.Leave()
	got = pos
	// Every word is read under fault.Catch: a file shrunk below them
	// faults (Note [truncated while observed]).
	err = fault.Catch(func() (err error) {
		got, err = s.peek(pos, buf)
		return err
	})
	return got, err
}

// Note [truncated while observed]: another process of the user may shrink
// a segment file in /dev/shm below the words an observer reads (package
// fault), and the observer must say so rather than die: Peek and Observe
// read every word of the segment under fault.Catch, not only the frames
// (and zct_segment_observe maps and reads its header so too).

func (s *Stream) peek(pos uint64, buf []byte) (uint64, error) {
	if uint64(len(buf)) < s.frameBytes {
		return pos, fmt.Errorf("a buffer of %d bytes for frames of %d: %w", len(buf), s.frameBytes, unix.EINVAL)
	}
	frames := uint64(s.cfg.Frames)
	claimed := func() uint64 { return atomic.LoadUint64(u64(s.data, offClaim)) }
	for attempt := 0; ; attempt++ {
		published := atomic.LoadUint64(u64(s.data, offPublished))
		if attempt == peekAttempts && pos != PeekLatest {
			return pos, ErrEmpty // every copy overwritten: the caller asks again later
		}
		if pos == PeekLatest {
			pos = max(published, 1) - 1
		}
		if pos >= published {
			// End comes after every publish: published read again is all.
			if s.ended() && pos >= atomic.LoadUint64(u64(s.data, offPublished)) {
				return pos, ErrEnded
			}
			return pos, ErrEmpty
		}
		// Frames a ring before next are gone or going: the writer claimed
		// the frame that reuses their slot, or, under Block, may be
		// recording that frame's slot in their table entry.
		next := claimed()
		if s.cfg.Policy == Block {
			next = max(next, published+1)
		}
		if next > pos+frames {
			pos = next - frames
			continue
		}
		slot, err := s.slotOf(pos)
		if err != nil {
			return pos, err
		}
		if s.cfg.Policy == Block && atomic.LoadUint64(u64(s.data, offPublished)) >= pos+frames {
			continue // the entry read may be the next lap's
		}
		ferr := fault.Catch(func() error {
			copy(buf, s.Frame(slot))
			return nil
		})
		claim := claimed()
		if claim > pos+frames {
			continue
		}
		if s.cfg.Policy == Block {
			reused := false
			for q := pos + 1; q < claim && !reused; q++ {
				i, err := s.slotOf(q)
				reused = err != nil || i == slot
			}
			if claimed() > pos+frames {
				continue
			}
			if reused {
				// The frame's slot went to a later frame: the writer is
				// ahead, and frames between are likely gone too.
				pos = max(pos+1, published-1)
				continue
			}
		}
		return pos, ferr
	}
}

// ReaderState is a reader slot as Observe reads it.
type ReaderState struct {
	Slot     int
	PID      int64
	State    string // "active", "evicted" or "joining"
	Position uint64 // the next frame it reads
	Received uint64 // frames it took whole
	Dropped  uint64 // frames it lost
}

// State is what Observe reads of a stream.
type State struct {
	Config
	FrameBytes uint64
	Published  uint64 // frames published
	Claim      uint64 // frames claimed
	Dropped    uint64 // frames all readers lost
	Ended      bool
	Writer     int64         // the pid holding the writer role, 0 when none
	Slots      []ReaderState // the reader slots held
}

// Observe reads the state of the stream whose data region is data (mapped,
// with or without a count, from any process), without a lock and without
// writing anything. It checks the layout as Attach does (layoutOf) and
// never reads out of data; a fault on data is an error.
func Observe(data []byte) (st State, err error) {
	err = fault.Catch(func() (err error) { // Note [truncated while observed]
		st, err = observe(data)
		return err
	})
	return st, err
}

func observe(data []byte) (State, error) {
	l, err := layoutOf(data)
	if err != nil {
		return State{}, err
	}
	cfg := l.cfg
	st := State{
		Config:     cfg,
		FrameBytes: l.frameBytes,
		Published:  atomic.LoadUint64(u64(data, offPublished)),
		Claim:      atomic.LoadUint64(u64(data, offClaim)),
		Dropped:    atomic.LoadUint64(u64(data, offDropped)),
		Ended:      atomic.LoadUint32(u32(data, offEnded)) != 0,
		Writer:     lock.At(unsafe.Pointer(&data[offWriterLock])).Holder(),
	}
	for i := range cfg.Readers {
		slot := data[readersAt+i*readerSize : readersAt+(i+1)*readerSize]
		w := atomic.LoadUint64(u64(slot, rWord))
		var name string
		switch state(w) {
		case slotActive:
			name = "active"
		case slotEvicted:
			name = "evicted"
		case slotJoining:
			name = "joining"
		default:
			continue
		}
		st.Slots = append(st.Slots, ReaderState{
			Slot: i, PID: slotPID(w), State: name,
			Position: atomic.LoadUint64(u64(slot, rPosition)),
			Received: atomic.LoadUint64(u64(slot, rReceived)),
			Dropped:  atomic.LoadUint64(u64(slot, rDropped)),
		})
	}
	return st, nil
}
