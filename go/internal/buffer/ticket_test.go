package buffer_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/shm"
)

// send describes r's whole region and sends its count into descriptor
// bytes, as a pickle or a queue record carries them.
func send(t *testing.T, r *buffer.Ref) []byte {
	t.Helper()
	d, err := r.Describe(0, dtype.Uint8, []int64{64}, []int64{1}, 0)
	require.NoError(t, err, "Describe")
	buf := make([]byte, d.Size())
	sent, err := buffer.Send([]*buffer.Ref{r}, func() error { d.Encode(buf); return nil })
	require.True(t, sent)
	require.NoError(t, err)
	return buf
}

// take decodes descriptor bytes and takes the count they carry.
func take(b []byte) (*buffer.Ref, error) {
	d, _, err := message.DecodeDescriptor(b)
	if err != nil {
		return nil, err
	}
	r, _, err := buffer.Adopt(&d)
	return r, err
}

// Bytes of one sent descriptor, taken twice (its sender's ref released
// and described again after the send): the second take fails with
// ErrTaken and takes nothing, so the first taker stays the one owner of the
// count (before, both took it, and the first release freed memory the
// other still used).
func TestADescriptorIsTakenOnce(t *testing.T) {
	p := pool.New(16 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	for _, kind := range []string{"slot", "segment"} {
		t.Run(kind, func(t *testing.T) {
			r := newRef(t, p, kind)
			b := send(t, r)
			// The sent ref is spent: a release or a description after the
			// send cannot take the count from under the receiver.
			require.NoError(t, r.Release(), "a release after the send")
			_, err := r.Describe(0, dtype.Uint8, []int64{64}, []int64{1}, 0)
			require.ErrorIs(t, err, buffer.ErrTaken, "a description after the send")
			first, err := take(b)
			require.NoError(t, err)
			second, err := take(b)
			require.ErrorIs(t, err, buffer.ErrTaken, "a replayed descriptor")
			require.Nil(t, second)
			holders, err := first.Holders()
			require.NoError(t, err)
			require.EqualValues(t, 1, holders, "one count, one owner")
			require.NoError(t, first.Release())
			d, _, err := message.DecodeDescriptor(b)
			require.NoError(t, err)
			require.ErrorIs(t, buffer.Drop(&d), buffer.ErrTaken, "dropping a replay gives up nothing")
			require.Zero(t, p.Stats().SlotsInUse)
		})
	}
}

func mustQueue(t *testing.T, capacity, maxItems uint64) *queue.Queue {
	t.Helper()
	q, err := queue.Create("", capacity, maxItems)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, q.Close()) })
	return q
}

