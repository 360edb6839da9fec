"""Waiting: every blocking call waits in the library in slices, so that
Python runs its signal handlers (Ctrl-C) in between, and honours block and
timeout as multiprocessing does.

Note [sleeping outside Go]: a thread that sleeps inside the library's Go
runtime wakes the runtime's monitor thread some sixty times per sleep, so a
waiter that came back every slice woke its process over a thousand times a
second. So a call whose wait can be armed (sleep_outside) waits inside the
library only briefly (the paced spin and a short sleep, which catch what
comes soon), then arms the wait, looks once more, and sleeps in zct_sleep
(plain C) slice after slice, calling the library again only once woken.
The Go side is Note [sleeping outside Go] in go/internal/futex."""

from __future__ import annotations

import math
import threading
import time

from . import args, native

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# Longest single wait inside the library, so that Ctrl-C is seen in time.
WAIT_SLICE = 0.05

#: Slices of a sleep outside the library after which a waiter looks again
#: although nothing woke it: about a second, as the library's own waits
#: recheck (Note [a lock holder that died wakes nobody]).
RECHECK_SLICES = round(1 / WAIT_SLICE)

# Note [a lock holder that died wakes nobody]: a get or put that finds the
# queue's lock held by another process says "empty" or "full" when it does
# not wait, and the waiter sleeps on the data or space word. The holder
# wakes the sleepers when it lets the lock go; a holder killed first (or
# stopped in the lock and killed later) never does, and the word may never
# move again (a queue whose producers all wait, or whose messages were all
# put). Only a call that meets the lock takes it over from a dead holder,
# so a waiter looks again every RECHECK_SLICES slices, woken or not, as
# the library's own waits do every second (package queue's recheckEvery).

#: How long a call that can sleep outside the library first waits inside it
#: (ms): its paced spin and a short sleep, for what comes soon.
BRIEF_MS = 2

#: The wait policies of queues and stream endpoints: "sleep" spins briefly
#: (yielding the CPU between looks) and then sleeps on a futex, which costs
#: no CPU while nothing comes; "poll" looks without yielding and never
#: sleeps (or, with spin, for that long), which takes a core while waiting
#: and sees a message within a microsecond.
POLICIES = ("sleep", "poll")


def policy(wait: str, spin: float | None) -> tuple[bool, int]:
    """(poll flag, spin in ns) for the library's set_wait calls from a wait
    policy name and a spin in seconds (None: the policy's default, which
    the library says: for "sleep" 50 us, stretched up to 200 us while waits
    are short; for ever for "poll")."""
    if wait not in POLICIES:
        raise ValueError(f"wait must be one of {', '.join(map(repr, POLICIES))}, not {wait!r}")
    return wait == "poll", -1 if spin is None else int(args.timeout(spin, "spin") * 1e9)


class Armed(threading.local):
    """Per-thread out-parameters of the calls that arm a wait (zct_queue_arm,
    zct_stream_reader_arm, zct_stream_writer_arm): the word to sleep on, and
    the value it was seen to hold."""

    def __init__(self) -> None:
        ffi = native.ffi()
        self.word = ffi.new("uint32_t **")
        self.seen = ffi.new("uint32_t *")


def retry(call: Callable[[int], int], again: int, block: bool = True, timeout: float | None = None) -> int:
    """The status of call(ms), a native call that waits up to ms, called
    again in wait slices while it returns again (the status of a wait that
    timed out: nothing yet) or was interrupted by a signal, until block and
    timeout say to stop: 0 once when not blocking; slices of WAIT_SLICE
    until the deadline otherwise, however early a wait returned (a signal
    ends one at once), and one last try at it. The caller checks what it
    returns; a bad timeout raises TypeError or ValueError.

    Plain loops, not a generator of slices: what follows a wait's end is a
    waiter's latency, and closing a generator there cost a microsecond."""
    interrupted = native.E_INTERRUPTED
    if not block:
        status = call(0)
        return again if status == interrupted else status
    timeout = args.timeout(timeout)
    if timeout is None:
        ms = int(WAIT_SLICE * 1000)
        while True:
            status = call(ms)
            if status != again and status != interrupted:
                return status
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        status = call(0 if left <= 0 else math.ceil(min(left, WAIT_SLICE) * 1000))
        if status != again and status != interrupted:
            return status
        if left <= 0:
            return again


def sleep_outside(
    call: Callable[[int], int],
    again: int,
    block: bool,
    timeout: float | None,
    arm: Callable[[], tuple[Any, int]],
    disarm: Callable[[bool], object],
    closed: Callable[[], bool],
    look_every: int = 0,
) -> int:
    """retry, for a call whose wait can be armed (Note [sleeping outside
    Go]): call(ms) waits at most BRIEF_MS inside the library; then arm()
    counts this thread among the word's sleepers and returns (word, seen)
    (or raises), call(0) looks once more, and zct_sleep sleeps on the word
    in slices of WAIT_SLICE until it moves or the timeout passes;
    disarm(woken) takes the arm back, woken saying whether a wake-up (or
    a move of the word) ended the sleep. An infinite timeout is no timeout.

    closed() says, without calling the library, whether the handle was
    closed (Note [a sleep across a close]). look_every: after that many
    slices in a row that their timeout ended, look again all the same,
    still armed (0: never), for a call whose look does more than read the
    word (a stream writer's evicts readers that died)."""
    if not block:
        return call(0)
    timeout = args.timeout(timeout)
    deadline = math.inf if timeout is None else time.monotonic() + timeout

    def left_ms() -> int:
        left = deadline - time.monotonic()
        return 0 if left <= 0 else math.ceil(min(left, WAIT_SLICE) * 1000)

    status = call(min(BRIEF_MS, left_ms()))
    sleep = native.lib().zct_sleep
    interrupted, empty = native.E_INTERRUPTED, native.E_EMPTY
    while status == again or status == interrupted:
        ms = left_ms()
        if ms == 0:
            return again
        word, seen = arm()
        woken = False
        try:
            status = call(0)
            slices = 0
            while status == again:
                # Signal handlers run between these calls (Ctrl-C).
                slept = sleep(word, seen, ms)
                slices += 1
                if slept != empty and slept != interrupted or closed():
                    # Woken, or the word moved (or went with a close): look.
                    woken = slept != empty and slept != interrupted
                    status = call(0)
                    break
                if slices == look_every:
                    # Look, still armed: a look that finds nothing does
                    # not cost an arm and a disarm.
                    slices = 0
                    status = call(0)
                    if status != again:
                        break
                ms = left_ms()
                if ms == 0:
                    return again
        finally:
            disarm(woken)
    return status


# Note [a sleep across a close]: closing a handle wakes its sleepers and
# lets its mapping go, and the next mapping the process makes (another
# queue, say) often lands at the same address. A thread that was between
# two slices of its sleep when the handle closed (or between its arm and
# its first slice) then sleeps on a word of that other mapping, which may
# hold the very value it sleeps on (a fresh queue's 0): no wake-up of the
# closed queue reaches it, and, since a slice that ends at its timeout
# sleeps again on the same word, a wait without a timeout never ended. So
# after every slice that its timeout ended, the sleeper asks closed(),
# which reads its object's state in Python (no call into the library, so
# no cost while idle), and looks (a call that answers "closed") once it is.
