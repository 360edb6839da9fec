// Package futex waits on and wakes 32-bit words in memory shared between
// processes (futex(2) without FUTEX_PRIVATE_FLAG).
package futex

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zctipc/zctipc/go/internal/fault"
	"github.com/zctipc/zctipc/go/internal/plane"
	"golang.org/x/sys/unix"
)

// Errors Wait returns besides nil.
var (
	// ErrTimeout means the timeout passed first.
	ErrTimeout = errors.New("futex wait timed out")
	// ErrInterrupted means a signal arrived; the caller's host may have a
	// handler to run (Python's Ctrl-C) before waiting again.
	ErrInterrupted = errors.New("futex wait interrupted by a signal")
)

const (
	futexWait = 0 // FUTEX_WAIT, shared between processes
	futexWake = 1 // FUTEX_WAKE, shared between processes
)

// Wait sleeps while *addr == val, until a Wake on addr, the timeout (none if
// negative), or a signal. It returns nil when woken or when *addr no longer
// held val (callers re-check their condition), ErrTimeout when the timeout
// passed, ErrInterrupted when a signal arrived, and an error wrapping
// fault.ErrFault when the word's page lies past the end of a shrunk file.
func Wait(addr *uint32, val uint32, timeout time.Duration) error {
	var ts *unix.Timespec
	if timeout >= 0 {
		t := unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(ts)), 0, 0)
	return waitResult(addr, errno)
}

// waitBriefly is Wait for at most a short timeout without telling the Go
// scheduler: a thread that returns from a long system call may find that
// the scheduler gave its processor away, and getting one back costs about
// as much as the wake-up itself. It holds its processor meanwhile (the
// garbage collector waits for it to stop), so it is used only for
// briefWait.
func waitBriefly(addr *uint32, val uint32, timeout time.Duration) error {
	t := unix.NsecToTimespec(int64(timeout))
	_, _, errno := unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(&t)), 0, 0)
	return waitResult(addr, errno)
}

func waitResult(addr *uint32, errno unix.Errno) error {
	switch errno {
	case 0, unix.EAGAIN:
		return nil
	case unix.ETIMEDOUT:
		return ErrTimeout
	case unix.EINTR:
		return ErrInterrupted
	}
	return callError(addr, errno)
}

// callError is the error of a futex call on addr that failed with errno.
// The kernel reads the word itself, so a word on a page past the end of a
// shrunk file fails with EFAULT where a load would fault: that is the
// fault a load would have met (fault.ErrFault), and callers treat it so.
func callError(addr *uint32, errno unix.Errno) error {
	if errno == unix.EFAULT {
		return &fault.Error{Addr: uintptr(unsafe.Pointer(addr))}
	}
	return errno
}

// Wake wakes up to n waiters on addr and returns how many it woke. It
// does not tell the Go scheduler (Note [a wake-up the runtime does not
// see]).
func Wake(addr *uint32, n int) (int, error) {
	woken, _, errno := unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(n), 0, 0, 0)
	if errno != 0 {
		return 0, callError(addr, errno)
	}
	return int(woken), nil
}

// Note [a wake-up the runtime does not see]. FUTEX_WAKE never blocks: it
// returns as soon as the kernel has marked the sleepers runnable. Made as
// Go makes a system call that may block (unix.Syscall6), it first told the
// scheduler that the thread was entering one, and when the process had
// been idle (the runtime's monitor thread, sysmon, asleep until something
// happens) that woke the monitor: one more futex wake-up, and one more
// thread to run on a small machine, before the sleeper's own wake-up, on
// the path from a put to the consumer. Counted over 1,000 messages 1 ms
// apart between two processes: 5.3 futex calls per message with
// unix.Syscall6, 3.3 with unix.RawSyscall6. A raw call holds on to the
// thread's processor for its few microseconds, as the runtime's own wake-ups
// (futexwakeup) do.

// Until says how long a wait may last: until Deadline (none when zero),
// or until Done is closed (never when nil), whichever comes first. A wait
// whose Done closes must also be woken (the word bumped and waiters woken:
// see Wake), since a sleeper does not watch the channel.
type Until struct {
	Deadline time.Time
	Done     <-chan struct{}
}

