"""Attacks on how blocked calls wait (Note [sleeping outside Go] in
zctipc._core.wait): many waiters, closes while they sleep or are about to,
waiters killed, stopped or interrupted while armed, timeouts at their
edges, the readiness thread against consumers and producers.

Nothing here asserts a timing: wake-ups and events are counted, and hangs
are caught by timeouts far above what the behaviour needs."""

import os
import select
import subprocess
import sys
import threading
import time

import pytest
from conftest import with_pythonpath

import zctipc

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.path.dirname(HERE), "python")
ENV = {**os.environ, "PYTHONPATH": with_pythonpath(PACKAGE)}

# Far above anything the behaviour needs: only a hang reaches it.
HANG = 60


def _settle(condition, timeout=HANG):
    """Wait until condition() holds; False if it never did."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


# -- the readiness thread -------------------------------------------------------------------


def _readable(q):
    import multiprocessing.connection

    return bool(multiprocessing.connection.wait([q._reader], timeout=0))


def test_the_readiness_thread_follows_the_queue_while_it_is_open():
    """The thread that keeps the descriptor readable lives as long as the
    queue is open, and the descriptor follows the queue both ways."""
    q = zctipc.Queue()
    try:
        q._reader.fileno()
        for i in range(20):
            q.put(i)
            assert _settle(lambda: _readable(q))
            assert q.get(timeout=HANG) == i
            assert _settle(lambda: not _readable(q)), "readable on an empty queue"
        assert q._ready.thread.is_alive()
    finally:
        q.close()
    assert _settle(lambda: not q._ready.thread.is_alive())
    # As a pipe whose writer closed: whoever still watches it looks, and
    # finds the queue closed.
    assert select.select([q._ready.read_fd], [], [], 0)[0]


_EXIT_WITH_WAITABLE_QUEUES = """
import pytest

import zctipc
queues = [zctipc.Queue() for _ in range(100)]
for q in queues:
    q._reader.fileno()
for q in queues:
    q.close()
"""


def test_readiness_threads_leave_no_error_at_exit():
    """A process that closes waitable queues and exits at once: their
    threads, still ending, never write to a pipe closed at exit (a closed
    descriptor, or one another file took meanwhile)."""
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", _EXIT_WITH_WAITABLE_QUEUES], env=ENV, capture_output=True, text=True, timeout=HANG
        )
        assert done.returncode == 0, done.stderr
        assert "Exception in thread" not in done.stderr, done.stderr


# -- a close while a waiter sleeps, or is about to ----------------------------------------------


class _CloseBetweenSlices:
    """Stands for the time module of zctipc._core.wait: the first reading
    of the clock after a slice of sleep closes the queue and makes new
    queues, as another thread may do just then; their mappings take the
    closed queue's address (the next mapping of the same size does)."""

    def __init__(self, q):
        self.q, self.slices, self.made = q, 0, []

    def monotonic(self):
        self.slices += 1
        if self.slices == 3:  # the deadline, the brief wait, then after the first slice
            self.q.close()
            self.made = [zctipc.Queue(max_bytes=4096) for _ in range(3)]
        return time.monotonic()


def test_a_close_between_two_slices_of_a_sleep_ends_the_get(monkeypatch):
    from zctipc._core import wait

    q = zctipc.Queue(max_bytes=4096)  # never used: the word holds 0, as a new queue's does
    clock = _CloseBetweenSlices(q)
    monkeypatch.setattr(wait, "time", clock)
    outcome = []

    def get():
        try:
            outcome.append(q.get())
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=get, daemon=True)
    t.start()
    t.join(HANG)
    try:
        assert not t.is_alive(), "the get slept on for ever on another queue's word"
        assert isinstance(outcome[0], zctipc.HandleClosed), outcome
    finally:
        for other in clock.made:
            other.put("wake")  # the hung get, if any, sleeps on one of these
        t.join(HANG)
        for other in clock.made:
            other.close()


# -- a wake-up meant for one sleeper, taken by a waiter that takes nothing ----------------------


