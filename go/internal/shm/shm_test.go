package shm_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/headertest"
	"github.com/zctipc/zctipc/go/internal/shm"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

func mustCreate(t *testing.T, name string, dt dtype.DType, shape ...int64) *shm.Segment {
	t.Helper()
	seg, err := shm.Create(name, header.KindTensor, dt, shape)
	require.NoError(t, err, "Create")
	return seg
}

// mustAttach attaches tensor segment name, read-only or not.
func mustAttach(t *testing.T, name string, readOnly bool) *shm.Segment {
	t.Helper()
	seg, err := shm.Attach(name, header.KindTensor, readOnly)
	require.NoError(t, err, "Attach")
	return seg
}

// requireEmptyDir requires that directory dir holds nothing.
func requireEmptyDir(t *testing.T, dir string) {
	t.Helper()
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, left)
}

func TestCreateAttachClose(t *testing.T) {
	t.Parallel()
	name := testenv.UniqueName(t)
	seg := mustCreate(t, name, dtype.Float32, 4, 8)
	require.Equal(t, shm.Prefix+name, seg.Name())
	require.Len(t, seg.Data(), 4*8*4)
	testenv.Fill(seg.Data())
	rc, err := seg.Refcount()
	require.NoError(t, err)
	require.EqualValues(t, 1, rc)

	again := mustAttach(t, name, false)
	require.Equal(t, seg.Data(), again.Data())
	rc, err = again.Refcount()
	require.NoError(t, err)
	require.EqualValues(t, 1, rc, "a process counts once however many handles it has")
	require.Equal(t, []int64{32, 4}, again.Header().Strides)

	require.NoError(t, seg.Close())
	require.True(t, testenv.Exists(name), "the second handle still holds the segment")
	require.ErrorIs(t, seg.Close(), shm.ErrClosed)
	_, err = seg.Refcount()
	require.ErrorIs(t, err, shm.ErrClosed)
	require.NoError(t, again.Close())
	require.False(t, testenv.Exists(name), "the last holder unlinks")
}

func TestCreateRandomName(t *testing.T) {
	t.Parallel()
	seg := mustCreate(t, "", dtype.Uint8, 3)
	defer seg.Close()
	require.Regexp(t, `^zctipc_[0-9a-f]{32}$`, seg.Name())
}

func TestCreateModeIsOwnerOnlyWhateverTheUmask(t *testing.T) {
	old := unix.Umask(0)
	defer unix.Umask(old)
	seg := mustCreate(t, testenv.UniqueName(t), dtype.Uint8, 3)
	defer seg.Close()
	st, err := os.Stat(testenv.SegmentPath(seg.Name()))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
}

func TestCreateNeverAdoptsAnExistingName(t *testing.T) {
	t.Parallel()
	name := testenv.UniqueName(t)
	first := mustCreate(t, name, dtype.Uint8, 16)
	defer first.Close()
	testenv.Fill(first.Data())
	before := testenv.Digest(first.Data())

	_, err := shm.Create(name, header.KindTensor, dtype.Float64, []int64{100})
	require.ErrorIs(t, err, unix.EEXIST)

	require.Equal(t, before, testenv.Digest(first.Data()), "the existing segment was not touched")
	st, err := shm.Stat(name)
	require.NoError(t, err)
	require.Equal(t, dtype.Uint8, st.Header.DType)

	// A file that is not a segment is not adopted either.
	other := testenv.UniqueName(t)
	writeFile(t, other, []byte("not ours"), 0o600)
	_, err = shm.Create(other, header.KindTensor, dtype.Uint8, []int64{1})
	require.ErrorIs(t, err, unix.EEXIST)
	content, err := os.ReadFile(testenv.SegmentPath(other))
	require.NoError(t, err)
	require.Equal(t, "not ours", string(content))
}

