// Package message encodes and decodes the records of a zctipc queue and the
// buffer descriptors they carry (docs/format.md, "Queue messages").
//
// A descriptor names memory in another segment (a tensor segment of its own,
// or a slot of a pool arena) and the array laid over it. It carries one count
// on that memory: whoever takes the record from the queue owns the count.
// Records are read from a ring that other processes write, so decoding works
// on a private copy and checks every length and bound.
package message

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/plane"
)

// Record types.
const (
	TypePickle = 1 // a pickle (protocol 5) that refers to its descriptors by index
	TypeTensor = 2 // one descriptor and no payload: a bare array
	TypeBytes  = 3 // raw bytes and no descriptor
	TypeInline = 4 // a small array copied into the payload (Inline), no descriptor
)

// Descriptor kinds: what the memory of a descriptor is.
const (
	RefSegment = 1 // the data region of a tensor segment
	RefSlot    = 2 // a slot of a pool arena
)

// Layout constants.
const (
	RecordHeaderSize = 16
	// MaxDescriptors bounds the descriptors of one record.
	MaxDescriptors = 0xFFFF
	// MaxViews is the most views a record's header can ask a get for
	// (Views): an inline record that claims MaxDescriptors descriptors
	// asks one more than any record that decodes, and a get that gives
	// room for fewer could never take it.
	MaxViews   = MaxDescriptors + 1
	maxNameLen = 255
)

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("malformed message")

var le = binary.LittleEndian

// Descriptor is one buffer of a record.
type Descriptor struct {
	Kind       uint8
	Flags      uint8 // bits 0-1: the Python type to rebuild (0 NumPy, 1 torch, 2 SharedTensor); bit 2: read-only
	DType      dtype.DType
	Shape      []int64
	Strides    []int64 // bytes
	Name       string  // the segment, or the arena of the slot
	Offset     uint64  // where the array starts in the segment's data region
	NBytes     uint64  // bytes from Offset that the array may touch
	Slot       uint32  // the slot index (RefSlot)
	Generation uint32  // the slot's generation when it was handed out (RefSlot)
	Ticket     Ticket  // the claim on the count it carries, for a descriptor that carries one
}

// Ticket names the ticket of a descriptor that carries a count: the slot
// of a ticket arena whose first word holds Nonce until the count is taken
// (Note [a count is taken once] in package pool). Its zero value is no
// ticket.
type Ticket struct {
	Arena      string
	Slot       uint32
	Generation uint32
	Nonce      uint64
}

// Note [one descriptor codec]. A descriptor is read, checked and written
// by package plane (descriptor.c), in C, so that the C ABI's calls that
// never enter Go take the same bytes by the same rules as Go does; this
// package turns a Descriptor into the plane's Desc and back, and words
// what the plane refuses as it always has (ErrMalformed and the detail
// that users and tests see). The plane checks in the order this package
// always did, so a descriptor broken twice is refused for the same reason.
//
// Size alone is Go's own, the same sum of three lengths as zp_desc_size:
// a put asks a record's size several times (Record.Size, Parts, Encode),
// and a call into C costs more than the sum (about 65 ns a call on the
// machine that measured it, against a nanosecond), which would have made
// a descriptor's encoding several times slower. TestDescriptorSize holds
// the two to each other over every ndim and name length the format has.

// Size returns the encoded size of d, a multiple of 8.
func (d *Descriptor) Size() int {
	n := align8(plane.DescriptorBase + 16*len(d.Shape) + len(d.Name))
	if d.Ticket.Arena != "" {
		n += align8(plane.TicketBase + len(d.Ticket.Arena))
	}
	return n
}

