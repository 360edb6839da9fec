package plane

/*
#cgo noescape zp_pool_pop
#cgo nocallback zp_pool_pop
#cgo noescape zp_pool_push
#cgo nocallback zp_pool_push
#cgo noescape zp_pool_hand_out
#cgo nocallback zp_pool_hand_out
#cgo noescape zp_pool_add_ref
#cgo nocallback zp_pool_add_ref
#cgo noescape zp_pool_release
#cgo nocallback zp_pool_release
#cgo noescape zp_pool_check
#cgo nocallback zp_pool_check
#cgo noescape zp_ticket_arm
#cgo nocallback zp_ticket_arm
#cgo noescape zp_ticket_take
#cgo nocallback zp_ticket_take
#cgo noescape zp_pool_take
#cgo nocallback zp_pool_take
#cgo noescape zp_slot_release
#cgo nocallback zp_slot_release
#cgo noescape zp_slot_ref
#cgo nocallback zp_slot_ref
#cgo noescape zp_slot_send
#cgo nocallback zp_slot_send
#cgo noescape zp_slot_adopt
#cgo nocallback zp_slot_adopt
#include "plane.h"
*/
import "C"

import (
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/fault"
)

// Note [a pool slot's steps in the plane]: a queue record may carry
// descriptors of pool slots, each with a count and a ticket; for the C
// ABI to take such a record without entering Go, the steps of the slot
// protocol (the free stack, a count added for one generation and given
// back, a descriptor's check, a ticket's word) are C, here, and package
// pool runs them through cgo: one implementation. Each pointer argument
// is only read or written for the call (noescape) and no step calls Go
// (nocallback), which spares Go the heap for its results.

// Results of the slot protocol's steps (plane.h).
const (
	PoolStale = C.ZP_POOL_STALE
	PoolMoved = C.ZP_POOL_MOVED
	PoolTaken = C.ZP_POOL_TAKEN
	// PoolRefused, PoolUnpinned and PoolReserve are the sequences' (Note
	// [a hand-off's steps in one call] in pool.c).
	PoolRefused  = C.ZP_POOL_REFUSED
	PoolUnpinned = C.ZP_POOL_UNPINNED
	PoolReserve  = C.ZP_POOL_RESERVE
	// LedgerNone is a sequence's entry of a count left unrecorded.
	LedgerNone = C.ZP_LEDGER_NONE
	// Steps of Adopt.
	AdoptDesc  = C.ZP_ADOPT_DESC
	AdoptCheck = C.ZP_ADOPT_CHECK
	AdoptTake  = C.ZP_ADOPT_TAKE
)

// Layout of an arena's data region (docs/format.md), as plane.h has it.
const (
	ArenaFreeHead  = C.ZP_ARENA_FREE_HEAD
	ArenaFreeSeq   = C.ZP_ARENA_FREE_SEQ
	ArenaWaiters   = C.ZP_ARENA_WAITERS
	ArenaFreeCount = C.ZP_ARENA_FREE_COUNT
	ArenaSlotTable = C.ZP_ARENA_SLOT_TABLE
	SlotMeta       = C.ZP_SLOT_META
)

// Arena is an arena as the plane sees it: its layout, checked by the
// caller once, who keeps data mapped while a step runs. It holds no Go
// pointer, so it may live in Go memory. Its steps are safe for concurrent
// use, as the protocol is.
type Arena C.zp_arena

// NewArena returns the view of the arena whose data region is at data.
func NewArena(data unsafe.Pointer, slotSize, slotsAt uint64, nslots uint32) Arena {
	return Arena{data: (*C.uint8_t)(data), slot_size: C.uint64_t(slotSize), slots_at: C.uint64_t(slotsAt),
		nslots: C.uint32_t(nslots)}
}

// Note: each step is given a copy of the view on the stack rather than a,
// which lives inside a larger Go object (package pool's Arena): cgo's
// check of a pointer argument into the heap looks at every pointer of the
// whole object it lies in (and finds Go's), while a pointer into the stack
// is no Go pointer to it; noescape keeps the copy there.

// faulted returns the error of a step that reported Fault, or nil.
func faulted(r C.int, out *C.zp_out) error {
	if r == Fault {
		return &fault.Error{Addr: uintptr(out.addr)}
	}
	return nil
}

