package main

/*
#include "internal.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/stream"
	"golang.org/x/sys/unix"
)

// The observer's calls (zctipc top and tail): they read queues, streams and
// arenas without taking anything from their users.

// The cursors of zctipc.h are package queue's and stream's.
var _ = [1][1][1]struct{}{}[queue.PeekOldest-C.ZCT_PEEK_OLDEST][queue.PeekNewest-C.ZCT_PEEK_NEWEST][stream.PeekLatest-C.ZCT_PEEK_LATEST]

//export zct_queue_peek
func zct_queue_peek(h C.zct_handle, cursor *C.uint64_t, buf unsafe.Pointer, capacity C.uint64_t, typ *C.int32_t,
	payloadOffset *C.uint64_t, payloadLen *C.uint64_t, views *C.zct_view, viewsCap C.int32_t, nviews *C.int32_t,
	missed *C.uint64_t) C.int {
	return run(func() error {
		if cursor == nil || typ == nil || payloadOffset == nil || payloadLen == nil || nviews == nil || missed == nil {
			return errNilArg
		}
		if viewsCap < 0 {
			return badCount("views_cap", viewsCap, 0, math.MaxInt32)
		}
		if buf == nil && capacity > 0 || viewsCap > 0 && views == nil {
			return errNilArg
		}
		q, err := queues.get(uint64(h))
		if err != nil {
			return err
		}
		raw := unsafe.Slice((*byte)(buf), capacity)
		p, err := q.Peek(uint64(*cursor), raw)
		var re *queue.RangeError
		if err == nil || errors.Is(err, queue.ErrEmpty) || errors.As(err, &re) {
			*cursor, *missed = C.uint64_t(p.Next), C.uint64_t(p.Missed)
		}
		if errors.As(err, &re) {
			*payloadLen, *nviews = C.uint64_t(re.Need), C.int32_t(re.Views)
			if buf == nil { // passed over, as asked
				*typ = 0
				return nil
			}
			*cursor = C.uint64_t(p.At)
			return fmt.Errorf("%w: %w", errRange, err)
		}
		if err != nil {
			return err
		}
		var m handover.Message
		if err := m.Decode(raw[:p.Size]); err != nil {
			return err
		}
		need := message.Views(m.Type, len(m.Descriptors)) // as a get gives them
		if need > int(viewsCap) {
			*payloadLen, *nviews = C.uint64_t(p.Size), C.int32_t(need)
			*cursor = C.uint64_t(p.At) // asked again with room for them
			return fmt.Errorf("%w: a record with %d views", errRange, need)
		}
		// What fails from here is the record's (it was put so): the cursor
		// stays past it.
		out := unsafe.Slice(views, need)
		if err := attachViews(m.Descriptors, out); err != nil {
			return err
		}
		if m.Type == message.TypeInline {
			fillInline(&out[0], &m.Inline, m.InlineAt)
		}
		*typ = C.int32_t(m.Type)
		*payloadOffset = C.uint64_t(m.PayloadAt)
		*payloadLen = C.uint64_t(len(m.Payload))
		*nviews = C.int32_t(need)
		return nil
	})
}

// attachViews fills a view for each descriptor of a peeked record, with a
// count of this process's own (buffer.Attach: never the count the record
// carries, which stays its taker's). A descriptor whose memory every holder
// let go meanwhile gets a view without a ref (0) or data (NULL). On failure
// it releases what it attached.
func attachViews(descs []message.Descriptor, views []C.zct_view) error {
	for i := range descs {
		r, data, err := buffer.Attach(&descs[i])
		if errors.Is(err, unix.ENOENT) {
			gone := handover.ViewOf(nil, nil, &descs[i])
			fillView(&views[i], 0, &gone)
			continue
		}
		if err != nil {
			errs := []error{err}
			for j := range i {
				if r, terr := refs.take(uint64(views[j].ref)); terr == nil {
					errs = append(errs, r.Release())
				}
			}
			return errors.Join(errs...)
		}
		a := handover.ViewOf(r, data, &descs[i])
		fillView(&views[i], refs.put(r), &a)
	}
	return nil
}

//export zct_stream_peek
func zct_stream_peek(h C.zct_handle, position *C.uint64_t, buf unsafe.Pointer, capacity C.uint64_t) C.int {
	return run(func() error {
		if position == nil || buf == nil && capacity > 0 {
			return errNilArg
		}
		s, err := streams.get(uint64(h))
		if err != nil {
			return err
		}
		pos, err := s.Peek(uint64(*position), unsafe.Slice((*byte)(buf), capacity))
		*position = C.uint64_t(pos)
		return err
	})
}

// observed is one segment in zct_segment_observe's report: its state as
// package queue, stream or pool reads it, in the names of format.md.
type observed struct {
	Name   string          `json:"name"`
	Kind   string          `json:"kind"`
	Queue  *observedQueue  `json:"queue,omitempty"`
	Stream *observedStream `json:"stream,omitempty"`
	Arena  *observedArena  `json:"arena,omitempty"`
}

type observedQueue struct {
	RingBytes uint64 `json:"ring_bytes"`
	Capacity  uint64 `json:"capacity"`
	MaxItems  uint64 `json:"max_items"`
	Unbounded bool   `json:"unbounded"`
	Puts      uint32 `json:"puts"`
	Gets      uint32 `json:"gets"`
	Done      uint32 `json:"done"`
	Tail      uint32 `json:"tail"`
	Head      uint32 `json:"head"`
	Messages  int    `json:"messages"`
	Bytes     uint64 `json:"bytes"`
	Producer  int64  `json:"producer"`
	Consumer  int64  `json:"consumer"`
}

type observedStream struct {
	Frames          int              `json:"frames"`
	ReaderSlots     int              `json:"reader_slots"`
	Policy          string           `json:"policy"`
	DType           int              `json:"dtype"`
	Shape           []int64          `json:"shape"`
	FrameBytes      uint64           `json:"frame_bytes"`
	ReaderTimeoutMS int64            `json:"reader_timeout_ms"`
	Published       uint64           `json:"published"`
	Claim           uint64           `json:"claim"`
	Dropped         uint64           `json:"dropped"`
	Ended           bool             `json:"ended"`
	Writer          int64            `json:"writer"`
	Readers         []observedReader `json:"readers"`
}

type observedReader struct {
	Slot     int    `json:"slot"`
	PID      int64  `json:"pid"`
	State    string `json:"state"`
	Position uint64 `json:"position"`
	Received uint64 `json:"received"`
	Dropped  uint64 `json:"dropped"`
}

type observedArena struct {
	SlotSize uint64 `json:"slot_size"`
	Slots    uint32 `json:"slots"`
	InUse    int64  `json:"in_use"`
	Class    int    `json:"class"`
	Tickets  bool   `json:"tickets"`
	Frees    uint32 `json:"frees"`
}

//export zct_segment_observe
func zct_segment_observe(name *C.zct_cchar, buf *C.char, capacity C.uint64_t, length *C.uint64_t) C.int {
	return run(func() error {
		if name == nil {
			return errNilArg
		}
		client() // memfd segments come through the daemon
		m, err := shm.Map(goString(name), 0)
		if err != nil {
			return err
		}
		defer m.Unmap()
		out := observed{Name: m.Name(), Kind: m.Header().Kind.String()}
		switch m.Header().Kind {
		case header.KindQueue:
			st, err := queue.Observe(m.Data())
			if err != nil {
				return fmt.Errorf("queue %q: %w", m.Name(), err)
			}
			out.Queue = &observedQueue{
				RingBytes: st.RingBytes, Capacity: st.Capacity, MaxItems: st.MaxItems, Unbounded: st.Unbounded,
				Puts: st.Puts, Gets: st.Gets, Done: st.Done, Tail: st.Tail, Head: st.Head,
				Messages: st.Messages(), Bytes: st.Bytes(), Producer: st.Producer, Consumer: st.Consumer,
			}
		case header.KindStream:
			st, err := stream.Observe(m.Data())
			if err != nil {
				return fmt.Errorf("stream %q: %w", m.Name(), err)
			}
			out.Stream = &observedStream{
				Frames: st.Frames, ReaderSlots: st.Readers, Policy: st.Policy.String(), DType: int(st.DType),
				Shape: st.Shape, FrameBytes: st.FrameBytes, ReaderTimeoutMS: st.ReaderTimeout.Milliseconds(),
				Published: st.Published, Claim: st.Claim, Dropped: st.Dropped, Ended: st.Ended, Writer: st.Writer,
				Readers: []observedReader{},
			}
			for _, r := range st.Slots {
				out.Stream.Readers = append(out.Stream.Readers, observedReader{
					Slot: r.Slot, PID: r.PID, State: r.State, Position: r.Position, Received: r.Received, Dropped: r.Dropped,
				})
			}
		case header.KindArena:
			st, err := pool.ObserveArena(m)
			if err != nil {
				return err
			}
			out.Arena = &observedArena{
				SlotSize: st.SlotSize, Slots: st.Slots, InUse: st.InUse, Class: st.Class, Tickets: st.Tickets, Frees: st.Frees,
			}
		}
		return writeJSON(out, buf, capacity, length)
	})
}
