package zctipc_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/daemontest"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"github.com/zctipc/zctipc/go/zctipc"
	"golang.org/x/sys/unix"
)

func TestAPITensorValuesAndRefs(t *testing.T) {
	t.Parallel()
	x, err := zctipc.NewTensor("", zctipc.Float32, 2, 3)
	require.NoError(t, err)
	defer func() { require.NoError(t, x.Close()) }()
	v, err := zctipc.Values[float32](x)
	require.NoError(t, err)
	require.Len(t, v, 6)
	for i := range v {
		v[i] = float32(i)
	}
	_, err = zctipc.Values[float64](x)
	require.ErrorIs(t, err, unix.EINVAL, "a float32 tensor is not []float64")
	require.Equal(t, []int64{2, 3}, x.Shape())
	require.Equal(t, []int64{12, 4}, x.Strides())
	require.True(t, x.Contiguous())

	ref, err := x.Ref()
	require.NoError(t, err)
	text, err := json.Marshal(ref)
	require.NoError(t, err)
	require.Equal(t, `{"id":"`+ref.ID+`","segment":"zctipc_`+ref.ID+`","dtype":"float32","shape":[2,3],"strides":[12,4],`+
		`"offset":0,"nbytes":24,"device":"cpu"}`, string(text), "the stable JSON form")
	var back zctipc.TensorRef
	require.NoError(t, json.Unmarshal(text, &back))
	y, err := zctipc.AttachRef(back)
	require.NoError(t, err)
	w, err := zctipc.Values[float32](y)
	require.NoError(t, err)
	require.Equal(t, v, w, "the same memory")
	n, err := y.Refcount()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "one process, one count")
	require.NoError(t, y.Close())

	// A ref is checked against the segment's header: nothing is read as
	// another type, shape or part.
	q, err := zctipc.NewQueue("", 1<<12)
	require.NoError(t, err)
	defer q.Close()
	wrong := func(edit func(r *zctipc.TensorRef)) zctipc.TensorRef {
		r := back
		edit(&r)
		return r
	}
	for what, bad := range map[string]zctipc.TensorRef{
		"dtype":     wrong(func(r *zctipc.TensorRef) { r.DType = "int32" }),
		"shape":     wrong(func(r *zctipc.TensorRef) { r.Shape = []int64{3, 2} }),
		"strides":   wrong(func(r *zctipc.TensorRef) { r.Strides = []int64{4, 8} }),
		"a column":  wrong(func(r *zctipc.TensorRef) { r.Shape, r.Strides, r.Offset, r.NBytes = []int64{2}, []int64{12}, 4, 16 }),
		"bytes":     wrong(func(r *zctipc.TensorRef) { r.NBytes = 400 }),
		"id":        wrong(func(r *zctipc.TensorRef) { r.ID = "someone_else" }),
		"device":    wrong(func(r *zctipc.TensorRef) { r.Device = "cuda:0" }),
		"a queue":   wrong(func(r *zctipc.TensorRef) { r.ID, r.Segment = "", q.Name() }),
		"no dtype":  wrong(func(r *zctipc.TensorRef) { r.DType = "no-such-type" }),
		"no memory": wrong(func(r *zctipc.TensorRef) { r.Segment = "zctipc_no_such_segment" }),
	} {
		_, err := zctipc.AttachRef(bad)
		require.Error(t, err, what)
		if what != "no dtype" && what != "no memory" {
			require.ErrorIs(t, err, zctipc.ErrMismatch, what)
			require.ErrorIs(t, err, unix.EINVAL, what)
		}
	}
	parsed, err := zctipc.ParseRef(text)
	require.NoError(t, err)
	require.Equal(t, back, parsed)
	_, err = zctipc.ParseRef([]byte(`{"segment": "x", "dtype": "float32"}`))
	require.ErrorIs(t, err, unix.EINVAL, "shape and strides are required")
}

func TestAPIQueueCarriesTensorsAndBytes(t *testing.T) {
	q, err := zctipc.NewQueue("", 1<<16)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	ctx := context.Background()
	x, err := zctipc.NewTensor("", zctipc.Int64, 4)
	require.NoError(t, err)
	v, _ := zctipc.Values[int64](x)
	copy(v, []int64{1, 2, 3, 4})
	require.NoError(t, q.PutTensor(ctx, x))
	require.NoError(t, x.Close(), "the message holds its own count")
	require.NoError(t, q.PutBytes(ctx, []byte("hello")))
	m, err := q.Get(ctx)
	require.NoError(t, err)
	got, err := zctipc.Values[int64](m.Tensor)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2, 3, 4}, got)
	require.NoError(t, m.Tensor.Close())
	m, err = q.Get(ctx)
	require.NoError(t, err)
	require.Equal(t, "hello", string(m.Bytes))

	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = q.Get(short)
	require.ErrorIs(t, err, zctipc.ErrEmpty)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 2*time.Second)
	cancelled, stop := context.WithCancel(ctx)
	go func() { time.Sleep(20 * time.Millisecond); stop() }()
	_, err = q.Get(cancelled)
	require.ErrorIs(t, err, context.Canceled, "a cancelled context ends a wait")

	// An unbounded queue takes more than a bounded one's ring.
	u, err := zctipc.NewQueue("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, u.Close()) }()
	for range 300 {
		require.NoError(t, u.PutBytes(ctx, make([]byte, 100<<10)))
	}
	n, err := u.Len()
	require.NoError(t, err)
	require.Equal(t, 300, n)

	// Wait: told of a message without taking it.
	short, cancel = context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, q.Wait(short), zctipc.ErrEmpty)
	require.NoError(t, q.PutBytes(ctx, []byte("there")))
	require.NoError(t, q.Wait(ctx))
	n, err = q.Len()
	require.NoError(t, err)
	require.Equal(t, 1, n, "Wait takes nothing")
}

