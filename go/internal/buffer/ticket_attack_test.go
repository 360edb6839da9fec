package buffer_test

import (
	"encoding/binary"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// Attacks on descriptor tickets: forged ticket fields and forged ticket
// blocks. Each forged take must fail without taking anything (the slot or
// segment keeps its holders, the word it aimed at keeps its value), and the
// genuine descriptor is still taken once afterwards.

// sentSlot sends a count on a fresh 64-byte slot into descriptor bytes and
// returns them decoded, with the bytes.
func sentSlot(t *testing.T, p *pool.Pool) (message.Descriptor, []byte) {
	t.Helper()
	s, err := p.Alloc(64, time.Time{})
	require.NoError(t, err)
	b := send(t, buffer.NewSlotRef(s))
	d, _, err := message.DecodeDescriptor(b)
	require.NoError(t, err)
	return d, b
}

func TestForgedTicketsTakeNothing(t *testing.T) {
	p := pool.New(16 << 20)
	defer func() { require.NoError(t, p.Close()) }()

	// A buffer of the user's in a class-0 data arena (the class of ticket
	// arenas), whose first word the forger knows.
	victim, err := p.Alloc(64, time.Time{})
	require.NoError(t, err)
	defer func() { require.NoError(t, victim.Release()) }()
	known := uint64(0x0123456789abcdef)
	binary.LittleEndian.PutUint64(victim.Data(), known)

	tensor, err := shm.Create("", header.KindTensor, dtype.Uint8, []int64{64})
	require.NoError(t, err)
	defer func() { require.NoError(t, tensor.Close()) }()
	q := mustQueue(t, 4096, 0)

	link := shm.Prefix + "forged_ticket_link"
	cases := []struct {
		name  string
		forge func(real message.Ticket) message.Ticket
	}{
		{"wrong nonce", func(r message.Ticket) message.Ticket { r.Nonce ^= 2; return r }},
		{"slot past the arena", func(r message.Ticket) message.Ticket { r.Slot = 1<<20 + 5; return r }},
		{"last slot index", func(r message.Ticket) message.Ticket { r.Slot = ^uint32(0); return r }},
		{"a later generation", func(r message.Ticket) message.Ticket { r.Generation++; return r }},
		{"an earlier generation", func(r message.Ticket) message.Ticket { r.Generation--; return r }},
		{"a tensor segment", func(r message.Ticket) message.Ticket { r.Arena = tensor.Name(); return r }},
		{"a queue", func(r message.Ticket) message.Ticket { r.Arena = q.Segment().Name(); return r }},
		{"a name with a slash", func(r message.Ticket) message.Ticket { r.Arena = "../" + r.Arena; return r }},
		{"a name that is not there", func(r message.Ticket) message.Ticket { r.Arena = shm.RandomName(); return r }},
		{"a link to the ticket arena", func(r message.Ticket) message.Ticket { r.Arena = link; return r }},
		{"a data arena of class 0", func(r message.Ticket) message.Ticket {
			return message.Ticket{Arena: victim.Arena().Name(), Slot: victim.Index, Generation: victim.Generation, Nonce: known}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, _ := sentSlot(t, p)
			require.NoError(t, os.Symlink(shm.Dir()+"/"+d.Ticket.Arena, shm.Dir()+"/"+link))
			defer os.Remove(shm.Dir() + "/" + link)
			forged := d
			forged.Ticket = c.forge(d.Ticket)
			r, _, err := buffer.Adopt(&forged)
			require.Error(t, err, "a forged ticket took a count")
			require.Nil(t, r)
			require.Error(t, buffer.Drop(&forged), "a forged ticket dropped a count")
			require.EqualValues(t, 1, victim.Holders(), "the user's buffer keeps its one holder")
			require.Equal(t, known, binary.LittleEndian.Uint64(victim.Data()), "the user's bytes are untouched")
			// The genuine descriptor is still taken, once.
			owner, _, err := buffer.Adopt(&d)
			require.NoError(t, err, "the genuine take after a forged one")
			n, err := owner.Holders()
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			require.NoError(t, owner.Release())
		})
	}
	require.EqualValues(t, 1, p.Stats().SlotsInUse, "only the victim is in use")
}

// A descriptor whose ticket names a slot of a ticket arena as its memory
// (a ticket forged into a buffer) is refused, and the ticket is still taken
// once by its own descriptor.
func TestATicketSlotIsNotABuffer(t *testing.T) {
	p := pool.New(16 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	d, _ := sentSlot(t, p)
	forged := d
	forged.Name, forged.Slot, forged.Generation = d.Ticket.Arena, d.Ticket.Slot, d.Ticket.Generation
	forged.Ticket = message.Ticket{}
	forged.Shape, forged.Strides, forged.NBytes = []int64{8}, []int64{1}, 8
	r, _, err := buffer.Attach(&forged)
	require.Error(t, err, "a ticket attached as a buffer")
	require.Nil(t, r)
	owner, _, err := buffer.Adopt(&d)
	require.NoError(t, err)
	require.NoError(t, owner.Release())
	require.Zero(t, p.Stats().SlotsInUse)
}

// A slot's descriptor whose kind is forged to say "segment" (its name an
// arena's) is refused before its live ticket is taken: the genuine
// descriptor still takes the count, and nothing is left in use.
func TestASlotDescriptorForgedAsASegmentTakesNothing(t *testing.T) {
	p := pool.New(16 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	d, _ := sentSlot(t, p)
	forged := d
	forged.Kind = message.RefSegment
	forged.Slot, forged.Generation, forged.Offset = 0, 0, 0
	r, _, err := buffer.Adopt(&forged)
	require.Error(t, err, "a slot's descriptor adopted as a segment")
	require.ErrorIs(t, err, unix.EINVAL)
	require.Nil(t, r)
	require.Error(t, buffer.Drop(&forged), "a slot's descriptor dropped as a segment")
	owner, _, err := buffer.Adopt(&d)
	require.NoError(t, err, "the genuine descriptor after the forged one")
	require.NoError(t, owner.Release())
	require.Zero(t, p.Stats().SlotsInUse)
}

// Forged ticket blocks in descriptor bytes: cut short, a zero or too long
// name, flags bit 3 without a block, a block whose name runs past the
// bytes. Each decodes to ErrMalformed without reading past its bytes.
func TestForgedTicketBlocksAreMalformed(t *testing.T) {
	p := pool.New(16 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	d, b := sentSlot(t, p)
	defer func() {
		owner, _, err := buffer.Adopt(&d)
		require.NoError(t, err)
		require.NoError(t, owner.Release())
	}()
	noTicket := d
	noTicket.Ticket = message.Ticket{}
	plain := make([]byte, noTicket.Size())
	noTicket.Encode(plain)
	at := len(plain) // where the ticket block starts in b
	le := binary.LittleEndian
	cases := map[string]func() []byte{
		"bit 3 without a block": func() []byte {
			c := append([]byte(nil), plain...)
			c[3] |= 8
			return c
		},
		"bit 3 and a block of 8 bytes": func() []byte {
			c := append(append([]byte(nil), plain...), make([]byte, 8)...)
			c[3] |= 8
			le.PutUint16(c, uint16(len(c)))
			return c
		},
		"block cut short": func() []byte {
			c := append([]byte(nil), b[:at+16]...)
			le.PutUint16(c, uint16(len(c)))
			return c
		},
		"size says more than the bytes": func() []byte { return append([]byte(nil), b[:len(b)-8]...) },
		"name of 0 bytes": func() []byte {
			c := append([]byte(nil), b...)
			c[at+16] = 0
			return c
		},
		"name longer than the block": func() []byte {
			c := append([]byte(nil), b...)
			c[at+16] = 255
			return c
		},
		"nonce 0": func() []byte {
			c := append([]byte(nil), b...)
			le.PutUint64(c[at:], 0)
			return c
		},
	}
	for name, forge := range cases {
		t.Run(name, func(t *testing.T) {
			c := forge()
			// A copy whose end is unmapped memory would fault on an overread:
			// here the slice's capacity is its length, which the race
			// detector and the bounds checks watch.
			c = c[:len(c):len(c)]
			got, _, err := message.DecodeDescriptor(c)
			if err == nil {
				err = got.Check()
			}
			require.ErrorIs(t, err, message.ErrMalformed)
		})
	}
}

// A descriptor that carries no count (made by Describe and never sent: the
// bytes zct_ref_describe writes for zct_ref_attach) is attached any number
// of times, but never adopted: adopting it would make a second owner of
// the count its describer still holds, whose release frees the memory
// under the describer (and a later release of the describer's then takes a
// stranger's count).
func TestADescriptorThatCarriesNoCountIsNotAdopted(t *testing.T) {
	p := pool.New(16 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	for _, kind := range []string{"slot", "segment"} {
		t.Run(kind, func(t *testing.T) {
			r := newRef(t, p, kind)
			d, err := r.Describe(0, dtype.Uint8, []int64{64}, []int64{1}, 0)
			require.NoError(t, err)
			b := make([]byte, d.Size())
			d.Encode(b)
			for range 100 {
				a, _, err := buffer.Attach(&d)
				require.NoError(t, err)
				require.NoError(t, a.Release())
			}
			got, _, err := message.DecodeDescriptor(b)
			require.NoError(t, err)
			before, err := r.Holders()
			require.NoError(t, err)
			stolen, _, err := buffer.Adopt(&got)
			require.ErrorIs(t, err, buffer.ErrTaken, "a descriptor that carries no count was adopted")
			require.Nil(t, stolen)
			require.ErrorIs(t, buffer.Drop(&got), buffer.ErrTaken, "a descriptor that carries no count was dropped")
			n, err := r.Holders()
			require.NoError(t, err)
			require.Equal(t, before, n, "the describer is the one owner of its count")
			require.NoError(t, r.Release(), "the describer gives its count up, once")
			_, _, err = buffer.Attach(&d)
			require.Error(t, err, "memory let go of is not attached")
		})
	}
	require.Zero(t, p.Stats().SlotsInUse)
}

// Thousands of sends, in flight at once and one after another: every
// ticket goes back when its descriptor is taken, and the ticket arenas do
// not grow while the number in flight does not.
func TestTicketsDoNotLeakOrGrow(t *testing.T) {
	p := pool.New(64 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	files := func() int {
		names, err := shm.List()
		require.NoError(t, err)
		return len(names)
	}
	take := func(b []byte) {
		d, _, err := message.DecodeDescriptor(b)
		require.NoError(t, err)
		owner, _, err := buffer.Adopt(&d)
		require.NoError(t, err)
		require.NoError(t, owner.Release())
	}
	var wires [][]byte
	for range 3000 {
		_, b := sentSlot(t, p)
		wires = append(wires, b)
	}
	for _, b := range wires {
		take(b)
	}
	steady := files()
	for range 3 {
		for range 3000 {
			_, b := sentSlot(t, p)
			take(b)
		}
		require.Equal(t, steady, files(), "sends one at a time made ticket arenas")
		wires = wires[:0]
		for range 3000 {
			_, b := sentSlot(t, p)
			wires = append(wires, b)
		}
		for _, b := range wires {
			take(b)
		}
		require.Equal(t, steady, files(), "as many in flight as before made ticket arenas")
	}
	require.Zero(t, p.Stats().SlotsInUse)
}

// Attacks on a sent ref (Sent spends it): released twice, described, sent
// again, lost after the send. None of them gives up, takes or re-sends the
// message's count: the receiver is its one holder, and once it lets go the
// memory is gone.
func TestASentRefStaysSpent(t *testing.T) {
	p := pool.New(16 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	for _, kind := range []string{"slot", "segment"} {
		t.Run(kind, func(t *testing.T) {
			r := newRef(t, p, kind)
			name := ""
			if seg := r.Segment(); seg != nil {
				name = seg.Name()
			}
			b := send(t, r)
			for range 2 {
				require.NoError(t, r.Release(), "a release after the send")
				_, err := r.Describe(0, dtype.Uint8, []int64{64}, []int64{1}, 0)
				require.ErrorIs(t, err, buffer.ErrTaken, "a description after the send")
			}
			// Sent or Lost again: the segment handle is closed already
			// (shm.ErrClosed), and no count moves.
			if err := buffer.Sent([]*buffer.Ref{r}); err != nil {
				require.ErrorIs(t, err, shm.ErrClosed)
			}
			if err := buffer.Lost([]*buffer.Ref{r}); err != nil {
				require.ErrorIs(t, err, shm.ErrClosed)
			}
			require.NoError(t, r.Release())
			got, err := take(b)
			require.NoError(t, err)
			holders, err := got.Holders()
			require.NoError(t, err)
			require.EqualValues(t, 1, holders, "the receiver holds the count alone")
			if name != "" {
				info, err := shm.Stat(name)
				require.NoError(t, err, "the segment is still there for the receiver")
				require.EqualValues(t, 1, info.Header.Refcount)
			}
			require.NoError(t, got.Release())
			require.Zero(t, p.Stats().SlotsInUse)
			if name != "" {
				_, err := shm.Stat(name)
				require.ErrorIs(t, err, unix.ENOENT, "the receiver's release let it go")
			}
		})
	}
}

// A received slot ref sent on again: the second receiver holds the count
// alone. (A received segment ref's count is this process's own, which the
// close in Sent gives up: sending one on directly loses the message's count,
// so every sender finds its memory again with Find, a count of its own.)
func TestAReceivedRefSentOnIsHeldOnce(t *testing.T) {
	p := pool.New(16 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	for _, kind := range []string{"slot"} {
		t.Run(kind, func(t *testing.T) {
			r := newRef(t, p, kind)
			name := ""
			if seg := r.Segment(); seg != nil {
				name = seg.Name()
			}
			relay, err := take(send(t, r))
			require.NoError(t, err)
			b := send(t, relay)
			require.NoError(t, relay.Release())
			got, err := take(b)
			require.NoError(t, err)
			holders, err := got.Holders()
			require.NoError(t, err)
			require.EqualValues(t, 1, holders, "the second receiver holds the count alone")
			if name != "" {
				info, err := shm.Stat(name)
				require.NoError(t, err, "the segment is still there for the second receiver")
				require.EqualValues(t, 1, info.Header.Refcount)
			}
			require.NoError(t, got.Release())
			require.Zero(t, p.Stats().SlotsInUse)
			if name != "" {
				_, err := shm.Stat(name)
				require.ErrorIs(t, err, unix.ENOENT)
			}
		})
	}
}

// Sent of a ref that Lost spent already moves no count: the lost count
// stays where it was (lost), and Release gives up nothing.
func TestSentAfterLostMovesNothing(t *testing.T) {
	p := pool.New(16 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	for _, kind := range []string{"slot", "segment"} {
		t.Run(kind, func(t *testing.T) {
			var r *buffer.Ref
			var slot pool.Slot
			if kind == "slot" {
				var err error
				slot, err = p.Alloc(64, time.Time{})
				require.NoError(t, err)
				r = buffer.NewSlotRef(slot)
			} else {
				r = newRef(t, p, kind)
			}
			before, err := r.Holders()
			require.NoError(t, err)
			name := ""
			if seg := r.Segment(); seg != nil {
				name = seg.Name()
			}
			require.NoError(t, buffer.Lost([]*buffer.Ref{r}))
			if err := buffer.Sent([]*buffer.Ref{r}); err != nil {
				require.ErrorIs(t, err, shm.ErrClosed)
			}
			require.NoError(t, r.Release())
			_, err = r.Describe(0, dtype.Uint8, []int64{64}, []int64{1}, 0)
			require.ErrorIs(t, err, buffer.ErrTaken)
			if name != "" {
				info, err := shm.Stat(name)
				require.NoError(t, err)
				// The handle Lost closed gave back this process's count; the
				// ref's own (lost) is still there.
				require.EqualValues(t, before-1, info.Header.Refcount, "the lost count is still there")
				require.NoError(t, shm.DropRef(name, header.KindTensor)) // the test gives it up
				_, err = shm.Stat(name)
				require.ErrorIs(t, err, unix.ENOENT)
				return
			}
			require.Equal(t, before, slot.Holders(), "the lost count is still there")
			require.NoError(t, slot.Release()) // the test gives it up
			require.Zero(t, p.Stats().SlotsInUse)
		})
	}
}
