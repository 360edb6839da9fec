package stream_test

import (
	"encoding/binary"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/event"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/stream"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

func mustStream(t *testing.T, cfg stream.Config) *stream.Stream {
	t.Helper()
	s, err := stream.Create("", cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// mustReader joins s as reader index (-1: the first free slot).
func mustReader(t *testing.T, s *stream.Stream, index int) *stream.Reader {
	t.Helper()
	r, err := s.Reader(index)
	require.NoError(t, err)
	return r
}

// mustWriter takes the writer role of s.
func mustWriter(t *testing.T, s *stream.Stream) *stream.Writer {
	t.Helper()
	w, err := s.Writer()
	require.NoError(t, err)
	return w
}

func frameConfig(frames, readers int, policy stream.Policy) stream.Config {
	return stream.Config{DType: dtype.Uint64, Shape: []int64{64}, Frames: frames, Readers: readers, Policy: policy}
}

// fillFrame writes seq into every word of a frame.
func fillFrame(frame []byte, seq uint64) {
	for i := 0; i+8 <= len(frame); i += 8 {
		binary.LittleEndian.PutUint64(frame[i:], seq)
	}
}

// frameSeq returns the sequence number every word of frame holds, or an
// error naming the first word that differs (a torn frame).
func frameSeq(frame []byte) (uint64, error) {
	seq := binary.LittleEndian.Uint64(frame)
	for i := 8; i+8 <= len(frame); i += 8 {
		if w := binary.LittleEndian.Uint64(frame[i:]); w != seq {
			return 0, fmt.Errorf("torn frame: word 0 is %d, word %d is %d", seq, i/8, w)
		}
	}
	return seq, nil
}

func write(t *testing.T, w *stream.Writer, s *stream.Stream, seq uint64, deadline time.Time) {
	t.Helper()
	slot, err := w.Look(deadline)
	require.NoError(t, err)
	fillFrame(s.Frame(slot), seq)
	require.NoError(t, w.Increment())
}

// readAll reads frames until the stream ends and returns their sequence
// numbers; torn frames are errors.
func readAll(s *stream.Stream, r *stream.Reader) ([]uint64, error) {
	var got []uint64
	for {
		slot, err := r.Look(time.Time{})
		if err == stream.ErrEnded {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		seq, ferr := frameSeq(s.Frame(slot))
		whole, err := r.Increment()
		if err != nil {
			return got, err
		}
		if whole {
			if ferr != nil {
				return got, ferr
			}
			got = append(got, seq)
		}
	}
}

func TestStreamEveryReaderSeesEveryFrameInOrder(t *testing.T) {
	testenv.SkipShort(t, "runs for seconds")
	for _, readers := range []int{1, 2, 4} {
		t.Run(strconv.Itoa(readers), func(t *testing.T) {
			s := mustStream(t, frameConfig(8, readers, stream.Block))
			const frames = 3000
			rs := make([]*stream.Reader, readers)
			for i := range rs {
				rs[i] = mustReader(t, s, -1)
				require.Equal(t, i, rs[i].Index())
			}
			got := make([][]uint64, readers)
			errs := make([]error, readers)
			var wg sync.WaitGroup
			for i, r := range rs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[i], errs[i] = readAll(s, r)
				}()
			}
			w := mustWriter(t, s)
			for seq := range uint64(frames) {
				write(t, w, s, seq, time.Time{})
			}
			require.NoError(t, s.End())
			wg.Wait()
			for i := range rs {
				require.NoError(t, errs[i])
				require.Len(t, got[i], frames, "reader %d", i)
				for seq, g := range got[i] {
					require.EqualValues(t, seq, g, "reader %d, in order, exactly once", i)
				}
				require.Zero(t, rstats(t, rs[i]).Dropped)
				require.EqualValues(t, frames, rstats(t, rs[i]).Received)
				require.NoError(t, rs[i].Close())
			}
			require.NoError(t, w.Close())
			require.EqualValues(t, frames, stats(t, s).Published)
		})
	}
}

func TestStreamOverwriteCountsWhatASlowReaderLoses(t *testing.T) {
	s := mustStream(t, frameConfig(4, 2, stream.Overwrite))
	slow := mustReader(t, s, -1)
	fast := mustReader(t, s, -1)
	w := mustWriter(t, s)
	const frames = 2000
	var wg sync.WaitGroup
	var slowGot, fastGot []uint64
	var slowErr, fastErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			slot, err := slow.Look(time.Time{})
			if err == stream.ErrEnded {
				return
			}
			if err != nil {
				slowErr = err
				return
			}
			time.Sleep(50 * time.Microsecond) // slow: the writer laps it
			seq, ferr := frameSeq(s.Frame(slot))
			whole, err := slow.Increment()
			if err != nil {
				slowErr = err
				return
			}
			if whole {
				if ferr != nil {
					slowErr = ferr
					return
				}
				slowGot = append(slowGot, seq)
			}
		}
	}()
	go func() {
		defer wg.Done()
		fastGot, fastErr = readAll(s, fast)
	}()
	for seq := range uint64(frames) {
		write(t, w, s, seq, time.Now()) // never waits
		if seq%16 == 0 {
			time.Sleep(20 * time.Microsecond)
		}
	}
	require.NoError(t, s.End())
	wg.Wait()
	require.NoError(t, slowErr)
	require.NoError(t, fastErr)
	require.Positive(t, rstats(t, slow).Dropped, "the slow reader was lapped")
	require.EqualValues(t, frames, uint64(len(slowGot))+rstats(t, slow).Dropped, "received + dropped = published")
	require.EqualValues(t, frames, uint64(len(fastGot))+rstats(t, fast).Dropped)
	require.Equal(t, rstats(t, slow).Dropped+rstats(t, fast).Dropped, stats(t, s).Dropped)
	for i := 1; i < len(slowGot); i++ {
		require.Greater(t, slowGot[i], slowGot[i-1], "in order")
	}
	require.NoError(t, slow.Close())
	require.NoError(t, fast.Close())
	require.NoError(t, w.Close())
}