// WakeOnDone arranges for wake to run when ctx is done (wake bumps the
// words its waiters sleep on), and returns the Until of ctx and a stop
// function that undoes the arrangement. stop waits for a wake that has
// started to finish: a caller that defers stop before it lets go of the
// memory wake touches (a call in flight, which Close waits for) never has
// wake run on memory unmapped.
func WakeOnDone(ctx context.Context, wake func()) (Until, func()) {
	deadline, _ := ctx.Deadline()
	u := Until{Deadline: deadline, Done: ctx.Done()}
	if u.Done == nil {
		return u, func() {}
	}
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(done)
		wake()
	})
	return u, func() {
		if !stop() {
			<-done
		}
	}
}

// Stopped reports whether Done is closed.
func (u Until) Stopped() bool {
	select {
	case <-u.Done:
		return true
	default:
		return false
	}
}

// Cause adds why ctx ended (ctx.Err(), or DeadlineExceeded once its
// deadline passed, which the wait may see before ctx does) to err, the
// timeout error of a wait on ctx.
func Cause(ctx context.Context, err error) error {
	cause := ctx.Err()
	if d, ok := ctx.Deadline(); cause == nil && ok && !time.Now().Before(d) {
		cause = context.DeadlineExceeded
	}
	if cause == nil {
		return err
	}
	return errors.Join(err, cause)
}

// Policy says how a waiter waits for a sequence word to move.
type Policy struct {
	// Spin is how long it looks at the word before it sleeps on it; a
	// negative Spin looks until the deadline and never sleeps.
	Spin time.Duration
	// Poll looks without yielding the CPU, with a spin-wait hint between
	// looks: the waiter takes a core while it looks and sees a change
	// within a few hundred nanoseconds. Otherwise it yields the CPU
	// between looks after the first few (a sched_yield system call each),
	// which costs others little when there are more waiters than cores.
	Poll bool
	// Pace, when set, adapts a sleeping waiter's spin to how long its
	// recent waits lasted (see Pace); nil keeps Spin as it is.
	Pace *Pace
}

// Note [paced spin]. A waiter that sleeps on the futex costs the signaller
// a wake-up call and itself a trip through the scheduler, which on a small
// machine is tens of microseconds; when events come steadily a little
// more often than the fixed spin lasts (1 MiB stream frames written every
// 70-80 µs here), nearly every wait ends in a sleep. Measured on one writer
// and one reader of 1 MiB frames: a 50 µs spin gave 11.9-13.0 K frames/s,
// a 500 µs one 13.4-14.0 K. But a long fixed spin burns the waiter's core
// whenever events are sparse (a message every millisecond). A Pace keeps a
// running estimate of the waits and spins for twice the recent wait, up
// to maxPacedSpin, only while waits are that short; otherwise the policy's
// own spin applies, and a waiter between sparse events sleeps as before.

// maxPacedSpin bounds a paced spin; waits longer than it leave the spin
// at the policy's.
const maxPacedSpin = 200 * time.Microsecond

// A Pace learns how long one waiter's waits last (Note [paced spin]). The
// zero value is ready to use; it is safe for concurrent use (an estimate:
// concurrent waits may overwrite each other's observations).
type Pace struct{ ns atomic.Int64 }

// NewSleeping returns the default policy with a Pace of its own: Sleeping,
// with its spin stretched while events come steadily.
func NewSleeping() Policy {
	p := Sleeping
	p.Pace = new(Pace)
	return p
}

// Spin returns how long to spin before sleeping: base, or twice the recent
// wait while recent waits are shorter than maxPacedSpin.
func (p *Pace) Spin(base time.Duration) time.Duration {
	recent := time.Duration(p.ns.Load())
	if recent <= 0 || recent >= maxPacedSpin {
		return base
	}
	return max(base, min(2*recent, maxPacedSpin))
}

// Observe adds a wait that lasted waited to the estimate, a moving average
// in which a wait weighs a quarter; waits past a few maxPacedSpin count as
// that, so that one long idle spell is forgotten within a few dozen waits.
func (p *Pace) Observe(waited time.Duration) {
	waited = min(waited, 4*maxPacedSpin)
	old := p.ns.Load()
	if old == 0 {
		p.ns.Store(int64(waited))
		return
	}
	p.ns.Store(old + (int64(waited)-old)/4)
}

// Sleeping is a 50 µs spin that yields, then a sleep. A message that comes
// within the spin is taken without a wake-up call, which costs the sender
// a system call and the receiver a trip through the scheduler. Queues and
// streams start with NewSleeping: this, with a Pace of their own.
var Sleeping = Policy{Spin: 50 * time.Microsecond}

// briefWait bounds the part of a sleep that holds the scheduler's
// processor (waitBriefly): the longest a garbage collection may wait for a
// sleeper to stop.
const briefWait = 2 * time.Millisecond

