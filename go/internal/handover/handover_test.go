package handover_test

import (
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/ledger"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

func mustQueue(t *testing.T, capacity, maxItems uint64) *queue.Queue {
	t.Helper()
	q, err := queue.Create("", capacity, maxItems)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	return q
}

func mustPool(t *testing.T) *pool.Pool {
	t.Helper()
	p := pool.New(64 << 20)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// tensor returns a tensor record of four float32s in a fresh slot of p,
// which holds want, and the ref whose count it carries.
func tensor(t *testing.T, p *pool.Pool, want float32) (*message.Record, *buffer.Ref) {
	t.Helper()
	s, err := p.Alloc(16, time.Time{})
	require.NoError(t, err)
	for i := range 4 {
		binary.LittleEndian.PutUint32(s.Data()[4*i:], uint32(want)+uint32(i))
	}
	r := buffer.NewSlotRef(s)
	d, err := r.Describe(0, dtype.Float32, []int64{4}, []int64{4}, 0)
	require.NoError(t, err)
	return &message.Record{Type: message.TypeTensor, Descriptors: []message.Descriptor{d}}, r
}

// putTensor puts a tensor record of p's (tensor) into q, its count with it.
func putTensor(t *testing.T, p *pool.Pool, q *queue.Queue, want float32) {
	t.Helper()
	rec, r := tensor(t, p, want)
	_, err := handover.Put(q, rec, []*buffer.Ref{r}, time.Time{})
	require.NoError(t, err)
}

// getRaw takes q's next record, with room for views views.
func getRaw(t *testing.T, q *queue.Queue, views int) []byte {
	t.Helper()
	buf := make([]byte, q.Capacity())
	n, err := q.Get(buf, views, time.Now())
	require.NoError(t, err)
	return buf[:n]
}

// take takes the next record of q and decodes it.
func take(t *testing.T, q *queue.Queue) handover.Message {
	t.Helper()
	var m handover.Message
	require.NoError(t, m.Decode(getRaw(t, q, message.MaxDescriptors)))
	return m
}

// qlen returns the queue's message count.
func qlen(t *testing.T, q *queue.Queue) int {
	t.Helper()
	n, err := q.Len()
	require.NoError(t, err)
	return n
}

func TestPutThenAdoptHandsTheCountOver(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 4096, 0)
	rec, r := tensor(t, p, 7)
	sent, err := handover.Put(q, rec, []*buffer.Ref{r}, time.Time{})
	require.NoError(t, err)
	require.True(t, sent)
	require.EqualValues(t, 1, p.Stats().SlotsInUse, "the message holds the slot's count")

	m := take(t, q)
	require.EqualValues(t, message.TypeTensor, m.Type)
	require.Empty(t, m.Views, "no count is taken before Adopt")
	require.NoError(t, m.Adopt())
	require.Len(t, m.Views, 1)
	require.Equal(t, 1, m.NumViews())
	v := m.Views[0]
	require.NotNil(t, v.Ref)
	require.Equal(t, []int64{4}, v.Shape)
	require.Equal(t, []int64{4}, v.Strides)
	require.EqualValues(t, 8, binary.LittleEndian.Uint32(v.Data[4:]))
	n, err := v.Ref.Holders()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "one count, handed over")
	require.NoError(t, m.Release())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

func TestAFailedPutLeavesTheCountsTheCallers(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 4096, 1)
	_, err := handover.Put(q, &message.Record{Type: message.TypeBytes, Payload: []byte("full")}, nil, time.Time{})
	require.NoError(t, err)
	rec, r := tensor(t, p, 1)
	sent, err := handover.Put(q, rec, []*buffer.Ref{r}, time.Now())
	require.ErrorIs(t, err, queue.ErrFull)
	require.False(t, sent)
	n, err := r.Holders()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.NoError(t, r.Release(), "the caller's still, to release")
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

// One count given for two descriptors of a record is refused before
// anything is sent, few refs or many: the count stays the caller's.
func TestOneCountForTwoDescriptorsIsABadArgument(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 1<<16, 0)
	for _, n := range []int{2, 9, 40} {
		rec, r := tensor(t, p, 1)
		others := make([]*buffer.Ref, 0, n-2)
		rec.Type = message.TypePickle
		rec.Payload = []byte("\x80\x05N.")
		for range n - 2 {
			o, or := tensor(t, p, 2)
			rec.Descriptors = append(rec.Descriptors, o.Descriptors[0])
			others = append(others, or)
		}
		rec.Descriptors = append(rec.Descriptors, rec.Descriptors[0]) // the first again, its count with it
		refs := append(append([]*buffer.Ref{r}, others...), r)
		sent, err := handover.Put(q, rec, refs, time.Time{})
		require.ErrorIs(t, err, unix.EINVAL, "%d descriptors", n)
		require.False(t, sent)
		items, err := q.Len()
		require.NoError(t, err)
		require.Zero(t, items)
		for _, o := range append(others, r) {
			require.NoError(t, o.Release(), "the caller's still, to release")
		}
	}
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

// A record its sender made wrong is a bad argument, never corrupt data,
// and a record whose counts do not match its descriptors is refused.
func TestARecordMadeWrongIsABadArgument(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 4096, 0)
	rec, r := tensor(t, p, 1)
	defer func() { require.NoError(t, r.Release()) }()
	rec.Payload = []byte("a tensor record has none")
	for name, put := range map[string]func() (bool, error){
		"payload":    func() (bool, error) { return handover.Put(q, rec, []*buffer.Ref{r}, time.Now()) },
		"no counts":  func() (bool, error) { return handover.Put(q, rec, nil, time.Now()) },
		"two counts": func() (bool, error) { return handover.Put(q, rec, []*buffer.Ref{r, r}, time.Now()) },
	} {
		t.Run(name, func(t *testing.T) {
			sent, err := put()
			require.False(t, sent)
			require.ErrorIs(t, err, unix.EINVAL)
			require.NotErrorIs(t, err, message.ErrMalformed)
		})
	}
	require.Zero(t, qlen(t, q))
}

