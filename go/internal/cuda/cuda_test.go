package cuda_test

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/cuda"
	"github.com/zctipc/zctipc/go/internal/cudatest"
	"github.com/zctipc/zctipc/go/internal/fdpass"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"github.com/zctipc/zctipc/go/internal/usersock"
	"golang.org/x/sys/unix"
)

// requireGPU skips a test, saying why, where CUDA cannot be used.
func requireGPU(t *testing.T) {
	t.Helper()
	if err := cuda.Available(); err != nil {
		t.Skipf("no GPU: %v", err)
	}
}

func TestCudaAvailabilityIsReportedAndCallsFailClearly(t *testing.T) {
	err := cuda.Available()
	if err == nil {
		n, err := cuda.Devices()
		require.NoError(t, err)
		require.Positive(t, n)
		return
	}
	require.ErrorIs(t, err, cuda.ErrUnavailable)
	t.Logf("CUDA unavailable here: %v", err)
	_, err = cuda.Devices()
	require.ErrorIs(t, err, cuda.ErrUnavailable)
	_, err = cuda.Alloc(0, 1<<20)
	require.ErrorIs(t, err, cuda.ErrUnavailable)
	_, err = cuda.ExportMemory(0, 0x7f0000000000, 0)
	require.ErrorIs(t, err, cuda.ErrUnavailable)
	_, err = cuda.Granularity(0)
	require.ErrorIs(t, err, cuda.ErrUnavailable)
}

func TestCudaFetchRefusesBadNames(t *testing.T) {
	t.Parallel()
	_, _, _, err := cuda.Fetch("not-a-name")
	require.ErrorIs(t, err, unix.EINVAL)
	_, _, _, err = cuda.Fetch(fmt.Sprintf("%d-%032x", 1<<22+12345, 1))
	require.ErrorIs(t, err, cuda.ErrNotShared, "nobody serves it")
}

// A VMM allocation shared by one process is mapped by another.
func TestCudaVMMAcrossProcesses(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	requireGPU(t)
	a, err := cuda.Alloc(0, 3<<20)
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Free()) }()
	g, err := cuda.Granularity(0)
	require.NoError(t, err)
	require.Zero(t, a.Size%g, "rounded up to the granularity")
	name, err := a.Share()
	require.NoError(t, err)
	h := testenv.StartHelper(t, "cuda-import", name)
	require.Equal(t, fmt.Sprintf("mapped %d", a.Size), h.ReadLine(t))
	h.Wait(t)
	cuda.Unshare(name)
	_, _, _, err = cuda.Fetch(name)
	require.ErrorIs(t, err, cuda.ErrNotShared)
}

func init() {
	testenv.Helpers["cuda-import"] = func(args []string) error {
		a, err := cuda.ImportShared(args[0], -1)
		if err != nil {
			return err
		}
		if a.Ptr == 0 {
			return errors.New("mapped at 0")
		}
		fmt.Fprintf(os.Stdout, "mapped %d\n", a.Size)
		return a.Free()
	}
}

// A VMM allocation is shared by file descriptor: the consumer maps the
// producer's memory, reads what it wrote, and writes back.
func TestCudaVMMSharingWithTheStandInDriver(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	producer, name, size := startProducer(t, "")
	require.Equal(t, strconv.Itoa(2*64<<10), size, "100 KiB rounded up to the granularity")
	consumeAndWriteBack(t, producer, name)
}

// startProducer starts the helper mock-vmm-producer with arg and returns it,
// the name of the allocation it shares, and its size.
func startProducer(t *testing.T, arg string) (*testenv.Helper, string, string) {
	t.Helper()
	producer := cudatest.StartMockHelper(t, "mock-vmm-producer", arg)
	name, size, _ := strings.Cut(producer.ReadLine(t), " ")
	return producer, name, size
}

// consumeAndWriteBack runs a consumer of producer's allocation name, which
// reads what the producer wrote and writes into its first byte, and
// requires that the producer sees that byte; the producer then exits.
func consumeAndWriteBack(t *testing.T, producer *testenv.Helper, name string) {
	t.Helper()
	consumer := cudatest.StartMockHelper(t, "mock-vmm-consumer", name)
	require.Equal(t, "sum 5050", consumer.ReadLine(t))
	consumer.Wait(t)
	producer.Send(t, "check")
	require.Equal(t, "first 42", producer.ReadLine(t), "the consumer wrote into the producer's memory")
	producer.Wait(t)
}

