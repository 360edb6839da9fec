package main

/*
#include "internal.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/ledger"
	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

func init() { refs.miss = claimLight }

// claimLight takes over the light ref h that handoff.c made (Note [a ref
// made outside Go] there): its count and its ledger entry become a Go ref,
// which the ref table holds under h from then on. It reports false when h
// names no light ref.
func claimLight(h uint64) (*buffer.Ref, bool) {
	var arena unsafe.Pointer
	var slot, gen C.uint32_t
	var entry C.int32_t
	if C.zct_light_ref_claim(C.uint64_t(h), &arena, &slot, &gen, &entry) == 0 {
		return nil, false
	}
	a, ok := pool.ArenaOfView(arena)
	if !ok {
		// A slot in use pins its arena, which stays mapped: not reached.
		panic(fmt.Sprintf("zctipc: a light ref's arena %p is not mapped", arena))
	}
	n := int(entry)
	if n < 0 {
		n = shm.NoEntry
	}
	return buffer.HeldSlotRef(a.Held(uint32(slot), uint32(gen)), n), true
}

// zctipc_go_arena_unpin gives back the count on an arena's segment that a
// slot held, whose last count handoff.c gave up, when it may be the last
// (the segment then goes).
//
//export zctipc_go_arena_unpin
func zctipc_go_arena_unpin(arena unsafe.Pointer) C.int {
	return run(func() error {
		a, ok := pool.ArenaOfView(arena)
		if !ok {
			return fmt.Errorf("an arena at %p that this process does not map: %w", arena, unix.EINVAL)
		}
		return a.Unpin()
	})
}

// zctipc_go_ledger_grow grows this process's ledger, which handoff.c found
// full: ZCT_OK when an entry may be free now.
//
//export zctipc_go_ledger_grow
func zctipc_go_ledger_grow() C.int {
	return run(func() error {
		if l := ledger.Current(); l == nil || !l.Grow() {
			return fmt.Errorf("the ledger is full: %w", unix.ENOSPC)
		}
		return nil
	})
}
