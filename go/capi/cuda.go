package main

/*
#include "internal.h"
*/
import "C"

import (
	"sync"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/cuda"
)

var (
	cudaExports = newTable[*cuda.Export]()
	cudaAllocs  = newTable[*sharedAllocation]()
)

// sharedAllocation is a VMM allocation and the name it is shared under.
type sharedAllocation struct {
	*cuda.Allocation
	mu   sync.Mutex
	name string
}

// shareName shares the allocation, once, and returns its name.
func (a *sharedAllocation) shareName() (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.name == "" {
		name, err := a.Share()
		if err != nil {
			return "", err
		}
		a.name = name
	}
	return a.name, nil
}

//export zct_cuda_devices
func zct_cuda_devices(count, driverVersion *C.int32_t) C.int {
	return run(func() error {
		if count == nil || driverVersion == nil {
			return errNilArg
		}
		n, err := cuda.Devices()
		if err != nil {
			return err
		}
		v, err := cuda.DriverVersion()
		*count, *driverVersion = C.int32_t(n), C.int32_t(v)
		return err
	})
}

// ipcHandle views a handle field of a zct_cuda_ipc as Go bytes.
func ipcHandle(p *[64]C.uint8_t) *[cuda.HandleSize]byte {
	return (*[cuda.HandleSize]byte)(unsafe.Pointer(p))
}

//export zct_cuda_ipc_export
func zct_cuda_ipc_export(device C.int32_t, ptr, stream C.uint64_t, ipc *C.zct_cuda_ipc, out *C.zct_handle) C.int {
	return run(func() error {
		if ipc == nil || out == nil {
			return errNilArg
		}
		e, err := cuda.ExportMemory(int(device), uint64(ptr), uint64(stream))
		if err != nil {
			return err
		}
		*ipc = C.zct_cuda_ipc{}
		*ipcHandle(&ipc.handle) = e.Handle
		*ipcHandle(&ipc.event) = e.Event
		ipc.offset, ipc.size, ipc.device = C.uint64_t(e.Offset), C.uint64_t(e.Size), C.int32_t(e.Device)
		*out = C.zct_handle(cudaExports.put(e))
		return nil
	})
}

//export zct_cuda_ipc_record
func zct_cuda_ipc_record(h C.zct_handle, stream C.uint64_t) C.int {
	return with(cudaExports, uint64(h), func(e *cuda.Export) error {
		return e.Record(uint64(stream))
	})
}

//export zct_cuda_ipc_release
func zct_cuda_ipc_release(h C.zct_handle) C.int {
	return closing(cudaExports, uint64(h), func(e *cuda.Export) error {
		return e.Release()
	})
}

//export zct_cuda_ipc_open
func zct_cuda_ipc_open(ipc *C.zct_ccuda_ipc, stream C.uint64_t, ptr *C.uint64_t) C.int {
	return run(func() error {
		if ipc == nil || ptr == nil {
			return errNilArg
		}
		p, err := cuda.Open(*ipcHandle(&ipc.handle), uint64(ipc.offset), int(ipc.device), *ipcHandle(&ipc.event), uint64(stream))
		*ptr = C.uint64_t(p)
		return err
	})
}

//export zct_cuda_ipc_close
func zct_cuda_ipc_close(ipc *C.zct_ccuda_ipc) C.int {
	return run(func() error {
		if ipc == nil {
			return errNilArg
		}
		return cuda.Close(*ipcHandle(&ipc.handle))
	})
}

//export zct_cuda_ipc_trim
func zct_cuda_ipc_trim(keep C.int32_t) C.int {
	return run(func() error { return cuda.Forget(int(max(keep, 0))) })
}

//export zct_cuda_ipc_opens
func zct_cuda_ipc_opens(count *C.int64_t) C.int {
	return run(func() error {
		if count == nil {
			return errNilArg
		}
		*count = C.int64_t(cuda.OpenCount())
		return nil
	})
}

//export zct_cuda_alloc
func zct_cuda_alloc(device C.int32_t, size C.uint64_t, out *C.zct_handle, ptr, sizeOut *C.uint64_t) C.int {
	return run(func() error {
		if out == nil || ptr == nil || sizeOut == nil {
			return errNilArg
		}
		a, err := cuda.Alloc(int(device), uint64(size))
		if err != nil {
			return err
		}
		*out = C.zct_handle(cudaAllocs.put(&sharedAllocation{Allocation: a}))
		*ptr, *sizeOut = C.uint64_t(a.Ptr), C.uint64_t(a.Size)
		return nil
	})
}

//export zct_cuda_share
func zct_cuda_share(h C.zct_handle, name *C.char, capacity C.uint64_t) C.int {
	return with(cudaAllocs, uint64(h), func(a *sharedAllocation) error {
		shared, err := a.shareName()
		if err != nil {
			return err
		}
		var n C.uint64_t
		return copyOut(shared, name, capacity, &n)
	})
}

//export zct_cuda_import
func zct_cuda_import(name *C.zct_cchar, device C.int32_t, out *C.zct_handle, ptr, size *C.uint64_t, resident *C.int32_t) C.int {
	return run(func() error {
		if name == nil || out == nil || ptr == nil || size == nil || resident == nil {
			return errNilArg
		}
		a, err := cuda.ImportShared(goString(name), int(device))
		if err != nil {
			return err
		}
		*out = C.zct_handle(cudaAllocs.put(&sharedAllocation{Allocation: a}))
		*ptr, *size, *resident = C.uint64_t(a.Ptr), C.uint64_t(a.Size), C.int32_t(a.Resident)
		return nil
	})
}

//export zct_cuda_free
func zct_cuda_free(h C.zct_handle) C.int {
	return closing(cudaAllocs, uint64(h), func(a *sharedAllocation) error {
		if a.name != "" {
			cuda.Unshare(a.name)
		}
		return a.Free()
	})
}
