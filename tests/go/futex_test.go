package gotests

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/futex"
)

// TestSeqSleepPolicies: every policy wakes for a bump and times out at its
// deadline; a poller for ever never counts itself among the sleepers.
func TestSeqSleepPolicies(t *testing.T) {
	for name, p := range map[string]futex.Policy{
		"sleep":          futex.Sleeping,
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
