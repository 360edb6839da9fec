// Command consumer takes tensors another process (Go or Python) handed over
// through zctipc, and prints what it got.
//
//	consumer tensor REF_JSON    attach the tensor a TensorRef describes; print "sum S"
//	consumer queue QUEUE        take tensors until the bytes "done"; print "tensors K sum S"
//	consumer stream STREAM      join as a reader (print "joined"), read frames until the
//	                            stream ends; print "frames K sum S whole W"
//
// Tensors must be float32; the sum is of every element of every tensor.
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"

	"github.com/zctipc/zctipc/go/zctipc"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

func sum(t *zctipc.Tensor) (float64, error) {
	v, err := zctipc.Values[float32](t)
	if err != nil {
		return 0, err
	}
	s := 0.0
	for _, x := range v {
		s += float64(x)
	}
	return s, nil
}

func run(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: consumer tensor REF_JSON | queue QUEUE | stream STREAM")
	}
	ctx := context.Background()
	switch args[0] {
	case "tensor":
		var ref zctipc.TensorRef
		if err := json.Unmarshal([]byte(args[1]), &ref); err != nil {
			return err
		}
		t, err := zctipc.AttachRef(ref)
		if err != nil {
			return err
		}
		defer t.Close()
		s, err := sum(t)
		if err != nil {
			return err
		}
		fmt.Printf("sum %g\n", s)
		return nil
	case "queue":
		q, err := zctipc.AttachQueue(args[1])
		if err != nil {
			return err
		}
		defer q.Close()
		total, n := 0.0, 0
		for {
			m, err := q.Get(ctx)
			if err != nil {
				return err
			}
			switch {
			case m.Tensor != nil:
				s, err := sum(m.Tensor)
				if cerr := m.Tensor.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return err
				}
				total += s
				n++
			case string(m.Bytes) == "done":
				fmt.Printf("tensors %d sum %g\n", n, total)
				return nil
			}
		}
	case "stream":
		s, err := zctipc.AttachStream(args[1])
		if err != nil {
			return err
		}
		defer s.Close()
		r, err := s.Reader(-1)
		if err != nil {
			return err
		}
		defer r.Close()
		fmt.Println("joined")
		total, n, whole := 0.0, 0, true
		for {
			frame, err := r.Look(ctx)
			if errors.Is(err, zctipc.ErrEnded) {
				fmt.Printf("frames %d sum %g whole %t\n", n, total, whole)
				return nil
			}
			if err != nil {
				return err
			}
			first := math.Float32frombits(binary.LittleEndian.Uint32(frame))
			for j := 0; j+4 <= len(frame); j += 4 {
				x := math.Float32frombits(binary.LittleEndian.Uint32(frame[j:]))
				whole = whole && x == first
				total += float64(x)
			}
			if _, err := r.Increment(); err != nil {
				return err
			}
			n++
		}
	}
	return fmt.Errorf("unknown mode %q", args[0])
}
