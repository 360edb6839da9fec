package main

/*
#cgo CFLAGS: -I${SRCDIR}/../internal/plane
#include "internal.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"golang.org/x/sys/unix"
)

// The framing facts of zctipc.h are package message's: the record types,
// the size of a record's header, and what a view of an inline array is;
// one number each, checked when this package compiles (an index other
// than 0 fails it). The layout of zct_queue_take's result is zctipc.h's
// alone: take packs it with the header's constants.
var (
	_ = [1][1][1][1]struct{}{}[message.TypePickle-C.ZCT_RECORD_PICKLE][message.TypeTensor-C.ZCT_RECORD_TENSOR][message.TypeBytes-C.ZCT_RECORD_BYTES][message.TypeInline-C.ZCT_RECORD_INLINE]
	_ = [1][1][1]struct{}{}[message.RecordHeaderSize-C.ZCT_RECORD_HEADER][message.RefSegment-C.ZCT_REF_SEGMENT][message.RefSlot-C.ZCT_REF_SLOT]
	// A payload's length and offset, below a record's largest size, fill
	// their fields, and a record type leaves the result's sign bit clear.
	_ = [1]struct{}{}[(queue.MaxCapacity-1)>>C.ZCT_TAKE_OFFSET_SHIFT]
	_ = [1]struct{}{}[C.ZCT_TAKE_FIELD_MASK+1-(1<<C.ZCT_TAKE_OFFSET_SHIFT)]
	_ = [1]struct{}{}[message.TypeInline>>(63-C.ZCT_TAKE_TYPE_SHIFT)]
)

var queues = newTable[*queue.Queue]()

// openQueue puts q in the table of handles, and in fast.c's, whose calls
// run the data plane's steps on it without Go.
func openQueue(q *queue.Queue) C.zct_handle {
	h := queues.put(q)
	C.zct_fast_register(C.uint64_t(h), unsafe.Pointer(q.Plane()))
	return C.zct_handle(h)
}

// recordType checks a record type that a C caller passed: one of
// zctipc.h's zct_record_type, which are package message's. A value past a
// byte is not taken for its low byte (259 is not ZCT_RECORD_BYTES), and
// 0xFF, the ring's skip marker, is no record's type.
func recordType(typ C.int32_t) (uint8, error) {
	if typ < message.TypePickle || typ > message.TypeInline {
		return 0, fmt.Errorf("record type %d: it must be from %d to %d: %w", typ, message.TypePickle, message.TypeInline, unix.EINVAL)
	}
	return uint8(typ), nil
}

// Note [the C contract of queue calls]: any C code in the process may call
// these exports with any arguments: NULL or dangling pointers, negative or
// huge counts, an extent that does not cover the array it describes. A
// NULL pointer is ZCT_E_INVALID naming NULL; a count out of range is
// ZCT_E_INVALID naming the count; an out-parameter is never skipped in
// silence (a caller that passed NULL would read what it never got). A put
// never sends a descriptor of bytes the caller did not name (past extent),
// and a failed put leaves no count taken. Pointers that are not NULL are
// trusted to be valid for what they say: C gives no way to check them.
// Every count is checked against its range before any pointer it sizes is
// read (a negative one is named as a count, not as a NULL pointer); a
// record type must be a zct_record_type (never its low byte: 259 is not
// ZCT_RECORD_BYTES, and 0xFF is the ring's skip marker); a record the
// caller made wrong is ZCT_E_INVALID, not ZCT_E_CORRUPT; a timeout past the
// clock's range waits for ever rather than not at all.
//
// zctipc_go_queue_put_array is zct_queue_put_array (handoff.c) for what
// the data plane does not send itself: memory of a segment, or of an arena
// not listed yet, a wait for room, a ticket arena to make, an error to say.
//
//export zctipc_go_queue_put_array
func zctipc_go_queue_put_array(h C.zct_handle, typ C.int32_t, addr *C.zct_cvoid, extent C.uint64_t, dt C.int32_t, ndim C.int32_t, shape *C.zct_cint64, strides *C.zct_cint64, flags C.int32_t, timeoutMS C.int64_t) C.int {
	return run(func() error {
		if addr == nil || ndim > 0 && (shape == nil || strides == nil) {
			return errNilArg
		}
		rtype, err := recordType(typ)
		if err != nil {
			return err
		}
		q, err := queues.get(uint64(h))
		if err != nil {
			return err
		}
		r, off, ok, err := buffer.Find(uintptr(unsafe.Pointer(addr)), uint64(extent))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("the %d bytes at %p are not zctipc memory: %w", extent, addr, unix.ENOENT)
		}
		d, err := describeArray(r, off, dt, ndim, (*C.int64_t)(unsafe.Pointer(shape)), (*C.int64_t)(unsafe.Pointer(strides)), flags)
		if err == nil && d.NBytes > uint64(extent) {
			// Find vouched for extent bytes only: the array must lie in them,
			// not merely somewhere in the memory they belong to.
			err = fmt.Errorf("an array of shape %v and strides %v needs %d bytes, past its extent of %d: %w",
				d.Shape, d.Strides, d.NBytes, extent, unix.EINVAL)
		}
		if err != nil {
			return errors.Join(err, r.Release())
		}
		rec := message.Record{Type: rtype, Descriptors: []message.Descriptor{d}}
		sent, err := handover.Put(q, &rec, []*buffer.Ref{r}, deadline(timeoutMS))
		if !sent {
			return errors.Join(err, r.Release())
		}
		return err
	})
}

// zctipc_go_queue_put_inline is zct_queue_put_inline (fast.c) for what
// the data plane does not finish: a wait for room, an error to say. It
// reads the array from the caller's memory once, as Put writes the record
// into the ring (Note [one hand-over] in package handover). nbytes is
// bounded before a slice is laid over data: no inline record larger than a
// queue's largest is read at all.
//
//export zctipc_go_queue_put_inline
func zctipc_go_queue_put_inline(h C.zct_handle, data *C.zct_cvoid, nbytes C.uint64_t, dt C.int32_t, ndim C.int32_t, shape *C.zct_cint64, flags C.int32_t, timeoutMS C.int64_t) C.int {
	return run(func() error {
		if ndim < 0 || ndim > header.MaxNDim {
			return badCount("ndim", ndim, 0, header.MaxNDim)
		}
		if nbytes > 0 && data == nil || ndim > 0 && shape == nil {
			return errNilArg
		}
		if flags < 0 || flags > 7 {
			return fmt.Errorf("inline array flags %d: they must be from 0 to 7: %w", flags, unix.EINVAL)
		}
		q, err := queues.get(uint64(h))
		if err != nil {
			return err
		}
		if nbytes > queue.MaxCapacity {
			return fmt.Errorf("an inline array of %d bytes: %w", nbytes, queue.ErrTooLarge)
		}
		sh := make([]int64, ndim)
		if ndim > 0 {
			for i, d := range unsafe.Slice((*C.int64_t)(unsafe.Pointer(shape)), ndim) {
				sh[i] = int64(d)
			}
		}
		var elements []byte
		if nbytes > 0 {
			elements = unsafe.Slice((*byte)(unsafe.Pointer(data)), nbytes)
		}
		d, err := dtypeOf(dt)
		if err != nil {
			return err
		}
		rec, err := handover.Inline(d, uint8(flags), sh, elements)
		if err != nil {
			return err
		}
		_, err = handover.Put(q, &rec, nil, deadline(timeoutMS))
		return err
	})
}

//export zct_queue_create
func zct_queue_create(name *C.zct_cchar, capacity C.uint64_t, maxsize C.uint64_t, out *C.zct_handle) C.int {
	return run(func() error {
		if out == nil {
			return errNilArg
		}
		create := func() (*queue.Queue, error) { return queue.Create(goString(name), uint64(capacity), uint64(maxsize)) }
		if capacity == 0 {
			create = func() (*queue.Queue, error) { return queue.CreateUnbounded(goString(name), uint64(maxsize)) }
		}
		q, err := create()
		if err != nil {
			return err
		}
		q.SetInterruptible(true) // Python runs its signal handlers between calls
		*out = openQueue(q)
		return nil
	})
}

//export zct_queue_attach
func zct_queue_attach(name *C.zct_cchar, adopt C.int32_t, out *C.zct_handle) C.int {
	return run(func() error {
		if name == nil || out == nil {
			return errNilArg
		}
		attach := queue.Attach
		if adopt != 0 {
			attach = queue.Adopt
		}
		q, err := attach(goString(name))
		if err != nil {
			return err
		}
		q.SetInterruptible(true)
		*out = openQueue(q)
		return nil
	})
}

//export zct_queue_describe
func zct_queue_describe(h C.zct_handle, name *C.char, capacity C.uint64_t, size *C.uint64_t, maxsize *C.uint64_t) C.int {
	return run(func() error {
		if name == nil || size == nil || maxsize == nil {
			return errNilArg
		}
		q, err := queues.get(uint64(h))
		if err != nil {
			return err
		}
		full := q.Segment().Name()
		if uint64(capacity) <= uint64(len(full)) {
			return errRange
		}
		dst := unsafe.Slice((*byte)(unsafe.Pointer(name)), capacity)
		dst[copy(dst, full)] = 0
		*size = C.uint64_t(q.Capacity())
		*maxsize = C.uint64_t(q.MaxItems())
		return nil
	})
}

// setWait sets the wait policy that the set_wait exports describe on the
// queue or stream endpoint h of t: poll or sleep, and how long to look
// before sleeping (negative: the policy's default, 50 us for a sleeper, for
// ever for a poller).
func setWait[T interface{ SetWait(futex.Policy) error }](t *table[T], h C.zct_handle, poll C.int32_t, spinNS C.int64_t) C.int {
	return with(t, uint64(h), func(v T) error {
		p := futex.Policy{Poll: poll == 1, Spin: time.Duration(spinNS)}
		switch {
		case poll != 0 && poll != 1:
			return fmt.Errorf("a wait policy of %d (0 sleeps, 1 polls): %w", poll, unix.EINVAL)
		case poll == 0 && spinNS < 0:
			p = futex.NewSleeping()
		}
		return v.SetWait(p)
	})
}

// fastWaits says where a handle given the wait policy of poll and spinNS
// waits: fast.c waits as the default policy does and as the policy that
// polls for ever; any other is Go's.
func fastWaits(poll C.int32_t, spinNS C.int64_t) C.int32_t {
	switch {
	case poll != 0 && spinNS < 0:
		return C.ZCT_FAST_POLL
	case poll != 0 || spinNS >= 0:
		return C.ZCT_FAST_GO
	}
	return C.ZCT_FAST_SLEEP
}

//export zct_queue_set_wait
func zct_queue_set_wait(h C.zct_handle, poll C.int32_t, spinNS C.int64_t) C.int {
	status := setWait(queues, h, poll, spinNS)
	if status == C.ZCT_OK {
		C.zct_fast_set_wait(C.uint64_t(h), fastWaits(poll, spinNS))
	}
	return status
}

//export zct_queue_addref
func zct_queue_addref(h C.zct_handle) C.int {
	return with(queues, uint64(h), func(q *queue.Queue) error {
		if _, err := q.Segment().AddRef(); err != nil {
			return err
		}
		return nil
	})
}

//export zct_queue_close
func zct_queue_close(h C.zct_handle) C.int {
	return closing(queues, uint64(h), func(q *queue.Queue) error {
		C.zct_fast_unregister(C.uint64_t(h)) // no step of fast.c runs on q after this
		return q.Close()
	})
}

// zctipc_go_queue_put is zct_queue_put (fast.c) for what the data plane does not finish
// without Go.
//
//export zctipc_go_queue_put
func zctipc_go_queue_put(h C.zct_handle, typ C.int32_t, payload *C.zct_cvoid, length C.uint64_t, views *C.zct_cview, nviews C.int32_t, timeoutMS C.int64_t) C.int {
	return run(func() error {
		if nviews < 0 || nviews > message.MaxDescriptors {
			return badCount("nviews", nviews, 0, message.MaxDescriptors)
		}
		if length > 0 && payload == nil || nviews > 0 && views == nil {
			return errNilArg
		}
		rtype, err := recordType(typ)
		if err != nil {
			return err
		}
		q, err := queues.get(uint64(h))
		if err != nil {
			return err
		}
		rec := message.Record{Type: rtype}
		if length > 0 {
			rec.Payload = unsafe.Slice((*byte)(unsafe.Pointer(payload)), length)
		}
		if nviews == 0 { // no refs change hands
			_, err := handover.Put(q, &rec, nil, deadline(timeoutMS))
			return err
		}
		vs := unsafe.Slice((*C.zct_view)(unsafe.Pointer(views)), nviews)
		handles := make([]uint64, nviews)
		seen := make(map[C.zct_handle]bool, nviews)
		for i := range vs {
			if seen[vs[i].ref] {
				return fmt.Errorf("ref %d appears twice in one message: %w", vs[i].ref, unix.EINVAL)
			}
			seen[vs[i].ref] = true
			handles[i] = uint64(vs[i].ref)
		}
		// The refs are the put's from here; on failure they are the
		// caller's again, handles and all (Note [refs on their way out]).
		sending, err := claim(handles)
		if err != nil {
			return err
		}
		rec.Descriptors = make([]message.Descriptor, nviews)
		for i := range vs {
			if rec.Descriptors[i], err = describe(sending[i], &vs[i]); err != nil {
				restore(handles, sending)
				return err
			}
		}
		sent, err := handover.Put(q, &rec, sending, deadline(timeoutMS))
		if !sent {
			restore(handles, sending)
		}
		return err
	})
}

//export zct_queue_get
func zct_queue_get(h C.zct_handle, buf unsafe.Pointer, capacity C.uint64_t, timeoutMS C.int64_t, typ *C.int32_t, payloadOffset *C.uint64_t, payloadLen *C.uint64_t, views *C.zct_view, viewsCap C.int32_t, nviews *C.int32_t) C.int {
	return run(func() error {
		if typ == nil || payloadOffset == nil || payloadLen == nil || nviews == nil {
			return errNilArg
		}
		var m handover.Message
		err := take(h, buf, capacity, timeoutMS, views, viewsCap, &m)
		var re *queue.RangeError
		if errors.As(err, &re) {
			*payloadLen = C.uint64_t(re.Need)
			*nviews = C.int32_t(re.Views)
		}
		if err != nil {
			return err
		}
		*typ = C.int32_t(m.Type)
		*payloadOffset = C.uint64_t(m.PayloadAt)
		*payloadLen = C.uint64_t(len(m.Payload))
		*nviews = C.int32_t(m.NumViews())
		return nil
	})
}

// zctipc_go_queue_take is zct_queue_take (fast.c) for what the data plane does not finish
// without Go.
//
//export zctipc_go_queue_take
func zctipc_go_queue_take(h C.zct_handle, buf unsafe.Pointer, capacity C.uint64_t, timeoutMS C.int64_t, views *C.zct_view, viewsCap C.int32_t, nviews *C.int32_t) C.int64_t {
	var m handover.Message
	status := run(func() error {
		if nviews == nil {
			return errNilArg
		}
		err := take(h, buf, capacity, timeoutMS, views, viewsCap, &m)
		if err == nil {
			*nviews = C.int32_t(m.NumViews())
		}
		return err
	})
	if status != C.ZCT_OK {
		return C.int64_t(status)
	}
	return C.int64_t(uint64(len(m.Payload)) | uint64(m.PayloadAt)<<C.ZCT_TAKE_OFFSET_SHIFT | uint64(m.Type)<<C.ZCT_TAKE_TYPE_SHIFT)
}

// take takes the next record of queue h into buf, whole, decodes it into
// m, and fills a view for each of its arrays (zct_queue_get and
// zct_queue_take), each descriptor's holding a new ref. A record that does
// not fit is left in the queue: a *queue.RangeError, wrapped in errRange.
func take(h C.zct_handle, buf unsafe.Pointer, capacity C.uint64_t, timeoutMS C.int64_t, views *C.zct_view, viewsCap C.int32_t, m *handover.Message) error {
	if viewsCap < 0 {
		return badCount("views_cap", viewsCap, 0, math.MaxInt32)
	}
	if buf == nil || viewsCap > 0 && views == nil {
		return errNilArg
	}
	q, err := queues.get(uint64(h))
	if err != nil {
		return err
	}
	raw := unsafe.Slice((*byte)(buf), capacity)
	n, err := q.Get(raw, int(viewsCap), deadline(timeoutMS))
	var re *queue.RangeError
	if errors.As(err, &re) {
		return fmt.Errorf("%w: %w", errRange, err)
	}
	if err != nil {
		return err
	}
	return adoptTaken(raw[:n], views, viewsCap, m)
}

// adoptTaken decodes the record raw, which a take took whole, into m, takes
// the counts of its descriptors and fills a view for each of its arrays.
func adoptTaken(raw []byte, views *C.zct_view, viewsCap C.int32_t, m *handover.Message) error {
	if err := m.Decode(raw); err != nil {
		return err
	}
	if err := m.Adopt(); err != nil {
		return err
	}
	if err := fillViews(views, viewsCap, m.NumViews(), func(out []C.zct_view) { fillMessage(out, m, 0) }); err != nil {
		return errors.Join(err, m.Release())
	}
	return nil
}

// zctipc_go_queue_adopt is the end of zct_queue_take (handoff.c) for a
// record that the data plane took from the queue into rec (size bytes)
// but does not adopt itself: a record of other kinds of descriptors, or of
// arenas this process has not mapped yet. It returns what
// zctipc_go_queue_take does.
//
//export zctipc_go_queue_adopt
func zctipc_go_queue_adopt(rec unsafe.Pointer, size C.uint32_t, views *C.zct_view, viewsCap C.int32_t, nviews *C.int32_t) C.int64_t {
	var m handover.Message
	status := run(func() error {
		err := adoptTaken(unsafe.Slice((*byte)(rec), size), views, viewsCap, &m)
		if err == nil {
			*nviews = C.int32_t(m.NumViews())
		}
		return err
	})
	if status != C.ZCT_OK {
		return C.int64_t(status)
	}
	return C.int64_t(uint64(len(m.Payload)) | uint64(m.PayloadAt)<<C.ZCT_TAKE_OFFSET_SHIFT | uint64(m.Type)<<C.ZCT_TAKE_TYPE_SHIFT)
}

//export zct_queue_put_many
func zct_queue_put_many(h C.zct_handle, typ C.int32_t, data *C.zct_cvoid, ends *C.zct_cuint64, count C.int32_t, timeoutMS C.int64_t, written *C.int32_t) C.int {
	return run(func() error {
		if count < 0 {
			return badCount("count", count, 0, math.MaxInt32)
		}
		if written == nil || count > 0 && ends == nil {
			return errNilArg
		}
		rtype, err := recordType(typ)
		if err != nil {
			return err
		}
		q, err := queues.get(uint64(h))
		if err != nil {
			return err
		}
		bounds := unsafe.Slice((*C.uint64_t)(unsafe.Pointer(ends)), count)
		total := uint64(0)
		if count > 0 {
			total = uint64(bounds[count-1])
		}
		if total > 0 && data == nil {
			return errNilArg
		}
		payloads := unsafe.Slice((*byte)(unsafe.Pointer(data)), total)
		recs := make([]message.Record, count)
		ptrs := make([]*message.Record, count)
		at := uint64(0)
		for i, end := range bounds {
			if uint64(end) < at || uint64(end) > total {
				return fmt.Errorf("payload ends out of order at %d: %w", i, unix.EINVAL)
			}
			recs[i] = message.Record{Type: rtype, Payload: payloads[at:end]}
			if err := handover.Check(&recs[i]); err != nil {
				return err
			}
			ptrs[i] = &recs[i]
			at = uint64(end)
		}
		n, err := q.PutMany(ptrs, deadline(timeoutMS))
		*written = C.int32_t(n)
		if err != nil {
			return err
		}
		return nil
	})
}

//export zct_queue_get_many
func zct_queue_get_many(h C.zct_handle, buf unsafe.Pointer, capacity C.uint64_t, maxRecords C.int32_t, timeoutMS C.int64_t, records *C.int32_t, recs *C.zct_record, filled *C.uint64_t, views *C.zct_view, viewsCap C.int32_t, nviews *C.int32_t) C.int {
	return run(func() error {
		if maxRecords < 1 {
			return badCount("max_records", maxRecords, 1, math.MaxInt32)
		}
		if viewsCap < 0 {
			return badCount("views_cap", viewsCap, 0, math.MaxInt32)
		}
		if buf == nil || records == nil || recs == nil || filled == nil || nviews == nil || viewsCap > 0 && views == nil {
			return errNilArg
		}
		*records = 0 // until records are taken: zctipc.h
		q, err := queues.get(uint64(h))
		if err != nil {
			return err
		}
		raw := unsafe.Slice((*byte)(buf), capacity)
		n, size, err := q.GetMany(raw, int(maxRecords), int(viewsCap), deadline(timeoutMS))
		var re *queue.RangeError
		if errors.As(err, &re) {
			*filled = C.uint64_t(re.Need)
			*nviews = C.int32_t(re.Views)
			return fmt.Errorf("%w: %w", errRange, err)
		}
		if err != nil && n == 0 {
			return err
		}
		// A record that fails to decode, or whose counts cannot be taken,
		// is given with type 0 and no views; the others are given whole,
		// and the error is reported after them (Note [one hand-over]).
		msgs, derr := handover.DecodeRun(raw[:size], n)
		aerr := handover.AdoptAll(msgs)
		out := unsafe.Slice(recs, n)
		starts := make([]int, n)
		total := 0
		for i, at := 0, 0; i < n; i++ {
			m := &msgs[i]
			out[i] = C.zct_record{}
			if m.Bytes == 0 {
				continue // the rest could not be read: empty records
			}
			starts[i] = at
			nv := m.NumViews()
			out[i] = C.zct_record{_type: C.int32_t(m.Type), nviews: C.int32_t(nv),
				payload_offset: C.uint64_t(at + m.PayloadAt), payload_len: C.uint64_t(len(m.Payload))}
			total += nv
			at += m.Bytes
		}
		ferr := fillViews(views, viewsCap, total, func(out []C.zct_view) {
			for i := range msgs {
				out = out[fillMessage(out, &msgs[i], starts[i]):]
			}
		})
		if ferr != nil {
			for i := range msgs {
				ferr = errors.Join(ferr, msgs[i].Release())
				out[i].nviews = 0
			}
			total = 0
		}
		*records = C.int32_t(n)
		*filled = C.uint64_t(size)
		*nviews = C.int32_t(total)
		return errors.Join(derr, aerr, ferr, err)
	})
}

//export zct_queue_len
func zct_queue_len(h C.zct_handle, items *C.int64_t, unfinished *C.int64_t) C.int {
	return with(queues, uint64(h), func(q *queue.Queue) error {
		if items == nil || unfinished == nil {
			return errNilArg
		}
		n, err := q.Len()
		if err != nil {
			return err
		}
		done, err := q.Unfinished()
		if err != nil {
			return err
		}
		*items, *unfinished = C.int64_t(max(0, n)), C.int64_t(max(0, done))
		return nil
	})
}

//export zct_queue_room
func zct_queue_room(h C.zct_handle, bytes *C.uint64_t) C.int {
	return with(queues, uint64(h), func(q *queue.Queue) error {
		if bytes == nil {
			return errNilArg
		}
		n, err := q.Room()
		*bytes = C.uint64_t(n)
		return err
	})
}

//export zct_queue_task_done
func zct_queue_task_done(h C.zct_handle) C.int {
	return with(queues, uint64(h), func(q *queue.Queue) error {
		return q.TaskDone()
	})
}

//export zct_queue_wait
func zct_queue_wait(h C.zct_handle, timeoutMS C.int64_t) C.int {
	return with(queues, uint64(h), func(q *queue.Queue) error {
		return q.WaitNonEmpty(deadline(timeoutMS))
	})
}

//export zct_queue_join
func zct_queue_join(h C.zct_handle, timeoutMS C.int64_t) C.int {
	return with(queues, uint64(h), func(q *queue.Queue) error {
		return q.Join(deadline(timeoutMS))
	})
}

// Threat model of the arm/disarm exports (Note [sleeping outside Go] in
// package futex): any code in the process may call them with any handle and
// word number. A closed or unknown handle is refused; which is checked; an
// unbalanced disarm is refused, so that no caller can take a sleeper's count
// off the shared word. Other processes may scribble on the word itself:
// that only wakes sleepers, which look again.

// zctipc_go_queue_arm is zct_queue_arm (fast.c) for what the data plane does not finish
// without Go.
//
//export zctipc_go_queue_arm
func zctipc_go_queue_arm(h C.zct_handle, which C.int32_t, word **C.uint32_t, seen *C.uint32_t) C.int {
	return with(queues, uint64(h), func(q *queue.Queue) error {
		if word == nil || seen == nil {
			return fmt.Errorf("zct_queue_arm: a NULL out-parameter: %w", unix.EINVAL)
		}
		w, v, err := q.ArmWait(int(which))
		if err != nil {
			return err
		}
		*word, *seen = (*C.uint32_t)(unsafe.Pointer(w)), C.uint32_t(v)
		return nil
	})
}

// zctipc_go_queue_disarm is zct_queue_disarm (fast.c) for what the data plane does not finish
// without Go.
//
//export zctipc_go_queue_disarm
func zctipc_go_queue_disarm(h C.zct_handle, which C.int32_t, passOn C.int32_t) C.int {
	return with(queues, uint64(h), func(q *queue.Queue) error {
		return q.DisarmWait(int(which), passOn != 0)
	})
}
