package shm_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/daemon"
	"github.com/zctipc/zctipc/go/internal/daemontest"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

// recorder is a Tracker that keeps its entries in memory.
type recorder struct {
	mu      sync.Mutex
	entries map[int]string
	next    int
}

func (r *recorder) add(s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	r.entries[r.next] = s
	return r.next
}

func (r *recorder) Creating(tmp, final string) int { return r.add("creating " + tmp + " " + final) }

func (r *recorder) Opened(int, uint64, uint64) {}

func (r *recorder) Created(int) {}

func (r *recorder) Holding(name string) int { return r.add("holding " + name) }

func (r *recorder) Dropped(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.entries, n)
}

// live returns the entries not dropped.
func (r *recorder) live() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.entries {
		out = append(out, e)
	}
	return out
}

// tracked makes the test's segments tracked by a recorder, and drops the
// spares it leaves.
func tracked(t *testing.T) *recorder {
	r := &recorder{entries: map[int]string{}}
	shm.SetTracker(r)
	t.Cleanup(func() {
		shm.DropSpares()
		shm.SetTracker(nil)
	})
	return r
}

// tmpFiles returns the temporary files in the segment directory.
func tmpFiles(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(shm.Dir())
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), shm.TmpPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// makeSpare makes a large tensor and lets it go, which makes it a spare,
// and returns the spare's name.
func makeSpare(t *testing.T) string {
	t.Helper()
	a := mustCreate(t, "", dtype.Uint8, 4<<20)
	testenv.Fill(a.Data())
	require.NoError(t, a.Close())
	spares := tmpFiles(t)
	require.Len(t, spares, 1)
	return spares[0]
}

// requireZeros requires that every byte of a new segment's data is zero.
func requireZeros(t *testing.T, data []byte) {
	t.Helper()
	for i, v := range data {
		if v != 0 {
			t.Fatalf("byte %d of a new segment is %d: Create zeroes what a spare held", i, v)
		}
	}
}

// startTrackedSpare starts a client of the cleanup daemon that keeps a
// spare ("tracked-spare"), and returns it, its ledger's name and the
// spare's.
func startTrackedSpare(t *testing.T) (*testenv.Helper, string, string) {
	t.Helper()
	daemontest.WithRuntimeDir(t)
	h := daemontest.StartClient(t, "tracked-spare", nil)
	fields := strings.Fields(h.ReadLine(t))
	require.Len(t, fields, 2)
	require.True(t, strings.HasPrefix(fields[1], shm.TmpPrefix), fields)
	return h, fields[0], fields[1]
}

func inode(t *testing.T, name string) uint64 {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Stat(filepath.Join(shm.Dir(), name), &st))
	return st.Ino
}

// A large tensor let go becomes a spare under a temporary name; the next
// large segment is made from it, cut to size, zeroed unless the caller
// writes it all, and the spare's record goes.
func TestSpareFilesAreReused(t *testing.T) {
	r := tracked(t)
	a := mustCreate(t, "", dtype.Uint8, 4<<20)
	testenv.Fill(a.Data())
	name, ino := a.Name(), inode(t, a.Name())
	require.NoError(t, a.Close())
	require.False(t, testenv.Exists(name), "the name goes with the last count")
	require.Len(t, tmpFiles(t), 1, "kept as a spare")
	require.Len(t, r.live(), 1)
	require.Contains(t, r.live()[0], "creating "+shm.TmpPrefix)

	b, err := shm.CreateUninitialized("", header.KindTensor, dtype.Uint8, []int64{3 << 20})
	require.NoError(t, err)
	require.False(t, testenv.Exists(b.Name()), "no name before Publish")
	require.Len(t, tmpFiles(t), 1, "still under its temporary name")
	require.NoError(t, b.Publish())
	require.Equal(t, ino, inode(t, b.Name()), "made from the spare")
	require.Empty(t, tmpFiles(t))
	info, err := os.Stat(filepath.Join(shm.Dir(), b.Name()))
	require.NoError(t, err)
	require.EqualValues(t, b.Header().SegmentSize(), info.Size(), "cut to size")
	require.EqualValues(t, 3<<20, len(b.Data()))
	b.Data()[len(b.Data())-1] = 7 // the whole data region is mapped
	require.NoError(t, b.Close())
	require.Len(t, tmpFiles(t), 1)

	c := mustCreate(t, "", dtype.Uint8, 2<<20)
	require.Equal(t, ino, inode(t, c.Name()), "made from the spare")
	requireZeros(t, c.Data())
	require.NoError(t, c.Close())
	require.Equal(t, 1, shm.DropSpares())
	require.Empty(t, tmpFiles(t))
	require.Empty(t, r.live())
}

