package usersock

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Note [Serving a socket that any process of the user may flood]
//
// Who can call: any process of this user can connect to a socket in the
// runtime directory, as often as it likes, and then say nothing, stop
// (SIGSTOP), die, or send anything. Other users cannot connect (the
// directory is 0700) and are refused by PeerOf where they could.
//
// What must never happen: the server stops accepting while its process
// lives; it takes every descriptor of its process (the daemon's, or a
// user's program that shares CUDA memory, whose own files would then fail);
// a client waits with no answer. So the Acceptor:
//
//   - serves at most Limit connections at once, and answers any other with
//     the reason (Refusal) before it closes it: a client learns it was
//     refused and why, rather than waiting for a timeout;
//   - retries every accept error but the listener's closing, backing off as
//     net/http's Server does (5 ms, doubling, at most 1 s): EMFILE, ENFILE,
//     ENOBUFS and ENOMEM pass once something is released;
//   - at EMFILE or ENFILE, closes a spare descriptor kept for the purpose, so
//     that it can take the connections that wait (without waiting itself)
//     and refuse them with the reason, then opens the spare again;
//   - leaves deadlines to Serve: each server bounds its exchanges and closes
//     a connection that says nothing.

// An Acceptor serves the connections of a listener. Its fields are set
// before Run; it is safe for concurrent use once it runs.
type Acceptor struct {
	// Name names the server in the reasons of refusals ("zctipcd").
	Name string
	// Serve serves one connection, in a goroutine of its own, and closes it.
	Serve func(c *net.UnixConn)
	// Refusal returns the message that tells a refused client why.
	Refusal func(reason error) []byte
	// Limit returns how many connections may be served at once (it is asked
	// at each connection, so it may follow the open-file limit).
	Limit func() int
	// Logf logs what a client is not told (nil: nothing is logged).
	Logf func(format string, args ...any)

	open    atomic.Int64
	refused atomic.Int64
}

// Open returns how many connections are being served.
func (a *Acceptor) Open() int { return int(a.open.Load()) }

// Refused returns how many connections were refused so far.
func (a *Acceptor) Refused() int { return int(a.refused.Load()) }

// Back-off of accept after an error, as net/http's Server does.
const (
	firstPause = 5 * time.Millisecond
	maxPause   = time.Second
	// refuseFor bounds the write of a refusal (a new connection's buffer
	// is empty: it does not block).
	refuseFor = 100 * time.Millisecond
)

// Run accepts the connections of ln until ln is closed.
func (a *Acceptor) Run(ln *net.UnixListener) {
	spare := openSpare() // closed to make room at EMFILE
	defer func() {
		if spare >= 0 {
			unix.Close(spare)
		}
	}()
	var pause time.Duration
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			pause = min(max(2*pause, firstPause), maxPause)
			if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
				spare = a.refuseWaiting(ln, spare)
			} else if a.Logf != nil {
				a.Logf("accept: %v (trying again in %v)", err, pause)
			}
			time.Sleep(pause)
			continue
		}
		pause = 0
		if limit := a.Limit(); int(a.open.Load()) >= limit {
			a.Refuse(c, fmt.Errorf("%s is at its limit of %d connections; try again later: %w", a.Name, limit, unix.EAGAIN))
			continue
		}
		a.open.Add(1)
		go func() {
			defer a.open.Add(-1)
			a.Serve(c)
		}()
	}
}

// NoFiles is the reason to refuse a connection when the process has no
// descriptor left (EMFILE, ENFILE) for the connection or its work.
func (a *Acceptor) NoFiles() error {
	return fmt.Errorf("%s is at its limit of open files: %w", a.Name, unix.EMFILE)
}

// Refuse answers c with reason and closes it at once. A client that sent
// its request first finds its send fails (EPIPE) or its read (ECONNRESET)
// before it reads the answer: it reads again to learn why (the daemon's
// Client does).
func (a *Acceptor) Refuse(c *net.UnixConn, reason error) {
	defer c.Close()
	a.refused.Add(1)
	c.SetWriteDeadline(time.Now().Add(refuseFor))
	c.WriteMsgUnix(a.Refusal(reason), nil, nil)
}

// refuseWaiting takes the connections that wait on ln in the room of the
// spare descriptor, answers each with the reason and closes it, without
// waiting for one that has not come. It returns the spare, open again
// (or -1 while it cannot be).
func (a *Acceptor) refuseWaiting(ln *net.UnixListener, spare int) int {
	if spare < 0 {
		return openSpare()
	}
	unix.Close(spare)
	rc, err := ln.SyscallConn()
	if err != nil {
		return openSpare()
	}
	msg := a.Refusal(a.NoFiles())
	for range 1024 { // a flood that goes on is met at the next accept
		fd := -1
		var aerr error
		if rc.Control(func(lfd uintptr) {
			fd, _, aerr = unix.Accept4(int(lfd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
		}) != nil || aerr != nil {
			break // nothing waits (EAGAIN), or another descriptor took the room
		}
		a.refused.Add(1)
		unix.Write(fd, msg) // a new connection's buffer is empty: this does not block
		unix.Close(fd)
	}
	return openSpare()
}

func openSpare() int {
	fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
}

// FileLimit returns the soft limit of open files in force now (it may be
// lowered while the process runs), or fallback when it cannot be read.
func FileLimit(fallback int) int {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil || lim.Cur > 1<<30 {
		return fallback
	}
	return int(lim.Cur)
}
