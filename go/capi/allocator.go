package main

/*
#include "internal.h"
*/
import "C"

import (
	"errors"
	"fmt"

	"github.com/zctipc/zctipc/go/internal/cuda"
	"github.com/zctipc/zctipc/go/internal/cudaalloc"
)

// deviceCache is the process's caching allocator of shareable device
// memory, the one torch's pluggable allocator reaches.
var deviceCache = cudaalloc.New()

//export zct_cuda_cache_alloc
func zct_cuda_cache_alloc(device C.int32_t, size, stream C.uint64_t, ptr *C.uint64_t) C.int {
	return run(func() error {
		if ptr == nil {
			return errNilArg
		}
		p, err := deviceCache.Alloc(int(device), uint64(size), uint64(stream))
		*ptr = C.uint64_t(p)
		return err
	})
}

//export zct_cuda_shareable
func zct_cuda_shareable(device C.int32_t) C.int {
	return run(func() error { return cuda.Shareable(int(device)) })
}

//export zct_cuda_cache_free
func zct_cuda_cache_free(ptr C.uint64_t) C.int {
	return run(func() error { return deviceCache.Free(uint64(ptr)) })
}

//export zct_cuda_cache_trim
func zct_cuda_cache_trim(device C.int32_t, released *C.int64_t) C.int {
	return run(func() error {
		if released == nil {
			return errNilArg
		}
		*released = C.int64_t(deviceCache.Trim(int(device)))
		return nil
	})
}

//export zct_cuda_cache_stats
func zct_cuda_cache_stats(stats *C.zct_cuda_cache_info) C.int {
	return run(func() error {
		if stats == nil {
			return errNilArg
		}
		st := deviceCache.Stats()
		*stats = C.zct_cuda_cache_info{
			segments: C.int64_t(st.Segments), reserved: C.uint64_t(st.Reserved), in_use: C.uint64_t(st.InUse),
			blocks: C.int64_t(st.Blocks), creates: C.uint64_t(st.Creates), hits: C.uint64_t(st.Hits),
			trimmed: C.uint64_t(st.Trimmed), requested: C.uint64_t(st.Requested),
		}
		return nil
	})
}

// vmmName reads the share name of a zct_cuda_vmm.
func vmmName(v *C.zct_ccuda_vmm) string {
	return C.GoString(&v.name[0])
}

//export zct_cuda_vmm_export
func zct_cuda_vmm_export(ptr, stream C.uint64_t, vmm *C.zct_cuda_vmm, out *C.zct_handle) C.int {
	return run(func() error {
		if vmm == nil || out == nil {
			return errNilArg
		}
		sh, err := shareAny(uint64(ptr))
		if err != nil {
			return err
		}
		e, err := cuda.ExportEvent(sh.Device, uint64(stream))
		if err != nil {
			return err
		}
		if len(sh.Name) >= len(vmm.name) {
			return fmt.Errorf("a share name of %d bytes does not fit zct_cuda_vmm: %w", len(sh.Name), errRange)
		}
		*vmm = C.zct_cuda_vmm{offset: C.uint64_t(sh.Offset), size: C.uint64_t(sh.Size), device: C.int32_t(sh.Device)}
		for i := range len(sh.Name) {
			vmm.name[i] = C.char(sh.Name[i])
		}
		*ipcHandle(&vmm.event) = e.Event
		*out = C.zct_handle(cudaExports.put(e))
		return nil
	})
}

// shareAny says where the VMM memory at ptr lies for another process: a
// block of the caching allocator, an allocation of zct_cuda_alloc (shared
// now if it was not), or an allocation this process mapped by name (whose
// producer serves it). Other memory is ErrNotOurs.
func shareAny(ptr uint64) (cudaalloc.Shared, error) {
	sh, err := deviceCache.Share(ptr)
	if !errors.Is(err, cudaalloc.ErrNotOurs) {
		return sh, err
	}
	if a, ok := cudaAllocs.find(func(a *sharedAllocation) bool { return ptr >= a.Ptr && ptr < a.Ptr+a.Size }); ok {
		name, err := a.shareName()
		return cudaalloc.Shared{Name: name, Offset: ptr - a.Ptr, Size: a.Size, Device: a.Resident}, err
	}
	if name, a, ok := cuda.FindImported(ptr); ok {
		return cudaalloc.Shared{Name: name, Offset: ptr - a.Ptr, Size: a.Size, Device: a.Resident}, nil
	}
	return cudaalloc.Shared{}, err
}

//export zct_cuda_vmm_open
func zct_cuda_vmm_open(vmm *C.zct_ccuda_vmm, stream C.uint64_t, ptr *C.uint64_t) C.int {
	return run(func() error {
		if vmm == nil || ptr == nil {
			return errNilArg
		}
		p, err := cuda.OpenShared(vmmName(vmm), uint64(vmm.offset), *ipcHandle(&vmm.event), uint64(stream))
		*ptr = C.uint64_t(p)
		return err
	})
}

//export zct_cuda_vmm_close
func zct_cuda_vmm_close(vmm *C.zct_ccuda_vmm) C.int {
	return run(func() error {
		if vmm == nil {
			return errNilArg
		}
		cuda.CloseShared(vmmName(vmm))
		return nil
	})
}

//export zct_cuda_vmm_imports
func zct_cuda_vmm_imports(count *C.int64_t) C.int {
	return run(func() error {
		if count == nil {
			return errNilArg
		}
		*count = C.int64_t(cuda.ImportCount())
		return nil
	})
}