// Small segments, segments that are not tensors or tables, untracked ones
// and ones whose name was removed are not kept.
func TestSparesOnlyOfLargeTrackedTensors(t *testing.T) {
	small := mustCreate(t, "", dtype.Uint8, 4<<20)
	require.NoError(t, small.Close())
	require.Empty(t, tmpFiles(t), "untracked")

	tracked(t)
	small = mustCreate(t, "", dtype.Uint8, 64<<10)
	require.NoError(t, small.Close())
	require.Empty(t, tmpFiles(t), "small")

	unlinked := mustCreate(t, "", dtype.Uint8, 4<<20)
	require.NoError(t, shm.Unlink(unlinked.Name()))
	require.NoError(t, unlinked.Close())
	require.Empty(t, tmpFiles(t), "its name was removed")

	_, err := shm.CreateUninitialized("", header.KindQueue, dtype.Uint8, []int64{4 << 20})
	require.ErrorIs(t, err, unix.EINVAL)
}

// Spares go after a second, or at once with the mapping cache turned off.
func TestSparesExpire(t *testing.T) {
	testenv.SkipShort(t, "runs for seconds")
	tracked(t)
	a := mustCreate(t, "", dtype.Uint8, 2<<20)
	require.NoError(t, a.Close())
	require.Len(t, tmpFiles(t), 1)
	require.Eventually(t, func() bool { return len(tmpFiles(t)) == 0 }, 5*time.Second, 50*time.Millisecond)

	b := mustCreate(t, "", dtype.Uint8, 2<<20)
	require.NoError(t, b.Close())
	require.Len(t, tmpFiles(t), 1)
	was := shm.SetMapCache(false)
	t.Cleanup(func() { shm.SetMapCache(was) })
	require.Empty(t, tmpFiles(t))
	c := mustCreate(t, "", dtype.Uint8, 2<<20)
	require.NoError(t, c.Close())
	require.Empty(t, tmpFiles(t), "no spares with the cache off")
}

// A segment that does not fit drops the spares and tries again.
func TestOutOfMemoryDropsSpares(t *testing.T) {
	dir := testenv.SegmentsOnTmpfs(t, "size=8m")
	tracked(t)
	a := mustCreate(t, "", dtype.Uint8, 5<<20)
	require.NoError(t, a.Close())
	require.Len(t, tmpFiles(t), 1)
	b := mustCreate(t, "", dtype.Uint8, 512<<10) // fits beside the spare, too small to take it
	c := mustCreate(t, "", dtype.Uint8, 6<<20)   // fits only once the spare is gone
	require.Empty(t, tmpFiles(t))
	require.NoError(t, b.Close())
	require.NoError(t, c.Close())
	shm.DropSpares()
	requireEmptyDir(t, dir)
}

// Another process that attached a segment and keeps its mapping cached
// never serves that stale mapping once the file is made into a new segment
// of the same name from a spare.
func TestSpareReusedUnderTheSameNameIsNotServedStale(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	tracked(t)
	name := testenv.UniqueName(t)
	a, err := shm.CreateUninitialized(name, header.KindTensor, dtype.Uint8, []int64{2 << 20})
	require.NoError(t, err)
	testenv.Fill(a.Data())
	require.NoError(t, a.Publish())
	ino := inode(t, a.Name())
	h := testenv.StartHelper(t, "attach-cache-then-digest", name)
	require.Equal(t, testenv.Digest(a.Data()), h.ReadLine(t))
	require.NoError(t, a.Close()) // the helper holds no count: a spare

	b, err := shm.CreateUninitialized(name, header.KindTensor, dtype.Uint8, []int64{1 << 20})
	require.NoError(t, err)
	for i := range b.Data() {
		b.Data()[i] = byte(i % 7)
	}
	require.NoError(t, b.Publish())
	require.Equal(t, ino, inode(t, b.Name()), "made from the spare, under the same name")
	h.Send(t, "again")
	require.Equal(t, fmt.Sprint(len(b.Data()), " ", testenv.Digest(b.Data())), h.ReadLine(t))
	h.Wait(t)
	require.NoError(t, b.Close())
}

