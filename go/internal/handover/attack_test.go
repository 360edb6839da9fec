package handover_test

// Attacks on the hand-over: records that a writer who lies puts in the
// ring (inline headers whose fields say what their bytes are not,
// descriptors replayed or doubled), and runs of records with a bad one
// among good ones.

import (
	"context"
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/queue"
)

var le = binary.LittleEndian

// ringAt is where a queue's ring starts in its segment's data
// (docs/format.md, "Queues").
const ringAt = 512

// forge puts raw, a record of any bytes whose first word is its size (a
// multiple of 8), into q as its next record, as a writer that lies would:
// a bytes record of that size is put, then overwritten in the ring.
func forge(t *testing.T, q *queue.Queue, raw []byte) {
	t.Helper()
	require.Zero(t, len(raw)%8)
	require.GreaterOrEqual(t, len(raw), message.RecordHeaderSize)
	placeholder := message.Record{Type: message.TypeBytes, Payload: make([]byte, len(raw)-message.RecordHeaderSize)}
	require.NoError(t, q.Put(&placeholder, time.Time{}))
	d := q.Segment().Data()
	size := le.Uint64(d[0:])
	tail := uint64(uint32(le.Uint64(d[96:])))
	for i := range raw { // as the ring wraps
		d[ringAt+(tail-uint64(len(raw))+uint64(i))%size] = raw[i]
	}
}

// rawRecord is a record of type typ, claiming ndesc descriptors and a
// payload of plen bytes, whose body is body, padded to a multiple of 8.
func rawRecord(typ uint8, ndesc uint16, plen uint32, body []byte) []byte {
	raw := make([]byte, (message.RecordHeaderSize+len(body)+7)&^7)
	le.PutUint32(raw[0:], uint32(len(raw)))
	raw[4] = typ
	le.PutUint16(raw[6:], ndesc)
	le.PutUint32(raw[8:], plen)
	copy(raw[message.RecordHeaderSize:], body)
	return raw
}

// inlinePayload is an inline array's payload as its header says it,
// true or not: dtype code, flags, ndim, the reserved word, shape, elements.
func inlinePayload(code uint16, flags, ndim uint8, reserved uint32, shape []int64, data []byte) []byte {
	p := make([]byte, message.InlineHeaderSize+8*len(shape), message.InlineHeaderSize+8*len(shape)+len(data))
	le.PutUint16(p[0:], code)
	p[2], p[3] = flags, ndim
	le.PutUint32(p[4:], reserved)
	for i, d := range shape {
		le.PutUint64(p[message.InlineHeaderSize+8*i:], uint64(d))
	}
	return append(p, data...)
}

// inlineRecord is rawRecord of an inline payload, its length told true.
func inlineRecord(code uint16, flags uint8, shape []int64, data []byte) []byte {
	p := inlinePayload(code, flags, uint8(len(shape)), 0, shape, data)
	return rawRecord(message.TypeInline, 0, uint32(len(p)), p)
}

// takeRaw takes q's next record with room for every view a header can ask.
func takeRaw(t *testing.T, q *queue.Queue) []byte {
	t.Helper()
	return getRaw(t, q, message.MaxViews)
}

func bytesRecord(t *testing.T, q *queue.Queue, b string) {
	t.Helper()
	_, err := handover.Put(q, &message.Record{Type: message.TypeBytes, Payload: []byte(b)}, nil, time.Time{})
	require.NoError(t, err)
}

