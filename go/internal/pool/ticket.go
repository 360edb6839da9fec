// Tickets: the once-only claim that a sent descriptor carries on its count.

package pool

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/plane"
	"golang.org/x/sys/unix"
)

// Note [a count is taken once]: a descriptor that is sent carries one
// count on its memory, and whoever takes the descriptor owns that count.
// The descriptor is bytes, though: a pickle loaded twice, a queue record
// written again by a forged writer, or Go's decode of saved bytes would
// each take the count again, and two owners of one count free the memory
// while the other still views it (the next allocation then writes into
// it). So each sent count comes with a ticket: a slot of a small arena of
// the sender's (class 0, its first word a random 64-bit nonce), named in
// the descriptor with its generation and nonce. The word holds the nonce
// only while the count is in flight: Send stores it (Arm) just before the
// descriptor becomes visible, and until then it is zero, so a descriptor
// that carries no count (one described and never sent, for Attach) names
// a ticket that no take can win. Taking the descriptor
// first moves the ticket's word from the nonce ("sent") to zero ("taken")
// with one compare-and-swap in shared memory, then frees the ticket's
// slot: exactly one taker wins, wherever it runs, and every later take
// (the same bytes replayed, or a reused slot, which has another nonce)
// fails with ErrTaken before it touches the count. A sender whose send
// fails cancels its ticket the same way.
//
// Threat model: any process of the user can read and replay descriptor
// bytes, and can write any word of the user's shared memory. The ticket
// guards against a replay (the common case, and a bug's): a replayed
// descriptor never takes a count twice. A process that forges new
// tickets, or writes into the arenas, can do anything the user can do and
// is out of scope; whatever it writes, a take never gives a count it did
// not win by the compare-and-swap, and never wins one on a word that is
// not a ticket's (Note [a ticket arena is not a buffer's]). A ticket that is never taken (bytes
// dropped unread) keeps its slot, as its count keeps its memory, until
// cleanup of its sender's arenas.

// ErrTaken means a descriptor's count was already taken: the descriptor
// (a pickle, a queue record) was received before, and is replayed.
var ErrTaken = errors.New("descriptor was already taken: its count belongs to whoever received it first")

// ticketArenaBytes is the size of a ticket arena at first; later ones
// double, as a pool's do.
const ticketArenaBytes = 64 << 10

var ticketPool struct {
	sync.Mutex
	p *Pool
}

// tickets returns the process's ticket pool, made on first use.
func tickets() *Pool {
	ticketPool.Lock()
	defer ticketPool.Unlock()
	if ticketPool.p == nil {
		ticketPool.p = New(1 << 30)
		ticketPool.p.first = ticketArenaBytes
		ticketPool.p.tickets = true
	}
	return ticketPool.p
}

// CloseTickets gives up the process's ticket arenas, as Pool.Close does: each
// goes when the last of its tickets in flight is taken. (shm.ReleaseAll,
// at exit, gives them up too.)
func CloseTickets() error {
	ticketPool.Lock()
	defer ticketPool.Unlock()
	if ticketPool.p == nil {
		return nil
	}
	err := ticketPool.p.Close()
	ticketPool.p = nil
	return err
}

// Note [a ticket arena is not a buffer's]: a ticket arena is a pool arena
// of class 0, as the arenas of the smallest buffers are, and a ticket is
// taken by a compare-and-swap of a slot's first word and a release of the
// slot. Were a buffer's arena taken for a ticket arena (a forged or
// mistaken descriptor naming it, with the buffer's first 8 bytes as the
// nonce), the take would zero the user's bytes and free a buffer its
// holder still uses; were a ticket taken for a buffer, a release of it
// would free a ticket in flight. So a ticket arena says so in its layout
// (its purpose word), and each side refuses the other's arenas.

// Ticket is a sent count's claim: a slot of a ticket arena whose first
// word holds Nonce while the count is in flight. It is not for concurrent
// use: the holder of the count arms, disarms or cancels it.
type Ticket struct {
	Slot  Slot
	Nonce uint64
	armed bool // the word holds Nonce: the descriptor may be taken
}

