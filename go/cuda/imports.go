package cuda

import (
	"errors"
	"os"
	"strconv"
	"strings"
)

// A VMM allocation received by name (a block of zctipc's caching allocator,
// see package cudaalloc) is mapped once per process and cached, as legacy
// IPC allocations are: a tensor from the same allocation, received again,
// costs no socket round trip and no mapping.

type importedAllocation struct {
	*Allocation
	users int
}

var (
	// imported caches the allocations this process mapped by share name;
	// ipcMu guards it.
	imported = map[string]*importedAllocation{}
	// imports counts the allocations mapped by OpenShared.
	imports int
)

// ImportCount returns how many allocations OpenShared has mapped.
func ImportCount() int {
	ipcMu.Lock()
	defer ipcMu.Unlock()
	return imports
}

// own returns this process's allocation shared as name, if it is ours.
func own(name string) *Allocation {
	pid, _, _ := strings.Cut(name, "-")
	if pid != strconv.Itoa(os.Getpid()) {
		return nil
	}
	serveMu.Lock()
	s := serving
	serveMu.Unlock()
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shared[name]
}

// OpenShared returns the address, offset bytes into the allocation shared
// as name, in this process: its own allocation as it is, another process's
// mapped on the device it lives on the first time (cached afterwards). It
// makes stream (0: the legacy default stream) wait for the producer's event
// (zero: none). CloseShared gives the use back.
func OpenShared(name string, offset uint64, event [HandleSize]byte, stream uint64) (uint64, error) {
	if a := own(name); a != nil {
		if offset >= a.Size {
			return 0, errors.New("an offset past the allocation " + name)
		}
		return a.Ptr + offset, nil
	}
	ipcMu.Lock()
	a := imported[name]
	ipcMu.Unlock()
	if a == nil {
		m, err := ImportShared(name, -1)
		if err != nil {
			return 0, err
		}
		ipcMu.Lock()
		if a = imported[name]; a == nil { // another thread may have mapped it meanwhile
			a = &importedAllocation{Allocation: m}
			imported[name] = a
			imports++
			m = nil
		}
		ipcMu.Unlock()
		if m != nil {
			_ = m.Free()
		}
	}
	if offset >= a.Size {
		return 0, errors.New("an offset past the allocation " + name)
	}
	var ptr uint64
	err := onDevice(a.Device, func() error {
		ipcMu.Lock()
		defer ipcMu.Unlock()
		if err := waitEvent(event, stream); err != nil {
			return err
		}
		a.users++
		ptr = a.Ptr + offset
		return nil
	})
	return ptr, err
}

// CloseShared gives back one use of an allocation opened by OpenShared. It
// stays mapped (and cached) until Forget.
func CloseShared(name string) {
	ipcMu.Lock()
	defer ipcMu.Unlock()
	if a := imported[name]; a != nil && a.users > 0 {
		a.users--
	}
}

// forgetImported unmaps allocations mapped by OpenShared that no view uses,
// keeping at most keep of them.
func forgetImported(keep int) error {
	ipcMu.Lock()
	var idle []*importedAllocation
	for name, a := range imported {
		if a.users == 0 {
			if keep > 0 {
				keep--
				continue
			}
			idle = append(idle, a)
			delete(imported, name)
		}
	}
	ipcMu.Unlock()
	var errs []error
	for _, a := range idle {
		errs = append(errs, a.Free())
	}
	return errors.Join(errs...)
}
