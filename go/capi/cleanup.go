package main

/*
#include "internal.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/zctipc/zctipc/go/internal/daemon"
	"github.com/zctipc/zctipc/go/internal/gc"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/usersock"
)

//export zct_set_strategy
func zct_set_strategy(strategy C.int32_t) C.int {
	return run(func() error { return shm.SetStrategy(shm.Strategy(strategy)) })
}

//export zct_get_strategy
func zct_get_strategy(strategy *C.int32_t) C.int {
	return run(func() error {
		if strategy == nil {
			return errNilArg
		}
		*strategy = C.int32_t(shm.CurrentStrategy())
		return nil
	})
}

//export zct_cleanup_enable
func zct_cleanup_enable(daemonPath *C.zct_cchar) C.int {
	return run(func() error {
		path := goString(daemonPath)
		if path == "" {
			path = defaultDaemon()
		}
		_, err := daemon.Enable(daemon.Program(path))
		return err
	})
}

// defaultDaemon is the zctipcd beside libzctipc.so (as the Python wheel
// ships it), else the one on PATH, else "" (start none).
func defaultDaemon() string {
	if lib := C.GoString(C.zct_library_path()); lib != "" {
		beside := filepath.Join(filepath.Dir(lib), "zctipcd")
		if _, err := os.Stat(beside); err == nil {
			return beside
		}
	}
	path, _ := exec.LookPath("zctipcd")
	return path
}

//export zct_cleanup_disable
func zct_cleanup_disable() C.int {
	return run(daemon.Disable)
}

// client returns the process's daemon client, or a new connection to a
// running daemon, which it makes the broker of memfd segments when the
// process has none; nil when no daemon runs.
func client() *daemon.Client {
	if c := daemon.Current(); c != nil {
		return c
	}
	if daemon.RunningPID(usersock.RuntimeDir()) == 0 {
		return nil
	}
	c, err := daemon.Dial(usersock.RuntimeDir(), daemon.Launcher{}, nil)
	if err != nil {
		return nil
	}
	shm.SetBroker(c)
	return c
}

// census is one segment in zct_census's report.
type census struct {
	Name         string  `json:"name"`
	Kind         string  `json:"kind"`
	Size         int64   `json:"size"`
	NBytes       uint64  `json:"nbytes"`
	DType        int     `json:"dtype,omitempty"`
	Shape        []int64 `json:"shape,omitempty"`
	CreatorPID   int64   `json:"creator_pid,omitempty"`
	CreatorAlive bool    `json:"creator_alive"`
	Refcount     int64   `json:"refcount"`
	CreatedNS    int64   `json:"created_ns"`
	Tracked      bool    `json:"tracked"`
	Holders      []int64 `json:"holders"`
	Messages     int     `json:"messages"`
	Error        string  `json:"error,omitempty"`
}

//export zct_census
func zct_census(buf *C.char, capacity C.uint64_t, length *C.uint64_t) C.int {
	return run(func() error {
		var src gc.Source
		if c := client(); c != nil {
			if st, err := c.Status(); err == nil {
				src.Names = st.Segments
			}
		}
		cs, err := gc.Take(src)
		if err != nil {
			return err
		}
		out := make([]census, 0, len(cs.Segments))
		for _, s := range cs.Segments {
			e := census{Name: s.Name, Kind: "file", Size: s.Size, CreatedNS: s.ModTime.UnixNano(), Messages: s.Messages, Holders: []int64{}}
			for _, h := range s.Holders {
				e.Holders = append(e.Holders, h.PID)
			}
			if s.Err != nil {
				e.Error = s.Err.Error()
			} else {
				h := s.Header
				e.Kind, e.DType, e.Shape, e.NBytes = h.Kind.String(), int(h.DType), h.Shape, h.NBytes
				e.CreatorPID, e.CreatorAlive = h.Creator.PID, s.CreatorAlive
				e.Refcount, e.CreatedNS, e.Tracked = h.Refcount, h.CreatedNS, h.Tracked
			}
			out = append(out, e)
		}
		return writeJSON(out, buf, capacity, length)
	})
}

//export zct_gc
func zct_gc(dryRun C.int32_t, buf *C.char, capacity C.uint64_t, length *C.uint64_t) C.int {
	return run(func() error {
		var rep gc.Report
		var err error
		if c := client(); c != nil {
			rep, err = c.Collect(dryRun != 0)
		} else {
			self, perr := proc.Self()
			if perr != nil {
				return perr
			}
			rep, err = gc.Collect(self, gc.Options{DryRun: dryRun != 0, Confirm: 200 * time.Millisecond})
		}
		if werr := writeJSON(rep, buf, capacity, length); werr != nil {
			return werr
		}
		return err
	})
}

// daemonStatus is zct_daemon_status's report.
type daemonStatus struct {
	Running  bool           `json:"running"`
	Dir      string         `json:"dir"`
	Strategy string         `json:"strategy"`
	Status   *daemon.Status `json:"status,omitempty"`
	Error    string         `json:"error,omitempty"`
}

//export zct_daemon_status
func zct_daemon_status(buf *C.char, capacity C.uint64_t, length *C.uint64_t) C.int {
	return run(func() error {
		st := daemonStatus{Dir: usersock.RuntimeDir(), Strategy: shm.CurrentStrategy().String()}
		if c := client(); c != nil {
			s, err := c.Status()
			if err != nil {
				st.Error = err.Error()
			} else {
				st.Running, st.Status = true, &s
			}
		}
		return writeJSON(st, buf, capacity, length)
	})
}

// writeJSON writes v as JSON into buf as copyOut does.
func writeJSON(v any, buf *C.char, capacity C.uint64_t, length *C.uint64_t) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode a report: %w", err)
	}
	return copyOut(string(b), buf, capacity, length)
}