func TestSegmentNames(t *testing.T) {
	t.Parallel()
	_, err := shm.Attach("", 0, false)
	require.ErrorIs(t, err, unix.EINVAL, "Attach needs a name")
	bad := []string{"a/b", "..", "x..y", "../etc/passwd", "sp ace", "nul\x00", "é", strings.Repeat("n", shm.MaxNameLen+1), shm.Prefix}
	for _, name := range bad {
		_, err := shm.Create(name, header.KindTensor, dtype.Uint8, []int64{1})
		require.ErrorIs(t, err, unix.EINVAL, "Create(%q)", name)
		_, err = shm.Attach(name, 0, false)
		require.ErrorIs(t, err, unix.EINVAL, "Attach(%q)", name)
	}
	// The error names the character as written, a whole UTF-8 sequence or
	// the byte that begins none.
	for name, shown := range map[string]string{"ab名": `"名"`, "xé": `"é"`, "y\xff": `"\xff"`, "sp ace": `" "`} {
		_, err := shm.Create(name, header.KindTensor, dtype.Uint8, []int64{1})
		require.ErrorContains(t, err, "contains "+shown+";", "Create(%q)", name)
	}
	longest := strings.Repeat("n", shm.MaxNameLen-len(testenv.UniqueName(t))) + testenv.UniqueName(t)
	seg := mustCreate(t, longest, dtype.Uint8, 1)
	require.NoError(t, seg.Close())
	seg = mustCreate(t, shm.Prefix+"already-prefixed."+testenv.UniqueName(t), dtype.Uint8, 1)
	require.False(t, strings.HasPrefix(strings.TrimPrefix(seg.Name(), shm.Prefix), shm.Prefix), "the prefix is not doubled")
	require.NoError(t, seg.Close())
}

func TestZeroSizeAndScalarSegments(t *testing.T) {
	t.Parallel()
	for _, shape := range [][]int64{{}, {0}, {5, 0}} {
		name := testenv.UniqueName(t)
		seg := mustCreate(t, name, dtype.Float64, shape...)
		att := mustAttach(t, name, true)
		require.Equal(t, shape, att.Header().Shape)
		want := 8
		if len(shape) > 0 {
			want = 0
		}
		require.Len(t, att.Data(), want)
		require.NoError(t, att.Close())
		require.NoError(t, seg.Close())
		require.False(t, testenv.Exists(name))
	}
}

// writeFile puts raw bytes in the segment directory under name, as a hostile
// or broken peer could.
func writeFile(t *testing.T, name string, content []byte, mode os.FileMode) {
	t.Helper()
	path := testenv.SegmentPath(name)
	require.NoError(t, os.WriteFile(path, content, mode))
	require.NoError(t, os.Chmod(path, mode))
	t.Cleanup(func() { os.Remove(path) })
}

func TestAttachRefusesBrokenSegments(t *testing.T) {
	t.Parallel()
	for _, v := range headertest.Read(t).Vectors {
		if v.Error == "" {
			continue
		}
		t.Run(v.Name, func(t *testing.T) {
			name := testenv.UniqueName(t)
			writeFile(t, name, v.Bytes, 0o600)
			_, err := shm.Attach(name, 0, false)
			require.Equal(t, v.Error, headertest.ErrorClass(err), "Attach: %v", err)
			require.True(t, testenv.Exists(name), "a refused segment is left alone")
			_, err = shm.Stat(name)
			require.Equal(t, v.Error, headertest.ErrorClass(err), "Stat: %v", err)
		})
	}
}

