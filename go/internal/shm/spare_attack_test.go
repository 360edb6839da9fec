package shm_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/shm"
	"golang.org/x/sys/unix"
)

// Another process of the user tampers with a spare between its making and
// its reuse. Whatever it did, the next segment is made (never refused),
// reads as zeros, has mode 0600 and one name, and has every page of its
// data in the file (so no write into it can fault when the file system
// fills); the tampered file is gone once the spares are dropped.
func TestTamperedSparesAreNotReused(t *testing.T) {
	tracked(t)
	const size = 4 << 20
	tampers := map[string]func(t *testing.T, path string){
		"grown": func(t *testing.T, path string) { require.NoError(t, os.Truncate(path, 2*size)) },
		"chmod": func(t *testing.T, path string) { require.NoError(t, os.Chmod(path, 0o644)) },
		"garbage": func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteAt([]byte("not a header, not zeros"), 0)
			require.NoError(t, err)
			_, err = f.WriteAt([]byte{0xff}, 3<<20)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		},
		"hard link": func(t *testing.T, path string) {
			require.NoError(t, os.Link(path, filepath.Join(shm.Dir(), "a-second-name")))
		},
		"symlink": func(t *testing.T, path string) {
			moved := filepath.Join(shm.Dir(), "moved-away")
			require.NoError(t, os.Rename(path, moved))
			require.NoError(t, os.Symlink(moved, path))
		},
		"hole punched": func(t *testing.T, path string) {
			fd, err := unix.Open(path, unix.O_RDWR, 0)
			require.NoError(t, err)
			require.NoError(t, unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 1<<20, 1<<20))
			require.NoError(t, unix.Close(fd))
		},
	}
	for name, tamper := range tampers {
		for _, uninit := range []bool{false, true} {
			t.Run(fmt.Sprint(name, "/uninitialized=", uninit), func(t *testing.T) {
				tamperedSpare(t, name, tamper, uninit)
			})
		}
	}
}

// tamperedSpare makes a spare, tampers with it, and makes the next segment
// (zeroed, or with uninit one for data that Publish names).
func tamperedSpare(t *testing.T, name string, tamper func(t *testing.T, path string), uninit bool) {
	const size = 4 << 20 // the size of makeSpare's spare
	defer func() {
		for _, extra := range []string{"a-second-name", "moved-away"} {
			os.Remove(filepath.Join(shm.Dir(), extra))
		}
	}()
	tamper(t, filepath.Join(shm.Dir(), makeSpare(t)))

	var b *shm.Segment
	var err error
	if uninit {
		b, err = shm.CreateUninitialized("", header.KindTensor, dtype.Uint8, []int64{size})
		require.NoError(t, err, "a tampered spare is dropped, not an error")
		require.NoError(t, b.Publish())
	} else {
		b, err = shm.Create("", header.KindTensor, dtype.Uint8, []int64{size})
		require.NoError(t, err, "a tampered spare is dropped, not an error")
		requireZeros(t, b.Data())
	}
	var st unix.Stat_t
	require.NoError(t, unix.Lstat(filepath.Join(shm.Dir(), b.Name()), &st))
	require.EqualValues(t, unix.S_IFREG|0o600, st.Mode, "a regular file of mode 0600")
	require.EqualValues(t, 1, st.Nlink, "one name: another would keep its pages after it goes")
	require.GreaterOrEqual(t, st.Blocks*512, st.Size, "every page reserved")
	other, err := shm.Attach(b.Name(), header.KindTensor, false)
	require.NoError(t, err, "another process can attach it")
	require.NoError(t, other.Close())
	require.NoError(t, b.Close())
	shm.DropSpares()
	left := tmpFiles(t)
	if name == "symlink" && len(left) == 1 {
		// The link is the tamperer's, and stays: only the file
		// that was the spare is the library's to remove.
		var st unix.Stat_t
		require.NoError(t, unix.Lstat(filepath.Join(shm.Dir(), left[0]), &st))
		require.EqualValues(t, unix.S_IFLNK, st.Mode&unix.S_IFMT)
		require.NoError(t, os.Remove(filepath.Join(shm.Dir(), left[0])))
		left = nil
	}
	require.Empty(t, left, "the tampered spare is removed")
	_, err = os.Lstat(filepath.Join(shm.Dir(), "moved-away"))
	require.ErrorIs(t, err, os.ErrNotExist, "the spare renamed away is removed")
}
