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

// Results of a reader's steps (plane.h), beside OK, Wait, Corrupt and Fault.
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
)

// Reader is a stream reader's state, in C memory so that the C ABI may run
// its steps between calls: NewReader makes it, Free lets it go once no
// step runs. Its calls are one at a time (Enter).
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

// Enter takes r for one call, waiting for the call that has it: a step of
// the C ABI's, or its wait for a frame, which a frame, its timeout or a
// close ends (as a Look of Go's holds the reader while it waits). It and
// Leave take the busy word as zp_reader_enter and zp_reader_leave do, with
// Go's atomics, which are the same on the same word, and no cgo call.
func (r *Reader) Enter() {
	busy := (*int32)(unsafe.Pointer(&r.busy))
	pause := 10 * time.Microsecond
	for i := 0; !atomic.CompareAndSwapInt32(busy, 0, 1); i++ {
		if i < 64 {
			runtime.Gosched()
			continue
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
	}
}

// Leave lets r go after a call.
func (r *Reader) Leave() { atomic.StoreInt32((*int32)(unsafe.Pointer(&r.busy)), 0) }

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
