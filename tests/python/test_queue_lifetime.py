"""A queue dropped goes at once, by reference counting: nothing of zctipc's
holds it in a reference cycle (Note [an end holds its queue weakly] in
zctipc._pipes), so its handle, its segment and its readiness thread go with
its last reference, not when the cycle collector runs (perhaps only at
exit)."""

import gc
import os
import select
import threading
import types
import weakref

import pytest
from conftest import segment_exists

import zctipc

PACKAGE = os.path.dirname(zctipc.__file__)


@pytest.fixture
def no_collector():
    """The cycle collector off for the test, which may then look at what it
    would have had to collect (gc.garbage, after collect_all)."""
    gc.collect()  # what earlier tests left
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()


def collect_all():
    """Everything that only the cycle collector could free, kept in gc.garbage."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    gc.set_debug(0)
    return gc.garbage


def of_zctipc(obj):
    """Whether obj is zctipc's: an object of one of its classes, one of its
    functions or methods, a frame of its code, or one of its threads."""
    if isinstance(obj, types.MethodType):
        obj = obj.__self__
    if isinstance(obj, types.FunctionType):
        return (obj.__module__ or "").startswith("zctipc")
    if isinstance(obj, types.FrameType):
        return obj.f_code.co_filename.startswith(PACKAGE)
    if isinstance(obj, threading.Thread):
        return obj.name.startswith("zctipc")
    return type(obj).__module__.startswith("zctipc")


@pytest.mark.parametrize("kind", [zctipc.Queue, zctipc.SimpleQueue, zctipc.JoinableQueue])
def test_a_dropped_queue_goes_at_once(no_collector, kind):
    q = kind()
    name = q.name
    reader, writer = q._reader, q._writer
    fd = reader.fileno()  # starts the readiness thread
    pipe = os.fstat(fd).st_ino
    assert not reader.poll()
    writer.send((1, "a"))
    assert reader.poll(timeout=10) and reader.recv() == (1, "a")
    q.put((2, "b"))
    assert q.get() == (2, "b")
    if kind is zctipc.JoinableQueue:
        q.task_done()
        q.task_done()
    thread, readiness, queue = q._ready.thread, weakref.ref(q._ready), weakref.ref(q)
    assert thread.is_alive() and segment_exists(name)

    del q
    assert queue() is None, "the queue went with its last reference"
    assert not segment_exists(name), "and its handle with it: the segment is unlinked"
    thread.join(timeout=30)
    assert not thread.is_alive(), "the readiness thread ended"
    # The ends do not keep their queue (they hold it weakly): they say so.
    assert reader.closed and writer.closed
    with pytest.raises(zctipc.HandleClosed, match="collected"):
        reader.recv()
    with pytest.raises(zctipc.HandleClosed, match="collected"):
        writer.send(1)
    # The descriptor the reader gave out lives as long as the reader,
    # readable as a pipe whose writer closed is; then its pipe goes.
    assert os.fstat(fd).st_ino == pipe and select.select([fd], [], [], 0)[0] == [fd]
    del reader
    assert readiness() is None, "its pipe went with the reader"
    try:
        assert os.fstat(fd).st_ino != pipe, "the descriptor is another file's now"
    except OSError:
        pass  # closed
    del writer, thread
    assert [obj for obj in collect_all() if of_zctipc(obj)] == [], "nothing of zctipc's was left in a cycle"


def test_a_queue_awaited_goes_at_once(no_collector):
    """get_async leaves no cycle behind either: its futures and the loop's
    reader callback go when it returned."""
    import asyncio

    q = zctipc.Queue()
    queue = weakref.ref(q)

    async def main(q):
        waiter = asyncio.ensure_future(q.get_async())
        await asyncio.sleep(0.01)
        q.put("x")
        return await asyncio.wait_for(waiter, 30)

    assert asyncio.run(main(q)) == "x"
    thread = q._ready.thread
    del q
    assert queue() is None
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert [obj for obj in collect_all() if of_zctipc(obj)] == []