// toPlane writes d's fields into c, for the plane's check or encoder. A
// Descriptor may hold what a Desc cannot (more than MaxNDim dimensions, or
// strides that are not one for each): it is given NDim past MaxNDim, which
// the plane refuses (plane.DescNDim) where this package always did. Names
// past MaxName are given as MaxName + 1 bytes long, which the plane refuses.
func (d *Descriptor) toPlane(c *plane.Desc) {
	c.Kind, c.Flags, c.DType = d.Kind, d.Flags, uint16(d.DType)
	c.Offset, c.NBytes, c.Slot, c.Generation = d.Offset, d.NBytes, d.Slot, d.Generation
	c.NameLen, c.ArenaLen = uint32(min(len(d.Name), maxNameLen+1)), uint32(min(len(d.Ticket.Arena), maxNameLen+1))
	c.Nonce, c.TicketSlot, c.TicketGeneration = d.Ticket.Nonce, d.Ticket.Slot, d.Ticket.Generation
	if len(d.Shape) > header.MaxNDim || len(d.Strides) != len(d.Shape) {
		c.NDim = header.MaxNDim + 1
		return
	}
	c.NDim = uint32(len(d.Shape))
	copy(c.Shape[:], d.Shape)
	copy(c.Strides[:], d.Strides)
}

// Plane writes d's fields into c as the plane has them (toPlane), for a
// step of the plane that checks and uses them in one call (package pool's
// AdoptSent).
func (d *Descriptor) Plane(c *plane.Desc) { d.toPlane(c) }

// fromPlane returns the descriptor c, read from src by the plane.
func fromPlane(src []byte, c *plane.Desc) Descriptor {
	ndim := int(c.NDim)
	dims := make([]int64, 2*ndim) // the shape and the strides, in one allocation
	copy(dims, c.Shape[:ndim])
	copy(dims[ndim:], c.Strides[:ndim])
	d := Descriptor{
		Kind:       c.Kind,
		Flags:      c.Flags,
		DType:      dtype.DType(c.DType),
		Shape:      dims[:ndim:ndim],
		Strides:    dims[ndim:],
		Name:       string(src[c.NameAt : c.NameAt+c.NameLen]),
		Offset:     c.Offset,
		NBytes:     c.NBytes,
		Slot:       c.Slot,
		Generation: c.Generation,
	}
	if c.ArenaLen > 0 {
		d.Ticket = Ticket{Arena: string(src[c.ArenaAt : c.ArenaAt+c.ArenaLen]), Slot: c.TicketSlot,
			Generation: c.TicketGeneration, Nonce: c.Nonce}
	}
	return d
}

// refused is the error of d, which breaks bad (a plane.Desc* from
// plane.DescKind on), nil for plane.OK.
func (d *Descriptor) refused(bad int) error {
	switch bad {
	case plane.OK:
		return nil
	case plane.DescKind:
		return fmt.Errorf("%w: descriptor kind %d", ErrMalformed, d.Kind)
	case plane.DescFlags:
		return fmt.Errorf("%w: descriptor flags %#x", ErrMalformed, d.Flags)
	case plane.DescNDim:
		return fmt.Errorf("%w: descriptor ndim %d", ErrMalformed, len(d.Shape))
	case plane.DescName:
		return fmt.Errorf("%w: descriptor name of %d bytes", ErrMalformed, len(d.Name))
	case plane.DescTicket:
		return fmt.Errorf("%w: descriptor ticket of a %d-byte name and nonce %#x", ErrMalformed, len(d.Ticket.Arena), d.Ticket.Nonce)
	case plane.DescDType:
		return fmt.Errorf("%w: %w", ErrMalformed, d.DType.Check())
	case plane.DescNegative:
		return fmt.Errorf("%w: negative shape or stride in descriptor", ErrMalformed)
	case plane.DescOverflow:
		return fmt.Errorf("%w: descriptor shape %v overflows", ErrMalformed, d.Shape)
	default:
		return fmt.Errorf("%w: descriptor array reaches past its %d bytes", ErrMalformed, d.NBytes)
	}
}

// Check validates d's fields: its kind, type, dimensions, name length, and
// that the array fits in NBytes.
func (d *Descriptor) Check() error {
	var c plane.Desc
	d.toPlane(&c)
	return d.refused(plane.CheckDescriptor(&c))
}

// Encode writes d into dst, which holds at least d.Size() bytes, and returns
// the bytes written. d checks (Check): Encode panics on dimensions or names
// the format cannot hold.
func (d *Descriptor) Encode(dst []byte) int {
	var c plane.Desc
	d.toPlane(&c)
	return plane.WriteDescriptor(dst, &c, d.Name, d.Ticket.Arena)
}

