package stream_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/stream"
)

// Attacks on the slots a writer takes back (Note [the slots a writer takes
// back] in package plane's stream.c) and on a writer taking the role over
// (findFree), with the shared memory written as another process of the
// user may: every slot table entry of the ring, relative to the writer's
// next frame, forged to every slot and past the ring; reader positions
// forged behind and ahead of the writer, across 2^31, 2^32 and 2^63.

// atPosition is reader 0's position in the data region.
const atPosition = 576 + 8

// fixAttackCase is a stream under Block with one reader, a shadow of the
// slot the writer gave each frame (from its Looks, never from the table),
// and the writer's next frame.
type fixAttackCase struct {
	t      *testing.T
	s      *stream.Stream
	r      *stream.Reader
	w      *stream.Writer
	frames uint64
	given  map[uint64]int
	next   uint64
}

func (c *fixAttackCase) entry(p uint64) int {
	return atTable + 4*int(p%c.frames)
}

// claim runs one Look of the writer: it either gives a slot that no frame
// the reader has yet to release holds (by the shadow, not the table), or
// fails as the ring being full or the table corrupt.
func (c *fixAttackCase) claim() bool {
	c.t.Helper()
	slot, err := c.w.Look(time.Now())
	if err != nil {
		require.Truef(c.t, errors.Is(err, stream.ErrFull) || errors.Is(err, header.ErrCorrupt), "%v", err)
		return false
	}
	require.Less(c.t, slot, int(c.frames))
	// In flight: from the reader's position as the writer reads it (the
	// shared one, maybe forged), within the last ring.
	pos := binary.LittleEndian.Uint64(c.s.Segment().Data()[atPosition:])
	pos = max(pos, c.next-min(c.next, c.frames-1))
	for p := pos; p < c.next; p++ {
		require.NotEqualf(c.t, c.given[p], slot, "frame %d given slot %d, where frame %d still is", c.next, slot, p)
	}
	fillFrame(c.s.Frame(slot), c.next)
	require.NoError(c.t, c.w.Increment())
	c.given[c.next] = slot
	c.next++
	return true
}

// restore writes back the table entries of the last ring as the writer
// gave them.
func (c *fixAttackCase) restore() {
	d := c.s.Segment().Data()
	for p := c.next - min(c.next, c.frames); p < c.next; p++ {
		binary.LittleEndian.PutUint32(d[c.entry(p):], uint32(c.given[p]))
	}
}

// lockstep writes n frames, reading each whole and in order: no slot was
// lost, none is given twice.
func (c *fixAttackCase) lockstep(n int) {
	c.t.Helper()
	for range n {
		require.True(c.t, c.claim())
		got, _ := readOne(c.t, c.s, c.r)
		require.Equal(c.t, c.next-1, got)
	}
}

// drain reads every frame published, whole or not.
func (c *fixAttackCase) drain() {
	c.t.Helper()
	for rstats(c.t, c.r).Position < c.next {
		_, err := c.r.Look(time.Now())
		require.NoError(c.t, err)
		_, err = c.r.Increment()
		require.NoError(c.t, err)
	}
}

// TestFixAttackForgedEntryEverywhere forges the table entry of each frame
// of the ring around the writer's next (in flight, released, the next to
// claim) to each slot and past the ring, with 0 to all frames in flight,
// small frames (every slot warm) and large ones (a few warm slots, so one
// slot is in the table twice among the frames released). While forged, the
// writer never gives a slot that a frame in flight holds and fails only as
// full or corrupt; the reader reads or says corrupt; once the entry is
// back, both go on, every frame whole, in order, in a slot of its own.
func TestFixAttackForgedEntryEverywhere(t *testing.T) {
	t.Parallel()
	for _, big := range []bool{false, true} {
		t.Run(fmt.Sprintf("big=%v", big), func(t *testing.T) {
			var s *stream.Stream
			const frames = 5
			if big {
				s = bigFrames(t, frames)
			} else {
				s = mustStream(t, frameConfig(frames, 1, stream.Block))
			}
			c := &fixAttackCase{t: t, s: s, r: mustReader(t, s, 0), w: mustWriter(t, s), frames: frames,
				given: map[uint64]int{}}
			t.Cleanup(func() { require.NoError(t, c.r.Close()); require.NoError(t, c.w.Close()) })
			c.lockstep(3 * frames)
			values := []uint32{frames, frames + 1, 1 << 31, 1<<32 - 1}
			for v := range uint32(frames) {
				values = append(values, v)
			}
			d := s.Segment().Data()
			for inflight := range uint64(frames + 1) {
				for ahead := range uint64(frames) { // the entry of next - ahead, and so of next + frames - ahead
					for _, v := range values {
						for range inflight {
							require.True(t, c.claim())
						}
						at := c.entry(c.next + frames - ahead)
						binary.LittleEndian.PutUint32(d[at:], v)
						for range frames + 1 {
							if _, err := c.r.Look(time.Now()); err == nil {
								_, err = c.r.Increment()
								require.NoError(t, err)
							} else {
								require.Truef(t, errors.Is(err, header.ErrCorrupt) || errors.Is(err, stream.ErrEmpty), "%v", err)
							}
							c.claim()
						}
						c.restore()
						c.drain()
						c.lockstep(2 * frames)
					}
				}
			}
		})
	}
}