func TestAttachRefusals(t *testing.T) {
	t.Parallel()
	valid := func(t *testing.T) string {
		_, b := headertest.SegmentBytes(t, dtype.Float32, []int64{2, 3})
		name := testenv.UniqueName(t)
		writeFile(t, name, b, 0o600)
		return name
	}
	t.Run("missing", func(t *testing.T) {
		_, err := shm.Attach(testenv.UniqueName(t), 0, false)
		require.ErrorIs(t, err, unix.ENOENT)
		require.Contains(t, err.Error(), "does not exist")
	})
	t.Run("mode 0666", func(t *testing.T) {
		name := valid(t)
		require.NoError(t, os.Chmod(testenv.SegmentPath(name), 0o666))
		_, err := shm.Attach(name, 0, false)
		require.ErrorIs(t, err, unix.EACCES)
		require.Contains(t, err.Error(), "mode 0666")
	})
	t.Run("mode 0640", func(t *testing.T) {
		name := valid(t)
		require.NoError(t, os.Chmod(testenv.SegmentPath(name), 0o640))
		_, err := shm.Attach(name, 0, true)
		require.ErrorIs(t, err, unix.EACCES)
	})
	t.Run("another owner", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("giving a file to another uid needs root")
		}
		name := valid(t)
		require.NoError(t, os.Chown(testenv.SegmentPath(name), 65534, 65534))
		_, err := shm.Attach(name, 0, false)
		require.ErrorIs(t, err, unix.EACCES)
		require.Contains(t, err.Error(), "uid 65534")
	})
	t.Run("symbolic link", func(t *testing.T) {
		target := valid(t)
		link := testenv.UniqueName(t)
		require.NoError(t, os.Symlink(testenv.SegmentPath(target), testenv.SegmentPath(link)))
		t.Cleanup(func() { os.Remove(testenv.SegmentPath(link)) })
		_, err := shm.Attach(link, 0, false)
		require.ErrorIs(t, err, unix.EACCES)
		_, err = shm.Create(link, header.KindTensor, dtype.Uint8, []int64{1})
		require.ErrorIs(t, err, unix.EEXIST, "O_EXCL|O_NOFOLLOW: a link is never followed on create")
	})
	t.Run("directory", func(t *testing.T) {
		name := testenv.UniqueName(t)
		require.NoError(t, os.Mkdir(testenv.SegmentPath(name), 0o700))
		t.Cleanup(func() { os.Remove(testenv.SegmentPath(name)) })
		_, err := shm.Attach(name, 0, false)
		require.Error(t, err)
	})
	t.Run("wrong kind", func(t *testing.T) {
		name := valid(t)
		_, err := shm.Attach(name, header.KindQueue, false)
		require.ErrorIs(t, err, unix.EINVAL)
		require.Contains(t, err.Error(), "holds a tensor, not a queue")
	})
	t.Run("refcount already zero", func(t *testing.T) {
		h, b := headertest.SegmentBytes(t, dtype.Float32, []int64{2})
		h.Refcount = 0
		h.Encode(b)
		name := testenv.UniqueName(t)
		writeFile(t, name, b, 0o600)
		_, err := shm.Attach(name, 0, false)
		require.ErrorIs(t, err, unix.ENOENT)
		require.Contains(t, err.Error(), "being removed")
	})
}

func TestOutOfSharedMemory(t *testing.T) {
	name := testenv.UniqueName(t)
	_, err := shm.Create(name, header.KindTensor, dtype.Float64, []int64{1 << 50})
	require.ErrorIs(t, err, shm.ErrOutOfSharedMemory)
	require.ErrorIs(t, err, unix.ENOSPC)
	require.Contains(t, err.Error(), "--shm-size")
	require.Contains(t, err.Error(), strconv.FormatInt(8<<50+192, 10))
	require.False(t, testenv.Exists(name), "nothing is left half-created")

	t.Run("small tmpfs", func(t *testing.T) {
		dir := testenv.SegmentsOnTmpfs(t, "size=1m")
		fits := mustCreate(t, "", dtype.Uint8, 512<<10)
		_, err := shm.Create("", header.KindTensor, dtype.Uint8, []int64{4 << 20})
		require.ErrorIs(t, err, shm.ErrOutOfSharedMemory)
		require.Contains(t, err.Error(), dir)
		require.NoError(t, fits.Close())
		requireEmptyDir(t, dir)
	})
}