// Pop takes the slot on top of the free stack (zp_pool_pop): false when
// there is none.
func (a *Arena) Pop() (uint32, bool, error) {
	var out C.zp_out
	var slot C.uint32_t
	v := C.zp_arena(*a)
	r := C.zp_pool_pop(&v, &slot, &out)
	return uint32(slot), r == OK, faulted(r, &out)
}

// Push puts slot back on the free stack and wakes the owners waiting for
// one (zp_pool_push); Range for a slot past the arena.
func (a *Arena) Push(slot uint32) (int, error) {
	var out C.zp_out
	v := C.zp_arena(*a)
	r := C.zp_pool_push(&v, C.uint32_t(slot), &out)
	return int(r), faulted(r, &out)
}

// HandOut gives a slot just popped a new generation, returned, and a count
// of one (zp_pool_hand_out).
func (a *Arena) HandOut(slot uint32) (uint32, int, error) {
	var out C.zp_out
	var gen C.uint32_t
	v := C.zp_arena(*a)
	r := C.zp_pool_hand_out(&v, C.uint32_t(slot), &gen, &out)
	return uint32(gen), int(r), faulted(r, &out)
}

// AddRef adds a count to slot for generation gen (zp_pool_add_ref): OK,
// PoolStale, or PoolMoved with the generation the count landed on, which
// the caller gives back.
func (a *Arena) AddRef(slot, gen uint32) (uint32, int, error) {
	var out C.zp_out
	var landed C.uint32_t
	v := C.zp_arena(*a)
	r := C.zp_pool_add_ref(&v, C.uint32_t(slot), C.uint32_t(gen), &landed, &out)
	return uint32(landed), int(r), faulted(r, &out)
}

// Release gives back a count on slot (zp_pool_release): OK, with whether
// it was the last (the slot is then on the free stack again), or
// PoolStale.
func (a *Arena) Release(slot uint32) (bool, int, error) {
	var out C.zp_out
	var last C.uint32_t
	v := C.zp_arena(*a)
	r := C.zp_pool_release(&v, C.uint32_t(slot), &last, &out)
	return last != 0, int(r), faulted(r, &out)
}

// Check is a descriptor's check of slot and gen (zp_pool_check): OK,
// PoolStale, or Corrupt for a slot past the arena.
func (a *Arena) Check(slot, gen uint32) (int, error) {
	var out C.zp_out
	v := C.zp_arena(*a)
	r := C.zp_pool_check(&v, C.uint32_t(slot), C.uint32_t(gen), &out)
	return int(r), faulted(r, &out)
}

// ArmTicket stores nonce in the ticket word of slot (zp_ticket_arm).
func (a *Arena) ArmTicket(slot uint32, nonce uint64) (int, error) {
	var out C.zp_out
	v := C.zp_arena(*a)
	r := C.zp_ticket_arm(&v, C.uint32_t(slot), C.uint64_t(nonce), &out)
	return int(r), faulted(r, &out)
}

// TakeTicket moves the ticket word of slot from nonce to zero, once
// (zp_ticket_take): OK for the one that wins, PoolTaken for the others.
func (a *Arena) TakeTicket(slot uint32, nonce uint64) (int, error) {
	var out C.zp_out
	v := C.zp_arena(*a)
	r := C.zp_ticket_take(&v, C.uint32_t(slot), C.uint64_t(nonce), &out)
	return int(r), faulted(r, &out)
}

// ParkAddRef, for tests, makes the next AddRef of the count at rc wait
// between its check of the generation and its exchange of the count until
// ResumeAddRef; AddRefParked says it waits.
func ParkAddRef(rc *int64) { C.zp_pool_park_add_ref((*C.int64_t)(unsafe.Pointer(rc))) }

// AddRefParked reports whether the AddRef that ParkAddRef named waits.
func AddRefParked() bool { return C.zp_pool_add_ref_parked() != 0 }

// ResumeAddRef lets the AddRef that ParkAddRef named go on, or disarms the
// park when none came.
func ResumeAddRef() { C.zp_pool_resume_add_ref() }

// The sequences of a hand-off (Note [a hand-off's steps in one call] in
// pool.c): each is one crossing into C for several steps. pins is the word
// of the arena segment's count (shm's RefcountWord), l the ledger of the
// counts (nil: none), whose entries are C's ints (shm.NoEntry is -1).