// TestFixAttackTakeOverReaderAnywhere: a writer closes with frames in
// flight and another takes the role over, with the reader's position in
// shared memory forged to each place relative to the frames published
// (one and a ring ahead, at, one behind, a ring less one, a ring, a ring
// and one, 2^31, 2^32 and 2^63 behind, and 0), the frames published
// themselves across 2^31, 2^32 and 2^63. The writer takes over at once,
// or refuses the table as corrupt; it never hands a frame in flight's slot
// out; and once the reader's own position is back, both go on for good.
func TestFixAttackTakeOverReaderAnywhere(t *testing.T) {
	t.Parallel()
	const frames = 4
	for _, base := range []uint64{0, 1<<31 - 3, 1<<32 - 2, 1<<63 - 1} {
		for _, big := range []bool{false, true} {
			for _, off := range []int64{-frames, -1, 0, 1, frames - 1, frames, frames + 1, 1 << 31, 1 << 32, 1 << 62, -(1 << 62)} {
				name := fmt.Sprintf("base=%d/big=%v/behind=%d", base, big, off)
				t.Run(name, func(t *testing.T) {
					var s *stream.Stream
					if big {
						s = mustStream(t, stream.Config{DType: dtype.Uint64, Shape: []int64{1 << 18}, Frames: frames,
							Readers: 1, Policy: stream.Block})
					} else {
						s = mustStream(t, frameConfig(frames, 1, stream.Block))
					}
					d := s.Segment().Data()
					binary.LittleEndian.PutUint64(d[atClaim:], base)
					binary.LittleEndian.PutUint64(d[atPublished:], base)
					c := &fixAttackCase{t: t, s: s, r: mustReader(t, s, 0), w: mustWriter(t, s), frames: frames,
						given: map[uint64]int{}, next: base}
					t.Cleanup(func() { require.NoError(t, c.r.Close()) })
					c.lockstep(3 * frames)
					for range frames - 1 {
						require.True(t, c.claim())
					}
					require.NoError(t, c.w.Close())
					pos := rstats(t, c.r).Position
					at := atPosition
					binary.LittleEndian.PutUint64(d[at:], c.next-uint64(off))
					start := time.Now()
					w, err := s.Writer()
					require.Less(t, time.Since(start), 10*time.Second, "the writer walked the positions")
					if err != nil {
						// Only a table it cannot take is refused: a slot twice
						// in the last ring, where the forged reader is behind it.
						require.ErrorIs(t, err, header.ErrCorrupt)
						require.Greater(t, off, int64(frames))
					} else {
						c.w = w
						for range frames + 1 {
							c.claim()
						}
						require.NoError(t, c.w.Close())
					}
					// The reader's position back, it reads what was published
					// (a writer forged past it lapped it: it skips to the last
					// ring), and a writer takes over and goes on for good.
					binary.LittleEndian.PutUint64(d[at:], pos)
					c.restore()
					c.drain()
					c.w = mustWriter(t, s)
					t.Cleanup(func() { require.NoError(t, c.w.Close()) })
					c.lockstep(3 * frames)
				})
			}
		}
	}
}
