package zctipc

import (
	"context"
	"errors"
	"time"

	"github.com/zctipc/zctipc/go/buffer"
	"github.com/zctipc/zctipc/go/message"
	"github.com/zctipc/zctipc/go/queue"
)

// waitSlice bounds one wait of a blocking call, so that it sees its
// context's cancellation soon.
const waitSlice = 50 * time.Millisecond

// Errors of non-blocking or timed-out queue operations.
var (
	ErrFull  = queue.ErrFull
	ErrEmpty = queue.ErrEmpty
)

// Queue is a zctipc queue: the ring Python's zctipc.Queue uses, so that Go
// and Python programs exchange messages through it (docs/format.md).
type Queue struct {
	q   *queue.Queue
	buf []byte
}

// NewQueue creates a queue whose ring holds maxBytes (rounded up to a power
// of two). An empty name makes a random one.
func NewQueue(name string, maxBytes int) (*Queue, error) {
	q, err := queue.Create(name, uint64(maxBytes), 0)
	if err != nil {
		return nil, err
	}
	return &Queue{q: q}, nil
}

// AttachQueue attaches the queue name (Python: Queue.name).
func AttachQueue(name string) (*Queue, error) {
	q, err := queue.Attach(name)
	if err != nil {
		return nil, err
	}
	return &Queue{q: q}, nil
}

// Name returns the queue's full segment name.
func (q *Queue) Name() string { return q.q.Segment().Name() }

// Len returns the number of messages in the queue (an error once the queue
// is closed).
func (q *Queue) Len() (int, error) { return q.q.Len() }

// Close closes this process's handle on the queue.
func (q *Queue) Close() error { return q.q.Close() }

// PutTensor sends t as a descriptor (no copy): the receiver, Go or Python
// (which gets a NumPy array), maps the same memory. The message holds its
// own count, so t may be closed once PutTensor returned.
func (q *Queue) PutTensor(ctx context.Context, t *Tensor) error {
	d, r, err := t.describe()
	if err != nil {
		return err
	}
	rec := &message.Record{Type: message.TypeTensor, Descriptors: []message.Descriptor{d}}
	r.Sending()
	if err := retry(ctx, ErrFull, func(deadline time.Time) error { return q.q.Put(rec, deadline) }); err != nil {
		r.Unsent()
		return errors.Join(err, r.Release())
	}
	return r.Sent()
}

// PutBytes sends raw bytes (Python receives them as bytes).
func (q *Queue) PutBytes(ctx context.Context, b []byte) error {
	rec := &message.Record{Type: message.TypeBytes, Payload: b}
	return retry(ctx, ErrFull, func(deadline time.Time) error { return q.q.Put(rec, deadline) })
}

// Message is what Get takes: a tensor, raw bytes, or a Python pickle, which
// Go cannot read (its Pickle bytes are opaque; the counts of the arrays it
// carried are given up).
type Message struct {
	Tensor *Tensor // the receiver closes it
	Bytes  []byte
	Pickle []byte
}

// Get takes the next message, waiting until ctx is done.
func (q *Queue) Get(ctx context.Context) (Message, error) {
	if q.buf == nil {
		q.buf = make([]byte, 64<<10)
	}
	var n int
	err := retry(ctx, ErrEmpty, func(deadline time.Time) error {
		var err error
		n, err = q.q.Get(q.buf, message.MaxDescriptors, deadline)
		var re *queue.RangeError
		if errors.As(err, &re) {
			q.buf = make([]byte, re.Need)
			return ErrEmpty // try again at once with room for it
		}
		return err
	})
	if err != nil {
		return Message{}, err
	}
	rec, err := message.DecodeRecord(q.buf[:n])
	if err != nil {
		return Message{}, err
	}
	switch rec.Type {
	case message.TypeTensor:
		t, err := received(&rec.Descriptors[0])
		return Message{Tensor: t}, err
	case message.TypeBytes:
		return Message{Bytes: append([]byte(nil), rec.Payload...)}, nil
	}
	var errs []error
	for i := range rec.Descriptors {
		errs = append(errs, buffer.Drop(&rec.Descriptors[i]))
	}
	return Message{Pickle: append([]byte(nil), rec.Payload...)}, errors.Join(errs...)
}

// retry calls op with deadlines of at most waitSlice until it returns
// something other than again, or ctx is done.
func retry(ctx context.Context, again error, op func(deadline time.Time) error) error {
	for {
		deadline := time.Now().Add(waitSlice)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		err := op(deadline)
		if !errors.Is(err, again) {
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			return errors.Join(err, cerr)
		}
	}
}
