package gotests

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/cuda"
	"github.com/zctipc/zctipc/go/fdpass"
	"github.com/zctipc/zctipc/go/usersock"
)

// fetchAsync runs cuda.Fetch(name) in a goroutine; the channel gets its
// error.
func fetchAsync(name string) <-chan error {
	done := make(chan error, 1)
	go func() {
		fd, _, _, err := cuda.Fetch(name)
		if err == nil {
			syscall.Close(fd)
		}
		done <- err
	}()
	return done
}

// A producer killed (SIGKILL) while a consumer's fetch waits on it, at
// whichever step of the exchange, means the allocation is no longer
// shared: Fetch says so (ErrNotShared, naming the process), not that the
// reply was malformed, and does not wait for its deadline.
func TestCudaFetchFromAProducerKilledMidExchangeSaysItIsGone(t *testing.T) {
	producer := startMockHelper(t, "mock-vmm-producer", "")
	name, _, _ := strings.Cut(producer.readLine(t), " ")
	pid := producer.cmd.Process.Pid
	require.NoError(t, producer.cmd.Process.Signal(syscall.SIGSTOP))
	waitStopped(t, pid)
	var pending []<-chan error
	for range 8 { // connected (in the backlog), or about to
		pending = append(pending, fetchAsync(name))
	}
	time.Sleep(100 * time.Millisecond) // let them connect; any that has not is refused the same
	require.NoError(t, producer.cmd.Process.Signal(syscall.SIGKILL))
	for _, done := range pending {
		select {
		case err := <-done:
			require.ErrorIs(t, err, cuda.ErrNotShared)
			require.ErrorContains(t, err, fmt.Sprintf("process %d", pid))
		case <-time.After(time.Minute):
			t.Fatal("Fetch did not return")
		}
	}
}

// A server that reads the request and hangs up without a word (its process
// died between the two) leaves Fetch with ErrNotShared.
func TestCudaFetchFromAServerThatHangsUpSaysItIsGone(t *testing.T) {
	const pid = 1<<22 + 4322
	name := fmt.Sprintf("%d-%032x", pid, 9)
	sock := filepath.Join(usersock.RuntimeDir(), fmt.Sprintf("cuda-%d.sock", pid))
	require.NoError(t, usersock.EnsureDir(usersock.RuntimeDir()))
	for _, step := range []string{"accepted", "read"} {
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
		require.NoError(t, err)
		go func() {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			if step == "read" {
				fdpass.Recv(c, make([]byte, 256), 0)
			}
			c.Close()
		}()
		err = fetchWithin(t, name)
		require.ErrorIs(t, err, cuda.ErrNotShared, step)
		require.ErrorContains(t, err, fmt.Sprintf("process %d", pid), step)
		ln.Close()
	}
}
