package queue_test

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

// Offsets of a version 3 ring's window words (docs/format.md, "Queues").
const (
	offWindowWord = 108
	ringOffset    = 512
	ringSize      = 1 << 30
	chunkSize     = 2 << 20
)

// startAt moves a new, empty unbounded queue's positions to start (a
// multiple of 8), as if that many bytes had passed: the test's way to reach
// positions near and past 2^31 and 2^32 at once. It writes the words the
// format gives them, as a queue at that position would hold them.
func startAt(t *testing.T, q *queue.Queue, start uint32) {
	t.Helper()
	require.Zero(t, start%8)
	d := q.Segment().Data()
	binary.LittleEndian.PutUint64(d[offTailWord:], uint64(start))
	binary.LittleEndian.PutUint64(d[offHeadWord:], uint64(start))
	binary.LittleEndian.PutUint32(d[offReserved:], start)
	binary.LittleEndian.PutUint32(d[offGivenBack:], start&^(chunkSize-1))
}

// ringPages checks the invariants of an unbounded ring's words and its
// memory: positions within a ring of each other, the window within its
// bound, and every page of the ring that holds memory one the words say is
// reserved (the window's, or those of positions from given_back to
// reserved): no page was ever written before it was reserved, and none
// was left behind.
func ringPages(t *testing.T, q *queue.Queue) {
	t.Helper()
	d := q.Segment().Data()
	tail := uint32(binary.LittleEndian.Uint64(d[offTailWord:]))
	head := uint32(binary.LittleEndian.Uint64(d[offHeadWord:]))
	reserved := binary.LittleEndian.Uint32(d[offReserved:])
	givenBack := binary.LittleEndian.Uint32(d[offGivenBack:])
	window := binary.LittleEndian.Uint32(d[offWindowWord:])
	require.LessOrEqual(t, tail-head, uint32(ringSize), "tail within a ring of head")
	require.LessOrEqual(t, head-givenBack, uint32(ringSize), "given_back at most a ring behind head")
	dist := int64(int32(reserved - tail))
	require.LessOrEqual(t, dist, int64(ringSize), "reserved within a ring of tail")
	require.GreaterOrEqual(t, dist, -int64(ringSize+queue.WarmWindow), "reserved within a ring of tail")
	require.LessOrEqual(t, window, uint32(queue.WarmWindow))

	page := uintptr(unix.Getpagesize())
	ring := d[ringOffset:]
	base := uintptr(unsafe.Pointer(&ring[0]))
	first := base &^ (page - 1)
	mapped := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(&ring[0]), -int(base-first))), base-first+ringSize)
	vec := make([]byte, (len(mapped)+int(page)-1)/int(page))
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mapped[0])), uintptr(len(mapped)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	// allowed reports whether a page overlaps ring offsets [from, to).
	allowed := make([]bool, len(vec))
	mark := func(from, to uint32) {
		if to <= from {
			return
		}
		for p := (base + uintptr(from) - first) / page; p <= (base+uintptr(to)-1-first)/page; p++ {
			allowed[p] = true
		}
	}
	allowed[0] = true // the queue's words share it
	// The ring starts 512 bytes into its data region, so a page may straddle
	// a chunk's boundary; consumers keep it, as the next lap's producers may
	// write its bytes before the boundary (docs/format.md).
	for c := uint32(chunkSize); c < ringSize; c += chunkSize {
		if (base+uintptr(c))%page != 0 {
			allowed[(base+uintptr(c)-first)/page] = true
		}
	}
	mark(0, window)
	if n := reserved - givenBack; int32(n) > 0 {
		n = min(n, ringSize)
		from := givenBack % ringSize
		if from+n <= ringSize {
			mark(from, from+n)
		} else {
			mark(from, ringSize)
			mark(0, from+n-ringSize)
		}
	}
	for p, v := range vec {
		if v&1 != 0 && !allowed[p] {
			t.Fatalf("ring page %d (offset %d) holds memory no word says is reserved (tail %d head %d reserved %d given_back %d window %d)",
				p, uintptr(p)*page+first-base, tail, head, reserved, givenBack, window)
		}
	}
}

