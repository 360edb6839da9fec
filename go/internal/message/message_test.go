package message_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/message"
)

var le = binary.LittleEndian

func sampleRecord() message.Record {
	return message.Record{
		Type: message.TypePickle,
		Descriptors: []message.Descriptor{
			{Kind: message.RefSlot, Flags: 1, DType: dtype.Float32, Shape: []int64{2, 3}, Strides: []int64{12, 4},
				Name: "zctipc_0123456789abcdef0123456789abcdef", Offset: 64, NBytes: 24, Slot: 7, Generation: 3},
			{Kind: message.RefSegment, DType: dtype.BFloat16, Shape: []int64{}, Strides: []int64{}, Name: "zctipc_weights", NBytes: 2},
		},
		Payload: []byte("\x80\x05K\x01."),
	}
}

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	rec := sampleRecord()
	require.NoError(t, rec.Check())
	buf := make([]byte, rec.Size())
	rec.Encode(buf)
	require.Zero(t, len(buf)%8)
	back, err := message.DecodeRecord(buf)
	require.NoError(t, err)
	require.Equal(t, rec.Type, back.Type)
	require.Equal(t, rec.Payload, back.Payload)
	require.Equal(t, rec.Descriptors, back.Descriptors)
}

func TestRecordRefusesMalformedInput(t *testing.T) {
	t.Parallel()
	good := sampleRecord()
	buf := make([]byte, good.Size())
	good.Encode(buf)
	tests := []struct {
		name string
		edit func(b []byte) []byte
	}{
		{"truncated", func(b []byte) []byte { return b[:len(b)-8] }},
		{"size field lies", func(b []byte) []byte { le.PutUint32(b, uint32(len(b)+8)); return b }},
		{"too many descriptors", func(b []byte) []byte { le.PutUint16(b[6:], 50); return b }},
		{"payload past the end", func(b []byte) []byte { le.PutUint32(b[8:], 1<<20); return b }},
		{"unknown type", func(b []byte) []byte { b[4] = 9; return b }},
		{"descriptor size lies", func(b []byte) []byte { le.PutUint16(b[16:], 8); return b }},
		{"descriptor kind", func(b []byte) []byte { b[16+2] = 7; return b }},
		{"descriptor ndim past 32", func(b []byte) []byte { b[16+6] = 40; return b }},
		{"descriptor array past its bytes", func(b []byte) []byte { le.PutUint64(b[16+16:], 4); return b }},
		{"descriptor dtype", func(b []byte) []byte { le.PutUint16(b[16+4:], 99); return b }},
		{"descriptor offset overflows", func(b []byte) []byte { le.PutUint64(b[16+8:], ^uint64(0)-2); return b }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.edit(append([]byte(nil), buf...))
			_, err := message.DecodeRecord(b)
			require.ErrorIs(t, err, message.ErrMalformed)
		})
	}
	bad := sampleRecord()
	bad.Type = message.TypeTensor
	require.ErrorIs(t, bad.Check(), message.ErrMalformed, "a tensor record has exactly one descriptor and no payload")
}

// FuzzRecordDecode feeds the record decoder hostile bytes: it must never
// panic, and what it accepts must encode back to the same bytes.
func FuzzRecordDecode(f *testing.F) {
	rec := sampleRecord()
	buf := make([]byte, rec.Size())
	rec.Encode(buf)
	f.Add(buf)
	f.Add(buf[:16])
	f.Fuzz(func(t *testing.T, raw []byte) {
		rec, err := message.DecodeRecord(raw)
		if err != nil {
			require.ErrorIs(t, err, message.ErrMalformed)
			return
		}
		again := make([]byte, rec.Size())
		rec.Encode(again)
		require.Equal(t, len(raw), len(again), "DecodeRecord then Encode changed the size")
	})
}

