package queue

import "unsafe"

// The warm window's steps (skipping to the next lap, rewinding an emptied
// ring, giving pages back) are the data plane's (package plane, queue.c).
// What is left here reads the ring for a walk that takes nothing
// (Descriptors, Peek).

// skipAt reports whether the record at position at is a skip record; the
// caller knows that a record is there.
func (q *Queue) skipAt(at uint32) bool {
	pos := at & q.mask
	return q.warm && pos%8 == 0 && q.ring[pos+4] == typeSkip && *(*uint32)(unsafe.Pointer(&q.ring[pos])) == q.capacity-pos
}
