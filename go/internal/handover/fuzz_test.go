package handover_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/message"
)

// FuzzDecode feeds Decode hostile records: it never panics, refuses only
// with message.ErrMalformed, and what it accepts says where its payload and
// an inline array lie in the record, truly.
func FuzzDecode(f *testing.F) {
	rec, err := handover.Inline(dtype.Int32, 0, []int64{2, 2}, make([]byte, 16))
	require.NoError(f, err)
	raw := make([]byte, rec.Size())
	rec.Encode(raw)
	f.Add(raw)
	bytesRec := message.Record{Type: message.TypeBytes, Payload: []byte("seven b")}
	raw = make([]byte, bytesRec.Size())
	bytesRec.Encode(raw)
	f.Add(raw)
	f.Fuzz(func(t *testing.T, raw []byte) {
		var m handover.Message
		if err := m.Decode(raw); err != nil {
			require.ErrorIs(t, err, message.ErrMalformed)
			return
		}
		require.Equal(t, len(raw), m.Bytes)
		require.Equal(t, len(raw), m.Size())
		require.LessOrEqual(t, m.PayloadAt+len(m.Payload), len(raw))
		require.Equal(t, raw[m.PayloadAt:m.PayloadAt+len(m.Payload)], m.Payload)
		require.Empty(t, m.Views, "no count is taken before Adopt")
		require.Equal(t, m.Type == message.TypeInline, m.NumViews() == 1)
		if m.Type == message.TypeInline {
			end := m.InlineAt + len(m.Inline.Data)
			require.Equal(t, m.PayloadAt+len(m.Payload), end, "the elements end the payload")
			require.Equal(t, raw[m.InlineAt:end], m.Inline.Data)
		}
	})
}