// finishUntouched requires that no consumer wrote into producer's
// allocation, whose first byte is still 1; the producer then exits.
func finishUntouched(t *testing.T, producer *testenv.Helper) {
	t.Helper()
	producer.Send(t, "check")
	require.Equal(t, "first 1", producer.ReadLine(t))
	producer.Wait(t)
}

// shareSocket is the socket of the CUDA share server of process pid.
func shareSocket(pid int) string {
	return filepath.Join(usersock.RuntimeDir(), fmt.Sprintf("cuda-%d.sock", pid))
}

// Legacy IPC: the consumer opens the producer's allocation once however
// often it is sent, and waits on the producer's event each time.
func TestCudaLegacyIPCWithTheStandInDriver(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	producer := cudatest.StartMockHelper(t, "mock-ipc-producer")
	export := producer.ReadLine(t)
	consumer := cudatest.StartMockHelper(t, "mock-ipc-consumer", export)
	require.Equal(t, "opens 1 byte 7", consumer.ReadLine(t))
	consumer.Wait(t)
	producer.Send(t, "done")
	producer.Wait(t)
}

func init() {
	// mock-vmm-producer shares an allocation and prints its name; with the
	// argument "low-limit", under an open-file limit of 64.
	testenv.Helpers["mock-vmm-producer"] = func(args []string) error {
		if args[0] == "low-limit" {
			var lim syscall.Rlimit
			if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				return err
			}
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: 64, Max: lim.Max}); err != nil {
				return err
			}
		}
		a, err := cuda.Alloc(0, 100<<10)
		if err != nil {
			return err
		}
		mem := cudatest.HostBytes(a.Ptr, a.Size)
		for i := range 100 {
			mem[i] = byte(i + 1)
		}
		name, err := a.Share()
		if err != nil {
			return err
		}
		fmt.Println(name, a.Size)
		if _, err := testenv.StdinLine(); err != nil {
			return err
		}
		fmt.Println("first", mem[0])
		cuda.Unshare(name)
		return a.Free()
	}
	testenv.Helpers["mock-vmm-consumer"] = func(args []string) error {
		a, err := cuda.ImportShared(args[0], -1)
		if err != nil {
			return err
		}
		mem := cudatest.HostBytes(a.Ptr, a.Size)
		sum := 0
		for _, b := range mem[:100] {
			sum += int(b)
		}
		mem[0] = 42
		fmt.Println("sum", sum)
		return a.Free()
	}
	testenv.Helpers["mock-ipc-producer"] = func(args []string) error {
		a, err := cuda.Alloc(0, 64<<10)
		if err != nil {
			return err
		}
		cudatest.HostBytes(a.Ptr, a.Size)[4096] = 7
		e, err := cuda.ExportMemory(0, a.Ptr+4096, 0)
		if err != nil {
			return err
		}
		if e.Offset != 4096 || e.Size != a.Size {
			return fmt.Errorf("export at offset %d of %d bytes", e.Offset, e.Size)
		}
		if err := e.Record(0); err != nil {
			return err
		}
		fmt.Println(hex.EncodeToString(e.Handle[:]), e.Offset, hex.EncodeToString(e.Event[:]))
		if _, err := testenv.StdinLine(); err != nil {
			return err
		}
		return errors.Join(e.Release(), a.Free())
	}
	testenv.Helpers["mock-ipc-consumer"] = func(args []string) error {
		var handleHex, eventHex string
		var offset uint64
		if _, err := fmt.Sscan(args[0], &handleHex, &offset, &eventHex); err != nil {
			return err
		}
		var handle, event [cuda.HandleSize]byte
		hex.Decode(handle[:], []byte(handleHex))
		hex.Decode(event[:], []byte(eventHex))
		var ptr uint64
		for range 1000 {
			p, err := cuda.Open(handle, offset, 0, event, 0)
			if err != nil {
				return err
			}
			ptr = p
			if err := cuda.Close(handle); err != nil {
				return err
			}
		}
		b := cudatest.HostBytes(ptr, 1)[0]
		fmt.Println("opens", cuda.OpenCount(), "byte", b)
		return cuda.Forget(0)
	}
}

