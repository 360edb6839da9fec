package message_test

import (
	"errors"
	"testing"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
)

// FuzzInlineDecode: DecodeInline accepts only payloads whose elements are
// exactly what the shape and dtype make, and never reads past them.
func FuzzInlineDecode(f *testing.F) {
	p := make([]byte, message.InlineHeaderSize+16+24)
	message.EncodeInline(p, dtype.Float32, 0, []int64{2, 3})
	f.Add(p)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		in, err := message.DecodeInline(raw)
		if err != nil {
			if !errors.Is(err, message.ErrMalformed) {
				t.Fatalf("DecodeInline: error of no documented class: %v", err)
			}
			return
		}
		n, ok := header.ByteCount(in.Shape, in.DType.Size())
		if !ok || n != uint64(len(in.Data)) || len(in.Data) > len(raw) {
			t.Fatalf("DecodeInline accepted shape %v with %d bytes of elements", in.Shape, len(in.Data))
		}
	})
}
