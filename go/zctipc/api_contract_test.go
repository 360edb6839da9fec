package zctipc_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/daemon"
	"github.com/zctipc/zctipc/go/internal/daemontest"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"github.com/zctipc/zctipc/go/internal/usersock"
	"github.com/zctipc/zctipc/go/zctipc"
)

// The contract of package zctipc's types: safe for concurrent use, Close
// from any goroutine at any time, ErrClosed afterwards, cancellation that
// wakes, nil receivers that err rather than panic.

func TestAPIQueueSharedByGoroutines(t *testing.T) {
	testenv.SkipShort(t, "runs for seconds")
	const producers, consumers, perProducer = 4, 4, 25_000 // 100,000 messages
	q, err := zctipc.NewQueue("", 1<<16)
	require.NoError(t, err)
	defer q.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := make([]byte, 64)
			for i := range perProducer {
				id := uint64(p)<<32 | uint64(i)
				binary.LittleEndian.PutUint64(msg, id)
				for j := 12; j < len(msg); j++ {
					msg[j] = byte(id * uint64(j))
				}
				binary.LittleEndian.PutUint32(msg[8:], crc32.ChecksumIEEE(append(msg[:8:8], msg[12:]...)))
				if err := q.PutBytes(ctx, msg); err != nil {
					t.Errorf("PutBytes: %v", err)
					return
				}
			}
		}()
	}
	seen := make([]map[uint64]int, consumers)
	corrupt := make([]int, consumers)
	var got sync.WaitGroup
	for c := range consumers {
		seen[c] = map[uint64]int{}
		got.Add(1)
		go func() {
			defer got.Done()
			for {
				wait, cancel := context.WithTimeout(ctx, time.Second)
				m, err := q.Get(wait)
				cancel()
				if errors.Is(err, zctipc.ErrEmpty) {
					return // the producers are done
				}
				if err != nil {
					t.Errorf("Get: %v", err)
					return
				}
				b := m.Bytes
				if len(b) != 64 || crc32.ChecksumIEEE(append(b[:8:8], b[12:]...)) != binary.LittleEndian.Uint32(b[8:]) {
					corrupt[c]++
					continue
				}
				seen[c][binary.LittleEndian.Uint64(b)]++
			}
		}()
	}
	wg.Wait()
	got.Wait()
	all := map[uint64]int{}
	for c := range consumers {
		require.Zero(t, corrupt[c], "corrupt messages")
		for id, n := range seen[c] {
			all[id] += n
		}
	}
	require.Len(t, all, producers*perProducer, "every message arrived")
	for id, n := range all {
		require.Equal(t, 1, n, "message %x arrived %d times", id, n)
	}
}

func TestAPITensorReadByGoroutines(t *testing.T) {
	x, err := zctipc.NewTensor("", zctipc.Float64, 1<<16)
	require.NoError(t, err)
	v, err := zctipc.Values[float64](x)
	require.NoError(t, err)
	for i := range v {
		v[i] = float64(i)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				w, err := zctipc.Values[float64](x)
				if err != nil {
					t.Errorf("Values: %v", err)
					return
				}
				sum := 0.0
				for _, e := range w {
					sum += e
				}
				if sum != float64(len(w)-1)*float64(len(w))/2 {
					t.Errorf("sum %v", sum)
				}
				if _, err := x.Refcount(); err != nil {
					t.Errorf("Refcount: %v", err)
				}
				if _, err := x.Ref(); err != nil {
					t.Errorf("Ref: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	// Closed while goroutines ask it things: each call works or says closed.
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, err := x.Bytes(); err != nil {
					if !errors.Is(err, zctipc.ErrClosed) {
						t.Errorf("Bytes: %v", err)
					}
					return
				}
			}
		}()
	}
	time.Sleep(5 * time.Millisecond)
	require.NoError(t, x.Close())
	wg.Wait()
}

