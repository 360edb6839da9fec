package shm

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/zctipc/zctipc/go/internal/header"
	"golang.org/x/sys/unix"
)

// Strategy says where new segments live.
type Strategy int32

// The sharing strategies, named as torch.multiprocessing names its own.
const (
	// FileSystem segments are files in Dir(), found by name.
	FileSystem Strategy = iota
	// FileDescriptor segments are memfds: they have no name in any file
	// system, other processes receive their file descriptor from the Broker
	// (over a Unix socket, with SCM_RIGHTS), and the kernel frees them when
	// the last descriptor and mapping go, whatever dies.
	FileDescriptor
)

var strategyNames = [...]string{FileSystem: "file_system", FileDescriptor: "file_descriptor"}

// String returns the strategy's name ("file_system").
func (s Strategy) String() string {
	if s < 0 || int(s) >= len(strategyNames) {
		return fmt.Sprintf("strategy(%d)", int32(s))
	}
	return strategyNames[s]
}

// ParseStrategy returns the strategy named name.
func ParseStrategy(name string) (Strategy, error) {
	for s, n := range strategyNames {
		if n == name {
			return Strategy(s), nil
		}
	}
	return 0, fmt.Errorf("unknown sharing strategy %q; the strategies are %s: %w",
		name, strings.Join(strategyNames[:], " and "), unix.EINVAL)
}

// StrategyEnv names the environment variable that chooses the strategy of a
// process when it starts.
const StrategyEnv = "ZCTIPC_SHARING_STRATEGY"

var strategy atomic.Int32

// InitStrategy sets the strategy from $ZCTIPC_SHARING_STRATEGY (file_system
// when it is unset).
func InitStrategy() error {
	s := FileSystem
	if v := os.Getenv(StrategyEnv); v != "" {
		var err error
		if s, err = ParseStrategy(v); err != nil {
			return fmt.Errorf("%s: %w", StrategyEnv, err)
		}
	}
	strategy.Store(int32(s))
	return nil
}

func init() {
	if err := InitStrategy(); err != nil {
		fmt.Fprintln(os.Stderr, "zctipc:", err)
	}
}

// CurrentStrategy returns the strategy that new segments are created with.
func CurrentStrategy() Strategy { return Strategy(strategy.Load()) }

// SetStrategy sets the strategy of the segments created from now on.
// Segments that exist keep theirs.
func SetStrategy(s Strategy) error {
	if s != FileSystem && s != FileDescriptor {
		return fmt.Errorf("sharing strategy %d: %w", int32(s), unix.EINVAL)
	}
	strategy.Store(int32(s))
	return nil
}

// Broker keeps the file descriptors of memfd segments, so that a process
// can attach one by name: the cleanup daemon's client is the broker of
// ordinary processes, and the daemon is its own.
type Broker interface {
	// Put hands over a new memfd segment, which the broker keeps until
	// Drop (or until its count reaches zero).
	Put(name string, fd int) error
	// Fetch returns a new file descriptor of segment name, which the caller
	// closes.
	Fetch(name string) (int, error)
	// Drop says that the count of segment name reached zero.
	Drop(name string)
}

var broker atomic.Pointer[Broker]

// SetBroker sets the broker of memfd segments (nil for none).
func SetBroker(b Broker) {
	if b == nil {
		broker.Store(nil)
		return
	}
	broker.Store(&b)
}

// ErrNoBroker is returned for a memfd segment when no broker was set.
var ErrNoBroker = errors.New("the file_descriptor strategy needs the cleanup daemon (zctipcd), and this process is not connected to one")

func currentBroker() (Broker, error) {
	if b := broker.Load(); b != nil {
		return *b, nil
	}
	return nil, ErrNoBroker
}

// NoEntry is the entry number of a count that a Tracker did not record.
const NoEntry = -1

// Tracker records, outside this process, the counts this process holds, so
// that they can be given up for it when it dies without doing so (package
// ledger is the tracker). Each method returns quickly and makes no system
// call in the common case; the numbers it returns name its entries.
//
// The shm package takes a count before it records it and clears the record
// before it gives the count up (see the note in package ledger).
type Tracker interface {
	// Creating records a segment about to be created under the temporary
	// name tmp and renamed to final.
	Creating(tmp, final string) int
	// Opened records the device and inode of the temporary file of entry n.
	Opened(n int, dev, ino uint64)
	// Created turns entry n into a count on its final name.
	Created(n int)
	// Holding records a count on segment name.
	Holding(name string) int
	// Dropped clears entry n.
	Dropped(n int)
}

var tracker atomic.Pointer[Tracker]

// SetTracker sets the tracker of this process's counts (nil for none).
func SetTracker(t Tracker) {
	if t == nil {
		tracker.Store(nil)
		return
	}
	tracker.Store(&t)
}

// currentTracker returns the tracker, or nil when counts are not tracked.
func currentTracker() Tracker {
	if t := tracker.Load(); t != nil {
		return *t
	}
	return nil
}

// StallEnv names the environment variable of a fault-injection point: when
// it names one of the points of Create ("create-open", "create-reserve",
// "create-rename"), Create stops there forever (for any segment but the
// process's ledger), so that a crash test can kill the process at that
// exact step.
const StallEnv = "ZCTIPC_TEST_STALL"

var stallAt = os.Getenv(StallEnv)

func stall(kind header.Kind, point string) {
	if stallAt == point && kind != header.KindLedger {
		for {
			time.Sleep(time.Hour)
		}
	}
}

// InitStall re-reads $ZCTIPC_TEST_STALL (for hosts that set it after the
// process started).
func InitStall() { stallAt = os.Getenv(StallEnv) }

// Memfd checks.

// CheckMemfd checks that fd is a memfd segment named name, sealed against
// shrinking: a file descriptor received from another process is one, or is
// refused.
func CheckMemfd(fd int, name string) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return fmt.Errorf("the file descriptor received for segment %q is not a sealed memfd: %w", name, unix.EACCES)
	}
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if want := "/memfd:" + name; err != nil || link != want && !strings.HasPrefix(link, want+" ") {
		return fmt.Errorf("the file descriptor received for segment %q is another memfd: %w", name, unix.EACCES)
	}
	return nil
}

// createMemfd makes the file of a memfd segment: the caller reserves,
// writes and seals it.
func createMemfd(name string) (int, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("create memfd segment %q: %w", name, err)
	}
	return fd, nil
}

// seal forbids shrinking a memfd segment, which would turn the mappings of
// other processes into SIGBUS.
func seal(fd int, name string) error {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL); err != nil {
		return fmt.Errorf("seal memfd segment %q: %w", name, err)
	}
	return nil
}
