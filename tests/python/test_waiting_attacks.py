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


# -- timeouts at their edges ------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [0, 1e-9, 0.001])
def test_a_short_timeout_on_an_empty_queue_raises_empty(timeout):
    import queue

    q = zctipc.Queue(1)
    try:
        with pytest.raises(queue.Empty):
            q.get(timeout=timeout)
        q.put(0)
        with pytest.raises(queue.Full):
            q.put(1, timeout=timeout)
    finally:
        q.close()


@pytest.mark.parametrize("timeout", [float("nan"), -1.0, -1e-9, float("-inf")])
def test_a_timeout_that_is_no_number_of_seconds_is_refused(timeout):
    q = zctipc.Queue(1)
    try:
        with pytest.raises(ValueError):
            q.get(timeout=timeout)
        q.put(0)
        with pytest.raises(ValueError):
            q.put(1, timeout=timeout)
    finally:
        q.close()


@pytest.mark.parametrize("timeout", [float("inf"), 1e300, None])
def test_a_long_timeout_waits_for_a_late_put_and_a_late_get(timeout):
    q = zctipc.Queue(1)
    try:
        threading.Timer(0.2, q.put, ("late",)).start()
        assert q.get(timeout=timeout) == "late"
        q.put("first")
        threading.Timer(0.2, q.get).start()
        q.put("second", timeout=timeout)  # waits for the timer's get
        assert q.get(timeout=HANG) == "second"
    finally:
        q.close()


# -- many waiters, and closes while they sleep ------------------------------------------------


def test_a_hundred_threads_blocked_on_one_queue_each_get_one_message():
    q = zctipc.Queue()
    n, got = 100, []
    threads = [threading.Thread(target=lambda: got.append(q.get(timeout=HANG)), daemon=True) for _ in range(n)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.3)  # most are asleep outside the library by now
        for i in range(n):
            q.put(i)
        for t in threads:
            t.join(HANG)
        assert sorted(got) == list(range(n))
    finally:
        q.close()


