package abitest

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/testenv"
)

const headerPath = "../zctipc.h"

// buildLibrary builds libzctipc.so the way setup.py does, into a temporary
// directory, and returns its path; under -short it skips the test.
func buildLibrary(t *testing.T) string {
	t.Helper()
	testenv.SkipShort(t, "builds libzctipc.so")
	dir := t.TempDir()
	lib := filepath.Join(dir, "libzctipc.so")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath",
		"-ldflags=-s -w -extldflags=-Wl,-soname,libzctipc.so", "-o", lib, "./go/capi")
	cmd.Dir = testenv.ModuleRoot()
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
// args in the module's root, and requires that it prints "ok".
func runC(t *testing.T, lib, program string, args ...string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), program)
	out, err := exec.Command("gcc", "-std=c11", "-Wall", "-Werror", "-pthread", "-I", filepath.Dir(headerPath),
		"testdata/"+program+".c", "-o", bin, "-L", filepath.Dir(lib), "-lzctipc", "-Wl,-rpath,"+filepath.Dir(lib)).CombinedOutput()
	require.NoError(t, err, "gcc: %s", out)
	// Its output goes to files, and it runs in a process group of its own,
	// which goes with it: a program that forks (a crash test's driver) and
	// fails leaves no child behind, nor one holding its output open, which
	// would have kept the test waiting until go test's timeout, its output
	// unseen.
	dir := t.TempDir()
	stdout, err := os.Create(filepath.Join(dir, "stdout"))
	require.NoError(t, err)
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	require.NoError(t, err)
	cmd := exec.Command(bin, args...)
	cmd.Dir = testenv.ModuleRoot()
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	err = cmd.Wait()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	require.NoError(t, stdout.Close())
	require.NoError(t, stderr.Close())
	out, _ = os.ReadFile(stdout.Name())
	errOut, _ := os.ReadFile(stderr.Name())
	require.NoError(t, err, "%s: %s%s", program, out, errOut)
	require.Equal(t, "ok\n", string(out), "%s: %s", program, errOut)
}

// program is a C program of testdata and whether it takes a segment name
// as its argument.
type program struct {
	file  string
	named bool
}

