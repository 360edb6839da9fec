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
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/zctipc/zctipc/go/zctipc"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 3 {
		return fmt.Errorf("usage: producer tensor NAME N | queue QUEUE N K | stream STREAM K")
	}
	ctx := context.Background()
	count := func(i int) (int, error) { return strconv.Atoi(args[i]) }
	switch args[0] {
	case "tensor":
		n, err := count(2)
		if err != nil {
			return err
		}
		t, err := zctipc.NewTensor(args[1], zctipc.Float32, int64(n))
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
	case "queue":
		n, err := count(2)
		if err != nil {
			return err
		}
		k, err := count(3)
		if err != nil {
			return err
		}
		q, err := zctipc.AttachQueue(args[1])
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
			if cerr := t.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
		return q.PutBytes(ctx, []byte("done"))
	case "stamped":
		n, err := count(2)
		if err != nil {
			return err
		}
		k, err := count(3)
		if err != nil {
			return err
		}
		return stamped(ctx, args[1], n, k)
	case "stream":
		k, err := count(2)
		if err != nil {
			return err
		}
		s, err := zctipc.AttachStream(args[1])
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
			frame, err := w.Look(ctx)
			if err != nil {
				return err
			}
			for j := 0; j+4 <= len(frame); j += 4 {
				binary.LittleEndian.PutUint32(frame[j:], math.Float32bits(float32(i)))
			}
			if err := w.Increment(); err != nil {
				return err
			}
		}
		return s.End()
	}
	return fmt.Errorf("unknown mode %q", args[0])
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
		binary.LittleEndian.PutUint64(t.Bytes(), uint64(time.Now().UnixNano()))
		if err := q.PutTensor(ctx, t); err != nil {
			return err
		}
		if err := t.Close(); err != nil {
			return err
		}
	}
	return nil
}