// runUnboundedModel drives an unbounded queue whose positions start at
// start with the operations ops encodes (three bytes each: what, and a
// 16-bit argument) and checks every answer against a FIFO model, and the
// ring's words and pages after every operation.
func runUnboundedModel(t *testing.T, start uint32, ops []byte) {
	q, err := queue.CreateUnbounded("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	if !q.Unbounded() {
		t.Skip("this kernel cannot reserve pages on demand")
	}
	startAt(t, q, start&^7)
	var items [][]byte
	held, seq := 0, uint64(0)
	buf := make([]byte, 8<<20)
	put := func(n int) {
		if held+recordSize(n) > 48<<20 {
			return // the model's own bound on memory
		}
		p := patterned(seq, n)
		require.NoError(t, q.Put(bytesRecord(p), time.Now()), "put of %d bytes", n)
		items = append(items, p)
		held += recordSize(n)
		seq++
	}
	take := func() {
		got, err := getInto(t, q, buf)
		if len(items) == 0 {
			require.ErrorIs(t, err, queue.ErrEmpty)
			return
		}
		require.NoError(t, err)
		require.Equal(t, items[0], got, "FIFO, whole")
		held -= recordSize(len(items[0]))
		items = items[1:]
	}
	for len(ops) >= 3 {
		what, arg := ops[0]%8, int(binary.LittleEndian.Uint16(ops[1:]))
		ops = ops[3:]
		switch what {
		case 0, 1: // one record of a size from 0 bytes to past the window
			switch arg % 4 {
			case 0:
				put(arg % 512)
			case 1:
				put(arg % 2048 * 64)
			case 2:
				put(arg % 64 * (64 << 10))
			case 3:
				put(queue.WarmWindow - message.RecordHeaderSize - arg%16*8)
			}
		case 2, 3:
			take()
		case 4: // several at once
			n, filled, err := q.GetMany(buf, arg%5+1, 0, time.Now())
			if len(items) == 0 {
				require.ErrorIs(t, err, queue.ErrEmpty)
				break
			}
			require.NoError(t, err)
			at := 0
			for range n {
				size := int(binary.LittleEndian.Uint32(buf[at:]))
				rec, err := message.DecodeRecord(buf[at : at+size])
				require.NoError(t, err)
				require.Equal(t, items[0], rec.Payload)
				held -= recordSize(len(items[0]))
				items = items[1:]
				at += size
			}
			require.Equal(t, filled, at)
		case 5: // a batch of small records
			recs := make([]*message.Record, 1+arg%6)
			for i := range recs {
				recs[i] = bytesRecord(patterned(seq+uint64(i), arg*(i+1)%300))
			}
			n, err := q.PutMany(recs, time.Now())
			require.NoError(t, err)
			require.Equal(t, len(recs), n)
			for _, r := range recs {
				items = append(items, r.Payload)
				held += recordSize(len(r.Payload))
			}
			seq += uint64(len(recs))
		case 6:
			for len(items) > 0 {
				take()
			}
		case 7: // a size that skips a lap when the queue is empty
			put(1536 << 10)
		}
		require.Equal(t, len(items), qlen(t, q), "Len")
		ringPages(t, q)
	}
	for len(items) > 0 {
		take()
	}
	ringPages(t, q)
}

// ringStarts are positions near the edges of 32-bit arithmetic.
var ringStarts = []uint32{0, 1<<31 - 3<<20, 1<<31 - 8, 1 << 31, 3<<30 + 1536<<10, 1<<32 - 5<<20, 1<<32 - 8}

func TestUnboundedRingModel(t *testing.T) {
	testenv.SkipShort(t, "runs for seconds")
	for i, start := range ringStarts {
		rng := rand.New(rand.NewPCG(uint64(i), 28))
		ops := make([]byte, 3*150)
		for j := range ops {
			ops[j] = byte(rng.Uint32())
		}
		runUnboundedModel(t, start, ops)
	}
}

// FuzzRing drives an unbounded ring from any start position with any
// operations (runUnboundedModel); testdata/fuzz/FuzzRing holds its seeds,
// which plain go test runs.
func FuzzRing(f *testing.F) {
	for _, start := range ringStarts {
		f.Add(start, []byte{7, 0, 0, 2, 0, 0, 7, 0, 0, 2, 0, 0, 7, 0, 0, 0, 3, 0, 1, 2, 0})
	}
	f.Fuzz(func(t *testing.T, start uint32, ops []byte) {
		if len(ops) > 3*200 {
			ops = ops[:3*200]
		}
		runUnboundedModel(t, start, ops)
	})
}