// Inline and Put refuse an inline array made wrong, as a bad argument.
func TestInlineChecksItsArguments(t *testing.T) {
	tests := []struct {
		name  string
		dt    dtype.DType
		flags uint8
		shape []int64
		data  []byte
		want  error
	}{
		{"unknown dtype", dtype.DType(99), 0, []int64{1}, make([]byte, 1), dtype.ErrUnsupported},
		{"negative dimension", dtype.Uint8, 0, []int64{-1}, nil, unix.EINVAL},
		{"too few bytes", dtype.Float32, 0, []int64{3}, make([]byte, 8), unix.EINVAL},
		{"too many bytes", dtype.Float32, 0, []int64{3}, make([]byte, 16), unix.EINVAL},
		{"flags", dtype.Uint8, 8, []int64{1}, make([]byte, 1), unix.EINVAL},
		{"ndim past 32", dtype.Uint8, 0, make([]int64, 33), nil, unix.EINVAL},
	}
	q := mustQueue(t, 4096, 0)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, err := handover.Inline(tt.dt, tt.flags, tt.shape, tt.data)
			if err == nil {
				var sent bool
				sent, err = handover.Put(q, &rec, nil, time.Now())
				require.False(t, sent)
			}
			require.ErrorIs(t, err, tt.want)
			require.NotErrorIs(t, err, message.ErrMalformed)
		})
	}
	require.Zero(t, qlen(t, q))
}