// A process killed while it keeps a spare leaves nothing: the daemon removes
// the spare as a file being made.
func TestDaemonRemovesTheSparesOfAKilledProcess(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	h, ledger, spare := startTrackedSpare(t)
	require.FileExists(t, filepath.Join(shm.Dir(), spare))
	testenv.Kill(t, h)
	daemontest.WaitGone(t, ledger, spare)
}

// A process attaching a segment while its creator lets it go and makes it
// again from the same file, at another size, gets a segment whose header
// and data agree, or a not-found error: never the new data under the old
// header (which could map past the file's end).
func TestAttachRacingASpareReuse(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	tracked(t)
	name := testenv.UniqueName(t)
	h := testenv.StartHelper(t, "attach-until-told", name)
	deadline := time.Now().Add(time.Second)
	made := 0
	for i := 0; time.Now().Before(deadline); i++ {
		size := int64(1<<20 + (i%3)*(1<<19))
		seg, err := shm.Create(name, header.KindTensor, dtype.Uint8, []int64{size})
		if errors.Is(err, unix.EEXIST) {
			continue // the helper holds the last one
		}
		require.NoError(t, err)
		d := seg.Data()
		binary.LittleEndian.PutUint64(d, uint64(size))
		binary.LittleEndian.PutUint64(d[size-8:], uint64(size))
		require.NoError(t, seg.Close())
		made++
	}
	h.Send(t, "exit")
	reply := strings.Fields(h.ReadLine(t))
	h.Wait(t)
	require.Equal(t, "ok", reply[0], reply)
	t.Log(made, "made;", reply[1], "attached")
}

func init() {
	// attach-until-told attaches segment args[0] again and again, with no
	// mapping cache, checking that its data starts and ends with its size
	// (or zeros), until a line on stdin; then it prints ok and how many it attached.
	testenv.Helpers["attach-until-told"] = func(args []string) error {
		shm.SetMapCache(false)
		stop := toldToStop()
		n := 0
		for !isClosed(stop) {
			seg, err := shm.Attach(args[0], header.KindTensor, true)
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			if err != nil {
				return err
			}
			// The creator writes the words after making the segment: each
			// is zero until then, and its size after.
			d := seg.Data()
			size := uint64(len(d))
			first, last := binary.LittleEndian.Uint64(d), binary.LittleEndian.Uint64(d[size-8:])
			if first != 0 && first != size || last != 0 && last != size {
				fmt.Println("bad: a header of", size, "bytes over data of", first, last)
				return seg.Close()
			}
			n++
			if err := seg.Close(); err != nil {
				return err
			}
		}
		fmt.Println("ok", n)
		return nil
	}
	// attach-cache-then-digest attaches segment args[0], prints the digest
	// of its data once it has closed it (its mapping stays cached) and, after a line
	// on stdin, attaches it again and prints its size and digest.
	testenv.Helpers["attach-cache-then-digest"] = func(args []string) error {
		seg, err := shm.Attach(args[0], header.KindTensor, false)
		if err != nil {
			return err
		}
		sum := testenv.Digest(seg.Data())
		if err := seg.Close(); err != nil {
			return err
		}
		fmt.Println(sum)
		if _, err := testenv.StdinLine(); err != nil {
			return err
		}
		if seg, err = shm.Attach(args[0], header.KindTensor, false); err != nil {
			return err
		}
		fmt.Println(len(seg.Data()), testenv.Digest(seg.Data()))
		return seg.Close()
	}
	// tracked-spare enables cleanup, lets go of a large segment it made
	// (which it keeps as a spare), prints its ledger's name and the
	// spare's, and waits to be killed.
	testenv.Helpers["tracked-spare"] = func(args []string) error {
		if _, err := daemon.Enable(daemon.Program(os.Getenv("ZCTIPC_TEST_DAEMON"))); err != nil {
			return err
		}
		seg, err := shm.Create("", header.KindTensor, dtype.Uint8, []int64{2 << 20})
		if err != nil {
			return err
		}
		if err := seg.Close(); err != nil {
			return err
		}
		ents, err := os.ReadDir(shm.Dir())
		if err != nil {
			return err
		}
		spare := "-"
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), shm.TmpPrefix) {
				spare = e.Name()
			}
		}
		fmt.Println(daemontest.LedgerOf(), spare)
		line, err := testenv.StdinLine()
		if line == "drop" {
			shm.DropSpares() // as a process that exits with zctipc's cleanup does
		}
		return err
	}
}

