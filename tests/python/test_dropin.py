"""zctipc as a drop-in for multiprocessing: one regression test for each
incompatibility a drop-in user met (the fork default, the standard
library's pools, waiting on queues, hidden references, the namespace and
the contexts, put of an unpicklable object)."""

import asyncio
import concurrent.futures
import gc
import multiprocessing
import multiprocessing.connection
import multiprocessing.pool
import os
import pickle
import queue
import selectors
import subprocess
import sys
import textwrap
import time
import weakref

import _workers
import numpy as np
import pytest
import torch
from conftest import SHM

import zctipc

METHODS = ["forkserver", "spawn"]


def run_script(tmp_path, text, timeout=120):
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(text))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


# -- 1. the fork default -----------------------------------------------------------


@pytest.mark.slow
def test_a_program_that_chose_no_start_method_works_with_plain_multiprocessing(tmp_path):
    assert multiprocessing.context._default_context._default_context._name in ("fork", "forkserver")
    out = run_script(
        tmp_path,
        """
        import multiprocessing
        import numpy as np
        import zctipc

        def child(q):
            q.put(np.arange(3) * 2)

        if __name__ == "__main__":
            q = zctipc.Queue()
            p = multiprocessing.Process(target=child, args=(q,))
            p.start()
            print(q.get(timeout=60).tolist(), multiprocessing.get_start_method())
            p.join()
            print(p.exitcode)
            multiprocessing.set_start_method("spawn", force=True)  # still the program's to choose
    """,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[0, 2, 4] forkserver", "0"]
    if sys.version_info < (3, 14):
        warnings = [line for line in out.stderr.splitlines() if "RuntimeWarning" in line]
        assert len(warnings) == 1 and "'forkserver'" in warnings[0] and "set_start_method" in warnings[0], out.stderr


def test_the_start_method_stays_free_to_choose_after_zctipc_is_used(tmp_path):
    out = run_script(
        tmp_path,
        """
        import multiprocessing
        import zctipc

        if __name__ == "__main__":
            q = zctipc.Queue()
            multiprocessing.set_start_method("spawn")
            print(multiprocessing.get_start_method(), zctipc.get_start_method())
    """,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "spawn spawn"
    assert "RuntimeWarning" not in out.stderr or sys.version_info < (3, 14)


def test_a_program_that_chose_fork_gets_forked_process_error_in_the_child(tmp_path):
    out = run_script(
        tmp_path,
        """
        import multiprocessing
        import zctipc

        def child(q):
            q.put(1)

        if __name__ == "__main__":
            multiprocessing.set_start_method("fork")
            q = zctipc.Queue()
            p = multiprocessing.Process(target=child, args=(q,))
            p.start()
            p.join()
            print(p.exitcode)
    """,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
    assert "ForkedProcessError" in out.stderr
    assert "RuntimeWarning" not in out.stderr, "a chosen method is not overridden"


# -- 2. unbounded means unbounded --------------------------------------------------------


@pytest.mark.slow
def test_fill_the_task_queue_then_start_the_workers():
    """The issue's case: 400 tasks of 100 KB (40 MB, more than a bounded
    ring's 16 MiB) put with no consumer yet, then the workers start."""
    ctx = zctipc.get_context()
    tasks, results = ctx.Queue(), ctx.Queue()
    for i in range(400):
        assert not tasks.full()
        (tasks.put_nowait if i % 2 else tasks.put)({"id": i, "blob": bytes([i % 256]) * 100_000})
    assert tasks.qsize() == 400 and not tasks.full()
    workers = [ctx.Process(target=_workers.take_tasks, args=(tasks, results)) for _ in range(2)]
    for w in workers:
        w.start()
    for _ in workers:
        tasks.put(None)
    got = sorted(results.get(timeout=60) for _ in range(400))
    for w in workers:
        w.join(60)
    assert got == [(i, 100_000) for i in range(400)]
    assert tasks.empty()
    used = os.stat(os.path.join(SHM, tasks.name)).st_blocks * 512
    assert used < 8 << 20, f"the drained queue still uses {used} bytes"
    tasks.close(), results.close()


def test_a_bounded_queue_stays_bounded_and_full_agrees_with_put_nowait():
    q = zctipc.Queue(3)
    for i in range(3):
        q.put_nowait(i)
    assert q.full()
    with pytest.raises(queue.Full):
        q.put_nowait(3)
    b = zctipc.Queue(max_bytes=1 << 16)  # the bytes bound only where asked for
    with pytest.raises(queue.Full):
        for _ in range(100):
            b.put_nowait(b"x" * 10_000)
    assert 5 <= b.qsize() <= 7
    while not b.full():
        b.put_nowait(b"x")  # the smallest record with a payload
    with pytest.raises(queue.Full):
        b.put_nowait(b"x")
    q.close(), b.close()


# -- 4. the standard library's pools, and waiting on queues ---------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_process_pool_executor_with_zctipc_context(method):
    ctx = zctipc.get_context(method)
    arrays = [np.full(1 << 16, i, np.float32) for i in range(6)]
    tensors = [torch.full((1 << 12,), float(i)) for i in range(3)]
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as ex:
        out = list(ex.map(_workers.plus_one, arrays + tensors, timeout=120))
    for got, sent in zip(out, arrays + tensors, strict=True):
        assert type(got) is type(sent)
        assert (got == sent + 1).all()
        assert zctipc.is_shared(got), "the result is a view of zctipc memory"


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_multiprocessing_pool_with_zctipc_context(method):
    ctx = zctipc.get_context(method)
    arrays = [np.full(1 << 16, i, np.int64) for i in range(6)]
    with multiprocessing.pool.Pool(2, context=ctx) as pool:
        out = pool.map(_workers.plus_one, arrays)
        assert isinstance(pool._inqueue, zctipc.SimpleQueue), "tasks cross zctipc's queues"
        t = pool.apply_async(_workers.plus_one, (torch.ones(5),)).get(60)
    assert all((o == a + 1).all() and zctipc.is_shared(o) for o, a in zip(out, arrays, strict=True))
    assert torch.equal(t, torch.full((5,), 2.0))
    with ctx.Pool(2) as pool:
        assert pool.map(abs, [-1, -2]) == [1, 2]
        assert pool._ctx is ctx


def test_a_child_killed_before_it_attached_its_queue_leaves_nothing():
    """multiprocessing's pools terminate workers that may not have started
    yet: the queues handed to them must not outlive the parent's hold."""
    q = zctipc.get_context("spawn").Queue()
    p = zctipc.get_context("spawn").Process(target=_workers.put_later, args=(q, "never", 0))
    p.start()
    p.kill()  # long before a spawned interpreter unpickles its arguments
    p.join(60)
    name = q.name
    q.close()
    del p
    gc.collect()
    assert not os.path.exists(os.path.join(SHM, name)), "nothing holds the queue once the parent let go"


@pytest.mark.slow
def test_connection_wait_on_queues_among_other_things():
    ctx = zctipc.get_context()
    a, b = zctipc.Queue(), zctipc.SimpleQueue()
    here, there = multiprocessing.Pipe()
    assert multiprocessing.connection.wait([a._reader, b._reader, here], timeout=0.05) == []
    p = ctx.Process(target=_workers.put_later, args=(b, "late", 0.2))
    p.start()
    start = time.monotonic()
    assert multiprocessing.connection.wait([a._reader, b._reader, here], timeout=60) == [b._reader]
    assert time.monotonic() - start < 30
    assert b._reader.poll() and b._poll(0)
    assert b._reader.recv() == "late"
    assert multiprocessing.connection.wait([b._reader], timeout=0.05) == [], "empty again: not readable"
    assert not b._reader.poll(0.05)
    p.join(60)
    # Messages put before anyone watched count too; each get re-arms.
    a._writer.send(1)
    a.put(2)
    assert multiprocessing.connection.wait([a._reader], timeout=5) == [a._reader]
    assert a.get() == 1
    assert multiprocessing.connection.wait([a._reader], timeout=5) == [a._reader], "one more is there"
    assert a.get() == 2
    assert multiprocessing.connection.wait([a._reader], timeout=0.05) == []
    with selectors.DefaultSelector() as sel:
        sel.register(a._reader, selectors.EVENT_READ)
        assert sel.select(0.05) == []
        a.put("x")
        assert len(sel.select(5)) == 1
    assert a.get() == "x"
    a._reader.close(), a._writer.close()  # multiprocessing's pool workers do this
    a.put("still open")
    assert a.get() == "still open"
    a.close()
    b.close()


def test_await_a_queue():
    q = zctipc.Queue()

    async def main():
        asyncio.get_running_loop().call_later(0.1, q.put, {"a": np.arange(3)})
        first = await asyncio.wait_for(q.get_async(), 30)
        q.put("ready")
        return first, await asyncio.wait_for(q.get_async(), 30)

    first, second = asyncio.run(main())
    assert first["a"].tolist() == [0, 1, 2] and second == "ready"
    q.close()


def test_close_ends_the_readiness_thread():
    before = {t.ident for t in __import__("threading").enumerate()}
    q = zctipc.Queue()
    q._reader.fileno()
    q.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        new = [t for t in __import__("threading").enumerate() if t.ident not in before and t.is_alive()]
        if not new:
            break
        time.sleep(0.01)
    assert not new, new
    with pytest.raises(zctipc.HandleClosed):
        q._reader.fileno()


# -- 5. no hidden references ------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [lambda: np.arange(1000.0), lambda: torch.arange(1000.0), lambda: zctipc.empty(100)],
    ids=["array", "tensor", "zctipc"],
)
def test_a_put_keeps_nothing_of_the_message(make):
    q = zctipc.Queue()
    obj = make()
    ref = weakref.ref(obj) if not isinstance(obj, np.ndarray) else None
    holder = _Weakrefable(obj)
    w = weakref.ref(holder)
    q.put({"b": holder})
    del obj, holder
    got = q.get()
    del got
    gc.collect()
    assert w() is None, "the sender holds the last message"
    if ref is not None:
        assert ref() is None
    q.close()


class _Weakrefable:
    def __init__(self, payload):
        self.payload = payload


# -- 6. the namespace and the contexts ---------------------------------------------------


def test_every_name_of_multiprocessing_is_there():
    missing = [name for name in multiprocessing.__all__ if not hasattr(zctipc, name)]
    assert not missing
    for sub in (
        "pool",
        "connection",
        "managers",
        "shared_memory",
        "synchronize",
        "util",
        "context",
        "reduction",
        "queues",
    ):
        module = __import__(f"zctipc.{sub}", fromlist=["_"])
        original = __import__(f"multiprocessing.{sub}", fromlist=["_"])
        for name in dir(original):
            if not name.startswith("__"):
                assert hasattr(module, name), f"zctipc.{sub}.{name}"
    assert zctipc.pool.ThreadPool is multiprocessing.pool.ThreadPool
    with zctipc.pool.ThreadPool(2) as pool:
        assert pool.map(abs, [-1, -2]) == [1, 2]
    assert zctipc.connection.wait is multiprocessing.connection.wait
    assert zctipc.reducer is multiprocessing.reducer
    assert zctipc.queues.Queue is zctipc.Queue, "queues are zctipc's"
    assert zctipc.context.BaseContext is multiprocessing.context.BaseContext
    zctipc.allow_connection_pickling()
    zctipc.set_executable(sys.executable)


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_a_context_keeps_its_identity(method):
    ctx = zctipc.get_context(method)
    assert ctx.get_context() is ctx
    assert ctx.get_start_method() == method
    q = ctx.Queue()
    p = ctx.Process(target=_workers.start_method_seen, args=(q,))
    p.start()
    assert q.get(timeout=60) == (method, method, method), "the child reports its method"
    p.join(60)
    with ctx.Pool(1) as pool:
        assert pool._ctx is ctx
        assert pool.apply(_workers.process_name).startswith(("SpawnPoolWorker", "ForkServerPoolWorker"))
    with ctx.Manager() as m:
        assert m._ctx is ctx
        assert type(m._process).__name__ == {"spawn": "SpawnProcess", "forkserver": "ForkServerProcess"}[method]
        assert m.list([1, 2])[:] == [1, 2]
    q.close()


# -- 7. put of an unpicklable object raises in the caller ---------------------------------


def test_put_of_an_unpicklable_object_raises_in_the_caller():
    q = zctipc.SimpleQueue()
    with pytest.raises((AttributeError, TypeError, pickle.PicklingError)):
        q.put(lambda: 1)
    q.put("next")
    assert q.get() == "next"
    q.close()


# -- 8. a manager hands out copies --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("child", ["zctipc", "multiprocessing"])
@pytest.mark.parametrize("nbytes", [0, 8, 2 << 20])
def test_a_managers_values_are_copies(child, nbytes):
    """As the standard library's manager: an array read from a managed dict
    and written in place changes neither the stored value nor what others
    read, in a child (started by zctipc or by multiprocessing, which never
    imported zctipc's connections) or here."""
    with zctipc.Manager() as m:
        d = m.dict()
        d["a"] = np.zeros(max(nbytes // 8, 1))
        ctx = zctipc.get_context("forkserver") if child == "zctipc" else multiprocessing.get_context("spawn")
        p = ctx.Process(target=_workers.write_into_managed, args=(d, "a"))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        assert d["seen"] == 99.0, "the child wrote into its copy"
        assert d["a"][0] == 0.0, "the stored value is unchanged"
        mine = d["a"]
        mine[0] = 5
        assert d["a"][0] == 0.0 and mine[0] == 5
        stored = np.arange(4.0)
        d["b"] = stored
        stored[0] = -1
        assert d["b"][0] == 0.0, "a value stored is a copy of what was given"


@pytest.mark.parametrize("nbytes", [8, (1 << 20) - 8, 1 << 20, 2 << 20])
def test_a_managers_copy_of_a_read_only_array_is_writable(nbytes):
    """As the standard library's manager, whatever the size: a copy is the
    reader's own, writable, even of a read-only array (from 1 MiB, where it
    goes as a pool copy, it came back read-only), and the stored value is
    the same."""
    with zctipc.Manager() as m:
        d = m.dict()
        ro = np.arange(nbytes // 8, dtype=np.float64)
        ro.flags.writeable = False
        d["ro"] = ro
        mine = d["ro"]
        assert mine.flags.writeable and np.array_equal(mine, ro) and mine.dtype == ro.dtype
        mine += 1
        assert np.array_equal(d["ro"], ro), "the stored value is unchanged"
