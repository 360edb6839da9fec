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
from _procs import closed_while_blocked
from _procs import settle as _settle
from conftest import with_pythonpath

import zctipc

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.path.dirname(HERE), "python")
ENV = {**os.environ, "PYTHONPATH": with_pythonpath(PACKAGE)}

# Far above anything the behaviour needs: only a hang reaches it.
HANG = 60


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
    from test_waiting import assert_waits_quietly

    child = subprocess.Popen([sys.executable, "-c", _BLOCKED_CHILD, kind], stdout=subprocess.PIPE, text=True, env=ENV)
    assert_waits_quietly(child, "blocked")


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


@pytest.mark.parametrize("call", ["get", "get with a timeout", "put", "join", "poll"])
def test_a_close_wakes_a_hundred_blocked_threads(call):
    q = zctipc.JoinableQueue(1)
    if call in ("put", "join"):
        q.put(0)
    run = {
        "get": q.get,
        "get with a timeout": lambda: q.get(timeout=HANG),
        "put": lambda: q.put(1),
        "join": q.join,
        "poll": lambda: q._poll(None),
    }[call]
    outcome, alive = closed_while_blocked(run, q.close, 100, HANG)
    assert not alive
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


# -- blocked put, join and stream write under attack ------------------------------------------

_CHAOS_CONSUMER = """
import sys, zctipc
q = zctipc.Queue.attach(sys.argv[1])
print("ready", flush=True)
while q.get() is not None:
    pass
"""


def _spawn(code, *argv):
    p = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, text=True, env=ENV)
    assert p.stdout.readline() == "ready\n"
    return p


def test_a_blocked_put_goes_through_while_consumers_are_killed_and_stopped():
    """Producers (two threads) block on a full bounded queue while
    consumers of other processes take from it and are SIGKILLed (in the
    middle of a get, or asleep in one) and SIGSTOPped at random, and
    replaced: one consumer is always running, and every put goes through.

    A consumer stopped in the few instructions of a get that hold the get
    lock (or, when its get empties the ring, the put lock for a rewind)
    holds that lock until it runs again or dies, as a multiprocessing.Queue
    consumer stopped inside its get holds the queue's read lock: no lock can
    be taken from a live process. So every stopped consumer is, a round
    later, continued (and goes on taking) or killed; the puts must never
    wait for more than that."""
    import random
    import signal

    rng = random.Random(28)
    q = zctipc.Queue(2)
    steady = _spawn(_CHAOS_CONSUMER, q.name)
    others = [_spawn(_CHAOS_CONSUMER, q.name) for _ in range(3)]
    stopped, ended, failures, kills = [], [], [], 0

    rounds, puts = 12, [0, 0]

    def end_stopped():  # stopped a round ago: each runs again, or dies
        nonlocal stopped
        for p in stopped:
            p.send_signal(signal.SIGCONT if rng.random() < 0.5 else signal.SIGKILL)
        ended.extend(stopped)
        stopped = []

    def produce(k):
        try:
            while not done.is_set():
                q.put(puts[k], timeout=HANG)
                puts[k] += 1
        except BaseException as e:
            failures.append(e)

    done = threading.Event()
    producers = [threading.Thread(target=produce, args=(k,), daemon=True) for k in range(2)]
    try:
        for t in producers:
            t.start()
        for _ in range(rounds):
            end_stopped()
            victim = rng.randrange(len(others))
            p = others[victim]
            if rng.random() < 0.5:
                p.send_signal(signal.SIGKILL)
                p.wait()
                kills += 1
            else:
                p.send_signal(signal.SIGSTOP)
                stopped.append(p)
            others[victim] = _spawn(_CHAOS_CONSUMER, q.name)
            time.sleep(rng.random() * 0.02)
        end_stopped()
        done.set()
        for t in producers:
            t.join(HANG)
        assert not failures, failures
        assert not any(t.is_alive() for t in producers)
        assert steady.poll() is None
        assert kills and ended, "the seed killed and stopped consumers"
        assert min(puts) > rounds, puts
    finally:
        for p in [steady, *others, *stopped, *ended]:
            p.kill()
            p.wait()
        q.close()


_TASK_WORKER = """
import sys, zctipc
q = zctipc.JoinableQueue.attach(sys.argv[1])
print("ready", flush=True)
while True:
    x = q.get()
    q.task_done()
    if x is None:
        break
"""

_JOINER = """
import sys, zctipc
q = zctipc.JoinableQueue.attach(sys.argv[1])
print("ready", flush=True)
q.join()
print("joined", flush=True)
"""