// A Seq is a sequence word that signallers bump and waiters sleep on, with
// the count of its sleepers beside it so that a signal with nobody asleep
// costs no system call. It is safe for concurrent use by any number of
// signallers and sleepers, in any processes.
type Seq struct {
	Word    *uint32 // bumped by every Signal
	Waiters *uint32 // how many are asleep on Word, or about to be
	// Mine, when not nil, counts the sleepers among Waiters that one
	// party armed (a stream reader, in its slot), so that another can take
	// them back once that party died (TakeBack; Note [a dead party's
	// sleepers]).
	Mine *uint32
}

// Note [a dead party's sleepers]: a process killed while asleep on a word
// never takes its sleeper back, and every signal after that makes a
// system call for nobody. Where the sleepers belong to a party whose
// death another process sees (a stream reader, which the writer evicts or
// a new reader takes the slot of), the party counts its own (Seq.Mine)
// and the other takes them back (TakeBack). An arm adds one to Waiters and
// then to Mine, and a disarm takes one from Mine, when Mine has one, and
// then from Waiters: a process killed between the two leaves one too many
// in Waiters (a wasted wake-up), never one too few (a lost one), and a
// disarm that finds Mine taken back leaves Waiters alone, since TakeBack
// took its sleeper from it.

// count counts a sleeper, and uncount takes back n, of those still in
// Mine when there is one and never below zero: a count forged in Mine (or
// a TakeBack of one) may have taken this party's sleepers from Waiters
// already, and Waiters must not wrap round (every signal would then make
// a system call). Both are the data plane's steps (package plane); a
// fault on their memory panics as a Go access to it would, for the
// caller's fault.Catch.
func (s Seq) count() { fault.Must(plane.CountSleeper(s.Waiters, s.Mine)) }

func (s Seq) uncount(n uint32) { fault.Must(plane.UncountSleepers(s.Waiters, s.Mine, n)) }

// TakeBack takes the sleepers that mine counts out of waiters, for a
// party that died armed (Note [a dead party's sleepers]). It takes no more
// than waiters holds: a forged count cannot make it wrap round.
func TakeBack(waiters, mine *uint32) { fault.Must(plane.TakeBackSleepers(waiters, mine)) }

// Load returns the sequence word's value, to be passed to Sleep once the
// caller has found it must wait.
func (s Seq) Load() uint32 { return atomic.LoadUint32(s.Word) }

// Sleep waits for the word to move from seen, as the policy p says. It
// looks for p.Spin first (an event that comes within it costs no wake-up),
// then sleeps for at most
// recheck, and not past deadline (none when zero). It returns nil when the
// word moved or the sleep ended early (callers re-check their condition:
// a bounded sleep makes up for a wake-up lost with a killed process),
// ErrTimeout once deadline has passed, and ErrInterrupted when a signal
// arrived and interruptible is set (otherwise a signal is a spurious wake).
func (s Seq) Sleep(seen uint32, p Policy, deadline time.Time, recheck time.Duration, interruptible bool) error {
	if p.Pace != nil && !p.Poll {
		start := time.Now()
		defer func() { p.Pace.Observe(time.Since(start)) }()
		p.Spin = p.Pace.Spin(p.Spin)
	}
	if p.Poll {
		// Polling for ever still returns every recheck, so that the caller
		// looks again as it would after a sleep.
		limit := p.Spin
		if limit < 0 || limit > recheck {
			limit = recheck
		}
		if moved, err := s.poll(seen, limit, deadline); moved || err != nil || p.Spin < 0 {
			return err
		}
	} else if s.spin(seen, p.Spin) {
		return nil
	}
	timeout := recheck
	if !deadline.IsZero() {
		left := time.Until(deadline)
		if left <= 0 {
			return ErrTimeout
		}
		timeout = min(timeout, left)
	}
	s.count()
	// The first part of the sleep holds on to the scheduler's processor
	// (waitBriefly), so that an event that comes soon wakes the waiter in
	// one futex wake-up; the rest lets the processor go.
	brief := min(timeout, briefWait)
	err := waitBriefly(s.Word, seen, brief)
	if errors.Is(err, ErrInterrupted) {
		// Most likely the Go runtime's own preemption signal, which a
		// raw wait receives: a spurious wake-up. (A host's signal is seen
		// when its wait slice ends.)
		err = nil
	}
	if errors.Is(err, ErrTimeout) && timeout > brief && atomic.LoadUint32(s.Word) == seen {
		err = Wait(s.Word, seen, timeout-brief)
	}
	s.uncount(1)
	switch {
	case errors.Is(err, ErrTimeout):
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return ErrTimeout
		}
		return nil
	case errors.Is(err, ErrInterrupted) && !interruptible:
		return nil
	}
	return err
}

