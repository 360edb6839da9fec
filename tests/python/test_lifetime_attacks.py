"""Attacks on a queue's lifetime (Note [an end holds its queue weakly] in
zctipc._pipes): its ends used after it was dropped or closed, and while it
goes; the standard library's pools and executors, which use the ends; a
queue dropped in a finalizer, in a collection, at exit, and before the
child it was handed to attached it."""

import asyncio
import concurrent.futures
import gc
import multiprocessing.connection
import os
import select
import selectors
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import weakref

import pytest
from conftest import segment_exists

import zctipc

KINDS = [zctipc.Queue, zctipc.SimpleQueue, zctipc.JoinableQueue]


def open_fd(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


# -- the ends after their queue went -----------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["dropped", "closed"])
def test_the_ends_of_a_queue_that_went(kind, how):
    """Every use of an end raises HandleClosed, multiprocessing.connection.
    wait among them, and the ends say they are closed."""
    q = kind()
    reader, writer = q._reader, q._writer
    q.put("x")
    if how == "dropped":
        del q
    else:
        q.close()
    assert reader.closed and writer.closed
    for use in (reader.recv, reader.poll, reader.fileno, lambda: writer.send(1)):
        with pytest.raises(zctipc.HandleClosed):
            use()
    with pytest.raises(ValueError):  # HandleClosed from fileno(), which selectors calls an invalid file object
        multiprocessing.connection.wait([reader], 0)
    reader.close()  # nothing to close: never raises
    writer.close()


@pytest.mark.parametrize("how", ["dropped", "closed"])
def test_a_descriptor_given_out_lives_as_long_as_its_reader(how):
    """Registered with a selector before the queue went, the reader's
    descriptor stays open and readable, as a pipe whose writer closed is,
    until the reader goes: closed with the queue, epoll forgot it and its
    number went to the next file opened."""
    q = zctipc.Queue()
    reader = q._reader
    fd = reader.fileno()
    sel = selectors.DefaultSelector()
    sel.register(reader, selectors.EVENT_READ)
    thread = q._ready.thread
    if how == "dropped":
        del q
    else:
        q.close()
    thread.join(30)  # the readiness thread ended: its pipe is the reader's now
    assert [key.fileobj for key, _ in sel.select(timeout=10)] == [reader]
    assert open_fd(fd) and select.select([fd], [], [], 0)[0] == [fd]
    with pytest.raises(zctipc.HandleClosed):
        reader.recv()
    sel.unregister(reader)
    sel.close()
    ino = os.fstat(fd).st_ino
    del reader
    if how == "closed":
        del q  # it holds its pipe too
    gc.collect()
    assert not open_fd(fd) or os.fstat(fd).st_ino != ino, "the pipe went with the reader"


def _wait_on(wait, reader, woke, waiting):
    """Wait on reader as the test says, and say whether it became ready."""
    if wait == "selector":
        with selectors.DefaultSelector() as sel:
            sel.register(reader, selectors.EVENT_READ)
            waiting.set()
            woke.append(bool(sel.select(timeout=20)))
    else:
        waiting.set()
        try:
            woke.append(bool(multiprocessing.connection.wait([reader], 20)))
        except ValueError:  # the queue went before wait() asked for the descriptor
            woke.append(True)


@pytest.mark.parametrize("wait", ["selector", "connection.wait"])
def test_a_thread_waiting_on_the_reader_wakes_when_the_queue_goes(wait):
    """A thread waiting (epoll, or multiprocessing.connection.wait) on a
    reader whose queue is dropped wakes at once; the pipe closing under an
    epoll wait lost the wake-up about one time in six."""
    for _ in range(10):
        q = zctipc.Queue()
        woke, waiting = [], threading.Event()
        t = threading.Thread(target=_wait_on, args=(wait, q._reader, woke, waiting))
        t.start()
        assert waiting.wait(30)
        time.sleep(0.01)
        del q
        t.join(30)
        assert woke == [True], "the waiter slept through its queue's going"


def test_asyncio_after_the_queue_went():
    async def main():
        q = zctipc.Queue()
        waiting = asyncio.ensure_future(q.get_async())
        await asyncio.sleep(0.05)
        q.close()
        with pytest.raises(zctipc.HandleClosed):
            await asyncio.wait_for(waiting, 30)
        with pytest.raises(zctipc.HandleClosed):
            await q.get_async()
        # A loop watching a reader's descriptor when its queue is dropped.
        q = zctipc.Queue()
        reader = q._reader
        fd = reader.fileno()
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        loop.add_reader(fd, lambda: readable.done() or readable.set_result(True))
        del q
        assert await asyncio.wait_for(readable, 30)
        loop.remove_reader(fd)
        with pytest.raises(zctipc.HandleClosed):
            reader.recv()

    asyncio.run(main())


# -- dropped while other threads use it --------------------------------------------------


@pytest.mark.parametrize("use", ["recv", "poll", "fileno then wait"])
def test_a_queue_dropped_while_a_thread_waits_on_its_reader(use):
    """The waiting call holds the queue, and the writer still reaches it;
    once the call returned, the queue goes (its end alone does not hold it,
    and says so)."""
    q = zctipc.Queue()
    reader, writer = q._reader, q._writer
    got = []
    sent = threading.Event()

    def waiter():
        if use == "recv":
            got.append(reader.recv())
        elif use == "poll":
            got.append(reader.poll(None))
            # The sender holds the queue until its send returns: the poll it
            # woke may return before that.
            sent.wait(30)
            try:
                reader.recv()
            except zctipc.HandleClosed as exc:
                got.append("hold the queue, not only its end" in str(exc))
        else:
            try:
                multiprocessing.connection.wait([reader], 30)
                got.append(reader.recv())
            except zctipc.HandleClosed:
                got.append("HandleClosed")

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    queue = weakref.ref(q)
    del q
    if use != "fileno then wait":
        assert queue() is not None, "a call in progress holds its queue"
        writer.send("x")
        sent.set()
        t.join(30)
        assert got == (["x"] if use == "recv" else [True, True]) and queue() is None
    else:  # wait() held only the reader: the queue went, and the waiter woke
        t.join(30)
        assert not t.is_alive() and got == ["HandleClosed"] and queue() is None


def test_fileno_and_drop_race():
    """fileno() in one thread while the queue goes in another: a descriptor
    or HandleClosed, never anything else."""
    outcomes = set()

    def ask(reader, barrier):
        barrier.wait()
        try:
            outcomes.add(type(reader.fileno()).__name__)
        except zctipc.HandleClosed:
            outcomes.add("HandleClosed")

    for _ in range(50):
        q = zctipc.Queue()
        barrier = threading.Barrier(2)
        t = threading.Thread(target=ask, args=(q._reader, barrier))
        t.start()
        barrier.wait()
        del q
        t.join(30)
    assert outcomes <= {"int", "HandleClosed"}


@pytest.mark.parametrize("blocked", ["get", "recv", "poll", "put", "wait"])
def test_close_wakes_every_waiter(blocked):
    q = zctipc.Queue(maxsize=1)
    if blocked == "put":
        q.put(1)
    out = []

    def waiter():
        try:
            if blocked == "get":
                q.get()
            elif blocked == "recv":
                q._reader.recv()
            elif blocked == "poll":
                q._reader.poll(None)
            elif blocked == "put":
                q.put(2)
            else:
                out.append(bool(multiprocessing.connection.wait([q._reader], 30)))
        except zctipc.HandleClosed:
            out.append("HandleClosed")

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    q.close()
    t.join(30)
    assert out == ([True] if blocked == "wait" else ["HandleClosed"])


# -- in finalizers and collections -------------------------------------------------------


class _Cycle:
    """A queue in a reference cycle whose __del__ still uses it."""

    def __init__(self, seen):
        self.me = self
        self.seen = seen
        self.q = zctipc.Queue()
        self.q.put("in the cycle")
        self.q._reader.fileno()

    def __del__(self):
        self.seen.append(self.q.get(timeout=10))


def test_a_queue_dropped_in_a_finalizer_and_in_a_collection():
    class Owner:
        pass

    owner, holder = Owner(), [zctipc.Queue()]
    name = holder[0].name
    holder[0]._reader.fileno()
    weakref.finalize(owner, holder.clear)
    del owner  # its finalizer drops the last reference to the queue
    assert not segment_exists(name)
    seen = []
    c = _Cycle(seen)
    name = c.q.name
    del c
    gc.collect()
    assert seen == ["in the cycle"] and not segment_exists(name)


# -- pools and executors -----------------------------------------------------------------


def square(x):
    return x * x


def die(_):
    os._exit(3)


@pytest.fixture
def thread_errors():
    """What threads raised (threading.excepthook) during the test."""
    errors = []
    saved = threading.excepthook
    threading.excepthook = errors.append
    yield errors
    threading.excepthook = saved


@pytest.mark.slow
def test_executors_shut_down_collected_and_broken(thread_errors):
    ctx = zctipc.get_context("forkserver")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as ex:
        assert list(ex.map(square, range(4))) == [0, 1, 4, 9]
    ex = concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx)
    assert ex.submit(square, 3).result(60) == 9
    ex.shutdown(wait=False)  # drops its result queue while its manager thread still uses it
    del ex
    ex = concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx)
    assert ex.submit(square, 4).result(60) == 16
    manager = ex._executor_manager_thread
    del ex  # collected without a shutdown
    gc.collect()
    manager.join(60)
    assert not manager.is_alive()
    ex = concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx)
    with pytest.raises(concurrent.futures.process.BrokenProcessPool):
        ex.submit(die, 1).result(60)
    ex.shutdown(wait=True)
    assert thread_errors == []