func TestStreamLateReaderStartsAtTheNextFrame(t *testing.T) {
	s := mustStream(t, frameConfig(4, 2, stream.Block))
	w := mustWriter(t, s)
	for seq := range uint64(10) {
		write(t, w, s, seq, time.Now()) // no reader yet: nothing holds the writer back
	}
	r := mustReader(t, s, 1)
	_, err := r.Look(time.Now())
	require.ErrorIs(t, err, stream.ErrEmpty)
	write(t, w, s, 10, time.Now())
	seq, _ := readOne(t, s, r)
	require.EqualValues(t, 10, seq)
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
}

func TestStreamBackpressureAndTimeouts(t *testing.T) {
	s := mustStream(t, frameConfig(4, 1, stream.Block))
	r := mustReader(t, s, 0)
	w := mustWriter(t, s)
	start := time.Now()
	_, err := r.Look(time.Now().Add(30 * time.Millisecond))
	require.ErrorIs(t, err, stream.ErrEmpty)
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
	for seq := range uint64(4) {
		write(t, w, s, seq, time.Now())
	}
	_, err = w.Look(time.Now())
	require.ErrorIs(t, err, stream.ErrFull, "the reader holds every slot")
	start = time.Now()
	_, err = w.Look(time.Now().Add(30 * time.Millisecond))
	require.ErrorIs(t, err, stream.ErrFull)
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)

	// A blocked writer wakes when the reader releases a frame.
	done := make(chan error)
	go func() {
		slot, err := w.Look(time.Time{})
		if err == nil {
			fillFrame(s.Frame(slot), 4)
			err = w.Increment()
		}
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	_, err = r.Look(time.Now())
	require.NoError(t, err)
	_, err = r.Increment()
	require.NoError(t, err)
	require.NoError(t, <-done)

	// Looking twice returns the same frame; incrementing without a look fails.
	a, err := r.Look(time.Now())
	require.NoError(t, err)
	b, err := r.Look(time.Now())
	require.NoError(t, err)
	require.Equal(t, a, b)
	_, err = r.Increment()
	require.NoError(t, err)
	_, err = r.Increment()
	require.ErrorIs(t, err, stream.ErrNoFrame)
	require.ErrorIs(t, w.Increment(), stream.ErrNoFrame)
	require.NoError(t, w.Close())
	require.NoError(t, r.Close())
}

