// Package handover is the one implementation of a queue message's trip:
// a put hands the counts of its arrays over to the record it publishes,
// and a get decodes the record it took (package message) and takes those
// counts over, or gives them up. The C ABI and the Go API both go through
// it, so that neither re-implements the framing of a record or the order
// in which its counts change hands.
//
// Note [one hand-over]: the rules a message keeps, each written once here:
//   - a record a sender made wrong (a type its descriptors or payload do
//     not fit, an inline array whose bytes are not its shape's) is a bad
//     argument, unix.EINVAL, never message.ErrMalformed, which names bytes
//     a get read (Check);
//   - a put hands over the count of each ref with the record, in the put
//     step itself (buffer.Sends): on success the refs are spent, on
//     failure they are the caller's, who keeps or releases them (Put);
//   - an inline array is copied from the sender's memory straight into the
//     ring, header, shape and elements, with no payload of its own between
//     (Inline);
//   - a get decodes the record whole before it takes any count, then takes
//     the count of every descriptor of the record, or of none: when one
//     fails, those taken are released and the rest given up, so that a
//     count is never left behind unowned, and the record is refused as one
//     that does not decode is (Message.Decode, Adopt);
//   - a bad record in a run that one get took (it does not decode, or a
//     count of its cannot be taken: a descriptor replayed, memory gone)
//     costs only itself: the others are given whole, views, counts and
//     all, as gets of them one by one would give them, and the error says
//     why the bad one was refused (DecodeRun, AdoptAll);
//   - a taker is given one view per descriptor, in order, and for an
//     inline record one view of its array, which lies in the buffer the
//     record was taken into and holds no count (NumViews; message.Views,
//     by which the queue's gets count them before they take a record).
package handover

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/queue"
	"golang.org/x/sys/unix"
)

// Check checks a record that a sender made, before it is put: one made
// wrong is a bad argument (unix.EINVAL), not corrupt data.
func Check(rec *message.Record) error {
	if err := rec.Check(); err != nil {
		return fmt.Errorf("%s: %w", err, unix.EINVAL)
	}
	return nil
}

// Put puts rec into q, waiting for room until deadline (as queue.Put),
// with the counts of refs: refs[i] is the count that rec.Descriptors[i]
// carries. It returns whether the record was put. When it was, the counts
// are the message's and the refs are spent (the error is of closing them);
// when it was not, the refs are the caller's still, to keep or release. A
// ref given for two descriptors is a bad argument (unix.EINVAL).
func Put(q *queue.Queue, rec *message.Record, refs []*buffer.Ref, deadline time.Time) (bool, error) {
	return send(rec, refs, func(sends []plane.Send) error { return q.PutSending(rec, deadline, sends) })
}

// PutContext is Put, waiting for room until ctx is done (as
// queue.PutContext).
func PutContext(ctx context.Context, q *queue.Queue, rec *message.Record, refs []*buffer.Ref) (bool, error) {
	return send(rec, refs, func(sends []plane.Send) error { return q.PutSendingContext(ctx, rec, sends) })
}

// send puts rec with put, whose step hands the counts of refs over as
// sends say once it found room (package buffer, Note [counts that wait]),
// so that they are in the ledger while the put waits; a ref is spent only
// once the put put the record.
func send(rec *message.Record, refs []*buffer.Ref, put func(sends []plane.Send) error) (bool, error) {
	if len(refs) != len(rec.Descriptors) {
		return false, fmt.Errorf("a record of %d descriptors with %d counts: %w", len(rec.Descriptors), len(refs), unix.EINVAL)
	}
	if err := Check(rec); err != nil {
		return false, err
	}
	if i, j, ok := repeated(refs); ok {
		// One count cannot go with two descriptors: the second's taker
		// would find it taken, and the record would be refused.
		return false, fmt.Errorf("descriptors %d and %d of a record carry the same count: %w", i, j, unix.EINVAL)
	}
	var sends []plane.Send
	if len(refs) > 0 {
		sends = buffer.Sends(refs)
	}
	if err := put(sends); err != nil {
		if errors.Is(err, queue.ErrSendsFaulted) {
			err = errors.Join(err, buffer.Lost(refs))
		}
		return false, err
	}
	return true, buffer.Sent(refs)
}

