package queue

import "github.com/zctipc/zctipc/go/internal/message"

// write encodes rec at byte position at, going on at offset 0 when it runs
// past the end of the ring.
func (q *Queue) write(at uint32, rec *message.Record) {
	pos, size := at&q.mask, uint32(rec.Size())
	if pos+size <= q.capacity {
		rec.Encode(q.ring[pos : pos+size])
		return
	}
	buf := make([]byte, size) // once per lap of the ring at most
	rec.Encode(buf)
	copy(q.ring[0:], buf[copy(q.ring[pos:], buf):])
}

// read copies the record of size bytes at byte position at into dst.
func (q *Queue) read(at, size uint32, dst []byte) {
	pos := at & q.mask
	n := copy(dst[:size], q.ring[pos:min(pos+size, q.capacity)])
	copy(dst[n:size], q.ring[:size-uint32(n)])
}