func TestAPIStream(t *testing.T) {
	t.Parallel()
	s, err := zctipc.NewStream("", zctipc.StreamConfig{DType: zctipc.Uint8, Shape: []int64{16}, Frames: 4, Readers: 1})
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	ctx := context.Background()
	r, err := s.Reader(-1)
	require.NoError(t, err)
	w, err := s.Writer()
	require.NoError(t, err)
	require.ErrorIs(t, w.Write(ctx, make([]byte, 3)), unix.EINVAL)
	for i := range 10 {
		require.NoError(t, w.Write(ctx, []byte(strings.Repeat(string(rune('a'+i)), 16))))
		dst := make([]byte, 16)
		require.NoError(t, r.Read(ctx, dst))
		require.Equal(t, strings.Repeat(string(rune('a'+i)), 16), string(dst))
	}
	require.NoError(t, s.End())
	_, err = r.Look(ctx)
	require.ErrorIs(t, err, zctipc.ErrEnded)
	published, err := s.Published()
	require.NoError(t, err)
	require.EqualValues(t, 10, published)
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
}

// The examples in go/examples, built and run against each other: a segment
// by TensorRef, a queue and a stream.
var (
	examplesOnce sync.Once
	examplesDir  string
	examplesErr  error
)

func buildExamples(t *testing.T) string {
	t.Helper()
	examplesOnce.Do(func() {
		examplesDir, examplesErr = os.MkdirTemp("", "zctipc-examples-")
		if examplesErr != nil {
			return
		}
		for _, name := range []string{"producer", "consumer"} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(examplesDir, name), "../examples/"+name).CombinedOutput()
			if err != nil {
				examplesErr = errors.Join(examplesErr, errors.New(string(out)), err)
			}
		}
	})
	require.NoError(t, examplesErr)
	return examplesDir
}

func example(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(dir, args[0]), args[1:]...).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("%v: %v: %s", args, err, ee.Stderr)
	}
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

func TestExamplesHandTensorsToEachOther(t *testing.T) {
	testenv.SkipShort(t, "builds and runs programs")
	dir := buildExamples(t)
	producer := exec.Command(filepath.Join(dir, "producer"), "tensor", "", "1000")
	stdin, err := producer.StdinPipe()
	require.NoError(t, err)
	stdout, err := producer.StdoutPipe()
	require.NoError(t, err)
	producer.Stderr = os.Stderr
	require.NoError(t, producer.Start())
	ref, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "sum 249750", example(t, dir, "consumer", "tensor", strings.TrimSpace(ref)), "by TensorRef")
	require.NoError(t, stdin.Close())
	require.NoError(t, producer.Wait())

	q, err := zctipc.NewQueue("", 1<<20)
	require.NoError(t, err)
	defer q.Close()
	consumer := exec.Command(filepath.Join(dir, "consumer"), "queue", q.Name())
	consumer.Stderr = os.Stderr
	out, err := consumer.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, consumer.Start())
	require.Empty(t, example(t, dir, "producer", "queue", q.Name(), "1000", "5"))
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "tensors 5 sum 10000\n", line, "through a queue")
	require.NoError(t, consumer.Wait())

	s, err := zctipc.NewStream("", zctipc.StreamConfig{DType: zctipc.Float32, Shape: []int64{256}, Frames: 8, Readers: 1})
	require.NoError(t, err)
	defer s.Close()
	reader := exec.Command(filepath.Join(dir, "consumer"), "stream", s.Name())
	reader.Stderr = os.Stderr
	rout, err := reader.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, reader.Start())
	lines := bufio.NewReader(rout)
	joined, err := lines.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "joined\n", joined)
	require.Empty(t, example(t, dir, "producer", "stream", s.Name(), "20"))
	last, err := lines.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "frames 20 sum 48640 whole true\n", last, "through a stream")
	require.NoError(t, reader.Wait())
}

