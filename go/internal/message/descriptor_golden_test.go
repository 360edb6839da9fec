package message_test

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/plane"
)

// goldenSlot and goldenSegment are descriptors and the bytes docs/format.md
// ("Descriptors") makes of them, written out by hand, a line a word: they
// hold the descriptor codec (C in package plane since it left Go, Note [one
// descriptor codec]) to what the Go codec before it wrote and read.
var (
	goldenSlot = message.Descriptor{
		Kind: message.RefSlot, Flags: 5, DType: dtype.Float32, Shape: []int64{2, 3}, Strides: []int64{12, 4},
		Name: "zctipc_arena", Offset: 64, NBytes: 24, Slot: 7, Generation: 3,
		Ticket: message.Ticket{Arena: "zctipc_tickets", Slot: 9, Generation: 2, Nonce: 0x0102030405060708},
	}
	goldenSlotBytes = "" +
		"7800" + "02" + "0d" + "0b00" + "02" + "0c" + // size 120, kind 2, flags 5 | 8 (a ticket), float32, ndim 2, a 12-byte name
		"4000000000000000" + // offset 64
		"1800000000000000" + // nbytes 24
		"07000000" + "03000000" + // slot 7, generation 3
		"0200000000000000" + "0300000000000000" + // shape
		"0c00000000000000" + "0400000000000000" + // strides
		"7a63746970635f61" + "72656e6100000000" + // "zctipc_arena", zeros to 8
		"0807060504030201" + // the ticket's nonce (T = 80)
		"09000000" + "02000000" + // its slot 9, generation 2
		"0e" + "00000000000000" + // its arena's name of 14 bytes, 7 zeros
		"7a63746970635f74" + "69636b6574730000" // "zctipc_tickets", zeros to 8
	goldenSegment = message.Descriptor{
		Kind: message.RefSegment, DType: dtype.BFloat16, Shape: []int64{}, Strides: []int64{}, Name: "zctipc_weights", NBytes: 2,
	}
	goldenSegmentBytes = "" +
		"3000" + "01" + "00" + "0d00" + "00" + "0e" + // size 48, kind 1, no flags, bfloat16, a scalar, a 14-byte name
		"0000000000000000" + "0200000000000000" + // offset 0, nbytes 2
		"00000000" + "00000000" + // no slot
		"7a63746970635f77" + "6569676874730000" // "zctipc_weights", zeros to 8
)

func goldenBytes(t *testing.T, s string) []byte {
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}

func TestDescriptorGoldenBytes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		d    message.Descriptor
		want string
	}{
		{"a slot with a ticket", goldenSlot, goldenSlotBytes},
		{"a segment's scalar", goldenSegment, goldenSegmentBytes},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := goldenBytes(t, c.want)
			require.NoError(t, c.d.Check())
			require.Equal(t, len(want), c.d.Size())
			got := make([]byte, c.d.Size()+8)
			for i := range got {
				got[i] = 0xEE // Encode writes every byte of its size, its padding too, and no more
			}
			require.Equal(t, len(want), c.d.Encode(got))
			require.Equal(t, hex.EncodeToString(want), hex.EncodeToString(got[:len(want)]))
			require.Equal(t, "eeeeeeeeeeeeeeee", hex.EncodeToString(got[len(want):]))

			back, n, err := message.DecodeDescriptor(append(want, 0xEE)) // what follows it is not its
			require.NoError(t, err)
			require.Equal(t, len(want), n)
			require.Equal(t, c.d, back)
		})
	}
}

