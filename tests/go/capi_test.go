package gotests

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const headerPath = "../../go/capi/zctipc.h"

// buildLibrary builds libzctipc.so the way setup.py does, into a temporary
// directory, and returns its path.
func buildLibrary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	lib := filepath.Join(dir, "libzctipc.so")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath",
		"-ldflags=-s -w -extldflags=-Wl,-soname,libzctipc.so", "-o", lib, "./go/capi")
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build -buildmode=c-shared: %s", out)
	return lib
}

// declaredFunctions returns the names of the functions zctipc.h declares.
func declaredFunctions(t *testing.T) []string {
	raw, err := os.ReadFile(headerPath)
	require.NoError(t, err)
	text := regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(string(raw), "")
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^[a-z][\w ]*?\*?\s*(zct_\w+)\s*\(`).FindAllStringSubmatch(text, -1) {
		names = append(names, m[1])
	}
	slices.Sort(names)
	return names
}

func TestHeaderMatchesExports(t *testing.T) {
	lib := buildLibrary(t)
	f, err := elf.Open(lib)
	require.NoError(t, err)
	defer f.Close()
	syms, err := f.DynamicSymbols()
	require.NoError(t, err)
	var exported []string
	for _, s := range syms {
		if strings.HasPrefix(s.Name, "zct_") && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
			exported = append(exported, s.Name)
		}
	}
	slices.Sort(exported)
	declared := declaredFunctions(t)
	require.NotEmpty(t, declared)
	require.Contains(t, declared, "zct_abi_version")
	require.Equal(t, declared, exported, "zctipc.h and the library's exports differ")

	soname, err := f.DynString(elf.DT_SONAME)
	require.NoError(t, err)
	require.Equal(t, []string{"libzctipc.so"}, soname)
}

// runC compiles testdata/program.c against zctipc.h and lib, runs it with
// args, and requires that it prints "ok".
func runC(t *testing.T, lib, program string, args ...string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), program)
	out, err := exec.Command("gcc", "-std=c11", "-Wall", "-Werror", "-pthread", "-I", filepath.Dir(headerPath),
		"testdata/"+program+".c", "-o", bin, "-L", filepath.Dir(lib), "-lzctipc", "-Wl,-rpath,"+filepath.Dir(lib)).CombinedOutput()
	require.NoError(t, err, "gcc: %s", out)
	out, err = exec.Command(bin, args...).Output()
	require.NoError(t, err, "%s: %s", program, out)
	require.Equal(t, "ok\n", string(out))
}

func TestCProgramUsesTheABI(t *testing.T) {
	lib := buildLibrary(t)
	runC(t, lib, "abi_smoke", uniqueName(t))
	runC(t, lib, "abi_poison")
}

// TestCQueueContract: NULL out-parameters, bad counts and short extents
// are refused through the C ABI as zctipc.h's status table says.
func TestCQueueContract(t *testing.T) {
	lib := buildLibrary(t)
	runC(t, lib, "abi_queue_contract", uniqueName(t))
}

// TestCQueueInline: zct_queue_put_inline builds an inline record in one
// call, a get gives its array as a view in the get's buffer, and bad
// arguments (ndim out of range, nbytes that are not the shape's, a record
// larger than the ring, an unknown dtype, NULL pointers, a closed or full
// queue) are each refused with their status.
func TestCQueueInline(t *testing.T) {
	lib := buildLibrary(t)
	runC(t, lib, "abi_queue_inline")
}

// TestCQueueLimits: the queue calls at the limits of their arguments (counts
// of 0, -1 and INT32_MAX, types past a byte, a timeout past the clock's
// range, inline records) and a queue closed while C threads wait in it.
func TestCQueueLimits(t *testing.T) {
	lib := buildLibrary(t)
	runC(t, lib, "abi_queue_limits", uniqueName(t))
}

// TestCHandoverAttacks: records a writer who lies puts in the ring
// (inline headers that say what their bytes are not, a replayed
// descriptor, a header claiming every descriptor), read by get, get_many
// and peek: each is refused alone, the good records beside them are given
// whole, and no count is left taken.
func TestCHandoverAttacks(t *testing.T) {
	lib := buildLibrary(t)
	runC(t, lib, "abi_handover_attacks")
}