// An inline record written from its array is byte for byte the record of
// its encoded payload (docs/format.md, "inline"), and a get gives its
// array as a view that lies in the record and holds no count.
func TestInlineRecordIsTheFormats(t *testing.T) {
	shape := []int64{2, 3}
	data := make([]byte, 24)
	for i := range data {
		data[i] = byte(i)
	}
	const torch = 1 // the flags: rebuild as a torch tensor
	rec, err := handover.Inline(dtype.Float32, torch, shape, data)
	require.NoError(t, err)
	payload := make([]byte, message.InlineHeaderSize+8*len(shape)+len(data))
	copy(payload[message.EncodeInline(payload, dtype.Float32, torch, shape):], data)
	encoded := message.Record{Type: message.TypeInline, Payload: payload}
	require.Equal(t, encoded.Size(), rec.Size())
	a, b := make([]byte, rec.Size()), make([]byte, encoded.Size())
	rec.Encode(a)
	encoded.Encode(b)
	require.Equal(t, b, a)

	q := mustQueue(t, 4096, 0)
	sent, err := handover.Put(q, &rec, nil, time.Time{})
	require.NoError(t, err)
	require.True(t, sent)
	_, err = q.Get(make([]byte, 4096), 0, time.Now())
	var re *queue.RangeError
	require.ErrorAs(t, err, &re, "an inline record's array is a view: it needs room for one")
	require.Equal(t, 1, re.Views)

	m := take(t, q)
	require.NoError(t, m.Adopt(), "nothing to adopt")
	require.EqualValues(t, message.TypeInline, m.Type)
	require.Equal(t, payload, m.Payload)
	require.Equal(t, message.RecordHeaderSize, m.PayloadAt)
	require.Equal(t, 1, m.NumViews())
	require.Empty(t, m.Views, "no descriptor")
	require.Equal(t, data, m.Inline.Data)
	require.Equal(t, message.RecordHeaderSize+message.InlineHeaderSize+8*len(shape), m.InlineAt)
	require.Equal(t, shape, m.Inline.Shape)
	require.Equal(t, []int64{12, 4}, m.Inline.Strides())
	require.EqualValues(t, torch, m.Inline.Flags)
	require.NoError(t, m.Release())
}

func TestARecordLargerThanTheQueueIsRefused(t *testing.T) {
	q := mustQueue(t, 4096, 0)
	rec, err := handover.Inline(dtype.Uint8, 0, []int64{4096}, make([]byte, 4096))
	require.NoError(t, err)
	sent, err := handover.Put(q, &rec, nil, time.Time{})
	require.False(t, sent)
	require.ErrorIs(t, err, queue.ErrTooLarge)
}

// AdoptAll takes every count of each message a get took, or none of
// that message's: a replayed descriptor (its count taken before) fails
// its message alone, and the message before it keeps its view.
func TestAdoptAllIsAllOrNoneForEachMessage(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 4096, 0)
	for i := range 2 {
		putTensor(t, p, q, float32(i))
	}
	buf := make([]byte, 4096)
	n, size, err := q.GetMany(buf, 2, message.MaxDescriptors, time.Now())
	require.NoError(t, err)
	require.Equal(t, 2, n)
	msgs, err := handover.DecodeRun(buf[:size], n)
	require.NoError(t, err)
	second := msgs[1]
	require.NoError(t, second.Adopt()) // taken first, elsewhere: a replay for the run
	err = handover.AdoptAll(msgs)
	require.ErrorIs(t, err, pool.ErrTaken)
	require.Len(t, msgs[0].Views, 1)
	require.Empty(t, msgs[1].Views)
	require.Zero(t, msgs[1].Type, "refused as a record that does not decode")
	require.EqualValues(t, 2, p.Stats().SlotsInUse)
	require.NoError(t, second.Release())
	require.NoError(t, msgs[0].Release())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

func TestDropGivesUpWhatAMessageCarries(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 4096, 0)
	rec, r := tensor(t, p, 1)
	rec.Type, rec.Payload = message.TypePickle, []byte("\x80\x05N.")
	_, err := handover.Put(q, rec, []*buffer.Ref{r}, time.Time{})
	require.NoError(t, err)
	m := take(t, q)
	require.Equal(t, []byte("\x80\x05N."), m.Payload)
	require.NoError(t, m.Drop())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