func TestAPIStreamReadersOnGoroutines(t *testing.T) {
	testenv.SkipShort(t, "runs for seconds")
	const frames, readers = 2000, 4
	s, err := zctipc.NewStream("", zctipc.StreamConfig{DType: zctipc.Uint64, Shape: []int64{32}, Frames: 8, Readers: readers})
	require.NoError(t, err)
	defer s.Close()
	ctx := context.Background()
	rs := make([]*zctipc.StreamReader, readers)
	for i := range rs {
		rs[i], err = s.Reader(-1)
		require.NoError(t, err)
	}
	n, err := s.Readers()
	require.NoError(t, err)
	require.Equal(t, readers, n)
	var wg sync.WaitGroup
	for i := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer rs[i].Close()
			for want := range uint64(frames) {
				f, err := zctipc.ReaderLook[uint64](ctx, rs[i])
				if err != nil {
					t.Errorf("reader %d: %v", i, err)
					return
				}
				for _, e := range f {
					if e != want {
						t.Errorf("reader %d: frame %d holds %d", i, want, e)
						return
					}
				}
				if _, err := rs[i].Increment(); err != nil {
					t.Errorf("Increment: %v", err)
					return
				}
			}
		}()
	}
	w, err := s.Writer()
	require.NoError(t, err)
	for i := range uint64(frames) {
		f, err := zctipc.WriterLook[uint64](ctx, w)
		require.NoError(t, err)
		for j := range f {
			f[j] = i
		}
		require.NoError(t, w.Increment())
	}
	wg.Wait()
	_, err = zctipc.WriterLook[float32](ctx, w)
	require.Error(t, err, "a uint64 frame is not []float32")
	require.NoError(t, w.Close())
}

// closed lists, for each exported type, every method that must return
// ErrClosed once the object is closed (or is nil).
func closedCalls(ctx context.Context, x *zctipc.Tensor, q *zctipc.Queue, s *zctipc.Stream, w *zctipc.StreamWriter,
	r *zctipc.StreamReader) map[string]func() error {
	return map[string]func() error{
		"Tensor.Bytes":         func() error { _, err := x.Bytes(); return err },
		"Tensor.Values":        func() error { _, err := zctipc.Values[float32](x); return err },
		"Tensor.Refcount":      func() error { _, err := x.Refcount(); return err },
		"Tensor.Ref":           func() error { _, err := x.Ref(); return err },
		"Tensor.Unlink":        x.Unlink,
		"Tensor.Close":         x.Close,
		"Queue.Len":            func() error { _, err := q.Len(); return err },
		"Queue.PutBytes":       func() error { return q.PutBytes(ctx, []byte("x")) },
		"Queue.PutTensor":      func() error { return q.PutTensor(ctx, x) },
		"Queue.Get":            func() error { _, err := q.Get(ctx); return err },
		"Queue.Close":          q.Close,
		"Stream.Published":     func() error { _, err := s.Published(); return err },
		"Stream.Readers":       func() error { _, err := s.Readers(); return err },
		"Stream.End":           s.End,
		"Stream.Writer":        func() error { _, err := s.Writer(); return err },
		"Stream.Reader":        func() error { _, err := s.Reader(-1); return err },
		"Stream.Close":         s.Close,
		"StreamWriter.Look":    func() error { _, err := w.Look(ctx); return err },
		"StreamWriter.Write":   func() error { return w.Write(ctx, make([]byte, 16)) },
		"StreamWriter.Incr":    w.Increment,
		"StreamWriter.Close":   w.Close,
		"WriterLook":           func() error { _, err := zctipc.WriterLook[uint8](ctx, w); return err },
		"StreamReader.Look":    func() error { _, err := r.Look(ctx); return err },
		"StreamReader.Read":    func() error { return r.Read(ctx, make([]byte, 16)) },
		"StreamReader.Incr":    func() error { _, err := r.Increment(); return err },
		"StreamReader.Dropped": func() error { _, err := r.Dropped(); return err },
		"StreamReader.Close":   r.Close,
		"ReaderLook":           func() error { _, err := zctipc.ReaderLook[uint8](ctx, r); return err },
	}
}

func TestAPIEveryMethodAfterCloseSaysClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	x, err := zctipc.NewTensor("", zctipc.Float32, 4)
	require.NoError(t, err)
	q, err := zctipc.NewQueue("", 1<<12)
	require.NoError(t, err)
	s, err := zctipc.NewStream("", zctipc.StreamConfig{DType: zctipc.Uint8, Shape: []int64{16}, Frames: 2, Readers: 1})
	require.NoError(t, err)
	w, err := s.Writer()
	require.NoError(t, err)
	r, err := s.Reader(-1)
	require.NoError(t, err)
	for _, c := range []interface{ Close() error }{r, w, s, q, x} {
		require.NoError(t, c.Close())
	}
	for name, call := range closedCalls(ctx, x, q, s, w, r) {
		require.ErrorIs(t, call(), zctipc.ErrClosed, name)
	}
	for name, call := range closedCalls(ctx, nil, nil, nil, nil, nil) {
		require.NotPanics(t, func() { require.ErrorIs(t, call(), zctipc.ErrClosed, "nil "+name) })
	}
	var nilTensor *zctipc.Tensor
	require.NotPanics(t, func() {
		require.Empty(t, nilTensor.Name())
		require.Nil(t, nilTensor.Shape())
		require.False(t, nilTensor.Contiguous())
	})
}

