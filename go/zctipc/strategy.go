package zctipc

import (
	"github.com/zctipc/zctipc/go/daemon"
	"github.com/zctipc/zctipc/go/shm"
)

// SetSharingStrategy chooses where segments made from now on live:
// "file_system" (files in /dev/shm, the default) or "file_descriptor"
// (memfds handed to other processes by the cleanup daemon; that needs
// EnableCleanup).
func SetSharingStrategy(name string) error {
	s, err := shm.ParseStrategy(name)
	if err != nil {
		return err
	}
	return shm.SetStrategy(s)
}

// SharingStrategy returns the strategy in force.
func SharingStrategy() string { return shm.CurrentStrategy().String() }

// EnableCleanup records the counts this process holds in a ledger and
// registers with the user's cleanup daemon (starting the zctipcd program at
// daemonPath when none runs), so that what this process holds is given up
// if it is killed. Python processes do this by themselves.
func EnableCleanup(daemonPath string) error {
	_, err := daemon.Enable(daemonPath)
	return err
}

// DisableCleanup gives up everything this process holds and leaves the
// daemon, as a process does before it exits.
func DisableCleanup() error {
	_, err := shm.ReleaseAll()
	daemon.Disable()
	return err
}