func TestStreamEndWakesEveryone(t *testing.T) {
	s := mustStream(t, frameConfig(2, 1, stream.Block))
	r := mustReader(t, s, 0)
	w := mustWriter(t, s)
	write(t, w, s, 0, time.Now())
	write(t, w, s, 1, time.Now())
	blocked := make(chan error)
	go func() { _, err := w.Look(time.Time{}); blocked <- err }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, s.End())
	require.ErrorIs(t, <-blocked, stream.ErrEnded, "a writer waiting for room")
	got, err := readAll(s, r)
	require.NoError(t, err)
	require.Equal(t, []uint64{0, 1}, got, "readers read what was published, then the end")
	_, err = r.Look(time.Time{})
	require.ErrorIs(t, err, stream.ErrEnded)
	require.True(t, stats(t, s).Ended)
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
}

func TestStreamReaderSlotsAndWriterRole(t *testing.T) {
	s := mustStream(t, frameConfig(4, 2, stream.Block))
	a := mustReader(t, s, -1)
	_, err := s.Reader(0)
	require.ErrorIs(t, err, stream.ErrNoSlot)
	require.ErrorContains(t, err, "reader slot 0 is held by pid")
	b := mustReader(t, s, -1)
	require.Equal(t, 1, b.Index())
	_, err = s.Reader(-1)
	require.ErrorIs(t, err, stream.ErrNoSlot)
	require.ErrorContains(t, err, "all 2 reader slots")
	_, err = s.Reader(2)
	require.ErrorIs(t, err, unix.EINVAL)
	require.Equal(t, 2, stats(t, s).Readers)
	require.NoError(t, a.Close())
	c, err := s.Reader(-1)
	require.NoError(t, err, "a reader that left frees its slot")
	require.Equal(t, 0, c.Index())

	w := mustWriter(t, s)
	_, err = s.Writer()
	require.ErrorIs(t, err, stream.ErrWriterBusy)
	require.NoError(t, w.Close())
	w, err = s.Writer()
	require.NoError(t, err, "a writer that left frees the role")
	require.NoError(t, w.Close())
	_, err = w.Look(time.Now())
	require.ErrorIs(t, err, stream.ErrClosed)
	require.NoError(t, b.Close())
	require.NoError(t, c.Close())
}

func TestStreamRefusesBadConfigurations(t *testing.T) {
	t.Parallel()
	for _, cfg := range []stream.Config{
		frameConfig(1, 1, stream.Block),
		frameConfig(stream.MaxFrames+1, 1, stream.Block),
		frameConfig(4, 0, stream.Block),
		frameConfig(4, stream.MaxReaders+1, stream.Block),
		frameConfig(4, 1, stream.Policy(2)),
		{DType: dtype.Float32, Shape: []int64{-1}, Frames: 4, Readers: 1},
		{DType: dtype.DType(99), Shape: []int64{4}, Frames: 4, Readers: 1},
		{DType: dtype.Float32, Shape: []int64{1 << 40}, Frames: 4, Readers: 1},
		{DType: dtype.Float32, Shape: []int64{4}, Frames: 4, Readers: 1, ReaderTimeout: -time.Second},
	} {
		_, err := stream.Create("", cfg)
		require.Error(t, err, "%+v", cfg)
	}
}