@pytest.mark.slow
def test_pools_closed_collected_and_terminated(thread_errors):
    ctx = zctipc.get_context("forkserver")
    with ctx.Pool(1) as pool:
        assert pool.map(square, range(3)) == [0, 1, 4]
    pool = ctx.Pool(1)
    assert pool.apply(square, (3,)) == 9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del pool  # collected unclosed: its finalizer terminates it
        gc.collect()
    pool = ctx.Pool(1)
    result = pool.apply_async(die, (1,))
    time.sleep(0.5)
    pool.terminate()
    pool.join()
    assert not result.ready() or not result.successful()
    assert thread_errors == []


# -- at exit, and handed to a child ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("how", ["dropped", "closed"])
def test_a_queue_handed_to_a_child_and_let_go_before_it_attached(how):
    ctx = zctipc.get_context("spawn")
    q, out = ctx.Queue(), ctx.Queue()
    q.put("hello")
    p = ctx.Process(target=_get_and_answer, args=(q, out))
    p.start()
    if how == "dropped":
        del q
        gc.collect()
    else:
        q.close()
    assert out.get(timeout=60) == "hello"
    p.join(60)
    assert p.exitcode == 0


def _get_and_answer(q, out):
    out.put(q.get(timeout=60))


EXITING = """
import concurrent.futures, os, sys, threading
import zctipc

def square(x):
    return x * x

def child(q):
    os.write(1, f"child got {q.get(timeout=60)}\\n".encode())  # one write: the parent writes to the same pipe

if __name__ == "__main__":
    ctx = zctipc.get_context("spawn")
    q = ctx.Queue()
    q.put("hello")
    ctx.Process(target=child, args=(q,)).start()  # joined at exit, not by the program
    pool = ctx.Pool(1)  # never closed
    print(pool.apply(square, (3,)), flush=True)
    executor = concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx)  # never shut down
    print(executor.submit(square, 4).result(), flush=True)
    blocked = zctipc.Queue()
    threading.Thread(target=blocked.get, daemon=True).start()  # blocked at exit
    print("main returns", flush=True)
"""


