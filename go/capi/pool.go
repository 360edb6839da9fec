package main

/*
#include "internal.h"
*/
import "C"

import (
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/buffer"
	"github.com/zctipc/zctipc/go/internal/pool"
)

//export zct_pool_alloc
func zct_pool_alloc(nbytes C.uint64_t, timeoutMS C.int64_t, ref *C.zct_handle, data *unsafe.Pointer, size *C.uint64_t) C.int {
	return zct_pool_alloc_leaving(nbytes, 0, timeoutMS, ref, data, size)
}

//export zct_pool_alloc_leaving
func zct_pool_alloc_leaving(nbytes, leave C.uint64_t, timeoutMS C.int64_t, ref *C.zct_handle, data *unsafe.Pointer, size *C.uint64_t) C.int {
	return run(func() error {
		if ref == nil || data == nil || size == nil {
			return errNilArg
		}
		s, err := pool.Default().AllocLeaving(uint64(nbytes), uint64(leave), deadline(timeoutMS))
		if err != nil {
			return err
		}
		*ref = C.zct_handle(refs.put(buffer.NewSlotRef(s)))
		*data = unsafe.Pointer(unsafe.SliceData(s.Data()))
		*size = C.uint64_t(len(s.Data()))
		return nil
	})
}

//export zct_pool_trim
func zct_pool_trim() C.int {
	return run(func() error { return pool.Default().Trim() })
}

//export zct_pool_stats_get
func zct_pool_stats_get(stats *C.zct_pool_stats) C.int {
	return run(func() error {
		if stats == nil {
			return errNilArg
		}
		st := pool.Default().Stats()
		*stats = C.zct_pool_stats{
			arenas:       C.uint64_t(st.Arenas),
			reserved:     C.uint64_t(st.Reserved),
			limit:        C.uint64_t(st.Limit),
			slots_in_use: C.uint64_t(st.SlotsInUse),
			bytes_in_use: C.uint64_t(st.BytesInUse),
		}
		return nil
	})
}

//export zct_pool_set_limit
func zct_pool_set_limit(limit C.uint64_t) C.int {
	return run(func() error {
		pool.Default().SetLimit(uint64(limit))
		return nil
	})
}