// poll looks at the word without yielding, for spin or until deadline: it
// reports whether the word moved, and ErrTimeout at the deadline.
func (s Seq) poll(seen uint32, spin time.Duration, deadline time.Time) (bool, error) {
	if !deadline.IsZero() {
		left := time.Until(deadline)
		if left <= 0 {
			return false, ErrTimeout
		}
		spin = min(spin, left)
	}
	if plane.Poll(s.Word, seen, spin) { // the data plane's poll, the C ABI's too
		return true, nil
	}
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		return false, ErrTimeout
	}
	return false, nil
}

// spin looks at the word for spin, yielding the CPU between looks after
// the first few (the data plane's step, package plane); it reports whether
// the word moved, or its memory faulted (the caller's next look meets it).
func (s Seq) spin(seen uint32, spin time.Duration) bool {
	return plane.Spin(s.Word, seen, spin)
}

// Note [sleeping outside Go]. A thread that sleeps in a system call made
// by Go code wakes the runtime's monitor thread (sysmon) as it enters the
// call; the monitor then looks every 20 us, then less and less often, until
// it takes the thread's processor away some 10 ms later, and sleeps again:
// about 60 wake-ups for each sleep. A host that returns every 50 ms to
// look for Ctrl-C, and calls in again, pays them twenty times a second
// (measured: a Python process blocked in get() woke 1,300 times a second).
// So a host that waits long sleeps in C, outside the Go runtime (zct_sleep
// of the C ABI): it arms the word here (Arm: it counts among the sleepers,
// so that Signal wakes it), sleeps on the value Arm returned, for as long
// as it likes and in as many slices, and disarms (Disarm) once it is done.
// The sleep itself is the futex call alone: the kernel compares the word,
// so it reads no memory that closing a handle may have unmapped meanwhile.
//
// Threat model: Arm and Disarm are called through a handle, under its
// guard; an unbalanced Disarm would make Signal skip a sleeper, so callers
// count what they armed (see Armed) and refuse a Disarm with nothing armed.
// A forged or stale word address given to the sleep makes the futex call
// fail (EFAULT) or sleep on some other word until its timeout: it never
// faults, and never writes.

// Arm counts a sleeper that is about to sleep on the word outside this
// package (Note [sleeping outside Go]) and returns the value it sleeps on:
// the caller looks at its condition after Arm, and sleeps only if it still
// must wait.
func (s Seq) Arm() uint32 {
	s.count()
	return s.Load()
}

// Disarm takes back one Arm, once its sleeper is awake.
func (s Seq) Disarm() { s.uncount(1) }

// Armed counts the Arms of one handle on up to four words that it has not
// taken back: Close gives them up (Release), so that a host thread still
// asleep when its handle closes leaves no sleeper counted. It is safe for
// concurrent use.
type Armed struct{ n [4]atomic.Int32 }

// Arm arms s as word i of the handle. The handle counts the arm once the
// word counts its sleeper: a Disarm on another goroutine, which may take
// any of the handle's arms, never takes back one half counted (Note [an
// arm is the handle's once counted] in go/capi/fast.c).
func (a *Armed) Arm(i int, s Seq) uint32 {
	seen := s.Arm()
	a.n[i].Add(1)
	return seen
}

// Disarm takes back an Arm of word i, and reports false when there was
// none to take back.
func (a *Armed) Disarm(i int, s Seq) bool {
	for {
		n := a.n[i].Load()
		if n <= 0 {
			return false
		}
		if a.n[i].CompareAndSwap(n, n-1) {
			s.Disarm()
			return true
		}
	}
}

// Release takes back every Arm of word i still counted, when the handle
// closes (after its calls in flight ended).
func (a *Armed) Release(i int, s Seq) {
	if n := a.n[i].Swap(0); n > 0 {
		s.uncount(uint32(n))
	}
}

// Signal bumps the word and wakes up to n of its sleepers: the data
// plane's step (package plane), which every signaller uses. It fails only
// when the word's memory faulted (a shrunk file).
func (s Seq) Signal(n int) error { return plane.Signal(s.Word, s.Waiters, n) }