def test_join_in_several_processes_ends_when_workers_of_several_processes_are_done():
    """Three processes mark messages done, two others and two threads here
    join: every join returns once the last message is done, and none
    before (a join that returned early would see work undone)."""
    q = zctipc.JoinableQueue(8)
    q.put("first")  # the joins wait for it
    joiners = [_spawn(_JOINER, q.name) for _ in range(2)]
    joined = []
    threads = [threading.Thread(target=lambda: (q.join(), joined.append(1)), daemon=True) for _ in range(2)]
    workers = []
    try:
        for t in threads:
            t.start()
        time.sleep(0.3)  # the joins are asleep
        assert not joined and all(j.poll() is None for j in joiners)
        workers = [_spawn(_TASK_WORKER, q.name) for _ in range(3)]
        for i in range(300):
            q.put(i, timeout=HANG)
        for _ in workers:
            q.put(None, timeout=HANG)
        for w in workers:
            assert w.wait(HANG) == 0
        for t in threads:
            t.join(HANG)
        assert joined == [1, 1]
        for j in joiners:
            assert j.stdout.readline() == "joined\n"
            assert j.wait(HANG) == 0
    finally:
        for p in [*joiners, *workers]:
            p.kill()
            p.wait()
        q.close()


_READER = """
import sys, zctipc
s = zctipc.Stream.attach(sys.argv[1])
r = s.reader()
print("ready", flush=True)
for line in sys.stdin:
    if line == "close\\n":
        r.close()
        print("closed", flush=True)
    elif line == "read\\n":
        r.read()
        print("read", flush=True)
"""