// A segment whose creator writes its data gets its name only when it is
// published: until then no process attaches it (and sees the pages of
// another tensor, or a half-made copy), and closing it leaves nothing.
// Note [a name appears with its contents] in go/internal/shm/create.go.
func TestUninitializedSegmentIsNamedOnlyWhenPublished(t *testing.T) {
	tracked(t)
	for _, spare := range []bool{false, true} {
		t.Run(fmt.Sprintf("spare=%v", spare), func(t *testing.T) {
			name := fmt.Sprintf("publish_%d_%v", os.Getpid(), spare)
			if spare {
				makeSpare(t)
			}
			s, err := shm.CreateUninitialized(name, header.KindTensor, dtype.Uint8, []int64{2 << 20})
			require.NoError(t, err)
			_, err = shm.Attach(name, header.KindTensor, true)
			require.ErrorIs(t, err, unix.ENOENT, "attached before its contents were written")
			for i := range s.Data() {
				s.Data()[i] = 9
			}
			require.NoError(t, s.Publish())
			require.NoError(t, s.Publish(), "publishing twice does nothing")
			other := mustAttach(t, name, true)
			require.EqualValues(t, 9, other.Data()[0])
			require.EqualValues(t, 9, other.Data()[len(other.Data())-1])
			require.NoError(t, other.Close())
			require.NoError(t, s.Close())
			shm.DropSpares()

			// Let go of unpublished: nothing is left, and the name is free.
			u, err := shm.CreateUninitialized(name, header.KindTensor, dtype.Uint8, []int64{2 << 20})
			require.NoError(t, err)
			require.NoError(t, u.Close())
			require.False(t, testenv.Exists(u.Name()))
			shm.DropSpares()
			require.Empty(t, tmpFiles(t))
		})
	}
}

// A spare that another process of the user truncated is not reused: the
// next segment is made from a fresh file, never refused as corrupt.
func TestTruncatedSpareFallsBackToAFreshFile(t *testing.T) {
	tracked(t)
	for _, c := range []struct{ cut, make int64 }{{0, 2 << 20}, {4096, 2 << 20}, {1 << 20, 2 << 20}, {0, 4 << 20}, {4096, 4 << 20}} {
		size := c.cut
		t.Run(fmt.Sprint(c.cut, "_", c.make), func(t *testing.T) {
			spare := makeSpare(t)
			ino := inode(t, spare)
			require.NoError(t, os.Truncate(filepath.Join(shm.Dir(), spare), size))

			b, err := shm.Create("", header.KindTensor, dtype.Uint8, []int64{c.make})
			require.NoError(t, err, "a tampered spare is dropped, not an error")
			require.NotEqual(t, ino, inode(t, b.Name()), "a fresh file")
			requireZeros(t, b.Data())
			require.NoError(t, b.Close())
			shm.DropSpares()
			require.Empty(t, tmpFiles(t), "the tampered spare is removed")
		})
	}
}