// fetchAsync runs cuda.Fetch(name) in a goroutine; the channel gets its
// error.
func fetchAsync(name string) <-chan error {
	done := make(chan error, 1)
	go func() {
		fd, _, _, err := cuda.Fetch(name)
		if err == nil {
			unix.Close(fd)
		}
		done <- err
	}()
	return done
}

// fetchWithin runs cuda.Fetch(name) and fails the test when it does not
// return within a minute (it has a deadline of its own, much shorter).
func fetchWithin(t *testing.T, name string) error {
	t.Helper()
	select {
	case err := <-fetchAsync(name):
		return err
	case <-time.After(time.Minute):
		t.Fatalf("Fetch(%s) did not return", name)
		return nil
	}
}

// 200 connections that say nothing do not take the producer's
// descriptors or its server: while they are open, a consumer is refused
// with the reason; the server closes them once they said nothing for its
// silent period, and a consumer then maps the allocation.
func TestCudaShareServerOutlivesAFlood(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	producer, name, _ := startProducer(t, "low-limit")
	pid := producer.Cmd.Process.Pid
	sock := shareSocket(pid)
	testenv.Flood(t, sock, 200)

	err := fetchWithin(t, name)
	require.ErrorIs(t, err, cuda.ErrBusy, "refused, with the reason")
	require.ErrorContains(t, err, fmt.Sprintf("the CUDA share server of pid %d is at its limit", pid))

	require.Eventually(t, func() bool { return fetchWithin(t, name) == nil }, time.Minute, 100*time.Millisecond,
		"the silent connections were closed")
	consumeAndWriteBack(t, producer, name)
}

// A consumer's fetch from a stopped producer fails, naming the producer,
// instead of blocking for ever; once the producer goes on, it succeeds.
func TestCudaFetchFromAStoppedProducerFails(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	producer, name, pid := startStoppedProducer(t)
	err := fetchWithin(t, name)
	require.ErrorIs(t, err, unix.ETIMEDOUT)
	require.ErrorContains(t, err, fmt.Sprintf("the process %d that shares it did not answer", pid))
	require.NoError(t, producer.Cmd.Process.Signal(syscall.SIGCONT))
	require.NoError(t, fetchWithin(t, name))
	finishUntouched(t, producer)
}

// startStoppedProducer starts the helper mock-vmm-producer and stops it
// (SIGSTOP) once it shares its allocation; it returns the helper, the
// allocation's name and the helper's pid.
func startStoppedProducer(t *testing.T) (*testenv.Helper, string, int) {
	t.Helper()
	producer, name, _ := startProducer(t, "")
	pid := producer.Cmd.Process.Pid
	require.NoError(t, producer.Cmd.Process.Signal(syscall.SIGSTOP))
	testenv.WaitStopped(t, pid)
	return producer, name, pid
}

func init() {
	// mock-vmm-producer-exhausted shares an allocation, then opens files
	// until it has no descriptor left, prints the share name, and waits;
	// at "free" it closes them and prints "freed", and at the next line
	// it frees the allocation.
	testenv.Helpers["mock-vmm-producer-exhausted"] = func(args []string) error {
		var held []int
		exhaust := func() error {
			for {
				fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if errors.Is(err, unix.EMFILE) {
					return nil
				}
				if err != nil {
					return err
				}
				held = append(held, fd)
			}
		}
		free := func() error {
			for _, fd := range held {
				unix.Close(fd)
			}
			return nil
		}
		return shareUntilTold(exhaust, free, "freed")
	}
}

// shareUntilTold, in a helper process, shares an allocation of 64 KiB, runs
// prepare and prints the share name; at a line on stdin it runs then and
// prints done; at the next line it stops sharing the allocation and frees
// it.
func shareUntilTold(prepare, then func() error, done string) error {
	a, err := cuda.Alloc(0, 64<<10)
	if err != nil {
		return err
	}
	name, err := a.Share()
	if err != nil {
		return err
	}
	if err := prepare(); err != nil {
		return err
	}
	fmt.Println(name)
	if _, err := testenv.StdinLine(); err != nil {
		return err
	}
	if err := then(); err != nil {
		return err
	}
	fmt.Println(done)
	if _, err := testenv.StdinLine(); err != nil {
		return err
	}
	cuda.Unshare(name)
	return a.Free()
}

