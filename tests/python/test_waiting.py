"""How blocked calls wait: they wake when they should (several awaiting
coroutines, close, an infinite timeout under load), stay asleep when they
should not (an idle waiter costs no wake-ups, a readiness descriptor is not
readable on an empty queue), and a stream reader that waits is alive.

Nothing here asserts a timing: wake-ups are counted (context switches of
every thread of the waiting process), and hangs are caught by timeouts far
above what the behaviour needs."""

import asyncio
import multiprocessing.connection
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import with_pythonpath

import zctipc

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.path.dirname(HERE), "python")

# -- wake-ups of an idle waiter -----------------------------------------------------------

# Allowed wake-ups a second of a whole process whose one thread is blocked:
# Ctrl-C is seen within 100 ms (~10-20 a second), and the Go runtime's own
# threads wake now and then; a spinning or polling waiter wakes thousands
# of times.
IDLE_WAKEUPS_PER_SECOND = 100


def _switches(pid):
    """Voluntary context switches of every thread of pid, summed: one for
    each time a thread that woke blocked again. (A thread preempted while
    it runs, which a loaded machine does often, switches involuntarily:
    those say nothing of how often it woke.)"""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except FileNotFoundError:  # a thread that ended
            pass
    return total


def _cpu_seconds(pid):
    """User and system CPU time of pid, all its threads, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_IDLE_CHILD = """
import sys, zctipc
kind = sys.argv[1]
if kind.startswith("queue"):
    q = zctipc.Queue()
    q.put(1); q.get()
    print("ready", flush=True)
    q.get(timeout=float("inf") if kind == "queue-inf" else None)
elif kind == "stream":
    s = zctipc.Stream.create(shape=16, frames=4)
    r = s.reader()
    print("ready", flush=True)
    r.read()
elif kind == "readiness":
    queues = [zctipc.Queue() for _ in range(50)]
    for q in queues:
        q._reader.fileno()
        q.put(1); q.get()
    print("ready", flush=True)
    import multiprocessing.connection
    multiprocessing.connection.wait([q._reader for q in queues])
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["queue", "queue-inf", "stream", "readiness"])
def test_an_idle_waiter_does_not_wake(kind):
    child = subprocess.Popen(
        [sys.executable, "-c", _IDLE_CHILD, kind],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": with_pythonpath(PACKAGE)},
    )
    assert_waits_quietly(child, "waiting")


def assert_waits_quietly(child, what):
    """child, once it printed "ready", stays blocked, wakes less than
    IDLE_WAKEUPS_PER_SECOND and takes under a tenth of a core over two
    seconds; it is killed afterwards."""
    try:
        assert child.stdout.readline() == "ready\n"
        time.sleep(0.5)  # past the first spin and brief wait
        before, cpu, start = _switches(child.pid), _cpu_seconds(child.pid), time.monotonic()
        time.sleep(2)
        elapsed = time.monotonic() - start
        rate = (_switches(child.pid) - before) / elapsed
        busy = (_cpu_seconds(child.pid) - cpu) / elapsed
        assert child.poll() is None, f"the call returned while {what}"
        assert rate < IDLE_WAKEUPS_PER_SECOND, f"{rate:.0f} wake-ups a second while {what}"
        assert busy < 0.1, f"{busy:.0%} of a core while {what}"
    finally:
        child.kill()
        child.wait()


# -- readiness descriptors and get_async ----------------------------------------------------


@pytest.mark.slow
def test_readiness_is_not_left_readable_after_another_consumer_took_the_message():
    q = zctipc.Queue()
    other = zctipc.Queue.attach(q.name)  # another consumer, as another process would be
    try:
        q.put("m")
        assert multiprocessing.connection.wait([q._reader], timeout=30) == [q._reader]
        assert other.get(timeout=30) == "m"
        # The queue is empty: the descriptor soon stops being readable, and
        # waiting on it then blocks, as on a drained pipe.
        deadline = time.monotonic() + 30
        while multiprocessing.connection.wait([q._reader], timeout=0) and time.monotonic() < deadline:
            time.sleep(0.001)
        returned, deadline = 0, time.monotonic() + 1
        while time.monotonic() < deadline:
            returned += len(multiprocessing.connection.wait([q._reader], timeout=0.2))
        assert returned == 0, f"wait() returned {returned} times on an empty queue"
        q.put("n")
        assert multiprocessing.connection.wait([q._reader], timeout=30) == [q._reader]
        assert q.get(timeout=30) == "n"
    finally:
        other.close()
        q.close()


