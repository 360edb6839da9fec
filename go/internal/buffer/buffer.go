// Package buffer connects message descriptors to the counts they carry: it
// finds the zctipc memory behind an address, turns a count on it into a
// descriptor, and turns a received descriptor back into memory.
package buffer

import (
	"errors"
	"fmt"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/ledger"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// Ref is a count on a region of zctipc memory (the data of a tensor segment,
// or a pool slot) together with the mapping that makes it readable here.
// Release gives the count up; Describe hands it on inside a descriptor.
//
// The count a Ref owns, unless it is this process's own count on a segment
// (which package shm records), is recorded in the process's ledger while
// the Ref holds it. A Ref is one count: it is not for concurrent use, and
// is released or sent once.
type Ref struct {
	seg    *shm.Segment   // a tensor segment, open in this process
	extra  bool           // seg: the ref holds a count besides this process's
	slot   pool.Slot      // a slot, when seg is nil
	led    *ledger.Ledger // where the count is recorded, or nil
	entry  int            // its record there, or shm.NoEntry
	ticket *pool.Ticket   // the ticket of the count's descriptor, once described
	taken  bool           // its count went elsewhere: sent (Sent), its ticket taken though not sent, or lost (Lost)
}

// ErrTaken is returned when a descriptor's count was already taken (see
// Note [a count is taken once] in package pool).
var ErrTaken = pool.ErrTaken

// NewSlotRef returns a Ref that owns the count s.
func NewSlotRef(s pool.Slot) *Ref { return recorded(&Ref{slot: s}) }

// HeldSlotRef returns a Ref that owns the count s, which its ledger entry
// entry records already (shm.NoEntry: none): a count that the C ABI took
// and recorded without entering Go (Note [a ref made outside Go] in the
// C ABI's handoff.c).
func HeldSlotRef(s pool.Slot, entry int) *Ref {
	r := &Ref{slot: s, entry: entry}
	if entry != shm.NoEntry {
		r.led = ledger.Current()
	}
	return r
}

// recorded records the count r owns in the ledger and returns r.
func recorded(r *Ref) *Ref {
	r.led = ledger.Current()
	switch {
	case r.seg == nil:
		r.entry = r.led.HoldSlot(r.slot.Arena().Name(), r.slot.Index, r.slot.Generation)
	case r.extra:
		r.entry = r.led.HoldSegment(r.seg.Name())
	default:
		r.entry = shm.NoEntry
	}
	return r
}

// unrecord clears the ledger's record of the count, before it is given up
// or handed on.
func (r *Ref) unrecord() {
	r.led.Drop(r.entry)
	r.led, r.entry = nil, shm.NoEntry
}

// Kind returns message.RefSegment or message.RefSlot.
func (r *Ref) Kind() uint8 {
	if r.seg != nil {
		return message.RefSegment
	}
	return message.RefSlot
}

// Data returns the whole region: the segment's data, or the slot.
func (r *Ref) Data() []byte {
	if r.seg != nil {
		return r.seg.Data()
	}
	return r.slot.Data()
}

// Segment returns the segment handle of a segment ref, or nil.
func (r *Ref) Segment() *shm.Segment { return r.seg }

// Find returns a new count on the zctipc memory that holds the n bytes at
// addr, and the offset of addr in it, when this process maps it.
func Find(addr uintptr, n uint64) (*Ref, uint64, bool, error) {
	led := ledger.Current()
	if s, off, entry, ok := pool.FindRecorded(addr, n, led.Plane()); ok { // the count and its entry in one call
		return &Ref{slot: s, led: led, entry: led.Recorded(entry, s.Arena().Name(), s.Index, s.Generation)}, off, true, nil
	}
	seg, off, ok := shm.Find(addr, n)
	if !ok {
		return nil, 0, false, nil
	}
	if _, err := seg.AddRef(); err != nil {
		return nil, 0, false, errors.Join(err, seg.Close())
	}
	return recorded(&Ref{seg: seg, extra: true}), off, true, nil
}

// Holds reports whether the n bytes at addr are zctipc memory that Find
// would return, without taking a count.
func Holds(addr uintptr, n uint64) bool { return pool.Holds(addr, n) || shm.Holds(addr, n) }

// Holders returns how many counts the ref's memory has, in every process:
// the slot's count, or the segment's.
func (r *Ref) Holders() (int64, error) {
	if r.seg == nil {
		return r.slot.Holders(), nil
	}
	return r.seg.Refcount()
}

// Release gives up the ref's count (and the ticket of its descriptions,
// which were not sent).
func (r *Ref) Release() error {
	if r.taken {
		return nil // the count and its ticket are the taker's, or lost (unsend, Lost)
	}
	var terr error
	if r.ticket != nil {
		terr = r.ticket.Cancel()
		r.ticket = nil
	}
	if r.seg == nil {
		// The entry dropped and the count given back in one call into the
		// plane (pool.Slot.ReleaseRecorded), in unrecord's order.
		err := r.slot.ReleaseRecorded(r.led.Plane(), r.entry)
		r.led, r.entry = nil, shm.NoEntry
		return errors.Join(terr, err)
	}
	r.unrecord()
	var err error
	if r.extra {
		_, err = r.seg.DropRef()
	}
	return errors.Join(terr, err, r.seg.Close())
}

// Describe returns a descriptor of the array laid over the ref's region at
// offset, which carries the ref's count once Send has sent it, with the
// ticket that its receiver takes once (Note [a count is taken once] in
// package pool; one ticket per ref, whatever the number of descriptions).
// Until Send, the descriptor carries no count: Attach takes it, and Adopt
// and Drop refuse it with ErrTaken, since its ticket is not armed.
//
// Threat model: a descriptor that carries no count (zct_ref_describe's,
// Ray's) goes to other processes and may be handed to a receiver that
// takes counts (zct_ref_decode, a queue record). What must never happen is
// such a receiver becoming a second owner of the count the describer still
// holds: only Send arms the ticket.
func (r *Ref) Describe(offset uint64, dt dtype.DType, shape, strides []int64, flags uint8) (message.Descriptor, error) {
	d := message.Descriptor{Kind: r.Kind(), Flags: flags, DType: dt, Shape: shape, Strides: strides, Offset: offset}
	if r.taken {
		return d, fmt.Errorf("a ref whose count was taken: %w", ErrTaken)
	}
	if err := dt.Check(); err != nil {
		return d, fmt.Errorf("an array: %w", err)
	}
	region := uint64(len(r.Data()))
	if offset > region {
		return d, fmt.Errorf("offset %d is past the %d-byte region: %w", offset, region, unix.EINVAL)
	}
	extent, ok := header.Extent(shape, strides, dt.Size())
	if _, fits := header.ByteCount(shape, dt.Size()); ok && !fits {
		// Zero strides keep the extent small while the elements' bytes
		// overflow (a torch expand): the caller's argument, not a
		// malformed message (d.Check's ErrMalformed names bytes a get read).
		return d, fmt.Errorf("an array of shape %v has more bytes than a descriptor counts (2^63): %w", shape, unix.EINVAL)
	}
	if !ok || offset+extent > region {
		return d, fmt.Errorf("an array of shape %v and strides %v at offset %d does not fit in %d bytes: %w",
			shape, strides, offset, region, unix.EINVAL)
	}
	d.NBytes = extent
	if r.seg != nil {
		// A receiver finds the segment by its name: one that lost it
		// (Unlink) is refused here rather than lost in transit.
		if err := r.seg.CheckNamed(); err != nil {
			return d, err
		}
		d.Name = r.seg.Name()
	} else {
		d.Name = r.slot.Arena().Name()
		d.Slot, d.Generation = r.slot.Index, r.slot.Generation
	}
	if r.ticket == nil {
		t, err := pool.NewTicket()
		if err != nil {
			return d, err
		}
		r.ticket = &t
	}
	d.Ticket = message.Ticket{Arena: r.ticket.Slot.Arena().Name(), Slot: r.ticket.Slot.Index,
		Generation: r.ticket.Slot.Generation, Nonce: r.ticket.Nonce}
	return d, d.Check()
}

// Send hands the counts of refs over to a message that publish makes
// public at once, without waiting (descriptor bytes written for another
// process); a queue put hands them over with the put itself (Sends).
//
// The ledger's record of each count is cleared and its ticket armed just
// before publish, since from then on the message holds it (a process
// killed after publish must not have it given up for it). When publish
// fails, the counts are recorded again and stay the refs', which the
// caller still releases, and Send returns false with publish's error. When
// it succeeds, the refs are spent: they close (the error is of closing),
// and must not be released.
func Send(refs []*Ref, publish func() error) (bool, error) {
	for _, r := range refs {
		if r.ticket == nil {
			r.unrecord()
			continue
		}
		// From now on, its receiver may take it: the entry dropped and
		// the ticket armed in one call into the plane (pool.Ticket.Send).
		r.ticket.Send(r.led.Plane(), r.entry)
		r.led, r.entry = nil, shm.NoEntry
	}
	if err := publish(); err != nil {
		return false, errors.Join(err, unsend(refs))
	}
	return true, Sent(refs)
}

// unsend takes back the counts Send sent for a publish that failed: the
// tickets disarmed, the entries recorded again. A ticket taken meanwhile
// (by a receiver of bytes forged with its descriptor, in the window before
// publish) took its count with it: its ref is spent, its Release gives up
// nothing and it describes nothing more (ErrTaken).
func unsend(refs []*Ref) error {
	var errs []error
	for _, r := range refs {
		if r.ticket != nil {
			if err := r.ticket.Disarm(); err != nil {
				errs = append(errs, err, r.spend())
				continue
			}
		}
		recorded(r)
	}
	return errors.Join(errs...)
}

// spend marks r spent with its count gone elsewhere (sent, taken, or
// lost): its ticket and its count are no longer its own to give up.
func (r *Ref) spend() error {
	r.ticket, r.taken = nil, true
	r.led, r.entry = nil, shm.NoEntry
	if r.seg != nil {
		return r.seg.Close()
	}
	return nil
}

// Note [counts that wait]: a count leaves the ledger when its ticket is
// armed, and a put that waits (for room, or for the queue's lock) must not
// hold it outside the ledger meanwhile, or a sender killed then loses it
// for as long as its pool's owner lives. So a queue put does not arm the
// tickets itself: it gives the plane's put step the sends of its counts
// (Sends: each count's ledger entry and ticket), which the step runs once
// it has found room and written the record, just before the store that
// makes the record visible. A put that waits or fails has run none: every
// count is in the ledger, its ticket unarmed, and nothing can take it. The
// only window left is the few instructions between the arm and that store,
// inside the step. The C ABI's put (handoff.c) gives the same step its
// send.

// Sends returns the sends of the counts of refs (plane.Send), for a put
// step that runs them once its record finds room, and only then (Note
// [counts that wait]). After a put that put the record, Sent; after one
// that did not, the refs are the caller's still, untouched; after one that
// faulted in its sends (plane.InSends), Lost.
func Sends(refs []*Ref) []plane.Send {
	sends := make([]plane.Send, len(refs))
	for i, r := range refs {
		entry := r.entry
		if r.led == nil {
			entry = shm.NoEntry
		}
		if r.ticket == nil {
			sends[i] = plane.NewSend(r.led.Plane(), entry, nil, 0, 0)
			continue
		}
		sends[i] = r.ticket.Sending(r.led.Plane(), entry)
	}
	return sends
}

// Sent marks refs as sent, by a put that ran their sends (Sends) or by
// Send: their counts are the message's, and its receiver takes them. The
// refs are spent: they close (the error is of closing), a Release gives up
// nothing, and they describe nothing more (ErrTaken).
func Sent(refs []*Ref) error {
	var errs []error
	for _, r := range refs {
		errs = append(errs, r.spend()) // the message's now: its receiver takes it
	}
	return errors.Join(errs...)
}

// Lost marks refs whose sends a put faulted in (plane.InSends: a ticket
// arena's file shrunk under it): their counts may have left the ledger and
// their tickets may be armed, so they are lost rather than given up twice.
// The refs are spent: Release gives up nothing, and they describe nothing
// more (ErrTaken).
func Lost(refs []*Ref) error {
	var errs []error
	for _, r := range refs {
		errs = append(errs, r.spend())
	}
	return errors.Join(errs...)
}

// Adopt turns a received descriptor into a Ref that owns the count it
// carried, and returns the array's bytes (from its offset). It takes the
// descriptor's ticket first: a descriptor taken before (replayed bytes)
// fails with an error wrapping ErrTaken and takes nothing.
func Adopt(d *message.Descriptor) (*Ref, []byte, error) {
	if d.Kind == message.RefSlot && d.Ticket.Arena != "" {
		if r, data, taken, err := adoptHere(d); taken {
			return r, data, err
		}
	}
	if err := take(d); err != nil {
		return nil, nil, err
	}
	return opened(d, false) // take checked d
}

// adoptHere adopts a slot's descriptor d, as Adopt does, in one call into
// the plane (pool.AdoptSent), when its arenas are mapped here already: the
// descriptor's check, its ticket's and slot's, the ticket taken and its
// slot given back, the count recorded. It reports whether it took the
// ticket: when not, nothing changed and Adopt goes step by step, which says
// why; when it did, the error is what came after the take, as take's.
func adoptHere(d *message.Descriptor) (*Ref, []byte, bool, error) {
	var c plane.Desc
	d.Plane(&c)
	led := ledger.Current()
	s, entry, taken, err := pool.AdoptSent(d.Name, d.Ticket.Arena, &c, plane.AdoptDesc|plane.AdoptCheck|plane.AdoptTake,
		led.Plane())
	if !taken {
		return nil, nil, false, nil
	}
	entry = led.Recorded(entry, d.Name, d.Slot, d.Generation)
	if err != nil {
		led.Drop(entry) // the count is lost with the error, as take loses it
		return nil, nil, true, fmt.Errorf("descriptor of %q: %w", d.Name, err)
	}
	r := &Ref{slot: s, led: led, entry: entry}
	if entry == shm.NoEntry {
		r.led = nil
	}
	data := s.Data() // the plane checked that the bytes lie in the slot
	return r, data[d.Offset : d.Offset+d.NBytes : d.Offset+d.NBytes], true, nil
}

// take takes the ticket of descriptor d, which carries a count, once.
func take(d *message.Descriptor) error {
	if err := d.Check(); err != nil {
		return err
	}
	t := d.Ticket
	if t.Arena == "" {
		return fmt.Errorf("%w: a descriptor that carries a count has no ticket", message.ErrMalformed)
	}
	if d.Kind == message.RefSlot && pool.TicketLive(t.Arena, t.Slot, t.Generation, t.Nonce) == nil {
		// The slot is checked before a live ticket is taken, as the C
		// ABI's take checks it (handoff.c): a ticket taken for a slot that
		// the descriptor then fails to name would leave its count with no
		// one, neither the ticket nor a ref; a descriptor refused here
		// leaves it with the ticket, for the genuine descriptor (or the
		// sender's exit) to take. A ticket taken before is said to be so
		// by TakeTicket below; an arena that is gone holds no count to
		// lose.
		if _, err := pool.Adopt(d.Name, d.Slot, d.Generation); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("descriptor of %q: %w", d.Name, err)
		}
	}
	if d.Kind == message.RefSegment && pool.TicketLive(t.Arena, t.Slot, t.Generation, t.Nonce) == nil {
		// The same for a segment's descriptor whose live ticket is a
		// slot's (a forged kind): a segment file that holds something
		// other than a tensor (a pool arena) is refused before the take.
		// So is a name the open after it could never open (one that is not
		// a segment name, not there, not a segment file of this user's):
		// its take would only lose the count. A memfd segment, which is
		// not read here, and a failure that may pass (out of descriptors
		// or memory) are left to the open, as before.
		info, err := shm.Stat(d.Name)
		if err == nil && info.Header.Kind != header.KindTensor {
			return fmt.Errorf("descriptor of %q: segment holds a %s, not a %s: %w", d.Name, info.Header.Kind,
				header.KindTensor, unix.EINVAL)
		}
		if err != nil && !shm.IsFDName(d.Name) && !passing(err) {
			return fmt.Errorf("descriptor of %q: %w", d.Name, err)
		}
	}
	if err := pool.TakeTicket(t.Arena, t.Slot, t.Generation, t.Nonce); err != nil {
		if errors.Is(err, unix.ENOENT) && gone(d.Name) {
			// The ticket's arena and the memory are both gone: the sender
			// died and what it had sent was collected (zctipc gc, the
			// daemon), which is what to say, rather than that someone
			// took it.
			return fmt.Errorf("descriptor of %q: the memory it names is gone (its sender exited and it was "+
				"collected, or every holder let go), and so is its ticket arena %q: %w", d.Name, t.Arena, unix.ENOENT)
		}
		return fmt.Errorf("descriptor of %q: %w", d.Name, err)
	}
	return nil
}

