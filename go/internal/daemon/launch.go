package daemon

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/usersock"
	"golang.org/x/sys/unix"
)

// SelfEnv names the environment variable that makes a program which links
// package zctipc run as the daemon (Main) instead of itself: a Go program
// is its own daemon, and needs no zctipcd binary beside it.
const SelfEnv = "ZCTIPC_DAEMON_SELF"

// Launcher says how a client starts a daemon when none runs: the program
// to run, with the environment it needs. The zero Launcher starts none.
type Launcher struct {
	Path string
	Env  []string // the whole environment of the daemon (it needs nothing else)
}

// Program is the Launcher of the zctipcd program at path ("" for none).
func Program(path string) Launcher { return Launcher{Path: path} }

// Self is the Launcher that runs this very program as the daemon: the
// program must link package zctipc, whose init turns it into the daemon
// when SelfEnv is set.
func Self() (Launcher, error) {
	exe, err := os.Executable()
	if err != nil {
		return Launcher{}, fmt.Errorf("find this program to run it as the daemon: %w", err)
	}
	return Launcher{Path: exe, Env: []string{SelfEnv + "=1"}}, nil
}

// Main is zctipcd's command line:
//
//	zctipcd [-dir DIR] [-shm-dir DIR] [-idle 10s] [-silent 30s] [-detach]
//
// With -detach it starts itself again in a new session, with its output in
// the runtime directory's daemon.log, and returns at once. It returns the
// exit status: 0 also when another daemon already serves the directory.
func Main(args []string) int {
	fs := flag.NewFlagSet("zctipcd", flag.ContinueOnError)
	dir := fs.String("dir", "", "runtime directory (default: $ZCTIPC_RUNTIME_DIR, $XDG_RUNTIME_DIR/zctipc or /tmp/zctipc-UID)")
	shmDir := fs.String("shm-dir", "", "segment directory (default: $ZCTIPC_SHM_DIR or /dev/shm)")
	idle := fs.Duration("idle", DefaultIdle, "exit after this long with nothing to watch")
	silent := fs.Duration("silent", DefaultSilent, "close a connection that watches no ledger after this long without a request")
	detach := fs.Bool("detach", false, "start in the background, detached, and return at once")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *shmDir != "" {
		os.Setenv(shm.DirEnv, *shmDir)
	}
	if *dir == "" {
		*dir = usersock.RuntimeDir()
	}
	if *detach {
		if err := detached(*dir, args); err != nil {
			fmt.Fprintln(os.Stderr, "zctipcd:", err)
			return 1
		}
		return 0
	}
	opts := Options{Dir: *dir, Idle: *idle, Silent: *silent}
	if log := logOnStderr(*dir); log != nil {
		opts.Log = log
	}
	os.Chdir("/") // hold no directory busy
	err := Serve(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "zctipcd:", err)
	}
	if err != nil && !errors.Is(err, ErrRunning) {
		return 1
	}
	return 0
}

// detached runs this program again without -detach, in a new session, with
// its output appended to the directory's log, no other inherited file, and
// its environment (SelfEnv too, when it is set).
func detached(dir string, args []string) error {
	var rest []string
	for _, a := range args {
		if a != "-detach" && a != "--detach" {
			rest = append(rest, a)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	rotateIfFull(filepath.Join(dir, LogName))
	logf, err := os.OpenFile(filepath.Join(dir, LogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// Whatever the client had open without close-on-exec stays here.
	unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	cmd := exec.Command(exe, rest...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}
