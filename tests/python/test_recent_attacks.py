"""Attacks on a blocking get's first wait inside the library (Note [a get's
first wait] in zctipc.queues) and on programs that import zctipc in any
order, or start processes at module level without a main guard."""

import contextlib
import os
import queue as _queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from conftest import HERE, SWEEP_TIMEOUT, slots_in_use, with_pythonpath

import zctipc
from zctipc import queues
from zctipc._core import native, wait

HANG = 5.0  # longer than any of these waits may take


class Raised(Exception):
    pass


def _raise(*_):
    raise Raised


@contextlib.contextmanager
def alarms(handler):
    """SIGALRM handled by handler within; after, no timer is left armed
    and the handler before is back."""
    old = signal.signal(signal.SIGALRM, handler)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def blocked_get(q, out, **kw):
    """A thread that runs q.get() and puts into out what came of it."""

    def run():
        try:
            out.append(("got", q.get(**kw)))
        except BaseException as e:  # noqa: BLE001 - what the get raised is the outcome
            out.append(("raised", e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# -- signals during the first wait ------------------------------------------


def test_a_raising_handler_during_the_first_wait_ends_the_get_and_loses_nothing():
    """A SIGALRM handler that raises, run while a get waits inside the
    library for the first time, ends the get with its exception; no message
    was taken by it, and the messages put after come out once each, in order."""
    q = zctipc.Queue()
    with alarms(_raise), contextlib.closing(q):
        for i in range(20):
            # Within the first wait (up to BRIEF_MS), at a different point each time.
            start = time.monotonic()
            with pytest.raises(Raised):
                signal.setitimer(signal.ITIMER_REAL, random.uniform(0.00005, wait.BRIEF_MS / 1000))
                q.get()
            assert time.monotonic() - start < HANG
            signal.setitimer(signal.ITIMER_REAL, 0)
            q.put(i)
            assert q.get() == i
            assert q.empty()


def test_keyboard_interrupt_during_the_first_wait_ends_the_get():
    q = zctipc.Queue()
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for delay in (0.0002, 0.001, 0.0019, 0.05):
            go = threading.Event()

            def fire(delay=delay, go=go):
                go.wait()
                time.sleep(delay)
                os.kill(os.getpid(), signal.SIGINT)

            t = threading.Thread(target=fire)
            t.start()  # started before the get: a signal cannot land in this start
            start = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                go.set()
                q.get()
            t.join()
            assert time.monotonic() - start < HANG
        q.put("after")
        assert q.get() == "after"
    finally:
        signal.signal(signal.SIGINT, old)
        q.close()


def test_a_handler_that_puts_during_the_first_wait_ends_the_get_with_its_message():
    """A handler that puts into the very queue the get waits on: the get
    that the signal interrupted goes on and returns that message, once."""
    q = zctipc.Queue()
    with alarms(lambda *_: q.put("from the handler")), contextlib.closing(q):
        for _ in range(10):
            signal.setitimer(signal.ITIMER_REAL, random.uniform(0.00005, wait.BRIEF_MS / 1000))
            assert q.get() == "from the handler"
            assert q.empty()


def _put_slowly(q, n):
    for i in range(n):
        time.sleep(random.uniform(0, 0.003))
        q.put(i)


def test_signals_that_do_not_raise_lose_no_message_put_from_another_process():
    """Signals every 0.2 ms, whose handler returns, through every wait of
    many gets, while another process puts at random moments (many within
    a first wait): every message comes once, in order."""
    ctx = zctipc.get_context("spawn")
    q = ctx.Queue()
    n = 300
    p = ctx.Process(target=_put_slowly, args=(q, n))
    p.start()
    hits = []
    with alarms(lambda *_: hits.append(1)):
        signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
        got = [q.get() for _ in range(n)]
    p.join(HANG)
    assert p.exitcode == 0
    assert got == list(range(n))
    assert hits
    with pytest.raises(_queue.Empty):
        q.get(timeout=0.01)
    q.close()


# -- close, many getters, stopped getters -------------------------------------


def test_a_close_during_the_first_wait_ends_the_get():
    for _ in range(30):
        q = zctipc.Queue()
        out = []
        t = blocked_get(q, out)
        time.sleep(random.uniform(0, 0.003))  # before, in, or after the first wait
        q.close()
        t.join(HANG)
        assert not t.is_alive(), "a get went on waiting after its queue was closed"
        assert len(out) == 1 and out[0][0] == "raised", out
        assert isinstance(out[0][1], ValueError), out  # HandleClosed


def _get_one(q, results):
    results.put((os.getpid(), q.get()))


def test_more_getters_than_messages_each_message_comes_once():
    """Threads and processes all in their first wait; fewer messages than
    getters come at once: each is got exactly once; then a close ends the
    threads that got none, and the processes that got none are killed."""
    ctx = zctipc.get_context("spawn")
    q, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_get_one, args=(q, results)) for _ in range(3)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # the children are in their gets (at least some are)
    outs = [[] for _ in range(6)]
    threads = [blocked_get(q, out) for out in outs]
    n = 5  # fewer than the 9 getters
    for i in range(n):
        q.put(i)
    from_procs = []

    def from_threads():
        return [v for out in outs for kind, v in out if kind == "got"]

    deadline = time.monotonic() + HANG
    while len(from_threads()) + len(from_procs) < n and time.monotonic() < deadline:
        try:
            from_procs.append(results.get(timeout=0.01)[1])
        except _queue.Empty:
            pass
    assert sorted(from_threads() + from_procs) == list(range(n)), (from_threads(), from_procs)
    q.close()
    for t in threads:
        t.join(HANG)
        assert not t.is_alive()
    assert all(len(out) == 1 and out[0][0] in ("got", "raised") for out in outs), outs
    for p in procs:
        if p.exitcode is None:
            p.kill()
        p.join(HANG)
    while True:
        try:
            from_procs.append(results.get(timeout=0.05)[1])
        except _queue.Empty:
            break
    # Each message exactly once in all, none twice, none after the close.
    assert sorted(from_threads() + from_procs) == list(range(n)), (from_threads(), from_procs)
    results.close()


def test_a_stopped_getter_delays_no_other_getter_for_long():
    """A getter process stopped (SIGSTOP) while it waits may be the one a
    put wakes; a getter of this process still gets the message soon, and
    the stopped one, continued, gets the next."""
    ctx = zctipc.get_context("spawn")
    q, results = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_get_one, args=(q, results))
    p.start()
    try:
        time.sleep(0.5)  # the child waits in its get
        os.kill(p.pid, signal.SIGSTOP)
        out = []
        t = blocked_get(q, out)
        time.sleep(0.01)
        start = time.monotonic()
        q.put("first")
        t.join(HANG)
        assert out == [("got", "first")]
        assert time.monotonic() - start < 2.0
        os.kill(p.pid, signal.SIGCONT)
        q.put("second")
        assert results.get(timeout=HANG) == (p.pid, "second")
        p.join(HANG)
        assert p.exitcode == 0
    finally:
        if p.exitcode is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.join()
        q.close()
        results.close()


