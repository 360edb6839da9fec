package queue

import (
	"fmt"
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/lock"
	"github.com/zctipc/zctipc/go/internal/message"
	"golang.org/x/sys/unix"
)

// Note [peeking at a queue]: an observer (zctipc tail) reads the records of
// a queue without taking them: it takes no lock, writes no word, and never
// sleeps on the queue's futex words (a put wakes one sleeper, which could be
// the observer rather than a consumer). It keeps a cursor, a word like the
// committed ones (count << 32 | position), and copies the record there into
// private memory, then checks that what it copied was the record:
//
//   - A record still in the queue after the copy (head not past its start,
//     read again after the copy) was in it for the whole copy: producers
//     write only past the committed tail and less than a ring past head,
//     consumers write nothing into the ring, and pages are given back only
//     behind head or while the queue is empty. This holds for every ring.
//   - A record a consumer took may still lie in a bounded ring (version 1),
//     whose pages are never given back, until a producer writes over it.
//     Producers write only while they hold the producers' lock, and commit
//     a new tail before they let it go (a killed one leaves it held). So a
//     copy made while the lock read free before and after it, with the same
//     tail word before and after, and a tail at most a ring past the
//     record's start, is the record: no write reached it before, and none
//     happened during the copy.
//   - An unbounded ring (versions 2 and 3) gives back the pages of taken
//     records (and rewinds its window when it empties), so a record taken
//     before it was copied is counted as missed.
//
// Such a ring also skips to its next lap whenever it empties, so 32-bit
// positions wrap within a few messages and a cursor left a while may be
// laps behind: the message counts, which skips do not move, say first
// whether the cursor's record was taken, and the positions are compared
// only when they are surely less than a wrap apart. The words are read
// one after another while others move them (head first: read after the
// tail, it could be past it), so a set that cannot be the queue's is read
// again.
//
// A copy that fails its check is thrown away and the cursor moves on. A
// copy may read a page that a consumer gives back meanwhile (a taken record
// of an unbounded ring): the page reads as zeros (tmpfs maps a new one,
// which the ring gives back when it next passes there) and the check throws
// the copy away; a full file system faults instead, which the copy catches
// (package fault) and treats the same way. Nothing else is touched: a
// peeker holds counts only on what it attaches from the copy, as any
// process may (zct_queue_peek).

// Cursors that Peek takes in place of a record's.
const (
	PeekOldest uint64 = math.MaxUint64     // the oldest message in the queue
	PeekNewest uint64 = math.MaxUint64 - 1 // the next message put
)

// peekTries bounds how often Peek copies one taken record of a bounded ring
// while producers are busy, before it counts the record as missed;
// peekUnsound how often it reads words that cannot be the queue's together
// (each read while others moved them) before it reports them corrupt.
// peekAttempts bounds one call: while consumers take every record before
// it is copied, Peek says ErrEmpty, and the caller asks again later.
const (
	peekTries    = 8
	peekUnsound  = 1000
	peekAttempts = 4096
)

// Peeked says what Peek copied.
type Peeked struct {
	Size   int    // bytes of the record copied into buf; what it needs with a *RangeError
	At     uint64 // the cursor of the record copied, or of the one that did not fit
	Next   uint64 // the cursor after it, where the next Peek starts
	Missed uint32 // messages between the cursor asked for and At that consumers took before they were copied
}

// Peek copies the record at cursor (or, when consumers took it before it
// could be read, the first one after it that is still there) into buf,
// without taking it and without a lock (Note [peeking at a queue]). cursor
// is PeekOldest, PeekNewest, or a Peeked.Next. When there is no record
// there yet (or every record there was taken before it could be copied,
// many times over) it returns ErrEmpty, with Next the cursor to ask for
// again; a
// record larger than buf is a *RangeError, with At its cursor (to ask again
// with a larger buf) and Next the one past it (to pass it over). The
// copy is checked as a record was put: the caller decodes it
// (message.DecodeRecord). It is safe for concurrent use.
func (q *Queue) Peek(cursor uint64, buf []byte) (p Peeked, err error) {
	if !q.guard.Enter() {
		return Peeked{}, ErrClosed
	}
	defer q.guard.Leave()
	// The words too are read under fault.Catch: a file shrunk below them
	// faults (Note [truncated while observed] in package stream).
	err = fault.Catch(func() (err error) {
		p, err = q.peek(cursor, buf)
		return err
	})
	return p, err
}

