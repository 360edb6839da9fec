package message_test

import (
	"testing"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/message"
)

// benchDescriptor is a descriptor as a hand-off of a pool slot makes it:
// one dimension, an arena's name and a ticket.
var benchDescriptor = message.Descriptor{
	Kind: message.RefSlot, DType: dtype.Float32, Shape: []int64{1 << 18}, Strides: []int64{4},
	Name: "zctipc_0123456789abcdef0123456789abcdef", Offset: 64, NBytes: 1 << 20, Slot: 7, Generation: 3,
	Ticket: message.Ticket{Arena: "zctipc_fedcba9876543210fedcba9876543210", Slot: 2, Generation: 1, Nonce: 0x1234},
}

// BenchmarkDescriptorEncode is a sender's share of a descriptor: its
// check, its size and its bytes.
func BenchmarkDescriptorEncode(b *testing.B) {
	d := benchDescriptor
	buf := make([]byte, 256)
	for b.Loop() {
		if err := d.Check(); err != nil {
			b.Fatal(err)
		}
		if d.Encode(buf[:d.Size()]) != d.Size() {
			b.Fatal("Encode")
		}
	}
}

// BenchmarkDescriptorDecode is a taker's: decoding and checking it.
func BenchmarkDescriptorDecode(b *testing.B) {
	d := benchDescriptor
	buf := make([]byte, d.Size())
	d.Encode(buf)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := message.DecodeDescriptor(buf); err != nil {
			b.Fatal(err)
		}
	}
}
