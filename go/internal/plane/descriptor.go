package plane

/*
#cgo noescape zp_byte_count
#cgo nocallback zp_byte_count
#cgo noescape zp_extent
#cgo nocallback zp_extent
#cgo noescape zp_desc_size
#cgo nocallback zp_desc_size
#cgo noescape zp_desc_check
#cgo nocallback zp_desc_check
#cgo noescape zp_desc_read
#cgo nocallback zp_desc_read
#cgo noescape zp_desc_write
#cgo nocallback zp_desc_write
#include "plane.h"
*/
import "C"

import (
	"unsafe"
)

// The functions of descriptor.c are declared noescape and nocallback:
// they keep no pointer they are given and never call Go. So a Desc or a
// shape that a caller keeps on its stack stays there, and a call costs
// what a call of a few instructions' work must, not an allocation.

// What a descriptor breaks (plane.h, ZP_BAD_DESC_*), as ReadDescriptor and
// CheckDescriptor report it, in the order they are checked; OK when
// nothing.
const (
	DescTruncated  = C.ZP_BAD_DESC_TRUNCATED
	DescTicketCut  = C.ZP_BAD_DESC_TICKET_CUT
	DescTicketSize = C.ZP_BAD_DESC_TICKET_SIZE
	DescSize       = C.ZP_BAD_DESC_SIZE
	DescKind       = C.ZP_BAD_DESC_KIND
	DescFlags      = C.ZP_BAD_DESC_FLAGS
	DescNDim       = C.ZP_BAD_DESC_NDIM
	DescName       = C.ZP_BAD_DESC_NAME
	DescTicket     = C.ZP_BAD_DESC_TICKET
	DescDType      = C.ZP_BAD_DESC_DTYPE
	DescNegative   = C.ZP_BAD_DESC_NEGATIVE
	DescOverflow   = C.ZP_BAD_DESC_OVERFLOW
	DescExtent     = C.ZP_BAD_DESC_EXTENT
	// MaxName is the longest name a descriptor holds, its own or its
	// ticket arena's.
	MaxName = C.ZP_MAX_NAME
	// DescriptorBase is the fixed part of a descriptor, TicketBase that of
	// its ticket block: their names follow them.
	DescriptorBase = C.ZP_DESC_BASE
	TicketBase     = C.ZP_TICKET_BASE
)

// Desc is a descriptor as the plane reads, checks and writes it (plane.h's
// zp_desc, laid out the same: checked below when this compiles). Its
// names are not in it: NameAt and ArenaAt say where they lie in the bytes
// ReadDescriptor read, and WriteDescriptor takes them. ArenaLen is 0 for a
// descriptor with no ticket.
type Desc struct {
	Kind             uint8
	Flags            uint8
	DType            uint16
	NDim             uint32
	Size             uint32
	NameAt           uint32
	NameLen          uint32
	ArenaAt          uint32
	ArenaLen         uint32
	Slot             uint32
	Generation       uint32
	TicketSlot       uint32
	TicketGeneration uint32
	_                uint32
	Offset           uint64
	NBytes           uint64
	Nonce            uint64
	Shape            [MaxNDim]int64
	Strides          [MaxNDim]int64
}

// descLayout is 0 when Desc is laid out as C's zp_desc: the differences of
// their sizes and of each field's offset, or'ed. A negative uintptr
// constant does not compile, so neither does a Desc that drifted from it.
const descLayout = (unsafe.Sizeof(Desc{}) ^ unsafe.Sizeof(C.zp_desc{})) |
	(unsafe.Offsetof(Desc{}.Kind) ^ unsafe.Offsetof(C.zp_desc{}.kind)) |
	(unsafe.Offsetof(Desc{}.Flags) ^ unsafe.Offsetof(C.zp_desc{}.flags)) |
	(unsafe.Offsetof(Desc{}.DType) ^ unsafe.Offsetof(C.zp_desc{}.dtype)) |
	(unsafe.Offsetof(Desc{}.NDim) ^ unsafe.Offsetof(C.zp_desc{}.ndim)) |
	(unsafe.Offsetof(Desc{}.Size) ^ unsafe.Offsetof(C.zp_desc{}.size)) |
	(unsafe.Offsetof(Desc{}.NameAt) ^ unsafe.Offsetof(C.zp_desc{}.name_at)) |
	(unsafe.Offsetof(Desc{}.NameLen) ^ unsafe.Offsetof(C.zp_desc{}.name_len)) |
	(unsafe.Offsetof(Desc{}.ArenaAt) ^ unsafe.Offsetof(C.zp_desc{}.arena_at)) |
	(unsafe.Offsetof(Desc{}.ArenaLen) ^ unsafe.Offsetof(C.zp_desc{}.arena_len)) |
	(unsafe.Offsetof(Desc{}.Slot) ^ unsafe.Offsetof(C.zp_desc{}.slot)) |
	(unsafe.Offsetof(Desc{}.Generation) ^ unsafe.Offsetof(C.zp_desc{}.generation)) |
	(unsafe.Offsetof(Desc{}.TicketSlot) ^ unsafe.Offsetof(C.zp_desc{}.ticket_slot)) |
	(unsafe.Offsetof(Desc{}.TicketGeneration) ^ unsafe.Offsetof(C.zp_desc{}.ticket_generation)) |
	(unsafe.Offsetof(Desc{}.Offset) ^ unsafe.Offsetof(C.zp_desc{}.offset)) |
	(unsafe.Offsetof(Desc{}.NBytes) ^ unsafe.Offsetof(C.zp_desc{}.nbytes)) |
	(unsafe.Offsetof(Desc{}.Nonce) ^ unsafe.Offsetof(C.zp_desc{}.nonce)) |
	(unsafe.Offsetof(Desc{}.Shape) ^ unsafe.Offsetof(C.zp_desc{}.shape)) |
	(unsafe.Offsetof(Desc{}.Strides) ^ unsafe.Offsetof(C.zp_desc{}.strides))

