package zctipc

import (
	"context"
	"fmt"
	"time"

	"github.com/zctipc/zctipc/go/stream"
	"golang.org/x/sys/unix"
)

// Stream policies and errors.
const (
	Block     = stream.Block
	Overwrite = stream.Overwrite
)

// StreamConfig describes a stream: its frames' type and shape, the frames
// in its ring, its reader slots, its policy, and a reader timeout.
type StreamConfig = stream.Config

// ErrEnded means the stream has ended.
var ErrEnded = stream.ErrEnded

// Stream is a zctipc stream (Python: zctipc.Stream): one writer, many
// readers, fixed-size frames in a shared ring.
type Stream struct{ s *stream.Stream }

// NewStream creates a stream. An empty name makes a random one.
func NewStream(name string, cfg StreamConfig) (*Stream, error) {
	s, err := stream.Create(name, cfg)
	if err != nil {
		return nil, err
	}
	return &Stream{s}, nil
}

// AttachStream attaches the stream name.
func AttachStream(name string) (*Stream, error) {
	s, err := stream.Attach(name)
	if err != nil {
		return nil, err
	}
	return &Stream{s}, nil
}

// Name returns the stream's full segment name.
func (s *Stream) Name() string { return s.s.Segment().Name() }

// Config returns the stream's configuration.
func (s *Stream) Config() StreamConfig { return s.s.Config() }

// Published returns the number of frames published.
func (s *Stream) Published() (uint64, error) {
	st, err := s.s.Stats()
	return st.Published, err
}

// End ends the stream: readers read what was published, then get ErrEnded.
func (s *Stream) End() error { return s.s.End() }

// Close closes this process's handle on the stream.
func (s *Stream) Close() error { return s.s.Close() }

// StreamWriter is the stream's writer in this process.
type StreamWriter struct {
	s *Stream
	w *stream.Writer
}

// Writer makes this process the stream's writer.
func (s *Stream) Writer() (*StreamWriter, error) {
	w, err := s.s.Writer()
	if err != nil {
		return nil, err
	}
	return &StreamWriter{s, w}, nil
}

// Look returns the memory of the next frame to fill, waiting for room (under
// the block policy) until ctx is done.
func (w *StreamWriter) Look(ctx context.Context) ([]byte, error) {
	var slot int
	err := retry(ctx, stream.ErrFull, func(deadline time.Time) error {
		var err error
		slot, err = w.w.Look(deadline)
		return err
	})
	if err != nil {
		return nil, err
	}
	return w.s.s.Frame(slot), nil
}

// Increment publishes the frame Look returned.
func (w *StreamWriter) Increment() error { return w.w.Increment() }

// Write copies frame (exactly one frame's bytes) into the next frame and
// publishes it.
func (w *StreamWriter) Write(ctx context.Context, frame []byte) error {
	if uint64(len(frame)) != w.s.s.FrameBytes() {
		return fmt.Errorf("a frame of %d bytes for a stream of %d-byte frames: %w", len(frame), w.s.s.FrameBytes(), unix.EINVAL)
	}
	dst, err := w.Look(ctx)
	if err != nil {
		return err
	}
	copy(dst, frame)
	return w.w.Increment()
}

// Close gives up the writer role.
func (w *StreamWriter) Close() error { return w.w.Close() }

// StreamReader is one reader of a stream in this process.
type StreamReader struct {
	s *Stream
	r *stream.Reader
}

// Reader joins the stream as reader index, or in the first free slot when
// index is negative, at the next frame published.
func (s *Stream) Reader(index int) (*StreamReader, error) {
	r, err := s.s.Reader(index)
	if err != nil {
		return nil, err
	}
	return &StreamReader{s, r}, nil
}

// Look returns the memory of the next frame (read it, do not write it),
// waiting until ctx is done; ErrEnded once the stream ended and every frame
// was read.
func (r *StreamReader) Look(ctx context.Context) ([]byte, error) {
	var slot int
	err := retry(ctx, stream.ErrEmpty, func(deadline time.Time) error {
		var err error
		slot, err = r.r.Look(deadline)
		return err
	})
	if err != nil {
		return nil, err
	}
	return r.s.s.Frame(slot), nil
}

// Increment releases the frame Look returned, and reports whether it was
// whole (not overwritten while looked at).
func (r *StreamReader) Increment() (bool, error) { return r.r.Increment() }

// Read copies the next whole frame into dst (one frame's bytes), skipping
// frames overwritten while they were copied.
func (r *StreamReader) Read(ctx context.Context, dst []byte) error {
	for {
		frame, err := r.Look(ctx)
		if err != nil {
			return err
		}
		copy(dst, frame)
		whole, err := r.r.Increment()
		if err != nil || whole {
			return err
		}
	}
}

// Dropped returns the frames this reader lost.
func (r *StreamReader) Dropped() (uint64, error) {
	st, err := r.r.Stats()
	return st.Dropped, err
}

// Close leaves the stream.
func (r *StreamReader) Close() error { return r.r.Close() }