func TestAPISharingStrategies(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	require.Equal(t, "file_system", zctipc.SharingStrategy())
	require.ErrorIs(t, zctipc.SetSharingStrategy("cuda_ipc"), unix.EINVAL)
	// Under file_descriptor, a Go producer's tensor is a memfd that a Go
	// consumer gets from the cleanup daemon; nothing is in the segment
	// directory.
	producer := daemontest.StartClient(t, "api-fd-producer", nil)
	name := producer.ReadLine(t)
	require.True(t, strings.HasPrefix(name, "zctipc-fd-"), name)
	consumer := daemontest.StartClient(t, "api-fd-consumer", nil, name)
	require.Equal(t, "sum 6", consumer.ReadLine(t))
	consumer.Wait(t)
	producer.Send(t, "done")
	producer.Wait(t)
}

func init() {
	testenv.Helpers["api-fd-producer"] = func(args []string) error {
		if err := zctipc.EnableCleanup(os.Getenv("ZCTIPC_TEST_DAEMON")); err != nil {
			return err
		}
		if err := zctipc.SetSharingStrategy("file_descriptor"); err != nil {
			return err
		}
		x, err := zctipc.NewTensor("", zctipc.Int32, 4)
		if err != nil {
			return err
		}
		v, _ := zctipc.Values[int32](x)
		copy(v, []int32{0, 1, 2, 3})
		entries, err := os.ReadDir(os.Getenv("ZCTIPC_SHM_DIR"))
		if err != nil {
			return err
		}
		for _, e := range entries {
			// The ledger, and the ticket arenas of the test process.
			if info, err := shm.Stat(e.Name()); err != nil || info.Header.Kind != header.KindLedger && info.Header.Kind != header.KindArena {
				return errors.Join(err, fmt.Errorf("%s is in the segment directory", e.Name()))
			}
		}
		fmt.Println(x.Name())
		if _, err := testenv.StdinLine(); err != nil {
			return err
		}
		return errors.Join(x.Close(), zctipc.DisableCleanup())
	}
	testenv.Helpers["api-fd-consumer"] = func(args []string) error {
		if err := zctipc.EnableCleanup(os.Getenv("ZCTIPC_TEST_DAEMON")); err != nil {
			return err
		}
		x, err := zctipc.AttachTensor(args[0], true)
		if err != nil {
			return err
		}
		v, err := zctipc.Values[int32](x)
		if err != nil {
			return err
		}
		fmt.Println("sum", v[0]+v[1]+v[2]+v[3])
		return errors.Join(x.Close(), zctipc.DisableCleanup())
	}
}

// TestAPIPollingWaits: a polling Queue and stream endpoints wait for what
// another goroutine sends, time out, and can go back to sleeping.
func TestAPIPollingWaits(t *testing.T) {
	q, err := zctipc.NewQueue("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	require.NoError(t, q.SetWait(zctipc.Polling))
	go func() {
		time.Sleep(20 * time.Millisecond)
		_ = q.PutBytes(context.Background(), []byte("late"))
	}()
	m, err := q.Get(context.Background())
	require.NoError(t, err)
	require.Equal(t, "late", string(m.Bytes))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = q.Get(ctx)
	require.ErrorIs(t, err, zctipc.ErrEmpty)
	require.NoError(t, q.SetWait(zctipc.Sleeping))

	s, err := zctipc.NewStream("", zctipc.StreamConfig{DType: zctipc.Uint8, Shape: []int64{8}, Frames: 2, Readers: 1})
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	r, err := s.Reader(-1)
	require.NoError(t, err)
	w, err := s.Writer()
	require.NoError(t, err)
	require.NoError(t, r.SetWait(zctipc.Polling))
	require.NoError(t, w.SetWait(zctipc.Polling))
	go func() {
		time.Sleep(20 * time.Millisecond)
		_ = w.Write(context.Background(), []byte("abcdefgh"))
	}()
	dst := make([]byte, 8)
	require.NoError(t, r.Read(context.Background(), dst))
	require.Equal(t, "abcdefgh", string(dst))
	require.NoError(t, r.Close())
	require.NoError(t, w.Close())
	require.Error(t, r.SetWait(zctipc.Polling), "a closed reader")
}

// A tensor whose segment was unlinked cannot be found by a receiver: the
// put is refused, and nothing that was accepted is lost (the queue stays
// usable, and the tensor too).
func TestAPIPutOfAnUnlinkedTensorIsRefused(t *testing.T) {
	t.Parallel()
	q, err := zctipc.NewQueue("", 1<<16)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	ctx := context.Background()
	x, err := zctipc.NewTensor("", zctipc.Int64, 4)
	require.NoError(t, err)
	defer func() { require.NoError(t, x.Close()) }()
	require.NoError(t, x.Unlink())
	err = q.PutTensor(ctx, x)
	require.ErrorIs(t, err, unix.ENOENT, "the put of a tensor no receiver can attach")
	require.ErrorContains(t, err, "unlinked")
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = q.Get(short)
	require.ErrorIs(t, err, zctipc.ErrEmpty, "nothing was accepted")
	v, err := zctipc.Values[int64](x)
	require.NoError(t, err)
	v[0] = 1 // the handle still holds the memory
}