func TestInlineRoundTrip(t *testing.T) {
	t.Parallel()
	shape := []int64{2, 3}
	payload := make([]byte, message.InlineHeaderSize+8*len(shape)+24)
	at := message.EncodeInline(payload, dtype.Float32, 0, shape)
	for i := range payload[at:] {
		payload[at+i] = byte(i)
	}
	rec := message.Record{Type: message.TypeInline, Payload: payload}
	require.NoError(t, rec.Check())
	buf := make([]byte, rec.Size())
	rec.Encode(buf)
	back, err := message.DecodeRecord(buf)
	require.NoError(t, err)
	in, err := message.DecodeInline(back.Payload)
	require.NoError(t, err)
	require.Equal(t, dtype.Float32, in.DType)
	require.Equal(t, shape, in.Shape)
	require.Equal(t, payload[at:], in.Data)
}

func TestInlineRefusesMalformedPayloads(t *testing.T) {
	t.Parallel()
	good := func() []byte {
		p := make([]byte, message.InlineHeaderSize+8+8)
		message.EncodeInline(p, dtype.Int32, 0, []int64{2})
		return p
	}
	tests := map[string]func([]byte) []byte{
		"truncated header": func(p []byte) []byte { return p[:4] },
		"unknown dtype":    func(p []byte) []byte { p[0] = 0xEE; return p },
		"flags":            func(p []byte) []byte { p[2] = 8; return p },
		"ndim past 32":     func(p []byte) []byte { p[3] = 33; return p },
		"reserved bytes":   func(p []byte) []byte { p[5] = 1; return p },
		"shape past data":  func(p []byte) []byte { p[3] = 3; return p },
		"negative shape":   func(p []byte) []byte { p[15] = 0x80; return p },
		"too few elements": func(p []byte) []byte { return p[:len(p)-4] },
		"too many":         func(p []byte) []byte { return append(p, 0, 0, 0, 0) },
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := message.DecodeInline(mutate(good()))
			require.ErrorIs(t, err, message.ErrMalformed)
			rec := message.Record{Type: message.TypeInline, Payload: mutate(good())}
			require.ErrorIs(t, rec.Check(), message.ErrMalformed)
		})
	}
	rec := message.Record{Type: message.TypeInline, Payload: good(), Descriptors: sampleRecord().Descriptors}
	require.ErrorIs(t, rec.Check(), message.ErrMalformed, "an inline record holds no descriptor")
}

// A record whose Inline is set encodes to the bytes of the record whose
// payload is that array encoded, and decodes back with Inline set (its
// Data in the payload).
func TestInlineRecordFromItsArray(t *testing.T) {
	t.Parallel()
	in := message.Inline{DType: dtype.Int16, Flags: 4, Shape: []int64{3}, Data: []byte{1, 0, 2, 0, 3, 0}}
	payload := make([]byte, in.Size())
	require.Equal(t, len(payload), in.Encode(payload))
	byPayload := message.Record{Type: message.TypeInline, Payload: payload}
	byArray := message.Record{Type: message.TypeInline, Inline: in}
	require.NoError(t, byArray.Check())
	require.Equal(t, byPayload.Size(), byArray.Size())
	a, b := make([]byte, byArray.Size()), make([]byte, byPayload.Size())
	byArray.Encode(a)
	byPayload.Encode(b)
	require.Equal(t, b, a)

	back, err := message.DecodeRecord(a)
	require.NoError(t, err)
	require.Equal(t, in.Shape, back.Inline.Shape)
	require.Equal(t, in.Data, back.Inline.Data)
	require.Equal(t, []int64{2}, back.Inline.Strides())

	wrong := message.Record{Type: message.TypeBytes, Inline: in}
	require.ErrorIs(t, wrong.Check(), message.ErrMalformed, "only an inline record holds an array")
	short := in
	short.Data = short.Data[:4]
	require.ErrorIs(t, (&message.Record{Type: message.TypeInline, Inline: short}).Check(), message.ErrMalformed)
}

func TestViewsOfARecord(t *testing.T) {
	t.Parallel()
	require.Equal(t, 0, message.Views(message.TypeBytes, 0))
	require.Equal(t, 3, message.Views(message.TypePickle, 3))
	require.Equal(t, 1, message.Views(message.TypeTensor, 1))
	require.Equal(t, 1, message.Views(message.TypeInline, 0), "its array, which lies in the record")
}
