"""Attacks on the fast paths of Queue.put and Queue.get: the native calls
bound as zctipc.queues' globals, the one pickling body that finds its
thread's pickler (a fresh one when that one is busy or out of date), a
scratch's ready-made take arguments (rebuilt when it grows), and the one
comparison that finds a plain pickle."""

import os
import queue as stdqueue
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from _procs import forking

import zctipc
from zctipc import queues
from zctipc._wire import pickler

HANG = 60


def _run(code, timeout=HANG):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


# -- a forked child -------------------------------------------------------------


def test_a_queue_in_a_forked_child_raises_forked_process_error_at_once():
    """The bound native calls must not outlive fork: a forked child's Go
    runtime is gone, and a put or get there raised ForkedProcessError before
    they were bound, instead of calling into it (which took the parent's
    message, or may hang)."""
    said = forking("""
        q = zctipc.Queue()
        q.put(1)
        assert q.get() == 1
        q.put("parent's")
        child = in_child(lambda: kinds(lambda: q.put(3), lambda: q.get(timeout=1), lambda: q.get(block=False),
                                       lambda: q.put(b"raw"), lambda: q.get()))
        print(child, q.get(timeout=5), q.qsize())
        q.close()
    """)
    assert said == ["ForkedProcessError," * 4 + "ForkedProcessError", "parent's", "0"]


# -- threads --------------------------------------------------------------------


def _message(k, i):
    """Message i of producer k: small pickles most, some larger than a
    scratch's first 64 KiB, bytes, inline and bare arrays, tuples of arrays."""
    tag = k * 100_000 + i
    match i % 7:
        case 0 | 1 | 2:
            return (tag, "small")
        case 3:
            return (tag, "x" * (70_000 + i))  # past 64 KiB: a scratch grows
        case 4:
            return np.full(8 + i % 5, tag, dtype=np.int64)  # inline
        case 5:
            return (tag, np.full(300_000, tag, dtype=np.int64), [np.arange(3) + tag])  # views
        case _:
            return f"{tag}".encode() * 3


def _check(k, i, got):
    want = _message(k, i)
    if isinstance(want, bytes):
        return got == want
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and got.dtype == want.dtype and np.array_equal(got, want)
    if len(want) == 2:
        return got == want
    return got[0] == want[0] and np.array_equal(got[1], want[1]) and np.array_equal(got[2][0], want[2][0])


