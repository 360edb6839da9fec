package plane

/*
#include <stdlib.h>
#include "plane.h"
*/
import "C"

import (
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// Results of a reader's and a writer's steps (plane.h), beside OK, Wait,
// Corrupt and Fault.
const (
	Ended   = C.ZP_ENDED
	Rejoin  = C.ZP_REJOIN
	NoFrame = C.ZP_NO_FRAME
)

// Layout of a stream's data region that a reader's steps use (plane.h):
// package stream's words, written once there.
const (
	StreamClaim        = C.ZP_STREAM_CLAIM
	StreamPublished    = C.ZP_STREAM_PUBLISHED
	StreamEnded        = C.ZP_STREAM_ENDED
	StreamDataSeq      = C.ZP_STREAM_DATA_SEQ
	StreamDataWaiters  = C.ZP_STREAM_DATA_WAITERS
	StreamSpaceSeq     = C.ZP_STREAM_SPACE_SEQ
	StreamSpaceWaiters = C.ZP_STREAM_SPACE_WAITERS
	StreamWanted       = C.ZP_STREAM_WANTED
	StreamDropped      = C.ZP_STREAM_DROPPED
	ReaderWordAt       = C.ZP_READER_WORD
	ReaderPositionAt   = C.ZP_READER_POSITION
	ReaderSeenAt       = C.ZP_READER_SEEN
	ReaderDroppedAt    = C.ZP_READER_DROPPED
	ReaderReceivedAt   = C.ZP_READER_RECEIVED
	ReaderArmedAt      = C.ZP_READER_ARMED
	StreamReadersAt    = C.ZP_STREAM_READERS_AT
	ReaderSize         = C.ZP_READER_SIZE
)

// What a writer's Corrupt met (Out's What): a slot past the ring in the
// table, no free slot at all, or a table entry that is not the slot the
// writer gave the frame.
const (
	BadSlot    = C.ZP_BAD_SLOT
	NoFreeSlot = C.ZP_NO_FREE_SLOT
	MovedSlot  = C.ZP_MOVED_SLOT
)

// The busy word's bits (plane.h): a call holds it, a call of Go's waits
// for it.
const (
	busyHeld   = C.ZP_BUSY_HELD
	busyWanted = C.ZP_BUSY_WANTED
)

// Hold is the busy word of a stream's reader or writer: its calls hold it
// one at a time, a step of the C ABI's (zp_enter) or a call of Go's
// (Enter).
type Hold C.int32_t

// Enter takes b for one call, waiting for the call that has it: a step of
// the C ABI's, or its wait for a frame, which a frame, its timeout or a
// close ends (as a Look of Go's holds the reader while it waits). While it
// waits, the word says so, and the C ABI's steps leave it to this call
// (Note [a call of Go's waits for the busy word] in stream.c). It and
// Leave take the busy word as zp_enter and zp_leave do, with Go's atomics,
// which are the same on the same word, and no cgo call. The calls of Go's
// on one word are one at a time (package stream's calls).
func (b *Hold) Enter() {
	busy := (*int32)(unsafe.Pointer(b))
	pause := 10 * time.Microsecond
	for i := 0; ; i++ {
		v := atomic.LoadInt32(busy)
		if v&busyHeld == 0 && atomic.CompareAndSwapInt32(busy, v, busyHeld) {
			return // the mark of this call's wait goes with it
		}
		if v&busyHeld != 0 && v&busyWanted == 0 {
			atomic.CompareAndSwapInt32(busy, v, v|busyWanted)
		}
		if i < 64 {
			runtime.Gosched()
			continue
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
	}
}

// Leave lets b go after a call.
func (b *Hold) Leave() { atomic.AndInt32((*int32)(unsafe.Pointer(b)), ^int32(busyHeld)) }

// Reader is a stream reader's state, in C memory so that the C ABI may run
// its steps between calls: NewReader makes it, Free lets it go once no
// step runs. Its calls are one at a time (Hold).
type Reader C.zp_reader

// NewReader makes the Reader of the reader slot at slot in the stream
// data region data, of frames frames whose slot table starts at table.
// data and slot stay mapped for as long as the Reader lives.
func NewReader(data, slot unsafe.Pointer, frames int, table uint64) *Reader {
	r := (*C.zp_reader)(C.calloc(1, C.sizeof_zp_reader))
	r.data = (*C.uint8_t)(data)
	r.slot = (*C.uint8_t)(slot)
	r.frames = C.uint64_t(frames)
	r.table = C.uint64_t(table)
	return (*Reader)(r)
}

// Free lets r go.
func (r *Reader) Free() { C.free(unsafe.Pointer(r)) }

// Hold returns r's busy word, which its calls take (Hold.Enter).
func (r *Reader) Hold() *Hold { return (*Hold)(unsafe.Pointer(&r.busy)) }

// Look runs the look step (zp_read_look): the slot of the next frame, and
// the step's result.
func (r *Reader) Look(out *Out) (int, int) {
	var slot C.int32_t
	res := int(C.zp_read_look((*C.zp_reader)(r), &slot, out))
	return int(slot), res
}

// Increment runs the increment step (zp_read_increment): whether the frame
// was whole, and the step's result.
func (r *Reader) Increment(out *Out) (bool, int) {
	var whole C.int32_t
	res := int(C.zp_read_increment((*C.zp_reader)(r), &whole, out))
	return whole != 0, res
}

// Pos returns the position of the next frame to read; SetPos sets it.
func (r *Reader) Pos() uint64     { return uint64(r.pos) }
func (r *Reader) SetPos(p uint64) { r.pos = C.uint64_t(p) }

// Word returns the slot word the reader holds; SetWord sets it.
func (r *Reader) Word() uint64     { return uint64(r.word) }
func (r *Reader) SetWord(w uint64) { r.word = C.uint64_t(w) }

// Looking reports whether a frame is looked at.
func (r *Reader) Looking() bool { return r.looking != 0 }

// Writer is a stream writer's state, in C memory so that the C ABI may run
// its steps between calls: NewWriter makes it, Free lets it go once no
// step runs. Its calls are one at a time (Hold).
type Writer C.zp_writer

// WriterConfig is what a writer's steps know of its stream, beside its
// data region.
type WriterConfig struct {
	Frames  int
	Table   uint64 // where the slot table starts
	Readers int
	Block   bool // the policy is Block
	// Refresh reads the readers on every claim; WarmSlots bounds the free
	// slots kept warm.
	Refresh   bool
	WarmSlots int
	// ReaderTimeout is how long a live reader may go unseen before a
	// wait for room evicts it (0: for ever); Suspects reads it.
	ReaderTimeout time.Duration
}

// NewWriter makes the Writer of the stream data region data, which stays
// mapped for as long as the Writer lives, at position next.
func NewWriter(data unsafe.Pointer, cfg WriterConfig, next uint64) *Writer {
	frames := C.size_t(cfg.Frames)
	w := (*C.zp_writer)(C.calloc(1, C.sizeof_zp_writer+3*frames*C.sizeof_int32_t))
	w.data = (*C.uint8_t)(data)
	w.frames = C.uint64_t(cfg.Frames)
	w.table = C.uint64_t(cfg.Table)
	w.readers = C.uint32_t(cfg.Readers)
	w.block = C.int32_t(boolInt(cfg.Block))
	w.refresh = C.int32_t(boolInt(cfg.Refresh))
	w.warm_slots = C.uint32_t(cfg.WarmSlots)
	w.reader_timeout = C.int64_t(cfg.ReaderTimeout.Nanoseconds())
	w.next = C.uint64_t(next)
	lists := unsafe.Add(unsafe.Pointer(w), C.sizeof_zp_writer)
	w.warm = (*C.int32_t)(lists)
	w.cold = (*C.int32_t)(unsafe.Add(lists, uintptr(frames)*C.sizeof_int32_t))
	w.given = (*C.int32_t)(unsafe.Add(lists, 2*uintptr(frames)*C.sizeof_int32_t))
	return (*Writer)(w)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Free lets w go.
func (w *Writer) Free() { C.free(unsafe.Pointer(w)) }

// Hold returns w's busy word, which its calls take (Hold.Enter).
func (w *Writer) Hold() *Hold { return (*Hold)(unsafe.Pointer(&w.busy)) }

// Look runs the claim step (zp_write_look): the slot of the next frame,
// and the step's result.
func (w *Writer) Look(out *Out) (int, int) {
	var slot C.int32_t
	res := int(C.zp_write_look((*C.zp_writer)(w), &slot, out))
	return int(slot), res
}

// Increment runs the publish step (zp_write_increment).
func (w *Writer) Increment(out *Out) int {
	return int(C.zp_write_increment((*C.zp_writer)(w), out))
}

// Slowest reads the live readers' positions (zp_write_slowest): the
// lowest, or the next frame when none is live; and the step's result.
func (w *Writer) Slowest(out *Out) (uint64, int) {
	var low C.uint64_t
	res := int(C.zp_write_slowest((*C.zp_writer)(w), &low, out))
	return uint64(low), res
}

// Suspects runs zp_write_suspects: whether a reader that holds the writer
// back may be evicted, by the slot table and the reader's /proc entry
// (not its start time: package proc's), at the wall clock now (Unix ns);
// and the step's result.
func (w *Writer) Suspects(now int64, out *Out) (bool, int) {
	var suspect C.int32_t
	res := int(C.zp_write_suspects((*C.zp_writer)(w), C.int64_t(now), &suspect, out))
	return suspect != 0, res
}

// Next returns the position of the next frame to claim.
func (w *Writer) Next() uint64 { return uint64(w.next) }

// SetFreed says that every frame's slot below position p is free, and
// that no reader is below it.
func (w *Writer) SetFreed(p uint64) { w.freed = C.uint64_t(p); w.min_pos = C.uint64_t(p) }

// PushCold adds slot i to the cold free slots (at most Frames of them).
func (w *Writer) PushCold(i int) {
	unsafe.Slice(w.cold, int(w.frames))[w.cold_n] = C.int32_t(i)
	w.cold_n++
}

// SetGiven notes that frame p, in flight, is in slot i (a writer that
// takes the role over reads the frames in flight from the table).
func (w *Writer) SetGiven(p uint64, i int) {
	unsafe.Slice(w.given, int(w.frames))[p%uint64(w.frames)] = C.int32_t(i)
}

// Frame is the position a writer's Corrupt met: the frame whose slot is
// past the ring (BadSlot) or not the one given (MovedSlot), or the frames
// in flight (NoFreeSlot).
func Frame(o *Out) uint64 { return uint64(o.filled) }
