package zctipc

import (
	"context"
	"errors"
	"sync"

	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/futex"
	"github.com/zctipc/zctipc/go/internal/handover"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
)

// Queue is a zctipc queue: the ring Python's zctipc.Queue uses, so that Go
// and Python programs exchange messages through it (docs/format.md). It is
// safe for concurrent use: any number of goroutines may put and get at
// once, each Get taking its message into a buffer of its own, and Close
// from any goroutine wakes the calls blocked on it, which return ErrClosed.
type Queue struct{ q *queue.Queue }

// NewQueue creates a queue whose ring holds maxBytes (rounded up to a power
// of two; the largest message), or with maxBytes 0 an unbounded queue, as
// Python's zctipc.Queue() is: its ring uses the memory of the messages it
// holds, and a put fails only when shared memory is full. An empty name
// makes a random one.
func NewQueue(name string, maxBytes int) (*Queue, error) {
	startCleanup()
	create := func() (*queue.Queue, error) { return queue.Create(name, uint64(maxBytes), 0) } // a negative size is refused as too large
	if maxBytes == 0 {
		create = func() (*queue.Queue, error) { return queue.CreateUnbounded(name, 0) }
	}
	q, err := create()
	if err != nil {
		return nil, err
	}
	return &Queue{q: q}, nil
}

// AttachQueue attaches the queue name (Python: Queue.name).
func AttachQueue(name string) (*Queue, error) {
	startCleanup()
	q, err := queue.Attach(name)
	if err != nil {
		return nil, err
	}
	return &Queue{q: q}, nil
}

// Wait says how blocking calls wait: by default (Sleeping) a short spin that yields the CPU and then a sleep on a futex,
// which uses no CPU; Polling looks without yielding or a system call, and
// sees a message or frame within a microsecond while it takes a core.
type Wait = futex.Policy

// Sleeping is a 50 µs spin, then a sleep. The default Wait of a handle
// is this with its spin stretched, up to 200 µs, while messages or frames
// come steadily (futex.NewSleeping).
var Sleeping = futex.Sleeping

// Polling is a Wait that polls and never sleeps.
var Polling = Wait{Poll: true, Spin: -1}

// SetWait says how this handle's Put and Get wait.
func (q *Queue) SetWait(w Wait) error {
	if err := q.check(); err != nil {
		return err
	}
	return q.q.SetWait(w)
}

func (q *Queue) check() error {
	if q == nil || q.q == nil {
		return nilErr("Queue")
	}
	return nil
}

// Name returns the queue's full segment name ("" for a nil Queue).
func (q *Queue) Name() string {
	if q.check() != nil {
		return ""
	}
	return q.q.Segment().Name()
}

// Len returns the number of messages in the queue.
func (q *Queue) Len() (int, error) {
	if err := q.check(); err != nil {
		return 0, err
	}
	return q.q.Len()
}

// Wait returns once the queue holds a message, without taking it, or when
// ctx is done (ErrEmpty, with ctx.Err()). Another consumer may take the
// message first; it is for a goroutine that waits on the queue among other
// things, as a select would.
func (q *Queue) Wait(ctx context.Context) error {
	if err := q.check(); err != nil {
		return err
	}
	return q.q.WaitNonEmptyContext(ctx)
}

// Close closes this process's handle on the queue, waking the calls
// blocked on it; they return ErrClosed once Close has given up this
// process's count. Closing twice returns ErrClosed.
func (q *Queue) Close() error {
	if err := q.check(); err != nil {
		return err
	}
	return q.q.Close()
}

// PutTensor sends t as a descriptor (no copy): the receiver, Go or Python
// (which gets a NumPy array, or what the tensor came as from Python: a
// torch tensor, say), maps the same memory. A tensor with no elements, or
// one that came inline, travels inline (its type, shape and bytes). The
// message holds its own count, so t may be closed once PutTensor returned.
// It waits for room until ctx is done (ErrFull, with ctx.Err()).
func (q *Queue) PutTensor(ctx context.Context, t *Tensor) error {
	if err := q.check(); err != nil {
		return err
	}
	if err := t.enter(); err != nil {
		return err
	}
	defer t.guard.Leave()
	in, inline, err := t.inlineRecord()
	if err != nil {
		return err
	}
	if inline {
		_, err := handover.PutContext(ctx, q.q, &in, nil)
		return err
	}
	d, r, err := t.describe()
	if err != nil {
		return err
	}
	rec := &message.Record{Type: message.TypeTensor, Descriptors: []message.Descriptor{d}}
	sent, err := handover.PutContext(ctx, q.q, rec, []*buffer.Ref{r})
	if !sent {
		return errors.Join(err, r.Release())
	}
	return err
}

// PutBytes sends raw bytes (Python receives them as bytes), waiting for
// room as PutTensor does.
func (q *Queue) PutBytes(ctx context.Context, b []byte) error {
	if err := q.check(); err != nil {
		return err
	}
	_, err := handover.PutContext(ctx, q.q, &message.Record{Type: message.TypeBytes, Payload: b}, nil)
	return err
}

// Message is what Get takes: a tensor, raw bytes, or a Python pickle, which
// Go cannot read (its Pickle bytes are opaque; the counts of the arrays it
// carried are given up). Exactly one field is not nil: an empty bytes
// message has empty, non-nil Bytes.
type Message struct {
	Tensor *Tensor // the receiver closes it
	Bytes  []byte
	Pickle []byte
}

// keptBuffer bounds the receive buffers kept for reuse.
const keptBuffer = 1 << 20

var receiveBuffers = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// Get takes the next message, waiting until ctx is done (ErrEmpty, with
// ctx.Err()); a cancellation wakes the wait at once.
func (q *Queue) Get(ctx context.Context) (Message, error) {
	if err := q.check(); err != nil {
		return Message{}, err
	}
	bp := receiveBuffers.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= keptBuffer {
			receiveBuffers.Put(bp)
		}
	}()
	for {
		// Room for every view a record's header can ask: a record that
		// asked more than the room given could never be taken.
		n, err := q.q.GetContext(ctx, *bp, message.MaxViews)
		var re *queue.RangeError
		if errors.As(err, &re) {
			*bp = make([]byte, re.Need) // and take it at once
			continue
		}
		if err != nil {
			return Message{}, err
		}
		return decode((*bp)[:n])
	}
}

// decode turns a record taken from the queue into a Message that owns what
// it carries, copying the payload out of the receive buffer.
func decode(raw []byte) (Message, error) {
	var m handover.Message
	if err := m.Decode(raw); err != nil {
		return Message{}, err
	}
	switch m.Type {
	case message.TypeTensor:
		if err := m.Adopt(); err != nil {
			return Message{}, err
		}
		return Message{Tensor: received(&m.Views[0])}, nil
	case message.TypeBytes:
		return Message{Bytes: append([]byte{}, m.Payload...)}, nil // empty, not nil: told from no bytes
	case message.TypeInline:
		return Message{Tensor: inlineTensor(&m.Inline)}, nil
	}
	return Message{Pickle: append([]byte{}, m.Payload...)}, m.Drop()
}
