package handover_test

import (
	"testing"
	"time"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
)

// BenchmarkInline is the library's share of a small array's put and get
// through a queue, inline: building the record from the array, writing it
// into the ring, taking it and decoding it.
func BenchmarkInline(b *testing.B) {
	q, err := queue.Create("", 1<<20, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	data, shape, buf := make([]byte, 40), []int64{10}, make([]byte, 4096)
	b.ReportAllocs()
	for b.Loop() {
		rec, err := handover.Inline(dtype.Float32, 0, shape, data)
		if err == nil {
			_, err = handover.Put(q, &rec, nil, time.Time{})
		}
		var n int
		if err == nil {
			n, err = q.Get(buf, 1, time.Time{})
		}
		var m handover.Message
		if err == nil {
			err = m.Decode(buf[:n])
		}
		if err == nil {
			err = m.Adopt()
		}
		if err != nil || m.NumViews() != 1 {
			b.Fatal(err)
		}
	}
}

// BenchmarkBytes is BenchmarkInline's for a record of raw bytes.
func BenchmarkBytes(b *testing.B) {
	q, err := queue.Create("", 1<<20, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	payload, buf := make([]byte, 64), make([]byte, 4096)
	b.ReportAllocs()
	for b.Loop() {
		rec := message.Record{Type: message.TypeBytes, Payload: payload}
		_, err := handover.Put(q, &rec, nil, time.Time{})
		var n int
		if err == nil {
			n, err = q.Get(buf, 1, time.Time{})
		}
		var m handover.Message
		if err == nil {
			err = m.Decode(buf[:n])
		}
		if err == nil {
			err = m.Adopt()
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}