// DecodeRun goes on past a record that fails to decode, which keeps only
// its size, and says why it failed.
func TestDecodeRunGoesPastABadRecord(t *testing.T) {
	q := mustQueue(t, 4096, 0)
	for _, b := range []string{"one", "two", "three"} {
		_, err := handover.Put(q, &message.Record{Type: message.TypeBytes, Payload: []byte(b)}, nil, time.Time{})
		require.NoError(t, err)
	}
	buf := make([]byte, 4096)
	n, size, err := q.GetMany(buf, 3, 0, time.Now())
	require.NoError(t, err)
	buf[24+4] = 9 // the second record's type
	msgs, err := handover.DecodeRun(buf[:size], n)
	require.ErrorIs(t, err, message.ErrMalformed)
	require.Equal(t, "one", string(msgs[0].Payload))
	require.Zero(t, msgs[1].Type)
	require.Equal(t, 24, msgs[1].Bytes)
	require.Equal(t, "three", string(msgs[2].Payload))
	require.Equal(t, message.RecordHeaderSize, msgs[2].PayloadAt)
}

// Puts and takes from several goroutines at once hand every count over
// once: when they are done, no slot is in use.
func TestConcurrentPutsAndTakes(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 64<<10, 0)
	const producers, each = 4, 200
	var wg sync.WaitGroup
	errs := make(chan error, 2*producers)
	for range producers {
		wg.Go(func() {
			for i := range each {
				s, err := p.Alloc(16, time.Time{})
				if err != nil {
					errs <- err
					return
				}
				r := buffer.NewSlotRef(s)
				d, err := r.Describe(0, dtype.Uint8, []int64{16}, []int64{1}, 0)
				var rec *message.Record
				if err == nil {
					rec = &message.Record{Type: message.TypeTensor, Descriptors: []message.Descriptor{d}}
					if i%2 == 0 {
						rec.Type, rec.Payload = message.TypePickle, []byte{byte(i)}
					}
					_, err = handover.Put(q, rec, []*buffer.Ref{r}, time.Time{})
				}
				if err != nil {
					errs <- errors.Join(err, r.Release())
					return
				}
			}
		})
		wg.Go(func() {
			buf := make([]byte, 4096)
			for range each {
				if err := takeAndRelease(q, buf, 1); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

// withLedger gives the test process a ledger until the test ends, and
// returns what says whether it records the count of a slot's descriptor.
func withLedger(t *testing.T) func(d message.Descriptor) func() bool {
	t.Helper()
	led, err := ledger.Enable()
	require.NoError(t, err)
	m, err := shm.Map(led.Name(), header.KindLedger)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, m.Unmap())
		require.NoError(t, led.Close())
	})
	return func(d message.Descriptor) func() bool {
		return func() bool {
			for _, e := range ledger.Entries(m.Data()) {
				if e.State == ledger.Slot && e.Name == d.Name && e.Index == d.Slot && e.Gen == d.Generation {
					return true
				}
			}
			return false
		}
	}
}

// A put that waits for room keeps the counts it sends in the ledger while
// it waits (package buffer, Note [counts that wait]): a sender killed then
// has them given up for it. Once room comes, the put goes, the message
// holds the count, and the ledger no longer does.
func TestAPutThatWaitsKeepsItsCountsInTheLedger(t *testing.T) {
	ledgerOn := withLedger(t)
	p := mustPool(t)
	q := mustQueue(t, 4096, 1)
	bytesRecord(t, q, "full")
	rec, r := tensor(t, p, 7)
	holds := ledgerOn(rec.Descriptors[0])
	require.True(t, holds(), "a count not yet sent is in the ledger")
	done := make(chan error, 1)
	go func() {
		_, err := handover.Put(q, rec, []*buffer.Ref{r}, time.Time{})
		done <- err
	}()
	for range 20 { // it waits for room, looked at again and again
		time.Sleep(5 * time.Millisecond)
		require.True(t, holds(), "the count a waiting put sends left the ledger")
		select {
		case err := <-done:
			t.Fatalf("the put into a full queue returned: %v", err)
		default:
		}
	}
	require.Equal(t, 1, qlen(t, q))
	getRaw(t, q, 0) // the "full" message: room comes
	require.NoError(t, <-done)
	require.False(t, holds(), "a count the message holds is still in the ledger")
	msg := take(t, q)
	require.NoError(t, msg.Adopt())
	require.True(t, holds(), "the taker's count is in its ledger")
	require.NoError(t, msg.Release())
	require.False(t, holds())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}
