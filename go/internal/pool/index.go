package pool

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// Note: an arena is unmapped only after removeFromIndex, so whatever reads an
// arena's memory without holding a count on one of its slots does it under
// index's read lock.

// The arenas this process maps, its own and other processes', by name and
// by address, so that a received slot costs no mmap and a buffer can be
// traced back to its slot.
var index = struct {
	sync.RWMutex
	byName   map[string]*Arena
	byAddr   []*Arena // sorted by base
	byListed map[unsafe.Pointer]*Arena
	sweeping bool
}{byName: map[string]*Arena{}, byListed: map[unsafe.Pointer]*Arena{}}

// sweepEvery is how often mapped arenas of other processes are checked, and
// unmapped once their count reached zero.
const sweepEvery = time.Second

func addToIndex(a *Arena) {
	index.Lock()
	defer index.Unlock()
	index.byName[a.Name()] = a
	i := sort.Search(len(index.byAddr), func(i int) bool { return index.byAddr[i].base >= a.base })
	index.byAddr = append(index.byAddr, nil)
	copy(index.byAddr[i+1:], index.byAddr[i:])
	index.byAddr[i] = a
	a.listed = plane.List(a.Name(), a.view, a.tickets, a.owned, a.mem.RefcountWord())
	index.byListed[a.listed.Pointer()] = a
	if !a.owned {
		startSweeper()
	}
}

// removeFromIndex forgets a, and marks it closed, before its memory goes:
// Find and Adopt use an arena only under the read lock.
func removeFromIndex(a *Arena) {
	index.Lock()
	defer index.Unlock()
	a.closed = true
	if index.byName[a.Name()] == a {
		delete(index.byName, a.Name())
	}
	for i, b := range index.byAddr {
		if b == a {
			index.byAddr = append(index.byAddr[:i], index.byAddr[i+1:]...)
			break
		}
	}
	if index.byListed[a.listed.Pointer()] == a {
		delete(index.byListed, a.listed.Pointer())
		a.listed.Unlist() // waits for the C ABI's calls that hold it, which wait for nothing
		a.listed = plane.Listed{}
	}
}

// ArenaOfView returns the arena whose entry in the C ABI's table of mapped
// arenas is p (plane.Listed.Pointer), while it is in the index.
func ArenaOfView(p unsafe.Pointer) (*Arena, bool) {
	index.RLock()
	defer index.RUnlock()
	a, ok := index.byListed[p]
	return a, ok
}

// Held returns the count on slot i, of generation gen, that its holder
// took outside Go (the C ABI's handoff.c): a Slot for it, unchecked.
func (a *Arena) Held(i, gen uint32) Slot { return Slot{arena: a, Index: i, Generation: gen} }

// Unpin gives back the count on the arena's segment that a slot in use
// held, once the C ABI gave up the slot's last count (Slot.Release's
// end): the segment goes when it was the last.
func (a *Arena) Unpin() error {
	_, err := a.mem.DropRef()
	return err
}

// retire turns an owned arena into one this process only maps, unmapped by
// the sweeper once its count reaches zero.
func retire(a *Arena) {
	index.Lock()
	defer index.Unlock()
	a.owned = false
	a.listed.Disown()
	startSweeper()
}

// startSweeper starts sweep unless it runs. The caller holds index.
func startSweeper() {
	if !index.sweeping {
		index.sweeping = true
		go sweep()
	}
}

// sweep unmaps the arenas this process does not own once their count
// reached zero, while any is mapped.
func sweep() {
	for {
		time.Sleep(sweepEvery)
		var dead []*Arena
		index.Lock()
		left := 0
		for _, a := range index.byName {
			if a.owned {
				continue
			}
			if a.mem.Count() <= 0 {
				dead = append(dead, a)
			} else {
				left++
			}
		}
		if left == 0 {
			index.sweeping = false
		}
		index.Unlock()
		for _, a := range dead {
			removeFromIndex(a)
			if err := a.mem.Unmap(); err != nil {
				fmt.Fprintln(os.Stderr, "zctipc:", err)
			}
		}
		if left == 0 {
			return
		}
	}
}

// Open returns the arena named name, mapping it (without a count) the first
// time this process meets it, after checking its layout.
func Open(name string) (*Arena, error) {
	index.RLock()
	a := index.byName[name]
	index.RUnlock()
	if a != nil {
		return a, nil
	}
	m, err := shm.Map(name, header.KindArena)
	if err != nil {
		return nil, err
	}
	a, err = arenaOf(mapped{m})
	if err != nil {
		return nil, errors.Join(err, m.Unmap())
	}
	index.Lock()
	if b := index.byName[a.Name()]; b != nil { // mapped meanwhile by another thread
		index.Unlock()
		return b, m.Unmap()
	}
	index.Unlock()
	addToIndex(a)
	return a, nil
}

// mapped is another process's arena, mapped without a count.
type mapped struct{ *shm.Mapping }

func (m mapped) Count() int64 { return m.Refcount() }