func TestReadOnlyAndReadWriteHandlesShareOneCount(t *testing.T) {
	t.Parallel()
	name := testenv.UniqueName(t)
	seg := mustCreate(t, name, dtype.Int32, 10)
	testenv.Fill(seg.Data())
	ro := mustAttach(t, name, true)
	require.True(t, ro.ReadOnly())
	require.Equal(t, seg.Data(), ro.Data())
	require.NoError(t, seg.Close())
	rw := mustAttach(t, name, false)
	require.False(t, rw.ReadOnly())
	rw.Data()[0] = 200
	require.EqualValues(t, 200, ro.Data()[0], "both mappings are the same memory")
	rc, err := ro.Refcount()
	require.NoError(t, err)
	require.EqualValues(t, 1, rc)
	require.NoError(t, ro.Close())
	require.NoError(t, rw.Close())
	require.False(t, testenv.Exists(name))
}

func TestUnlinkWhileHeldAndNameReuse(t *testing.T) {
	t.Parallel()
	name := testenv.UniqueName(t)
	old := mustCreate(t, name, dtype.Uint8, 8)
	testenv.Fill(old.Data())
	require.NoError(t, shm.Unlink(name))
	require.False(t, testenv.Exists(name))
	require.Equal(t, byte(7), old.Data()[7], "holders keep their memory")
	_, err := shm.Attach(name, 0, false)
	require.ErrorIs(t, err, unix.ENOENT)
	require.ErrorIs(t, shm.Unlink(name), unix.ENOENT)

	reused := mustCreate(t, name, dtype.Uint8, 8)
	require.NoError(t, old.Close())
	require.True(t, testenv.Exists(name), "releasing the old segment must not unlink the new one of the same name")
	require.NoError(t, reused.Close())
	require.False(t, testenv.Exists(name))
}

func TestReleaseAllKeepsMappings(t *testing.T) {
	a := mustCreate(t, testenv.UniqueName(t), dtype.Uint8, 8)
	b := mustCreate(t, testenv.UniqueName(t), dtype.Uint8, 8)
	testenv.Fill(a.Data())
	n, err := shm.ReleaseAll()
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 2)
	require.False(t, testenv.Exists(a.Name()))
	require.False(t, testenv.Exists(b.Name()))
	require.Equal(t, byte(5), a.Data()[5], "mappings stay for views still in use")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
}

func TestAddRefDropRef(t *testing.T) {
	t.Parallel()
	name := testenv.UniqueName(t)
	seg := mustCreate(t, name, dtype.Uint8, 1)
	n, err := seg.AddRef()
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.NoError(t, seg.Close())
	require.True(t, testenv.Exists(name), "the in-flight count still holds it")
	holder, err := shm.Attach(name, 0, false)
	require.NoError(t, err)
	n, err = holder.DropRef()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.NoError(t, holder.Close())
	require.False(t, testenv.Exists(name))
}

func init() {
	testenv.Helpers["refcount-worker"] = func(args []string) error {
		n, err := strconv.Atoi(args[1])
		if err != nil {
			return err
		}
		seg, err := shm.Attach(args[0], header.KindTensor, false)
		if err != nil {
			return err
		}
		for range n {
			if _, err := seg.AddRef(); err != nil {
				return err
			}
		}
		fmt.Println("ready")
		if _, err := testenv.StdinLine(); err != nil {
			return err
		}
		for range n {
			if _, err := seg.DropRef(); err != nil {
				return err
			}
		}
		return seg.Close()
	}
	testenv.Helpers["verify-and-invert"] = func(args []string) error {
		seg, err := shm.Attach(args[0], header.KindTensor, false)
		if err != nil {
			return err
		}
		for i, b := range seg.Data() {
			if b != byte(i%251) {
				return fmt.Errorf("byte %d is %d, want %d", i, b, i%251)
			}
			seg.Data()[i] = ^b
		}
		return seg.Close()
	}
	// create-and-wait creates a segment, fills it, says "created", and
	// closes it when it reads a line (see startOwner).
	testenv.Helpers["create-and-wait"] = func(args []string) error {
		seg, err := shm.Create(args[0], header.KindTensor, dtype.Uint8, []int64{1 << 16})
		if err != nil {
			return err
		}
		testenv.Fill(seg.Data())
		fmt.Println("created")
		if _, err := testenv.StdinLine(); err != nil {
			return err
		}
		return seg.Close()
	}
	testenv.Helpers["attach-and-digest"] = func(args []string) error {
		seg, err := shm.Attach(args[0], header.KindTensor, true)
		if err != nil {
			return err
		}
		fmt.Println(testenv.Digest(seg.Data()))
		return seg.Close()
	}
}

