package stream

import (
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/plane"
)

// TestSuspectsTellsWhatTheDataPlaneCan: Note [a writer's look for the dead]
// in package plane. A reader in slot 0 holds a full ring; the data plane's
// step says whether a look must go to Go to evict it, by the reader's
// process (none, a zombie, a pid out of range), and by when it was last
// seen; a reader that does not hold the writer back is never suspect, and
// a forged time does not overflow.
func TestSuspectsTellsWhatTheDataPlaneCan(t *testing.T) {
	s, err := Create("", Config{DType: dtype.Uint64, Shape: []int64{8}, Frames: 2, Readers: 1, Policy: Block,
		ReaderTimeout: time.Second})
	require.NoError(t, err)
	defer s.Close()
	slot := s.slot(0)
	forge := func(pid int64, pos uint64, seen int64) {
		atomic.StoreUint64(u64(slot, rPID), uint64(pid))
		atomic.StoreUint64(u64(slot, rPosition), pos)
		atomic.StoreInt64((*int64)(ptr(slot, rSeen)), seen)
		atomic.StoreUint64(u64(slot, rWord), slotWord(pid, 1, slotActive))
	}
	me := int64(os.Getpid())
	forge(me, 0, nowNS())
	w, err := s.Writer()
	require.NoError(t, err)
	defer w.Close()
	for range 2 { // the ring is full: slot 0 holds the writer back
		_, err = w.Look(time.Time{})
		require.NoError(t, err)
		require.NoError(t, w.Increment())
	}

	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	zombie := exec.Command("true")
	require.NoError(t, zombie.Start())
	defer func() { _ = zombie.Wait() }()
	require.Eventually(t, func() bool {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(zombie.Process.Pid) + "/stat")
		return err == nil && strings.Contains(string(stat), ") Z ")
	}, 10*time.Second, time.Millisecond, "the child never became a zombie")

	now := nowNS()
	for _, c := range []struct {
		name    string
		pid     int64
		pos     uint64
		seen    int64
		suspect bool
	}{
		{"alive, seen now", me, 0, now, false},
		{"no process", int64(dead.Process.Pid), 0, now, true},
		{"a zombie", int64(zombie.Process.Pid), 0, now, true},
		{"pid 0", 0, 0, now, true},
		{"pid past INT32_MAX (a process group to kill)", 1<<31 + 5, 0, now, true},
		{"alive, not seen for longer than the timeout", me, 0, now - 2*int64(time.Second), true},
		{"alive, seen at the dawn of time", me, 0, math.MinInt64, true},
		{"alive, seen in the far future", me, 0, math.MaxInt64, false},
		{"no process, but past the frame the claim needs", int64(dead.Process.Pid), 1, 0, false},
	} {
		forge(c.pid, c.pos, c.seen)
		var out plane.Out
		suspect, res := w.c.Suspects(now, &out)
		require.Equal(t, plane.OK, res, c.name)
		require.Equal(t, c.suspect, suspect, c.name)
	}
	forge(me, 0, nowNS()) // the writer's close finds a live reader
}
