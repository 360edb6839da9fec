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
		if errors.Is(err, os.ErrNotExist) {
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

// Alive reports whether the process id still runs. A pid that now belongs to
// another process (a different start time) counts as dead. A zombie counts as
// dead too: it holds no mappings any more.
func Alive(id Identity) bool {
	if id.PID <= 0 {
		return false
	}
	raw, err := os.ReadFile("/proc/" + strconv.FormatInt(id.PID, 10) + "/stat")
	if err != nil {
		return false
	}
	start, err := parseStartTime(raw)
	if err != nil || start != id.StartTime {
		return false
	}
	end := bytes.LastIndexByte(raw, ')')
	if fields := bytes.Fields(raw[end+1:]); len(fields) > 0 {
		switch fields[0][0] {
		case 'Z', 'X', 'x':
			return false
		}
	}
	return true
}

// Gone reports whether the process that claimed something as pid (in a
// word of shared memory) is gone, given the identity it recorded beside the
// claim afterwards: by pid and start time once the record names pid, and
// until then (a process killed between its claim and its record) only when
// no process has that pid at all.
func Gone(pid int64, recorded Identity) bool {
	if pid <= 0 {
		return true
	}
	if recorded.PID != pid {
		_, err := StartTime(pid)
		return errors.Is(err, unix.ESRCH)
	}
	return !Alive(recorded)
}