// repeated reports whether a ref appears twice in refs, and where.
func repeated(refs []*buffer.Ref) (int, int, bool) {
	if len(refs) <= 8 {
		for j := range refs {
			for i := range j {
				if refs[i] == refs[j] {
					return i, j, true
				}
			}
		}
		return 0, 0, false
	}
	seen := make(map[*buffer.Ref]int, len(refs))
	for j, r := range refs {
		if i, ok := seen[r]; ok {
			return i, j, true
		}
		seen[r] = j
	}
	return 0, 0, false
}

// Inline returns the record of an inline array: of type dt, with the
// descriptor flags flags, of shape shape, whose elements in C order are
// data. Put writes it straight into the ring (Note [one hand-over]); data
// is read then, and must not change until Put returned. An unknown dtype
// is an error wrapping dtype.ErrUnsupported; negative dimensions and data
// that is not the shape's bytes are unix.EINVAL, and so are the flags and
// the number of dimensions when Put checks the record.
func Inline(dt dtype.DType, flags uint8, shape []int64, data []byte) (message.Record, error) {
	rec := message.Record{Type: message.TypeInline, Inline: message.Inline{DType: dt, Flags: flags, Shape: shape, Data: data}}
	if err := dt.Check(); err != nil {
		return rec, fmt.Errorf("an inline array: %w", err)
	}
	if len(shape) <= header.MaxNDim {
		n, ok := header.ByteCount(shape, dt.Size())
		if !ok || slices.ContainsFunc(shape, func(d int64) bool { return d < 0 }) {
			return rec, fmt.Errorf("an inline array of shape %v: %w", slices.Clone(shape), unix.EINVAL)
		}
		if n != uint64(len(data)) {
			return rec, fmt.Errorf("an inline array of shape %v and dtype %s has %d bytes, not %d: %w",
				slices.Clone(shape), dt, n, len(data), unix.EINVAL)
		}
	}
	return rec, nil
}

// Message is a record taken from a queue, decoded (its Payload, and an
// inline record's Inline, lie in the buffer it was taken into), with the
// arrays of its descriptors (Views) once Adopt took their counts. It is
// not for concurrent use.
type Message struct {
	message.Record
	// PayloadAt is where the payload starts in the record, and InlineAt
	// where an inline record's elements do; Bytes is the record's size.
	PayloadAt, InlineAt, Bytes int
	// Views are the arrays of the record's descriptors, once Adopt took
	// their counts: each owns the one it carried.
	Views []View
}

// NumViews returns how many views a taker is given of m: one per
// descriptor, once adopted, and one of an inline record's array (as
// message.Views counts them for a queue's gets).
func (m *Message) NumViews() int { return message.Views(m.Type, len(m.Views)) }

// View is an array of a message's descriptor.
type View struct {
	// Ref is the count the descriptor carried, now this process's.
	Ref *buffer.Ref
	// Kind is what the memory is (message.RefSegment, message.RefSlot).
	Kind uint8
	// Data are the bytes the array may touch, from its first, which lie
	// Offset bytes from the start of the Ref's memory.
	Data    []byte
	Offset  uint64
	DType   dtype.DType
	Shape   []int64
	Strides []int64 // bytes
	Flags   uint8   // as a descriptor's: the Python type to rebuild, read-only
	Name    string  // the segment, or the arena of the slot
}

// ViewOf returns the view of the array that descriptor d describes, whose
// count r holds and whose bytes are data (as buffer.Adopt and
// buffer.Attach return them).
func ViewOf(r *buffer.Ref, data []byte, d *message.Descriptor) View {
	return View{Ref: r, Kind: d.Kind, Data: data, Offset: d.Offset, DType: d.DType, Shape: d.Shape,
		Strides: d.Strides, Flags: d.Flags, Name: d.Name}
}

