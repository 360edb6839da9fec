package plane

/*
#include "plane.h"
*/
import "C"

import (
	"unsafe"
)

// Layout of a ledger (plane.h; docs/format.md), package ledger's.
const (
	LedgerEntriesAt  = C.ZP_LEDGER_ENTRIES_AT
	LedgerEntrySize  = C.ZP_LEDGER_ENTRY_SIZE
	LedgerNameCap    = C.ZP_LEDGER_NAME_CAP
	LedgerMaxEntries = C.ZP_LEDGER_MAX_ENTRIES
	LedgerEState     = C.ZP_LEDGER_E_STATE
	LedgerEIndex     = C.ZP_LEDGER_E_INDEX
	LedgerEGen       = C.ZP_LEDGER_E_GEN
	LedgerENameLen   = C.ZP_LEDGER_E_NAME_LEN
	LedgerEFinalLen  = C.ZP_LEDGER_E_FINAL_LEN
	LedgerEDev       = C.ZP_LEDGER_E_DEV
	LedgerEIno       = C.ZP_LEDGER_E_INO
	LedgerEName      = C.ZP_LEDGER_E_NAME
	LedgerEFinal     = C.ZP_LEDGER_E_FINAL
	LedgerFree       = C.ZP_LEDGER_FREE
	LedgerCreating   = C.ZP_LEDGER_CREATING
	LedgerSegment    = C.ZP_LEDGER_SEGMENT
	LedgerSlot       = C.ZP_LEDGER_SLOT
	// LedgerFull and LedgerFaulted are what Record returns when it
	// records nothing.
	LedgerFull    = C.ZP_LEDGER_FULL
	LedgerFaulted = C.ZP_LEDGER_FAULTED
)

// Ledger is a process's ledger as the plane keeps it (zp_ledger): its
// data region and its free entries, in C memory, so that the C ABI's calls
// record counts in it too. It is never freed.
type Ledger C.zp_ledger

// NewLedger makes the Ledger of data, a ledger's data region mapped for as
// long as the process lives, whose first capacity entries are reserved; nil
// when C memory ran out.
func NewLedger(data []byte, capacity int) *Ledger {
	return (*Ledger)(C.zp_ledger_new((*C.uint8_t)(unsafe.Pointer(&data[0])), C.uint32_t(capacity)))
}

// SetCurrent makes l the ledger of this process's counts for the C ABI's
// calls that take counts without entering Go; nil: none.
func SetCurrent(l *Ledger) { C.zp_ledger_set_current((*C.zp_ledger)(l)) }

// Grow frees the entries up to capacity, once their pages are reserved.
func (l *Ledger) Grow(capacity int) { C.zp_ledger_grow((*C.zp_ledger)(l), C.uint32_t(capacity)) }

// Move points the ledger at data, a new ledger's data region mapped for as
// long as the process lives, keeping which entries are taken: the counts
// recorded before drop their entries in it, where they free them (its
// entries of those numbers record nothing).
func (l *Ledger) Move(data []byte) {
	C.zp_ledger_move((*C.zp_ledger)(l), (*C.uint8_t)(unsafe.Pointer(&data[0])))
}

// Capacity returns how many entries the ledger has.
func (l *Ledger) Capacity() int { return int(C.zp_ledger_capacity((*C.zp_ledger)(l))) }

// Free returns how many entries are free now.
func (l *Ledger) Free() int { return int(C.zp_ledger_free((*C.zp_ledger)(l))) }

// Record records one count (state LedgerCreating, LedgerSegment or
// LedgerSlot) in a free entry and returns its number, or LedgerFull or
// LedgerFaulted. name and final hold at most LedgerNameCap bytes.
func (l *Ledger) Record(state uint32, name, final string, index, gen uint32) int {
	return int(C.zp_ledger_record((*C.zp_ledger)(l), C.uint32_t(state), bytesOf(name), C.uint32_t(len(name)),
		bytesOf(final), C.uint32_t(len(final)), C.uint32_t(index), C.uint32_t(gen)))
}

// bytesOf returns the bytes of s for C, which reads them during the call.
func bytesOf(s string) *C.uint8_t { return (*C.uint8_t)(unsafe.Pointer(unsafe.StringData(s))) }

// Drop clears entry n, which the caller recorded, and frees it. It reports
// whether the ledger's memory held (false: it faulted, and the entry
// records nothing any more), as Opened and Created do; false too, changing
// nothing, for an entry no one holds (dropped already, never recorded).
func (l *Ledger) Drop(n int) bool { return C.zp_ledger_drop((*C.zp_ledger)(l), C.int32_t(n)) == OK }

// Opened says where the file of Creating entry n was made.
func (l *Ledger) Opened(n int, dev, ino uint64) bool {
	return C.zp_ledger_opened((*C.zp_ledger)(l), C.int32_t(n), C.uint64_t(dev), C.uint64_t(ino)) == OK
}

// Created turns Creating entry n into a Segment entry of its final name.
func (l *Ledger) Created(n int) bool {
	return C.zp_ledger_created((*C.zp_ledger)(l), C.int32_t(n)) == OK
}