// startOwner runs a process that creates segment name and holds it until
// told to exit.
func startOwner(t *testing.T, name string) *testenv.Helper {
	t.Helper()
	h := testenv.StartHelper(t, "create-and-wait", name)
	require.Equal(t, "created", h.ReadLine(t))
	return h
}

func TestRefcountAcrossProcesses(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	const procs, each = 8, 10000
	name := testenv.UniqueName(t)
	seg := mustCreate(t, name, dtype.Uint8, 1)
	defer seg.Close()
	workers := make([]*testenv.Helper, procs)
	for i := range workers {
		workers[i] = testenv.StartHelper(t, "refcount-worker", name, strconv.Itoa(each))
	}
	for _, w := range workers {
		require.Equal(t, "ready", w.ReadLine(t))
	}
	rc, err := seg.Refcount()
	require.NoError(t, err)
	require.EqualValues(t, 1+procs*(1+each), rc, "every increment counted exactly once")
	for _, w := range workers {
		w.Send(t, "go")
	}
	for _, w := range workers {
		w.Wait(t)
	}
	rc, err = seg.Refcount()
	require.NoError(t, err)
	require.EqualValues(t, 1, rc, "every decrement counted exactly once")
}

func TestWritesCrossProcesses(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	name := testenv.UniqueName(t)
	seg := mustCreate(t, name, dtype.Uint8, 1<<20)
	testenv.Fill(seg.Data())
	w := testenv.StartHelper(t, "verify-and-invert", name)
	w.Wait(t)
	require.True(t, testenv.Exists(name), "a consumer that exits normally does not unlink what the producer holds")
	for i, b := range seg.Data() {
		if b != ^byte(i%251) {
			t.Fatalf("byte %d is %d after the other process wrote it", i, b)
		}
	}
	require.NoError(t, seg.Close())
	require.False(t, testenv.Exists(name))
}

func TestHandOnAfterCreatorExits(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	name := testenv.UniqueName(t)
	a := startOwner(t, name)
	b := mustAttach(t, name, false)
	want := testenv.Digest(b.Data())
	a.Exit(t)
	require.True(t, testenv.Exists(name), "B still holds it after its creator A exited")

	c := testenv.StartHelper(t, "attach-and-digest", name)
	require.Equal(t, want, c.ReadLine(t), "C reads what A wrote")
	c.Wait(t)
	require.NoError(t, b.Close())
	require.False(t, testenv.Exists(name))
}

func TestAttachOfAMappedNameChecksItStillNamesTheSameFile(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	name := testenv.UniqueName(t)
	old := mustCreate(t, name, dtype.Uint8, 1<<16)
	defer old.Close()
	require.NoError(t, shm.Unlink(name))
	other := startOwner(t, name) // a new file under the same name
	seg := mustAttach(t, name, false)
	require.EqualValues(t, 1, seg.Data()[1], "the new file's data, not the old mapping's")
	rc, err := seg.Refcount()
	require.NoError(t, err)
	require.EqualValues(t, 2, rc, "this process now holds the new file too")
	require.NoError(t, seg.Close())
	other.Exit(t)
	require.False(t, testenv.Exists(name))

	mapped := mustCreate(t, testenv.UniqueName(t), dtype.Uint8, 1)
	defer mapped.Close()
	require.NoError(t, os.Chmod(testenv.SegmentPath(mapped.Name()), 0o644))
	_, err = shm.Attach(mapped.Name(), 0, false)
	require.ErrorIs(t, err, unix.EACCES, "a mapped segment whose mode was loosened is refused too")
}