// TestDescriptorRefusals forges a descriptor that breaks each rule of the
// decoder and its check, one at a time, and holds each refusal to the
// error the Go codec gave before the plane took the rules over.
func TestDescriptorRefusals(t *testing.T) {
	t.Parallel()
	put64 := func(at int, v uint64) func([]byte) []byte {
		return func(b []byte) []byte { le.PutUint64(b[at:], v); return b }
	}
	slot := []struct {
		name string
		edit func([]byte) []byte
		want string
	}{
		{"truncated", func(b []byte) []byte { return b[:31] }, "descriptor truncated"},
		{"a size with no room for its ticket", func(b []byte) []byte { le.PutUint16(b, 80); return b }, "descriptor of 80 bytes truncates its ticket"},
		{"bytes with no room for its ticket", func(b []byte) []byte { return b[:96] }, "descriptor of 120 bytes truncates its ticket"},
		{"ndim past 32 with a ticket", func(b []byte) []byte { b[6] = 33; return b }, "descriptor of 120 bytes truncates its ticket"},
		{"a ticket name of 0 bytes", func(b []byte) []byte { b[96] = 0; return b }, "descriptor of 120 bytes with a 0-byte ticket name"},
		{"a ticket name past its size", func(b []byte) []byte { b[96] = 20; return b }, "descriptor of 120 bytes with a 20-byte ticket name"},
		{"a ticket name past the bytes", func(b []byte) []byte { return b[:112] }, "descriptor of 120 bytes with a 14-byte ticket name"},
		{"kind", func(b []byte) []byte { b[2] = 3; return b }, "descriptor kind 3"},
		{"kind 0", func(b []byte) []byte { b[2] = 0; return b }, "descriptor kind 0"},
		{"flags past bit 3", func(b []byte) []byte { b[3] |= 0x10; return b }, "descriptor flags 0x15"},
		{"a ticket's nonce of 0", put64(80, 0), "descriptor ticket of a 14-byte name and nonce 0x0"},
		{"dtype", func(b []byte) []byte { b[4] = 99; return b }, "dtype code 99: unsupported dtype"},
		{"dtype 0", func(b []byte) []byte { b[4] = 0; return b }, "dtype code 0: unsupported dtype"},
		{"negative shape", put64(32, ^uint64(0)), "negative shape or stride in descriptor"},
		{"negative stride", put64(56, 1<<63), "negative shape or stride in descriptor"},
		{"shape overflows", func(b []byte) []byte { le.PutUint64(b[32:], 1<<40); le.PutUint64(b[40:], 1<<40); return b },
			"descriptor shape [1099511627776 1099511627776] overflows"},
		{"overflows past a 0", func(b []byte) []byte { le.PutUint64(b[32:], 0); le.PutUint64(b[40:], 1<<62); return b },
			"descriptor shape [0 4611686018427387904] overflows"},
		{"array past nbytes", put64(16, 23), "descriptor array reaches past its 23 bytes"},
		{"stride past nbytes", put64(48, 1<<62), "descriptor array reaches past its 24 bytes"},
		{"extent overflows", put64(48, 1<<63-1), "descriptor array reaches past its 24 bytes"},
		{"offset plus nbytes wraps", put64(8, ^uint64(0)-2), "descriptor array reaches past its 24 bytes"},
	}
	segment := []struct {
		name string
		edit func([]byte) []byte
		want string
	}{
		{"a size past its end", func(b []byte) []byte { le.PutUint16(b, 56); return append(b, make([]byte, 8)...) },
			"descriptor of 56 bytes with ndim 0 and a 14-byte name"},
		{"a size short of its name", func(b []byte) []byte { le.PutUint16(b, 40); return b },
			"descriptor of 40 bytes with ndim 0 and a 14-byte name"},
		{"bytes short of its size", func(b []byte) []byte { return b[:40] }, "descriptor of 48 bytes with ndim 0 and a 14-byte name"},
		{"ndim past 32", func(b []byte) []byte { b[6] = 33; return b }, "descriptor of 48 bytes with ndim 33 and a 14-byte name"},
		{"a name of 0 bytes", func(b []byte) []byte { le.PutUint16(b, 32); b[7] = 0; return b[:32] }, "descriptor name of 0 bytes"},
	}
	check := func(t *testing.T, golden, want string, edit func([]byte) []byte) {
		_, n, err := message.DecodeDescriptor(edit(goldenBytes(t, golden)))
		require.ErrorIs(t, err, message.ErrMalformed)
		require.Equal(t, "malformed message: "+want, err.Error())
		require.Zero(t, n)
	}
	for _, c := range slot {
		t.Run(c.name, func(t *testing.T) { check(t, goldenSlotBytes, c.want, c.edit) })
	}
	for _, c := range segment {
		t.Run(c.name, func(t *testing.T) { check(t, goldenSegmentBytes, c.want, c.edit) })
	}
}