// The ticket's word is moved by the data plane's steps (zp_ticket_arm,
// zp_ticket_take), which the C ABI may run without entering Go (Note [a
// pool slot's steps in the plane] in package plane).

// NewTicket issues a ticket for a count that may be sent: its word stays
// zero, so that nothing takes it, until Arm.
func NewTicket() (Ticket, error) {
	s, err := tickets().Alloc(8, time.Now())
	if err != nil {
		return Ticket{}, fmt.Errorf("a ticket for a descriptor: %w", err)
	}
	// Its word is zero: the take of a ticket arena's slot zeroes it (a slot
	// keeps the bytes it had).
	nonce := rand.Uint64() | 1 // never zero, which means taken
	return Ticket{Slot: s, Nonce: nonce}, nil
}

// Arm makes the ticket's descriptor takeable, once: its count is about to
// be sent.
func (t *Ticket) Arm() {
	// A fault (its file shrunk) panics into the caller's fault.Catch, as a
	// store in Go did: Arm has no error to say it with.
	_, err := t.Slot.arena.view.ArmTicket(t.Slot.Index, t.Nonce)
	fault.Must(err)
	t.armed = true
}

// Send arms the ticket, as Arm does, after dropping entry of ledger l
// (nil: none), which recorded the count it sends: one call into the plane
// (zp_slot_send), in the order buffer.Send keeps.
func (t *Ticket) Send(l *plane.Ledger, entry int) {
	_, err := t.Slot.arena.view.SendTicket(l, entry, t.Slot.Index, t.Nonce)
	fault.Must(err)
	t.armed = true
}

// Sending returns the send of the ticket (plane.Send) for a put that
// drops entry of ledger l (nil: none) and arms the ticket itself, once it
// found room for the record that carries it; after such a put, the ticket
// is the message's.
func (t *Ticket) Sending(l *plane.Ledger, entry int) plane.Send {
	return plane.NewSend(l, entry, &t.Slot.arena.view, t.Slot.Index, t.Nonce)
}

// Disarm takes back an armed ticket whose descriptor was not sent after
// all, keeping its slot for a later Arm. It fails with ErrTaken when a
// receiver took the descriptor meanwhile: the count is the receiver's, and
// the ticket's slot is gone with it.
func (t *Ticket) Disarm() error {
	t.armed = false
	r, err := t.Slot.arena.view.TakeTicket(t.Slot.Index, t.Nonce)
	if err != nil {
		return fmt.Errorf("ticket %d of arena %q: %w", t.Slot.Index, t.Slot.arena.Name(), err)
	}
	if r != plane.OK {
		return fmt.Errorf("ticket %d of arena %q: %w", t.Slot.Index, t.Slot.arena.Name(), ErrTaken)
	}
	return nil
}

// Cancel gives up the ticket of a count that is not sent (never armed, or
// disarmed). An armed ticket is disarmed first; when a receiver took it
// meanwhile, Cancel fails with ErrTaken and gives up nothing.
func (t *Ticket) Cancel() error {
	if t.armed {
		if err := t.Disarm(); err != nil {
			return fmt.Errorf("cancel %w", err)
		}
	}
	return t.Slot.Release()
}

// TicketLive reports (nil) whether the ticket a received descriptor names
// may still be taken: its slot is in use at its generation, as TakeTicket
// first checks, without taking it. A ticket taken already fails as
// TakeTicket would fail it.
func TicketLive(name string, index, gen uint32, nonce uint64) error {
	if nonce == 0 {
		return fmt.Errorf("ticket %d of arena %q with no nonce: %w", index, name, ErrTaken)
	}
	_, err := adopt(name, index, gen, true)
	return err
}

