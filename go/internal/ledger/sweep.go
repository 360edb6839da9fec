package ledger

import (
	"errors"
	"fmt"

	"github.com/zctipc/zctipc/go/internal/pool"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// Result counts what a sweep gave up.
type Result struct {
	Segments int `json:"segments"` // counts on segments
	Slots    int `json:"slots"`    // counts on pool slots
	Files    int `json:"files"`    // half-made segment files removed
}

// Add adds the counts of o to r.
func (r *Result) Add(o Result) {
	r.Segments += o.Segments
	r.Slots += o.Slots
	r.Files += o.Files
}

// Sweep gives up every count recorded in the ledger whose data region is d,
// on behalf of its owner, who died: each segment count is dropped (the last
// one removes the segment, and a queue's messages with it), each slot count
// released (the last one frees the slot and unpins its arena), and each
// half-made segment file removed. The caller claimed the ledger.
func Sweep(d []byte) (Result, error) {
	var r Result
	var errs []error
	for _, e := range Entries(d) {
		if !Take(d, e) {
			continue // another sweeper took it
		}
		var err error
		switch e.State {
		case Segment:
			if err = shm.DropRef(e.Name, 0); err == nil {
				r.Segments++
			}
		case Slot:
			var s pool.Slot
			if s, err = pool.Adopt(e.Name, e.Index, e.Gen); err == nil {
				if err = s.Release(); err == nil {
					r.Slots++
				}
			}
		case Creating:
			var removed bool
			removed, err = abandon(e)
			if removed {
				r.Files++
			}
		}
		// A segment that is gone needs nothing more.
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, pool.ErrStale) {
			errs = append(errs, err)
		}
	}
	return r, errors.Join(errs...)
}

// abandon finishes, for a creator that died, a segment creation it left: it
// removes the temporary file, or drops the creator's count on the segment
// when the file had already been renamed. It reports whether it removed a
// file.
func abandon(e Entry) (bool, error) {
	if !shm.IsTmpName(e.Name) {
		return false, fmt.Errorf("ledger entry %d: %q is not a temporary segment name: %w", e.Number, e.Name, unix.EINVAL)
	}
	tmp := shm.Dir() + "/" + e.Name
	var st unix.Stat_t
	if err := unix.Lstat(tmp, &st); err == nil {
		if e.Ino != 0 && (st.Dev != e.Dev || st.Ino != e.Ino) {
			return false, nil
		}
		if err := unix.Unlink(tmp); err != nil && !errors.Is(err, unix.ENOENT) {
			return false, fmt.Errorf("remove half-made segment %q: %w", e.Name, err)
		}
		return true, nil
	}
	if e.Ino == 0 {
		return false, nil // never made
	}
	final, err := shm.FullName(e.Final)
	if err != nil || final != e.Final || shm.IsFDName(final) {
		return false, fmt.Errorf("ledger entry %d: bad segment name %q: %w", e.Number, e.Final, unix.EINVAL)
	}
	if err := unix.Lstat(shm.Dir()+"/"+final, &st); err != nil || st.Dev != e.Dev || st.Ino != e.Ino {
		// Removed, or renamed away by another process (a spare, or a
		// segment never published): the file goes wherever it is.
		return shm.RemoveInode(e.Dev, e.Ino)
	}
	return false, shm.DropRef(final, 0)
}