func (q *Queue) peek(cursor uint64, buf []byte) (Peeked, error) {
	var p Peeked
	tries, unsound := 0, 0
	for attempt := 0; ; attempt++ {
		if attempt == peekAttempts && cursor != PeekOldest && cursor != PeekNewest {
			p.At, p.Next = cursor, cursor
			return p, ErrEmpty
		}
		// Head first: read after tail, it could be past the tail read.
		free := q.putLock.Holder() == 0
		headWord := atomic.LoadUint64(q.u64(offHead))
		tailWord := atomic.LoadUint64(q.u64(offTail))
		puts, tail := split(tailWord)
		gets, head := split(headWord)
		switch cursor {
		case PeekOldest:
			cursor = headWord
		case PeekNewest:
			cursor = tailWord
		}
		count, pos := split(cursor)
		// Positions wrap every four laps, and an unbounded ring skips to
		// its next lap whenever it empties, so a cursor's position may be
		// laps behind: its count, which only messages move, says first
		// whether its record was taken.
		taken := int32(gets-count) > 0
		switch {
		case !taken && count == gets && int32(head-pos) > 0:
			// Head crossed a skip record without taking a message. (A cursor
			// past head with head's count is past a skip record at head,
			// which no consumer crossed yet: Peek crossed it.)
			cursor = headWord
			continue
		case pos%8 != 0 || int32(count-puts) > 0:
			return p, fmt.Errorf("queue %q: a cursor (%d, %d) that is not the queue's (head %d, tail %d): %w",
				q.seg.Name(), count, pos, head, tail, unix.EINVAL)
		case !q.sound(head, tail) || !taken && (pos-head > q.capacity || tail-pos > q.capacity):
			// The words were read one after the other, while producers and
			// consumers moved them: look again. Forged ones stay so.
			if unsound++; unsound > peekUnsound && !q.sound(head, tail) {
				return p, q.corrupt(head, tail)
			} else if unsound > peekUnsound {
				// Sound words, read as many times, with a position that is
				// not among them: the cursor is not the queue's.
				return p, fmt.Errorf("queue %q: a cursor (%d, %d) more than a ring from head %d and tail %d: %w",
					q.seg.Name(), count, pos, head, tail, unix.EINVAL)
			}
			continue
		case taken && (q.sparse || tries >= peekTries || uint64(puts-count)*uint64(q.capacity) >= 1<<32 || tail-pos > q.capacity):
			// Taken, and gone or going (a record of a bounded ring is read
			// only while its position is surely within a ring of the
			// tail): go on from head.
			p.Missed += gets - count
			cursor, tries = headWord, 0
			continue
		case pos == tail:
			p.At, p.Next = cursor, cursor
			return p, ErrEmpty
		}
		// valid reports whether what was read at pos since the loads above
		// was the queue's record there.
		valid := func() bool {
			if g, h := split(atomic.LoadUint64(q.u64(offHead))); int32(g-count) <= 0 && int32(h-pos) <= 0 {
				return true // still in the queue
			}
			return !q.sparse && free && atomic.LoadUint64(q.u64(offTail)) == tailWord && q.putLock.Holder() == 0
		}
		var size uint32
		var typ uint8
		var ndesc uint16
		at := pos & q.mask
		copied := false
		ferr := fault.Catch(func() error {
			// A record's first 8 bytes never straddle the ring's end.
			size = *(*uint32)(unsafe.Pointer(&q.ring[at]))
			typ = q.ring[at+4]
			ndesc = *(*uint16)(unsafe.Pointer(&q.ring[at+6]))
			if typ != typeSkip && size >= message.RecordHeaderSize && size%8 == 0 && size <= tail-pos && int(size) <= len(buf) {
				q.read(pos, size, buf)
				copied = true
			}
			return nil
		})
		if !valid() {
			tries++
			continue
		}
		switch {
		case ferr != nil:
			return p, ferr
		case q.warm && typ == typeSkip && size == q.capacity-at && size <= tail-pos:
			cursor = uint64(count)<<32 | uint64(pos+size) // to the next lap: no message
			continue
		case copied:
			p.Size, p.At = int(size), cursor
			p.Next = uint64(count+1)<<32 | uint64(pos+size)
			return p, nil
		case size >= message.RecordHeaderSize && size%8 == 0 && size <= tail-pos && typ != typeSkip:
			p.Size, p.At = int(size), cursor
			p.Next = uint64(count+1)<<32 | uint64(pos+size)
			return p, &RangeError{Need: int(size), Views: message.Views(typ, int(ndesc))}
		}
		return p, fmt.Errorf("queue %q: %w: a record of %d bytes (type %d) at %d", q.seg.Name(), header.ErrCorrupt, size, typ, pos)
	}
}

