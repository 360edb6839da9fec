// Package header encodes and validates the header that starts every zctipc
// segment (layout version 1, specified byte by byte in docs/format.md).
//
// A header is written by another process and must be treated as hostile:
// Decode works on a private copy of the bytes, checks every field against the
// copy and the size of the file, and returns a Header that the caller uses in
// place of the shared bytes.
package header

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/bits"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/proc"
	"golang.org/x/sys/unix"
)

// Layout constants of version 1.
const (
	Magic          uint32 = 0x5A435449 // "ITCZ" on disk: little-endian "ZCTI"
	Version        uint16 = 1
	FixedSize             = 128 // bytes before the shape array
	MaxNDim               = 32
	MaxSize               = FixedSize + 16*MaxNDim
	DataAlign             = 64
	RefcountOffset        = 64 // int64, the only field other processes change
	CreatedOffset         = 48 // int64, created_ns: new for every segment made in a file
	checksumOffset        = 56
	reservedOffset        = 60 // bytes 60-63 and 72-127: zero in version 1
)

func zero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Kind says what the data region of a segment holds. It is the low byte of
// the flags word.
type Kind uint8

// The kinds of layout version 1.
const (
	KindTensor Kind = 1 // an n-dimensional array, described by dtype/shape/strides
	KindArena  Kind = 2 // a pool arena (one uint8 dimension)
	KindQueue  Kind = 3 // a message queue (one uint8 dimension)
	KindStream Kind = 4 // a multi-reader frame ring (one uint8 dimension)
	KindTable  Kind = 5 // an Arrow IPC stream (one uint8 dimension)
	KindLedger Kind = 6 // the counts one process holds (one uint8 dimension)
	KindEvent  Kind = 7 // a flag processes set, clear and wait for (one uint8 dimension)
	maxKind         = KindEvent
)

const (
	kindMask    = 0xff
	flagTracked = 1 << 8
	knownFlags  = kindMask | flagTracked
)

var kindNames = [...]string{KindTensor: "tensor", KindArena: "arena", KindQueue: "queue", KindStream: "stream", KindTable: "table", KindLedger: "ledger", KindEvent: "event"}

// String returns the name of k ("tensor").
func (k Kind) String() string {
	if k == 0 || k > maxKind {
		return fmt.Sprintf("kind(%d)", uint8(k))
	}
	return kindNames[k]
}

// Errors that Decode returns, each wrapped with the detail of what failed.
var (
	// ErrNotZctipc means the bytes do not start with the zctipc magic.
	ErrNotZctipc = errors.New("not a zctipc segment")
	// ErrVersion means the header has a layout version this code does not read.
	ErrVersion = errors.New("incompatible layout version")
	// ErrCorrupt means a field is inconsistent, out of range or fails the checksum.
	ErrCorrupt = errors.New("corrupt header")
)

// Header is the decoded, validated content of a segment header.
type Header struct {
	Kind       Kind
	DType      dtype.DType
	Shape      []int64
	Strides    []int64 // in bytes, one per dimension
	DataOffset uint64  // from the start of the segment; a multiple of DataAlign
	NBytes     uint64  // bytes of data after DataOffset
	Creator    proc.Identity
	CreatedNS  int64 // CLOCK_REALTIME nanoseconds at creation
	Refcount   int64 // the value when the header was read; it changes afterwards
	// Tracked says that the creator recorded its counts in a ledger, so that
	// the cleanup daemon may remove the segment once no live process holds
	// it.
	Tracked bool
}

var le = binary.LittleEndian

// New returns the header of a C-contiguous array of the given type and shape,
// with its data placed right after the header. Creator, CreatedNS and
// Refcount are left for the caller. Bad arguments give errors wrapping
// unix.EINVAL or dtype.ErrUnsupported; a kind other than KindTensor takes
// uint8 in one dimension only (docs/format.md, "Segment kinds").
func New(kind Kind, dt dtype.DType, shape []int64) (Header, error) {
	if kind == 0 || kind > maxKind {
		return Header{}, fmt.Errorf("segment kind %d: %w", kind, unix.EINVAL)
	}
	if err := dt.Check(); err != nil {
		return Header{}, err
	}
	if kind != KindTensor && (dt != dtype.Uint8 || len(shape) != 1) {
		return Header{}, fmt.Errorf("a %s segment of %s and shape %v: a %s holds uint8 in one dimension: %w",
			kind, dt, shape, kind, unix.EINVAL)
	}
	if len(shape) > MaxNDim {
		return Header{}, fmt.Errorf("ndim %d exceeds the limit of %d: %w", len(shape), MaxNDim, unix.EINVAL)
	}
	for i, n := range shape {
		if n < 0 {
			return Header{}, fmt.Errorf("shape[%d] = %d is negative: %w", i, n, unix.EINVAL)
		}
	}
	nbytes, ok := ByteCount(shape, dt.Size())
	if !ok {
		return Header{}, fmt.Errorf("shape %v of %s overflows int64 bytes: %w", shape, dt, unix.EINVAL)
	}
	h := Header{
		Kind:    kind,
		DType:   dt,
		Shape:   append(make([]int64, 0, len(shape)), shape...),
		Strides: ContiguousStrides(shape, dt.Size()),
		NBytes:  nbytes,
	}
	h.DataOffset = alignUp(uint64(h.Len()), DataAlign)
	if h.DataOffset+h.NBytes > math.MaxInt64 {
		return Header{}, fmt.Errorf("shape %v of %s is too large: %w", shape, dt, unix.EINVAL)
	}
	return h, nil
}

