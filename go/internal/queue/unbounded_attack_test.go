package queue_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/lock"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

// Offsets of the queue words the attacks forge (docs/format.md, "Queues").
const (
	offWindowNeedWord = 112
	typeSkipRecord    = 0xFF
)

// noPanic runs fn, turning a panic or a fault on mapped memory into a test
// failure that names what, rather than the death of the test binary.
func noPanic(t *testing.T, what string, fn func()) {
	t.Helper()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("%s panicked: %v", what, r)
		}
	}()
	fn()
}

// pastRing returns the bytes of the queue's mapping past its ring, to the
// end of the page the ring ends in: past the end of the file, where no call
// may write.
func pastRing(q *queue.Queue) []byte {
	d := q.Segment().Data()
	end := uintptr(unsafe.Pointer(unsafe.SliceData(d))) + uintptr(len(d))
	page := uintptr(unix.Getpagesize())
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(d[len(d)-1:]))), (end+page-1)&^(page-1)-end+1)[1:]
}

// lockAt returns the queue's lock at offset off of its data region.
func lockAt(q *queue.Queue, off int) lock.Mutex {
	return lock.At(unsafe.Pointer(&q.Segment().Data()[off]))
}

// forgery is a hostile process's write into a queue's words or ring.
type forgery struct {
	name  string
	forge func(d []byte, capacity uint32)
}

func putWord64(d []byte, off int, count, pos uint32) {
	binary.LittleEndian.PutUint64(d[off:], uint64(count)<<32|uint64(pos))
}

// ringForgeries are values no process that follows the protocol writes:
// positions off the 8-byte grid or more than a ring apart, windows and
// reservations far past the ring, skip records that do not end the lap.
var ringForgeries = []forgery{
	{"tail and head 4 bytes before the ring's end", func(d []byte, c uint32) {
		putWord64(d, offTailWord, 0, c-4)
		putWord64(d, offHeadWord, 0, c-4)
	}},
	{"tail and head 1 byte before the ring's end", func(d []byte, c uint32) {
		putWord64(d, offTailWord, 0, 4*c-1)
		putWord64(d, offHeadWord, 0, 4*c-1)
	}},
	{"head 3 bytes before the ring's end, tail past it", func(d []byte, c uint32) {
		putWord64(d, offTailWord, 1, c+64)
		putWord64(d, offHeadWord, 0, c-3)
	}},
	{"tail off the grid", func(d []byte, c uint32) {
		tail := uint32(binary.LittleEndian.Uint64(d[offTailWord:]))
		putWord64(d, offTailWord, uint32(binary.LittleEndian.Uint64(d[offTailWord:])>>32), tail+5)
	}},
	{"tail more than a ring past head", func(d []byte, c uint32) {
		putWord64(d, offTailWord, 7, c+c/2)
		putWord64(d, offHeadWord, 0, 0)
	}},
	{"head past tail", func(d []byte, c uint32) {
		putWord64(d, offTailWord, 0, 64)
		putWord64(d, offHeadWord, 0, 1<<31)
	}},
	{"a record of huge size at head", func(d []byte, c uint32) {
		head := uint32(binary.LittleEndian.Uint64(d[offHeadWord:]))
		binary.LittleEndian.PutUint32(d[ringOffset+head%c:], 0xFFFFFFF8)
	}},
	{"a skip record at head that does not end the lap", func(d []byte, c uint32) {
		head := uint32(binary.LittleEndian.Uint64(d[offHeadWord:]))
		binary.LittleEndian.PutUint32(d[ringOffset+head%c:], 64)
		d[ringOffset+head%c+4] = typeSkipRecord
	}},
	{"window, window_need, reserved and given_back all ones", func(d []byte, c uint32) {
		binary.LittleEndian.PutUint32(d[offWindowWord:], 0xFFFFFFFF)
		binary.LittleEndian.PutUint32(d[offWindowNeedWord:], 0xFFFFFFFF)
		binary.LittleEndian.PutUint32(d[offReserved:], 0xFFFFFFFF)
		binary.LittleEndian.PutUint32(d[offGivenBack:], 0xFFFFFFFF)
	}},
	{"window_need past the window, off the grid", func(d []byte, c uint32) {
		binary.LittleEndian.PutUint32(d[offWindowNeedWord:], 1<<31-3)
	}},
	{"given_back two laps behind head", func(d []byte, c uint32) {
		head := uint32(binary.LittleEndian.Uint64(d[offHeadWord:]))
		binary.LittleEndian.PutUint32(d[offGivenBack:], head-2*c+8)
	}},
	{"reserved a ring ahead of tail, off the grid", func(d []byte, c uint32) {
		tail := uint32(binary.LittleEndian.Uint64(d[offTailWord:]))
		binary.LittleEndian.PutUint32(d[offReserved:], tail+c-1)
	}},
}