func TestAPICloseWakesBlockedCalls(t *testing.T) {
	ctx := context.Background()
	q, err := zctipc.NewQueue("", 1<<12)
	require.NoError(t, err)
	s, err := zctipc.NewStream("", zctipc.StreamConfig{DType: zctipc.Uint8, Shape: []int64{16}, Frames: 2, Readers: 1})
	require.NoError(t, err)
	defer s.Close()
	r, err := s.Reader(-1)
	require.NoError(t, err)
	errs := make(chan error, 2)
	go func() { _, err := q.Get(ctx); errs <- err }()
	go func() { _, err := r.Look(ctx); errs <- err }()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, q.Close())
	require.NoError(t, r.Close())
	for range 2 {
		select {
		case err := <-errs:
			require.ErrorIs(t, err, zctipc.ErrClosed)
		case <-time.After(5 * time.Second):
			t.Fatal("a call blocked on a closed object did not return")
		}
	}
}

func TestAPICancellationWakesAtOnce(t *testing.T) {
	q, err := zctipc.NewQueue("", 1<<12)
	require.NoError(t, err)
	defer q.Close()
	s, err := zctipc.NewStream("", zctipc.StreamConfig{DType: zctipc.Uint8, Shape: []int64{16}, Frames: 2, Readers: 1})
	require.NoError(t, err)
	defer s.Close()
	r, err := s.Reader(-1)
	require.NoError(t, err)
	defer r.Close()
	w, err := s.Writer()
	require.NoError(t, err)
	defer w.Close()
	for range 2 { // fill the ring: the reader never reads
		require.NoError(t, w.Write(context.Background(), make([]byte, 16)))
	}
	for name, call := range map[string]func(context.Context) error{
		"Queue.Get":         func(ctx context.Context) error { _, err := q.Get(ctx); return err },
		"StreamWriter.Look": func(ctx context.Context) error { _, err := w.Look(ctx); return err },
	} {
		// Already cancelled: no wait at all.
		done, cancel := context.WithCancel(context.Background())
		cancel()
		start := time.Now()
		err := call(done)
		require.ErrorIs(t, err, context.Canceled, name)
		require.Less(t, time.Since(start), 100*time.Millisecond, name)
		// Cancelled while blocked: woken, not polled.
		ctx, cancel := context.WithCancel(context.Background())
		errs := make(chan error, 1)
		go func() { errs <- call(ctx) }()
		time.Sleep(100 * time.Millisecond)
		start = time.Now()
		cancel()
		err = <-errs
		require.ErrorIs(t, err, context.Canceled, name)
		require.Less(t, time.Since(start), 100*time.Millisecond, name)
	}
	// The reader, on a ring it has read: nothing new comes.
	_, err = r.Look(context.Background())
	require.NoError(t, err)
	_, err = r.Increment()
	require.NoError(t, err)
	_, err = r.Look(context.Background())
	require.NoError(t, err)
	_, err = r.Increment()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() { _, err := r.Look(ctx); errs <- err }()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	cancel()
	require.ErrorIs(t, <-errs, context.Canceled)
	require.Less(t, time.Since(start), 100*time.Millisecond)
}

func TestAGoProgramLeavesNothing(t *testing.T) {
	testenv.SkipShort(t, "builds and runs programs")
	// A program built against package zctipc, with no Python and no
	// zctipcd on PATH: it is its own cleanup daemon.
	bin := filepath.Join(t.TempDir(), "leaver")
	out, err := exec.Command("go", "build", "-o", bin, "./testdata/leaver").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	for _, end := range []string{"return", "SIGTERM", "SIGKILL"} {
		t.Run(end, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run")
			t.Cleanup(func() { daemontest.Stop(dir) })
			cmd := exec.Command(bin, map[bool]string{true: "return", false: "wait"}[end == "return"])
			cmd.Env = []string{"PATH=" + t.TempDir(), shm.DirEnv + "=" + shm.Dir(), usersock.RuntimeDirEnv + "=" + dir}
			cmd.Stderr = os.Stderr
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			// It returns when its input ends: only after the files were seen.
			stdin, err := cmd.StdinPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			line, err := bufio.NewReader(stdout).ReadString('\n')
			require.NoError(t, err)
			names := strings.Fields(line)
			require.Len(t, names, 4)
			for _, n := range names {
				require.FileExists(t, filepath.Join(shm.Dir(), n))
			}
			switch end {
			case "return":
				require.NoError(t, stdin.Close())
			case "SIGTERM":
				require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			case "SIGKILL":
				require.NoError(t, cmd.Process.Kill())
			}
			_ = cmd.Wait()
			require.NotZero(t, daemon.RunningPID(dir), "the program started its daemon: itself")
			daemontest.WaitGone(t, names...)
		})
	}
}
