// Command producer hands tensors to another process (Go or Python) through
// zctipc: a named segment, a queue, or a stream.
//
//	producer tensor NAME N      make float32 tensor NAME of N elements (element i = i/2),
//	                            print its TensorRef as JSON, and keep it until stdin closes
//	producer queue QUEUE N K    put K float32 tensors of N elements (all k in tensor k) in
//	                            queue QUEUE, then the bytes "done"
//	producer stream STREAM K    write K frames into stream STREAM (every element of frame k
//	                            is k), then end it
//	producer stamped QUEUE N K  put K float32 tensors of N elements, 2 ms apart, each
//	                            stamped (its first 8 bytes) with the wall-clock time in ns
//	                            just before the put: a hand-off latency probe
//	producer burst QUEUE K G    put K messages of 32 bytes from G goroutines at once, after
//	                            printing "start T", the wall-clock time in ns: a rate probe
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/zctipc/zctipc/go/zctipc"
)

func main() {
	err := run(os.Args[1:])
	// Give up what this process still holds (the ticket arena of the
	// tensors it sent goes once the consumer has taken them), as a
	// process does before it exits.
	err = errors.Join(err, zctipc.DisableCleanup())
	if err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
}

// counts says how many counts each mode takes after its name.
var counts = map[string]int{"tensor": 1, "queue": 2, "stamped": 2, "stream": 1, "burst": 2}

func run(args []string) error {
	usage := errors.New("usage: producer tensor NAME N | queue QUEUE N K | stamped QUEUE N K | stream STREAM K | burst QUEUE K G")
	if len(args) < 2 || counts[args[0]] != len(args)-2 {
		return usage
	}
	n := make([]int, len(args)-2)
	for i, a := range args[2:] {
		v, err := strconv.Atoi(a)
		if err != nil {
			return fmt.Errorf("%q is not a count: %w", a, err)
		}
		n[i] = v
	}
	ctx := context.Background()
	switch args[0] {
	case "tensor":
		return tensor(args[1], n[0])
	case "queue":
		return queue(ctx, args[1], n[0], n[1])
	case "stamped":
		return stamped(ctx, args[1], n[0], n[1])
	case "burst":
		return burst(ctx, args[1], n[0], n[1])
	}
	return stream(ctx, args[1], n[0])
}

// tensor makes tensor name of n float32 elements (element i = i/2), prints
// its TensorRef, and keeps it until stdin closes.
func tensor(name string, n int) error {
	t, err := zctipc.NewTensor(name, zctipc.Float32, int64(n))
	if err != nil {
		return err
	}
	defer t.Close()
	v, err := zctipc.Values[float32](t)
	if err != nil {
		return err
	}
	for i := range v {
		v[i] = float32(i) / 2
	}
	ref, err := t.Ref()
	if err != nil {
		return err
	}
	if err := json.NewEncoder(os.Stdout).Encode(ref); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, os.Stdin) // hold it until told
	return err
}

// queue puts k tensors of n float32 elements (all i in tensor i), then the
// bytes "done".
func queue(ctx context.Context, name string, n, k int) error {
	q, err := zctipc.AttachQueue(name)
	if err != nil {
		return err
	}
	defer q.Close()
	for i := range k {
		t, err := zctipc.NewTensor("", zctipc.Float32, int64(n))
		if err != nil {
			return err
		}
		v, _ := zctipc.Values[float32](t)
		for j := range v {
			v[j] = float32(i)
		}
		err = q.PutTensor(ctx, t)
		if cerr := t.Close(); err == nil { // the message holds its own count
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return q.PutBytes(ctx, []byte("done"))
}

// stream writes k frames (every element of frame i is i), then ends it.
func stream(ctx context.Context, name string, k int) error {
	s, err := zctipc.AttachStream(name)
	if err != nil {
		return err
	}
	defer s.Close()
	w, err := s.Writer()
	if err != nil {
		return err
	}
	defer w.Close()
	for i := range k {
		frame, err := zctipc.WriterLook[float32](ctx, w)
		if err != nil {
			return err
		}
		for j := range frame {
			frame[j] = float32(i)
		}
		if err := w.Increment(); err != nil {
			return err
		}
	}
	return s.End()
}

func stamped(ctx context.Context, queue string, n, k int) error {
	q, err := zctipc.AttachQueue(queue)
	if err != nil {
		return err
	}
	defer q.Close()
	tensors := make([]*zctipc.Tensor, k)
	for i := range tensors {
		if tensors[i], err = zctipc.NewTensor("", zctipc.Float32, int64(n)); err != nil {
			return err
		}
	}
	for _, t := range tensors {
		time.Sleep(2 * time.Millisecond)
		b, err := t.Bytes()
		if err != nil {
			return err
		}
		binary.LittleEndian.PutUint64(b, uint64(time.Now().UnixNano()))
		if err := q.PutTensor(ctx, t); err != nil {
			return err
		}
		if err := t.Close(); err != nil {
			return err
		}
	}
	return nil
}

// burst puts k messages of 32 bytes from g goroutines at once.
func burst(ctx context.Context, name string, k, g int) error {
	q, err := zctipc.AttachQueue(name)
	if err != nil {
		return err
	}
	defer q.Close()
	msg := make([]byte, 32)
	fmt.Printf("start %d\n", time.Now().UnixNano())
	errs := make(chan error, g)
	for i := range g {
		go func() {
			n := k / g
			if i < k%g {
				n++
			}
			for range n {
				if err := q.PutBytes(ctx, msg); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range g {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}
