package pool

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/plane"
	"github.com/zctipc/zctipc/go/internal/shm"
)

// cut shrinks the file of owned arena a to nothing (the hostile process):
// its words share the first page with the segment's header, and every one
// of them then lies past the file's end. It returns the file's path.
func cut(t *testing.T, a *Arena) string {
	t.Helper()
	path := filepath.Join(shm.Dir(), a.Name())
	require.NoError(t, os.Truncate(path, 0))
	return path
}

// forgetCut lets go of pool p, whose arena a was cut: its Close meets the
// fault in Go, on the segment's count (as a queue's does); a is taken out
// of the index, to stay mapped, unused, and its file removed.
func forgetCut(p *Pool, a *Arena, path string) error {
	_ = fault.Catch(p.Close)
	removeFromIndex(a)
	return os.Remove(path)
}

// An arena whose file another process of the user shrank: each step of the
// slot protocol, the data plane's (Note [a pool slot's steps in the plane]
// in package plane), faults inside C and returns the fault as an error
// wrapping fault.ErrFault, never killing the process.
func TestAShrunkArenaFaultsIntoAnError(t *testing.T) {
	p := New(64 << 20)
	s, err := p.Alloc(100, time.Time{})
	require.NoError(t, err)
	a := s.arena
	path := cut(t, a)

	_, _, err = a.pop()
	require.ErrorIs(t, err, fault.ErrFault, "pop")
	_, _, err = a.take()
	require.ErrorIs(t, err, fault.ErrFault, "take")
	require.ErrorIs(t, a.push(s.Index+1), fault.ErrFault, "push")
	_, _, err = a.view.HandOut(s.Index)
	require.ErrorIs(t, err, fault.ErrFault, "hand out")
	_, err = s.AddRef()
	require.ErrorIs(t, err, fault.ErrFault, "add ref")
	require.ErrorIs(t, s.Release(), fault.ErrFault, "release")
	_, err = Adopt(a.Name(), s.Index, s.Generation)
	require.ErrorIs(t, err, fault.ErrFault, "adopt's check")

	require.NoError(t, forgetCut(p, a, path))
}

// A ticket arena shrunk the same way: arming, disarming and taking a
// ticket each report the fault (Arm, which returns no error, panics into
// the caller's fault.Catch, as a store in Go did).
func TestAShrunkTicketArenaFaultsIntoAnError(t *testing.T) {
	tk, err := NewTicket()
	require.NoError(t, err)
	path := cut(t, tk.Slot.arena)

	require.ErrorIs(t, fault.Catch(func() error { tk.Arm(); return nil }), fault.ErrFault, "arm")
	require.ErrorIs(t, tk.Disarm(), fault.ErrFault, "disarm")
	s := tk.Slot
	require.ErrorIs(t, TakeTicket(s.arena.Name(), s.Index, s.Generation, tk.Nonce), fault.ErrFault, "take")
	_, err = s.arena.view.TakeTicket(s.Index, tk.Nonce)
	require.ErrorIs(t, err, fault.ErrFault, "the take's exchange")

	// Later tickets come from a new ticket pool.
	ticketPool.Lock()
	tp := ticketPool.p
	ticketPool.p = nil
	ticketPool.Unlock()
	require.NoError(t, forgetCut(tp, s.arena, path))
}

// A slot index past the arena (a forged descriptor's, were the C ABI to
// hand one to a step unchecked) is refused by each step before it touches
// memory: plane.Range, or plane.Corrupt for the check.
func TestAStepRefusesASlotPastTheArena(t *testing.T) {
	p := New(64 << 20)
	defer func() { require.NoError(t, p.Close()) }()
	s, err := p.Alloc(100, time.Time{})
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Release()) }()
	a, past := s.arena, s.arena.nslots
	for what, step := range map[string]func() (int, error){
		"push":     func() (int, error) { return a.view.Push(past) },
		"hand out": func() (int, error) { _, r, err := a.view.HandOut(past); return r, err },
		"add ref":  func() (int, error) { _, r, err := a.view.AddRef(past, 1); return r, err },
		"release":  func() (int, error) { _, r, err := a.view.Release(past); return r, err },
		"arm":      func() (int, error) { return a.view.ArmTicket(past, 1) },
		"take":     func() (int, error) { return a.view.TakeTicket(past, 1) },
	} {
		r, err := step()
		require.NoError(t, err, what)
		require.Equal(t, plane.Range, r, what)
	}
	r, err := a.view.Check(past, s.Generation)
	require.NoError(t, err)
	require.Equal(t, plane.Corrupt, r)
	require.EqualValues(t, 1, s.Holders(), "nothing moved")
}