// TestCPrograms runs the C programs of testdata against one build of the
// library, in subtests of their own.
func TestCPrograms(t *testing.T) {
	lib := buildLibrary(t)
	for _, c := range []struct {
		name     string
		programs []program // run in order
	}{
		// CProgramUsesTheABI: the ABI through zctipc.h only, as any binding
		// uses it; and a bad out-pointer, which poisons the library so that
		// every later call fails cleanly.
		{"CProgramUsesTheABI", []program{{"abi_smoke", true}, {"abi_poison", false}}},
		// CQueueContract: NULL out-parameters, bad counts and short extents
		// are refused through the C ABI as zctipc.h's status table says.
		{"CQueueContract", []program{{"abi_queue_contract", true}}},
		// CQueueInline: zct_queue_put_inline builds an inline record in one
		// call, a get gives its array as a view in the get's buffer, and bad
		// arguments (ndim out of range, nbytes that are not the shape's, a
		// record larger than the ring, an unknown dtype, NULL pointers, a
		// closed or full queue) are each refused with their status.
		{"CQueueInline", []program{{"abi_queue_inline", false}}},
		// CInlineAttacks: inline records taken by the data plane across a
		// small ring's end, lap after lap, each as Go's get gives its twin;
		// takes with no room for a view, and a full ring.
		{"CInlineAttacks", []program{{"abi_inline_attacks", false}}},
		// CQueueLimits: the queue calls at the limits of their arguments
		// (counts of 0, -1 and INT32_MAX, types past a byte, a timeout past
		// the clock's range, inline records) and a queue closed while C
		// threads wait in it.
		{"CQueueLimits", []program{{"abi_queue_limits", true}}},
		// CHandoverAttacks: records a writer who lies puts in the ring
		// (inline headers that say what their bytes are not, a replayed
		// descriptor, a header claiming every descriptor), read by get,
		// get_many and peek: each is refused alone, the good records beside
		// them are given whole, and no count is left taken.
		{"CHandoverAttacks", []program{{"abi_handover_attacks", false}}},
		// CHandoff: zct_queue_take adopts records of pool slots outside Go,
		// under light refs that release there or become Go's when another
		// call names them; a replayed descriptor is refused alone or in a
		// record, no count left taken; past the table's room, and for a
		// segment's descriptor, Go adopts.
		{"CHandoff", []program{{"abi_handoff", false}}},
		// CLedgerAttacks: a light ref taken under one ledger and released
		// after zct_cleanup_disable and _enable made another leaves the new
		// ledger's records as they are; a ledger file shrunk by another
		// process records nothing and faults nothing.
		{"CLedgerAttacks", []program{{"abi_ledger_attacks", false}}},
		// CHandoffAttacks: a light ref named by two threads at once (a
		// release against a call that makes Go take it over, two such
		// calls, two releases): never refused as unknown while valid, its
		// count given back once; eight threads taking while others
		// release; zct_release_all with light refs held; forged records
		// (stale generations, a view past its slot, a ticket arena named
		// as the buffer's, descriptor counts and payload lengths that lie,
		// 16 and 17 descriptors, more views than room) taken by
		// zct_queue_take and zct_queue_get with one status and reason,
		// and whatever a forgery did not take still the genuine record's.
		{"CHandoffAttacks", []program{{"abi_handoff_attacks", false}}},
		// CPutAttacks: zct_queue_put_array's send of pool memory outside Go
		// against the call it replaced (zctipc_go_queue_put_array): every
		// shape kind, flag, dtype code, ndim, NULL pointer, extent at and
		// past a slot's end, sent alike or refused with one status and
		// reason, read alike by take and get; full queues with and without
		// a wait; threads putting one slot while others take; thousands
		// in flight; a replayed record refused; no count nor ticket left.
		{"CPutAttacks", []program{{"abi_put_attacks", false}}},
		// CDTypeAttacks: every call that takes a dtype code refuses an
		// unknown one (0, negative, past 16 bits, past the last) with
		// ZCT_E_DTYPE and leaves everything as it was, every valid code
		// round-trips, a table is uint8 in one dimension; a dtype forged
		// into a header, a descriptor, an inline record or a stream's
		// layout is refused, never wrapped onto a valid code nor read past
		// its bytes.
		{"CDTypeAttacks", []program{{"abi_dtype_attacks", true}}},
		// CPlaneLocks: the locks of the data plane's steps, which the C
		// ABI's queue calls run without Go: a put that must catch up after
		// a killed consumer leaves no lock held for Go to wait on, a file
		// cut under a step that holds a lock fails every call at once
		// (ZCT_E_CORRUPT), and peers stopped and killed in their steps
		// leave locks that the others wait out or take over.
		{"CPlaneLocks", []program{{"abi_plane_locks", true}}},
		// CPlaneRecords: records and ring words forged in the ring (sizes,
		// skips, types, payload lengths, positions past 2^31 and 2^32, a
		// length rewritten while a take copies it) are taken whole or
		// refused with ZCT_E_CORRUPT, never read past, and later messages
		// flow.
		{"CPlaneRecords", []program{{"abi_plane_records", false}}},
		// CPlaneSigbus: a queue file shrunk under threads that call it
		// ends their calls with ZCT_E_CORRUPT, not the process; a SIGBUS
		// outside the plane's steps still kills, or reaches the program's
		// own handler, installed before or after the plane's guard.
		{"CPlaneSigbus", []program{{"abi_plane_sigbus", false}}},
		// CGuardAttacks: many threads not made by Go faulting at once on
		// queues cut under them; a SIGBUS outside the plane's steps, in a
		// thread that armed the guard or a child forked from one, still
		// kills; a handler installed before the library loaded still gets
		// its own faults; sleepers of every kind on a cut file all return.
		{"CGuardAttacks", []program{{"abi_guard_attacks", false}}},
		// CLightRefAttacks: forged, released and contested light refs are
		// refused with no count moved; threads holding more refs at once
		// than the light table holds get Go's for the rest.
		{"CLightRefAttacks", []program{{"abi_light_ref_attacks", false}}},
		// CPlaneHandles: forged, stale and other kinds' handles; a close
		// while threads call on the handle; arms out of balance or across
		// handles; more queues open than the C table has slots.
		{"CPlaneHandles", []program{{"abi_plane_handles", true}}},
		// CPlaneWaits: zct_queue_take's waits in C: a timeout too long for
		// the clock waits for ever, sleepers are each woken by a put, and a
		// close, a signal or a shrunk file ends them, their counts taken
		// back.
		{"CPlaneWaits", []program{{"abi_plane_waits", true}}},
		// CPlaneCrashes: producers and consumers killed at random in their
		// steps and sleeps: no message duplicated or lost beyond the
		// documented rule, and the dead's locks taken over.
		{"CPlaneCrashes", []program{{"abi_plane_crashes", true}}},
		// CStreamWriterAttacks: a stream writer's claim and publish, run
		// in C: slot table entries forged past the ring, twice or moved
		// are refused as corrupt, saying the frame and the slots, the
		// same every time; positions past 2^31 and 2^32; threads that
		// claim, publish, read the counts and peek while the writer is
		// closed under them, and its stale handle after; a file shrunk
		// under the writer.
		{"CStreamWriterAttacks", []program{{"abi_stream_writer_attacks", false}}},
		// CPollPlaneAttacks: takes and looks that poll in C, and a stream
		// reader's arms counted in C: timeouts of 0, 1 ms, 200 ms, negative
		// and past the clock's range under every poll policy (never cut
		// short); policies switched while a take or a look waits, and calls
		// on a reader that looks again and again not starved; a close while
		// pollers wait; more pollers than cores on one queue and one
		// reader, each message and frame taken once; arms from many
		// threads, out of balance, after a close, through forged and other
		// kinds' handles and past the C table; a close while threads sleep
		// on the armed word; a reader killed while armed; files shrunk
		// under pollers and an armed reader.
		{"CPollPlaneAttacks", []program{{"abi_poll_plane_attacks", true}}},
		// CPlaneFixAttacks: the busy word's WANTED mark, a next whose look
		// goes to Go, and the time a wait hands to Go: Go's calls from many
		// threads against C steps on one reader and writer, not starved,
		// and the steps going on after them; a close while Go's calls wait
		// for a look in C; many threads calling next on one reader while
		// its policy switches, each frame once and whole; timeouts of 0 to
		// 3 ms, negative and past the clock's range on every policy, never
		// empty before the deadline.
		{"CPlaneFixAttacks", []program{{"abi_plane_fix_attacks", false}}},
		// CArmModel: a model of the sleepers that a handle's arms count
		// (Note [an arm is the handle's once counted] in fast.c): threads
		// arm and disarm a queue's words and a reader's at random, each in
		// balance, beside another handle's arms; at each stop the counts on
		// the words and in the reader's slot are the model's, a thread's
		// disarm of its own arm is never refused, and a close under the
		// threads takes back theirs alone. Counts forged in the file never
		// wrap round on a disarm or a close, and a sleeper armed after the
		// forgery is woken by a put or a publish.
		{"CArmModel", []program{{"abi_arm_model", true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, p := range c.programs {
				var args []string
				if p.named {
					args = append(args, testenv.UniqueName(t))
				}
				runC(t, lib, p.file, args...)
			}
		})
	}
}