// TestQueueForgedRingWordsNeverFault: a hostile process of the same user
// writes values into a queue's words and ring that no process following
// the protocol writes. Every call on the queue then answers (a message, an
// error, ErrCorrupt) without a panic, a fault or a write past the end of
// the file, and the last holder's close (which walks the ring to give back
// what messages hold) does too.
func TestQueueForgedRingWordsNeverFault(t *testing.T) {
	testenv.SkipShort(t, "runs for seconds")
	makers := map[string]func() (*queue.Queue, error){
		"bounded":   func() (*queue.Queue, error) { return queue.Create("", 64<<10, 0) },
		"unbounded": func() (*queue.Queue, error) { return queue.CreateUnbounded("", 0) },
	}
	for kind, create := range makers {
		for _, f := range ringForgeries {
			t.Run(kind+"/"+f.name, func(t *testing.T) {
				q, err := create()
				require.NoError(t, err)
				closed := false
				defer func() {
					if !closed {
						_ = q.Close()
					}
				}()
				for i := range 3 {
					require.NoError(t, q.Put(bytesRecord(patterned(uint64(i), 100)), time.Now()))
				}
				f.forge(q.Segment().Data(), uint32(len(q.Segment().Data())-ringOffset))
				buf := make([]byte, 4<<20)
				for step := range 6 {
					noPanic(t, fmt.Sprintf("step %d", step), func() {
						_, _ = q.Len()
						_, _ = q.Room()
						_ = q.Put(bytesRecord(patterned(9, step*4000)), time.Now())
						_, _ = q.Get(buf, message.MaxDescriptors, time.Now())
						_, _, _ = q.GetMany(buf, 3, message.MaxDescriptors, time.Now())
						_ = q.Put(bytesRecord(patterned(9, 3<<20)), time.Now())
						_, _ = q.Get(buf, message.MaxDescriptors, time.Now())
					})
				}
				require.Equal(t, make([]byte, len(pastRing(q))), pastRing(q), "nothing written past the end of the file")
				closed = true
				noPanic(t, "Close", func() {
					if err := q.Close(); err != nil {
						require.ErrorIs(t, err, header.ErrCorrupt)
					}
				})
			})
		}
	}
}

// skipUncrossed leaves an empty unbounded queue as a consumer killed in the
// middle of a rewind does (docs/format.md): a skip record written at the
// tail and committed with a store of the tail, and the head not moved past
// it yet. It returns the start of the next lap.
func skipUncrossed(t *testing.T, q *queue.Queue) uint32 {
	t.Helper()
	d := q.Segment().Data()
	tail := uint32(binary.LittleEndian.Uint64(d[offTailWord:]))
	puts := uint32(binary.LittleEndian.Uint64(d[offTailWord:]) >> 32)
	require.Equal(t, tail, uint32(binary.LittleEndian.Uint64(d[offHeadWord:])), "an empty queue")
	off := tail % ringSize
	require.NotZero(t, off)
	require.LessOrEqual(t, off+8, binary.LittleEndian.Uint32(d[offWindowWord:]), "the skip's bytes are reserved")
	binary.LittleEndian.PutUint32(d[ringOffset+off:], ringSize-off)
	binary.LittleEndian.PutUint32(d[ringOffset+off+4:], typeSkipRecord)
	next := tail + ringSize - off
	putWord64(d, offTailWord, puts, next)
	return next
}

