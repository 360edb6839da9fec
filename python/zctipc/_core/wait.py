"""Waiting: every blocking call waits in the library in slices, so that
Python runs its signal handlers (Ctrl-C) in between, and honours block and
timeout as multiprocessing does."""

from __future__ import annotations

import math
import time

from . import args, native

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# Longest single wait inside the library, so that Ctrl-C is seen in time.
WAIT_SLICE = 0.05

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


def wait_slices(block: bool, timeout: float | None) -> Iterator[int]:
    """Yield how long each native wait may last (in ms) until the deadline:
    0 once when not blocking; slices of WAIT_SLICE otherwise. Raises
    TypeError or ValueError for a bad timeout."""
    if not block:
        yield 0
        return
    timeout = args.timeout(timeout)
    if timeout is None:
        while True:
            yield int(WAIT_SLICE * 1000)
    # Slices until the deadline, however early a wait returned (a signal
    # ends one at once), and one last try at it.
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            yield 0
            return
        yield math.ceil(min(left, WAIT_SLICE) * 1000)


def retry(call: Callable[[int], int], again: int, block: bool = True, timeout: float | None = None) -> int:
    """The status of call(ms), a native call that waits up to ms, called
    again in wait slices while it returns again (the status of a wait that
    timed out: nothing yet) or was interrupted by a signal, until block and
    timeout say to stop. The caller checks what it returns."""
    status = again
    for ms in wait_slices(block, timeout):
        status = call(ms)
        if status != again and status != native.E_INTERRUPTED:
            return status
    return again
