package cuda

/*
#include "driver.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// HandleSize is the size of a CUDA IPC memory or event handle.
const HandleSize = 64

// Export describes device memory shared by legacy IPC: the handle of the
// allocation that holds it, where the memory lies in that allocation, and
// the event recorded after the producer's stream work. It is a value.
type Export struct {
	Device int
	Handle [HandleSize]byte // cuIpcGetMemHandle of the allocation's base
	Offset uint64           // of the memory from the allocation's base
	Size   uint64           // of the allocation
	Event  [HandleSize]byte // an interprocess event, recorded on the producer's stream
	event  uintptr
}

var (
	ipcMu sync.Mutex
	// exported maps the handles this process made to the bases they name:
	// a process never opens its own handle (CUDA refuses it), it uses the
	// memory it has.
	exported = map[[HandleSize]byte]uint64{}
	// opened caches the allocations this process opened, so that each is
	// opened once however often it is received.
	opened = map[[HandleSize]byte]*openAllocation{}
	// events caches opened interprocess events, at most KeepEvents of
	// them, eventOrder the order they were opened in.
	events     = map[[HandleSize]byte]uintptr{}
	eventOrder [][HandleSize]byte
	// opens counts cuIpcOpenMemHandle calls.
	opens int
)

// OpenCount returns how many allocations this process opened with
// cuIpcOpenMemHandle.
func OpenCount() int {
	ipcMu.Lock()
	defer ipcMu.Unlock()
	return opens
}

type openAllocation struct {
	base   uint64
	device int
	users  int
}

// ExportMemory makes an Export of the device memory at ptr on device
// ordinal, with an interprocess event recorded on stream (0: the legacy
// default stream) that a consumer waits on before it reads. Record records
// the event again for a later send.
func ExportMemory(ordinal int, ptr, stream uint64) (*Export, error) {
	e := &Export{Device: ordinal}
	err := onDevice(ordinal, func() error {
		var base C.CUdeviceptr
		var size C.size_t
		if err := check("cuMemGetAddressRange", C.zct_cuAddressRange(C.CUdeviceptr(ptr), &base, &size)); err != nil {
			return fmt.Errorf("%#x is not device memory of device %d: %w", ptr, ordinal, err)
		}
		if err := check("cuIpcGetMemHandle", C.zct_cuIpcGetMemHandle(base, unsafe.Pointer(&e.Handle[0]))); err != nil {
			return err
		}
		e.Offset, e.Size = ptr-uint64(base), uint64(size)
		if err := e.newEvent(stream); err != nil {
			return err
		}
		ipcMu.Lock()
		exported[e.Handle] = uint64(base)
		ipcMu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// ExportEvent makes an Export that carries no memory handle, only an
// interprocess event recorded on stream: the consumer of memory shared some
// other way (a VMM allocation by name) waits on it before it reads.
func ExportEvent(ordinal int, stream uint64) (*Export, error) {
	e := &Export{Device: ordinal}
	if err := onDevice(ordinal, func() error { return e.newEvent(stream) }); err != nil {
		return nil, err
	}
	return e, nil
}

// newEvent makes e's interprocess event and records it on stream. The
// caller holds the device's context.
func (e *Export) newEvent(stream uint64) error {
	var ev C.uintptr_t
	if err := check("cuEventCreate", C.zct_cuEventCreateShared(unsafe.Pointer(&e.Event[0]), &ev)); err != nil {
		return err
	}
	e.event = uintptr(ev)
	if err := check("cuEventRecord", C.zct_cuEventRecord(ev, C.uintptr_t(stream))); err != nil {
		e.event = 0
		return errors.Join(err, check("cuEventDestroy", C.zct_cuEventDestroy(ev)))
	}
	return nil
}

// Record records the export's event on stream again, for another send of
// the same memory: a consumer that waits on it then waits for the work
// queued before this send (or later; never less).
func (e *Export) Record(stream uint64) error {
	if e.event == 0 {
		return fmt.Errorf("the export was released: %w", unix.EINVAL)
	}
	return onDevice(e.Device, func() error {
		return check("cuEventRecord", C.zct_cuEventRecord(C.uintptr_t(e.event), C.uintptr_t(stream)))
	})
}

// Release destroys the export's event; the memory is the producer's to free.
func (e *Export) Release() error {
	ipcMu.Lock()
	delete(exported, e.Handle)
	ipcMu.Unlock()
	if e.event == 0 {
		return nil
	}
	ev := e.event
	e.event = 0
	return onDevice(e.Device, func() error { return check("cuEventDestroy", C.zct_cuEventDestroy(C.uintptr_t(ev))) })
}

// Open returns the address of the memory an Export describes in this
// process, opening its allocation the first time (cached afterwards), and
// makes stream (0: the legacy default stream) wait for the producer's event
// (queued on the GPU: the caller does not block).
// Close gives the use back.
func Open(handle [HandleSize]byte, offset uint64, device int, event [HandleSize]byte, stream uint64) (uint64, error) {
	var ptr uint64
	err := onDevice(device, func() error {
		ipcMu.Lock()
		defer ipcMu.Unlock()
		if base, ok := exported[handle]; ok {
			ptr = base + offset // our own: same process, same memory, ordered by the caller's streams
			return nil
		}
		a := opened[handle]
		if a == nil {
			var base C.CUdeviceptr
			if err := check("cuIpcOpenMemHandle", C.zct_cuIpcOpenMemHandle(unsafe.Pointer(&handle[0]), &base)); err != nil {
				return err
			}
			opens++
			a = &openAllocation{base: uint64(base), device: device}
			opened[handle] = a
		}
		if err := waitEvent(event, stream); err != nil {
			return err
		}
		a.users++
		ptr = a.base + offset
		return nil
	})
	return ptr, err
}

// KeepEvents is how many opened interprocess events a process keeps: every
// storage a producer sends has an event of its own, so a consumer of many
// storages would otherwise gather them without end. The oldest is destroyed
// first; a stream already waiting on it still waits (the driver releases an
// event once the work that uses it is done).
const KeepEvents = 256

// waitEvent makes stream wait for an interprocess event. The caller holds
// ipcMu and the context of the device the event lives on.
func waitEvent(handle [HandleSize]byte, stream uint64) error {
	if handle == ([HandleSize]byte{}) {
		return nil
	}
	ev, ok := events[handle]
	if !ok {
		var e C.uintptr_t
		if err := check("cuIpcOpenEventHandle", C.zct_cuIpcOpenEvent(unsafe.Pointer(&handle[0]), &e)); err != nil {
			return err
		}
		ev = uintptr(e)
		if len(eventOrder) >= KeepEvents {
			_ = check("cuEventDestroy", C.zct_cuEventDestroy(C.uintptr_t(events[eventOrder[0]])))
			delete(events, eventOrder[0])
			eventOrder = eventOrder[1:]
		}
		events[handle] = ev
		eventOrder = append(eventOrder, handle)
	}
	return check("cuStreamWaitEvent", C.zct_cuStreamWaitEvent(C.uintptr_t(stream), C.uintptr_t(ev)))
}

// Close gives back one use of an allocation opened by Open. The allocation
// stays open (and cached) until Forget: the same producer allocation is
// usually received again.
func Close(handle [HandleSize]byte) error {
	ipcMu.Lock()
	defer ipcMu.Unlock()
	if a := opened[handle]; a != nil && a.users > 0 {
		a.users--
	}
	return nil
}

// Forget closes cached allocations that no view uses, keeping at most keep
// of each kind (legacy IPC, VMM by name) open.
func Forget(keep int) error {
	return errors.Join(forgetLegacy(keep), forgetImported(keep))
}

// forgetLegacy closes idle legacy allocations beyond keep. They leave the
// cache in the same critical section that finds them idle, so an Open in
// between cannot take one that is about to close.
func forgetLegacy(keep int) error {
	ipcMu.Lock()
	var idle []*openAllocation
	for h, a := range opened {
		if a.users > 0 {
			continue
		}
		if keep > 0 {
			keep--
			continue
		}
		idle = append(idle, a)
		delete(opened, h)
	}
	ipcMu.Unlock()
	var errs []error
	for _, a := range idle {
		errs = append(errs, onDevice(a.device, func() error {
			return check("cuIpcCloseMemHandle", C.zct_cuIpcCloseMemHandle(C.CUdeviceptr(a.base)))
		}))
	}
	return errors.Join(errs...)
}