func TestStreamAttachSeesTheSameRing(t *testing.T) {
	t.Parallel()
	cfg := stream.Config{DType: dtype.Float32, Shape: []int64{3, 5}, Frames: 6, Readers: 3, Policy: stream.Overwrite,
		ReaderTimeout: 1500 * time.Millisecond}
	s := mustStream(t, cfg)
	other, err := stream.Attach(s.Segment().Name())
	require.NoError(t, err)
	require.Equal(t, cfg, other.Config())
	require.EqualValues(t, 60, other.FrameBytes())
	require.Equal(t, s.FrameOffset(5), other.FrameOffset(5))
	require.Zero(t, s.FrameOffset(1)%64, "frames are aligned")
	require.NoError(t, other.Close())
}

// A reader in another process that dies holding a frame stops holding the
// writer back; a reader not seen for the reader timeout is evicted and
// rejoins, counting what it missed.
func TestStreamKilledReaderDoesNotStallTheWriter(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	s := mustStream(t, frameConfig(4, 2, stream.Block))
	w := mustWriter(t, s)
	h := testenv.StartHelper(t, "stream-reader", s.Segment().Name())
	require.Equal(t, "joined", h.ReadLine(t))
	write(t, w, s, 0, time.Now())
	require.Equal(t, "looking", h.ReadLine(t))
	testenv.Kill(t, h)
	start := time.Now()
	for seq := range uint64(20) {
		write(t, w, s, seq+1, time.Now().Add(5*time.Second))
	}
	require.Less(t, time.Since(start), 5*time.Second)
	require.Zero(t, stats(t, s).Readers, "the dead reader's slot was taken away")
	r, err := s.Reader(-1)
	require.NoError(t, err, "and can be taken")
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
	_, err = s.Segment().DropRef() // the killed helper's count: the cleanup daemon's work
	require.NoError(t, err)
}

func TestStreamReaderTimeout(t *testing.T) {
	cfg := frameConfig(4, 1, stream.Block)
	cfg.ReaderTimeout = 100 * time.Millisecond
	s := mustStream(t, cfg)
	r := mustReader(t, s, 0)
	w := mustWriter(t, s)
	_, err := r.Look(time.Now()) // seen now, and then not again
	require.ErrorIs(t, err, stream.ErrEmpty)
	start := time.Now()
	for seq := range uint64(10) {
		write(t, w, s, seq, time.Now().Add(5*time.Second))
	}
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "the writer waited for the timeout")
	_, err = r.Look(time.Now())
	require.ErrorIs(t, err, stream.ErrEmpty, "the evicted reader rejoins at the next frame")
	require.EqualValues(t, 10, rstats(t, r).Dropped, "having missed every frame written without it")
	write(t, w, s, 10, time.Now())
	seq, _ := lookSeq(t, s, r)
	require.EqualValues(t, 10, seq)
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
}

// A writer killed mid-frame publishes nothing; the next writer takes the
// role over and its frames are whole.
func TestStreamWriterKilledMidFrame(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	s := mustStream(t, frameConfig(4, 1, stream.Overwrite))
	r := mustReader(t, s, 0)
	h := testenv.StartHelper(t, "stream-writer", s.Segment().Name())
	require.Equal(t, "half-written", h.ReadLine(t))
	testenv.Kill(t, h)
	require.EqualValues(t, 1, stats(t, s).Published, "the frame being written was not published")
	w, err := s.Writer()
	require.NoError(t, err, "the dead writer's role is taken over")
	write(t, w, s, 7, time.Now())
	require.NoError(t, s.End())
	got, err := readAll(s, r)
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 7}, got, "the half-written frame never reaches a reader")
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
	_, err = s.Segment().DropRef() // the killed helper's count
	require.NoError(t, err)
}

