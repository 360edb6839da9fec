package queue_test

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
)

// recordSize is the ring bytes a bytes record of n payload bytes takes.
func recordSize(n int) int { return message.RecordHeaderSize + (n+7)/8*8 }

// patterned returns n payload bytes that start with seq and go on with
// bytes derived from it, so that a torn or misplaced copy is seen.
func patterned(seq uint64, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(seq*31 + uint64(i)*7)
	}
	if n >= 8 {
		binary.LittleEndian.PutUint64(p, seq)
	}
	return p
}

func TestQueueEmptyRingTakesAnyRecord(t *testing.T) {
	t.Parallel()
	// A record that would run past the end of the ring goes on at its
	// start: an empty ring takes any record up to its size, wherever the
	// last one ended.
	for _, tc := range []struct {
		name         string
		capacity     int
		first, then  int // payload bytes
		firstRepeats int
	}{
		{"2000 then 3000 in 4 KiB", 4096, 2000, 3000, 1},
		{"a ring-sized record after an odd offset", 4096, 1000, 4096 - message.RecordHeaderSize, 3},
		{"6 MB then 11 MB in 16 MiB", 16 << 20, 6_000_000, 11_000_000, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := mustQueue(t, uint64(tc.capacity), 0)
			for i := range tc.firstRepeats {
				require.NoError(t, q.Put(bytesRecord(patterned(uint64(i), tc.first)), time.Now()))
				got, err := get(t, q, time.Now())
				require.NoError(t, err)
				require.Equal(t, patterned(uint64(i), tc.first), got)
			}
			require.Zero(t, qlen(t, q))
			require.NoError(t, q.Put(bytesRecord(patterned(99, tc.then)), time.Now()), "an empty ring takes it")
			got, err := get(t, q, time.Now())
			require.NoError(t, err)
			require.Equal(t, patterned(99, tc.then), got, "the wrapped record reads back whole")
		})
	}
}

// ringModel is what a queue should hold: the payloads in it, in order.
type ringModel struct {
	capacity, maxItems int
	items              [][]byte
	bytes              int
}

func (m *ringModel) fits(n int) bool {
	return m.bytes+recordSize(n) <= m.capacity && (m.maxItems == 0 || len(m.items) < m.maxItems)
}

// runRingModel drives the queue with the operations ops encodes (three
// bytes each: what, and a 16-bit size or count) and checks every answer
// against the model: Full exactly when the record cannot fit beside what
// the queue holds, Empty exactly when it holds nothing, Len always, and
// every payload whole and in order.
func runRingModel(t *testing.T, capacity, maxItems int, ops []byte) {
	q, err := queue.Create("", uint64(capacity), uint64(maxItems))
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	m := &ringModel{capacity: q.Capacity(), maxItems: maxItems}
	seq := uint64(0)
	maxPayload := q.Capacity() - message.RecordHeaderSize
	buf := make([]byte, q.Capacity())
	for len(ops) >= 3 {
		what, arg := ops[0]%4, int(binary.LittleEndian.Uint16(ops[1:]))
		ops = ops[3:]
		switch what {
		case 0: // put one record
			n := arg % (maxPayload + 1)
			p := patterned(seq, n)
			err := q.Put(bytesRecord(p), time.Now())
			if m.fits(n) {
				require.NoError(t, err, "a %d-byte record beside %d bytes in a %d-byte ring", recordSize(n), m.bytes, m.capacity)
				m.items = append(m.items, p)
				m.bytes += recordSize(n)
				seq++
			} else {
				require.ErrorIs(t, err, queue.ErrFull, "a %d-byte record beside %d bytes of %d", recordSize(n), m.bytes, m.capacity)
			}
		case 1: // put a batch of small records
			count := 1 + arg%6
			recs := make([]*message.Record, count)
			for i := range recs {
				recs[i] = bytesRecord(patterned(seq+uint64(i), (arg*(i+1))%300))
			}
			n, err := q.PutMany(recs, time.Now())
			want := 0
			for _, r := range recs {
				if !m.fits(len(r.Payload)) {
					break
				}
				m.items = append(m.items, r.Payload)
				m.bytes += recordSize(len(r.Payload))
				want++
			}
			require.Equal(t, want, n, "records appended")
			if want == 0 {
				require.ErrorIs(t, err, queue.ErrFull)
			} else {
				require.NoError(t, err)
			}
			seq += uint64(count)
		case 2: // get one
			got, err := get(t, q, time.Now())
			if len(m.items) == 0 {
				require.ErrorIs(t, err, queue.ErrEmpty)
				break
			}
			require.NoError(t, err)
			require.Equal(t, m.items[0], got, "FIFO, whole")
			m.bytes -= recordSize(len(m.items[0]))
			m.items = m.items[1:]
		case 3: // get up to arg%5+1 into a buffer of arg bytes or more
			room := min(max(arg, message.RecordHeaderSize), len(buf))
			n, filled, err := q.GetMany(buf[:room], arg%5+1, 0, time.Now())
			if len(m.items) == 0 {
				require.ErrorIs(t, err, queue.ErrEmpty)
				break
			}
			var re *queue.RangeError
			if errors.As(err, &re) {
				require.Greater(t, recordSize(len(m.items[0])), room, "only a record that does not fit is left")
				require.Equal(t, recordSize(len(m.items[0])), re.Need)
				break
			}
			require.NoError(t, err)
			at := 0
			for range n {
				size := int(binary.LittleEndian.Uint32(buf[at:]))
				rec, err := message.DecodeRecord(buf[at : at+size])
				require.NoError(t, err)
				require.Equal(t, m.items[0], rec.Payload)
				m.bytes -= recordSize(len(m.items[0]))
				m.items = m.items[1:]
				at += size
			}
			require.Equal(t, filled, at)
		}
		require.Equal(t, len(m.items), qlen(t, q), "Len")
	}
}

