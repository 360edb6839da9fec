package zctipc

import (
	"context"
	"fmt"
	"time"

	"github.com/zctipc/zctipc/go/internal/stream"
	"golang.org/x/sys/unix"
)

// Policy says what a stream's writer does when its ring is full.
type Policy = stream.Policy

// Stream policies.
const (
	Block     = stream.Block     // wait for the slowest live reader
	Overwrite = stream.Overwrite // never wait; slow readers skip frames and count them
)

// StreamConfig describes a stream.
type StreamConfig struct {
	DType DType
	Shape []int64 // of one frame, C-contiguous
	// Frames is the number of frames in the ring, at least 2.
	Frames int
	// Readers is the number of reader slots, 1 to 64.
	Readers int
	Policy  Policy
	// ReaderTimeout, when positive, lets the writer evict a reader it has
	// not seen for that long (millisecond resolution); a reader whose
	// process died is evicted in any case.
	ReaderTimeout time.Duration
}

func (c StreamConfig) core() stream.Config {
	return stream.Config{DType: c.DType, Shape: c.Shape, Frames: c.Frames, Readers: c.Readers, Policy: c.Policy,
		ReaderTimeout: c.ReaderTimeout}
}

// Stream is a zctipc stream (Python: zctipc.Stream): one writer, many
// readers, fixed-size frames in a shared ring. It is safe for concurrent
// use; its writer and readers outlive its Close.
type Stream struct{ s *stream.Stream }

// NewStream creates a stream. An empty name makes a random one.
func NewStream(name string, cfg StreamConfig) (*Stream, error) {
	startCleanup()
	s, err := stream.Create(name, cfg.core())
	if err != nil {
		return nil, err
	}
	return &Stream{s}, nil
}

// AttachStream attaches the stream name.
func AttachStream(name string) (*Stream, error) {
	startCleanup()
	s, err := stream.Attach(name)
	if err != nil {
		return nil, err
	}
	return &Stream{s}, nil
}

func (s *Stream) check() error {
	if s == nil || s.s == nil {
		return nilErr("Stream")
	}
	return nil
}

// Name returns the stream's full segment name ("" for a nil Stream).
func (s *Stream) Name() string {
	if s.check() != nil {
		return ""
	}
	return s.s.Segment().Name()
}

// Config returns the stream's configuration.
func (s *Stream) Config() StreamConfig {
	if s.check() != nil {
		return StreamConfig{}
	}
	c := s.s.Config()
	return StreamConfig{DType: c.DType, Shape: c.Shape, Frames: c.Frames, Readers: c.Readers, Policy: c.Policy,
		ReaderTimeout: c.ReaderTimeout}
}

// Published returns the number of frames published.
func (s *Stream) Published() (uint64, error) {
	st, err := s.stats()
	return st.Published, err
}

// Readers returns the number of readers that hold a slot now.
func (s *Stream) Readers() (int, error) {
	st, err := s.stats()
	return st.Readers, err
}

func (s *Stream) stats() (stream.Stats, error) {
	if err := s.check(); err != nil {
		return stream.Stats{}, err
	}
	return s.s.Stats()
}

// End ends the stream: readers read what was published, then get ErrEnded.
func (s *Stream) End() error {
	if err := s.check(); err != nil {
		return err
	}
	return s.s.End()
}

// Close closes this process's handle on the stream. Closing twice returns
// ErrClosed.
func (s *Stream) Close() error {
	if err := s.check(); err != nil {
		return err
	}
	return s.s.Close()
}

// StreamWriter is the stream's writer in this process. It is safe for
// concurrent use: its calls are serialized, and the goroutines that share
// it share the frame it claimed (Look, then Increment, by whichever
// goroutine).
type StreamWriter struct {
	s *Stream
	w *stream.Writer
}

// Writer makes this process the stream's writer.
func (s *Stream) Writer() (*StreamWriter, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	w, err := s.s.Writer()
	if err != nil {
		return nil, err
	}
	return &StreamWriter{s, w}, nil
}

// SetWait says how Look and Write wait for room.
func (w *StreamWriter) SetWait(p Wait) error {
	if err := w.check(); err != nil {
		return err
	}
	return w.w.SetWait(p)
}

func (w *StreamWriter) check() error {
	if w == nil || w.w == nil {
		return nilErr("StreamWriter")
	}
	return nil
}

