package zctipc

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/zctipc/zctipc/go/internal/daemon"
	"github.com/zctipc/zctipc/go/internal/shm"
)

// A program that links this package is its own cleanup daemon: started
// with daemon.SelfEnv set, it runs the daemon instead of its main.
func init() {
	if os.Getenv(daemon.SelfEnv) == "1" {
		os.Exit(daemon.Main(os.Args[1:]))
	}
}

// Environment variables of cleanup.
const (
	// CleanupEnv set to "0" turns crash cleanup off for this process.
	CleanupEnv = "ZCTIPC_CLEANUP"
	// DaemonEnv names a zctipcd program to start instead of this program.
	DaemonEnv = "ZCTIPC_DAEMON"
)

// SetSharingStrategy chooses where segments made from now on live:
// "file_system" (files in /dev/shm, the default) or "file_descriptor"
// (memfds handed to other processes by the cleanup daemon).
func SetSharingStrategy(name string) error {
	s, err := shm.ParseStrategy(name)
	if err != nil {
		return err
	}
	return shm.SetStrategy(s)
}

// SharingStrategy returns the strategy in force.
func SharingStrategy() string { return shm.CurrentStrategy().String() }

var cleanup struct {
	once sync.Once
	err  error
}

// startCleanup turns crash cleanup on, once, unless CleanupEnv says not
// to. When no daemon can be reached it warns once on stderr and goes on
// (under file_descriptor, making a segment then fails with the reason).
func startCleanup() {
	cleanup.once.Do(func() {
		if os.Getenv(CleanupEnv) == "0" {
			return
		}
		if cleanup.err = EnableCleanup(""); cleanup.err != nil {
			fmt.Fprintln(os.Stderr, "zctipc: crash cleanup is not running:", cleanup.err)
		}
	})
}

// EnableCleanup records the counts this process holds in a ledger and
// registers with the user's cleanup daemon, so that what this process holds
// is given up if it ends without closing it. When no daemon runs it starts
// daemonPath, or with "" the program $ZCTIPC_DAEMON names, else this
// program itself. The first NewTensor, NewQueue, NewStream or attach does
// this on its own; calling it again does nothing.
func EnableCleanup(daemonPath string) error {
	if daemonPath == "" {
		daemonPath = os.Getenv(DaemonEnv)
	}
	l := daemon.Program(daemonPath)
	if daemonPath == "" {
		var err error
		if l, err = daemon.Self(); err != nil {
			return err
		}
	}
	_, err := daemon.Enable(l)
	return err
}

// DisableCleanup gives up everything this process holds and leaves the
// daemon, as a process may before it exits. Objects made before must not
// be used afterwards.
func DisableCleanup() error {
	_, err := shm.ReleaseAll()
	return errors.Join(err, daemon.Disable())
}