func TestQueueRingModel(t *testing.T) {
	testenv.SkipShort(t, "runs for seconds")
	for _, tc := range []struct{ capacity, maxItems int }{{4096, 0}, {4096, 3}, {8192, 0}, {64 << 10, 0}} {
		for seed := range uint64(20) {
			rng := rand.New(rand.NewPCG(seed, uint64(tc.capacity)))
			ops := make([]byte, 3*3000)
			for i := range ops {
				ops[i] = byte(rng.Uint32())
			}
			// Sizes near the ring's own and near its half are what wrap
			// accounting gets wrong: make some of them so.
			for i := 0; i+3 <= len(ops); i += 3 {
				if ops[i]%4 == 0 && rng.IntN(4) == 0 {
					binary.LittleEndian.PutUint16(ops[i+1:], uint16(tc.capacity/(1+rng.IntN(2))-rng.IntN(64)))
				}
			}
			runRingModel(t, tc.capacity, tc.maxItems, ops)
		}
	}
}

func FuzzQueueRing(f *testing.F) {
	f.Add(uint8(0), []byte{0, 0xd0, 0x07, 2, 0, 0, 0, 0xb8, 0x0b, 2, 0, 0})
	f.Add(uint8(3), []byte{1, 5, 0, 0, 0xf0, 0x0f, 3, 0xff, 0xff, 0, 0x10, 0})
	f.Fuzz(func(t *testing.T, maxItems uint8, ops []byte) {
		runRingModel(t, 4096, int(maxItems%8), ops)
	})
}

func TestQueueCloseWakesBlockedCalls(t *testing.T) {
	q, err := queue.Create("", 4096, 1)
	require.NoError(t, err)
	require.NoError(t, q.Put(bytesRecord([]byte("x")), time.Time{}))
	full, err := queue.Attach(q.Segment().Name()) // another handle, the same ring
	require.NoError(t, err)
	defer func() { require.NoError(t, full.Close()) }()

	empty, err := queue.Create("", 4096, 0)
	require.NoError(t, err)
	results := make(chan error, 3)
	go func() { results <- q.Put(bytesRecord([]byte("y")), time.Time{}) }() // full: waits
	go func() { results <- q.Join(time.Time{}) }()                          // a task undone: waits
	go func() {
		_, err := get(t, empty, time.Time{}) // empty: waits
		results <- err
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); require.NoError(t, q.Close()) }()
	go func() { defer wg.Done(); require.NoError(t, empty.Close()) }()
	for range 3 {
		select {
		case err := <-results:
			require.ErrorIs(t, err, queue.ErrClosed)
			require.ErrorIs(t, err, shm.ErrClosed)
		case <-time.After(5 * time.Second):
			t.Fatal("a call blocked on a closed queue did not return")
		}
	}
	wg.Wait()
	require.Less(t, time.Since(start), time.Second, "Close wakes the waiters rather than outwaiting them")

	_, err = q.Len()
	require.ErrorIs(t, err, queue.ErrClosed)
	_, err = q.Unfinished()
	require.ErrorIs(t, err, queue.ErrClosed)
	require.ErrorIs(t, q.Put(bytesRecord([]byte("z")), time.Now()), queue.ErrClosed)
	require.ErrorIs(t, q.TaskDone(), queue.ErrClosed)
	require.ErrorIs(t, q.Close(), queue.ErrClosed, "a second Close")
	n, err := full.Len()
	require.NoError(t, err)
	require.Equal(t, 1, n, "another handle is unaffected")
}

func TestQueueCloseWhileInUse(t *testing.T) {
	// Goroutines put and get as fast as they can while the queue is closed
	// under them: each call either works or says closed, and nothing faults.
	for range 20 {
		q, err := queue.Create("", 4096, 0)
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 4096)
				for {
					var err error
					if i%2 == 0 {
						err = q.Put(bytesRecord(patterned(uint64(i), 100)), time.Now().Add(time.Millisecond))
					} else {
						_, err = q.Get(buf, 0, time.Now().Add(time.Millisecond))
					}
					if errors.Is(err, queue.ErrClosed) {
						return
					}
					if err != nil && !errors.Is(err, queue.ErrFull) && !errors.Is(err, queue.ErrEmpty) {
						errs <- err
						return
					}
				}
			}()
		}
		time.Sleep(2 * time.Millisecond)
		require.NoError(t, q.Close())
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("a call on a queue being closed: %v", err)
		}
	}
}

func TestQueueRefusesAnotherRingVersion(t *testing.T) {
	t.Parallel()
	q := mustQueue(t, 4096, 0)
	data := q.Segment().Data()
	version := (*uint32)(unsafe.Pointer(&data[16]))
	require.EqualValues(t, queue.RingVersion, *version)
	*version = 0 // a ring of zctipc 0.1.0, whose records never wrapped
	_, err := queue.Attach(q.Segment().Name())
	require.ErrorIs(t, err, queue.ErrRingVersion)
	require.ErrorIs(t, err, header.ErrVersion)
	*version = queue.RingVersion
}