func init() {
	testenv.Helpers["stream-reader"] = func(args []string) error {
		s, err := stream.Attach(args[0])
		if err != nil {
			return err
		}
		r, err := s.Reader(-1)
		if err != nil {
			return err
		}
		fmt.Println("joined")
		if _, err := r.Look(time.Time{}); err != nil {
			return err
		}
		fmt.Println("looking")
		time.Sleep(time.Hour) // until killed
		return nil
	}
	testenv.Helpers["stream-writer"] = func(args []string) error {
		s, err := stream.Attach(args[0])
		if err != nil {
			return err
		}
		w, err := s.Writer()
		if err != nil {
			return err
		}
		slot, err := w.Look(time.Time{})
		if err != nil {
			return err
		}
		fillFrame(s.Frame(slot), 1)
		if err := w.Increment(); err != nil {
			return err
		}
		slot, err = w.Look(time.Time{})
		if err != nil {
			return err
		}
		frame := s.Frame(slot)
		fillFrame(frame[:len(frame)/2], 2)
		fmt.Println("half-written")
		time.Sleep(time.Hour)
		return nil
	}
}

// TestStreamAttachRefusesACorruptLayout: a layout word of a stream of 4
// frames and 2 readers changed is refused as corrupt, attached or
// observed; set back, the stream attaches.
func TestStreamAttachRefusesACorruptLayout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		at        int // the word's offset in the data
		bad, good uint32
	}{
		{"frames more than the segment holds", 16, 1000, 4},
		{"no reader slots", 20, 0, 2},
		// The dtype word is a u32: a code past 16 bits is none, however
		// valid its low half (uint64's here).
		{"a dtype code past 16 bits", 28, 1<<16 + uint32(dtype.Uint64), uint32(dtype.Uint64)},
		{"a dtype code past 31 bits", 28, 1<<31 + uint32(dtype.Uint64), uint32(dtype.Uint64)},
		{"a dtype code of none", 28, uint32(dtype.Complex128) + 1, uint32(dtype.Uint64)},
		{"a dtype of another itemsize", 28, uint32(dtype.Float32), uint32(dtype.Uint64)},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := mustStream(t, frameConfig(4, 2, stream.Block))
			d := s.Segment().Data()
			binary.LittleEndian.PutUint32(d[c.at:], c.bad)
			_, err := stream.Attach(s.Segment().Name())
			require.ErrorIs(t, err, header.ErrCorrupt)
			_, err = stream.Observe(d)
			require.ErrorIs(t, err, header.ErrCorrupt, "observed too")
			binary.LittleEndian.PutUint32(d[c.at:], c.good)
			other, err := stream.Attach(s.Segment().Name())
			require.NoError(t, err, "repaired, it attaches")
			require.NoError(t, other.Close())
		})
	}
}

func stats(t *testing.T, s *stream.Stream) stream.Stats {
	t.Helper()
	st, err := s.Stats()
	require.NoError(t, err)
	return st
}

func rstats(t *testing.T, r *stream.Reader) stream.ReaderStats {
	t.Helper()
	st, err := r.Stats()
	require.NoError(t, err)
	return st
}

