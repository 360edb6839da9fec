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

// FuzzDecodeRun feeds DecodeRun hostile runs of records: it never panics,
// every record it reads is located one after the other, a record it
// refused has no type and no view, and one it gave decodes alone as it
// did in the run.
func FuzzDecodeRun(f *testing.F) {
	in, err := handover.Inline(dtype.Uint8, 0, []int64{3}, []byte{1, 2, 3})
	require.NoError(f, err)
	run := make([]byte, in.Size())
	in.Encode(run)
	b := message.Record{Type: message.TypeBytes, Payload: []byte("x")}
	raw := make([]byte, b.Size())
	b.Encode(raw)
	run = append(run, raw...)
	f.Add(run, uint8(2))
	f.Add(run, uint8(5))
	f.Fuzz(func(t *testing.T, raw []byte, n uint8) {
		msgs, err := handover.DecodeRun(raw, int(n%16))
		at := 0
		for i := range msgs {
			m := &msgs[i]
			if m.Bytes == 0 {
				require.Error(t, err)
				for _, rest := range msgs[i:] {
					require.Zero(t, rest.Bytes)
				}
				break
			}
			require.LessOrEqual(t, at+m.Bytes, len(raw))
			var alone handover.Message
			derr := alone.Decode(raw[at : at+m.Bytes])
			if m.Type == 0 {
				require.ErrorIs(t, derr, message.ErrMalformed)
				require.ErrorIs(t, err, message.ErrMalformed)
				require.Zero(t, m.NumViews())
				require.Equal(t, m.Bytes, m.PayloadAt)
			} else {
				require.NoError(t, derr)
				require.Equal(t, alone.Record, m.Record)
				require.Equal(t, alone.PayloadAt, m.PayloadAt)
				require.Equal(t, alone.InlineAt, m.InlineAt)
			}
			at += m.Bytes
		}
	})
}
