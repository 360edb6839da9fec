package event_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/event"
)

func TestEventAcrossGoroutinesAndTimeouts(t *testing.T) {
	e, err := event.Create("")
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	require.False(t, isSet(t, e))
	start := time.Now()
	set, err := e.Wait(time.Now().Add(30 * time.Millisecond))
	require.NoError(t, err)
	require.False(t, set)
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
	other, err := event.Attach(e.Segment().Name())
	require.NoError(t, err)
	done := make(chan bool)
	go func() {
		ok, _ := other.Wait(time.Time{})
		done <- ok
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, e.Set())
	require.True(t, <-done)
	require.True(t, isSet(t, other))
	require.NoError(t, other.Clear())
	require.False(t, isSet(t, e))
	require.NoError(t, other.Close())
}

func isSet(t *testing.T, e *event.Event) bool {
	t.Helper()
	set, err := e.IsSet()
	require.NoError(t, err)
	return set
}