// State is what Observe reads of a queue.
type State struct {
	RingBytes uint64 // the ring's size
	Capacity  uint64 // the largest record: the ring, less a chunk for an unbounded queue
	MaxItems  uint64 // the most messages at once, 0 for no limit
	Unbounded bool
	// Puts, Gets and Done count messages put, taken and marked done, and
	// Tail and Head bytes put and taken, all modulo 2^32.
	Puts, Gets, Done uint32
	Tail, Head       uint32
	// Producer and Consumer are the pids holding the producers' and the
	// consumers' locks, 0 when free.
	Producer, Consumer int64
}

// Messages returns the messages in the queue.
func (s State) Messages() int { return int(int32(s.Puts - s.Gets)) }

// Bytes returns the ring bytes its messages fill (an unbounded queue's
// skips to the next lap among them).
func (s State) Bytes() uint64 { return uint64(s.Tail - s.Head) }

// Observe reads the state of the queue whose data region is data (mapped,
// with or without a count, from any process), without a lock and without
// writing anything: each word as it is at the moment it is read. It checks
// the layout and never reads out of data; a fault on data is an error.
func Observe(data []byte) (st State, err error) {
	err = fault.Catch(func() (err error) { // Note [truncated while observed] in package stream
		st, err = observe(data)
		return err
	})
	return st, err
}

func observe(data []byte) (State, error) {
	if len(data) < ringAt {
		return State{}, fmt.Errorf("%w: a queue of %d bytes", header.ErrCorrupt, len(data))
	}
	capacity := *(*uint64)(unsafe.Pointer(&data[offCapacity]))
	maxItems := *(*uint64)(unsafe.Pointer(&data[offMaxItems]))
	if capacity < MinCapacity || capacity > MaxCapacity || capacity&(capacity-1) != 0 || uint64(len(data)) != ringAt+capacity {
		return State{}, fmt.Errorf("%w: a %d-byte ring in a queue of %d bytes", header.ErrCorrupt, capacity, len(data))
	}
	v := *(*uint32)(unsafe.Pointer(&data[offRingVersion]))
	if v != RingVersion && v != SparseRingVersion && v != WarmRingVersion {
		return State{}, fmt.Errorf("%w %d (this library reads %d to %d)", ErrRingVersion, v, RingVersion, WarmRingVersion)
	}
	s := State{RingBytes: capacity, Capacity: capacity, MaxItems: maxItems, Unbounded: v != RingVersion}
	if s.Unbounded {
		s.Capacity -= min(capacity, chunk)
	}
	word := func(off int) uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(&data[off]))) }
	s.Gets, s.Head = split(word(offHead)) // first: read after tail, it could be past it
	s.Puts, s.Tail = split(word(offTail))
	s.Done = atomic.LoadUint32((*uint32)(unsafe.Pointer(&data[offDone])))
	s.Producer = lock.At(unsafe.Pointer(&data[offPutLock])).Holder()
	s.Consumer = lock.At(unsafe.Pointer(&data[offGetLock])).Holder()
	return s, nil
}