// arenaOf reads and checks the layout of an arena that another process wrote.
func arenaOf(m mapped) (*Arena, error) {
	data := m.Data()
	if len(data) < offSlotTable {
		return nil, fmt.Errorf("arena %q: %w: %d bytes", m.Name(), header.ErrCorrupt, len(data))
	}
	a := &Arena{mem: m, data: data, base: uintptr(unsafe.Pointer(&data[0]))}
	a.slotSize = *a.u64(offSlotSize)
	a.nslots = *a.u32(offNSlots)
	class := *a.u32(offClass)
	a.slotsAt = *a.u64(offSlotsAt)
	a.class = int(class)
	purpose := *a.u32(offPurpose)
	a.tickets = purpose == purposeTickets
	switch {
	case purpose != purposeBuffers && purpose != purposeTickets:
		return nil, fmt.Errorf("arena %q: %w: purpose %d", m.Name(), header.ErrCorrupt, purpose)
	case class >= NumClasses || a.slotSize != ClassSize(int(class)):
		return nil, fmt.Errorf("arena %q: %w: class %d with %d-byte slots", m.Name(), header.ErrCorrupt, class, a.slotSize)
	case a.nslots == 0 || a.nslots > maxSlots:
		return nil, fmt.Errorf("arena %q: %w: %d slots", m.Name(), header.ErrCorrupt, a.nslots)
	case a.slotsAt != slotsOffset(a.slotSize, uint64(a.nslots)) || arenaSize(a.slotSize, uint64(a.nslots)) > uint64(len(data)):
		return nil, fmt.Errorf("arena %q: %w: slots do not fit its %d bytes", m.Name(), header.ErrCorrupt, len(data))
	}
	a.view = plane.NewArena(unsafe.Pointer(&data[0]), a.slotSize, a.slotsAt, a.nslots)
	return a, nil
}

// Adopt returns the buffer slot a descriptor names, taking over the count
// the descriptor carried, after checking that the slot is in use and of
// that generation. A slot of a ticket arena is not a buffer: it is refused
// (Note [a ticket arena is not a buffer's]).
func Adopt(name string, slot uint32, generation uint32) (Slot, error) {
	return adopt(name, slot, generation, false)
}

// adopt returns the slot of an arena of tickets (or of buffers) that a
// descriptor names, as Adopt does.
func adopt(name string, slot uint32, generation uint32, tickets bool) (Slot, error) {
	a, err := Open(name)
	if err != nil {
		return Slot{}, err
	}
	index.RLock()
	defer index.RUnlock()
	switch {
	case a.tickets != tickets:
		what := map[bool]string{false: "buffers", true: "tickets"}
		return Slot{}, fmt.Errorf("slot %d of arena %q, an arena of %s, not of %s: %w", slot, name, what[a.tickets], what[tickets], unix.EINVAL)
	case a.closed:
		return Slot{}, fmt.Errorf("slot %d of arena %q, which is gone: %w", slot, name, ErrStale)
	}
	switch r, err := a.view.Check(slot, generation); {
	case err != nil:
		return Slot{}, fmt.Errorf("slot %d of arena %q: %w", slot, name, err)
	case r == plane.Corrupt:
		return Slot{}, fmt.Errorf("slot %d of arena %q, which has %d: %w", slot, name, a.nslots, header.ErrCorrupt)
	case r != plane.OK:
		return Slot{}, fmt.Errorf("slot %d of arena %q: %w", slot, name, ErrStale)
	}
	return Slot{arena: a, Index: slot, Generation: generation}, nil
}

// Find returns a new count on the slot that holds the n bytes at addr, with
// the offset of addr in it, when they lie in one slot in use of an arena this
// process maps.
func Find(addr uintptr, n uint64) (Slot, uint64, bool) {
	index.RLock()
	defer index.RUnlock()
	s, off, ok := lookup(addr, n)
	if !ok {
		return Slot{}, 0, false
	}
	s, err := s.AddRef()
	if err != nil {
		return Slot{}, 0, false
	}
	return s, off, true
}

// FindRecorded is Find with the new count recorded in ledger l (nil:
// none), in the same call into the plane (zp_slot_ref): the ledger's entry
// as the plane gives it (ledger.Recorded turns it into one).
func FindRecorded(addr uintptr, n uint64, l *plane.Ledger) (Slot, uint64, int, bool) {
	if addRefRaced != nil { // tests: AddRef's park, then the record, in Go
		s, off, ok := Find(addr, n)
		return s, off, plane.LedgerFull, ok
	}
	index.RLock()
	s, off, ok := lookup(addr, n)
	if !ok {
		index.RUnlock()
		return Slot{}, 0, 0, false
	}
	a := s.arena
	g, entry, r, err := a.view.RefRecorded(s.Index, s.Generation, l, a.Name())
	index.RUnlock()
	if err != nil || r != plane.OK {
		if r == plane.PoolMoved {
			// Note [a count for one generation]: the count is g's, given
			// back as any holder would; Find says only that there is none,
			// as for any count it cannot add.
			Slot{arena: a, Index: s.Index, Generation: g}.Release() //nolint:errcheck
		}
		return Slot{}, 0, 0, false
	}
	return s, off, entry, true
}

// Holds reports whether the n bytes at addr lie in one slot in use of an
// arena this process maps, as Find would, without a count.
func Holds(addr uintptr, n uint64) bool {
	index.RLock()
	defer index.RUnlock()
	s, _, ok := lookup(addr, n)
	return ok && s.Holders() > 0
}

// lookup finds the slot that holds the n bytes at addr, under the index's
// lock.
func lookup(addr uintptr, n uint64) (Slot, uint64, bool) {
	i := sort.Search(len(index.byAddr), func(i int) bool { return index.byAddr[i].base > addr }) - 1
	if i < 0 {
		return Slot{}, 0, false
	}
	a := index.byAddr[i]
	if a.tickets {
		return Slot{}, 0, false // a ticket is no buffer of anyone's
	}
	rel := uint64(addr - a.base)
	if rel < a.slotsAt {
		return Slot{}, 0, false
	}
	slot := (rel - a.slotsAt) / a.slotSize
	off := (rel - a.slotsAt) % a.slotSize
	if slot >= uint64(a.nslots) || off+n > a.slotSize {
		return Slot{}, 0, false
	}
	return Slot{arena: a, Index: uint32(slot), Generation: atomic.LoadUint32(a.gen(uint32(slot)))}, off, true
}