// Decode decodes into m the record that is exactly raw, as a queue's Get
// took it; it takes no count yet (Adopt, Drop).
func (m *Message) Decode(raw []byte) error {
	m.Views = nil
	err := m.Record.Decode(raw)
	m.located(len(raw))
	return err
}

// DecodeRun decodes the n records laid one after another in raw, as a
// queue's GetMany took them. A record that fails to decode is left with
// its Bytes alone (no type, payload or views; its PayloadAt is its end),
// its error joined into the one returned, and the walk goes on past it;
// when a record's size cannot be read, it and the rest are left zero.
func DecodeRun(raw []byte, n int) ([]Message, error) {
	msgs := make([]Message, n)
	var errs []error
	for i, at := 0, 0; i < n; i++ {
		rec, size, err := message.NextRecord(raw[at:])
		if size == 0 {
			errs = append(errs, err)
			break
		}
		errs = append(errs, err)
		msgs[i].Record = rec
		msgs[i].located(size)
		at += size
	}
	return msgs, errors.Join(errs...)
}

// located sets where m's payload and inline elements lie in its record of
// size bytes: at its end when it failed to decode.
func (m *Message) located(size int) {
	m.Bytes, m.PayloadAt, m.InlineAt = size, size, size
	if m.Type == 0 {
		return
	}
	m.PayloadAt = message.RecordHeaderSize
	for i := range m.Descriptors {
		m.PayloadAt += m.Descriptors[i].Size() // the payload follows the descriptors
	}
	m.InlineAt = m.PayloadAt + len(m.Payload) - len(m.Inline.Data) // an inline array's elements end the payload
}

// Adopt takes the counts that the descriptors of m carry, making a View
// of each, all of them or none: when one cannot be taken (a descriptor
// replayed, its count taken before; memory gone), those taken are
// released and the rest given up, m is left as a record that failed to
// decode is (its Bytes alone: no type, payload or views), and the error
// says why.
func (m *Message) Adopt() error {
	if len(m.Descriptors) == 0 {
		return nil
	}
	m.Views = make([]View, len(m.Descriptors))
	for j := range m.Descriptors {
		d := &m.Descriptors[j]
		r, data, err := buffer.Adopt(d)
		if err != nil {
			m.Views = m.Views[:j]
			errs := []error{err, m.Release()}
			for l := j + 1; l < len(m.Descriptors); l++ {
				errs = append(errs, buffer.Drop(&m.Descriptors[l]))
			}
			size := m.Bytes
			*m = Message{}
			m.located(size)
			return errors.Join(errs...)
		}
		m.Views[j] = ViewOf(r, data, d)
	}
	return nil
}

// AdoptAll adopts each of msgs, a run that one get took (Adopt): a
// message whose counts cannot all be taken is refused alone, its error
// joined into the one returned, and the others keep their views (Note
// [one hand-over]).
func AdoptAll(msgs []Message) error {
	var errs []error
	for i := range msgs {
		errs = append(errs, msgs[i].Adopt())
	}
	return errors.Join(errs...)
}

// Drop gives up the counts that the descriptors of m carry, unread, for a
// message whose arrays are not wanted (a pickle, for a reader that cannot
// read one). It is for a message that was not adopted.
func (m *Message) Drop() error {
	var errs []error
	for i := range m.Descriptors {
		errs = append(errs, buffer.Drop(&m.Descriptors[i]))
	}
	return errors.Join(errs...)
}

// Release gives up the counts of m's views (those Adopt took).
func (m *Message) Release() error {
	var errs []error
	for i := range m.Views {
		if r := m.Views[i].Ref; r != nil {
			errs = append(errs, r.Release())
			m.Views[i].Ref = nil
		}
	}
	m.Views = nil
	return errors.Join(errs...)
}
