package queue_test

// Attacks on the put step's sends (plane.Send; package buffer, Note
// [counts that wait]) below PutSending: a put of many records runs the
// sends of those it commits and no others; a send of a ticket past its
// arena is refused before anything is done; a ticket arena whose file
// shrank faults before any count changes hands.

import (
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/queue"
	"golang.org/x/sys/unix"
)

// parts returns n bytes records for the plane's put, record i carrying
// sends[i].
func parts(n int, sends func(i int) []plane.Send) []plane.Record {
	recs := make([]plane.Record, n)
	for i := range recs {
		rec := bytesRecord([]byte{byte(i), 1, 2, 3})
		prefix, payload := rec.Parts()
		recs[i] = plane.Record{Prefix: prefix, Payload: payload, Size: uint32(rec.Size()), Sends: sends(i)}
	}
	return recs
}

// A put of five records, each handing a count over, into a queue with
// room for three: the three it commits have their tickets armed, and the
// two that did not fit none (their counts are their senders' still).
func TestAPutOfManyRunsOnlyTheSendsOfThoseItCommits(t *testing.T) {
	q := mustQueue(t, 4096, 3)
	k := newTickets(t, 10)
	recs := parts(5, func(i int) []plane.Send {
		// Two counts a record: tickets 2i and 2i+1.
		return append(k.send(2*i), k.send(2*i+1)...)
	})
	var out plane.Out
	require.Equal(t, plane.OK, queue.PlaneOf(q).Put(recs, 0, &out))
	require.Equal(t, 3, plane.Count(&out))
	for i := range 10 {
		require.Equal(t, i < 6, k.armed(i), "ticket %d", i)
	}
	require.Equal(t, 3, qlen(t, q))
	// The rest, put again once there is room, arm theirs then.
	_, err := getInto(t, q, make([]byte, 4096))
	require.NoError(t, err)
	require.Equal(t, plane.OK, queue.PlaneOf(q).Put(recs[3:], 0, &out))
	require.Equal(t, 1, plane.Count(&out))
	require.True(t, k.armed(6) && k.armed(7))
	require.False(t, k.armed(8) || k.armed(9))
}

// A send whose ticket lies past its arena's slots, in any record of the
// put, is refused (Range) before anything is done: no record put, no
// ticket armed, the put lock free for the next put.
func TestASendPastItsArenaIsRefusedBeforeAnything(t *testing.T) {
	q := mustQueue(t, 4096, 0)
	k := newTickets(t, 4)
	past := plane.NewSend(nil, -1, &k.arena, 4, 99)
	small := plane.NewArena(unsafe.Pointer(&k.mem[0]), 4, 0, 4) // slots too small for a ticket
	tooSmall := plane.NewSend(nil, -1, &small, 0, 99)
	for _, bad := range []plane.Send{past, tooSmall} {
		recs := parts(3, func(i int) []plane.Send {
			if i == 2 {
				return append(k.send(i), bad)
			}
			return k.send(i)
		})
		var out plane.Out
		require.Equal(t, plane.Range, queue.PlaneOf(q).Put(recs, 0, &out))
		for i := range 4 {
			require.False(t, k.armed(i), "ticket %d", i)
		}
		require.Zero(t, qlen(t, q))
		err := q.PutSending(bytesRecord([]byte("x")), time.Now(), []plane.Send{bad})
		require.Error(t, err)
		require.Zero(t, qlen(t, q))
	}
	require.NoError(t, q.PutSending(bytesRecord([]byte("x")), time.Now(), k.send(3)), "the put lock is free")
	require.True(t, k.armed(3))
}

// A ticket arena whose file shrank under the put faults in the reads of
// its ticket words, before any send runs: a plain fault (not
// ErrSendsFaulted, whose counts would be lost), nothing put, no ticket of
// a mapped arena armed, and the put lock let go.
func TestAShrunkTicketArenaFaultsBeforeAnySend(t *testing.T) {
	q := mustQueue(t, 4096, 0)
	fd, err := unix.MemfdCreate("tickets", 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Ftruncate(fd, 4096))
	mem, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer func() { require.NoError(t, unix.Munmap(mem)) }()
	shrunk := plane.NewArena(unsafe.Pointer(&mem[0]), 8, 0, 4)
	require.NoError(t, unix.Ftruncate(fd, 0))
	k := newTickets(t, 2)
	// The good send first: it must not run when a later one faults.
	recs := parts(2, func(i int) []plane.Send {
		if i == 1 {
			return []plane.Send{plane.NewSend(nil, -1, &shrunk, 1, 5)}
		}
		return k.send(0)
	})
	var out plane.Out
	require.Equal(t, plane.Fault, queue.PlaneOf(q).Put(recs, 0, &out))
	_, _, what := plane.Need(&out)
	require.NotEqual(t, plane.InSends, what, "the fault came before any count changed hands")
	require.False(t, k.armed(0))
	require.Zero(t, qlen(t, q))
	err = q.PutSending(bytesRecord([]byte("x")), time.Now(), []plane.Send{plane.NewSend(nil, -1, &shrunk, 0, 5)})
	require.Error(t, err)
	require.NotErrorIs(t, err, queue.ErrSendsFaulted)
	require.Zero(t, qlen(t, q))
	require.NoError(t, q.PutSending(bytesRecord([]byte("x")), time.Now(), k.send(1)), "the put lock was let go")
	require.True(t, k.armed(1))
}