// ContiguousStrides returns the byte strides of a C-ordered array.
func ContiguousStrides(shape []int64, itemsize int) []int64 {
	strides := make([]int64, len(shape))
	step := int64(itemsize)
	for i := len(shape) - 1; i >= 0; i-- {
		strides[i] = step
		if shape[i] > 0 {
			step *= shape[i]
		}
	}
	return strides
}

// Len returns the length of the encoded header: the fixed part and the shape
// and stride arrays.
func (h Header) Len() int { return FixedSize + 16*len(h.Shape) }

// SegmentSize returns the size of the whole segment: header, padding and data.
func (h Header) SegmentSize() uint64 { return h.DataOffset + h.NBytes }

// Encode writes h into buf, which must hold at least h.Len() bytes, and
// computes the checksum.
func (h Header) Encode(buf []byte) {
	ndim := len(h.Shape)
	clear(buf[:h.Len()])
	le.PutUint32(buf[0:], Magic)
	le.PutUint16(buf[4:], Version)
	le.PutUint16(buf[6:], uint16(h.Len()))
	flags := uint32(h.Kind)
	if h.Tracked {
		flags |= flagTracked
	}
	le.PutUint32(buf[8:], flags)
	le.PutUint16(buf[12:], uint16(h.DType))
	le.PutUint16(buf[14:], uint16(ndim))
	le.PutUint64(buf[16:], h.DataOffset)
	le.PutUint64(buf[24:], h.NBytes)
	le.PutUint64(buf[32:], uint64(h.Creator.PID))
	le.PutUint64(buf[40:], h.Creator.StartTime)
	le.PutUint64(buf[CreatedOffset:], uint64(h.CreatedNS))
	le.PutUint64(buf[RefcountOffset:], uint64(h.Refcount))
	for i := range ndim {
		le.PutUint64(buf[FixedSize+8*i:], uint64(h.Shape[i]))
		le.PutUint64(buf[FixedSize+8*(ndim+i):], uint64(h.Strides[i]))
	}
	le.PutUint32(buf[checksumOffset:], Checksum(buf))
}

// Checksum returns the CRC-32 (IEEE, as zlib computes it) of the fields that
// never change: bytes [0, 56) and the shape and stride arrays. buf must hold
// the whole header; the header length is read from buf itself.
func Checksum(buf []byte) uint32 {
	hlen := int(le.Uint16(buf[6:]))
	c := crc32.ChecksumIEEE(buf[:checksumOffset])
	if hlen > FixedSize && hlen <= len(buf) {
		c = crc32.Update(c, crc32.IEEETable, buf[FixedSize:hlen])
	}
	return c
}