func TestStreamCloseWakesBlockedCalls(t *testing.T) {
	s, err := stream.Create("", frameConfig(2, 1, stream.Block))
	require.NoError(t, err)
	w := mustWriter(t, s)
	r := mustReader(t, s, -1)
	e, err := event.Create("")
	require.NoError(t, err)

	results := make(chan error, 3)
	go func() { _, err := r.Look(time.Time{}); results <- err }() // nothing published: waits
	go func() { _, err := e.Wait(time.Time{}); results <- err }() // never set: waits
	time.Sleep(30 * time.Millisecond)
	require.NoError(t, r.Close())
	require.NoError(t, e.Close())
	for range 2 {
		select {
		case err := <-results:
			require.Error(t, err)
			require.ErrorIs(t, err, shm.ErrClosed, "stream.ErrClosed or event.ErrClosed")
		case <-time.After(5 * time.Second):
			t.Fatal("a call blocked on a closed reader or event did not return")
		}
	}

	// A writer waiting for room, with a reader that never reads.
	slow := mustReader(t, s, -1)
	write(t, w, s, 1, time.Time{})
	write(t, w, s, 2, time.Time{})
	go func() { _, err := w.Look(time.Time{}); results <- err }()
	time.Sleep(30 * time.Millisecond)
	require.NoError(t, w.Close())
	select {
	case err := <-results:
		require.ErrorIs(t, err, stream.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("a writer blocked on a closed handle did not return")
	}

	require.NoError(t, s.Close())
	_, err = s.Stats()
	require.ErrorIs(t, err, stream.ErrClosed)
	require.ErrorIs(t, s.End(), stream.ErrClosed)
	_, err = s.Writer()
	require.ErrorIs(t, err, stream.ErrClosed)
	require.ErrorIs(t, s.Close(), stream.ErrClosed, "a second Close")
	_, err = r.Stats()
	require.ErrorIs(t, err, stream.ErrClosed)
	_, err = w.Look(time.Now())
	require.ErrorIs(t, err, stream.ErrClosed)
	require.ErrorIs(t, e.Set(), event.ErrClosed)
	_, err = e.IsSet()
	require.ErrorIs(t, err, event.ErrClosed)

	// The reader outlives the stream handle it came from.
	seq, _ := lookSeq(t, s, slow)
	require.EqualValues(t, 1, seq)
	require.NoError(t, slow.Close())
}

func TestStreamEndpointsSharedByGoroutines(t *testing.T) {
	// Goroutines that share a writer and a reader: the calls are serialized,
	// every frame is published once and read once, and -race sees no race.
	s := mustStream(t, frameConfig(8, 1, stream.Block))
	w := mustWriter(t, s)
	r := mustReader(t, s, -1)
	const perWriter, writers = 500, 4
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perWriter {
				mu.Lock() // Look and Increment of one frame belong together
				slot, err := w.Look(time.Time{})
				if err == nil {
					fillFrame(s.Frame(slot), 7)
					err = w.Increment()
				}
				mu.Unlock()
				if err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
		}()
	}
	var read sync.WaitGroup
	counts := make(chan int, 4)
	for range 4 {
		read.Add(1)
		go func() {
			defer read.Done()
			n := 0
			for {
				_, _, err := r.Next(time.Now().Add(200 * time.Millisecond))
				if err != nil {
					counts <- n
					return
				}
				n++
			}
		}()
	}
	wg.Wait()
	read.Wait()
	close(counts)
	total := 0
	for n := range counts {
		total += n
	}
	require.Equal(t, perWriter*writers, total, "each frame looked at once")
	require.EqualValues(t, perWriter*writers, stats(t, s).Published)
	require.NoError(t, w.Close())
	require.NoError(t, r.Close())
}

// bigFrames makes a Block stream whose ring is larger than the slots its
// writer keeps warm (4 MiB): frames of 1 MiB.
func bigFrames(t *testing.T, frames int) *stream.Stream {
	return mustStream(t, stream.Config{DType: dtype.Uint64, Shape: []int64{1 << 17}, Frames: frames, Readers: 1})
}

// lookSeq looks at the next frame, which must be there and whole, and
// returns its sequence number and slot.
func lookSeq(t *testing.T, s *stream.Stream, r *stream.Reader) (uint64, int) {
	t.Helper()
	slot, err := r.Look(time.Now())
	require.NoError(t, err)
	seq, err := frameSeq(s.Frame(slot))
	require.NoError(t, err)
	return seq, slot
}

// readOne reads the next frame whole and returns its sequence number and
// slot.
func readOne(t *testing.T, s *stream.Stream, r *stream.Reader) (uint64, int) {
	t.Helper()
	seq, slot := lookSeq(t, s, r)
	whole, err := r.Increment()
	require.NoError(t, err)
	require.True(t, whole)
	return seq, slot
}