// TestUnboundedQueueGetAfterAKilledRewindWaits: a consumer killed between
// the commit of its rewind's skip record and the store that crosses it
// leaves a queue with no message and a skip at its head. The next Get
// crosses the skip and finds the queue empty: it waits, and returns
// ErrEmpty at its deadline or the next message, never a record of 0 bytes
// with no error. (It returned (0, nil).)
func TestUnboundedQueueGetAfterAKilledRewindWaits(t *testing.T) {
	q, err := queue.CreateUnbounded("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	if !q.Unbounded() {
		t.Skip("this kernel cannot reserve pages on demand")
	}
	// Hold the producers' lock through one get so that it does not rewind:
	// the queue is left empty in the middle of its lap.
	putLock := lockAt(q, 64)
	require.NoError(t, q.Put(bytesRecord([]byte("first")), time.Now()))
	ok, err := putLock.TryLock()
	require.NoError(t, err)
	require.True(t, ok)
	buf := make([]byte, 1<<20)
	got, err := getInto(t, q, buf)
	require.NoError(t, putLock.Unlock())
	require.NoError(t, err)
	require.Equal(t, "first", string(got))

	next := skipUncrossed(t, q)
	n, err := q.Get(buf, 0, time.Now())
	require.ErrorIs(t, err, queue.ErrEmpty, "Get took %d bytes", n)
	require.Equal(t, next, uint32(binary.LittleEndian.Uint64(q.Segment().Data()[offHeadWord:])), "the skip was crossed")
	require.Zero(t, qlen(t, q))

	// And a Get that waits takes the next message.
	next = 0
	require.NoError(t, q.Put(bytesRecord([]byte("second")), time.Now()))
	ok, err = putLock.TryLock()
	require.NoError(t, err)
	require.True(t, ok)
	got, err = getInto(t, q, buf)
	require.NoError(t, putLock.Unlock())
	require.NoError(t, err)
	require.Equal(t, "second", string(got))
	skipUncrossed(t, q)
	done := make(chan error, 1)
	go func() {
		n, _, err := q.GetMany(buf, 1, 0, time.Now().Add(time.Minute))
		if err == nil && n != 1 {
			err = errors.New("GetMany returned no record and no error")
		}
		done <- err
	}()
	time.Sleep(20 * time.Millisecond) // let it cross the skip and sleep (not asserted)
	require.NoError(t, q.Put(bytesRecord([]byte("third")), time.Now()))
	require.NoError(t, <-done)
	rec, err := message.DecodeRecord(buf[:binary.LittleEndian.Uint32(buf)])
	require.NoError(t, err)
	require.Equal(t, "third", string(rec.Payload))
}

// TestUnboundedQueueForgedGivenBackKeepsItsMessages: given_back forged to
// laps behind head would have the next get give back the pages of the whole
// ring, the messages still in the queue among them (they read as zeros,
// and the get that met them dropped them all as corrupt). A value no
// consumer stores is not followed: the messages arrive whole (the pages
// the forged word hid stay in use until the ring comes round to them).
func TestUnboundedQueueForgedGivenBackKeepsItsMessages(t *testing.T) {
	q, err := queue.CreateUnbounded("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	if !q.Unbounded() {
		t.Skip("this kernel cannot reserve pages on demand")
	}
	const n, size = 40, 200 << 10 // 8 MB: past the window
	for i := range n {
		require.NoError(t, q.Put(bytesRecord(patterned(uint64(i), size)), time.Now()))
	}
	buf := make([]byte, 1<<20)
	for i := range n / 2 {
		got, err := getInto(t, q, buf)
		require.NoError(t, err)
		require.Equal(t, patterned(uint64(i), size), got)
	}
	d := q.Segment().Data()
	head := uint32(binary.LittleEndian.Uint64(d[offHeadWord:]))
	binary.LittleEndian.PutUint32(d[offGivenBack:], head-2*ringSize+chunkSize)
	for i := n / 2; i < n; i++ {
		got, err := getInto(t, q, buf)
		require.NoError(t, err, "message %d", i)
		require.Equal(t, patterned(uint64(i), size), got, "message %d", i)
	}
}

func init() {
	// queue-rewind-loop attaches the unbounded queue args[0] and, for ever,
	// puts and takes a message that fills most of the warm window and then
	// a small one: every second get rewinds the ring and gives back most of
	// the window's pages. It prints "looping" once the loop has turned.
	testenv.Helpers["queue-rewind-loop"] = func(args []string) error {
		q, err := queue.Attach(args[0])
		if err != nil {
			return err
		}
		big := bytesRecord(make([]byte, queue.WarmWindow-64<<10))
		small := bytesRecord([]byte("small"))
		buf := make([]byte, queue.WarmWindow)
		for i := 0; ; i++ {
			for _, rec := range []*message.Record{big, small} {
				if err := q.Put(rec, time.Time{}); err != nil {
					return err
				}
				if _, err := q.Get(buf, 0, time.Time{}); err != nil {
					return err
				}
			}
			if i == 0 {
				fmt.Println("looping")
			}
		}
	}
}