@pytest.mark.slow
def test_a_program_that_leaves_everything_open_exits_cleanly(tmp_path):
    """A child started with a queue and never joined, a Pool never closed,
    an executor never shut down, a daemon thread blocked in get: the
    program exits as it would without zctipc. The queues' handles were
    closed at exit before multiprocessing's exit function ran (Note [a
    queue at exit] in zctipc.queues): the child found its queue gone, and
    the Pool's threads and finalizer raised HandleClosed."""
    path = tmp_path / "exiting.py"
    path.write_text(textwrap.dedent(EXITING))
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert {"9", "16", "main returns", "child got hello"} <= set(out.stdout.splitlines()), (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and "Exception" not in out.stderr, out.stderr


SHUTDOWN = """
import gc, numpy as np, torch, zctipc
from zctipc._core import memory
x = zctipc.empty((4,), torch.float32)
q = zctipc.Queue()
q.put(np.ones(1 << 20, dtype=np.uint8))  # by descriptor: the get builds its own owner
y = q.get()
before = zctipc.pool_stats().slots_in_use
memory.native = memory.log = memory._RELEASING = None  # as interpreter shutdown may leave the module
del x, y
gc.collect()
print(before - zctipc.pool_stats().slots_in_use)
"""


@pytest.mark.slow
def test_memory_collected_after_its_module_was_cleared_is_released_quietly(isolated):
    """Note [finalizers at shutdown] in zctipc._core.memory: a module-level
    array still alive at shutdown (under torch before 2.3 it was collected
    after memory's globals were cleared) printed "Exception ignored ...
    'NoneType' object has no attribute 'finalize'" for each."""
    out = subprocess.run([sys.executable, "-c", SHUTDOWN], env=isolated, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr
    assert out.stdout.split() == ["2"], "both buffers went back"
