package main

/*
#include "internal.h"
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/stream"
	"golang.org/x/sys/unix"
)

var (
	streams = newTable[*stream.Stream]()
	writers = newTable[*stream.Writer]()
	readers = newTable[*stream.Reader]()
)

// Streams wait in slices so that Python runs its signal handlers between
// calls.
func openStream(s *stream.Stream, out *C.zct_handle, info *C.zct_stream_info) {
	s.SetInterruptible(true)
	*out = C.zct_handle(streams.put(s))
	cfg := s.Config()
	*info = C.zct_stream_info{}
	data := s.Segment().Data()
	info.data = unsafe.Pointer(unsafe.SliceData(data))
	info.ring_offset = C.uint64_t(s.FrameOffset(0))
	info.stride = C.uint64_t(s.FrameOffset(1) - s.FrameOffset(0))
	info.frame_bytes = C.uint64_t(s.FrameBytes())
	for i, n := range cfg.Shape {
		info.shape[i] = C.int64_t(n)
	}
	info.reader_timeout_ms = C.int64_t(cfg.ReaderTimeout.Milliseconds())
	info.dtype = C.int32_t(cfg.DType)
	info.ndim = C.int32_t(len(cfg.Shape))
	info.frames = C.int32_t(cfg.Frames)
	info.readers = C.int32_t(cfg.Readers)
	info.policy = C.int32_t(cfg.Policy)
	copyName(&info.name, s.Segment().Name())
}

//export zct_stream_create
func zct_stream_create(name *C.zct_cchar, dt C.int32_t, ndim C.int32_t, shape *C.zct_cint64, frames C.int32_t,
	nreaders C.int32_t, policy C.int32_t, readerTimeoutMS C.int64_t, out *C.zct_handle, info *C.zct_stream_info) C.int {
	return run(func() error {
		if out == nil || info == nil || (ndim > 0 && shape == nil) {
			return errNilArg
		}
		dims, err := dimsOf(ndim, shape)
		if err != nil {
			return err
		}
		d, err := dtypeOf(dt)
		if err != nil {
			return err
		}
		s, err := stream.Create(goString(name), stream.Config{
			DType: d, Shape: dims, Frames: int(frames), Readers: int(nreaders),
			Policy: stream.Policy(policy), ReaderTimeout: time.Duration(readerTimeoutMS) * time.Millisecond,
		})
		if err != nil {
			return err
		}
		openStream(s, out, info)
		return nil
	})
}

//export zct_stream_attach
func zct_stream_attach(name *C.zct_cchar, out *C.zct_handle, info *C.zct_stream_info) C.int {
	return run(func() error {
		if name == nil || out == nil || info == nil {
			return errNilArg
		}
		s, err := stream.Attach(goString(name))
		if err != nil {
			return err
		}
		openStream(s, out, info)
		return nil
	})
}

//export zct_stream_close
func zct_stream_close(h C.zct_handle) C.int {
	return closing(streams, uint64(h), func(s *stream.Stream) error {
		return s.Close()
	})
}

//export zct_stream_end
func zct_stream_end(h C.zct_handle) C.int {
	return with(streams, uint64(h), func(s *stream.Stream) error {
		return s.End()
	})
}

//export zct_stream_stats
func zct_stream_stats(h C.zct_handle, published, dropped *C.uint64_t, nreaders, ended *C.int32_t) C.int {
	return run(func() error {
		if published == nil || dropped == nil || nreaders == nil || ended == nil {
			return errNilArg
		}
		s, err := streams.get(uint64(h))
		if err != nil {
			return err
		}
		st, err := s.Stats()
		if err != nil {
			return err
		}
		*published, *dropped = C.uint64_t(st.Published), C.uint64_t(st.Dropped)
		*nreaders, *ended = C.int32_t(st.Readers), boolInt(st.Ended)
		return nil
	})
}

//export zct_stream_writer
func zct_stream_writer(h C.zct_handle, out *C.zct_handle) C.int {
	return run(func() error {
		if out == nil {
			return errNilArg
		}
		s, err := streams.get(uint64(h))
		if err != nil {
			return err
		}
		w, err := s.Writer()
		if err != nil {
			return err
		}
		wh := writers.put(w)
		// fast.c runs the writer's steps without Go (Note [a data plane the
		// runtime never enters] in package plane).
		C.zct_fast_register_writer(C.uint64_t(wh), unsafe.Pointer(w.Plane()))
		*out = C.zct_handle(wh)
		return nil
	})
}

// zctipc_go_stream_write_look and _increment are zct_stream_write_look and
// _increment (fast.c) for what the data plane does not finish: a wait for
// room, an end, an error to say.
//
//export zctipc_go_stream_write_look
func zctipc_go_stream_write_look(h C.zct_handle, timeoutMS C.int64_t, slot *C.int32_t) C.int {
	return with(writers, uint64(h), func(w *stream.Writer) error {
		i, err := w.Look(deadline(timeoutMS))
		*slot = C.int32_t(i)
		return err
	})
}

//export zctipc_go_stream_write_increment
func zctipc_go_stream_write_increment(h C.zct_handle) C.int {
	return with(writers, uint64(h), func(w *stream.Writer) error {
		return w.Increment()
	})
}

//export zct_stream_writer_close
func zct_stream_writer_close(h C.zct_handle) C.int {
	return closing(writers, uint64(h), func(w *stream.Writer) error {
		C.zct_fast_unregister(C.uint64_t(h)) // no step of fast.c runs on w after this
		return w.Close()
	})
}

//export zct_stream_reader
func zct_stream_reader(h C.zct_handle, index C.int32_t, out *C.zct_handle, slot *C.int32_t) C.int {
	return run(func() error {
		if out == nil || slot == nil {
			return errNilArg
		}
		s, err := streams.get(uint64(h))
		if err != nil {
			return err
		}
		r, err := s.Reader(int(index))
		if err != nil {
			return err
		}
		rh := readers.put(r)
		// fast.c runs the reader's steps without Go (Note [a data plane the
		// runtime never enters] in package plane).
		C.zct_fast_register_reader(C.uint64_t(rh), unsafe.Pointer(r.Plane()))
		*out, *slot = C.zct_handle(rh), C.int32_t(r.Index())
		return nil
	})
}

// zctipc_go_stream_read_look, _increment and _next are zct_stream_read_look,
// _increment and _next (fast.c) for what the data plane does not finish: a
// wait of another policy, an end, a rejoin, an error to say.
//
//export zctipc_go_stream_read_look
func zctipc_go_stream_read_look(h C.zct_handle, timeoutMS C.int64_t, slot *C.int32_t) C.int {
	return with(readers, uint64(h), func(r *stream.Reader) error {
		i, err := r.Look(deadline(timeoutMS))
		*slot = C.int32_t(i)
		return err
	})
}

//export zctipc_go_stream_read_increment
func zctipc_go_stream_read_increment(h C.zct_handle, whole *C.int32_t) C.int {
	return with(readers, uint64(h), func(r *stream.Reader) error {
		ok, err := r.Increment()
		*whole = boolInt(ok)
		return err
	})
}

//export zctipc_go_stream_read_next
func zctipc_go_stream_read_next(h C.zct_handle, timeoutMS C.int64_t, slot *C.int32_t, whole *C.int32_t) C.int {
	return with(readers, uint64(h), func(r *stream.Reader) error {
		i, ok, err := r.Next(deadline(timeoutMS))
		*slot, *whole = C.int32_t(i), boolInt(ok)
		return err
	})
}

//export zct_stream_reader_stats
func zct_stream_reader_stats(h C.zct_handle, position, received, dropped *C.uint64_t) C.int {
	return run(func() error {
		if position == nil || received == nil || dropped == nil {
			return errNilArg
		}
		r, err := readers.get(uint64(h))
		if err != nil {
			return err
		}
		st, err := r.Stats()
		if err != nil {
			return err
		}
		*position, *received, *dropped = C.uint64_t(st.Position), C.uint64_t(st.Received), C.uint64_t(st.Dropped)
		return nil
	})
}

//export zct_stream_reader_set_wait
func zct_stream_reader_set_wait(h C.zct_handle, poll C.int32_t, spinNS C.int64_t) C.int {
	status := setWait(readers, h, poll, spinNS)
	if status == C.ZCT_OK {
		C.zct_fast_set_wait(C.uint64_t(h), fastWaits(poll, spinNS))
	}
	return status
}

//export zct_stream_writer_set_wait
func zct_stream_writer_set_wait(h C.zct_handle, poll C.int32_t, spinNS C.int64_t) C.int {
	return setWait(writers, h, poll, spinNS)
}

//export zct_stream_reader_close
func zct_stream_reader_close(h C.zct_handle) C.int {
	return closing(readers, uint64(h), func(r *stream.Reader) error {
		C.zct_fast_unregister(C.uint64_t(h)) // no step of fast.c runs on r after this
		return r.Close()
	})
}

// zctipc_go_stream_reader_arm and _disarm are zct_stream_reader_arm and
// _disarm (fast.c) for a handle that fast.c does not hold, and a shrunk
// file; they have the threat model of zct_queue_arm (queue.go).
//
//export zctipc_go_stream_reader_arm
func zctipc_go_stream_reader_arm(h C.zct_handle, word **C.uint32_t, seen *C.uint32_t) C.int {
	return with(readers, uint64(h), func(r *stream.Reader) error {
		if word == nil || seen == nil {
			return fmt.Errorf("zct_stream_reader_arm: a NULL out-parameter: %w", unix.EINVAL)
		}
		w, v, err := r.ArmWait()
		if err != nil {
			return err
		}
		*word, *seen = (*C.uint32_t)(unsafe.Pointer(w)), C.uint32_t(v)
		return nil
	})
}

//export zctipc_go_stream_reader_disarm
func zctipc_go_stream_reader_disarm(h C.zct_handle) C.int {
	return with(readers, uint64(h), func(r *stream.Reader) error { return r.DisarmWait() })
}

// zct_stream_writer_arm and zct_stream_writer_disarm have the threat model
// of zct_queue_arm (queue.go) and of stream.Writer.ArmWait.

//export zct_stream_writer_arm
func zct_stream_writer_arm(h C.zct_handle, word **C.uint32_t, seen *C.uint32_t) C.int {
	return with(writers, uint64(h), func(w *stream.Writer) error {
		if word == nil || seen == nil {
			return fmt.Errorf("zct_stream_writer_arm: a NULL out-parameter: %w", unix.EINVAL)
		}
		p, v, err := w.ArmWait()
		if err != nil {
			return err
		}
		*word, *seen = (*C.uint32_t)(unsafe.Pointer(p)), C.uint32_t(v)
		return nil
	})
}

//export zct_stream_writer_disarm
func zct_stream_writer_disarm(h C.zct_handle) C.int {
	return with(writers, uint64(h), func(w *stream.Writer) error { return w.DisarmWait() })
}