// Take takes a slot (zp_pool_take): popped, handed out, its arena pinned,
// and with zero its first word zeroed. It returns the slot (MaxUint32 when
// a fault came before the pop), its generation and the step's result: OK,
// Wait, PoolReserve, PoolUnpinned, Range, or Fault with the error.
func (a *Arena) Take(pins *int64, reservedTo uint64, zero bool) (uint32, uint32, int, error) {
	var out C.zp_out
	var slot, gen C.uint32_t
	v := C.zp_arena(*a)
	r := C.zp_pool_take(&v, (*C.int64_t)(unsafe.Pointer(pins)), C.uint64_t(reservedTo), c32(zero), &slot, &gen, &out)
	return uint32(slot), uint32(gen), int(r), faulted(r, &out)
}

// ReleaseRecorded gives back a count on slot, its entry in l dropped first
// (zp_slot_release): OK with whether the arena's pin is the caller's to
// give up, PoolStale, Range, or Fault with the error.
func (a *Arena) ReleaseRecorded(pins *int64, slot uint32, l *Ledger, entry int) (bool, int, error) {
	var out C.zp_out
	var unpin C.int32_t
	v := C.zp_arena(*a)
	r := C.zp_slot_release(&v, (*C.int64_t)(unsafe.Pointer(pins)), C.uint32_t(slot), (*C.zp_ledger)(l),
		C.int32_t(entry), &unpin, &out)
	return unpin != 0, int(r), faulted(r, &out)
}

// RefRecorded adds a count to slot for generation gen and records it in l
// under name (zp_slot_ref): the generation (for PoolMoved, the one the
// count landed on), the entry (LedgerNone or LedgerFaulted: unrecorded;
// LedgerFull: the caller grows the ledger), and OK, PoolStale, PoolMoved,
// Range, or Fault with the error.
func (a *Arena) RefRecorded(slot, gen uint32, l *Ledger, name string) (uint32, int, int, error) {
	var out C.zp_out
	var entry C.int32_t
	g := C.uint32_t(gen)
	v := C.zp_arena(*a)
	r := C.zp_slot_ref(&v, C.uint32_t(slot), 0, &g, (*C.zp_ledger)(l), bytesOf(name), C.uint32_t(len(name)), &entry, &out)
	return uint32(g), int(entry), int(r), faulted(r, &out)
}

// SendTicket drops entry of l, then arms ticket slot of a with nonce
// (zp_slot_send): OK, Range, or Fault with the error.
func (a *Arena) SendTicket(l *Ledger, entry int, slot uint32, nonce uint64) (int, error) {
	var out C.zp_out
	v := C.zp_arena(*a)
	r := C.zp_slot_send((*C.zp_ledger)(l), C.int32_t(entry), &v, C.uint32_t(slot), C.uint64_t(nonce), &out)
	return int(r), faulted(r, &out)
}

// Adopted is what Adopt did besides its result.
type Adopted struct {
	Entry int  // the buffer count's entry, as RefRecorded's
	Taken bool // the ticket was taken (before a PoolStale or Fault)
	Unpin bool // the ticket arena's pin is the caller's to give up
}

// Adopt runs steps (AdoptDesc, AdoptCheck, AdoptTake) of the adoption of
// the count descriptor d carries: its ticket in t (whose segment's count
// is tpins), its buffer in b (nil: a ticket alone), recorded in l under
// name (zp_slot_adopt). OK; PoolRefused, nothing changed; PoolStale or
// Fault with the error after the take.
func Adopt(t *Arena, tpins *int64, b *Arena, d *Desc, steps int, l *Ledger, name string) (Adopted, int, error) {
	var out C.zp_out
	var res C.zp_adopted
	tv := C.zp_arena(*t)
	var bv C.zp_arena
	bp := (*C.zp_arena)(nil)
	if b != nil {
		bv = C.zp_arena(*b)
		bp = &bv
	}
	r := C.zp_slot_adopt(&tv, (*C.int64_t)(unsafe.Pointer(tpins)), bp, d.c(), C.int32_t(steps), (*C.zp_ledger)(l),
		bytesOf(name), C.uint32_t(len(name)), &res, &out)
	return Adopted{Entry: int(res.entry), Taken: res.taken != 0, Unpin: res.unpin != 0}, int(r), faulted(r, &out)
}
