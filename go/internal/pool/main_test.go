package pool

import (
	"fmt"
	"os"
	"testing"

	"github.com/zctipc/zctipc/go/internal/shm"
)

// TestMain gives the run a segment directory of its own, which must be
// empty when the tests end.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("/dev/shm", fmt.Sprintf("zctipc-pooltest-%d-", os.Getpid()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "make segment directory:", err)
		os.Exit(2)
	}
	os.Setenv(shm.DirEnv, dir)
	code := m.Run()
	if err := CloseTickets(); err != nil {
		fmt.Fprintln(os.Stderr, "close ticket arenas:", err)
		code = 1
	}
	if left, err := os.ReadDir(dir); err == nil && len(left) > 0 {
		for _, e := range left {
			fmt.Fprintln(os.Stderr, "leaked segment:", e.Name())
		}
		code = 1
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, "remove segment directory:", err)
		code = 1
	}
	os.Exit(code)
}
