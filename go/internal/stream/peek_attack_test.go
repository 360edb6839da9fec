package stream_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/stream"
	"golang.org/x/sys/unix"
)

// noPanic runs fn with faults turned into panics, and fails the test on
// one: a fault that fn did not catch itself would kill the process.
func noPanic(t *testing.T, what string, fn func()) {
	t.Helper()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("%s panicked: %v", what, r)
		}
	}()
	fn()
}

// publish writes frames seq from..to-1 (each word of frame seq holds seq).
func publish(t *testing.T, s *stream.Stream, w *stream.Writer, from, to uint64) {
	t.Helper()
	for i := from; i < to; i++ {
		write(t, w, s, i, time.Now().Add(10*time.Second))
	}
}

// publishThenEnd writes frames 0 to total-1 (each word of frame seq holds
// seq), each within 30 seconds, ends the stream and closes w. It runs
// beside the test goroutine, so it reports with t.Errorf.
func publishThenEnd(t *testing.T, s *stream.Stream, w *stream.Writer, total uint64) {
	defer func() {
		if err := w.Close(); err != nil {
			t.Errorf("writer Close: %v", err)
		}
	}()
	for i := range total {
		slot, err := w.Look(time.Now().Add(30 * time.Second))
		if err != nil {
			t.Errorf("Look %d: %v", i, err)
			return
		}
		fillFrame(s.Frame(slot), i)
		if err := w.Increment(); err != nil {
			t.Errorf("Increment: %v", err)
			return
		}
	}
	if err := s.End(); err != nil {
		t.Errorf("End: %v", err)
	}
}

// TestStreamPeekAttackForgedPositions: positions a peeker may pass that are
// not a frame's: ahead of the writer, far behind it, a wrap of 32 bits past
// a published frame (whose table entry is the same), and the largest ones.
// Peek says ErrEmpty (or ErrEnded) for those not published, and copies a
// later, whole frame for those overwritten, never another frame as pos.
func TestStreamPeekAttackForgedPositions(t *testing.T) {
	for _, policy := range []stream.Policy{stream.Block, stream.Overwrite} {
		t.Run(policy.String(), func(t *testing.T) {
			s := mustStream(t, frameConfig(4, 1, policy))
			w := mustWriter(t, s)
			defer func() { require.NoError(t, w.Close()) }()
			publish(t, s, w, 0, 10)
			buf := make([]byte, s.FrameBytes())
			for _, pos := range []uint64{10, 11, 1 << 32, 1<<32 + 9, 1<<32 + 6, 1 << 63, stream.PeekLatest - 1, stream.PeekLatest - 4} {
				got, err := s.Peek(pos, buf)
				require.ErrorIs(t, err, stream.ErrEmpty, "position %d", pos)
				require.Equal(t, pos, got, "position %d is asked for again", pos)
			}
			oldest := uint64(6) // a ring behind published
			if policy == stream.Block {
				oldest = 7 // Note [peeking at a stream]
			}
			for _, pos := range []uint64{0, 1, 5, 6} {
				got, err := s.Peek(pos, buf)
				require.NoError(t, err, "position %d", pos)
				require.GreaterOrEqual(t, got, max(pos, oldest), "position %d", pos)
				seq, err := frameSeq(buf)
				require.NoError(t, err)
				require.Equal(t, got, seq, "position %d copies frame %d whole", pos, got)
			}
			got, err := s.Peek(stream.PeekLatest, buf)
			require.NoError(t, err)
			require.Equal(t, uint64(9), got)
			require.NoError(t, s.End())
			for _, pos := range []uint64{10, 1 << 32, stream.PeekLatest - 1} {
				_, err := s.Peek(pos, buf)
				require.ErrorIs(t, err, stream.ErrEnded, "position %d", pos)
			}
			_, err = s.Peek(0, buf[:len(buf)-1])
			require.ErrorIs(t, err, unix.EINVAL, "a buffer short of a frame")
		})
	}
}

