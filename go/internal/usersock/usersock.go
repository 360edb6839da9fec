// Package usersock holds what makes a Unix socket of zctipc reachable by
// its user only: the runtime directory the sockets live in, mode 0700 and
// the user's own (RuntimeDir, EnsureDir), and the SO_PEERCRED check of the
// process at the other end of a connection (PeerOf).
//
// The two halves are one rule, so they live together: a socket is private
// because its directory is, and its server still checks every peer. They
// are a package of their own, below package daemon, because the daemon is
// not their only user: the CUDA share server of package cuda keeps its
// socket in the same directory and checks its peers the same way, and
// should not import the daemon (and with it the collector, queues and
// ledgers) to do so.
package usersock

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// RuntimeDirEnv names the environment variable that sets the daemon's
// directory.
const RuntimeDirEnv = "ZCTIPC_RUNTIME_DIR"

// RuntimeDir returns the directory of the user's daemon: $ZCTIPC_RUNTIME_DIR,
// or zctipc in $XDG_RUNTIME_DIR, or /tmp/zctipc-<uid>; with a segment
// directory other than /dev/shm, a subdirectory named for it, so that each
// segment directory has its own daemon.
func RuntimeDir() string {
	if d := os.Getenv(RuntimeDirEnv); d != "" {
		return filepath.Clean(d)
	}
	base := fmt.Sprintf("/tmp/zctipc-%d", unix.Geteuid())
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" {
		if st, err := os.Stat(x); err == nil && st.IsDir() {
			base = filepath.Join(x, "zctipc")
		}
	}
	if dir := shm.Dir(); dir != "/dev/shm" {
		sum := sha256.Sum256([]byte(dir))
		base = filepath.Join(base, "shm-"+hex.EncodeToString(sum[:8]))
	}
	return base
}

// EnsureDir makes dir (and a missing parent) mode 0700, or checks that the
// one there is a directory, not a link, of this user, with no permission for
// group or others: the socket in it is reachable only by the user.
func EnsureDir(dir string) error {
	if parent := filepath.Dir(dir); parent != dir {
		if _, err := os.Lstat(parent); errors.Is(err, os.ErrNotExist) {
			if err := EnsureDir(parent); err != nil {
				return err
			}
		}
	}
	if err := unix.Mkdir(dir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create the runtime directory %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("runtime directory %s: %w", dir, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("runtime directory %s is not a directory (a link?): %w", dir, unix.EACCES)
	case st.Uid != uint32(unix.Geteuid()):
		return fmt.Errorf("runtime directory %s belongs to uid %d, not to this user: %w", dir, st.Uid, unix.EACCES)
	case st.Mode&0o077 != 0:
		return fmt.Errorf("runtime directory %s has mode %#o; it must be 0700: %w", dir, st.Mode&0o777, unix.EACCES)
	}
	return nil
}

// PeerOf returns the identity of the process at the other end of c, after
// checking that it runs as this user.
func PeerOf(c *net.UnixConn) (proc.Identity, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return proc.Identity{}, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return proc.Identity{}, err
	}
	if cerr != nil {
		return proc.Identity{}, cerr
	}
	if cred.Uid != uint32(unix.Geteuid()) {
		return proc.Identity{}, fmt.Errorf("peer pid %d runs as uid %d, not as this user: %w", cred.Pid, cred.Uid, unix.EACCES)
	}
	start, err := proc.StartTime(int64(cred.Pid))
	if err != nil {
		return proc.Identity{}, err
	}
	return proc.Identity{PID: int64(cred.Pid), StartTime: start}, nil
}
