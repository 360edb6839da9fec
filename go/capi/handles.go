package main

import (
	"sync"
	"sync/atomic"
)

// nextHandle numbers the objects of every table, so that a handle of one
// kind passed where another is expected is refused rather than misread.
var nextHandle atomic.Uint64

// table maps the integer handles that cross the C ABI to Go objects, which
// must never cross it themselves.
type table[T any] struct {
	mu sync.RWMutex
	m  map[uint64]T
	// miss, when set, is asked for a handle the table does not hold: it
	// returns the object the handle names elsewhere (Note [a ref made
	// outside Go] in handoff.c), which the table holds from then on.
	miss func(h uint64) (T, bool)
}

func newTable[T any]() *table[T] { return &table[T]{m: map[uint64]T{}} }

func (t *table[T]) put(v T) uint64 {
	h := nextHandle.Add(1)
	t.mu.Lock()
	t.m[h] = v
	t.mu.Unlock()
	return h
}

func (t *table[T]) get(h uint64) (T, error) {
	t.mu.RLock()
	v, ok := t.m[h]
	t.mu.RUnlock()
	if !ok {
		return t.missed(h, true)
	}
	return v, nil
}

// take removes h from the table and returns what it named.
func (t *table[T]) take(h uint64) (T, error) {
	t.mu.Lock()
	v, ok := t.m[h]
	delete(t.m, h)
	t.mu.Unlock()
	if !ok {
		return t.missed(h, false)
	}
	return v, nil
}

// missed returns what miss finds for h, which the table did not hold, and
// with keep holds it under h from then on. It runs under the table's lock,
// with h looked up again first: a take-over is one step to every other
// call on h, so a take (a release) that misses while another call's miss
// has taken the light ref out of C but not yet put it here waits for it
// and finds it, and two calls that miss at once both find the one ref,
// rather than the loser being told that a valid handle is unknown.
func (t *table[T]) missed(h uint64, keep bool) (T, error) {
	var v T
	if t.miss == nil {
		return v, errBadHandle
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if v, ok := t.m[h]; ok {
		if !keep {
			delete(t.m, h)
		}
		return v, nil
	}
	v, ok := t.miss(h)
	if !ok {
		return v, errBadHandle
	}
	if keep {
		t.m[h] = v
	}
	return v, nil
}

// restore puts v back under h, a handle take took it from.
func (t *table[T]) restore(h uint64, v T) {
	t.mu.Lock()
	t.m[h] = v
	t.mu.Unlock()
}

// find returns an object of the table that ok accepts.
func (t *table[T]) find(ok func(T) bool) (T, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, v := range t.m {
		if ok(v) {
			return v, true
		}
	}
	var zero T
	return zero, false
}

// drain empties the table and returns what it held.
func (t *table[T]) drain() []T {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]T, 0, len(t.m))
	for h, v := range t.m {
		out = append(out, v)
		delete(t.m, h)
	}
	return out
}

// with runs fn, as an export does (run), on the object that handle h names
// in t.
func with[T any](t *table[T], h uint64, fn func(T) error) cInt {
	return run(func() error {
		v, err := t.get(h)
		if err != nil {
			return err
		}
		return fn(v)
	})
}

// closing runs fn, as an export does, on the object that handle h names,
// taking it out of t first: h is invalid afterwards, whatever fn returns.
func closing[T any](t *table[T], h uint64, fn func(T) error) cInt {
	return run(func() error {
		v, err := t.take(h)
		if err != nil {
			return err
		}
		return fn(v)
	})
}