// passing reports whether err, of a look at a segment file, may not come
// again: the process or the system ran out of descriptors or memory, or a
// signal came.
func passing(err error) bool {
	for _, e := range []error{unix.EMFILE, unix.ENFILE, unix.ENOMEM, unix.EINTR, unix.EAGAIN} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// gone reports whether segment name (a tensor segment or an arena) is no
// longer there to be opened.
func gone(name string) bool {
	_, err := shm.Stat(name)
	return errors.Is(err, unix.ENOENT)
}

// Attach turns a descriptor that someone still holds (one made by
// Describe and not sent: its count stays with whoever described it) into a
// Ref with a count of this process's own, and returns the array's bytes
// (from its offset). The count is added only while the memory still has
// one (a segment's refcount, or the slot's, above zero, and the slot still
// of the descriptor's generation): memory let go of is never revived, and
// attaching it fails with an error that is unix.ENOENT.
func Attach(d *message.Descriptor) (*Ref, []byte, error) { return open(d, true) }

// open makes the Ref of descriptor d: one that takes over the count d
// carried, or with attach one with a count added for this process.
func open(d *message.Descriptor, attach bool) (*Ref, []byte, error) {
	if err := d.Check(); err != nil {
		return nil, nil, err
	}
	return opened(d, attach)
}

// opened is open of a descriptor checked already: a check is a call into
// C (package plane), which a hand-off makes once at each step, not twice.
func opened(d *message.Descriptor, attach bool) (*Ref, []byte, error) {
	var r *Ref
	switch d.Kind {
	case message.RefSegment:
		var seg *shm.Segment
		var err error
		if attach {
			seg, err = shm.Attach(d.Name, header.KindTensor, false)
		} else {
			seg, err = shm.Adopt(d.Name, header.KindTensor)
		}
		if err != nil {
			return nil, nil, err
		}
		r = &Ref{seg: seg, entry: shm.NoEntry}
	default:
		s, err := pool.Adopt(d.Name, d.Slot, d.Generation)
		if attach {
			if err == nil {
				s, err = s.AddRef()
			}
			if errors.Is(err, pool.ErrStale) || errors.Is(err, unix.ENOENT) {
				return nil, nil, fmt.Errorf("%w: the buffer was let go of by every holder (%v)", unix.ENOENT, err)
			}
		}
		if err != nil {
			return nil, nil, err
		}
		r = recorded(&Ref{slot: s})
	}
	data, err := r.bytesOf(d)
	if err != nil {
		return nil, nil, err
	}
	return r, data, nil
}

// bytesOf returns the bytes of r's region that d describes; when they do
// not lie in it, r is released and the error says so.
func (r *Ref) bytesOf(d *message.Descriptor) ([]byte, error) {
	data := r.Data()
	if d.Offset+d.NBytes > uint64(len(data)) {
		return nil, errors.Join(fmt.Errorf("descriptor reaches past its %d-byte region: %w", len(data), message.ErrMalformed), r.Release())
	}
	return data[d.Offset : d.Offset+d.NBytes : d.Offset+d.NBytes], nil
}

// Drop gives up the count a received descriptor carried, for a message
// whose buffers are not wanted. It maps nothing for long and takes no lock
// of package shm, so a segment finalizer may call it.
func Drop(d *message.Descriptor) error {
	if err := take(d); err != nil {
		return err
	}
	if d.Kind == message.RefSegment {
		return shm.DropRef(d.Name, header.KindTensor)
	}
	s, err := pool.Adopt(d.Name, d.Slot, d.Generation)
	if err != nil {
		return err
	}
	return s.Release()
}