var _ [-descLayout]struct{}

func (d *Desc) c() *C.zp_desc { return (*C.zp_desc)(unsafe.Pointer(d)) }

// ReadDescriptor reads and checks the descriptor at the start of src, a
// private copy, into d (zp_desc_read): OK, or the Desc* it breaks, with
// the fields read before that in d. Its size is d.Size.
func ReadDescriptor(src []byte, d *Desc) int {
	return int(C.zp_desc_read((*C.uint8_t)(first(src)), C.uint64_t(len(src)), d.c()))
}

// CheckDescriptor checks d's fields (zp_desc_check): OK, or the Desc*
// (DescKind on) it breaks.
func CheckDescriptor(d *Desc) int { return int(C.zp_desc_check(d.c())) }

// DescriptorSize returns the encoded size of a descriptor of ndim
// dimensions, a name of nameLen bytes and a ticket arena's of arenaLen (0:
// no ticket), a multiple of 8 (zp_desc_size).
func DescriptorSize(ndim, nameLen, arenaLen int) int {
	return int(C.zp_desc_size(C.uint64_t(ndim), C.uint64_t(nameLen), C.uint64_t(arenaLen)))
}

// WriteDescriptor writes d, with the name name and, when arena is not
// empty, a ticket of that arena, into dst, which holds at least its size,
// and returns its size (zp_desc_write). It sets d.NameLen and d.ArenaLen
// from them. d's dimensions and names fit the format (at most MaxNDim,
// and MaxName bytes; a descriptor that checks has them): it panics on
// those that do not, or a dst too small.
func WriteDescriptor(dst []byte, d *Desc, name, arena string) int {
	d.NameLen, d.ArenaLen = uint32(min(len(name), MaxName+1)), uint32(min(len(arena), MaxName+1))
	n := int(C.zp_desc_write((*C.uint8_t)(first(dst)), C.uint64_t(len(dst)), d.c(), (*C.uint8_t)(stringData(name)),
		(*C.uint8_t)(stringData(arena))))
	if n == 0 {
		panic("plane: a descriptor that does not fit its format or its buffer")
	}
	return n
}

// ByteCount returns the bytes an array with this shape and element size
// makes, 0 when a dimension is 0, and false when the product of the
// nonzero dimensions and itemsize passes 2^63 - 1 (zp_byte_count).
func ByteCount(shape []int64, itemsize int) (uint64, bool) {
	var n C.uint64_t
	ok := C.zp_byte_count(C.uint32_t(len(shape)), (*C.int64_t)(first64(shape)), C.uint64_t(itemsize), &n)
	return uint64(n), ok != 0
}

// Extent returns one past the last byte an array with this shape and
// non-negative byte strides (at least one for each dimension) touches, 0
// for an array with no elements, and false when that passes 2^63 - 1
// (zp_extent).
func Extent(shape, strides []int64, itemsize int) (uint64, bool) {
	if len(strides) < len(shape) {
		panic("plane: an array with fewer strides than dimensions")
	}
	var end C.uint64_t
	ok := C.zp_extent(C.uint32_t(len(shape)), (*C.int64_t)(first64(shape)), (*C.int64_t)(first64(strides)),
		C.uint64_t(itemsize), &end)
	return uint64(end), ok != 0
}

func stringData(s string) unsafe.Pointer {
	if s == "" {
		return nil
	}
	return unsafe.Pointer(unsafe.StringData(s))
}