// A producer with no descriptor left refuses a consumer with the reason
// and goes on accepting: once it has descriptors again, the consumer is
// served.
func TestCudaShareServerOutlivesRunningOutOfDescriptors(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	producer := cudatest.StartMockHelper(t, "mock-vmm-producer-exhausted")
	name := producer.ReadLine(t)
	for range 3 {
		err := fetchWithin(t, name)
		require.ErrorIs(t, err, cuda.ErrBusy)
		require.ErrorContains(t, err, "at its limit of open files")
	}
	producer.Send(t, "free")
	require.Equal(t, "freed", producer.ReadLine(t))
	require.NoError(t, fetchWithin(t, name))
	producer.Send(t, "done")
	producer.Wait(t)
}

// Forged requests get an error and leave the server serving; descriptors
// sent with a request are closed.
func TestCudaShareServerRefusesForgedRequests(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	producer, name, _ := startProducer(t, "")
	sock := shareSocket(producer.Cmd.Process.Pid)
	devnull, err := os.Open(os.DevNull)
	require.NoError(t, err)
	defer devnull.Close()
	forged := name[:len(name)-1] + "0" // the real name with its last digit changed
	if strings.HasSuffix(name, "0") {
		forged = name[:len(name)-1] + "1"
	}
	for _, tc := range []struct {
		req  []byte
		fds  []int
		want string
	}{
		{[]byte(forged), nil, "no such shared CUDA allocation"},
		{[]byte("garbage"), nil, "no such shared CUDA allocation"},
		{make([]byte, 4096), nil, "malformed file-descriptor message"},
		{[]byte(name), []int{int(devnull.Fd())}, "malformed file-descriptor message"},
	} {
		conn := testenv.Flood(t, sock, 1)[0]
		require.NoError(t, fdpass.Send(conn, tc.req, tc.fds...))
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 1024)
		n, fds, err := fdpass.Recv(conn, buf, 1)
		require.NoError(t, err)
		require.Empty(t, fds)
		require.Contains(t, string(buf[:n]), tc.want)
	}
	require.NoError(t, fetchWithin(t, name), "the server goes on")
	finishUntouched(t, producer)
}

// A forged server (any process of the user can listen on a socket named
// for a pid that is not its own, once that process is gone) cannot make
// Fetch hang, or leak the descriptors it sends.
func TestCudaFetchRefusesForgedReplies(t *testing.T) {
	testenv.SkipShort(t, "runs for seconds")
	name, listen := forgedServer(t, 1<<22+4321, 7)
	for _, reply := range []string{"ok twelve", "ok 4096 0", "hello", ""} {
		ln := listen()
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			defer c.Close()
			fdpass.Recv(c, make([]byte, 256), 0)
			if reply != "" {
				f, _ := os.Open(os.DevNull)
				fdpass.Send(c, []byte(reply), int(f.Fd()), int(f.Fd()))
				f.Close() // what is left open on /dev/null is Fetch's
				sent <- struct{}{}
			}
			time.Sleep(time.Minute) // "": never answers
		}()
		before := openOnDevNull(t)
		err := fetchWithin(t, name)
		require.Error(t, err, "reply %q", reply)
		if reply == "" {
			require.ErrorIs(t, err, unix.ETIMEDOUT)
		} else {
			<-sent
		}
		require.Equal(t, before, openOnDevNull(t), "every descriptor that came was closed")
		ln.Close()
	}
}

// forgedServer returns the name of an allocation (serial) that process pid,
// which is not there, would share, and listen, which listens on that
// process's share socket as a forged server of the user's could.
func forgedServer(t *testing.T, pid, serial int) (string, func() *net.UnixListener) {
	t.Helper()
	require.NoError(t, usersock.EnsureDir(usersock.RuntimeDir()))
	listen := func() *net.UnixListener {
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: shareSocket(pid), Net: "unixpacket"})
		require.NoError(t, err)
		return ln
	}
	return fmt.Sprintf("%d-%032x", pid, serial), listen
}

// openOnDevNull counts this process's descriptors open on /dev/null.
func openOnDevNull(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == os.DevNull {
			n++
		}
	}
	return n
}
