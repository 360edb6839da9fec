// Command consumer takes tensors another process (Go or Python) handed over
// through zctipc, and prints what it got.
//
//	consumer tensor REF_JSON    attach the tensor a TensorRef describes; print "sum S"
//	consumer queue QUEUE        take tensors until the bytes "done"; print "tensors K sum S"
//	consumer stream STREAM      join as a reader (print "joined"), read frames until the
//	                            stream ends; print "frames K sum S whole W"
//	consumer burst QUEUE K G    take K messages with G goroutines at once; print "end T",
//	                            the wall-clock time in ns when the last was taken
//	consumer echo IN OUT        take tensors from queue IN until the bytes "done", print
//	                            "DTYPE SHAPE" of each and put it back on queue OUT, then
//	                            put "done" there
//
// Tensors must be float32 (but in echo); the sum is of every element of every tensor.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"

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
	ctx := context.Background()
	if len(args) == 4 && args[0] == "burst" {
		return burst(ctx, args[1], args[2], args[3])
	}
	if len(args) == 3 && args[0] == "echo" {
		return echo(ctx, args[1], args[2])
	}
	if len(args) != 2 {
		return fmt.Errorf("usage: consumer tensor REF_JSON | queue QUEUE | stream STREAM | burst QUEUE K G | echo IN OUT")
	}
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
			frame, err := zctipc.ReaderLook[float32](ctx, r)
			if errors.Is(err, zctipc.ErrEnded) {
				fmt.Printf("frames %d sum %g whole %t\n", n, total, whole)
				return nil
			}
			if err != nil {
				return err
			}
			for _, x := range frame {
				whole = whole && x == frame[0]
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

// burst takes k messages from the queue with g goroutines at once, and
// prints when the last was taken.
func burst(ctx context.Context, name, k, g string) error {
	total, err := strconv.Atoi(k)
	if err != nil {
		return err
	}
	workers, err := strconv.Atoi(g)
	if err != nil {
		return err
	}
	q, err := zctipc.AttachQueue(name)
	if err != nil {
		return err
	}
	defer q.Close()
	var taken atomic.Int64
	errs := make(chan error, workers)
	for range workers {
		go func() {
			for taken.Add(1) <= int64(total) {
				if _, err := q.Get(ctx); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			return err
		}
	}
	fmt.Printf("end %d\n", time.Now().UnixNano())
	return nil
}

// echo takes tensors from queue in until the bytes "done", prints the type
// and shape of each, and puts it on queue out (a tensor another process
// sent goes on without a copy; one with no elements, as its type and
// shape).
func echo(ctx context.Context, in, out string) error {
	qi, err := zctipc.AttachQueue(in)
	if err != nil {
		return err
	}
	defer qi.Close()
	qo, err := zctipc.AttachQueue(out)
	if err != nil {
		return err
	}
	defer qo.Close()
	for {
		m, err := qi.Get(ctx)
		if err != nil {
			return err
		}
		switch {
		case m.Tensor != nil:
			fmt.Println(m.Tensor.DType(), m.Tensor.Shape())
			err := qo.PutTensor(ctx, m.Tensor)
			if cerr := m.Tensor.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case string(m.Bytes) == "done":
			return qo.PutBytes(ctx, m.Bytes)
		default:
			return fmt.Errorf("echo: a message that is not a tensor: %+v", m)
		}
	}
}