@pytest.mark.parametrize("how", ["stopped-stale", "closed-in-its-process", "closed-by-another-thread", "ended"])
def test_a_writer_asleep_for_room_goes_on_when_its_slowest_reader_goes(how):
    """A writer under policy="block" sleeps outside the library behind a
    reader that stops (and is evicted as stale), that leaves the stream
    (in another process, or from another thread of this one), or the
    stream ends: the write goes through or raises StreamEnded, never
    hangs."""
    import signal

    import numpy as np

    s = zctipc.Stream.create(shape=16, frames=2, policy="block", reader_timeout=0.3 if how == "stopped-stale" else None)
    w = s.writer()
    here = s.reader() if how in ("closed-by-another-thread", "ended") else None
    child = None
    if how in ("stopped-stale", "closed-in-its-process"):
        child = subprocess.Popen(
            [sys.executable, "-c", _READER, s.name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV
        )
        assert child.stdout.readline() == "ready\n"
    try:
        w.write(np.zeros(16, "float32"))
        w.write(np.zeros(16, "float32"))

        def act():
            if how == "stopped-stale":
                child.send_signal(signal.SIGSTOP)
            elif how == "closed-in-its-process":
                child.stdin.write("close\n")
                child.stdin.flush()
            elif how == "closed-by-another-thread":
                here.close()
            else:
                s.end()

        threading.Timer(0.3, act).start()  # while the writer sleeps
        if how == "ended":
            with pytest.raises(zctipc.StreamEnded):
                w.write(np.ones(16, "float32"), timeout=HANG)
        else:
            assert w.write(np.ones(16, "float32"), timeout=HANG)
    finally:
        if child is not None:
            child.kill()
            child.wait()
        if here is not None:
            here.close()
        w.close()
        s.close()


@pytest.mark.parametrize("call", ["put_many", "write", "look"])
def test_a_close_from_another_thread_ends_a_sleeping_call(call):
    """close() of the queue or the stream writer from another thread ends
    a put_many or a write (or a look) asleep for room with HandleClosed."""
    import numpy as np

    q = zctipc.Queue(2)
    s = zctipc.Stream.create(shape=4, frames=2, policy="block")
    r, w = s.reader(), s.writer()
    try:
        q.put(0)
        q.put(1)
        w.write(np.zeros(4, "float32"))
        w.write(np.zeros(4, "float32"))
        run = {
            "put_many": lambda: q.put_many(range(5)),
            "write": lambda: w.write(np.zeros(4, "float32")),
            "look": w.look,
        }[call]
        # Asleep outside the library by the close.
        outcome, alive = closed_while_blocked(run, q.close if call == "put_many" else w.close, 1, HANG)
        assert not alive, f"{call} still sleeps after the close"
        assert outcome == ["closed"], outcome
    finally:
        q.close()
        r.close()
        w.close()
        s.close()


@pytest.mark.parametrize("timeout", [0, 1e-9, 0.001])
def test_a_short_timeout_on_a_full_stream_or_a_put_many_gives_up(timeout):
    """A write or look with no room, and a put_many into a full queue,
    with a timeout of 0 or next to it, return False / None or raise
    queue.Full (having put what fitted), and leave everything usable."""
    import queue

    import numpy as np

    q = zctipc.Queue(2)
    s = zctipc.Stream.create(shape=4, frames=2, policy="block")
    r, w = s.reader(), s.writer()
    try:
        q.put(0)
        with pytest.raises(queue.Full):
            q.put_many([1, 2, 3], timeout=timeout)
        assert q.get(timeout=HANG) == 0 and q.get(timeout=HANG) == 1
        w.write(np.zeros(4, "float32"))
        w.write(np.zeros(4, "float32"))
        assert w.write(np.ones(4, "float32"), timeout=timeout) is False
        assert w.look(timeout=timeout) is None
        r.read()
        assert w.write(np.ones(4, "float32"), timeout=timeout)
    finally:
        q.close()
        r.close()
        w.close()
        s.close()


def test_put_many_waits_for_room_and_keeps_the_order():
    """put_many of more than fits sleeps for room, run after run, while a
    consumer takes slowly; every message arrives once, in order."""
    q = zctipc.Queue(3)
    got = []

    def consume():
        for _ in range(200):
            got.append(q.get(timeout=HANG))
            if len(got) % 20 == 0:
                time.sleep(0.02)

    t = threading.Thread(target=consume, daemon=True)
    try:
        t.start()
        q.put_many(range(100), timeout=HANG)
        q.put_many([b"x" * 10, *range(100, 199)], timeout=HANG)
        t.join(HANG)
        assert got == [*range(100), b"x" * 10, *range(100, 199)]
    finally:
        q.close()


_BLOCKED_CALL = """
import sys, numpy as np, zctipc
call = sys.argv[1]
q = zctipc.JoinableQueue(1)
s = zctipc.Stream.create(shape=4, frames=2, policy="block")
r, w = s.reader(), s.writer()
q.put(0)
w.write(np.zeros(4, "float32"))
w.write(np.zeros(4, "float32"))
print("ready", flush=True)
try:
    {
        "join": q.join,
        "put_many": lambda: q.put_many(range(3)),
        "put-bytes": lambda: q.put(b"x"),
        "look": w.look,
        "poll": lambda: zctipc.JoinableQueue(1)._poll(None),
    }[call]()
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


@pytest.mark.parametrize("call", ["join", "put_many", "put-bytes", "look", "poll"])
def test_ctrl_c_interrupts_every_other_blocked_call(call):
    import signal

    child = subprocess.Popen([sys.executable, "-c", _BLOCKED_CALL, call], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert child.stdout.readline() == "ready\n"
        time.sleep(0.5)  # asleep outside the library
        child.send_signal(signal.SIGINT)
        assert child.stdout.readline() == "interrupted\n"
        assert child.wait(HANG) == 0
    finally:
        child.kill()
        child.wait()


def test_fifty_blocked_producers_are_released_by_one_get_each():
    """Fifty threads block on a full queue of one message; each get frees
    room for one of them: every put goes through (no wake-up lost for
    good). How long each get waited for the next put is printed (run with
    -s), not asserted."""
    q = zctipc.Queue(1)
    n, failures = 50, []
    q.put("first")

    def produce(i):
        try:
            q.put(i, timeout=HANG)
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(n)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.5)  # all asleep outside the library
        assert q.get(timeout=HANG) == "first"
        got, delays = [], []
        for _ in range(n):
            start = time.monotonic()
            got.append(q.get(timeout=HANG))
            delays.append(time.monotonic() - start)
        for t in threads:
            t.join(HANG)
        assert not failures, failures
        assert sorted(got) == list(range(n))
        delays.sort()
        print(
            f"\nget after get, waiting for the next put: median {delays[n // 2] * 1e3:.2f} ms, "
            f"worst {delays[-1] * 1e3:.2f} ms"
        )
    finally:
        q.close()


_PRODUCER = """
import sys, zctipc
q = zctipc.Queue.attach(sys.argv[1])
print("ready", flush=True)
q.put("theirs")
print("put", flush=True)
"""


def test_a_wake_up_for_room_taken_by_a_stopped_or_killed_producer_is_not_lost():
    """Producers of other processes sleep for room beside one here; the
    others are SIGSTOPped or SIGKILLed while armed, so the wake-up of a
    get may go to one that cannot use it: the producer here still puts,
    and a stopped one puts once continued."""
    import signal

    q = zctipc.Queue(1)
    q.put("first")
    procs = [_spawn(_PRODUCER, q.name) for _ in range(4)]
    mine = []
    t = threading.Thread(target=lambda: (q.put("mine", timeout=HANG), mine.append(1)), daemon=True)
    try:
        t.start()
        time.sleep(0.5)  # every producer asleep outside the library
        for p in procs[:2]:
            p.send_signal(signal.SIGSTOP)
        for p in procs[2:]:
            p.send_signal(signal.SIGKILL)
            p.wait()
        assert q.get(timeout=HANG) == "first"
        assert q.get(timeout=HANG) == "mine"
        t.join(HANG)
        assert mine == [1]
        for p in procs[:2]:
            p.send_signal(signal.SIGCONT)
        assert [q.get(timeout=HANG), q.get(timeout=HANG)] == ["theirs", "theirs"]
        for p in procs[:2]:
            assert p.stdout.readline() == "put\n"
            assert p.wait(HANG) == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()
        q.close()