// While the reader keeps up, the writer goes round a few warm slots, not
// the whole ring; when the reader falls behind it takes the cold ones, and
// no frame in flight ever shares a slot.
func TestStreamWriterKeepsSlotsWarm(t *testing.T) {
	warm := int(stream.WarmBytes() >> 20) // slots of 1 MiB: 4, or more on AMD family 23
	frames := warm + 12
	s := bigFrames(t, frames)
	r := mustReader(t, s, 0)
	w := mustWriter(t, s)
	used := map[int]bool{}
	seq := uint64(0)
	for range 2 * warm { // each warm slot twice over: the writer stays among them
		write(t, w, s, seq, time.Now())
		got, slot := readOne(t, s, r)
		require.Equal(t, seq, got)
		used[slot] = true
		seq++
	}
	require.Len(t, used, warm, "the warm bytes' worth of 1 MiB frames")
	for range 3 { // a reader a whole ring behind, then catching up
		first := seq
		inFlight := map[int]bool{}
		for range frames {
			write(t, w, s, seq, time.Now())
			seq++
		}
		_, err := w.Look(time.Now())
		require.ErrorIs(t, err, stream.ErrFull)
		for want := first; want < seq; want++ {
			got, slot := readOne(t, s, r)
			require.Equal(t, want, got, "every frame intact: no slot was taken twice")
			require.False(t, inFlight[slot])
			inFlight[slot] = true
		}
		require.Len(t, inFlight, frames)
	}
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
}

// A writer that takes the role over finds the slots of the frames still
// unread from the slot table and never writes over them.
func TestStreamNewWriterKeepsUnreadFrames(t *testing.T) {
	s := bigFrames(t, 8)
	r := mustReader(t, s, 0)
	w := mustWriter(t, s)
	for seq := range uint64(10) { // frames 0 to 9 through the warm slots
		write(t, w, s, seq, time.Now())
		if seq < 5 {
			got, _ := readOne(t, s, r)
			require.Equal(t, seq, got)
		}
	}
	require.NoError(t, w.Close())
	w = mustWriter(t, s)
	for seq := uint64(10); seq < 13; seq++ { // 5 unread and 3 more fill the ring
		write(t, w, s, seq, time.Now())
	}
	_, err := w.Look(time.Now())
	require.ErrorIs(t, err, stream.ErrFull)
	for want := uint64(5); want < 13; want++ {
		got, _ := readOne(t, s, r)
		require.Equal(t, want, got)
	}
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
}

func TestStreamAttachRefusesAnotherLayoutVersion(t *testing.T) {
	t.Parallel()
	s := mustStream(t, frameConfig(4, 1, stream.Block))
	d := s.Segment().Data()
	binary.LittleEndian.PutUint32(d[48:], 0) // a stream of zctipc 0.1.0
	_, err := stream.Attach(s.Segment().Name())
	require.ErrorIs(t, err, header.ErrVersion)
	require.ErrorIs(t, err, stream.ErrLayoutVersion)
	binary.LittleEndian.PutUint32(d[48:], stream.LayoutVersion)
	w := mustWriter(t, s)
	r := mustReader(t, s, 0)
	write(t, w, s, 0, time.Now())
	require.NoError(t, w.Close())
	table := 576 + 64                           // the slot table, after one reader slot
	binary.LittleEndian.PutUint32(d[table:], 4) // frame 0 in slot 4 of 4
	_, err = r.Look(time.Now())
	require.ErrorIs(t, err, header.ErrCorrupt, "a reader checks the slot it is given")
	_, err = s.Writer()
	require.ErrorIs(t, err, header.ErrCorrupt, "so does a writer taking the role over")
	binary.LittleEndian.PutUint32(d[table:], 2)
	slot, err := r.Look(time.Now())
	require.NoError(t, err)
	require.Equal(t, 2, slot)
	require.NoError(t, r.Close())
}

