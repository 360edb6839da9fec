package cuda

/*
#include "driver.h"
*/
import "C"

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Allocation is device memory made with cuMemCreate (here or in another
// process, whose file descriptor was imported), mapped in this process.
// It is not for concurrent use: its owner frees it once.
type Allocation struct {
	Resident int    // the device the memory lives on
	Device   int    // the device it is mapped for here
	Ptr      uint64 // where it is mapped
	Size     uint64 // bytes, a multiple of the allocation granularity
	handle   C.CUmemGenericAllocationHandle
	freed    bool
}

// Shareable returns nil when device ordinal can make memory another process
// maps by file descriptor (virtual memory management with POSIX
// file-descriptor handles), and says why not otherwise. It asks the device's
// attributes, which needs no context on the device.
func Shareable(ordinal int) error {
	if err := device(ordinal); err != nil {
		return err
	}
	for _, a := range []struct {
		attr int
		what string
	}{{attrVirtualMemory, "virtual memory management"}, {attrPosixFD, "POSIX file-descriptor handles"}} {
		var v C.int
		if err := check("cuDeviceGetAttribute", C.zct_cuDeviceAttribute(C.int(ordinal), C.int(a.attr), &v)); err != nil {
			return err
		}
		if v == 0 {
			return notShareable(ordinal, "it has no "+a.what, ErrNotSupported)
		}
	}
	return nil
}

// The device attributes Shareable asks: CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_
// MANAGEMENT_SUPPORTED and CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_
// DESCRIPTOR_SUPPORTED.
const (
	attrVirtualMemory = 102
	attrPosixFD       = 103
)

// notShareable says that device ordinal cannot make memory shareable by
// file descriptor, and why.
func notShareable(ordinal int, why string, err error) error {
	return fmt.Errorf("CUDA device %d cannot make memory shareable by file descriptor: %s "+
		"(some virtualized GPUs lack it): %w", ordinal, why, err)
}

// ErrNotSupported means a device or driver lacks what a call needs; it is
// an ErrDriver, as the driver's own refusal would be.
var ErrNotSupported = fmt.Errorf("not supported by this CUDA device or driver: %w", ErrDriver)

// Synchronize waits until the work queued on device ordinal (every stream
// of its primary context) is done.
func Synchronize(ordinal int) error {
	return onDevice(ordinal, func() error { return check("cuCtxSynchronize", C.zct_cuCtxSynchronize()) })
}

// Granularity returns the allocation granularity of device ordinal for
// shareable allocations.
func Granularity(ordinal int) (uint64, error) {
	var g C.size_t
	err := onDevice(ordinal, func() error { return check("cuMemGetAllocationGranularity", C.zct_cuGranularity(C.int(ordinal), &g)) })
	return uint64(g), err
}

// Alloc makes size bytes (rounded up to the granularity) of shareable memory
// on device ordinal and maps it here.
func Alloc(ordinal int, size uint64) (*Allocation, error) {
	if size == 0 {
		return nil, fmt.Errorf("an allocation of 0 bytes: %w", unix.EINVAL)
	}
	g, err := Granularity(ordinal)
	if err != nil {
		return nil, err
	}
	size = (size + g - 1) / g * g
	a := &Allocation{Resident: ordinal, Device: ordinal, Size: size}
	err = onDevice(ordinal, func() error {
		if err := check("cuMemCreate", C.zct_cuMemCreate(C.int(ordinal), C.size_t(size), &a.handle)); err != nil {
			return refused(ordinal, size, err)
		}
		return a.mapHere(g)
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// cudaErrorNotSupported is CUDA_ERROR_NOT_SUPPORTED.
const cudaErrorNotSupported = 801

// refused returns cuMemCreate's refusal err of size bytes on device ordinal
// said plainly: an *OutOfMemory saying what the device has free when it
// ran out, or that the device cannot share memory by file descriptor. The
// caller holds the device's context.
func refused(ordinal int, size uint64, err error) error {
	var e *Error
	if errors.As(err, &e) && e.Result == cudaErrorNotSupported {
		return notShareable(ordinal, "the driver refuses POSIX file-descriptor handles", err)
	}
	if e == nil || e.Result != cudaErrorOutOfMemory {
		return err
	}
	var free, total C.size_t
	if check("cuMemGetInfo", C.zct_cuMemGetInfo(&free, &total)) != nil {
		free, total = 0, 0 // unknown: the message says 0 of 0
	}
	return &OutOfMemory{Device: ordinal, Asked: size, Free: uint64(free), Total: uint64(total), Err: err}
}

// mapHere maps the allocation on a.Device; on failure it releases the
// handle. The caller holds the device's context.
func (a *Allocation) mapHere(align uint64) error {
	var p C.CUdeviceptr
	err := check("cuMemMap", C.zct_cuMemMapOn(a.handle, C.size_t(a.Size), C.size_t(align), C.int(a.Resident), C.int(a.Device), &p))
	if err != nil {
		return errors.Join(err, check("cuMemRelease", C.zct_cuMemRelease(a.handle)))
	}
	a.Ptr = uint64(p)
	return nil
}

// ExportFD returns a new file descriptor for the allocation, to be passed
// to another process (SCM_RIGHTS); the caller closes it.
func (a *Allocation) ExportFD() (int, error) {
	var fd C.int
	err := onDevice(a.Resident, func() error { return check("cuMemExportToShareableHandle", C.zct_cuMemExportFD(a.handle, &fd)) })
	return int(fd), err
}

// Import maps an allocation of size bytes living on device resident, whose
// file descriptor another process exported, for device mapping here. The
// caller keeps (and closes) fd.
func Import(fd int, size uint64, resident, mapping int) (*Allocation, error) {
	g, err := Granularity(resident)
	if err != nil {
		return nil, err
	}
	if size == 0 || size%g != 0 {
		return nil, fmt.Errorf("an imported allocation of %d bytes is not a multiple of the granularity %d: %w", size, g, unix.EINVAL)
	}
	a := &Allocation{Resident: resident, Device: mapping, Size: size}
	err = onDevice(mapping, func() error {
		if err := check("cuMemImportFromShareableHandle", C.zct_cuMemImportFD(C.int(fd), &a.handle)); err != nil {
			return err
		}
		return a.mapHere(g)
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Free unmaps the allocation here and releases this process's handle; the
// memory goes when every process released it.
func (a *Allocation) Free() error {
	if a.freed {
		return nil
	}
	a.freed = true
	return onDevice(a.Device, func() error {
		return errors.Join(check("cuMemUnmap", C.zct_cuMemUnmapFree(C.CUdeviceptr(a.Ptr), C.size_t(a.Size))),
			check("cuMemRelease", C.zct_cuMemRelease(a.handle)))
	})
}
