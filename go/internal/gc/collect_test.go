package gc_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/gc"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
)

func init() {
	// untracked-orphan makes a segment without a ledger and exits without
	// letting go of it, as a process that is killed does.
	testenv.Helpers["untracked-orphan"] = func(args []string) error {
		seg, err := shm.Create(args[0], header.KindTensor, dtype.Uint8, []int64{64})
		if err != nil {
			return err
		}
		fmt.Println(seg.Name())
		os.Exit(0)
		return nil
	}
}

func TestCollectRemovesOrphansAndDebris(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	self, err := proc.Self()
	require.NoError(t, err)
	orphan := testenv.UniqueName(t)
	h := testenv.StartHelper(t, "untracked-orphan", orphan)
	full := h.ReadLine(t)
	h.Wait(t)
	// Debris of creations that died half-way: old enough to be dead, and
	// one that may still be in progress.
	old := time.Now().Add(-time.Hour)
	oldTmp := filepath.Join(shm.Dir(), shm.TmpPrefix+"00000000000000000000000000000001")
	newTmp := filepath.Join(shm.Dir(), shm.TmpPrefix+"00000000000000000000000000000002")
	junk := filepath.Join(shm.Dir(), shm.Prefix+"junk_"+strconv.Itoa(os.Getpid()))
	for _, p := range []string{oldTmp, newTmp, junk} {
		require.NoError(t, os.WriteFile(p, []byte("half"), 0o600))
	}
	require.NoError(t, os.Chtimes(oldTmp, old, old))
	require.NoError(t, os.Chtimes(junk, old, old))
	defer os.Remove(newTmp)

	// The daemon's rule leaves alone what an untracked process made.
	rep, err := gc.Collect(self, gc.Options{TrackedOnly: true, DryRun: true})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{filepath.Base(oldTmp), filepath.Base(junk)}, removedNames(rep))
	// A dry run removes nothing.
	rep, err = gc.Collect(self, gc.Options{DryRun: true})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{full, filepath.Base(oldTmp), filepath.Base(junk)}, removedNames(rep))
	require.FileExists(t, testenv.SegmentPath(orphan))
	rep, err = gc.Collect(self, gc.Options{Confirm: 20 * time.Millisecond})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{full, filepath.Base(oldTmp), filepath.Base(junk)}, removedNames(rep))
	require.NoFileExists(t, testenv.SegmentPath(orphan))
	require.NoFileExists(t, oldTmp)
	require.FileExists(t, newTmp, "a creation that may be in progress stays")
	for _, r := range rep.Removed {
		if r.Name == full {
			require.Contains(t, r.Reason, "no live holder")
		}
	}
}

func removedNames(rep gc.Report) []string {
	var out []string
	for _, r := range rep.Removed {
		out = append(out, r.Name)
	}
	return out
}
