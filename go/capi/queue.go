package main

/*
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
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"golang.org/x/sys/unix"
)

// The record types of zctipc.h are package message's: one number each,
// checked when this package compiles (an index other than 0 fails it).
var _ = [1][1][1][1]struct{}{}[message.TypePickle-C.ZCT_RECORD_PICKLE][message.TypeTensor-C.ZCT_RECORD_TENSOR][message.TypeBytes-C.ZCT_RECORD_BYTES][message.TypeInline-C.ZCT_RECORD_INLINE]

var queues = newTable[*queue.Queue]()

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

// checkPut checks a record that a C caller is putting: one it made wrong
// (an inline payload that is no array, a view in an inline record) is a bad
// argument, ZCT_E_INVALID, not corrupt data (message.ErrMalformed, which
// names what a get read).
func checkPut(rec *message.Record) error {
	if err := rec.Check(); err != nil {
		return fmt.Errorf("%s: %w", err, unix.EINVAL)
	}
	return nil
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
//export zct_queue_put_array
func zct_queue_put_array(h C.zct_handle, typ C.int32_t, addr *C.zct_cvoid, extent C.uint64_t, dt C.int32_t, ndim C.int32_t, shape *C.zct_cint64, strides *C.zct_cint64, flags C.int32_t, timeoutMS C.int64_t) C.int {
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
		rec := message.Record{Type: rtype, Descriptors: []message.Descriptor{d}}
		if err == nil {
			err = checkPut(&rec)
		}
		if err != nil {
			return errors.Join(err, r.Release())
		}
		sent, err := buffer.Send([]*buffer.Ref{r}, func() error { return q.Put(&rec, deadline(timeoutMS)) })
		if !sent {
			return errors.Join(err, r.Release())
		}
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
		*out = C.zct_handle(queues.put(q))
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
		*out = C.zct_handle(queues.put(q))
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

//export zct_queue_set_wait
func zct_queue_set_wait(h C.zct_handle, poll C.int32_t, spinNS C.int64_t) C.int {
	return setWait(queues, h, poll, spinNS)
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
		return q.Close()
	})
}

//export zct_queue_put
func zct_queue_put(h C.zct_handle, typ C.int32_t, payload *C.zct_cvoid, length C.uint64_t, views *C.zct_cview, nviews C.int32_t, timeoutMS C.int64_t) C.int {
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
			if err := checkPut(&rec); err != nil {
				return err
			}
			return q.Put(&rec, deadline(timeoutMS))
		}
		rec.Descriptors = make([]message.Descriptor, nviews)
		vs := unsafe.Slice((*C.zct_view)(unsafe.Pointer(views)), nviews)
		sending := make([]*buffer.Ref, nviews)
		seen := make(map[C.zct_handle]bool, nviews)
		for i := range vs {
			if seen[vs[i].ref] {
				return fmt.Errorf("ref %d appears twice in one message: %w", vs[i].ref, unix.EINVAL)
			}
			seen[vs[i].ref] = true
			if rec.Descriptors[i], sending[i], err = describe(&vs[i]); err != nil {
				return err
			}
		}
		if err := checkPut(&rec); err != nil {
			return err
		}
		// On failure the refs stay the caller's, handles and all.
		sent, err := buffer.Send(sending, func() error { return q.Put(&rec, deadline(timeoutMS)) })
		if !sent {
			return err
		}
		errs := []error{err}
		for i := range vs {
			if _, err := refs.take(uint64(vs[i].ref)); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}

//export zct_queue_get
func zct_queue_get(h C.zct_handle, buf unsafe.Pointer, capacity C.uint64_t, timeoutMS C.int64_t, typ *C.int32_t, payloadOffset *C.uint64_t, payloadLen *C.uint64_t, views *C.zct_view, viewsCap C.int32_t, nviews *C.int32_t) C.int {
	return run(func() error {
		if typ == nil || payloadOffset == nil || payloadLen == nil || nviews == nil {
			return errNilArg
		}
		rec, err := take(h, buf, capacity, timeoutMS, views, viewsCap)
		var re *queue.RangeError
		if errors.As(err, &re) {
			*payloadLen = C.uint64_t(re.Need)
			*nviews = C.int32_t(re.Descriptors)
		}
		if err != nil {
			return err
		}
		*typ = C.int32_t(rec.typ)
		*payloadOffset = C.uint64_t(rec.offset)
		*payloadLen = C.uint64_t(rec.length)
		*nviews = C.int32_t(rec.views)
		return nil
	})
}

//export zct_queue_take
func zct_queue_take(h C.zct_handle, buf unsafe.Pointer, capacity C.uint64_t, timeoutMS C.int64_t, views *C.zct_view, viewsCap C.int32_t) C.int64_t {
	var rec taken
	status := run(func() error {
		var err error
		rec, err = take(h, buf, capacity, timeoutMS, views, viewsCap)
		return err
	})
	if status != C.ZCT_OK {
		return C.int64_t(status)
	}
	return C.int64_t(rec.length | rec.offset<<30 | uint64(rec.typ)<<60)
}

// taken says what take copied into the caller's buffer.
type taken struct {
	typ            uint8
	offset, length uint64 // of the payload in the buffer
	views          int
}

// take takes the next record of queue h into buf, whole, and fills a view
// for each of its descriptors (zct_queue_get and zct_queue_take). A record
// that does not fit is left in the queue: a *queue.RangeError, wrapped in
// errRange.
func take(h C.zct_handle, buf unsafe.Pointer, capacity C.uint64_t, timeoutMS C.int64_t, views *C.zct_view, viewsCap C.int32_t) (taken, error) {
	if viewsCap < 0 {
		return taken{}, badCount("views_cap", viewsCap, 0, math.MaxInt32)
	}
	if buf == nil || viewsCap > 0 && views == nil {
		return taken{}, errNilArg
	}
	q, err := queues.get(uint64(h))
	if err != nil {
		return taken{}, err
	}
	raw := unsafe.Slice((*byte)(buf), capacity)
	n, err := q.Get(raw, int(viewsCap), deadline(timeoutMS))
	var re *queue.RangeError
	if errors.As(err, &re) {
		return taken{}, fmt.Errorf("%w: %w", errRange, err)
	}
	if err != nil {
		return taken{}, err
	}
	rec, err := message.DecodeRecord(raw[:n])
	if err != nil {
		return taken{}, err
	}
	if len(rec.Descriptors) > 0 {
		if err := adopt(rec.Descriptors, unsafe.Slice(views, len(rec.Descriptors))); err != nil {
			return taken{}, err
		}
	}
	t := taken{typ: rec.Type, offset: uint64(n - len(rec.Payload)), length: uint64(len(rec.Payload)), views: len(rec.Descriptors)}
	if len(rec.Payload) > 0 {
		t.offset = uint64(uintptr(unsafe.Pointer(&rec.Payload[0])) - uintptr(buf))
	}
	return t, nil
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
			if err := checkPut(&recs[i]); err != nil {
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
		q, err := queues.get(uint64(h))
		if err != nil {
			return err
		}
		raw := unsafe.Slice((*byte)(buf), capacity)
		n, size, err := q.GetMany(raw, int(maxRecords), int(viewsCap), deadline(timeoutMS))
		var re *queue.RangeError
		if errors.As(err, &re) {
			*filled = C.uint64_t(re.Need)
			*nviews = C.int32_t(re.Descriptors)
			return fmt.Errorf("%w: %w", errRange, err)
		}
		if err != nil && n == 0 {
			return err
		}
		// Adopt every record's descriptors; a record that fails to decode has
		// no views to give, and the error is reported after the others.
		out := unsafe.Slice(recs, n)
		var descs []message.Descriptor
		var errs []error
		for i, at := 0, 0; i < n; i++ {
			rec, rsize, derr := message.NextRecord(raw[at:size])
			if rsize == 0 {
				errs = append(errs, derr) // the rest cannot be read: n stays, with empty records
				clear(out[i:])
				break
			}
			errs = append(errs, derr)
			out[i] = C.zct_record{_type: C.int32_t(rec.Type), nviews: C.int32_t(len(rec.Descriptors)),
				payload_offset: C.uint64_t(at + rsize), payload_len: C.uint64_t(len(rec.Payload))}
			if len(rec.Payload) > 0 {
				out[i].payload_offset = C.uint64_t(uintptr(unsafe.Pointer(&rec.Payload[0])) - uintptr(buf))
			}
			descs = append(descs, rec.Descriptors...)
			at += rsize
		}
		if aerr := adopt(descs, unsafe.Slice(views, len(descs))); aerr != nil {
			errs = append(errs, aerr)
			descs = nil
			for i := range out {
				out[i].nviews = 0
			}
		}
		*records = C.int32_t(n)
		*filled = C.uint64_t(size)
		*nviews = C.int32_t(len(descs))
		return errors.Join(append(errs, err)...)
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

//export zct_queue_arm
func zct_queue_arm(h C.zct_handle, which C.int32_t, word **C.uint32_t, seen *C.uint32_t) C.int {
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

//export zct_queue_disarm
func zct_queue_disarm(h C.zct_handle, which C.int32_t, passOn C.int32_t) C.int {
	return with(queues, uint64(h), func(q *queue.Queue) error {
		return q.DisarmWait(int(which), passOn != 0)
	})
}