def _raw_futex_wait(address, seen):
    """FUTEX_WAIT on a shared word without a timeout: a host's sleeper
    that only a wake-up ends (zct_sleep looks again every second)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    sys_futex = 202 if os.uname().machine == "x86_64" else 98
    libc.syscall(
        ctypes.c_long(sys_futex), ctypes.c_void_p(address), ctypes.c_int(0), ctypes.c_uint32(seen), None, None, 0
    )


def _asleep(tid):
    with open(f"/proc/self/task/{tid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


def _raw_sleeper(q, which, ready, woke):
    """Arm q's word which, tell ready, sleep on it until a wake-up, then set
    woke and disarm."""
    from zctipc._core import native

    ffi, lib = native.ffi(), native.lib()
    word, seen = ffi.new("uint32_t **"), ffi.new("uint32_t *")
    native.check(lib.zct_queue_arm(q._handle, which, word, seen))
    ready.append(threading.get_native_id())
    _raw_futex_wait(int(ffi.cast("uintptr_t", word[0])), seen[0])
    woke.set()
    lib.zct_queue_disarm(q._handle, which, 0)


def test_a_poll_woken_by_a_put_passes_the_wake_up_to_a_consumer():
    """_poll waits for a message without taking it. A put into an empty
    queue wakes one sleeper; when that is the poll, asleep before the
    consumer, the consumer is woken in its place."""
    for _ in range(5):
        _poll_then_consume()


def _poll_then_consume():
    from zctipc._core import native

    q = zctipc.Queue()
    try:
        polled = []
        poller = threading.Thread(target=lambda: polled.append(q._poll(None)), daemon=True)
        poller.start()
        time.sleep(0.2)  # past its brief wait in the library: asleep in a slice
        ready, woke = [], threading.Event()
        consumer = threading.Thread(target=_raw_sleeper, args=(q, native.lib().ZCT_WAIT_DATA, ready, woke), daemon=True)
        consumer.start()
        assert _settle(lambda: ready and _asleep(ready[0]))
        q.put("m")
        poller.join(HANG)
        assert polled == [True]
        assert woke.wait(HANG), "the wake-up went to the poll, and no consumer was woken"
        assert q.get(timeout=HANG) == "m"
    finally:
        q.close()


# -- every blocked call sleeps outside the library --------------------------------------------

_BLOCKED_CHILD = """
import sys, zctipc
kind = sys.argv[1]
if kind == "put":
    q = zctipc.Queue(1)
    q.put(0)
    print("ready", flush=True)
    q.put(1)
elif kind == "put-bytes":
    q = zctipc.Queue(max_bytes=4096)
    q.put(b"x" * 3000)
    print("ready", flush=True)
    q.put(b"y" * 3000)
elif kind == "join":
    q = zctipc.JoinableQueue()
    q.put(0)
    q.get()
    print("ready", flush=True)
    q.join()
elif kind == "stream-writer":
    s = zctipc.Stream.create(shape=16, frames=2, policy="block")
    r, w = s.reader(), s.writer()  # a reader that reads nothing
    import numpy as np
    w.write(np.zeros(16, "float32"))
    w.write(np.ones(16, "float32"))
    print("ready", flush=True)
    w.write(np.ones(16, "float32"))
elif kind == "poll":
    q = zctipc.Queue()
    print("ready", flush=True)
    q._poll(None)
"""


@pytest.mark.parametrize("kind", ["put", "put-bytes", "join", "stream-writer", "poll"])
def test_a_blocked_call_does_not_wake(kind):
    """A put blocked on a full queue, a join blocked on an unfinished
    message and a stream writer waiting for room wake their process as
    rarely as a blocked get does (within the bound of test_waiting.py's
    idle test), not ~1,300 times a second."""
    from test_waiting import IDLE_WAKEUPS_PER_SECOND, _switches

    child = subprocess.Popen([sys.executable, "-c", _BLOCKED_CHILD, kind], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert child.stdout.readline() == "ready\n"
        time.sleep(0.5)  # past the first spin and brief wait
        before, start = _switches(child.pid), time.monotonic()
        time.sleep(2)
        rate = (_switches(child.pid) - before) / (time.monotonic() - start)
        assert child.poll() is None, "the call returned"
        assert rate < IDLE_WAKEUPS_PER_SECOND, f"{rate:.0f} wake-ups a second while blocked"
    finally:
        child.kill()
        child.wait()


_STUCK_READER = """
import sys, time, zctipc
s = zctipc.Stream.attach(sys.argv[1])
r = s.reader()
print("ready", flush=True)
time.sleep(600)
"""


def test_a_writer_asleep_for_room_evicts_a_reader_killed_meanwhile():
    """The writer sleeps outside the library while a reader of another
    process holds it back; the reader is killed (it wakes nobody): the
    writer's looks now and then evict it, and the write goes through."""
    import numpy as np

    s = zctipc.Stream.create(shape=16, frames=2, policy="block")
    w = s.writer()
    child = subprocess.Popen([sys.executable, "-c", _STUCK_READER, s.name], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert child.stdout.readline() == "ready\n"
        w.write(np.zeros(16, "float32"))
        w.write(np.zeros(16, "float32"))
        threading.Timer(0.5, child.kill).start()  # while the writer sleeps
        assert w.write(np.ones(16, "float32"), timeout=HANG)
    finally:
        child.kill()
        child.wait()
        w.close()
        s.close()


def test_a_writer_asleep_for_room_evicts_a_stale_reader():
    import numpy as np

    s = zctipc.Stream.create(shape=16, frames=2, policy="block", reader_timeout=0.3)
    r, w = s.reader(), s.writer()
    try:
        w.write(np.zeros(16, "float32"))
        w.write(np.zeros(16, "float32"))
        assert w.write(np.ones(16, "float32"), timeout=HANG)
    finally:
        r.close()
        w.close()
        s.close()
