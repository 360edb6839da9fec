package buffer_test

import (
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/stream"
)

// Attacks on take's check of a segment descriptor whose live ticket is a
// slot's: the forged descriptor names files of every other kind, names
// that are not there or not plain, and a segment removed under it. Each
// forged take is refused without taking the ticket, so the genuine
// descriptor still takes its count, once, and nothing stays in use.

// forgedSegment returns the slot's descriptor d with its kind forged to say
// "segment" and its name replaced.
func forgedSegment(d message.Descriptor, name string) message.Descriptor {
	f := d
	f.Kind = message.RefSegment
	f.Slot, f.Generation, f.Offset = 0, 0, 0
	f.Name = name
	return f
}

// genuineTakesOnce adopts the genuine descriptor d, which must succeed once,
// and a replay of it, which must not.
func genuineTakesOnce(t *testing.T, d message.Descriptor) {
	t.Helper()
	owner, _, err := buffer.Adopt(&d)
	require.NoError(t, err, "the genuine descriptor after the forged one")
	n, err := owner.Holders()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	replay := d
	r, _, err := buffer.Adopt(&replay)
	require.Error(t, err, "a replay of the genuine descriptor took a count")
	require.Nil(t, r)
	require.Error(t, buffer.Drop(&replay), "a replay of the genuine descriptor dropped a count")
	require.NoError(t, owner.Release())
}

func TestASlotDescriptorForgedAsASegmentOfAnyOtherFile(t *testing.T) {
	p := pool.New(16 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	q := mustQueue(t, 4096, 0)
	st, err := stream.Create("", stream.Config{DType: dtype.Uint8, Shape: []int64{64}, Frames: 2, Readers: 1})
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Close()) }()
	led, err := shm.Create("", header.KindLedger, dtype.Uint8, []int64{4096})
	require.NoError(t, err)
	defer func() { require.NoError(t, led.Close()) }()
	table, err := shm.Create("", header.KindTable, dtype.Uint8, []int64{4096})
	require.NoError(t, err)
	defer func() { require.NoError(t, table.Close()) }()
	// A file that is no segment at all: its header does not read.
	junk := shm.Prefix + "forged_junk_file"
	require.NoError(t, os.WriteFile(shm.Dir()+"/"+junk, []byte("not a segment"), 0o600))
	defer os.Remove(shm.Dir() + "/" + junk)

	cases := map[string]func(d message.Descriptor) string{
		"its ticket arena":      func(d message.Descriptor) string { return d.Ticket.Arena },
		"a queue ring":          func(message.Descriptor) string { return q.Segment().Name() },
		"a stream":              func(message.Descriptor) string { return st.Segment().Name() },
		"a ledger":              func(message.Descriptor) string { return led.Name() },
		"an arrow table":        func(message.Descriptor) string { return table.Name() },
		"a file with no header": func(message.Descriptor) string { return junk },
		"a name not there":      func(message.Descriptor) string { return shm.RandomName() },
		"dot dot":               func(d message.Descriptor) string { return "../" + strings.TrimPrefix(d.Name, "/") },
		"a slash inside":        func(d message.Descriptor) string { return "zctipc_x/" + strings.TrimPrefix(d.Name, "/") },
		"its own arena, ..'d":   func(d message.Descriptor) string { return "../shm/" + strings.TrimPrefix(d.Name, "/") },
	}
	for name, forge := range cases {
		t.Run(name, func(t *testing.T) {
			d, _ := sentSlot(t, p)
			forged := forgedSegment(d, forge(d))
			if forged.Check() == nil { // a name the format refuses is refused by the check
				r, _, err := buffer.Adopt(&forged)
				require.Error(t, err, "a slot's descriptor adopted as a segment named %q", forged.Name)
				require.Nil(t, r)
				require.Error(t, buffer.Drop(&forged), "a slot's descriptor dropped as a segment")
			}
			genuineTakesOnce(t, d)
		})
	}
	require.Zero(t, p.Stats().SlotsInUse)
}

// A forged segment descriptor that names a file of another kind, removed
// while the forged descriptor is taken: whichever way the race goes, the
// forged take is refused and takes nothing, and the genuine descriptor
// still takes its count once.
func TestASlotDescriptorForgedAsASegmentRemovedMeanwhile(t *testing.T) {
	p := pool.New(16 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	for i := 0; i < 50; i++ {
		d, _ := sentSlot(t, p)
		seg, err := shm.Create("", header.KindQueue, dtype.Uint8, []int64{4096})
		require.NoError(t, err)
		forged := forgedSegment(d, seg.Name())
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, seg.Close()) // its one holder: the file goes
		}()
		r, _, err := buffer.Adopt(&forged)
		wg.Wait()
		require.Error(t, err, "a slot's descriptor adopted as a segment")
		require.Nil(t, r)
		genuineTakesOnce(t, d)
	}
	require.Zero(t, p.Stats().SlotsInUse)
}