// TestUnboundedQueueConsumerKilledInItsRewindLeavesNoFault: a consumer is
// SIGKILLed, again and again, at random points of a loop whose gets rewind
// the ring and give back the window's pages. Whatever point it died at,
// the words must not say that a page is reserved which was given back: a
// put into the window on a full file system then reports
// ErrOutOfSharedMemory or succeeds, and never faults. (The rewind gave the
// pages back before it stored the smaller window, so a kill between the
// two left a window whose pages were gone.)
func TestUnboundedQueueConsumerKilledInItsRewindLeavesNoFault(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	dir := testenv.SegmentsOnTmpfs(t, "size=8m")
	q, err := queue.CreateUnbounded("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	if !q.Unbounded() {
		t.Skip("this kernel cannot reserve pages on demand")
	}
	buf := make([]byte, queue.WarmWindow)
	big := patterned(7, queue.WarmWindow-message.RecordHeaderSize)
	rng := rand.New(rand.NewPCG(28, 5))
	for round := range 150 {
		h := testenv.StartHelper(t, "queue-rewind-loop", q.Segment().Name())
		require.Equal(t, "looping", h.ReadLine(t))
		time.Sleep(time.Duration(rng.IntN(4000)) * time.Microsecond)
		require.NoError(t, h.Cmd.Process.Signal(unix.SIGKILL))
		require.Error(t, h.Cmd.Wait())
		_, err := q.Segment().DropRef() // the killed helper's count
		require.NoError(t, err)

		// Take what it left, then put into the whole window with no room
		// left on the file system.
		for {
			n, err := q.Get(buf, 0, time.Now())
			if errors.Is(err, queue.ErrEmpty) {
				break
			}
			require.NoError(t, err, "round %d", round)
			require.NotZero(t, n, "round %d", round)
		}
		removeFiller := fillDir(t, dir, 0)
		err = putNoFault(t, q, big)
		if err != nil {
			require.ErrorIs(t, err, shm.ErrOutOfSharedMemory, "round %d", round)
		}
		removeFiller()
		for qlen(t, q) > 0 {
			got, err := getInto(t, q, buf)
			require.NoError(t, err, "round %d", round)
			require.Equal(t, big, got, "round %d", round)
		}
	}
}

// TestUnboundedQueueFullFileSystemAtEveryStep: an unbounded queue on a
// small file system that fills and empties at random between its calls,
// from positions near 2^31 and 2^32, with messages from 0 bytes to past
// the warm window. A put that finds no room reports ErrOutOfSharedMemory
// and changes nothing; none faults; every message put arrives once, in
// order; and the ring's words account for every page it holds.
func TestUnboundedQueueFullFileSystemAtEveryStep(t *testing.T) {
	testenv.SkipShort(t, "runs for seconds")
	dir := testenv.SegmentsOnTmpfs(t, "size=12m")
	for i, start := range ringStarts {
		t.Run(fmt.Sprint(start), func(t *testing.T) { fullFileSystemAtEveryStep(t, dir, uint64(i), start) })
	}
}

func fullFileSystemAtEveryStep(t *testing.T, dir string, seed uint64, start uint32) {
	{
		q, err := queue.CreateUnbounded("", 0)
		require.NoError(t, err)
		defer func() { require.NoError(t, q.Close()) }()
		if !q.Unbounded() {
			t.Skip("this kernel cannot reserve pages on demand")
		}
		startAt(t, q, start&^7)
		rng := rand.New(rand.NewPCG(seed, 12))
		var items [][]byte
		seq, full, refused := uint64(0), func() {}, 0
		filled := false
		buf := make([]byte, 4<<20)
		for step := range 150 {
			switch op := rng.IntN(10); {
			case op < 4:
				var size int
				switch rng.IntN(4) {
				case 0:
					size = rng.IntN(64)
				case 1:
					size = rng.IntN(256 << 10)
				case 2:
					size = queue.WarmWindow - message.RecordHeaderSize
				default:
					size = 1<<20 + rng.IntN(1536<<10)
				}
				p := patterned(seq, size)
				seq++
				before := qlen(t, q)
				if err := putNoFault(t, q, p); err != nil {
					require.ErrorIs(t, err, shm.ErrOutOfSharedMemory, "step %d", step)
					require.Equal(t, before, qlen(t, q), "a refused put leaves nothing")
					refused++
					break
				}
				items = append(items, p)
			case op < 7:
				var got []byte
				noPanic(t, "Get", func() { got, err = getInto(t, q, buf) })
				if len(items) == 0 {
					require.ErrorIs(t, err, queue.ErrEmpty, "step %d", step)
					break
				}
				require.NoError(t, err, "step %d", step)
				require.Equal(t, items[0], got, "step %d", step)
				items = items[1:]
			case op < 9:
				if filled {
					full()
				} else {
					full = fillDir(t, dir, int64(rng.IntN(3<<20)))
				}
				filled = !filled
			default:
				for len(items) > 0 {
					got, err := getInto(t, q, buf)
					require.NoError(t, err)
					require.Equal(t, items[0], got)
					items = items[1:]
				}
			}
			require.Equal(t, len(items), qlen(t, q), "step %d", step)
			ringPages(t, q)
		}
		if filled {
			full()
		}
		for len(items) > 0 {
			got, err := getInto(t, q, buf)
			require.NoError(t, err)
			require.Equal(t, items[0], got)
			items = items[1:]
		}
		t.Logf("%d puts refused", refused)
	}
}