// An inline record whose header lies about its array is malformed, taken
// and refused whole (no panic, no view), and the record after it is read.
func TestForgedInlineHeadersAreMalformed(t *testing.T) {
	one := []byte{1}
	ones := make([]int64, 33)
	for i := range ones {
		ones[i] = 1
	}
	tests := map[string][]byte{
		"ndim past the max":        inlineRecord(uint16(dtype.Uint8), 0, ones, one),
		"ndim 255":                 rawRecord(message.TypeInline, 0, 8, inlinePayload(uint16(dtype.Uint8), 0, 255, 0, nil, nil)),
		"shape past 2^63":          inlineRecord(uint16(dtype.Float64), 0, []int64{1 << 32, 1 << 32}, nil),
		"shape past 2^64":          inlineRecord(uint16(dtype.Uint8), 0, []int64{1 << 62, 8}, nil),
		"empty shape past 2^63":    inlineRecord(uint16(dtype.Float64), 0, []int64{0, 1 << 32, 1 << 32}, nil),
		"itemsize past 2^63":       inlineRecord(uint16(dtype.Complex128), 0, []int64{1 << 60}, nil),
		"negative dimension":       inlineRecord(uint16(dtype.Uint8), 0, []int64{-1}, nil),
		"negative and zero":        inlineRecord(uint16(dtype.Uint8), 0, []int64{0, -1}, nil),
		"min int64":                inlineRecord(uint16(dtype.Uint8), 0, []int64{math.MinInt64}, nil),
		"fewer bytes than shape":   inlineRecord(uint16(dtype.Float32), 0, []int64{3}, make([]byte, 8)),
		"more bytes than shape":    inlineRecord(uint16(dtype.Float32), 0, []int64{1}, make([]byte, 8)),
		"array past the record":    inlineRecord(uint16(dtype.Uint8), 0, []int64{100}, make([]byte, 8)),
		"unknown dtype":            inlineRecord(99, 0, []int64{1}, one),
		"dtype 0":                  inlineRecord(0, 0, []int64{1}, one),
		"dtype past a byte":        inlineRecord(0x0106, 0, []int64{1}, one),
		"flags high bit":           inlineRecord(uint16(dtype.Uint8), 0x80, []int64{1}, one),
		"flags bit 3":              inlineRecord(uint16(dtype.Uint8), 8, []int64{1}, one),
		"reserved word":            rawRecord(message.TypeInline, 0, 9, inlinePayload(uint16(dtype.Uint8), 0, 0, 1, nil, one)),
		"shape past the payload":   rawRecord(message.TypeInline, 0, 16, inlinePayload(uint16(dtype.Uint8), 0, 4, 0, []int64{0}, nil)),
		"header past the payload":  rawRecord(message.TypeInline, 0, 4, inlinePayload(uint16(dtype.Uint8), 0, 0, 0, nil, nil)),
		"payload past the record":  rawRecord(message.TypeInline, 0, 200, inlinePayload(uint16(dtype.Uint8), 0, 1, 0, []int64{8}, make([]byte, 8))),
		"payload short of the end": rawRecord(message.TypeInline, 0, 9, inlinePayload(uint16(dtype.Uint8), 0, 1, 0, []int64{9}, make([]byte, 16))),
		"a descriptor claimed":     rawRecord(message.TypeInline, 1, 9, inlinePayload(uint16(dtype.Uint8), 0, 0, 0, nil, one)),
		"no payload":               rawRecord(message.TypeInline, 0, 0, nil),
		"record type 0":            rawRecord(0, 0, 9, inlinePayload(uint16(dtype.Uint8), 0, 0, 0, nil, one)),
		"record type 5":            rawRecord(5, 0, 9, inlinePayload(uint16(dtype.Uint8), 0, 0, 0, nil, one)),
	}
	q := mustQueue(t, 1<<16, 0)
	for name, raw := range tests {
		t.Run(name, func(t *testing.T) {
			forge(t, q, raw)
			bytesRecord(t, q, "after")
			var m handover.Message
			require.ErrorIs(t, m.Decode(takeRaw(t, q)), message.ErrMalformed)
			require.Zero(t, m.Type)
			require.Zero(t, m.NumViews(), "a record refused gives no view")
			require.Nil(t, m.Inline.Data)
			require.NoError(t, m.Adopt())
			require.NoError(t, m.Drop())
			require.NoError(t, m.Decode(takeRaw(t, q)))
			require.Equal(t, "after", string(m.Payload))
		})
	}
}

// Inline records at the edges of what an array is: none of its bytes, no
// dimension, a dimension of 2^62 beside a zero one, 32 dimensions. Each
// is an array, with C-order strides that do not overflow.
func TestInlineRecordsAtTheEdges(t *testing.T) {
	ones := make([]int64, 32)
	for i := range ones {
		ones[i] = 1
	}
	tests := []struct {
		name    string
		dt      dtype.DType
		shape   []int64
		data    []byte
		strides []int64
	}{
		{"no element", dtype.Float32, []int64{0}, nil, []int64{4}},
		{"a scalar", dtype.Float64, []int64{}, make([]byte, 8), []int64{}},
		{"a bool scalar", dtype.Bool, []int64{}, []byte{1}, []int64{}},
		{"2^62 beside 0", dtype.Uint8, []int64{0, 1 << 62}, nil, []int64{1 << 62, 1}},
		{"0 after 2^62", dtype.Uint8, []int64{1 << 62, 0}, nil, []int64{1, 1}},
		{"32 dimensions", dtype.Complex128, ones, make([]byte, 16), ones16()},
	}
	q := mustQueue(t, 4096, 0)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forge(t, q, inlineRecord(uint16(tt.dt), 0, tt.shape, tt.data))
			raw := takeRaw(t, q)
			var m handover.Message
			require.NoError(t, m.Decode(raw))
			require.EqualValues(t, message.TypeInline, m.Type)
			require.Equal(t, 1, m.NumViews())
			require.Equal(t, tt.shape, m.Inline.Shape)
			require.Equal(t, tt.strides, m.Inline.Strides())
			require.Len(t, m.Inline.Data, len(tt.data))
			require.Equal(t, len(raw), m.InlineAt+len(m.Inline.Data)+(len(raw)-m.PayloadAt-len(m.Payload)))
		})
	}
}