// DecodeDescriptor decodes and checks the descriptor at the start of src and
// returns it with its encoded size.
func DecodeDescriptor(src []byte) (Descriptor, int, error) {
	var c plane.Desc
	switch bad := plane.ReadDescriptor(src, &c); bad {
	case plane.OK:
		return fromPlane(src, &c), int(c.Size), nil
	case plane.DescTruncated:
		return Descriptor{}, 0, fmt.Errorf("%w: descriptor truncated", ErrMalformed)
	case plane.DescTicketCut:
		return Descriptor{}, 0, fmt.Errorf("%w: descriptor of %d bytes truncates its ticket", ErrMalformed, c.Size)
	case plane.DescTicketSize:
		return Descriptor{}, 0, fmt.Errorf("%w: descriptor of %d bytes with a %d-byte ticket name", ErrMalformed, c.Size, c.ArenaLen)
	case plane.DescSize:
		return Descriptor{}, 0, fmt.Errorf("%w: descriptor of %d bytes with ndim %d and a %d-byte name", ErrMalformed, c.Size, c.NDim, c.NameLen)
	default:
		d := fromPlane(src, &c)
		return Descriptor{}, 0, d.refused(bad)
	}
}

// Record is one message of a queue.
type Record struct {
	Type        uint8
	Descriptors []Descriptor
	Payload     []byte
	// Inline is the array of an inline record: DecodeRecord sets it (its
	// Data in the payload), and a sender may set it and leave Payload nil,
	// for Encode to write the payload from it, with none of its own to copy.
	Inline Inline
}

// fromInline reports whether r's payload is to be written from r.Inline.
func (r *Record) fromInline() bool { return r.Type == TypeInline && r.Payload == nil }

// payloadSize returns the bytes of r's payload: Payload's, or those
// Inline encodes to.
func (r *Record) payloadSize() int {
	if r.fromInline() {
		return r.Inline.Size()
	}
	return len(r.Payload)
}

// Size returns the encoded size of r, a multiple of 8.
func (r *Record) Size() int {
	n := RecordHeaderSize + r.payloadSize()
	for i := range r.Descriptors {
		n += r.Descriptors[i].Size()
	}
	return align8(n)
}

// Views returns the views a taker of a record of type typ with
// descriptors descriptors is given: one per descriptor, and for an inline
// record one of its array, which lies in the record.
func Views(typ uint8, descriptors int) int {
	if typ == TypeInline {
		return descriptors + 1
	}
	return descriptors
}

// Check validates r's type against its descriptors and payload.
func (r *Record) Check() error {
	if err := r.checkFraming(); err != nil {
		return err
	}
	for i := range r.Descriptors {
		if err := r.Descriptors[i].Check(); err != nil {
			return err
		}
	}
	switch {
	case r.fromInline():
		return r.Inline.Check()
	case r.Type == TypeInline:
		_, err := DecodeInline(r.Payload)
		return err
	}
	return nil
}

// checkFraming is Check but for the descriptors (which Decode has
// DecodeDescriptor check, each once: a check is a call into C) and an
// inline record's array.
func (r *Record) checkFraming() error {
	switch {
	case len(r.Descriptors) > MaxDescriptors:
		return fmt.Errorf("%w: %d descriptors", ErrMalformed, len(r.Descriptors))
	case r.Type == TypeTensor && (len(r.Descriptors) != 1 || len(r.Payload) != 0):
		return fmt.Errorf("%w: a tensor record holds one descriptor and no payload", ErrMalformed)
	case (r.Type == TypeBytes || r.Type == TypeInline) && len(r.Descriptors) != 0:
		return fmt.Errorf("%w: a bytes or inline record holds no descriptor", ErrMalformed)
	case r.Type < TypePickle || r.Type > TypeInline:
		return fmt.Errorf("%w: record type %d", ErrMalformed, r.Type)
	case r.Type != TypeInline && (r.Inline.Shape != nil || r.Inline.Data != nil):
		return fmt.Errorf("%w: a record of type %d with an inline array", ErrMalformed, r.Type)
	}
	return nil
}