def _hold_many(q, ready, n):
    held = [q.get() for _ in range(n)]  # every one in its first wait, or soon after
    ready.put(len(held))
    time.sleep(3600)


def test_a_killed_getter_holding_more_counts_than_its_first_ledger_entries():
    """A getter takes 150 pool buffers (more than the 64 entries its ledger
    reserves at first: it grows) and is SIGKILLed: the daemon gives each
    count back exactly once, so that this process's own buffer keeps its
    count and every other buffer goes back."""
    mine = zctipc.empty((40000,), dtype="float64")  # a pool buffer this process keeps
    mine[:] = 7
    base = slots_in_use()
    ctx = zctipc.get_context("spawn")
    q, ready = ctx.Queue(), ctx.Queue()
    n = 150
    p = ctx.Process(target=_hold_many, args=(q, ready, n))
    p.start()
    try:
        for i in range(n):
            q.put(np.full(40000, i, dtype="float64"))  # past the inline size: a pool buffer each
        assert ready.get(timeout=60) == n
        assert zctipc.pool_stats().slots_in_use == base + n
        os.kill(p.pid, signal.SIGKILL)
        p.join(HANG)
        deadline = time.monotonic() + SWEEP_TIMEOUT
        while zctipc.pool_stats().slots_in_use != base and time.monotonic() < deadline:
            time.sleep(0.02)
        assert zctipc.pool_stats().slots_in_use == base, "the killed getter's counts went back, once each"
        again = zctipc.collect_garbage()
        assert again["ledgers"] == [], "nothing is swept twice"
        assert zctipc.pool_stats().slots_in_use == base
        assert (mine == 7).all()
    finally:
        if p.exitcode is None:
            p.kill()
            p.join()
        q.close()
        ready.close()
    del mine
    assert slots_in_use() == base - 1