func ones16() []int64 {
	s := make([]int64, 32)
	for i := range s {
		s[i] = 16
	}
	return s
}

// An inline record whose header claims every descriptor asks for one view
// more than any descriptor count: a get that gives room for the most
// views a header can ask (message.MaxViews) takes it, and it is refused;
// one that gives room for message.MaxDescriptors is told it needs more.
func TestAnInlineRecordClaimingEveryDescriptor(t *testing.T) {
	q := mustQueue(t, 4096, 0)
	p := inlinePayload(uint16(dtype.Uint8), 0, 0, 0, nil, []byte{1})
	forge(t, q, rawRecord(message.TypeInline, message.MaxDescriptors, uint32(len(p)), p))
	buf := make([]byte, 4096)
	_, err := q.Get(buf, message.MaxDescriptors, time.Now())
	var re *queue.RangeError
	require.ErrorAs(t, err, &re)
	require.Equal(t, message.MaxViews, re.Views)
	var m handover.Message
	require.ErrorIs(t, m.Decode(takeRaw(t, q)), message.ErrMalformed)
}

// A get counts an inline record's view as one: with no room for views it
// is left, with room for one it is taken; so is a tensor record's one
// descriptor, and a run of both needs two.
func TestViewRoomOfZeroAndOne(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 4096, 0)
	in, err := handover.Inline(dtype.Uint8, 0, []int64{2}, []byte{1, 2})
	require.NoError(t, err)
	_, err = handover.Put(q, &in, nil, time.Time{})
	require.NoError(t, err)
	putTensor(t, p, q, 3)

	buf := make([]byte, 4096)
	var re *queue.RangeError
	_, err = q.Get(buf, 0, time.Now())
	require.ErrorAs(t, err, &re)
	require.Equal(t, 1, re.Views)
	n, size, err := q.GetMany(buf, 2, 1, time.Now())
	require.NoError(t, err)
	require.Equal(t, 1, n, "the tensor's view does not fit beside the inline one")
	msgs, err := handover.DecodeRun(buf[:size], n)
	require.NoError(t, err)
	require.Equal(t, 1, msgs[0].NumViews())
	_, err = q.Get(buf, 0, time.Now())
	require.ErrorAs(t, err, &re)
	require.Equal(t, 1, re.Views)
	m := take(t, q)
	require.NoError(t, m.Adopt())
	require.Equal(t, 1, m.NumViews())
	require.NoError(t, m.Release())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

// A descriptor taken once and replayed (its record's bytes put again, as
// a writer that kept them could) takes no second count: the adopt of the
// replay fails and leaves the first taker's count alone.
func TestAReplayedDescriptorTakesNoSecondCount(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 4096, 0)
	putTensor(t, p, q, 5)
	raw := takeRaw(t, q)
	replay := append([]byte{}, raw...)
	var first handover.Message
	require.NoError(t, first.Decode(raw))
	require.NoError(t, first.Adopt())

	forge(t, q, replay)
	m := take(t, q)
	require.ErrorIs(t, m.Adopt(), pool.ErrTaken)
	require.Empty(t, m.Views)
	require.Zero(t, m.NumViews())
	require.Zero(t, m.Type, "refused as a record that does not decode")
	require.NoError(t, m.Drop(), "nothing left to give up")
	forge(t, q, replay)
	require.NoError(t, m.Decode(takeRaw(t, q)))
	require.ErrorIs(t, m.Drop(), pool.ErrTaken, "nor is its count given up")
	n, err := first.Views[0].Ref.Holders()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.EqualValues(t, 6, le.Uint32(first.Views[0].Data[4:]))
	require.NoError(t, first.Release())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

