// Package fdpass sends and receives messages with file descriptors attached
// (SCM_RIGHTS) over Unix sockets, and refuses what a careless or hostile
// peer sends: more descriptors than expected, control data cut short, or
// control messages of other kinds. Every descriptor that arrives is either
// returned to the caller or closed.
package fdpass

import (
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// MaxFDs is the most descriptors one message may carry.
const MaxFDs = 4

// ErrRejected is wrapped by the errors for messages that are refused.
var ErrRejected = errors.New("malformed file-descriptor message")

// Send writes msg, with fds attached, as one message.
func Send(c *net.UnixConn, msg []byte, fds ...int) error {
	if len(fds) > MaxFDs {
		return fmt.Errorf("%d file descriptors in one message, at most %d: %w", len(fds), MaxFDs, unix.EINVAL)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(msg, oob, nil)
	if err != nil {
		return err
	}
	if n != len(msg) || oobn != len(oob) {
		return fmt.Errorf("short write: %d of %d bytes and %d of %d control bytes: %w", n, len(msg), oobn, len(oob), unix.EIO)
	}
	return nil
}

// Recv reads one message into buf and returns its length and the
// descriptors that came with it, at most want of them, which the caller
// closes. A message with more descriptors than want, truncated control data
// or data, or control messages other than SCM_RIGHTS is refused with an
// error wrapping ErrRejected, and every descriptor it brought is closed.
// When control data was cut short because this process is at its limit of
// open files, the error says so and names RLIMIT_NOFILE.
func Recv(c *net.UnixConn, buf []byte, want int) (int, []int, error) {
	// Room for more than want, so that extra descriptors arrive (and are
	// closed) rather than vanish into a truncation that hides them.
	oob := make([]byte, unix.CmsgSpace(4*(MaxFDs+want)))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, nil, err
	}
	fds, perr := parse(oob[:oobn])
	reject := func(format string, args ...any) (int, []int, error) {
		closeAll(fds)
		return 0, nil, errors.Join(fmt.Errorf("%w: "+format, append([]any{ErrRejected}, args...)...), perr)
	}
	switch {
	case perr != nil:
		return reject("bad control data")
	case flags&unix.MSG_CTRUNC != 0:
		if limit := atLimit(); limit != "" {
			closeAll(fds)
			return 0, nil, fmt.Errorf("could not receive a file descriptor: %s: %w", limit, unix.EMFILE)
		}
		return reject("control data cut short (more descriptors than %d were sent)", MaxFDs+want)
	case flags&unix.MSG_TRUNC != 0:
		return reject("message longer than %d bytes", len(buf))
	case len(fds) > want:
		return reject("%d file descriptors where at most %d were expected", len(fds), want)
	}
	return n, fds, nil
}

// parse returns the descriptors of the SCM_RIGHTS messages in oob; any other
// control message is an error (its descriptors, if any, are returned to be
// closed).
func parse(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	var errs []error
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			errs = append(errs, fmt.Errorf("control message of level %d and type %d", msgs[i].Header.Level, msgs[i].Header.Type))
			continue
		}
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fds = append(fds, got...)
	}
	return fds, errors.Join(errs...)
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// atLimit returns a description of this process's file limit when its open
// files are at (or near) the soft RLIMIT_NOFILE, and "" otherwise.
func atLimit() string {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil {
		return ""
	}
	// Counting needs a descriptor of its own: at the limit there is none.
	open := "all"
	if probe, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		unix.Close(probe)
		n := OpenFiles()
		if n < 0 || uint64(n)+MaxFDs < lim.Cur {
			return ""
		}
		open = fmt.Sprint(n)
	} else if !errors.Is(err, unix.EMFILE) {
		return ""
	}
	return fmt.Sprintf("this process has %s of the %d files its RLIMIT_NOFILE soft limit allows open (hard limit %d); "+
		"raise it with ulimit -n or resource.setrlimit(resource.RLIMIT_NOFILE, ...)", open, lim.Cur, lim.Max)
}

// OpenFiles returns the number of descriptors this process has open, or -1
// when /proc cannot tell.
func OpenFiles() int {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return -1
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return -1
	}
	return len(names) - 1 // the directory's own descriptor
}

// RaiseLimit raises this process's soft RLIMIT_NOFILE to its hard limit, as
// far as it is allowed, and returns the soft limit in force afterwards.
func RaiseLimit() (uint64, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= lim.Max {
		return lim.Cur, nil
	}
	raised := lim
	raised.Cur = lim.Max
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err != nil {
		return lim.Cur, err
	}
	return raised.Cur, nil
}
