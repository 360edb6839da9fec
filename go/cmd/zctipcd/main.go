// Command zctipcd is the per-user cleanup daemon of zctipc (package daemon).
// Clients start it on demand; it exits after a while with nothing to watch.
//
//	zctipcd [-dir DIR] [-shm-dir DIR] [-idle 10s] [-silent 30s] [-detach]
//
// With -detach it starts itself again in a new session, with its output in
// the runtime directory's daemon.log, and exits at once. It exits with
// status 0 when another daemon already serves the directory.
package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/zctipc/zctipc/go/daemon"
	"github.com/zctipc/zctipc/go/shm"
	"golang.org/x/sys/unix"
)

func main() {
	dir := flag.String("dir", "", "runtime directory (default: $ZCTIPC_RUNTIME_DIR, $XDG_RUNTIME_DIR/zctipc or /tmp/zctipc-UID)")
	shmDir := flag.String("shm-dir", "", "segment directory (default: $ZCTIPC_SHM_DIR or /dev/shm)")
	idle := flag.Duration("idle", daemon.DefaultIdle, "exit after this long with nothing to watch")
	silent := flag.Duration("silent", daemon.DefaultSilent, "close a connection that watches no ledger after this long without a request")
	detach := flag.Bool("detach", false, "start in the background, detached, and return at once")
	flag.Parse()
	if *shmDir != "" {
		os.Setenv(shm.DirEnv, *shmDir)
	}
	if *dir == "" {
		*dir = daemon.RuntimeDir()
	}
	if *detach {
		if err := start(*dir, os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "zctipcd:", err)
			os.Exit(1)
		}
		return
	}
	os.Chdir("/") // hold no directory busy
	err := daemon.Serve(daemon.Options{Dir: *dir, Idle: *idle, Silent: *silent})
	switch {
	case errors.Is(err, daemon.ErrRunning):
		fmt.Fprintln(os.Stderr, "zctipcd:", err)
	case err != nil:
		fmt.Fprintln(os.Stderr, "zctipcd:", err)
		os.Exit(1)
	}
}

// start runs this program again without -detach, in a new session, with
// its output appended to the directory's log, and no other inherited file.
func start(dir string, args []string) error {
	var rest []string
	for _, a := range args {
		if a != "-detach" && a != "--detach" {
			rest = append(rest, a)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(dir, daemon.LogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
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
