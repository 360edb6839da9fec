"""Objects shared between threads of one process: queues, pools, shared
tensors, streams and events, used at once from several threads with very
short switch intervals, and closed while other threads wait on them."""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import slots_in_use

import zctipc

HERE = os.path.dirname(os.path.abspath(__file__))
SECONDS = float(os.environ.get("ZCTIPC_THREAD_SECONDS", "3"))


@pytest.fixture
def switchy():
    """Switch threads as often as CPython allows: races show at once."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def run_threads(fn, n):
    """Run fn(i) in n threads; re-raise the first exception one raised."""
    errors = []

    def wrap(i):
        try:
            fn(i)
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a thread hung"
    if errors:
        raise errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("interval", [1e-6, 1e-4])
def test_queue_shared_by_producer_and_consumer_threads(interval):
    # In a child process: a crash there is a failed exit, not a dead run.
    out = subprocess.run(
        [sys.executable, "-X", "faulthandler", os.path.join(HERE, "_threads.py"), str(interval), str(SECONDS)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-3000:]}"
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["sent"] > 1000
    assert report["taken"] == report["sent"], "every message taken"
    assert report["duplicates"] == 0 and report["corrupt"] == [] and report["left"] == 0


def started(fn, raised):
    """A thread running fn, which appends what fn raises to raised."""

    def run():
        try:
            fn()
        except BaseException as exc:  # what the thread saw, for the test
            raised.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_close_wakes_a_thread_blocked_in_get():
    q = zctipc.Queue()
    got = []
    t = started(q.get, got)
    time.sleep(0.2)
    start = time.monotonic()
    q.close()
    t.join(5)
    assert not t.is_alive(), "get() still waits on a closed queue"
    assert time.monotonic() - start < 2
    assert len(got) == 1 and isinstance(got[0], zctipc.HandleClosed), got
    assert isinstance(got[0], ValueError), "HandleClosed is a ValueError, as multiprocessing raises"
    with pytest.raises(zctipc.HandleClosed):
        q.put(1)
    with pytest.raises(zctipc.HandleClosed):
        q.qsize()


@pytest.mark.slow
def test_close_wakes_threads_blocked_on_a_stream():
    s = zctipc.Stream.create(shape=4, dtype="int64", frames=2, readers=2)
    w = s.writer()
    r = s.reader()
    slow = s.reader()
    errors = []

    def write():
        for i in range(10):  # the slow reader never reads: the third write waits
            w.write(np.full(4, i))

    threads = [started(r.read, errors)]
    time.sleep(0.2)
    r.close()  # wakes the reader; its slot is free again
    threads.append(started(write, errors))
    time.sleep(0.3)
    w.close()
    for t in threads:
        t.join(5)
        assert not t.is_alive(), "a stream call still waits on a closed endpoint"
    assert len(errors) == 2 and all(isinstance(e, zctipc.HandleClosed) for e in errors), errors
    slow.close()
    s.close()


@pytest.mark.slow
def test_stream_endpoints_shared_by_threads(switchy):
    # Two threads write through one writer and three read through one
    # reader: each frame is written whole, published once and read once.
    frames = 2000
    s = zctipc.Stream.create(shape=256, dtype="int64", frames=8, readers=2)
    w = s.writer()
    shared = s.reader()
    own = s.reader()
    got, own_got = [], []

    def write(i):
        for n in range(i, frames, 2):
            assert w.write(np.full(256, n, dtype=np.int64), timeout=30)

    def read(_):
        while True:
            try:
                f = shared.read(timeout=1)
            except zctipc.StreamEnded:
                return
            if f is not None:
                assert (f == f[0]).all(), "a torn frame"
                got.append(int(f[0]))

    def read_all():
        for f in own:
            assert (f == f[0]).all()
            own_got.append(int(f[0]))

    reader_threads = [threading.Thread(target=run_threads, args=(read, 3)), threading.Thread(target=read_all)]
    for t in reader_threads:
        t.start()
    run_threads(write, 2)
    s.end()
    for t in reader_threads:
        t.join(60)
    assert sorted(got) == list(range(frames)), "each frame to exactly one of the threads sharing a reader"
    assert sorted(own_got) == list(range(frames)), "a reader of its own sees every frame"
    for e in (w, shared, own, s):
        e.close()


def test_events_pools_and_tensors_from_many_threads(switchy):
    e = zctipc.Event()
    woken = []

    def wait(_):
        woken.append(e.wait(30))

    waiters = threading.Thread(target=run_threads, args=(wait, 6))
    waiters.start()
    time.sleep(0.1)
    e.set()
    waiters.join(30)
    assert woken == [True] * 6

    def toggle(i):
        for _ in range(500):
            e.set() if i % 2 else e.clear()
            e.is_set()

    run_threads(toggle, 4)

    before = slots_in_use()
    t = zctipc.create_shared_tensor(data=np.arange(1000, dtype=np.float64))

    def use(i):
        for n in range(200):
            a = zctipc.empty((64, n % 5 + 1), "float32")
            a[:] = i
            assert (a == i).all()
            b = zctipc.share(np.full(100, n))
            assert zctipc.is_shared(b) and b[99] == n
            v = t.numpy()
            assert v[999] == 999.0 and t.refcount >= 1
            del a, b, v

    run_threads(use, 4)
    assert zctipc.pool_stats().slots_in_use == before, "every buffer went back"
    # A tensor closed by one thread while others ask it things: each call
    # works or raises HandleClosed.
    closer = threading.Thread(target=t.close)
    errors = []

    def repr_loop():
        for _ in range(200):
            try:
                repr(t)
                _ = t.refcount
                t.numpy()
            except zctipc.HandleClosed:
                return
            except BaseException as exc:  # anything else is a failure
                errors.append(exc)
                return

    loops = [threading.Thread(target=repr_loop) for _ in range(3)]
    for th in loops:
        th.start()
    closer.start()
    for th in [closer, *loops]:
        th.join(30)
    assert errors == []