// One descriptor twice in one record: the second adopt fails, the first
// count is released, and the memory goes (it had that one count).
func TestADescriptorTwiceInOneRecord(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 4096, 0)
	rec, r := tensor(t, p, 5)
	d := rec.Descriptors[0]
	twice := message.Record{Type: message.TypePickle, Descriptors: []message.Descriptor{d, d}, Payload: []byte("\x80\x05N.")}
	raw := make([]byte, twice.Size())
	twice.Encode(raw)
	// The ref's count goes with the record, as a put would send it.
	_, err := buffer.Send([]*buffer.Ref{r}, func() error { forge(t, q, raw); return nil })
	require.NoError(t, err)
	m := take(t, q)
	require.ErrorIs(t, m.Adopt(), pool.ErrTaken)
	require.Empty(t, m.Views)
	require.EqualValues(t, 0, p.Stats().SlotsInUse, "the one count was taken, then released")
}

// A run that GetMany took, of inline, pickled, descriptor and bytes
// records with bad ones among them (an inline header that lies, a
// replayed descriptor): the good ones are given whole, each with its
// views and counts, as separate gets would give them; the bad ones are
// left with no type and no view, their counts not taken; the error says
// why for each.
func TestARunWithBadRecordsAmongGoodOnes(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 1<<16, 0)

	// A descriptor taken already, to replay.
	putTensor(t, p, q, 100)
	replay := append([]byte{}, takeRaw(t, q)...)
	var taken handover.Message
	require.NoError(t, taken.Decode(replay))
	require.NoError(t, taken.Adopt())

	in, err := handover.Inline(dtype.Int16, 0, []int64{2}, []byte{1, 0, 2, 0})
	require.NoError(t, err)
	_, err = handover.Put(q, &in, nil, time.Time{})
	require.NoError(t, err)
	pickled, r1 := tensor(t, p, 1)
	pickled.Type, pickled.Payload = message.TypePickle, []byte("\x80\x05N.")
	_, err = handover.Put(q, pickled, []*buffer.Ref{r1}, time.Time{})
	require.NoError(t, err)
	forge(t, q, inlineRecord(uint16(dtype.Uint8), 0, []int64{100}, make([]byte, 8))) // bad: its array runs past it
	forge(t, q, replay)                                                              // bad: its count is taken
	putTensor(t, p, q, 2)
	bytesRecord(t, q, "end")

	buf := make([]byte, 1<<16)
	n, size, err := q.GetMany(buf, 10, message.MaxViews, time.Now())
	require.NoError(t, err)
	require.Equal(t, 6, n)
	msgs, derr := handover.DecodeRun(buf[:size], n)
	require.ErrorIs(t, derr, message.ErrMalformed)
	aerr := handover.AdoptAll(msgs)
	require.ErrorIs(t, aerr, pool.ErrTaken)

	require.EqualValues(t, message.TypeInline, msgs[0].Type)
	require.Equal(t, 1, msgs[0].NumViews())
	require.Equal(t, []byte{1, 0, 2, 0}, msgs[0].Inline.Data)
	require.EqualValues(t, message.TypePickle, msgs[1].Type)
	require.Len(t, msgs[1].Views, 1, "a good message keeps its view beside bad ones")
	require.EqualValues(t, 1, le.Uint32(msgs[1].Views[0].Data))
	for _, bad := range msgs[2:4] {
		require.Zero(t, bad.Type)
		require.Zero(t, bad.NumViews())
		require.Equal(t, bad.Bytes, bad.PayloadAt, "a bad record's payload is at its end: none")
	}
	require.EqualValues(t, message.TypeTensor, msgs[4].Type)
	require.Len(t, msgs[4].Views, 1)
	require.EqualValues(t, 2, le.Uint32(msgs[4].Views[0].Data))
	require.Equal(t, "end", string(msgs[5].Payload))

	at := 0
	for i := range msgs {
		at += msgs[i].Bytes
	}
	require.Equal(t, size, at, "every record is located, the bad ones too")

	n1, err := taken.Views[0].Ref.Holders()
	require.NoError(t, err)
	require.EqualValues(t, 1, n1, "the replay took nothing from the first taker")
	require.NoError(t, taken.Release())
	for i := range msgs {
		require.NoError(t, msgs[i].Release())
	}
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
}

// A PutContext whose context ends while it waits for room on a full queue
// puts nothing, and leaves the counts the caller's.
func TestAPutContextCancelledWhileItWaitsLeavesTheCounts(t *testing.T) {
	p := mustPool(t)
	q := mustQueue(t, 4096, 1)
	bytesRecord(t, q, "full")
	rec, r := tensor(t, p, 1)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	sent, err := handover.PutContext(ctx, q, rec, []*buffer.Ref{r})
	require.False(t, sent)
	require.ErrorIs(t, err, context.Canceled)
	n, err := r.Holders()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.NoError(t, r.Release())
	require.EqualValues(t, 0, p.Stats().SlotsInUse)
	require.Equal(t, 1, qlen(t, q))
}