// TestStreamWaitingReaderIsNotEvicted: a reader last seen long ago, because
// it waited for frames, is not evicted the moment the writer fills the ring
// (Note [waiting is alive]): the writer gives it a whole reader timeout from
// when it began to wait for it, across calls; one that then still does not
// move is evicted.
func TestStreamWaitingReaderIsNotEvicted(t *testing.T) {
	cfg := frameConfig(2, 1, stream.Block)
	cfg.ReaderTimeout = 100 * time.Millisecond
	s := mustStream(t, cfg)
	r := mustReader(t, s, 0)
	w := mustWriter(t, s)
	_, err := r.Look(time.Now().Add(3 * cfg.ReaderTimeout)) // waits, seen at its start only
	require.ErrorIs(t, err, stream.ErrEmpty)
	write(t, w, s, 0, time.Now())
	write(t, w, s, 1, time.Now())
	for range 3 { // a host's short waits, one call after another
		_, err = w.Look(time.Now())
		require.ErrorIs(t, err, stream.ErrFull, "the waiting reader holds the ring")
	}
	require.Zero(t, rstats(t, r).Dropped)
	// The reader takes a frame: the writer waits for the next position
	// afresh, and the reader goes on whole.
	seq, _ := readOne(t, s, r)
	require.EqualValues(t, 0, seq)
	write(t, w, s, 2, time.Now())
	// Now it stops: a whole timeout later the writer evicts it.
	write(t, w, s, 3, time.Now().Add(10*time.Second))
	_, err = r.Look(time.Now())
	require.ErrorIs(t, err, stream.ErrEmpty, "the evicted reader rejoins at the next frame")
	require.EqualValues(t, 1, rstats(t, r).Received)
	require.NotZero(t, rstats(t, r).Dropped)
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
}

// TestStreamBlockModel: random interleavings of a writer and two readers
// under Block, with a reader timeout no run reaches, against a model: the
// writer publishes exactly when every reader has released the frame a ring
// back, each reader gets every frame in order and whole, and no live reader
// is evicted however often the writer finds itself waiting.
func TestStreamBlockModel(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewSource(seed))
		cfg := frameConfig(2+rng.Intn(4), 2, stream.Block)
		cfg.ReaderTimeout = time.Hour
		s := mustStream(t, cfg)
		w := mustWriter(t, s)
		readers := make([]*stream.Reader, 2)
		for i := range readers {
			readers[i] = mustReader(t, s, i)
		}
		var published uint64
		next := []uint64{0, 0} // the model's reader positions
		for range 300 {
			if i := rng.Intn(3); i == 2 {
				fits := published < min(next[0], next[1])+uint64(cfg.Frames)
				slot, err := w.Look(time.Now())
				if !fits {
					require.ErrorIs(t, err, stream.ErrFull, "seed %d", seed)
					continue
				}
				require.NoError(t, err, "seed %d", seed)
				fillFrame(s.Frame(slot), published)
				require.NoError(t, w.Increment())
				published++
			} else {
				slot, err := readers[i].Look(time.Now())
				if next[i] == published {
					require.ErrorIs(t, err, stream.ErrEmpty, "seed %d", seed)
					continue
				}
				require.NoError(t, err, "seed %d", seed)
				seq, err := frameSeq(s.Frame(slot))
				require.NoError(t, err)
				require.Equal(t, next[i], seq, "seed %d reader %d", seed, i)
				whole, err := readers[i].Increment()
				require.NoError(t, err)
				require.True(t, whole, "seed %d", seed)
				next[i]++
			}
		}
		for i, r := range readers {
			st := rstats(t, r)
			require.Equal(t, next[i], st.Received, "seed %d", seed)
			require.Zero(t, st.Dropped, "seed %d", seed)
			require.NoError(t, r.Close())
		}
		require.NoError(t, w.Close())
	}
}
