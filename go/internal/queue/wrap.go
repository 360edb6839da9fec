package queue

// read copies the record of size bytes at byte position at into dst, going
// on at offset 0 when it runs past the end of the ring (records wrap: the
// data plane writes them so).
func (q *Queue) read(at, size uint32, dst []byte) {
	pos := at & q.mask
	n := copy(dst[:size], q.ring[pos:min(pos+size, q.capacity)])
	copy(dst[n:size], q.ring[:size-uint32(n)])
}