def test_readiness_shows_a_message_put_after_a_get_emptied_the_queue(monkeypatch):
    """The readiness thread shows the queue's state; meanwhile a get takes
    the last message (and drains the descriptor) and a put brings another.
    The descriptor must become readable: a ProcessPoolExecutor waiting on
    it hung with its results in the queue (Note [showing after arming] in
    zctipc._pipes)."""
    from zctipc import _pipes

    q = zctipc.SimpleQueue()
    taken = []
    show = _pipes.Readiness.show

    def show_then_race(self, readable):
        show(self, readable)
        # Only this queue's thread races: the readiness threads of other
        # queues still alive in this process show through the same method.
        if readable and not taken and self.handle == q._handle:
            taken.append(q.get())  # empties the queue: the descriptor is drained
            q.put("b")

    monkeypatch.setattr(_pipes.Readiness, "show", show_then_race)
    try:
        q.put("a")
        q._reader.fileno()  # the thread starts
        deadline = time.monotonic() + 30
        while not taken and time.monotonic() < deadline:
            time.sleep(0.001)
        assert taken == ["a"]
        assert multiprocessing.connection.wait([q._reader], timeout=30) == [q._reader], "b is in the queue"
        assert q.get() == "b"
    finally:
        q.close()


@pytest.mark.slow
def test_readiness_shows_a_put_that_follows_a_get_which_emptied_the_queue():
    """A producer thread puts as fast as it can while a consumer waits on
    the descriptor and gets: the descriptor always becomes readable while
    messages are there. (The readiness thread could arm the space word
    just after a get emptied the queue, the get's rearm drain the pipe, and
    a put come before the thread looked again: it slept with the pipe
    drained and messages in the queue, and the consumer waited for ever;
    Note [showing after arming] in zctipc._pipes.)"""
    q = zctipc.SimpleQueue()
    stop = threading.Event()

    def produce():
        i = 0
        while not stop.is_set():
            q.put(i)
            i += 1
            if i % 2 == 0:
                time.sleep(0)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    try:
        got, deadline = 0, time.monotonic() + 5
        while time.monotonic() < deadline:
            if multiprocessing.connection.wait([q._reader], timeout=10):
                q.get()
                got += 1
            else:
                assert q.empty(), f"the descriptor stayed unreadable with {q.qsize()} messages, after {got} gets"
        assert got > 100
    finally:
        stop.set()
        t.join(30)
        q.close()


def test_every_awaiting_coroutine_gets_a_message():
    q = zctipc.Queue()
    n = 20

    async def main():
        waiters = [asyncio.ensure_future(q.get_async()) for _ in range(n)]
        await asyncio.sleep(0.1)  # all of them wait
        for i in range(n):
            q.put(i)
        return await asyncio.wait_for(asyncio.gather(*waiters), 60)

    try:
        assert sorted(asyncio.run(main())) == list(range(n))
    finally:
        q.close()


def test_a_cancelled_coroutine_leaves_the_others_waiting():
    q = zctipc.Queue()

    async def main():
        a, b = asyncio.ensure_future(q.get_async()), asyncio.ensure_future(q.get_async())
        await asyncio.sleep(0.05)
        a.cancel()
        await asyncio.sleep(0.05)
        q.put("for b")
        return await asyncio.wait_for(b, 60)

    try:
        assert asyncio.run(main()) == "for b"
    finally:
        q.close()


def test_close_ends_get_async():
    q = zctipc.Queue()

    async def main():
        waiters = [asyncio.ensure_future(q.get_async()) for _ in range(3)]
        await asyncio.sleep(0.1)
        q.close()
        return await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 60)

    results = asyncio.run(main())
    assert all(isinstance(r, zctipc.HandleClosed) for r in results), results


def test_close_of_a_waitable_queue_ends_its_thread_at_once():
    before = set(threading.enumerate())
    queues = [zctipc.Queue() for _ in range(20)]
    for q in queues:
        q._reader.fileno()
    threads = [t for t in threading.enumerate() if t not in before and t.name.startswith("zctipc readiness")]
    assert len(threads) == len(queues)
    for q in queues:
        q.close()
    # Each thread ends when woken by its close: well within one recheck
    # (a thread that waited out its sleep would take a second each).
    for t in threads:
        t.join(0.5)
    assert not any(t.is_alive() for t in threads)


# -- an infinite timeout ---------------------------------------------------------------------

_PAIR = """
import sys, time, zctipc
q = zctipc.Queue.attach(sys.argv[2])
n = int(sys.argv[3])
if sys.argv[1] == "consume":
    for i in range(n):
        assert q.get(timeout=float("inf")) == i
else:
    for i in range(n):
        time.sleep(0.002 * (i % 5))
        q.put(i)
q.close()
"""