// TestStreamPeekAttackLappedDuringCopy: a writer laps the ring (of 2 frames)
// again and again while a peeker copies large frames, with a reader that
// reads every frame (Block) or a slow one (Overwrite): each frame copied is
// whole and is the frame Peek names, positions only grow, the reader of a
// Block stream reads every frame, and the writer never waits for the peeker.
func TestStreamPeekAttackLappedDuringCopy(t *testing.T) {
	for _, policy := range []stream.Policy{stream.Block, stream.Overwrite} {
		t.Run(policy.String(), func(t *testing.T) {
			cfg := frameConfig(2, 1, policy)
			cfg.Shape = []int64{16384}
			s := mustStream(t, cfg)
			r := mustReader(t, s, -1)
			w := mustWriter(t, s)
			const total = 20000
			var wg sync.WaitGroup
			var read []uint64
			var rerr error
			wg.Add(2)
			go func() {
				defer wg.Done()
				publishThenEnd(t, s, w, total)
			}()
			go func() {
				defer wg.Done()
				for {
					if policy == stream.Overwrite && len(read)%64 == 0 {
						time.Sleep(50 * time.Microsecond)
					}
					slot, err := r.Look(time.Time{})
					if errors.Is(err, stream.ErrEnded) {
						return
					}
					if err != nil {
						rerr = err
						return
					}
					seq, ferr := frameSeq(s.Frame(slot))
					whole, err := r.Increment()
					if err != nil {
						rerr = err
						return
					}
					if whole {
						if ferr != nil {
							rerr = ferr
							return
						}
						read = append(read, seq)
					}
				}
			}()
			buf := make([]byte, s.FrameBytes())
			pos, last, seen := stream.PeekLatest, uint64(0), 0
			for {
				got, err := s.Peek(pos, buf)
				if errors.Is(err, stream.ErrEnded) {
					break
				}
				if errors.Is(err, stream.ErrEmpty) {
					pos = got
					continue
				}
				require.NoError(t, err)
				require.GreaterOrEqual(t, got, last, "positions only grow")
				seq, ferr := frameSeq(buf)
				require.NoError(t, ferr, "frame %d", got)
				require.Equal(t, got, seq, "the frame Peek names")
				last, pos, seen = got, got+1, seen+1
			}
			wg.Wait()
			require.NoError(t, r.Close())
			require.NoError(t, rerr)
			if policy == stream.Block {
				require.Len(t, read, total, "the reader read every frame")
				for i, seq := range read {
					require.Equal(t, uint64(i), seq)
				}
			}
			t.Logf("peeked %d, read %d of %d frames", seen, len(read), total)
		})
	}
}

// TestStreamPeekAttackNeverHoldsTheWriter: under Block with no reader, the
// writer publishes at once however busy peekers are.
func TestStreamPeekAttackNeverHoldsTheWriter(t *testing.T) {
	s := mustStream(t, frameConfig(2, 1, stream.Block))
	w := mustWriter(t, s)
	defer func() { require.NoError(t, w.Close()) }()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, s.FrameBytes())
			pos := stream.PeekLatest
			for {
				select {
				case <-stop:
					return
				default:
				}
				got, err := s.Peek(pos, buf)
				if err == nil {
					got++
				}
				pos = got
			}
		}()
	}
	for i := range uint64(20000) {
		slot, err := w.Look(time.Now()) // a writer that waited would time out
		require.NoError(t, err, "frame %d", i)
		fillFrame(s.Frame(slot), i)
		require.NoError(t, w.Increment())
	}
	close(stop)
	wg.Wait()
}

// TestStreamPeekAttackTruncated: another process shrinks the stream's file
// below its control words (or to nothing): Peek and Observe meet the fault
// as an error, never a crash.
func TestStreamPeekAttackTruncated(t *testing.T) {
	for _, keep := range []string{"header", "nothing", "words"} {
		t.Run(keep, func(t *testing.T) {
			s := mustStream(t, frameConfig(4, 1, stream.Overwrite))
			w := mustWriter(t, s)
			publish(t, s, w, 0, 3)
			seg := s.Segment()
			fd, err := unix.Open(filepath.Join(shm.Dir(), seg.Name()), unix.O_RDWR, 0)
			require.NoError(t, err)
			defer unix.Close(fd)
			var st unix.Stat_t
			require.NoError(t, unix.Fstat(fd, &st))
			dataAt := st.Size - int64(len(seg.Data()))
			// Below the data's first page (its words read as zeros), to
			// nothing, or to the ring's first page (the frames fault).
			size := map[string]int64{"header": dataAt, "nothing": 0, "words": (dataAt + 4096) &^ 4095}[keep]
			saved := make([]byte, st.Size)
			_, err = unix.Pread(fd, saved, 0)
			require.NoError(t, err)
			require.NoError(t, unix.Ftruncate(fd, size))
			defer func() {
				_, err := unix.Pwrite(fd, saved, 0) // as it was, for the cleanup
				require.NoError(t, err)
				require.NoError(t, w.Close())
			}()
			buf := make([]byte, s.FrameBytes())
			var perr, oerr error
			noPanic(t, "Peek", func() { _, perr = s.Peek(stream.PeekLatest, buf) })
			noPanic(t, "Observe", func() { _, oerr = stream.Observe(seg.Data()) })
			switch keep {
			case "words": // the words are there: the frames are not
				require.ErrorIs(t, perr, fault.ErrFault)
				require.NoError(t, oerr)
			case "header": // words of zeros: no frame, and no layout
				require.ErrorIs(t, perr, stream.ErrEmpty)
				require.ErrorIs(t, oerr, stream.ErrLayoutVersion)
			default:
				require.ErrorIs(t, perr, fault.ErrFault, fmt.Sprint(perr))
				require.ErrorIs(t, oerr, fault.ErrFault, fmt.Sprint(oerr))
			}
		})
	}
}