// A spare that another process of the user renamed away is still removed
// when its owner drops its spares, and when its owner dies (the sweeper
// finds the file by its inode).
func TestRenamedSpareIsRemoved(t *testing.T) {
	testenv.SkipShort(t, "runs the cleanup daemon")
	for _, how := range []string{"drop", "kill"} {
		t.Run(how, func(t *testing.T) {
			h, ledger, spare := startTrackedSpare(t)
			moved := fmt.Sprintf("renamed-spare-%d-%s", os.Getpid(), how)
			require.NoError(t, os.Rename(filepath.Join(shm.Dir(), spare), filepath.Join(shm.Dir(), moved)))
			if how == "kill" {
				testenv.Kill(t, h)
			} else {
				h.Send(t, "drop")
				h.Wait(t)
			}
			daemontest.WaitGone(t, ledger, moved)
		})
	}
}

// Two names made and let go in turn, each from the other's spare, while
// another process attaches them: whoever attaches a name sees that name's
// contents, complete, never the other's bytes or a copy under way. The
// attacher may open a name's file just before its creator lets it go and
// makes it into the other segment: what it then reads is that other
// segment's header, whole and valid, and it must not count it as the
// name it opened. Note [a name appears with its contents] in
// go/internal/shm/create.go.
func TestAttachSeesOnlyItsNamesContentsWhileSparesAreReused(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	tracked(t)
	base := testenv.UniqueName(t)
	names := []string{base + "_a", base + "_b"}
	h := testenv.StartHelper(t, "attach-names-check-fill", names...)
	first := make(chan string, 1) // the helper's first line: enough good attaches, or a bad one
	go func() {
		line := ""
		if h.Out.Scan() {
			line = h.Out.Text()
		}
		first <- line
	}()
	const size = 1 << 20
	made, report := 0, ""
	for round := 0; report == "" || round < 1000 && !strings.HasPrefix(report, "bad"); round++ {
		if report == "" {
			select {
			case report = <-first:
			default:
			}
		}
		for i, name := range names {
			seg, err := shm.CreateUninitialized(name, header.KindTensor, dtype.Uint8, []int64{size})
			require.NoError(t, err)
			d := seg.Data()
			for j := range d {
				d[j] = byte(i + 1)
			}
			err = seg.Publish()
			if !errors.Is(err, unix.EEXIST) { // the attacher still holds the last one of this name
				require.NoError(t, err)
				made++
			}
			require.NoError(t, seg.Close())
		}
	}
	h.Send(t, "exit")
	reply := h.ReadLine(t)
	h.Wait(t)
	t.Log(made, "made; attacher:", report, "then", reply)
	require.Equal(t, "attached 20", report)
	require.True(t, strings.HasPrefix(reply, "ok "), reply)
}

func init() {
	// attach-names-check-fill attaches each of the segments args in turn,
	// read-only, again and again until a line on stdin, checking that
	// every byte of segment i is i+1. It prints "attached 20" after 20
	// good attaches, and the first wrong one when there is one; at the end
	// ok and how many it attached.
	testenv.Helpers["attach-names-check-fill"] = func(args []string) error {
		stop := toldToStop()
		n := 0
		for !isClosed(stop) {
			for i, name := range args {
				seg, err := shm.Attach(name, header.KindTensor, true)
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				if err != nil {
					return err
				}
				seen := map[byte]int{}
				for _, v := range seg.Data() {
					seen[v]++
				}
				if err := seg.Close(); err != nil {
					return err
				}
				if len(seen) != 1 || seen[byte(i+1)] == 0 {
					fmt.Println("bad:", name, "holds bytes", seen, "after", n, "good attaches")
					<-stop
					fmt.Println("ok", n)
					return nil
				}
				if n++; n == 20 {
					fmt.Println("attached", n)
				}
			}
		}
		fmt.Println("ok", n)
		return nil
	}
}

// toldToStop returns a channel that is closed when a line comes on stdin:
// the helpers that attach until told stop then.
func toldToStop() <-chan struct{} {
	stop := make(chan struct{})
	go func() {
		_, _ = testenv.StdinLine()
		close(stop)
	}()
	return stop
}

// isClosed reports whether stop is closed.
func isClosed(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}