@pytest.mark.slow
def test_gets_with_an_infinite_timeout_all_return_under_load():
    pairs, n = 4, 200
    queues = [zctipc.Queue() for _ in range(pairs)]
    env = {**os.environ, "PYTHONPATH": with_pythonpath(PACKAGE)}
    procs = []
    try:
        for q in queues:
            for role in ("consume", "produce"):
                procs.append(subprocess.Popen([sys.executable, "-c", _PAIR, role, q.name, str(n)], env=env))
        for p in procs:
            assert p.wait(120) == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for q in queues:
            q.close()


@pytest.mark.slow
def test_an_infinite_timeout_waits_in_one_slice_after_another():
    q = zctipc.Queue()
    try:
        threading.Timer(0.3, q.put, ("late",)).start()
        assert q.get(timeout=float("inf")) == "late"
        threading.Timer(0.3, q.put, ("later",)).start()
        assert q.get(timeout=1e300) == "later"
    finally:
        q.close()


# -- a stream reader that waits is alive ------------------------------------------------------


@pytest.mark.slow
def test_a_reader_waiting_for_frames_is_not_evicted():
    s = zctipc.Stream.create(shape=1024, frames=2, policy="block", reader_timeout=0.3)
    w, r = s.writer(), s.reader()
    frame = np.zeros(1024, "float32")
    try:
        got = []

        def read():
            while len(got) < 40:
                a = r.read(timeout=60)
                assert a is not None
                got.append(a[0])

        t = threading.Thread(target=read)
        t.start()
        time.sleep(1)  # the reader waits, seen last more than the reader timeout ago
        for i in range(40):
            frame[0] = i
            assert w.write(frame, timeout=60)
        t.join(60)
        assert got == list(range(40)) and r.dropped == 0
    finally:
        r.close()
        w.close()
        s.close()


# -- a model of the readiness state ---------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_readiness_model(seed):
    """Random puts, gets by this queue object and by another consumer,
    coroutines that await and that are cancelled, against a model: every
    awaiting coroutine that is not cancelled gets a message once one is
    there for it, messages are neither lost nor doubled, and once things
    settle the descriptor is readable exactly when the queue holds a
    message."""
    import random

    rng = random.Random(seed)
    q = zctipc.Queue()
    other = zctipc.Queue.attach(q.name)

    def readable():
        return bool(multiprocessing.connection.wait([q._reader], timeout=0))

    async def settle(pending, timeout=30):
        # Until every awaiting coroutine that can have a message has one,
        # and the descriptor agrees with the queue.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            waiting = [t for t in pending if not t.done()]
            if q.qsize() and waiting:
                continue
            if readable() == (q.qsize() > 0):
                return
        raise AssertionError(f"did not settle: {q.qsize()} queued, readable {readable()}")

    async def main():
        sent, got, pending, finished = 0, [], [], []
        for _ in range(60):
            op = rng.choice(["put", "put", "await", "await", "cancel", "get", "other", "check"])
            if op == "put":
                other.put(sent)
                sent += 1
            elif op == "await":
                pending.append(asyncio.ensure_future(q.get_async()))
            elif op == "cancel" and pending:
                t = pending.pop(rng.randrange(len(pending)))
                t.cancel()  # nothing if it has its message already
                finished.append(t)
            elif op == "get":
                try:
                    got.append(q.get_nowait())
                except Exception:
                    pass
            elif op == "other":
                try:
                    got.append(other.get_nowait())
                except Exception:
                    pass
            else:
                await settle(pending)
            await asyncio.sleep(0)
        await settle(pending)
        await asyncio.sleep(0)  # the cancelled ones end
        for t in pending + finished:
            if t.done() and not t.cancelled():
                got.append(t.result())
        waiting = [t for t in pending if not t.done()]
        while q.qsize():
            got.append(q.get_nowait())
        assert sorted(got) == list(range(sent)), "every message once"
        q.close()
        results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 60)
        assert all(isinstance(r, zctipc.HandleClosed) for r in results), results

    try:
        asyncio.run(main())
    finally:
        other.close()
        q.close()


def test_a_sleep_on_the_word_of_a_closed_queue_never_faults():
    from zctipc._core import native

    ffi, lib = native.ffi(), native.lib()
    q = zctipc.Queue()
    word, seen = ffi.new("uint32_t **"), ffi.new("uint32_t *")
    native.check(lib.zct_queue_arm(q._handle, lib.ZCT_WAIT_DATA, word, seen))
    q.close()  # wakes sleepers, takes the arm back, and lets the mapping go
    assert lib.zct_sleep(word[0], seen[0], 100) in (native.OK, native.E_CLOSED, native.E_EMPTY)
    assert lib.zct_queue_disarm(q._handle, lib.ZCT_WAIT_DATA, 0) == native.E_CLOSED
