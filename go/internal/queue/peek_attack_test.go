package queue_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

const offDoneWord = 192

// newPeekQueue returns a bounded (16 KiB) or unbounded queue whose counts
// and positions start at count and pos, as if that many messages and bytes
// had passed (the words a queue at that point holds).
func newPeekQueue(t *testing.T, bounded bool, count, pos uint32) *queue.Queue {
	t.Helper()
	var q *queue.Queue
	var err error
	if bounded {
		q, err = queue.Create("", 16<<10, 0)
	} else {
		q, err = queue.CreateUnbounded("", 0)
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	if !bounded {
		startAt(t, q, pos)
	}
	d := q.Segment().Data()
	putWord64(d, offTailWord, count, pos)
	putWord64(d, offHeadWord, count, pos)
	binary.LittleEndian.PutUint32(d[offDoneWord:], count)
	return q
}

func patternedRecord(i int) *message.Record {
	payload := make([]byte, 8+40*(i%7))
	for j := range payload {
		payload[j] = byte(i + 1)
	}
	return bytesRecord(payload)
}

// checkPatterned decodes a peeked record and returns the number its bytes
// all say.
func checkPatterned(t *testing.T, raw []byte) int {
	t.Helper()
	rec, err := message.DecodeRecord(raw)
	require.NoError(t, err)
	for _, c := range rec.Payload {
		require.Equal(t, rec.Payload[0], c, "a record peeked whole")
	}
	return int(rec.Payload[0]) - 1
}

// TestPeekAttackCountsAndPositionsWrap peeks across the 2^32 wrap of the
// message count and of the ring position at once (which is also the ring's
// end): every record shows in order, and records taken are either shown
// whole (a bounded ring keeps them until a producer writes over) or counted.
func TestPeekAttackCountsAndPositionsWrap(t *testing.T) {
	for _, bounded := range []bool{true, false} {
		for _, start := range []struct{ count, pos uint32 }{
			{1<<32 - 3, 1<<32 - 64},
			{1<<31 - 2, 1<<31 - 24},
			{1<<32 - 1, 1<<32 - 8},
		} {
			t.Run(fmt.Sprintf("bounded=%v/count=%#x/pos=%#x", bounded, start.count, start.pos), func(t *testing.T) {
				q := newPeekQueue(t, bounded, start.count, start.pos)
				const n = 12
				for i := range n {
					require.NoError(t, q.Put(patternedRecord(i), time.Time{}))
				}
				require.Equal(t, n, qlen(t, q))
				buf := make([]byte, 4096)
				cursor := queue.PeekOldest
				var first uint64
				for i := range n {
					p, err := q.Peek(cursor, buf)
					require.NoError(t, err, "record %d", i)
					require.Zero(t, p.Missed)
					require.Equal(t, i, checkPatterned(t, buf[:p.Size]))
					require.Equal(t, uint32(p.At>>32), start.count+uint32(i), "the cursor counts messages")
					if i == 0 {
						first = p.At
					}
					cursor = p.Next
				}
				_, err := q.Peek(cursor, buf)
				require.ErrorIs(t, err, queue.ErrEmpty)

				// Consumers take five; the first cursor is now behind.
				for range 5 {
					_, err := q.Get(make([]byte, 4096), 0, time.Time{})
					require.NoError(t, err)
				}
				seen, missed := 0, uint32(0)
				cursor = first
				for {
					p, err := q.Peek(cursor, buf)
					missed += p.Missed
					cursor = p.Next
					if errors.Is(err, queue.ErrEmpty) {
						break
					}
					require.NoError(t, err)
					require.Equal(t, seen+int(missed), checkPatterned(t, buf[:p.Size]), "in order")
					seen++
				}
				require.Equal(t, n, seen+int(missed))
				if !bounded {
					require.Equal(t, uint32(5), missed, "an unbounded ring counts taken records as missed")
				}
				require.Equal(t, n-5, qlen(t, q), "peeking took nothing")
			})
		}
	}
}

// TestPeekAttackForgedCursors passes cursors no Peek returned: each is a
// specific error or a record of the queue, never a panic, a fault or bytes
// that are no record.
func TestPeekAttackForgedCursors(t *testing.T) {
	for _, bounded := range []bool{true, false} {
		t.Run(fmt.Sprintf("bounded=%v", bounded), func(t *testing.T) {
			q := newPeekQueue(t, bounded, 1<<32-2, 1<<32-48)
			for i := range 4 {
				require.NoError(t, q.Put(patternedRecord(i), time.Time{}))
			}
			_, err := q.Get(make([]byte, 4096), 0, time.Time{})
			require.NoError(t, err)
			d := q.Segment().Data()
			gets, head := uint32(binary.LittleEndian.Uint64(d[offHeadWord:])>>32), uint32(binary.LittleEndian.Uint64(d[offHeadWord:]))
			puts, tail := uint32(binary.LittleEndian.Uint64(d[offTailWord:])>>32), uint32(binary.LittleEndian.Uint64(d[offTailWord:]))
			w := func(count, pos uint32) uint64 { return uint64(count)<<32 | uint64(pos) }
			buf := make([]byte, 4096)
			for _, tc := range []struct {
				name   string
				cursor uint64
				want   error // nil: a record of the queue, whole
			}{
				{"ahead by one", w(puts+1, tail+8), unix.EINVAL},
				{"far ahead", w(puts+1000, tail), unix.EINVAL},
				{"ahead by 2^31-1", w(puts+1<<31-1, tail), unix.EINVAL},
				{"off the 8-byte grid", w(gets+1, head+4), unix.EINVAL},
				{"off the grid at head", w(gets, head+3), unix.EINVAL},
				{"off the grid behind head", w(gets, head-3), nil},
				{"far behind", w(gets-1000, head-8000), nil},
				{"behind by 2^31", w(gets-1<<31, head), nil},
				{"a position a ring away", w(gets+1, head+1<<30+8), unix.EINVAL},
				{"a position 2^31 away", w(gets+1, head+1<<31), unix.EINVAL},
				{"inside a record", w(gets+1, head+16), nil},
				{"the tail", w(puts, tail), queue.ErrEmpty},
			} {
				t.Run(tc.name, func(t *testing.T) {
					var p queue.Peeked
					var err error
					noPanic(t, "Peek", func() { p, err = q.Peek(tc.cursor, buf) })
					t.Logf("%s: %+v %v", tc.name, p, err)
					if tc.want != nil {
						require.ErrorIs(t, err, tc.want)
						return
					}
					if err == nil {
						checkPatterned(t, buf[:p.Size])
						return
					}
					// A cursor that is not the queue's may be said to be so,
					// or met as bytes that are no record: never as a torn one.
					require.True(t, errors.Is(err, unix.EINVAL) || errors.Is(err, header.ErrCorrupt), "%v", err)
				})
			}
			require.Equal(t, 3, qlen(t, q), "peeking took nothing")
		})
	}
}

// TestPeekAttackTruncatedRing: another process shrinks the queue's file to
// its words (no ring left): Peek meets the fault as an error.
func TestPeekAttackTruncatedRing(t *testing.T) {
	for _, bounded := range []bool{true, false} {
		t.Run(fmt.Sprintf("bounded=%v", bounded), func(t *testing.T) {
			q := newPeekQueue(t, bounded, 0, 8192)
			require.NoError(t, q.Put(patternedRecord(3), time.Time{}))
			seg := q.Segment()
			fd, err := unix.Open(filepath.Join(shm.Dir(), seg.Name()), unix.O_RDWR, 0)
			require.NoError(t, err)
			defer unix.Close(fd)
			var st unix.Stat_t
			require.NoError(t, unix.Fstat(fd, &st))
			dataAt := st.Size - int64(len(seg.Data()))
			require.NoError(t, unix.Ftruncate(fd, (dataAt+512+4095)&^4095))
			defer func() {
				// The file grows back with zeros where the record was: a
				// consumer drops it as no record, and the queue closes.
				require.NoError(t, unix.Ftruncate(fd, st.Size))
				_, err := q.Get(make([]byte, 4096), 0, time.Time{})
				require.ErrorIs(t, err, header.ErrCorrupt)
			}()
			var perr error
			noPanic(t, "Peek", func() { _, perr = q.Peek(queue.PeekOldest, make([]byte, 4096)) })
			require.ErrorIs(t, perr, fault.ErrFault)
		})
	}
}

// TestPeekAttackSkipAtHead: a producer that finds an unbounded queue empty
// mid-lap (its consumer's rewind left undone) puts its record at the next
// lap, after a skip record at head that no consumer crossed yet. Peek
// shows the messages after it (it returned ErrEmpty, 4096 tries on).
func TestPeekAttackSkipAtHead(t *testing.T) {
	q := newPeekQueue(t, false, 7, 1<<20)
	for i := range 3 {
		require.NoError(t, q.Put(patternedRecord(i), time.Time{}))
	}
	buf := make([]byte, 4096)
	cursor := queue.PeekOldest
	for i := range 3 {
		p, err := q.Peek(cursor, buf)
		require.NoError(t, err)
		require.Equal(t, i, checkPatterned(t, buf[:p.Size]))
		cursor = p.Next
	}
	_, err := q.Peek(cursor, buf)
	require.ErrorIs(t, err, queue.ErrEmpty)
	require.Equal(t, 3, qlen(t, q))
}

// TestPeekAttackTruncatedWords: another process shrinks the queue's file to
// nothing, below its words: Peek and Observe meet the fault as an error.
func TestPeekAttackTruncatedWords(t *testing.T) {
	for _, bounded := range []bool{true, false} {
		t.Run(fmt.Sprintf("bounded=%v", bounded), func(t *testing.T) {
			q := newPeekQueue(t, bounded, 0, 8192)
			require.NoError(t, q.Put(patternedRecord(3), time.Time{}))
			seg := q.Segment()
			fd, err := unix.Open(filepath.Join(shm.Dir(), seg.Name()), unix.O_RDWR, 0)
			require.NoError(t, err)
			defer unix.Close(fd)
			var st unix.Stat_t
			require.NoError(t, unix.Fstat(fd, &st))
			saved := make([]byte, st.Size)
			_, err = unix.Pread(fd, saved, 0)
			require.NoError(t, err)
			require.NoError(t, unix.Ftruncate(fd, 0))
			defer func() {
				_, err := unix.Pwrite(fd, saved, 0) // as it was, for the cleanup
				require.NoError(t, err)
				require.Equal(t, 1, qlen(t, q))
			}()
			var perr, oerr error
			noPanic(t, "Peek", func() { _, perr = q.Peek(queue.PeekOldest, make([]byte, 4096)) })
			require.ErrorIs(t, perr, fault.ErrFault)
			noPanic(t, "Observe", func() { _, oerr = queue.Observe(seg.Data()) })
			require.ErrorIs(t, oerr, fault.ErrFault)
		})
	}
}
