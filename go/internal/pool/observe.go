package pool

import (
	"sync/atomic"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/shm"
)

// ArenaState is what ObserveArena reads of an arena.
type ArenaState struct {
	SlotSize uint64
	Slots    uint32 // slots in the arena
	InUse    int64  // slots out of the free stack, held anywhere
	Class    int
	Tickets  bool   // its slots are descriptor tickets, not buffers
	Frees    uint32 // slots freed so far, modulo 2^32 (the futex word every free bumps)
}

// ObserveArena reads the state of arena m, any process's, mapped with or
// without a count, without writing anything. It checks the layout as a
// receiver of its slots does; a fault on its memory is an error.
func ObserveArena(m *shm.Mapping) (st ArenaState, err error) {
	// A file shrunk below the arena's words faults (Note [truncated while
	// observed] in package stream).
	err = fault.Catch(func() error {
		a, err := arenaOf(mapped{m})
		if err != nil {
			return err
		}
		st = ArenaState{
			SlotSize: a.slotSize, Slots: a.nslots, InUse: a.inUse(), Class: a.class, Tickets: a.tickets,
			Frees: atomic.LoadUint32(a.u32(offFreeSeq)),
		}
		return nil
	})
	return st, err
}
