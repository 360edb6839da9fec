package plane

/*
#include "plane.h"
*/
import "C"

import (
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/dtype"
)

// What an inline array breaks (plane.h, ZP_BAD_INLINE_*), as CheckInline
// and ReadInline report it; OK when nothing.
const (
	InlineBadHeader = C.ZP_BAD_INLINE_HEADER
	InlineBadDType  = C.ZP_BAD_INLINE_DTYPE
	InlineBadShape  = C.ZP_BAD_INLINE_SHAPE
	InlineBadBytes  = C.ZP_BAD_INLINE_BYTES
	// InlineHeaderSize is the fixed part of an inline array's header; its
	// shape follows, 8 bytes a dimension, up to MaxNDim of them.
	InlineHeaderSize = C.ZP_INLINE_HEADER
	MaxNDim          = C.ZP_MAX_NDIM
)

func init() {
	// The plane knows element types by their sizes: package dtype's.
	for code := range C.ZP_DTYPES {
		C.zp_dtype_sizes[code] = C.uint8_t(dtype.DType(code).Size())
	}
}

// CheckInline reports whether an array of type dt with the descriptor
// flags flags and shape shape, whose elements are nbytes bytes, may travel
// inline (zp_inline_check): OK, or the InlineBad* it breaks.
func CheckInline(dt uint16, flags uint8, shape []int64, nbytes uint64) int {
	if len(shape) > MaxNDim {
		return InlineBadHeader
	}
	return int(C.zp_inline_check(C.uint32_t(dt), C.uint32_t(flags), C.uint32_t(len(shape)), (*C.int64_t)(first64(shape)),
		C.uint64_t(nbytes)))
}

// InlineHead writes the header of an inline array into dst, which holds at
// least InlineHeaderSize + 8*len(shape) bytes, and returns where its
// elements go (zp_inline_head). shape has at most MaxNDim dimensions.
func InlineHead(dst []byte, dt uint16, flags uint8, shape []int64) int {
	n := InlineHeaderSize + 8*len(shape)
	if len(shape) > MaxNDim || len(dst) < n {
		panic("plane: an inline array header past its buffer")
	}
	return int(C.zp_inline_head((*C.uint8_t)(unsafe.Pointer(&dst[0])), C.uint16_t(dt), C.uint8_t(flags),
		C.uint8_t(len(shape)), (*C.int64_t)(first64(shape))))
}

// ReadInline reads the inline array that payload holds (zp_inline_read):
// its type, flags and shape, where its elements start in payload, and OK
// or the InlineBad* it breaks (the fields read before that are given).
func ReadInline(payload []byte) (dt uint16, flags uint8, shape []int64, at int, bad int) {
	var in C.zp_inline
	bad = int(C.zp_inline_read((*C.uint8_t)(first(payload)), C.uint64_t(len(payload)), &in))
	dt, flags = uint16(in.dtype), uint8(in.flags)
	if int(in.ndim) <= MaxNDim {
		shape = make([]int64, in.ndim)
		for i := range shape {
			shape[i] = int64(in.shape[i])
		}
	}
	return dt, flags, shape, int(in.at), bad
}

func first64(s []int64) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}