// Look returns the memory of the next frame to fill, waiting for room (under
// the block policy) until ctx is done (ErrFull, with ctx.Err()). The frame
// is valid until Increment or Close.
func (w *StreamWriter) Look(ctx context.Context) ([]byte, error) {
	if err := w.check(); err != nil {
		return nil, err
	}
	slot, err := w.w.LookContext(ctx)
	if err != nil {
		return nil, err
	}
	return w.s.s.Frame(slot), nil
}

// Increment publishes the frame Look returned.
func (w *StreamWriter) Increment() error {
	if err := w.check(); err != nil {
		return err
	}
	return w.w.Increment()
}

// Write copies frame (exactly one frame's bytes) into the next frame and
// publishes it.
func (w *StreamWriter) Write(ctx context.Context, frame []byte) error {
	if err := w.check(); err != nil {
		return err
	}
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

// Close gives up the writer role, waking a Look blocked in another
// goroutine. Closing twice returns ErrClosed.
func (w *StreamWriter) Close() error {
	if err := w.check(); err != nil {
		return err
	}
	return w.w.Close()
}

// WriterLook returns the next frame to fill as a []T of the stream's
// element type, as StreamWriter.Look does, so that filling it needs no
// unsafe.
func WriterLook[T Element](ctx context.Context, w *StreamWriter) ([]T, error) {
	frame, err := w.Look(ctx)
	if err != nil {
		return nil, err
	}
	return frameOf[T](frame, w.s.s.Config())
}

// StreamReader is one reader of a stream in this process. It is safe for
// concurrent use: its calls are serialized, and the goroutines that share
// it share its position (a frame one looked at is released by the next
// Increment, whoever makes it); a goroutine that wants every frame joins
// with a reader of its own.
type StreamReader struct {
	s *Stream
	r *stream.Reader
}

// Reader joins the stream as reader index, or in the first free slot when
// index is negative, at the next frame published.
func (s *Stream) Reader(index int) (*StreamReader, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	r, err := s.s.Reader(index)
	if err != nil {
		return nil, err
	}
	return &StreamReader{s, r}, nil
}

// SetWait says how Look and Read wait for frames.
func (r *StreamReader) SetWait(p Wait) error {
	if err := r.check(); err != nil {
		return err
	}
	return r.r.SetWait(p)
}

func (r *StreamReader) check() error {
	if r == nil || r.r == nil {
		return nilErr("StreamReader")
	}
	return nil
}

// Look returns the memory of the next frame (read it, do not write it),
// waiting until ctx is done (ErrEmpty, with ctx.Err()); ErrEnded once the
// stream ended and every frame was read. The frame is valid until
// Increment or Close.
func (r *StreamReader) Look(ctx context.Context) ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	slot, err := r.r.LookContext(ctx)
	if err != nil {
		return nil, err
	}
	return r.s.s.Frame(slot), nil
}

// Increment releases the frame Look returned, and reports whether it was
// whole (not overwritten while looked at).
func (r *StreamReader) Increment() (bool, error) {
	if err := r.check(); err != nil {
		return false, err
	}
	return r.r.Increment()
}

// Read copies the next whole frame into dst (one frame's bytes), skipping
// frames overwritten while they were copied.
func (r *StreamReader) Read(ctx context.Context, dst []byte) error {
	if err := r.check(); err != nil {
		return err
	}
	if uint64(len(dst)) != r.s.s.FrameBytes() {
		return fmt.Errorf("a %d-byte buffer for a stream of %d-byte frames: %w", len(dst), r.s.s.FrameBytes(), unix.EINVAL)
	}
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
	if err := r.check(); err != nil {
		return 0, err
	}
	st, err := r.r.Stats()
	return st.Dropped, err
}

// Close leaves the stream, waking a Look blocked in another goroutine.
// Closing twice returns ErrClosed.
func (r *StreamReader) Close() error {
	if err := r.check(); err != nil {
		return err
	}
	return r.r.Close()
}

// ReaderLook returns the next frame as a []T of the stream's element type,
// as StreamReader.Look does (read it, do not write it).
func ReaderLook[T Element](ctx context.Context, r *StreamReader) ([]T, error) {
	frame, err := r.Look(ctx)
	if err != nil {
		return nil, err
	}
	return frameOf[T](frame, r.s.s.Config())
}

// frameOf views a frame of a stream of cfg as its elements.
func frameOf[T Element](frame []byte, cfg stream.Config) ([]T, error) {
	n := 1
	for _, d := range cfg.Shape {
		n *= int(d)
	}
	return view[T](frame, cfg.DType, n)
}
