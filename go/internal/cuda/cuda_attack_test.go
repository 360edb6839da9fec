package cuda_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/cuda"
	"github.com/zctipc/zctipc/go/internal/cudatest"
	"github.com/zctipc/zctipc/go/internal/fdpass"
	"github.com/zctipc/zctipc/go/internal/testenv"
)

// A producer killed (SIGKILL) while a consumer's fetch waits on it, at
// whichever step of the exchange, means the allocation is no longer
// shared: Fetch says so (ErrNotShared, naming the process), not that the
// reply was malformed, and does not wait for its deadline.
func TestCudaFetchFromAProducerKilledMidExchangeSaysItIsGone(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	producer, name, pid := startStoppedProducer(t)
	var pending []<-chan error
	for range 8 { // connected (in the backlog), or about to
		pending = append(pending, fetchAsync(name))
	}
	time.Sleep(100 * time.Millisecond) // let them connect; any that has not is refused the same
	require.NoError(t, producer.Cmd.Process.Signal(syscall.SIGKILL))
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
	name, listen := forgedServer(t, pid, 9)
	for _, step := range []string{"accepted", "read"} {
		ln := listen()
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
		err := fetchWithin(t, name)
		require.ErrorIs(t, err, cuda.ErrNotShared, step)
		require.ErrorContains(t, err, fmt.Sprintf("process %d", pid), step)
		ln.Close()
	}
}

func init() {
	// mock-vmm-producer-stopping shares an allocation and prints its name;
	// at "stop" it stops sharing and prints "stopped"; at the next line it
	// frees the allocation.
	testenv.Helpers["mock-vmm-producer-stopping"] = func(args []string) error {
		return shareUntilTold(func() error { return nil }, cuda.StopSharing, "stopped")
	}
}

// A consumer that half-closes its end after asking is answered; one that
// half-closes without asking is hung up on; a consumer connected when the
// producer stops sharing is still answered, and a later one is told the
// allocation is not shared, at once.
func TestCudaShareServerHalfClosedConsumersAndStopSharing(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	producer := cudatest.StartMockHelper(t, "mock-vmm-producer-stopping")
	name := producer.ReadLine(t)
	sock := shareSocket(producer.Cmd.Process.Pid)
	buf := make([]byte, 1024)

	asked := testenv.Flood(t, sock, 1)[0]
	require.NoError(t, fdpass.Send(asked, []byte(name)))
	require.NoError(t, asked.CloseWrite())
	asked.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, fds, err := fdpass.Recv(asked, buf, 1)
	require.NoError(t, err)
	require.Len(t, fds, 1)
	syscall.Close(fds[0])
	require.True(t, strings.HasPrefix(string(buf[:n]), "ok "), string(buf[:n]))

	silent := testenv.Flood(t, sock, 1)[0]
	require.NoError(t, silent.CloseWrite())
	silent.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, _, err = fdpass.Recv(silent, buf, 1)
	require.Error(t, err, "hung up on, without waiting for the silent period")

	waiting := testenv.Flood(t, sock, 1)[0]
	require.NoError(t, fetchWithin(t, name), "served before it stops") // the waiting one has been accepted by now
	producer.Send(t, "stop")
	require.Equal(t, "stopped", producer.ReadLine(t))
	require.NoError(t, fdpass.Send(waiting, []byte(name)))
	waiting.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, fds, err = fdpass.Recv(waiting, buf, 1)
	require.NoError(t, err)
	for _, fd := range fds {
		syscall.Close(fd)
	}
	require.True(t, strings.HasPrefix(string(buf[:n]), "ok "), "connected before the stop: %s", buf[:n])

	require.ErrorIs(t, fetchWithin(t, name), cuda.ErrNotShared, "after the stop")
	producer.Send(t, "free")
	producer.Wait(t)
}