def _key(got):
    if isinstance(got, bytes):
        tag = int(got[: len(got) // 3])
    elif isinstance(got, np.ndarray):
        tag = int(got[0])
    else:
        tag = got[0]
    return divmod(tag, 100_000)


@pytest.mark.parametrize("getter", ["get", "get_many", "mixed"])
def test_many_threads_put_and_get_one_queue_and_every_message_arrives_whole_once(getter):
    q = zctipc.Queue()
    producers, per, consumers = 4, 120, 4
    seen, bad, errors = [], [], []
    lock = threading.Lock()

    def produce(k):
        try:
            for i in range(per):
                q.put(_message(k, i))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def consume(c):
        try:
            n = 0
            while True:
                if getter == "get" or getter == "mixed" and n % 2:
                    items = [q.get(timeout=HANG)]
                else:
                    items = q.get_many(1 + c, timeout=HANG)
                n += 1
                stop = False
                for got in items:
                    if got is None:
                        if stop:  # get_many took another consumer's end too: give it back
                            q.put(None)
                        stop = True
                        continue
                    k, i = _key(got)
                    if not _check(k, i, got):
                        bad.append((k, i))
                    with lock:
                        seen.append((k, i))
                if stop:
                    return
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    cs = [threading.Thread(target=consume, args=(c,), daemon=True) for c in range(consumers)]
    ps = [threading.Thread(target=produce, args=(k,), daemon=True) for k in range(producers)]
    for t in cs + ps:
        t.start()
    for t in ps:
        t.join(HANG)
    for _ in cs:
        q.put(None)
    for t in cs:
        t.join(HANG)
    try:
        assert not errors, errors
        assert not any(t.is_alive() for t in cs + ps)
        assert not bad, bad[:5]
        assert sorted(seen) == [(k, i) for k in range(producers) for i in range(per)]
        # Every scratch is the queue's own, its take arguments its own buffer's.
        assert len(q._scratches) >= 1
        assert len({id(s) for s in q._scratches}) == len(q._scratches)
        for s in q._scratches:
            assert s.take_now == (q._handle, s.buf, s.cap, 0, s.views, s.vcap, s.nviews)
            assert s.take_brief[:3] == (q._handle, s.buf, s.cap) and s.take_brief[4:] == (s.views, s.vcap, s.nviews)
    finally:
        q.close()


# -- a scratch that grows -------------------------------------------------------


def test_a_large_message_then_small_ones_take_the_grown_buffer():
    """A get of a record past the 64 KiB scratch grows it; the gets after
    it pass the new buffer and capacity (a stale take tuple would pass the
    old, smaller buffer: the record would not fit, or land in memory no
    longer read)."""
    q = zctipc.Queue()
    try:
        (s,) = q._scratches
        first = s.cap
        big = b"y" * (3 * first)
        q.put((1, big))
        assert q.get(timeout=HANG) == (1, big)
        (s2,) = q._scratches
        assert s2 is s and s.cap > first
        assert s.take_now[1] is s.buf and s.take_now[2] == s.cap
        assert s.take_brief[1] is s.buf and s.take_brief[2] == s.cap
        # Small and large, pickles and not, by get, get_many, with and without waits.
        msgs = [(2, "small"), b"raw", np.arange(5), (3, big + big), (4,), np.zeros(200_000), "z" * 10]
        for m in msgs:
            q.put(m)
        got = [q.get(), q.get(block=False), q.get(timeout=1), q.get()]
        got += q.get_many(2, timeout=1)
        got.append(q.get(timeout=None))
        for g, m in zip(got, msgs, strict=True):
            if isinstance(m, np.ndarray):
                assert np.array_equal(g, m)
            else:
                assert g == m
        # Views past the first 16: the views' array grows too.
        many = [np.full(100_000, i) for i in range(40)]
        q.put(many)
        q.put((5, "after"))
        got = q.get(timeout=HANG)
        assert all(np.array_equal(a, b) for a, b in zip(got, many, strict=True))
        assert s.vcap >= 40 and s.take_now[4] is s.views and s.take_now[5] == s.vcap
        assert q.get(timeout=HANG) == (5, "after")
        del got
    finally:
        q.close()


def test_get_many_after_a_resize_then_get():
    q = zctipc.Queue()
    try:
        big = "b" * 200_000
        for i in range(6):
            q.put((i, big if i % 2 else "s"))
        got = []
        while len(got) < 6:  # a batch may stop before a record that does not fit
            got += q.get_many(6 - len(got), timeout=HANG)
        assert [g[0] for g in got] == list(range(6))
        assert all(g[1] == (big if g[0] % 2 else "s") for g in got)
        q.put((7, "small"))
        q.put((8, big * 2))
        q.put((9, "small"))
        assert q.get(timeout=HANG) == (7, "small")
        assert q.get_many(1, timeout=HANG) == [(8, big * 2)]
        assert q.get() == (9, "small")
    finally:
        q.close()


# -- waits ---------------------------------------------------------------------


@pytest.mark.parametrize("cls", [zctipc.Queue, zctipc.JoinableQueue])
def test_get_without_waiting_and_with_every_timeout_on_empty_and_full(cls):
    q = cls()
    try:
        with pytest.raises(stdqueue.Empty):
            q.get(block=False)
        with pytest.raises(stdqueue.Empty):
            q.get(timeout=0)
        with pytest.raises(stdqueue.Empty):
            q.get(False, None)
        with pytest.raises(stdqueue.Empty):
            q.get_nowait()
        with pytest.raises(stdqueue.Empty):
            q.get(timeout=0.01)
        items = [(1, 2), b"b", np.arange(3), (np.arange(200_000),), "s"]
        calls = [
            lambda: q.get(block=False),
            lambda: q.get(timeout=0),
            lambda: q.get(timeout=None),
            lambda: q.get(True, 1),
            lambda: q.get(False, 5),
        ]
        for item, call in zip(items, calls, strict=True):
            q.put(item)
            got = call()
            if isinstance(item, tuple) and isinstance(item[0], np.ndarray):
                assert np.array_equal(got[0], item[0])
            elif isinstance(item, np.ndarray):
                assert np.array_equal(got, item)
            else:
                assert got == item
            if cls is zctipc.JoinableQueue:
                q.task_done()
        with pytest.raises(stdqueue.Empty):
            q.get(timeout=0)
        if cls is zctipc.JoinableQueue:
            q.join()
    finally:
        q.close()


def test_set_wait_poll_and_back_while_another_thread_is_blocked_in_get():
    q = zctipc.Queue()
    got, started = [], threading.Event()

    def getter():
        started.set()
        for _ in range(4):
            got.append(q.get(timeout=HANG))

    t = threading.Thread(target=getter, daemon=True)
    try:
        t.start()
        assert started.wait(HANG)
        for i, how in enumerate(["poll", "sleep", "poll", "sleep"]):
            q.set_wait(how, spin=0.001)
            threading.Event().wait(0.02)
            q.put((i, how))
        t.join(HANG)
        assert not t.is_alive()
        assert got == [(0, "poll"), (1, "sleep"), (2, "poll"), (3, "sleep")]
        q.set_wait("poll", spin=0.001)
        q.put("p")
        assert q.get() == "p"
        with pytest.raises(stdqueue.Empty):
            q.get(timeout=0.01)
        q.set_wait("sleep")
        q.put("s")
        assert q.get() == "s"
    finally:
        q.close()


def test_simple_queue_takes_the_fast_paths():
    q = zctipc.SimpleQueue()
    try:
        for m in [(1,), b"x", np.arange(4), "y" * 100_000, (np.ones(300_000),)]:
            q.put(m)
            g = q.get()
            if isinstance(m, np.ndarray):
                assert np.array_equal(g, m)
            elif isinstance(m, tuple) and isinstance(m[0], np.ndarray):
                assert np.array_equal(g[0], m[0])
            else:
                assert g == m
        assert q.empty()
    finally:
        q.close()


def test_a_closed_queue_refuses_put_and_get():
    q = zctipc.Queue()
    q.put(1)
    q.close()
    for call in (lambda: q.put(2), lambda: q.get(), lambda: q.get(block=False), lambda: q.put(b"b")):
        with pytest.raises((ValueError, OSError, zctipc.ZctipcError)):
            call()


# -- reentrant pickling ----------------------------------------------------------


class _PutsWhilePickled:
    """An object whose pickling puts another message into the queue."""

    def __init__(self, q, inner):
        self.q, self.inner = q, inner

    def __reduce__(self):
        self.q.put(self.inner)
        return (str, ("outer",))


def test_an_object_whose_reduce_puts_into_the_queue_leaves_both_messages_whole():
    q = zctipc.Queue()
    try:
        arr = np.arange(300_000)
        q.put((_PutsWhilePickled(q, ("inner", arr)), "tail", arr))
        inner = q.get(timeout=HANG)
        outer = q.get(timeout=HANG)
        assert inner[0] == "inner" and np.array_equal(inner[1], arr)
        assert outer[:2] == ("outer", "tail") and np.array_equal(outer[2], arr)
        # The thread's pickler is left free and clean.
        p = pickler.pickler()
        assert not p.busy and p.chunks == [] and p is pickler._sending.pickler
        q.put((1, 2))
        assert q.get() == (1, 2)
        # Nested twice over.
        q.put(_PutsWhilePickled(q, _PutsWhilePickled(q, "innermost")))
        assert [q.get(timeout=HANG) for _ in range(3)] == ["innermost", "outer", "outer"]
    finally:
        q.close()


class _Signals:
    """An object whose pickling sends this process a signal, whose handler
    puts into the queue (it runs inside the pickling)."""

    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGUSR1)
        return (str, ("pickled",))


def test_a_signal_handler_that_puts_during_a_puts_pickling_and_during_a_get():
    q = zctipc.Queue()
    handled = []

    def handler(signum, frame):
        q.put(("from handler", np.arange(len(handled) + 200_000)))
        handled.append(signum)

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        q.put(("outer", _Signals(), np.arange(10)))
        assert handled == [signal.SIGUSR1]
        first, second = q.get(timeout=HANG), q.get(timeout=HANG)
        assert first[0] == "from handler" and np.array_equal(first[1], np.arange(200_000))
        assert second[:2] == ("outer", "pickled") and np.array_equal(second[2], np.arange(10))

        # During a get that waits: the handler's message is what it returns.
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        got = q.get(timeout=HANG)
        timer.join()
        assert got[0] == "from handler" and np.array_equal(got[1], np.arange(200_001))
        # And one waiting without a timeout (the brief wait inside the library).
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        got = q.get()
        timer.join()
        assert got[0] == "from handler" and np.array_equal(got[1], np.arange(200_002))
        assert q.empty()
        assert not pickler.pickler().busy
    finally:
        signal.signal(signal.SIGUSR1, old)
        q.close()


# -- torch imported after the first put -----------------------------------------


def test_torch_imported_after_the_first_put_goes_by_zctipc_reducers():
    """The thread's pickler predates torch: the put after the import must
    use a new one, whose reducers share the tensor's storage, not pickle its
    bytes; also when torch is imported inside a put's pickling."""
    pytest.importorskip("torch")
    said = _run("""
        import sys, zctipc
        from zctipc._wire import pickler
        assert "torch" not in sys.modules
        q = zctipc.Queue()
        q.put((1, 2)); assert q.get() == (1, 2)
        before = pickler._sending.pickler

        class ImportsTorch:
            def __reduce__(self):
                import torch
                t = torch.zeros(4)
                q.put(t)  # reentrant, with torch new
                self.t = t
                return (str, ("outer",))

        it = ImportsTorch()
        q.put(it)
        inner, outer = q.get(timeout=60), q.get(timeout=60)
        inner[0] = 7
        print(outer, float(it.t[0]))

        import torch
        t = torch.arange(6, dtype=torch.float32)
        q.put((t, [t[2:]], 5))
        a, (b,), n = q.get(timeout=60)
        a[0] = 42
        b[0] = 43
        print(n, float(t[0]), float(t[2]), pickler._sending.pickler is not before)
        q.put(b"raw"); q.put(torch.ones(3)); q.put((1,))
        print(q.get() == b"raw", float(q.get().sum()), q.get())
        q.close()
    """)
    assert said == ["outer", "7.0", "5", "42.0", "43.0", "True", "True", "3.0", "(1,)"]


# -- children and attach ----------------------------------------------------------


def _echo(q_in, q_out):
    """A child's first queues are those it unpickled."""
    for _ in range(3):
        m = q_in.get(timeout=HANG)
        q_out.put(m if not isinstance(m, np.ndarray) else ("array", m.sum()))


def test_a_child_whose_first_queues_are_unpickled_puts_and_gets(ctx):
    q_in, q_out = zctipc.Queue(), zctipc.Queue()
    try:
        p = ctx.Process(target=_echo, args=(q_in, q_out))
        p.start()
        q_in.put((1, "a"))
        q_in.put(b"bytes")
        q_in.put(np.arange(100))
        got = [q_out.get(timeout=HANG) for _ in range(3)]
        p.join(HANG)
        assert p.exitcode == 0
        assert got[:2] == [(1, "a"), b"bytes"] and got[2][0] == "array" and got[2][1] == 4950
    finally:
        q_in.close()
        q_out.close()


def test_attach_by_name_in_a_fresh_process():
    q = zctipc.Queue()
    try:
        q.put((1, "to child"))
        q.put(np.arange(200_000))
        said = _run(f"""
            import numpy as np, zctipc
            q = zctipc.Queue.attach({q.name!r})
            a = q.get(timeout=60)
            b = q.get(block=False)
            print(a[1].replace(" ", "_"), int(b.sum()))
            q.put((2, "from child")); q.put(b"raw")
            q.close()
        """)
        assert said == ["to_child", str(sum(range(200_000)))]
        assert q.get(timeout=HANG) == (2, "from child")
        assert q.get(timeout=HANG) == b"raw"
    finally:
        q.close()


# -- the type comparison --------------------------------------------------------


def test_every_record_type_interleaved_with_pickles():
    torch = pytest.importorskip("torch")
    q = zctipc.Queue()
    try:
        t = torch.arange(10)
        msgs = [
            (0,),
            b"",
            b"bytes",
            np.arange(3),
            np.empty(0),
            (1, "p"),
            np.arange(400_000),  # a bare array
            t,
            (np.arange(2), np.arange(300_000)),
            [],
            None,
            bytes(200_000),
        ]
        for m in msgs * 2:
            q.put(m)
        got = [q.get(timeout=HANG) for _ in msgs]
        while len(got) < 2 * len(msgs):  # a batch may stop before a record that does not fit
            got += q.get_many(2 * len(msgs) - len(got), timeout=HANG)
        for g, m in zip(got, msgs * 2, strict=True):
            if isinstance(m, np.ndarray):
                assert isinstance(g, np.ndarray) and np.array_equal(g, m)
            elif isinstance(m, torch.Tensor):
                assert isinstance(g, torch.Tensor) and torch.equal(g, m)
            elif isinstance(m, tuple) and m and isinstance(m[0], np.ndarray):
                assert all(np.array_equal(a, b) for a, b in zip(g, m, strict=True))
            else:
                assert g == m and type(g) is type(m)
        # The constant that finds a plain pickle is the take result's type and offset.
        assert (
            queues._PICKLE_AT_HEADER
            == (queues._PICKLE << queues._TYPE_SHIFT | queues._HEADER << queues._OFFSET_SHIFT) >> queues._OFFSET_SHIFT
        )
        del got, g
    finally:
        q.close()


def test_stream_endpoints_in_a_forked_child_raise_forked_process_error_at_once():
    """A stream writer's and reader's calls are bound as the queue's are
    (Note [calls bound for a hot path] in zctipc._core.native): in a forked
    child a read, a write, a look and an iteration begun in the parent
    raise ForkedProcessError, and the parent's stream is untouched (before,
    the child read the parent's frame and wrote one into its ring)."""
    said = forking("""
        s = zctipc.Stream.create(shape=(4,), frames=4, readers=1)
        w, rd = s.writer(), s.reader()
        for k in (1, 2):
            w.write(np.full(4, k, np.float32))
        frames = iter(rd)
        first = int(next(frames)[0])
        child = in_child(lambda: kinds(lambda: rd.read(timeout=1), lambda: w.write(np.zeros(4, np.float32)),
                                       lambda: rd.look(timeout=1), lambda: w.look(timeout=1), lambda: next(frames)))
        print(child, first, int(next(frames)[0]), rd.read(block=False))
        del frames
        w.close(); rd.close(); s.close()
    """)
    assert said == ["ForkedProcessError," * 4 + "ForkedProcessError", "1", "2", "None"]
