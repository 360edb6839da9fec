package daemon

import (
	"io"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// MaxLogBytes bounds daemon.log: a write that would take it past this
// first renames it daemon.log.1 (replacing the one before) and starts a new
// one, so the two hold at most about twice this.
const MaxLogBytes = 1 << 20

// rotatingLog writes the daemon's log to the file open on fds (its standard
// output and error, which the detached start pointed at path), starting a
// new file when it is full: what a crash prints lands in the log as well.
type rotatingLog struct {
	mu   sync.Mutex
	path string
	fds  []int // fds[0] is written to; every one is pointed at a new file
}

func (r *rotatingLog) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var st unix.Stat_t
	if unix.Fstat(r.fds[0], &st) == nil && st.Size+int64(len(p)) > MaxLogBytes {
		r.rotate()
	}
	return unix.Write(r.fds[0], p)
}

// rotate moves the full log aside and points the fds at a new one; when
// that fails, the log goes on in the old file.
func (r *rotatingLog) rotate() {
	if err := os.Rename(r.path, r.path+".1"); err != nil {
		return
	}
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	for _, fd := range r.fds {
		unix.Dup3(int(f.Fd()), fd, 0)
	}
}

// NewLog returns a writer to the file at path, open on fds, that starts a
// new file when it is full, as the daemon's log does.
func NewLog(path string, fds ...int) io.Writer { return &rotatingLog{path: path, fds: fds} }

// logOnStderr returns the log of the daemon started detached for dir, when
// its standard error is that directory's daemon.log, else nil.
func logOnStderr(dir string) *rotatingLog {
	path := filepath.Join(dir, LogName)
	var onErr, file unix.Stat_t
	if unix.Fstat(2, &onErr) != nil || unix.Stat(path, &file) != nil ||
		onErr.Dev != file.Dev || onErr.Ino != file.Ino {
		return nil
	}
	return &rotatingLog{path: path, fds: []int{2, 1}}
}

// rotateIfFull moves a full log aside before a new daemon appends to it.
func rotateIfFull(path string) {
	if st, err := os.Stat(path); err == nil && st.Size() > MaxLogBytes {
		os.Rename(path, path+".1")
	}
}