@pytest.mark.parametrize("call", ["get", "put", "join", "poll"])
def test_a_close_wakes_a_hundred_blocked_threads(call):
    q = zctipc.JoinableQueue(1)
    if call in ("put", "join"):
        q.put(0)
    outcome = []

    def block():
        try:
            {"get": q.get, "put": lambda: q.put(1), "join": q.join, "poll": lambda: q._poll(None)}[call]()
            outcome.append("returned")
        except zctipc.HandleClosed:
            outcome.append("closed")
        except BaseException as e:
            outcome.append(e)

    threads = [threading.Thread(target=block, daemon=True) for _ in range(100)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    q.close()
    for t in threads:
        t.join(HANG)
    assert not any(t.is_alive() for t in threads)
    assert outcome == ["closed"] * 100, outcome


# -- waiters killed, stopped, interrupted -----------------------------------------------------

_CONSUMER = """
import sys, zctipc
q = zctipc.Queue.attach(sys.argv[1])
print("ready", flush=True)
q.get()
"""


def _consumers(q, n):
    procs = [
        subprocess.Popen([sys.executable, "-c", _CONSUMER, q.name], stdout=subprocess.PIPE, text=True, env=ENV)
        for _ in range(n)
    ]
    for p in procs:
        assert p.stdout.readline() == "ready\n"
    time.sleep(0.3)  # asleep outside the library, armed
    return procs


def test_consumers_killed_while_armed_leave_no_wake_up_missing():
    """Consumers SIGKILLed while armed leave their count on the word (only
    a costlier put); the others still get every message."""
    import signal

    q = zctipc.Queue()
    procs = _consumers(q, 4)
    try:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        for i in range(50):
            threading.Timer(0.01, q.put, (i,)).start()
            assert q.get(timeout=HANG) == i
    finally:
        q.close()


def test_a_stopped_consumer_does_not_keep_a_message_from_the_others():
    """A put wakes one sleeper, which may be a stopped process: the
    others see the message all the same."""
    import signal

    q = zctipc.Queue()
    procs = _consumers(q, 3)
    try:
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        got = []
        t = threading.Thread(target=lambda: got.append(q.get(timeout=HANG)), daemon=True)
        t.start()
        time.sleep(0.3)
        for i in range(5):
            q.put(i)
            assert _settle(lambda: len(got) == 1)
            got.pop()
            if i < 4:
                t = threading.Thread(target=lambda: got.append(q.get(timeout=HANG)), daemon=True)
                t.start()
                time.sleep(0.1)
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        q.close()


@pytest.mark.parametrize("call", ["get", "put", "read", "write"])
def test_ctrl_c_interrupts_a_call_asleep_outside_the_library(call):
    import signal

    child_code = """
import sys, numpy as np, zctipc
call = sys.argv[1]
q = zctipc.JoinableQueue(1)
s = zctipc.Stream.create(shape=4, frames=2, policy="block")
r, w = s.reader(), s.writer()
if call == "put":
    q.put(0)
if call == "write":
    w.write(np.zeros(4, "float32"))
    w.write(np.zeros(4, "float32"))
print("ready", flush=True)
try:
    {"get": q.get, "put": lambda: q.put(1), "read": r.read, "write": lambda: w.write(np.zeros(4, "float32"))}[call]()
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""
    child = subprocess.Popen([sys.executable, "-c", child_code, call], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert child.stdout.readline() == "ready\n"
        time.sleep(0.5)  # asleep outside the library
        child.send_signal(signal.SIGINT)
        assert child.stdout.readline() == "interrupted\n"
        assert child.wait(HANG) == 0
    finally:
        child.kill()
        child.wait()


# -- get_async in several event loops ---------------------------------------------------------


def test_get_async_in_several_event_loops_of_several_threads():
    import asyncio

    q = zctipc.Queue()
    loops, per_loop, got = 4, 5, []

    def run():
        async def main():
            return await asyncio.wait_for(asyncio.gather(*(q.get_async() for _ in range(per_loop))), HANG)

        got.extend(asyncio.run(main()))

    threads = [threading.Thread(target=run) for _ in range(loops)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.3)
        for i in range(loops * per_loop):
            q.put(i)
        for t in threads:
            t.join(HANG)
        assert sorted(got) == list(range(loops * per_loop))
    finally:
        q.close()


def test_a_storm_of_cancellations_leaves_the_survivors_waiting():
    import asyncio

    q = zctipc.Queue()

    async def main():
        for _ in range(20):
            tasks = [asyncio.ensure_future(q.get_async()) for _ in range(20)]
            await asyncio.sleep(0)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        survivors = [asyncio.ensure_future(q.get_async()) for _ in range(3)]
        await asyncio.sleep(0.05)
        for i in range(3):
            q.put(i)
        return await asyncio.wait_for(asyncio.gather(*survivors), HANG)

    try:
        assert sorted(asyncio.run(main())) == [0, 1, 2]
        assert not q._async_waiting
    finally:
        q.close()


# -- a stream reader waiting while the writer dies --------------------------------------------

_DYING_WRITER = """
import sys, time, numpy as np, zctipc
s = zctipc.Stream.attach(sys.argv[1])
w = s.writer()
w.write(np.full(4, 1, "float32"))
print("ready", flush=True)
time.sleep(600)
"""


def test_a_reader_waiting_while_the_writer_dies_gets_the_next_writers_frames():
    import numpy as np

    s = zctipc.Stream.create(shape=4, frames=4)
    r = s.reader()
    child = subprocess.Popen([sys.executable, "-c", _DYING_WRITER, s.name], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert child.stdout.readline() == "ready\n"
        assert r.read(timeout=HANG)[0] == 1
        got = []
        t = threading.Thread(target=lambda: got.append(r.read(timeout=HANG)), daemon=True)
        t.start()
        time.sleep(0.3)  # the reader sleeps outside the library
        child.kill()
        child.wait()
        w = s.writer()  # takes over the role of the dead writer
        w.write(np.full(4, 2, "float32"))
        t.join(HANG)
        assert got and got[0][0] == 2
        w.close()
    finally:
        child.kill()
        child.wait()
        r.close()
        s.close()


def test_the_readiness_thread_never_keeps_a_blocked_producer_asleep():
    """The readiness thread of a queue that holds messages sleeps on the
    space word beside blocked producers, and a get wakes only one of them:
    when it wakes the thread, the producer's sleep still ends (its next
    slice finds the word moved) and its put goes through, every time."""
    q = zctipc.Queue(1)
    try:
        q._reader.fileno()
        q.put(-1)
        for i in range(20):
            t = threading.Thread(target=q.put, args=(i,), daemon=True)
            t.start()
            time.sleep(0.06)  # the producer and the thread both asleep on the word
            q.get(timeout=HANG)
            t.join(HANG)
            assert not t.is_alive(), "a get left the blocked producer asleep"
    finally:
        q.close()
