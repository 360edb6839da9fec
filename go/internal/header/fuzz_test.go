package header_test

import (
	"bytes"
	"math/bits"
	"slices"
	"strings"
	"testing"

	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/headertest"
)

// FuzzHeaderDecode feeds the decoder hostile bytes. It must never panic or
// fail with an undocumented error; whatever it accepts must keep the rules of
// docs/format.md and encode back to the same bytes, so the decoder neither
// invents nor drops a field.
func FuzzHeaderDecode(f *testing.F) {
	for _, v := range headertest.Vectors(f) {
		f.Add(v.Bytes, uint64(len(v.Bytes)), false)
		f.Add(v.Bytes, uint64(len(v.Bytes)), true)
	}
	f.Fuzz(func(t *testing.T, raw []byte, fileSize uint64, resealed bool) {
		buf := raw[:min(len(raw), header.MaxSize)]
		if resealed && len(buf) >= header.FixedSize {
			// Fix the checksum so that the checks behind it are reached.
			headertest.Reseal(buf)
		}
		h, err := header.Decode(buf, fileSize)
		if err != nil {
			if class := headertest.ErrorClass(err); strings.HasPrefix(class, "other") {
				t.Fatalf("Decode: error of no documented class: %v", err)
			}
			return
		}
		if len(h.Shape) > header.MaxNDim || len(h.Strides) != len(h.Shape) {
			t.Fatalf("Decode accepted ndim %d with %d strides", len(h.Shape), len(h.Strides))
		}
		if h.DataOffset%header.DataAlign != 0 || h.DataOffset < uint64(h.Len()) {
			t.Fatalf("Decode accepted data offset %d", h.DataOffset)
		}
		if end, carry := bits.Add64(h.DataOffset, h.NBytes, 0); carry != 0 || end > fileSize {
			t.Fatalf("Decode accepted %d+%d bytes in a file of %d", h.DataOffset, h.NBytes, fileSize)
		}
		empty := slices.Contains(h.Shape, 0)
		for i, d := range h.Shape {
			if d < 0 || h.Strides[i] < 0 {
				t.Fatalf("Decode accepted a negative dimension or stride: %v %v", h.Shape, h.Strides)
			}
			if hi, lo := bits.Mul64(uint64(max(d-1, 0)), uint64(h.Strides[i])); !empty && (hi != 0 || lo >= h.NBytes && d > 1) {
				t.Fatalf("Decode accepted dimension %d reaching past %d bytes: %v %v", i, h.NBytes, h.Shape, h.Strides)
			}
		}
		again := make([]byte, h.Len())
		h.Encode(again)
		hlen := h.Len()
		for _, r := range [][2]int{{0, 60}, {header.RefcountOffset, header.RefcountOffset + 8}, {header.FixedSize, hlen}} {
			if !bytes.Equal(again[r[0]:r[1]], buf[r[0]:r[1]]) {
				t.Fatalf("Decode then Encode changed bytes [%d, %d)", r[0], r[1])
			}
		}
	})
}