// newRef returns a count on new memory: a pool slot, or a tensor segment.
func newRef(t *testing.T, p *pool.Pool, kind string) *buffer.Ref {
	t.Helper()
	if kind == "slot" {
		s, err := p.Alloc(64, time.Time{})
		require.NoError(t, err)
		return buffer.NewSlotRef(s)
	}
	seg, err := shm.Create("", header.KindTensor, dtype.Uint8, []int64{64})
	require.NoError(t, err)
	r, _, ok, err := buffer.Find(uintptrOf(seg.Data()), 64)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, seg.Close()) // the ref's count keeps it
	return r
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// TestDescriptorOwnershipModel runs random sequences of allocations,
// sends, takes (of descriptors taken before too: replays), releases and
// drops against a model in which every count has one owner: a take
// succeeds exactly when its descriptor was not taken, each memory's count
// is the number of owners the model gives it, and when all is released
// nothing is in use.
func TestDescriptorOwnershipModel(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			p := pool.New(16 << 20)
			defer func() { require.NoError(t, p.Close()) }()
			type owned struct {
				r        *buffer.Ref
				mem      int  // which memory the model says it counts on
				sendable bool // a count of its own (Find); a taken one is sent by finding it again
			}
			type wire struct {
				b     []byte
				mem   int
				taken bool
			}
			var held []owned
			var wires []*wire
			counts := map[int]int{} // memory -> counts the model knows (held or in flight)
			var kinds []string      // the kind of each memory
			// A slot's count is its owners'; a segment's counts one per
			// process besides, so only slots are compared.
			check := func(step int) {
				for mem, n := range counts {
					if n == 0 || kinds[mem] != "slot" {
						continue
					}
					for _, h := range held {
						if h.mem == mem {
							got, err := h.r.Holders()
							require.NoError(t, err)
							require.EqualValues(t, n, got, "step %d: memory %d", step, mem)
							break
						}
					}
				}
			}
			for step := range 400 {
				switch op := rng.IntN(10); {
				case op < 2 || len(held) == 0: // new memory
					mem := len(kinds)
					kind := [2]string{"slot", "segment"}[rng.IntN(2)]
					r := newRef(t, p, kind)
					kinds = append(kinds, kind)
					held = append(held, owned{r, mem, true})
					counts[mem] = 1
				case op < 4: // another count on a held memory, sent
					h := held[rng.IntN(len(held))]
					r, _, ok, err := buffer.Find(uintptrOf(h.r.Data()), 64) // a count of its own, then sent
					require.NoError(t, err)
					require.True(t, ok)
					counts[h.mem]++
					wires = append(wires, &wire{b: send(t, r), mem: h.mem})
				case op < 5: // send a held count itself
					i := rng.IntN(len(held))
					h := held[i]
					if !h.sendable {
						continue
					}
					held = append(held[:i], held[i+1:]...)
					wires = append(wires, &wire{b: send(t, h.r), mem: h.mem})
				case op < 8 && len(wires) > 0: // take, or replay
					w := wires[rng.IntN(len(wires))]
					r, err := take(w.b)
					if w.taken {
						require.ErrorIs(t, err, buffer.ErrTaken, "step %d: a replay took a count", step)
						continue
					}
					require.NoError(t, err, "step %d", step)
					w.taken = true
					held = append(held, owned{r, w.mem, kinds[w.mem] == "slot"})
				default: // release
					i := rng.IntN(len(held))
					h := held[i]
					held = append(held[:i], held[i+1:]...)
					require.NoError(t, h.r.Release())
					counts[h.mem]--
				}
				check(step)
			}
			for _, h := range held {
				require.NoError(t, h.r.Release())
			}
			for _, w := range wires {
				d, _, err := message.DecodeDescriptor(w.b)
				require.NoError(t, err)
				if w.taken {
					require.ErrorIs(t, buffer.Drop(&d), buffer.ErrTaken)
				} else {
					require.NoError(t, buffer.Drop(&d), "an untaken descriptor gives up its count")
				}
			}
			require.Zero(t, p.Stats().SlotsInUse, "every count was given up once")
		})
	}
}

// A queue record written again by a forged writer (the bytes of a record
// another process put) brings no second count: its receiver's take fails
// with ErrTaken, and the first receiver stays the one owner.
func TestAReplayedQueueRecordTakesNothing(t *testing.T) {
	p := pool.New(16 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	q := mustQueue(t, 4096, 0)
	r := newRef(t, p, "slot")
	d, err := r.Describe(0, dtype.Uint8, []int64{64}, []int64{1}, 0)
	require.NoError(t, err)
	rec := &message.Record{Type: message.TypeTensor, Descriptors: []message.Descriptor{d}}
	sent, err := buffer.Send([]*buffer.Ref{r}, func() error { return q.Put(rec, time.Time{}) })
	require.True(t, sent)
	require.NoError(t, err)

	buf := make([]byte, 4096)
	n, err := q.Get(buf, 16, time.Time{})
	require.NoError(t, err)
	raw := append([]byte(nil), buf[:n]...)
	for range 2 { // the record, and the forged writer's copy of it
		again, err := message.DecodeRecord(raw)
		require.NoError(t, err)
		require.NoError(t, q.Put(&again, time.Time{}))
	}
	var takes []error
	var owner *buffer.Ref
	for range 2 {
		n, err := q.Get(buf, 16, time.Time{})
		require.NoError(t, err)
		got, err := message.DecodeRecord(buf[:n])
		require.NoError(t, err)
		r, _, err := buffer.Adopt(&got.Descriptors[0])
		if err == nil {
			owner = r
		}
		takes = append(takes, err)
	}
	require.NoError(t, takes[0], "the first copy is taken")
	require.ErrorIs(t, takes[1], buffer.ErrTaken, "its replay is not")
	require.NotNil(t, owner)
	n2, err := owner.Holders()
	require.NoError(t, err)
	require.EqualValues(t, 1, n2)
	require.NoError(t, owner.Release())
	require.Zero(t, p.Stats().SlotsInUse)
}
