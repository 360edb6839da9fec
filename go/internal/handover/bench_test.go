package handover_test

import (
	"testing"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/queue"
)

// BenchmarkInline is the library's share of a small array's put and get
// through a queue, inline: building the record from the array, writing it
// into the ring, taking it and decoding it.
func BenchmarkInline(b *testing.B) {
	q := benchQueue(b)
	data, shape, buf := make([]byte, 40), []int64{10}, make([]byte, 4096)
	b.ReportAllocs()
	for b.Loop() {
		var m handover.Message
		rec, err := handover.Inline(dtype.Float32, 0, shape, data)
		if err == nil {
			err = putAndTake(q, &rec, buf, &m)
		}
		if err != nil || m.NumViews() != 1 {
			b.Fatal(err)
		}
	}
}

// BenchmarkBytes is BenchmarkInline's for a record of raw bytes.
func BenchmarkBytes(b *testing.B) {
	q := benchQueue(b)
	payload, buf := make([]byte, 64), make([]byte, 4096)
	b.ReportAllocs()
	for b.Loop() {
		var m handover.Message
		rec := message.Record{Type: message.TypeBytes, Payload: payload}
		if err := putAndTake(q, &rec, buf, &m); err != nil {
			b.Fatal(err)
		}
	}
}

func benchQueue(b *testing.B) *queue.Queue {
	q, err := queue.Create("", 1<<20, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { q.Close() })
	return q
}

// putAndTake puts rec, which carries no count, into q, takes the next
// record into buf, and decodes and adopts it into m.
func putAndTake(q *queue.Queue, rec *message.Record, buf []byte, m *handover.Message) error {
	_, err := handover.Put(q, rec, nil, time.Time{})
	var n int
	if err == nil {
		n, err = q.Get(buf, 1, time.Time{})
	}
	if err == nil {
		err = m.Decode(buf[:n])
	}
	if err == nil {
		err = m.Adopt()
	}
	return err
}

// BenchmarkDescriptor is the library's share of a hand-off of an array in
// zctipc memory, as a queue's put and get of it go: finding the slot that
// holds the array and a count on it, describing it, putting the record
// with its count, taking the record, decoding it, taking its count over,
// and giving that count up (the receiver's array collected).
func BenchmarkDescriptor(b *testing.B) {
	q := benchQueue(b)
	p := pool.New(64 << 20)
	b.Cleanup(func() { p.Close() })
	s, err := p.Alloc(1<<20, time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Release()
	addr, buf := uintptr(unsafe.Pointer(&s.Data()[0])), make([]byte, 4096)
	shape, strides := []int64{1 << 18}, []int64{4}
	b.ReportAllocs()
	for b.Loop() {
		r, off, ok, err := buffer.Find(addr, 1<<20)
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
		d, err := r.Describe(off, dtype.Float32, shape, strides, 0)
		if err != nil {
			b.Fatal(err)
		}
		rec := message.Record{Type: message.TypeTensor, Descriptors: []message.Descriptor{d}}
		if _, err := handover.Put(q, &rec, []*buffer.Ref{r}, time.Time{}); err != nil {
			b.Fatal(err)
		}
		if err := takeAndRelease(q, buf, message.MaxDescriptors); err != nil {
			b.Fatal(err)
		}
	}
}

// takeAndRelease takes q's next record into buf, with room for views
// views, decodes it, takes its counts over and gives them up, as a
// receiver that drops what it got.
func takeAndRelease(q *queue.Queue, buf []byte, views int) error {
	n, err := q.Get(buf, views, time.Time{})
	var m handover.Message
	if err == nil {
		err = m.Decode(buf[:n])
	}
	if err == nil {
		err = m.Adopt()
	}
	if err == nil {
		err = m.Release()
	}
	return err
}
