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
		return v, errBadHandle
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
		return v, errBadHandle
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