# -- a message larger than the scratch, SimpleQueue, JoinableQueue -------------


@pytest.mark.parametrize("size", [70_000, 300_000, 3_000_000])
def test_a_large_message_that_comes_during_the_first_wait(size):
    q = zctipc.Queue()
    try:
        for i in range(10):
            big = bytes([i]) * size
            out = []
            t = blocked_get(q, out)
            time.sleep(random.uniform(0, 0.003))
            q.put(big)
            t.join(HANG)
            assert out == [("got", big)]
        assert q.empty()
    finally:
        q.close()


def test_a_simple_queues_get_after_a_signal_in_its_first_wait():
    q = zctipc.SimpleQueue()
    with alarms(_raise), contextlib.closing(q):
        with pytest.raises(Raised):
            signal.setitimer(signal.ITIMER_REAL, 0.0005)
            q.get()
        signal.signal(signal.SIGALRM, lambda *_: None)
        signal.setitimer(signal.ITIMER_REAL, 0.0003, 0.0003)
        threading.Timer(0.05, q.put, args=("x",)).start()
        assert q.get() == "x"


def test_a_joinable_queues_count_through_interrupted_first_waits():
    q = zctipc.JoinableQueue()
    with alarms(_raise), contextlib.closing(q):
        for _ in range(5):
            with pytest.raises(Raised):
                signal.setitimer(signal.ITIMER_REAL, 0.0005)
                q.get()
        signal.setitimer(signal.ITIMER_REAL, 0)
        q.put(1)
        q.put(2)
        assert q.get() == 1
        q.task_done()
        assert q.get() == 2
        q.task_done()
        done = threading.Thread(target=q.join, daemon=True)
        done.start()
        done.join(HANG)
        assert not done.is_alive(), "join waits though every message was done"
        with pytest.raises(ValueError):
            q.task_done()


# -- which first calls wait ---------------------------------------------------


def _record_takes(monkeypatch, timeouts):
    """Record the timeout of every zct_queue_take that queues make from now
    on: a get's first, through zctipc.queues' bound call, and those after
    it, through native.lib()."""
    lib = native.lib()

    def take(h, buf, cap, ms, *rest):
        timeouts.append(ms)
        return lib.zct_queue_take(h, buf, cap, ms, *rest)

    class Recording:
        def __getattr__(self, name):
            return take if name == "zct_queue_take" else getattr(lib, name)

    monkeypatch.setattr(queues, "_queue_take", take)
    monkeypatch.setattr(native, "lib", Recording)


@pytest.mark.parametrize(
    "make, kw, waits",
    [
        (lambda: zctipc.Queue(), {}, True),
        (lambda: zctipc.Queue(wait="poll", spin=0.001), {}, False),
        (lambda: zctipc.Queue(), {"timeout": 1.0}, False),
        (lambda: zctipc.Queue(), {"block": False}, False),
        (lambda: zctipc.SimpleQueue(), {}, True),
        (lambda: zctipc.JoinableQueue(), {}, True),
    ],
)
def test_only_a_get_without_timeout_or_polling_waits_in_its_first_call(monkeypatch, make, kw, waits):
    q = make()
    try:
        q.put("m")
        timeouts = []
        _record_takes(monkeypatch, timeouts)
        assert q.get(**kw) == "m"
        assert timeouts[0] == (wait.BRIEF_MS if waits else 0)
        if kw.get("block", True):
            # Empty: what the first call and the ones after it wait.
            threading.Timer(0.05, q.put, args=("n",)).start()
            if isinstance(q, zctipc.Queue) and not waits and "timeout" not in kw:  # a polling queue
                assert q.get() == "n"
            else:
                assert q.get(**kw) == "n"
    finally:
        monkeypatch.undo()
        q.close()


