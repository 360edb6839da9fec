// Package proc identifies processes by pid and start time, so that a reused
// pid is never mistaken for the process that first had it.
package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Identity names one process for its whole life: its pid together with its
// start time in clock ticks since boot (field 22 of /proc/PID/stat).
type Identity struct {
	PID       int64
	StartTime uint64
}

var (
	selfOnce sync.Once
	self     Identity
	selfErr  error
)

// Self returns the identity of the calling process. It is read once per
// process; a forked child must not use a library that has already read it.
func Self() (Identity, error) {
	selfOnce.Do(func() {
		pid := int64(os.Getpid())
		start, err := StartTime(pid)
		self, selfErr = Identity{PID: pid, StartTime: start}, err
	})
	return self, selfErr
}

// StartTime returns the start time of process pid in clock ticks since boot.
// The error wraps unix.ESRCH when no such process exists.
func StartTime(pid int64) (uint64, error) {
	raw, err := os.ReadFile("/proc/" + strconv.FormatInt(pid, 10) + "/stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) { // ESRCH: it exited while read
			return 0, fmt.Errorf("process %d: %w", pid, unix.ESRCH)
		}
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	return parseStartTime(raw)
}

// parseStartTime reads field 22 of a /proc/PID/stat line. The command name in
// field 2 may hold spaces and parentheses, so fields are counted from the
// last ')'.
func parseStartTime(stat []byte) (uint64, error) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, fmt.Errorf("malformed /proc stat line: %w", unix.EINVAL)
	}
	// After ") " come fields 3, 4, ...; the start time is field 22.
	fields := bytes.Fields(stat[end+1:])
	const startField = 22 - 3
	if len(fields) <= startField {
		return 0, fmt.Errorf("short /proc stat line: %w", unix.EINVAL)
	}
	v, err := strconv.ParseUint(string(fields[startField]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bad start time in /proc stat line: %w", unix.EINVAL)
	}
	return v, nil
}

// Note [Unreadable is not dead]
//
// Who calls: every part of zctipc that gives up what another process held
// once that process is gone (the daemon's sweeps, the collector's census,
// a ledger's sweeper claim, robust locks and stream reader slots). What can
// go wrong: /proc/PID/stat can fail to open for reasons that say nothing
// of the process: this process has no descriptor left (EMFILE, ENFILE), the
// kernel has no memory, /proc is mounted with hidepid or not at all. What
// must never happen: such a failure is taken for a death, and the counts,
// ledger or lock of a live process are given up under it. So Check tells
// three answers apart, and Dead, which callers act on, is true only when
// /proc says the process has exited.

// Liveness is what /proc tells of a process.
type Liveness uint8

const (
	// Unknown means /proc could not be read; the process may run.
	Unknown Liveness = iota
	// Running means the process runs (or is stopped) with the recorded
	// start time.
	Running
	// Exited means no process has the pid, another process has it now (a
	// different start time), or it is a zombie, which holds no mappings.
	Exited
)

// String returns "unknown", "running" or "exited".
func (l Liveness) String() string {
	switch l {
	case Running:
		return "running"
	case Exited:
		return "exited"
	}
	return "unknown"
}

// Check tells whether the process id runs, has exited, or cannot be told
// (Unknown, with the error that kept /proc from telling: callers that act
// on a death treat it as alive and look again later).
func Check(id Identity) (Liveness, error) {
	if id.PID <= 0 {
		return Exited, nil
	}
	raw, err := os.ReadFile("/proc/" + strconv.FormatInt(id.PID, 10) + "/stat")
	switch {
	case errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH): // ESRCH: it exited while read
		return Exited, nil
	case err != nil:
		return Unknown, fmt.Errorf("process %d: %w", id.PID, err)
	}
	start, err := parseStartTime(raw)
	if err != nil {
		return Unknown, fmt.Errorf("process %d: %w", id.PID, err)
	}
	if start != id.StartTime {
		return Exited, nil
	}
	end := bytes.LastIndexByte(raw, ')')
	if fields := bytes.Fields(raw[end+1:]); len(fields) > 0 {
		switch fields[0][0] {
		case 'Z', 'X', 'x':
			return Exited, nil
		}
	}
	return Running, nil
}

// Dead reports whether /proc says the process id is gone (see Check): a
// process whose entry cannot be read is not dead (Note [Unreadable is not
// dead]).
func Dead(id Identity) bool {
	l, err := Check(id)
	return err == nil && l == Exited // an error comes with Unknown, which is not Exited
}

// Gone reports whether the process that claimed something as pid (in a
// word of shared memory) is gone, given the identity it recorded beside the
// claim afterwards: by pid and start time once the record names pid, and
// until then (a process killed between its claim and its record, or in
// its release between clearing the record and the claim) only when no
// live process has that pid: none has it, or a zombie does. A zombie
// under pid is the claimant, dead, or a process that took the pid after
// the claimant exited; either way the claimant is gone, and its parent
// may never reap it (a parent blocked behind the very lock it claimed).
// A process /proc cannot tell of is not gone.
func Gone(pid int64, recorded Identity) bool {
	if pid <= 0 {
		return true
	}
	if recorded.PID != pid {
		start, err := StartTime(pid)
		if err != nil {
			return errors.Is(err, unix.ESRCH)
		}
		// Exited: a zombie, or the pid taken by another process since.
		return Dead(Identity{PID: pid, StartTime: start})
	}
	return Dead(recorded)
}