// Encode writes r into dst, which holds at least r.Size() bytes.
func (r *Record) Encode(dst []byte) {
	at := r.encodePrefix(dst, true)
	if !r.fromInline() {
		at += copy(dst[at:], r.Payload)
	}
	clear(dst[at:r.Size()])
}

// Parts returns r as the data plane writes it (package plane): its prefix
// (the header, the descriptors, and an inline record's array header),
// encoded, and the bytes that follow it (the payload, or an inline
// array's elements), the padding to r.Size() left out.
func (r *Record) Parts() (prefix, payload []byte) {
	n := RecordHeaderSize
	for i := range r.Descriptors {
		n += r.Descriptors[i].Size()
	}
	if r.fromInline() {
		n += r.Inline.Size() - len(r.Inline.Data)
	}
	prefix = make([]byte, n)
	r.encodePrefix(prefix, false)
	if r.fromInline() {
		return prefix, r.Inline.Data
	}
	return prefix, r.Payload
}

// encodePrefix writes r's header, its descriptors and an inline record's
// array header (and its elements, with elements) into dst, and returns the
// bytes written.
func (r *Record) encodePrefix(dst []byte, elements bool) int {
	le.PutUint32(dst[0:], uint32(r.Size()))
	dst[4] = r.Type
	dst[5] = 0
	le.PutUint16(dst[6:], uint16(len(r.Descriptors)))
	le.PutUint32(dst[8:], uint32(r.payloadSize()))
	le.PutUint32(dst[12:], 0)
	at := RecordHeaderSize
	for i := range r.Descriptors {
		at += r.Descriptors[i].Encode(dst[at:])
	}
	if r.fromInline() {
		at += EncodeInline(dst[at:], r.Inline.DType, r.Inline.Flags, r.Inline.Shape)
		if elements {
			at += copy(dst[at:], r.Inline.Data)
		}
	}
	return at
}

// DecodeRecord decodes and checks the record that is exactly src (a private
// copy). The payload, and an inline record's Inline, alias src.
func DecodeRecord(src []byte) (Record, error) {
	var r Record
	err := r.Decode(src)
	return r, err
}

// Decode is DecodeRecord into r, which it overwrites (with the zero
// Record when src is no record).
func (r *Record) Decode(src []byte) error {
	*r = Record{}
	if len(src) < RecordHeaderSize || len(src)%8 != 0 || int(le.Uint32(src)) != len(src) {
		return fmt.Errorf("%w: record of %d bytes", ErrMalformed, len(src))
	}
	r.Type = src[4]
	if n := le.Uint16(src[6:]); n > 0 {
		r.Descriptors = make([]Descriptor, n)
	}
	payload := int(le.Uint32(src[8:]))
	at := RecordHeaderSize
	for i := range r.Descriptors {
		d, n, err := DecodeDescriptor(src[at:])
		if err != nil {
			*r = Record{}
			return err
		}
		r.Descriptors[i] = d
		at += n
	}
	if payload > len(src)-at || align8(at+payload) != len(src) {
		*r = Record{}
		return fmt.Errorf("%w: payload of %d bytes in a %d-byte record", ErrMalformed, payload, len(src))
	}
	r.Payload = src[at : at+payload]
	err := r.checkFraming()
	if err == nil && r.Type == TypeInline {
		r.Inline, err = DecodeInline(r.Payload)
	}
	if err != nil {
		*r = Record{}
	}
	return err
}

// NextRecord decodes the record at the start of src, a run of records laid
// one after another (as a queue's GetMany fills a buffer), and returns it
// with its size. A record that fails to decode is reported with its size,
// so that a walk goes on past it; one whose size cannot be read, with 0.
func NextRecord(src []byte) (Record, int, error) {
	if len(src) < RecordHeaderSize {
		return Record{}, 0, fmt.Errorf("%w: %d bytes left for a record", ErrMalformed, len(src))
	}
	size := int(le.Uint32(src))
	if size < RecordHeaderSize || size%8 != 0 || size > len(src) {
		return Record{}, 0, fmt.Errorf("%w: a record of %d bytes with %d left", ErrMalformed, size, len(src))
	}
	r, err := DecodeRecord(src[:size])
	return r, size, err
}

