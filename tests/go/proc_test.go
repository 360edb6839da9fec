package gotests

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/proc"
	"golang.org/x/sys/unix"
)

func TestProcIdentity(t *testing.T) {
	self, err := proc.Self()
	require.NoError(t, err)
	require.EqualValues(t, os.Getpid(), self.PID)
	require.Positive(t, self.StartTime)
	require.True(t, proc.Alive(self))

	require.False(t, proc.Alive(proc.Identity{PID: self.PID, StartTime: self.StartTime + 1}), "a reused pid is another process")
	require.False(t, proc.Alive(proc.Identity{}))

	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	start, err := proc.StartTime(int64(cmd.Process.Pid))
	require.NoError(t, err)
	child := proc.Identity{PID: int64(cmd.Process.Pid), StartTime: start}
	require.True(t, proc.Alive(child))
	require.NoError(t, cmd.Process.Kill())
	require.Error(t, cmd.Wait())
	require.False(t, proc.Alive(child))
	_, err = proc.StartTime(int64(cmd.Process.Pid))
	require.ErrorIs(t, err, unix.ESRCH)
}