func TestMapCacheReusesTheMappingOfALiveSegment(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	name := testenv.UniqueName(t)
	owner := startOwner(t, name)

	first := mustAttach(t, name, false)
	addr := &first.Data()[0]
	require.NoError(t, first.Close())
	rc, err := shm.Stat(name)
	require.NoError(t, err)
	require.EqualValues(t, 1, rc.Header.Refcount, "a cached mapping holds no count")
	require.True(t, testenv.Mapped(t, name), "the mapping waits in the cache")

	again := mustAttach(t, name, false)
	require.Same(t, addr, &again.Data()[0], "the cached mapping is reused")
	n, err := again.Refcount()
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "reattaching counts this process again")
	require.NoError(t, again.Close())

	// The owner lets go: the segment is unlinked at once, and the cached
	// mapping goes within a sweep.
	owner.Exit(t)
	require.False(t, testenv.Exists(name))
	_, err = shm.Attach(name, header.KindTensor, false)
	require.ErrorIs(t, err, unix.ENOENT)
	require.Eventually(t, func() bool { return !testenv.Mapped(t, name) }, 5*time.Second, 20*time.Millisecond,
		"a cached mapping of a dead segment is unmapped")
}

func TestMapCacheOff(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	was := shm.SetMapCache(false)
	defer shm.SetMapCache(was)
	name := testenv.UniqueName(t)
	owner := startOwner(t, name)
	seg := mustAttach(t, name, true)
	require.NoError(t, seg.Close())
	require.False(t, testenv.Mapped(t, name), "without the cache the last close unmaps")
	owner.Exit(t)
}

func TestMapCacheNeverServesAReplacedFile(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	name := testenv.UniqueName(t)
	a := startOwner(t, name)
	seg := mustAttach(t, name, false)
	seg.Data()[0] = 99
	require.NoError(t, seg.Close()) // cached, holding no count
	a.Exit(t)

	b := startOwner(t, name) // a new file, same name
	seg = mustAttach(t, name, false)
	require.EqualValues(t, 0, seg.Data()[0], "the new file, not the cached old one")
	require.NoError(t, seg.Close())
	b.Exit(t)
	require.False(t, testenv.Exists(name))
}

// On a tmpfs that gives huge pages when asked (huge=advise), a new segment
// of 2 MiB and more is made of them; a smaller one is not asked to be.
func TestLargeSegmentsAskForHugePages(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage"); err != nil {
		t.Skip("this kernel has no transparent huge pages")
	}
	dir := testenv.SegmentsOnTmpfs(t, "size=64m,huge=advise")
	used := func() int64 { // bytes of the mount in use
		var st unix.Statfs_t
		require.NoError(t, unix.Statfs(dir, &st))
		return int64(st.Blocks-st.Bfree) * st.Bsize
	}
	small := mustCreate(t, "", dtype.Uint8, 64<<10)
	require.Less(t, used(), int64(2<<20), "a small segment takes small pages")
	big := mustCreate(t, "", dtype.Uint8, 8<<20)
	testenv.Fill(big.Data())
	smaps, err := os.ReadFile("/proc/self/smaps")
	require.NoError(t, err)
	var pmd int64
	for _, line := range strings.Split(string(smaps), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "ShmemPmdMapped:" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			require.NoError(t, err)
			pmd += n << 10
		}
	}
	require.GreaterOrEqual(t, pmd, int64(4<<20), "the large segment is mapped with 2 MiB pages")
	require.NoError(t, small.Close())
	require.NoError(t, big.Close())
	requireEmptyDir(t, dir)
}
