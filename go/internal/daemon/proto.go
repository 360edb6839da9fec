package daemon

import (
	"encoding/json"
	"fmt"

	"github.com/zctipc/zctipc/go/internal/gc"
	"golang.org/x/sys/unix"
)

// The protocol: each request and each reply is one SOCK_SEQPACKET message
// holding a JSON object, with at most one file descriptor attached (the
// ledger of a hello, the memfd of a put, the memfd of a reply to get). A
// connection carries one request at a time.

// Operations.
const (
	OpHello  = "hello"  // Ledger: the client's ledger (a memfd's descriptor attached)
	OpPut    = "put"    // Name: a memfd segment, attached, for the daemon to keep
	OpGet    = "get"    // Name: the reply carries the memfd
	OpDrop   = "drop"   // Name: its count reached zero
	OpStatus = "status" // the reply carries Status
	OpGC     = "gc"     // DryRun: the reply carries Report
	OpStop   = "stop"   // the daemon exits
)

// maxMessage bounds one message.
const maxMessage = 1 << 20

// Request is a client's message.
type Request struct {
	Op      string `json:"op"`
	Name    string `json:"name,omitempty"`
	Ledger  string `json:"ledger,omitempty"`
	Version string `json:"version,omitempty"`
	DryRun  bool   `json:"dry_run,omitempty"`
}

// Reply is the daemon's answer.
type Reply struct {
	Error  string     `json:"error,omitempty"`
	Errno  int        `json:"errno,omitempty"`
	Status *Status    `json:"status,omitempty"`
	Report *gc.Report `json:"report,omitempty"`
}

// Status describes a running daemon.
type Status struct {
	PID       int64     `json:"pid"`
	Version   string    `json:"version"`
	Dir       string    `json:"dir"`
	ShmDir    string    `json:"shm_dir"`
	Uptime    float64   `json:"uptime_s"`
	Clients   []Watched `json:"clients"`
	Segments  []string  `json:"memfd_segments"` // the memfd segments it keeps
	Swept     int       `json:"processes_swept"`
	Counts    int       `json:"counts_given_up"`
	Collected int       `json:"orphans_removed"`
	Recovered int       `json:"ledgers_found_at_start"`
	Refused   int       `json:"connections_refused"` // at the limit of connections or of open files
}

// Watched is one process the daemon watches.
type Watched struct {
	PID       int64  `json:"pid"`
	Ledger    string `json:"ledger"`
	Connected bool   `json:"connected"`
	Counts    int    `json:"counts"`
}

func encode(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err == nil && len(b) > maxMessage {
		err = fmt.Errorf("a message of %d bytes: %w", len(b), unix.EMSGSIZE)
	}
	return b, err
}

// replyError returns the error a reply carries, or nil.
func (r *Reply) err() error {
	if r.Error == "" {
		return nil
	}
	return &RemoteError{Msg: r.Error, Errno: unix.Errno(r.Errno)}
}

// RemoteError is an error the daemon reported; it wraps the errno the daemon
// saw, when there was one.
type RemoteError struct {
	Msg   string
	Errno unix.Errno
}

func (e *RemoteError) Error() string { return "zctipcd: " + e.Msg }

// Unwrap returns the errno.
func (e *RemoteError) Unwrap() error {
	if e.Errno == 0 {
		return nil
	}
	return e.Errno
}