// Decode validates the header at the start of buf, a private copy of the first
// bytes of a segment whose file is fileSize bytes long, and returns it. Every
// error wraps ErrNotZctipc, ErrVersion, ErrCorrupt or dtype.ErrUnsupported.
func Decode(buf []byte, fileSize uint64) (Header, error) {
	if len(buf) < 4 || le.Uint32(buf) != Magic {
		return Header{}, ErrNotZctipc
	}
	if len(buf) < FixedSize {
		if len(buf) >= 6 && le.Uint16(buf[4:]) != Version {
			return Header{}, fmt.Errorf("%w %d (this library reads %d)", ErrVersion, le.Uint16(buf[4:]), Version)
		}
		return Header{}, fmt.Errorf("%w: truncated: %d bytes, the header needs %d", ErrCorrupt, len(buf), FixedSize)
	}
	if v := le.Uint16(buf[4:]); v != Version {
		return Header{}, fmt.Errorf("%w %d (this library reads %d)", ErrVersion, v, Version)
	}
	hlen := int(le.Uint16(buf[6:]))
	flags := le.Uint32(buf[8:])
	ndim := int(le.Uint16(buf[14:]))
	if ndim > MaxNDim {
		return Header{}, fmt.Errorf("%w: ndim %d exceeds the limit of %d", ErrCorrupt, ndim, MaxNDim)
	}
	if hlen != FixedSize+16*ndim {
		return Header{}, fmt.Errorf("%w: header length %d does not match ndim %d", ErrCorrupt, hlen, ndim)
	}
	if len(buf) < hlen {
		return Header{}, fmt.Errorf("%w: truncated: %d bytes, the header needs %d", ErrCorrupt, len(buf), hlen)
	}
	if sum, want := le.Uint32(buf[checksumOffset:]), Checksum(buf[:hlen]); sum != want {
		return Header{}, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	h := Header{
		Kind:       Kind(flags & kindMask),
		DType:      dtype.DType(le.Uint16(buf[12:])),
		Shape:      make([]int64, ndim),
		Strides:    make([]int64, ndim),
		DataOffset: le.Uint64(buf[16:]),
		NBytes:     le.Uint64(buf[24:]),
		Creator:    proc.Identity{PID: int64(le.Uint64(buf[32:])), StartTime: le.Uint64(buf[40:])},
		CreatedNS:  int64(le.Uint64(buf[CreatedOffset:])),
		Refcount:   int64(le.Uint64(buf[RefcountOffset:])),
		Tracked:    flags&flagTracked != 0,
	}
	if flags&^knownFlags != 0 {
		return Header{}, fmt.Errorf("%w: unknown flag bits %#x", ErrCorrupt, flags&^knownFlags)
	}
	if h.Kind == 0 || h.Kind > maxKind {
		return Header{}, fmt.Errorf("%w: unknown segment kind %d", ErrCorrupt, h.Kind)
	}
	if !zero(buf[reservedOffset:RefcountOffset]) || !zero(buf[RefcountOffset+8:FixedSize]) {
		return Header{}, fmt.Errorf("%w: reserved header bytes are not zero", ErrCorrupt)
	}
	if err := h.DType.Check(); err != nil {
		return Header{}, err
	}
	for i := range ndim {
		h.Shape[i] = int64(le.Uint64(buf[FixedSize+8*i:]))
		h.Strides[i] = int64(le.Uint64(buf[FixedSize+8*(ndim+i):]))
		if h.Shape[i] < 0 || h.Strides[i] < 0 {
			return Header{}, fmt.Errorf("%w: negative shape or stride in dimension %d", ErrCorrupt, i)
		}
	}
	if _, ok := ByteCount(h.Shape, h.DType.Size()); !ok {
		return Header{}, fmt.Errorf("%w: shape %v of %s overflows int64 bytes", ErrCorrupt, h.Shape, h.DType)
	}
	extent, ok := Extent(h.Shape, h.Strides, h.DType.Size())
	if !ok || extent > h.NBytes {
		return Header{}, fmt.Errorf("%w: shape %v with strides %v reaches past the %d data bytes", ErrCorrupt, h.Shape, h.Strides, h.NBytes)
	}
	if h.DataOffset%DataAlign != 0 || h.DataOffset < uint64(hlen) {
		return Header{}, fmt.Errorf("%w: data offset %d is not a multiple of %d after the header", ErrCorrupt, h.DataOffset, DataAlign)
	}
	end, carry := bits.Add64(h.DataOffset, h.NBytes, 0)
	if carry != 0 || end > math.MaxInt64 || end > fileSize {
		return Header{}, fmt.Errorf("%w: truncated: the header claims %d+%d bytes, the file has %d", ErrCorrupt, h.DataOffset, h.NBytes, fileSize)
	}
	return h, nil
}

// ByteCount returns itemsize times the product of shape, and false if the
// product of the non-zero dimensions overflows int64: an array with a zero
// dimension holds nothing, but its other dimensions must still be sane
// (NumPy refuses them otherwise).
//
// Package plane counts the same in C (zp_byte_count, zp_extent), for the
// checks of a descriptor and of an inline array that the C ABI runs
// without entering Go. Go keeps its own copy because a call into C costs
// more than the count (about 65 ns a call where it was measured, against
// a few), on paths every hand-off takes (buffer's Describe, an inline
// put, a stream's frame); TestCountsAreThePlanes holds the two to each
// other.
func ByteCount(shape []int64, itemsize int) (uint64, bool) {
	n, empty := uint64(itemsize), false
	for _, d := range shape {
		if d == 0 {
			empty = true
			continue
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, false
		}
		n = lo
	}
	if empty {
		return 0, true
	}
	return n, true
}

// Extent returns one past the last byte an array with these shape and
// non-negative byte strides touches, 0 for an array with no elements, and
// false on overflow.
func Extent(shape, strides []int64, itemsize int) (uint64, bool) {
	last := uint64(0)
	for i, d := range shape {
		if d == 0 {
			return 0, true
		}
		hi, lo := bits.Mul64(uint64(d-1), uint64(strides[i]))
		if hi != 0 {
			return 0, false
		}
		var carry uint64
		last, carry = bits.Add64(last, lo, 0)
		if carry != 0 || last > math.MaxInt64 {
			return 0, false
		}
	}
	end, carry := bits.Add64(last, uint64(itemsize), 0)
	return end, carry == 0 && end <= math.MaxInt64
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) &^ (a - 1) }
