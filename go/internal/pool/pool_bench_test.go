package pool_test

import (
	"testing"
	"time"

	"github.com/zctipc/zctipc/go/internal/pool"
)

// BenchmarkAllocRelease is a buffer's life in its owner: a slot taken off
// an arena's free stack and pushed back.
func BenchmarkAllocRelease(b *testing.B) {
	p := pool.New(64 << 20)
	b.Cleanup(func() { p.Close() })
	b.ReportAllocs()
	for b.Loop() {
		s, err := p.Alloc(4096, time.Time{})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Release(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAddRefRelease is a count added to a slot in use and given
// back, as a descriptor's sender and receiver do.
func BenchmarkAddRefRelease(b *testing.B) {
	p := pool.New(64 << 20)
	b.Cleanup(func() { p.Close() })
	s, err := p.Alloc(4096, time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Release()
	b.ReportAllocs()
	for b.Loop() {
		c, err := s.AddRef()
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Release(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTicket is a sent count's ticket: issued, armed, and taken by
// its receiver.
func BenchmarkTicket(b *testing.B) {
	b.Cleanup(func() { pool.CloseTickets() })
	b.ReportAllocs()
	for b.Loop() {
		t, err := pool.NewTicket()
		if err != nil {
			b.Fatal(err)
		}
		t.Arm()
		if err := pool.TakeTicket(t.Slot.Arena().Name(), t.Slot.Index, t.Slot.Generation, t.Nonce); err != nil {
			b.Fatal(err)
		}
	}
}
