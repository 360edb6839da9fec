package message_test

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/message"
)

// TestInlineGoldenBytes holds the inline codec (C in package plane since
// it left Go) to the bytes docs/format.md specifies, written out by hand:
// a record's header, then the array's header (dtype u16, flags u8, ndim
// u8, a zero word), its shape as i64s, its elements, zeros to 8.
func TestInlineGoldenBytes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		dt    dtype.DType
		flags uint8
		shape []int64
		data  []byte
		want  string
	}{
		{"int16 2x1, read-only", dtype.Int16, 4, []int64{2, 1}, []byte{1, 2, 3, 4},
			"30000000" + "04000000" + "1c000000" + "00000000" +
				"0300" + "04" + "02" + "00000000" +
				"0200000000000000" + "0100000000000000" +
				"01020304" + "00000000"},
		{"a float64 scalar, torch", dtype.Float64, 1, []int64{}, []byte{0, 0, 0, 0, 0, 0, 0xf0, 0x3f},
			"20000000" + "04000000" + "10000000" + "00000000" +
				"0c00" + "01" + "00" + "00000000" +
				"000000000000f03f"},
		{"empty uint8, a dimension of 2^40", dtype.Uint8, 0, []int64{0, 1 << 40}, nil,
			"28000000" + "04000000" + "18000000" + "00000000" +
				"0600" + "00" + "02" + "00000000" +
				"0000000000000000" + "0000000000010000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			want, err := hex.DecodeString(c.want)
			require.NoError(t, err)
			payload := make([]byte, message.InlineHeaderSize+8*len(c.shape)+len(c.data))
			for i := range payload { // what EncodeInline does not write must not stay
				payload[i] = 0xAA
			}
			at := message.EncodeInline(payload, c.dt, c.flags, c.shape)
			require.Equal(t, message.InlineHeaderSize+8*len(c.shape), at)
			copy(payload[at:], c.data)
			rec := message.Record{Type: message.TypeInline, Payload: payload}
			require.NoError(t, rec.Check())
			buf := make([]byte, rec.Size())
			rec.Encode(buf)
			require.Equal(t, hex.EncodeToString(want), hex.EncodeToString(buf))

			back, err := message.DecodeRecord(want)
			require.NoError(t, err)
			in, err := message.DecodeInline(back.Payload)
			require.NoError(t, err)
			require.Equal(t, c.dt, in.DType)
			require.Equal(t, c.flags, in.Flags)
			require.Equal(t, c.shape, in.Shape)
			require.Equal(t, len(c.data), len(in.Data))
		})
	}
}
