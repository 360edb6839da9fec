// Tickets: the once-only claim that a sent descriptor carries on its count.

package pool

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/fault"
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
// the descriptor with its generation and nonce. Taking the descriptor
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
// not win by the compare-and-swap. A ticket that is never taken (bytes
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

// Ticket is a sent count's claim: a slot of a ticket arena whose first
// word holds Nonce until the count is taken.
type Ticket struct {
	Slot  Slot
	Nonce uint64
}

// word returns the ticket word of slot s.
func word(s Slot) *uint64 { return (*uint64)(unsafe.Pointer(&s.Data()[0])) }

// NewTicket issues a ticket for a count about to be sent.
func NewTicket() (Ticket, error) {
	s, err := tickets().Alloc(8, time.Now())
	if err != nil {
		return Ticket{}, fmt.Errorf("a ticket for a descriptor: %w", err)
	}
	nonce := rand.Uint64() | 1 // never zero, which means taken
	atomic.StoreUint64(word(s), nonce)
	return Ticket{Slot: s, Nonce: nonce}, nil
}

// Cancel takes back a ticket whose descriptor was not sent.
func (t Ticket) Cancel() error {
	if !atomic.CompareAndSwapUint64(word(t.Slot), t.Nonce, 0) {
		return fmt.Errorf("cancel ticket %d of arena %q: %w", t.Slot.Index, t.Slot.arena.Name(), ErrTaken)
	}
	return t.Slot.Release()
}

// TakeTicket takes the ticket a received descriptor names (slot index of
// generation gen of ticket arena name, holding nonce), once: a ticket
// taken before, here or anywhere, fails with ErrTaken.
func TakeTicket(name string, index, gen uint32, nonce uint64) error {
	if nonce == 0 {
		return fmt.Errorf("ticket %d of arena %q with no nonce: %w", index, name, ErrTaken)
	}
	s, err := Adopt(name, index, gen)
	if errors.Is(err, ErrStale) || errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%w (%v)", ErrTaken, err)
	}
	if err != nil {
		return err
	}
	if s.arena.slotSize < 8 {
		return fmt.Errorf("ticket %d of arena %q: slots of %d bytes: %w", index, name, s.arena.slotSize, unix.EINVAL)
	}
	won := false
	if err := fault.Catch(func() error {
		won = atomic.CompareAndSwapUint64(word(s), nonce, 0)
		return nil
	}); err != nil {
		return err
	}
	if !won {
		return fmt.Errorf("ticket %d of arena %q: %w", index, name, ErrTaken)
	}
	return s.Release()
}
