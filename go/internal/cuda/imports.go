package cuda

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
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

// Mapped returns how many allocations mapped by OpenShared are mapped now.
func Mapped() int {
	ipcMu.Lock()
	defer ipcMu.Unlock()
	return len(imported)
}

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

// KeepIdle is how many allocations mapped by OpenShared that no view uses
// stay mapped, for the next receipt; beyond it the oldest idle one is
// unmapped, since a mapping holds the producer's GPU memory.
const KeepIdle = 8

// idle lists the mapped allocations no view uses, oldest first; ipcMu
// guards it.
var idle []string

// OpenShared returns the address, offset bytes into the allocation shared
// as name, in this process: its own allocation as it is, another process's
// mapped on the device it lives on the first time (cached afterwards). It
// makes stream (0: the legacy default stream) wait for the producer's event
// (zero: none). CloseShared gives the use back.
func OpenShared(name string, offset uint64, event [HandleSize]byte, stream uint64) (uint64, error) {
	if a := own(name); a != nil {
		return a.at(name, offset)
	}
	ipcMu.Lock()
	a := imported[name]
	if a != nil {
		a.use()
	}
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
		a.use()
		ipcMu.Unlock()
		if m != nil {
			_ = m.Free()
		}
	}
	ptr, err := a.at(name, offset)
	if err == nil {
		err = onDevice(a.Device, func() error {
			ipcMu.Lock()
			defer ipcMu.Unlock()
			return waitEvent(event, stream)
		})
	}
	if err != nil {
		CloseShared(name)
		return 0, err
	}
	return ptr, nil
}

// at returns the address offset bytes into a, shared as name.
func (a *Allocation) at(name string, offset uint64) (uint64, error) {
	if offset >= a.Size {
		return 0, fmt.Errorf("offset %d past the allocation %s of %d bytes: %w", offset, name, a.Size, unix.EINVAL)
	}
	return a.Ptr + offset, nil
}

// use counts one more user of a, which is no longer idle. The caller holds
// ipcMu.
func (a *importedAllocation) use() {
	if a.users == 0 {
		for i, n := range idle {
			if imported[n] == a {
				idle = append(idle[:i], idle[i+1:]...)
				break
			}
		}
	}
	a.users++
}

// FindImported returns the allocation mapped by OpenShared that holds the
// address ptr, and its share name.
func FindImported(ptr uint64) (string, *Allocation, bool) {
	ipcMu.Lock()
	defer ipcMu.Unlock()
	for name, a := range imported {
		if ptr >= a.Ptr && ptr < a.Ptr+a.Size {
			return name, a.Allocation, true
		}
	}
	return "", nil, false
}

// CloseShared gives back one use of an allocation opened by OpenShared. It
// stays mapped (and cached) while it is one of the KeepIdle most recently
// idle, or until Forget; the caller's work on it must be done.
func CloseShared(name string) {
	ipcMu.Lock()
	a := imported[name]
	if a == nil || a.users == 0 {
		ipcMu.Unlock()
		return
	}
	a.users--
	var drop *importedAllocation
	if a.users == 0 {
		idle = append(idle, name)
		if len(idle) > KeepIdle {
			drop = imported[idle[0]]
			delete(imported, idle[0])
			idle = idle[1:]
		}
	}
	ipcMu.Unlock()
	if drop != nil {
		_ = drop.Free()
	}
}

// forgetImported unmaps allocations mapped by OpenShared that no view uses,
// keeping at most keep of them (the most recently idle).
func forgetImported(keep int) error {
	ipcMu.Lock()
	var drop []*importedAllocation
	for len(idle) > keep {
		drop = append(drop, imported[idle[0]])
		delete(imported, idle[0])
		idle = idle[1:]
	}
	ipcMu.Unlock()
	var errs []error
	for _, a := range drop {
		errs = append(errs, a.Free())
	}
	return errors.Join(errs...)
}