// TakeTicket takes the ticket a received descriptor names (slot index of
// generation gen of ticket arena name, holding nonce), once: a ticket
// taken before, here or anywhere, fails with ErrTaken.
func TakeTicket(name string, index, gen uint32, nonce uint64) error {
	if nonce == 0 {
		return fmt.Errorf("ticket %d of arena %q with no nonce: %w", index, name, ErrTaken)
	}
	if taken, err := takeHere(name, index, gen, nonce); taken {
		return err
	}
	s, err := adopt(name, index, gen, true)
	if errors.Is(err, unix.ENOENT) {
		// Its arena goes once every ticket of it was taken and its sender
		// let go, or when its sender died and its arenas were collected:
		// ENOENT stays in the chain for the caller to tell them apart.
		return fmt.Errorf("%w (its ticket arena is gone: %w)", ErrTaken, err)
	}
	if errors.Is(err, ErrStale) {
		return fmt.Errorf("%w (%v)", ErrTaken, err)
	}
	if err != nil {
		return err
	}
	switch r, err := s.arena.view.TakeTicket(s.Index, nonce); {
	case err != nil:
		return fmt.Errorf("ticket %d of arena %q: %w", index, name, err)
	case r == plane.Range: // adopt checked the index: the slots are too small for the word
		return fmt.Errorf("ticket %d of arena %q: slots of %d bytes: %w", index, name, s.arena.slotSize, unix.EINVAL)
	case r != plane.OK:
		return fmt.Errorf("ticket %d of arena %q: %w", index, name, ErrTaken)
	}
	return s.Release()
}

// takeHere takes the ticket as AdoptSent does, ticket alone: it reports
// whether it took it, and then the error of what came after.
func takeHere(name string, index, gen uint32, nonce uint64) (bool, error) {
	d := plane.Desc{TicketSlot: index, TicketGeneration: gen, Nonce: nonce}
	_, _, taken, err := AdoptSent("", name, &d, plane.AdoptCheck|plane.AdoptTake, nil)
	return taken, err
}

// AdoptSent takes the count that a sent descriptor d carries (its fields
// as the plane has them; steps as plane.Adopt's) in one call into the
// plane, when the arena of its buffer (name; "" for a ticket alone) and of
// its ticket (tickets) are mapped here already: the checks of TakeTicket
// and Adopt, the ticket taken, its slot given back, and the count recorded
// in l (nil: none). It reports whether the ticket was taken: when not,
// nothing changed, and the caller goes step by step, which says why; when
// it was, the slot's count is the caller's (with its entry in l, as the
// plane gives it), unless err says what failed after the take, when the
// count is lost as it is when TakeTicket fails there.
func AdoptSent(name, tickets string, d *plane.Desc, steps int, l *plane.Ledger) (Slot, int, bool, error) {
	index.RLock()
	t, b := index.byName[tickets], (*Arena)(nil)
	if name != "" {
		b = index.byName[name]
	}
	if t == nil || !t.tickets || t.closed || (name != "" && (b == nil || b.tickets || b.closed)) {
		index.RUnlock()
		return Slot{}, 0, false, nil // Note [a ticket arena is not a buffer's]: step by step says so
	}
	var bv *plane.Arena
	if b != nil {
		bv = &b.view
	}
	res, r, err := plane.Adopt(&t.view, t.mem.RefcountWord(), bv, d, steps, l, name)
	index.RUnlock()
	switch {
	case !res.Taken: // refused, or faulted before the take: step by step says why
		return Slot{}, 0, false, nil
	case err != nil:
		return Slot{}, res.Entry, true, fmt.Errorf("slot %d of arena %q: %w", d.TicketSlot, tickets, err)
	case r != plane.OK:
		return Slot{}, res.Entry, true, fmt.Errorf("slot %d of arena %q released more often than held: %w",
			d.TicketSlot, tickets, ErrStale)
	case res.Unpin:
		// The ticket's slot was freed, and its pin on the arena may be
		// the last: Go's to give up, as Slot.Release does.
		if _, err := t.mem.DropRef(); err != nil {
			return Slot{}, res.Entry, true, err
		}
	}
	return Slot{arena: b, Index: d.Slot, Generation: d.Generation}, res.Entry, true, nil
}