// TestDescriptorCheckRefusals holds Check, of a descriptor built in Go,
// to the errors it gave before the plane took its rules over, for what
// no decoded descriptor can hold too.
func TestDescriptorCheckRefusals(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		edit func(d *message.Descriptor)
		want string
	}{
		{"kind", func(d *message.Descriptor) { d.Kind = 9 }, "descriptor kind 9"},
		{"the ticket flag", func(d *message.Descriptor) { d.Flags = 8 }, "descriptor flags 0x8"},
		{"ndim past 32", func(d *message.Descriptor) { d.Shape, d.Strides = make([]int64, 33), make([]int64, 33) },
			"descriptor ndim 33"},
		{"a stride short", func(d *message.Descriptor) { d.Strides = d.Strides[:1] }, "descriptor ndim 2"},
		{"a stride over", func(d *message.Descriptor) { d.Strides = append(d.Strides, 1) }, "descriptor ndim 2"},
		{"kind before ndim", func(d *message.Descriptor) { d.Kind, d.Strides = 0, nil }, "descriptor kind 0"},
		{"no name", func(d *message.Descriptor) { d.Name = "" }, "descriptor name of 0 bytes"},
		{"a name past 255 bytes", func(d *message.Descriptor) { d.Name = strings.Repeat("n", 256) }, "descriptor name of 256 bytes"},
		{"a ticket arena's name past 255 bytes", func(d *message.Descriptor) { d.Ticket.Arena = strings.Repeat("a", 300) },
			"descriptor ticket of a 300-byte name and nonce 0x102030405060708"},
		{"a ticket with nonce 0", func(d *message.Descriptor) { d.Ticket.Nonce = 0 }, "descriptor ticket of a 14-byte name and nonce 0x0"},
		{"dtype", func(d *message.Descriptor) { d.DType = 64 }, "dtype code 64: unsupported dtype"},
		{"negative shape", func(d *message.Descriptor) { d.Shape = []int64{-1, 3} }, "negative shape or stride in descriptor"},
		{"shape overflows", func(d *message.Descriptor) { d.Shape = []int64{1 << 61, 1} }, "descriptor shape [2305843009213693952 1] overflows"},
		{"array past nbytes", func(d *message.Descriptor) { d.NBytes = 0 }, "descriptor array reaches past its 0 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := goldenSlot
			d.Shape, d.Strides = append([]int64(nil), d.Shape...), append([]int64(nil), d.Strides...)
			c.edit(&d)
			err := d.Check()
			require.ErrorIs(t, err, message.ErrMalformed)
			require.Equal(t, "malformed message: "+c.want, err.Error())
		})
	}
	// With no arena a ticket is none, whatever else it holds: it is not
	// encoded, as before.
	d := goldenSlot
	d.Ticket = message.Ticket{Nonce: 5, Slot: 1}
	require.NoError(t, d.Check())
}

// TestDescriptorSize holds Descriptor.Size, which Go keeps (Note [one
// descriptor codec]), to the plane's zp_desc_size, over every ndim and
// name length a descriptor may have, and a few past them.
func TestDescriptorSize(t *testing.T) {
	t.Parallel()
	names := strings.Repeat("n", 300)
	for ndim := range 34 {
		d := message.Descriptor{Shape: make([]int64, ndim)}
		for name := range 257 {
			d.Name = names[:name]
			for _, arena := range []int{0, 1, 7, 8, 9, 100, 254, 255, 256} {
				d.Ticket.Arena = names[:arena]
				if d.Size() != plane.DescriptorSize(ndim, name, arena) {
					t.Fatalf("Size of ndim %d and names of %d and %d bytes: %d, the plane's %d", ndim, name, arena,
						d.Size(), plane.DescriptorSize(ndim, name, arena))
				}
			}
		}
	}
}
