package stream_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/stream"
)

// Offsets in a stream's data region (docs/format.md): the claim and
// published words, and the slot table after one reader slot.
const (
	atClaim     = 320
	atPublished = 328
	atTable     = 576 + 64
)

// TestStreamWriterAttackOneSlotTwice: another process writes the slot of
// frame 0 into the table entry of frame 1 before the writer takes both
// back (Note [the slots a writer takes back] in package plane). The writer
// refuses it, naming the frame and both slots, instead of holding slot 0
// twice among its free ones and handing it to two frames in flight; once
// the entry is right again, every frame goes on in a slot of its own.
func TestStreamWriterAttackOneSlotTwice(t *testing.T) {
	t.Parallel()
	s := mustStream(t, frameConfig(4, 1, stream.Block))
	r := mustReader(t, s, 0)
	w := mustWriter(t, s)
	for seq := range uint64(4) {
		write(t, w, s, seq, time.Now())
	}
	for want := range uint64(2) {
		got, _ := readOne(t, s, r)
		require.Equal(t, want, got)
	}
	d := s.Segment().Data()
	binary.LittleEndian.PutUint32(d[atTable+4:], 0)
	_, err := w.Look(time.Now())
	require.ErrorIs(t, err, header.ErrCorrupt)
	require.ErrorContains(t, err, "frame 1 in slot 0, where its writer put it in slot 1")
	binary.LittleEndian.PutUint32(d[atTable+4:], 1)
	for seq := uint64(4); seq < 40; seq++ {
		write(t, w, s, seq, time.Now())
		got, _ := readOne(t, s, r)
		require.Equal(t, seq-2, got, "every frame in a slot of its own")
	}
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
}

// TestStreamWriterAttackTakeOverOneSlotTwice: a writer that takes the role
// over reads the slots of the frames in flight from the table, and refuses
// one slot twice there, letting the role go.
func TestStreamWriterAttackTakeOverOneSlotTwice(t *testing.T) {
	t.Parallel()
	s := mustStream(t, frameConfig(4, 1, stream.Block))
	r := mustReader(t, s, 0)
	w := mustWriter(t, s)
	for seq := range uint64(3) {
		write(t, w, s, seq, time.Now())
	}
	require.NoError(t, w.Close())
	d := s.Segment().Data()
	binary.LittleEndian.PutUint32(d[atTable+8:], 1) // frame 2 in frame 1's slot
	_, err := s.Writer()
	require.ErrorIs(t, err, header.ErrCorrupt)
	require.ErrorContains(t, err, "frames 1 and 2 in flight both in slot 1")
	binary.LittleEndian.PutUint32(d[atTable+8:], 2)
	w = mustWriter(t, s)
	for seq := uint64(3); seq < 12; seq++ {
		write(t, w, s, seq, time.Now())
		got, _ := readOne(t, s, r)
		require.Equal(t, seq-3, got)
	}
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
}

// TestStreamWriterAttackReaderFarBehind: a reader whose position is more
// than a ring behind the frames published (forged, or caught joining). A
// writer that takes the role over reads only the ring's frames in flight,
// at once (it walked every position in between, a trillion here), then
// waits for the reader, which skips to the oldest frame left; and it
// never takes one slot back twice.
func TestStreamWriterAttackReaderFarBehind(t *testing.T) {
	t.Parallel()
	for _, published := range []uint64{9, 100, 1<<40 + 2} {
		s := mustStream(t, frameConfig(4, 1, stream.Block))
		r := mustReader(t, s, 0)
		d := s.Segment().Data()
		binary.LittleEndian.PutUint64(d[atClaim:], published)
		binary.LittleEndian.PutUint64(d[atPublished:], published)
		start := time.Now()
		w := mustWriter(t, s)
		require.Less(t, time.Since(start), 10*time.Second, "the writer walked the positions")
		_, err := w.Look(time.Now())
		require.ErrorIs(t, err, stream.ErrFull, "the reader holds the ring")
		for range 4 {
			_, err := r.Look(time.Now())
			require.NoError(t, err)
			_, err = r.Increment()
			require.NoError(t, err)
		}
		st := rstats(t, r)
		require.Equal(t, stream.ReaderStats{Position: published, Received: 4, Dropped: published - 4}, st)
		for seq := range uint64(40) {
			write(t, w, s, seq, time.Now())
			got, _ := readOne(t, s, r)
			require.Equal(t, seq, got)
		}
		require.NoError(t, r.Close())
		require.NoError(t, w.Close())
	}
}