func align8(n int) int { return (n + 7) &^ 7 }

// InlineHeaderSize is the fixed part of an inline array's header; its shape
// follows.
const InlineHeaderSize = plane.InlineHeaderSize

// Inline is a small array that travels inside its record (TypeInline): its
// elements, in C order, follow its header in the payload.
//
//	+0  u16  dtype code
//	+2  u8   flags, as a descriptor's: bits 0-1 the Python type to rebuild,
//	         bit 2 read-only
//	+3  u8   ndim, 0 to 32
//	+4  u32  zero
//	+8  i64  shape, ndim of them, not negative
//	...      the elements: exactly the bytes the shape and dtype make
type Inline struct {
	DType dtype.DType
	Flags uint8
	Shape []int64
	Data  []byte // the elements, in the payload
}

// Size returns the bytes of the payload that holds in: its header, its
// shape and its elements.
func (in *Inline) Size() int { return InlineHeaderSize + 8*len(in.Shape) + len(in.Data) }

// Encode writes the payload that holds in into dst (at least in.Size()
// bytes) and returns the bytes written.
func (in *Inline) Encode(dst []byte) int {
	at := EncodeInline(dst, in.DType, in.Flags, in.Shape)
	return at + copy(dst[at:], in.Data)
}

// Check validates in's fields: its dtype, flags and dimensions, and that
// Data holds exactly the elements its shape and dtype make (the plane's
// rules, which the C ABI's calls that never enter Go keep too).
func (in *Inline) Check() error {
	return in.broken(plane.CheckInline(uint16(in.DType), in.Flags, in.Shape, uint64(len(in.Data))))
}

// broken is the error of an inline array that breaks bad (plane.InlineBad*),
// nil for plane.OK.
func (in *Inline) broken(bad int) error {
	switch bad {
	case plane.OK:
		return nil
	case plane.InlineBadHeader:
		return fmt.Errorf("%w: an inline array header (ndim %d, flags %#x)", ErrMalformed, len(in.Shape), in.Flags)
	case plane.InlineBadDType:
		return fmt.Errorf("%w: %w", ErrMalformed, in.DType.Check())
	case plane.InlineBadShape:
		return fmt.Errorf("%w: negative shape in an inline array", ErrMalformed)
	default:
		return fmt.Errorf("%w: an inline array of shape %v holds %d bytes of elements", ErrMalformed, slices.Clone(in.Shape), len(in.Data))
	}
}

// Strides returns the byte strides of in's elements, which are in C order.
func (in *Inline) Strides() []int64 {
	strides := make([]int64, len(in.Shape))
	in.CStrides(strides)
	return strides
}

// CStrides writes Strides into strides, which holds len(in.Shape).
func (in *Inline) CStrides(strides []int64) {
	step := int64(in.DType.Size())
	for i := len(in.Shape) - 1; i >= 0; i-- {
		strides[i] = step
		step *= max(in.Shape[i], 1)
	}
}

// EncodeInline writes the header of an inline array into dst (at least
// InlineHeaderSize + 8*len(shape) bytes) and returns where its elements go.
func EncodeInline(dst []byte, dt dtype.DType, flags uint8, shape []int64) int {
	return plane.InlineHead(dst, uint16(dt), flags, shape)
}

// DecodeInline reads and checks the inline array a TypeInline payload
// holds; Data aliases the payload.
func DecodeInline(payload []byte) (Inline, error) {
	dt, flags, shape, at, bad := plane.ReadInline(payload)
	switch {
	case len(payload) < InlineHeaderSize:
		return Inline{}, fmt.Errorf("%w: an inline array of %d bytes", ErrMalformed, len(payload))
	case bad == plane.InlineBadHeader: // its shape, past MaxNDim, is not read
		return Inline{}, fmt.Errorf("%w: an inline array header (ndim %d, flags %#x)", ErrMalformed, payload[3], flags)
	}
	in := Inline{DType: dtype.DType(dt), Flags: flags, Shape: shape, Data: payload[at:]}
	if err := in.broken(bad); err != nil {
		return Inline{}, err
	}
	return in, nil
}