def test_set_wait_poll_makes_the_first_call_only_look(monkeypatch):
    q = zctipc.Queue()
    try:
        q.set_wait("poll", 0.001)
        q.put("m")
        timeouts = []
        _record_takes(monkeypatch, timeouts)
        assert q.get() == "m"
        monkeypatch.undo()
        assert timeouts == [0]
        q.set_wait("sleep")
        q.put("m")
        _record_takes(monkeypatch, timeouts)
        assert q.get() == "m"
        assert timeouts == [0, wait.BRIEF_MS]
    finally:
        monkeypatch.undo()
        q.close()


# -- import order, and programs without a main guard -----------------------------


def emptied(directory, timeout=10.0):
    """What is left in directory once the daemon had timeout seconds to sweep."""
    deadline = time.monotonic() + timeout
    while (left := sorted(os.listdir(directory))) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _run(env, code, timeout=60):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "first, method",
    [
        ("import zctipc, numpy, multiprocessing", "forkserver"),
        ("import numpy, multiprocessing; import zctipc", "forkserver"),
        ("import multiprocessing; multiprocessing.set_start_method('spawn'); import zctipc", "spawn"),
        ("import torch.multiprocessing as tmp; tmp.set_start_method('spawn'); import torch; import zctipc", "spawn"),
        ("import zctipc; import torch.multiprocessing as tmp; tmp.set_start_method('spawn'); import torch", "spawn"),
    ],
)
def test_import_order(isolated, first, method):
    """Whatever came first, a queue carries arrays (and tensors, once torch
    is imported), the start method is the one chosen, and nothing is left."""
    r = _run(
        isolated,
        f"""
        {first}
        import sys
        import numpy as np, zctipc, multiprocessing as mp
        q = zctipc.Queue()
        q.put(np.arange(5))
        assert (q.get() == np.arange(5)).all()
        if "torch" in sys.modules:
            import torch
            q.put(torch.arange(4))
            assert q.get().tolist() == [0, 1, 2, 3]
        q.close()
        print(mp.get_start_method())
        """,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == method
    assert emptied(isolated["ZCTIPC_SHM_DIR"]) == []


NO_GUARD = """\
import multiprocessing as mp
import sys
{choose}
import zctipc


def work(q):
    q.put("from the child")


q = zctipc.Queue()
p = mp.Process(target=work, args=(q,))
p.start()
p.join(20)
print("exitcode", p.exitcode, flush=True)
try:
    print("got", q.get(timeout=1), flush=True)
except Exception as e:
    print("no message:", type(e).__name__, flush=True)
q.close()
"""


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver", None])
def test_a_script_without_a_main_guard(isolated, tmp_path, method):
    """A script that makes a queue and starts a process at module level,
    with no main guard, run as a file. Under fork the child cannot use the
    library and says so (ForkedProcessError); under spawn and forkserver
    (and the default, which is forkserver) the child re-runs the module
    and multiprocessing refuses the start there, with its own clear error.
    None of them hangs, and none leaves a file in /dev/shm."""
    choose = f"mp.set_start_method({method!r})" if method else ""
    script = tmp_path / "noguard.py"
    script.write_text(NO_GUARD.format(choose=choose))
    env = dict(isolated, PYTHONPATH=with_pythonpath(HERE, str(tmp_path)), ZCTIPC_NO_START_METHOD_WARNING="1")
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "no message: Empty" in r.stdout, (r.stdout, r.stderr)
    assert "exitcode 1" in r.stdout, (r.stdout, r.stderr)
    if method == "fork":
        assert "ForkedProcessError" in r.stderr, r.stderr
    else:
        assert "RuntimeError" in r.stderr, r.stderr
    assert emptied(isolated["ZCTIPC_SHM_DIR"]) == []
