// Looking up which segment this process maps at an address.

package shm

import (
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/header"
)

// Find returns a new handle on the tensor segment whose data holds the n
// bytes at addr, with their offset in the data region, when this process has
// it open. The handle holds no count of its own (the process already
// counts); AddRef adds one to hand on.
func Find(addr uintptr, n uint64) (*Segment, uint64, bool) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	f, data, readOnly, off, ok := lookup(addr, n)
	if !ok {
		return nil, 0, false
	}
	f.handles++
	return &Segment{f: f, data: data, readOnly: readOnly}, off, true
}

// Holds reports whether the n bytes at addr lie in the data of a tensor
// segment this process has open, as Find would, without a handle.
func Holds(addr uintptr, n uint64) bool {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	_, _, _, _, ok := lookup(addr, n)
	return ok
}

// lookup finds the open tensor segment whose data (read-only or not) holds
// the n bytes at addr, under the registry's lock.
func lookup(addr uintptr, n uint64) (f *file, data []byte, readOnly bool, off uint64, ok bool) {
	for _, f := range registry.files {
		if f.handles == 0 || f.hdr.Kind != header.KindTensor {
			continue
		}
		for _, readOnly := range []bool{false, true} {
			if !f.hasMapping(readOnly) {
				continue
			}
			data := f.region(readOnly)
			if len(data) == 0 {
				continue
			}
			base := uintptr(unsafe.Pointer(&data[0]))
			if addr >= base && uint64(addr-base)+n <= uint64(len(data)) {
				return f, data, readOnly, uint64(addr - base), true
			}
		}
	}
	return nil, nil, false, 0, false
}

// NameAt returns the name of the segment whose mapping in this process
// holds addr, for error messages; false when none does.
func NameAt(addr uintptr) (string, bool) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	for _, f := range registry.files {
		for _, m := range [][]byte{f.rw, f.ro, f.ctl} {
			if len(m) > 0 {
				base := uintptr(unsafe.Pointer(&m[0]))
				if addr >= base && addr-base < uintptr(len(m)) {
					return f.name, true
				}
			}
		}
	}
	return "", false
}
