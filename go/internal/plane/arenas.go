package plane

/*
#include <stdlib.h>
#include "plane.h"
*/
import "C"

import "unsafe"

// Listed is an arena's entry in the table of the arenas this process maps
// (arenas.c), which the C ABI's take of a hand-off looks its descriptors'
// arenas up in: a copy of the arena's view in C memory, which lives until
// Unlist.
type Listed struct{ p *C.zp_arena }

// List adds the arena of view v, mapped under name (tickets: an arena of
// tickets), whose segment's count is the word pins, to the table; the
// arena must stay mapped until Unlist returned. An arena the table has no
// room for is listed nowhere, and its hand-offs go through Go.
//
// An owned arena is this process's own, which it hands slots out of: the C
// ABI takes tickets from its own arenas of tickets (Disown ends that).
func List(name string, v Arena, tickets, owned bool, pins *int64) Listed {
	p := (*C.zp_arena)(C.malloc(C.sizeof_zp_arena))
	*p = C.zp_arena(v)
	C.zp_arenas_add((*C.uint8_t)(unsafe.Pointer(unsafe.StringData(name))), C.uint32_t(len(name)), p, c32(tickets),
		c32(owned), (*C.int64_t)(unsafe.Pointer(pins)))
	return Listed{p}
}

func c32(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// Disown says that the arena is this process's own no more: the C ABI
// hands no slot out of it.
func (l Listed) Disown() {
	if l.p != nil {
		C.zp_arenas_disown(l.p)
	}
}

// Unlist takes the arena out of the table, waiting until no call of the C
// ABI holds it, and frees its copy.
func (l Listed) Unlist() {
	if l.p != nil {
		C.zp_arenas_remove(l.p)
		C.free(unsafe.Pointer(l.p))
	}
}

// Pointer is the arena's view as the C ABI knows it, for finding the arena
// it names (zct_light_ref_claim).
func (l Listed) Pointer() unsafe.Pointer { return unsafe.Pointer(l.p) }
