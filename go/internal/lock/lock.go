// Package lock is a mutex in memory shared between processes that a killed
// holder cannot keep locked.
//
// A plain process-shared mutex stays locked forever when its holder is
// killed, and every other process waits on it. Here the lock word holds the
// holder's pid, and a record next to it holds the pid and the process start
// time. A waiter that has waited a while checks that process: if it is gone,
// or its pid now belongs to another process, the waiter takes the lock over
// and is told so, and must then bring the state the lock guards back to
// consistency (the structures in this module commit every change with one
// final store, so there is nothing to undo).
//
// All processes that share a lock must see the same pids: they share a pid
// namespace.
package lock

import (
	"errors"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/proc"
)

// Size is the number of bytes a Mutex occupies in shared memory; its address
// must be 8-byte aligned.
const Size = 16

const (
	contended = 1 << 31
	spins     = 64
	// checkEvery is how long a waiter sleeps before it checks whether the
	// holder is still alive.
	checkEvery = 20 * time.Millisecond
)

// ErrTimeout is returned by Lock when the deadline passed first.
var ErrTimeout = errors.New("timed out waiting for a lock")

// Mutex is a lock over Size bytes of shared memory, zero when unlocked:
//
//	+0  u32  state: 0 when free, else the holder's pid, with bit 31 set when
//	         others may be waiting
//	+4  u32  the holder's pid, written after state
//	+8  u64  the holder's process start time
//
// It is safe for concurrent use by the goroutines of one process and by
// processes alike: a goroutine waits for the lock another of its process
// holds.
type Mutex struct {
	state      *uint32
	ownerPID   *uint32
	ownerStart *uint64
}

// At returns the Mutex at p, which must point to Size bytes of shared memory.
func At(p unsafe.Pointer) Mutex {
	return Mutex{
		state:      (*uint32)(p),
		ownerPID:   (*uint32)(unsafe.Add(p, 4)),
		ownerStart: (*uint64)(unsafe.Add(p, 8)),
	}
}

// TryLock acquires m if it is free, without waiting and without reading the
// clock: the fast path of a call that finds the lock free.
func (m Mutex) TryLock() (bool, error) {
	self, err := proc.Self()
	if err != nil {
		return false, err
	}
	return plane.TryLock(unsafe.Pointer(m.state), uint32(self.PID), self.StartTime)
}

// Lock acquires m, waiting until deadline (forever if it is zero). It
// returns recovered=true when it took the lock over from a holder that died:
// the caller must then repair what the lock guards.
func (m Mutex) Lock(deadline time.Time) (recovered bool, err error) {
	self, err := proc.Self()
	if err != nil {
		return false, err
	}
	pid := uint32(self.PID)
	for range spins {
		if atomic.LoadUint32(m.state) == 0 && atomic.CompareAndSwapUint32(m.state, 0, pid) {
			m.setOwner(self)
			return false, nil
		}
	}
	for {
		v := atomic.LoadUint32(m.state)
		if v == 0 {
			// Taken as contended: others may be asleep behind us.
			if atomic.CompareAndSwapUint32(m.state, 0, pid|contended) {
				m.setOwner(self)
				return false, nil
			}
			continue
		}
		if v&contended == 0 && !atomic.CompareAndSwapUint32(m.state, v, v|contended) {
			continue
		}
		wait := checkEvery
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return false, ErrTimeout
			}
			wait = min(wait, left)
		}
		switch err := futex.Wait(m.state, v|contended, wait); {
		case errors.Is(err, futex.ErrTimeout):
			if m.holderDied(v&^contended) && atomic.CompareAndSwapUint32(m.state, v|contended, pid|contended) {
				m.setOwner(self)
				return true, nil
			}
		case errors.Is(err, futex.ErrInterrupted):
			// Held locks are held briefly: keep waiting.
		case err != nil:
			return false, err
		}
	}
}

// Unlock releases m, which the calling process holds: the data plane's
// step (package plane), which every holder uses. It fails only when the
// lock's memory faulted (a shrunk file).
func (m Mutex) Unlock() error { return plane.Unlock(unsafe.Pointer(m.state)) }

func (m Mutex) setOwner(self proc.Identity) {
	atomic.StoreUint64(m.ownerStart, self.StartTime)
	atomic.StoreUint32(m.ownerPID, uint32(self.PID))
}

// holderDied reports whether the process pid that holds m is gone.
func (m Mutex) holderDied(pid uint32) bool {
	recorded := proc.Identity{PID: int64(atomic.LoadUint32(m.ownerPID)), StartTime: atomic.LoadUint64(m.ownerStart)}
	return proc.Gone(int64(pid), recorded)
}

// Holder returns the pid of the process that holds m, or 0 when it is free.
func (m Mutex) Holder() int64 { return int64(atomic.LoadUint32(m.state) &^ contended) }
