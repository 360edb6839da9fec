package futex_test

import (
	"os"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/futex"
	"golang.org/x/sys/unix"
)

// TestSeqSleepPolicies: every policy wakes for a bump and times out at its
// deadline; a poller for ever never counts itself among the sleepers.
func TestSeqSleepPolicies(t *testing.T) {
	for name, p := range map[string]futex.Policy{
		"sleep":          futex.Sleeping,
		"sleep, paced":   futex.NewSleeping(),
		"poll for ever":  {Poll: true, Spin: -1},
		"poll, to sleep": {Poll: true, Spin: time.Millisecond},
	} {
		t.Run(name, func(t *testing.T) {
			var word, waiters uint32
			s := futex.Seq{Word: &word, Waiters: &waiters}
			var sawSleeper atomic.Bool
			signalled := make(chan error, 1)
			go func() {
				time.Sleep(20 * time.Millisecond)
				sawSleeper.Store(atomic.LoadUint32(&waiters) > 0)
				signalled <- s.Signal(1)
			}()
			start := time.Now()
			for atomic.LoadUint32(&word) == 0 { // a wake may be spurious: callers look again
				require.NoError(t, s.Sleep(0, p, time.Now().Add(10*time.Second), time.Second, false))
			}
			require.NoError(t, <-signalled)
			require.Less(t, time.Since(start), 5*time.Second)
			if p.Spin < 0 {
				require.False(t, sawSleeper.Load(), "a poller for ever never sleeps")
			}
			start = time.Now()
			deadline := start.Add(30 * time.Millisecond)
			err := s.Sleep(1, p, deadline, time.Second, false)
			for err == nil && atomic.LoadUint32(&word) == 1 { // spurious: look again
				err = s.Sleep(1, p, deadline, time.Second, false)
			}
			require.ErrorIs(t, err, futex.ErrTimeout)
			require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
		})
	}
}

// A Pace stretches the spin to twice the recent wait while waits are short,
// up to 200 µs, leaves the policy's spin otherwise, and forgets a long idle
// spell within a few dozen short waits.
func TestPaceFollowsRecentWaits(t *testing.T) {
	const base = 50 * time.Microsecond
	var p futex.Pace
	require.Equal(t, base, p.Spin(base), "nothing observed yet")
	for range 20 {
		p.Observe(80 * time.Microsecond)
	}
	require.Equal(t, 160*time.Microsecond, p.Spin(base), "steady 80 µs waits")
	for range 20 {
		p.Observe(10 * time.Microsecond)
	}
	require.Equal(t, base, p.Spin(base), "never below the policy's spin")
	p.Observe(150 * time.Microsecond)
	p.Observe(150 * time.Microsecond)
	require.LessOrEqual(t, p.Spin(base), 200*time.Microsecond, "bounded")
	p.Observe(time.Hour) // an idle spell
	require.Equal(t, base, p.Spin(base), "sparse events: the policy's spin")
	n := 0
	for ; p.Spin(base) == base && n < 100; n++ {
		p.Observe(60 * time.Microsecond)
	}
	require.Less(t, n, 40, "forgotten within a few dozen waits")
}

// A word on a page past the end of a shrunk file: the kernel's read of it
// fails (EFAULT), which is the fault a load would have met, so Wait and
// Wake say fault.ErrFault as every step on that memory does.
func TestAWordPastAShrunkFilesEndFaults(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "word")
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(4096))
	mem, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer func() { require.NoError(t, unix.Munmap(mem)) }()
	word := (*uint32)(unsafe.Pointer(&mem[0]))
	require.NoError(t, futex.Wait(word, 1, time.Millisecond)) // the value differs: no sleep
	require.NoError(t, f.Truncate(0))                         // the hostile process

	err = futex.Wait(word, 0, time.Second)
	require.ErrorIs(t, err, fault.ErrFault)
	_, err = futex.Wake(word, 1)
	require.ErrorIs(t, err, fault.ErrFault)
}
