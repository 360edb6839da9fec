"""zctipc.Queue, SimpleQueue and JoinableQueue: the behaviours of CPython's
own queue tests, across threads and real processes."""

import gc
import json
import os
import pickle
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import _workers
import numpy as np
import pytest
import torch
from conftest import slots_in_use, wait_until_gone, with_pythonpath

import zctipc


@pytest.fixture
def q():
    q = zctipc.Queue()
    yield q
    q.close()


def test_fifo_qsize_empty_full():
    q = zctipc.Queue(maxsize=3)
    assert q.empty() and not q.full() and q.qsize() == 0
    for i in range(3):
        q.put(i)
    assert q.full() and q.qsize() == 3
    with pytest.raises(queue.Full):
        q.put_nowait(99)
    with pytest.raises(queue.Full):
        q.put(99, timeout=0.01)
    assert [q.get() for _ in range(3)] == [0, 1, 2]
    assert q.empty()
    with pytest.raises(queue.Empty):
        q.get_nowait()
    q.close()


@pytest.mark.parametrize(
    "obj",
    [
        0,
        1.5,
        "text",
        b"bytes",
        None,
        (1, 2, 3, 4, 5),
        [1, [2, {"x": (3,)}]],
        {"a": 1},
        {1, 2},
        bytearray(b"ab"),
        10**30,
        float("inf"),
    ],
)
def test_round_trips(q, obj):
    q.put(obj)
    got = q.get()
    assert got == obj and type(got) is type(obj)


class _Tracked:
    """An object whose death a weak reference sees."""

    def __init__(self, payload):
        self.payload = payload


@pytest.mark.parametrize("payload", [1, np.zeros(4), torch.ones(3)], ids=["plain", "array", "tensor"])
def test_the_queue_keeps_no_reference_to_what_was_put(q, payload):
    # The pickler's memo is emptied at the end of each put: an object (and a
    # buffer it holds) dies when its caller drops it, not at the next put.
    obj = _Tracked(payload)
    ref = weakref.ref(obj)
    q.put(obj)
    objs = [_Tracked(payload), _Tracked(2)]
    refs = [weakref.ref(o) for o in objs]
    q.put_many(objs)
    del obj, objs
    gc.collect()
    assert ref() is None and [r() for r in refs] == [None, None]
    assert isinstance(q.get(), _Tracked) and len(q.get_many(2)) == 2


def test_get_timeout(q):
    start = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    assert time.monotonic() - start >= 0.045, "the timeout is honoured"
    with pytest.raises(queue.Empty):
        q.get(block=False)
    with pytest.raises(ValueError, match="non-negative"):
        q.get(timeout=-1)


def test_put_timeout():
    q = zctipc.Queue(1)
    q.put("x")
    start = time.monotonic()
    with pytest.raises(queue.Full):
        q.put("y", timeout=0.05)
    assert time.monotonic() - start >= 0.045
    q.close()


def test_blocking_get_waits_for_a_put(q):
    threading.Timer(0.1, q.put, args=("late",)).start()
    assert q.get() == "late"
    threading.Timer(0.1, q.put, args=("later",)).start()
    assert q.get(timeout=5) == "later"


def test_blocking_put_waits_for_a_get():
    q = zctipc.Queue(1)
    q.put(1)
    threading.Timer(0.1, q.get).start()
    q.put(2, timeout=5)
    assert q.get() == 2
    q.close()


def test_task_done_and_join():
    q = zctipc.JoinableQueue()
    with pytest.raises(ValueError, match="too many times"):
        q.task_done()
    for i in range(5):
        q.put(i)
    done = threading.Event()

    def joiner():
        q.join()
        done.set()

    t = threading.Thread(target=joiner)
    t.start()
    for _ in range(5):
        q.get()
        assert not done.is_set()
        q.task_done()
    t.join(5)
    assert done.is_set()
    with pytest.raises(ValueError):
        q.task_done()
    q.close()


def test_close():
    q = zctipc.Queue()
    q.put(1)
    with pytest.raises(ValueError, match="join_thread"):
        q.join_thread()
    q.cancel_join_thread()
    q.close()
    q.close()
    q.join_thread()
    for call in (lambda: q.put(2), q.get, q.qsize, q.full):
        with pytest.raises(ValueError, match="closed"):
            call()
    with pytest.raises(OSError, match="closed"):  # as multiprocessing's, whose pipe is closed
        q.empty()
    assert "closed" in repr(q)


def test_simple_queue():
    q = zctipc.SimpleQueue()
    assert q.empty()
    q.put({"k": [1, 2]})
    assert not q.empty()
    assert q.get() == {"k": [1, 2]}
    q.close()


def test_put_many_and_get_many(q):
    q.put_many(range(10))
    assert q.get_many(max_items=4) == [0, 1, 2, 3]
    assert q.get_many() == list(range(4, 10))
    with pytest.raises(queue.Empty):
        q.get_many(block=False)
    with pytest.raises(ValueError):
        q.get_many(max_items=0)


def test_batches_keep_order_across_kinds():
    # Two of the pickles do not fit in one run of 16 KiB: they go in two calls.
    q = zctipc.Queue(max_bytes=16384)
    objs = [1, np.arange(3), "x", "y" * 9000, b"raw", torch.ones(2), {"k": np.zeros(2)}, None, "z" * 6000]
    q.put_many(objs)
    got = []
    while len(got) < len(objs):
        got += q.get_many()
    assert got[0] == 1 and got[2] == "x" and got[3] == "y" * 9000 and got[4] == b"raw"
    assert got[7] is None and got[8] == "z" * 6000
    np.testing.assert_array_equal(got[1], np.arange(3))
    assert torch.equal(got[5], torch.ones(2))
    np.testing.assert_array_equal(got[6]["k"], np.zeros(2))
    assert not zctipc.is_shared(got[1]) and not zctipc.is_shared(got[6]["k"]), "small arrays travel inline"
    assert zctipc.is_shared(got[5]), "a tensor is shared"
    q.close()


def test_put_many_stops_at_full():
    q = zctipc.Queue(maxsize=5)
    with pytest.raises(queue.Full):
        q.put_many(range(8), timeout=0.05)
    assert q.get_many() == [0, 1, 2, 3, 4], "what fitted went in, in order"
    q.close()


def test_bad_arguments():
    with pytest.raises(TypeError):
        zctipc.Queue("3")
    with pytest.raises(ValueError, match="max_bytes"):
        zctipc.Queue(max_bytes=10)
    with pytest.raises(ValueError, match="max_bytes"):
        zctipc.Queue(max_bytes=2 << 30)


def test_unpicklable_object_fails_in_the_producer_and_the_queue_stays_usable(q):
    in_use = slots_in_use()
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        q.put({"array": np.arange(1000), "fn": lambda: 1})
    assert zctipc.pool_stats().slots_in_use == in_use, "the array already copied out was given back"
    q.put("still works")
    assert q.get() == "still works"


def test_object_larger_than_max_bytes(q):
    small = zctipc.Queue(max_bytes=4096)
    with pytest.raises(ValueError, match="max_bytes=4096"):
        small.put("x" * 5000)
    small.put("fits")
    assert small.get() == "fits"
    small.close()


def test_many_threads_put_and_get(q):
    n, threads = 2000, 4
    got = []
    lock = threading.Lock()

    def producer(k):
        for i in range(n):
            q.put((k, i))

    def consumer():
        while (m := q.get()) is not None:
            with lock:
                got.append(m)

    workers = [threading.Thread(target=producer, args=(k,)) for k in range(threads)]
    workers += [threading.Thread(target=consumer) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers[:threads]:
        w.join()
    for _ in range(threads):
        q.put(None)
    for w in workers[threads:]:
        w.join()
    assert sorted(got) == [(k, i) for k in range(threads) for i in range(n)]


@pytest.mark.parametrize("inline_bytes", [None, 0])
def test_mixed_dict_round_trip(inline_bytes):
    q = zctipc.Queue(inline_bytes=inline_bytes)
    msg = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "strided": np.arange(20)[::3],
        "transposed": np.arange(6.0).reshape(2, 3).T,
        "i64": torch.arange(5),
        "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "view": torch.arange(10.0)[2:8].reshape(2, 3),
        "scalar": np.float64(3.5),
        "zero_d": np.array(7),
        "empty": np.zeros((0, 3)),
        "objects": np.array([{"a": 1}, None], dtype=object),
        "text": "hello",
        "nested": [np.ones(3, dtype=np.uint8), ("x", torch.ones(2, 2))],
    }
    q.put(msg)
    got = q.get()
    assert set(got) == set(msg)
    for k in ("f32", "strided", "transposed", "zero_d", "empty"):
        np.testing.assert_array_equal(got[k], msg[k])
        assert type(got[k]) is np.ndarray and got[k].dtype == msg[k].dtype
        # Small arrays travel inline, as copies, unless inline_bytes=0.
        assert zctipc.is_shared(got[k]) == (inline_bytes == 0), k
    for k in ("i64", "bf16", "view"):
        assert torch.equal(got[k], msg[k]) and got[k].dtype == msg[k].dtype
        assert zctipc.is_shared(got[k]), k
    assert got["scalar"] == 3.5 and got["text"] == "hello"
    assert got["objects"][0] == {"a": 1}, "object arrays go by pickle"
    np.testing.assert_array_equal(got["nested"][0], np.ones(3))
    assert torch.equal(got["nested"][1][1], torch.ones(2, 2))
    q.close()


def test_shared_memory_goes_by_descriptor_and_writes_are_shared(q):
    a = zctipc.empty(4, "int32")
    a[:] = 1
    t = zctipc.share(torch.zeros(3))
    st = zctipc.create_shared_tensor(data=np.arange(3))
    q.put((a, t, st))
    a2, t2, st2 = q.get()
    a2[0] = 42
    t2[1] = 7
    assert a[0] == 42 and t[1] == 7, "the receiver got the same memory"
    assert isinstance(st2, zctipc.SharedTensor) and st2.name == st.name
    st2.numpy()[2] = 9
    assert st.numpy()[2] == 9
    st.close()
    st2.close()


def test_bare_arrays_and_tensors_go_as_tensor_records(q):
    q.put(np.arange(4.0))
    got = q.get()
    assert type(got) is np.ndarray and got.tolist() == [0, 1, 2, 3]
    q.put(torch.arange(3))
    assert torch.equal(q.get(), torch.arange(3))


INLINE_CASES = [
    np.arange(10, dtype=np.float32),
    np.zeros((0, 5)),
    np.array(3.5),
    np.arange(12).reshape(3, 4)[:, ::2],  # not contiguous: sent in C order
    np.arange(6)[::-1],  # negative strides
    np.ones((2, 3), dtype=np.bool_),
    np.arange(4, dtype=np.complex64),
    np.arange(2048, dtype=np.uint8).reshape(2, 1024),
]


@pytest.mark.parametrize("max_bytes", [None, 1 << 20])
def test_small_arrays_travel_inline_as_private_copies(max_bytes):
    q = zctipc.Queue(max_bytes=max_bytes)
    slots = slots_in_use()
    for a in INLINE_CASES:
        q.put(a)
        q.put({"a": a, "n": 1})
        q.put_many([a, (a,)])
        for got in (q.get(), q.get()["a"], *q.get_many(2)):
            got = got[0] if type(got) is tuple else got
            assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
            assert got.flags.writeable and not zctipc.is_shared(got), "a copy of its own, not shared"
            got[...] = 0  # the copy is the receiver's: the sender's array is untouched
            assert not np.shares_memory(got, a)
    assert zctipc.pool_stats().slots_in_use == slots, "no pool buffer was used"
    frozen = np.arange(3.0)
    frozen.setflags(write=False)
    q.put(frozen)
    assert not q.get().flags.writeable, "read-only, as the sender's was"
    q.put((frozen, np.arange(2)))
    inside = q.get()
    assert not inside[0].flags.writeable and inside[1].flags.writeable, "in band in a pickle, as they were"
    q.close()


def _count_puts(monkeypatch):
    """The names of the put calls into the library that queues make from
    now on (zctipc.queues binds them as its globals, and the library's
    others through native.lib())."""
    from zctipc import queues
    from zctipc._core import native

    calls = []

    def counted(name, call):
        def counting(*args):
            calls.append(name)
            return call(*args)

        return counting

    lib = native.lib()
    for name in dir(lib):
        if name.startswith("zct_queue_put"):
            if hasattr(queues, "_" + name[4:]):
                monkeypatch.setattr(queues, "_" + name[4:], counted(name, getattr(lib, name)))

    class Lib:
        def __getattr__(self, name):
            attr = getattr(lib, name)
            return counted(name, attr) if name.startswith("zct_queue_put") else attr

    monkeypatch.setattr(native, "_lib", Lib())
    return calls


def test_a_small_array_goes_inline_in_one_call(q, monkeypatch):
    """The library writes an inline record from the array (Note [inline
    arrays] in zctipc._wire.exports): one native call per put, none of
    them a put of bytes Python framed."""
    calls = _count_puts(monkeypatch)
    for a in INLINE_CASES:
        calls.clear()
        q.put(a)
        assert calls == ["zct_queue_put_inline"], a
    monkeypatch.undo()
    for a in INLINE_CASES:
        got = q.get()
        assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)


def test_put_inline_refuses_bad_arguments(q):
    """zct_queue_put_inline's bad arguments, each its own exception; a
    refused put puts nothing."""
    from zctipc._core import native

    ffi, lib = native.ffi(), native.lib()
    data = np.arange(6, dtype=np.float32)
    address = ffi.from_buffer(data)
    f32 = lib.ZCT_FLOAT32

    def put(nbytes=24, code=f32, ndim=2, shape=(2, 3), flags=0, handle=q._handle, address=address):
        native.check(lib.zct_queue_put_inline(handle, address, nbytes, code, ndim, shape, flags, 0))

    for ndim in (-1, native.MAX_NDIM + 1):
        with pytest.raises(zctipc.InvalidArgument, match="ndim"):
            put(ndim=ndim, shape=(1,) * max(ndim, 0))
    with pytest.raises(zctipc.InvalidArgument, match="24 bytes, not 20"):
        put(nbytes=20)
    with pytest.raises(zctipc.InvalidArgument, match="negative|shape"):
        put(nbytes=0, ndim=1, shape=(-1,))
    with pytest.raises(zctipc.UnsupportedDtype):
        put(code=99)
    with pytest.raises(zctipc.InvalidArgument, match="flags"):
        put(flags=8)
    small = zctipc.Queue(max_bytes=4096)
    big = np.zeros(4096, np.uint8)
    with pytest.raises(zctipc.InvalidArgument, match="larger than the queue"):
        put(nbytes=4096, code=lib.ZCT_UINT8, ndim=1, shape=(4096,), handle=small._handle, address=ffi.from_buffer(big))
    assert q.qsize() == 0 and small.qsize() == 0
    small.close()
    with pytest.raises(zctipc.HandleClosed):
        put(handle=small._handle)
    put()
    assert np.array_equal(q.get(), data.reshape(2, 3))


def test_inline_bytes_sets_the_bound_and_zctipc_memory_never_goes_inline():
    q = zctipc.Queue(inline_bytes=100)
    small, big = np.arange(12, dtype=np.int64), np.arange(13, dtype=np.int64)  # 96 and 104 bytes
    q.put(small)
    q.put(big)
    assert not zctipc.is_shared(q.get()) and zctipc.is_shared(q.get()), "104 bytes go through the pool"
    a = zctipc.empty(4, "int32")
    a[:] = 5
    q.put(a)
    q.put({"a": a})
    for got in (q.get(), q.get()["a"]):
        got[0] = 6
        assert a[0] == 6, "zctipc memory goes by descriptor, shared"
    q.put(a[1:])  # a view: NumPy does not own its data, the library says whose it is
    q.get()[0] = 7
    assert a[1] == 7
    q.put(np.arange(12)[2:])  # a view of NumPy's own memory goes inline
    assert not zctipc.is_shared(q.get())
    off = zctipc.Queue(inline_bytes=0)
    off.put(np.arange(2))
    assert zctipc.is_shared(off.get())
    for bad, exc in [(-1, ValueError), ("1", TypeError), (1.5, TypeError)]:
        with pytest.raises(exc):
            zctipc.Queue(inline_bytes=bad)
    q.close()
    off.close()


def test_zctipc_arrays_go_in_one_call_and_a_full_queue_keeps_no_count():
    """A C-contiguous array in zctipc memory goes by descriptor in one native
    call (zct_queue_put_array); one the queue has no room for stays the
    sender's, with no count left taken on its buffer."""
    gc.collect()
    slots = slots_in_use()
    q = zctipc.Queue(maxsize=1)
    a = zctipc.empty(1 << 16, "float32")
    a[:] = 1
    q.put(a)
    with pytest.raises(queue.Full):
        q.put(a, block=False)
    with pytest.raises(queue.Full):
        q.put(a, timeout=0.05)
    got = q.get()
    got[0] = 5
    assert a[0] == 5 and zctipc.is_shared(got), "the same memory"
    frozen = a[:]
    frozen.setflags(write=False)
    q.put(frozen)
    assert not q.get().flags.writeable, "read-only, as the sender's view was"
    q.put(a[::2])  # not contiguous: the long way, still by descriptor
    strided = q.get()
    strided[1] = 7
    assert a[2] == 7
    plain = np.ones(1 << 16, np.float32)
    q.put(plain)
    copy = q.get()
    assert zctipc.is_shared(copy) and not np.shares_memory(copy, plain), "plain memory is copied once"
    del got, strided, copy, a, frozen
    q.close()
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == slots, "every count went back"


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a,  # 1-D, C order
        lambda a: a[:0],  # no elements
        lambda a: a[:24].reshape(2, 3, 4),
        lambda a: a[:24].reshape(4, 6).T,  # Fortran order
        lambda a: a[1:13:3],  # 1-D, strided
        lambda a: a[:1].reshape(()),  # no dimensions
        lambda a: a.view(np.uint8)[3:11],  # 1-D of another dtype, at an odd offset
    ],
    ids=["1d", "empty", "3d", "fortran", "strided", "0d", "bytes"],
)
def test_a_received_array_has_the_senders_shape_strides_and_memory(q, make):
    """A get builds the array of a descriptor from the view's bytes (Note
    [reading a view at once] in zctipc._core.memory): every layout comes
    back as it went, writable and over the sender's memory, and its count
    goes back with it."""
    gc.collect()
    slots = slots_in_use()
    base = zctipc.empty(64, np.float32)
    base[:] = np.arange(64)
    sent = make(base)
    q.put(sent)
    got = q.get()
    assert (got.shape, got.dtype) == (sent.shape, sent.dtype)
    assert got.strides == sent.strides or not sent.size, "strides, where an element is"
    assert np.array_equal(got, sent) and got.flags.writeable
    if sent.size:
        got[(0,) * got.ndim] = 77
        assert sent[(0,) * sent.ndim] == 77, "the same memory as the sender's"
    del got, sent, base
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == slots, "every count went back"


def test_requires_grad_is_kept_and_non_leaf_refused(q):
    w = torch.ones(3, requires_grad=True)
    q.put(w)
    got = q.get()
    assert got.requires_grad and got.is_leaf
    with pytest.raises(RuntimeError, match="non-leaf"):
        q.put(w * 2)


def test_buffers_go_back_to_the_pool(q):
    gc.collect()  # what earlier tests left
    in_use = slots_in_use()
    for _ in range(20):
        q.put({"x": np.ones(100000), "y": torch.ones(100)})
        got = q.get()
        del got
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == in_use


def test_pool_at_its_limit_waits_or_raises(q):
    code = textwrap.dedent("""
        import numpy as np, queue, zctipc
        zctipc.set_pool_limit(6 << 20)
        q = zctipc.Queue()
        q.put(np.zeros(4 << 20, np.uint8))          # a 4 MiB slot of the 6 MiB allowed
        try:
            q.put(np.zeros(4 << 20, np.uint8), block=False)
        except zctipc.OutOfSharedMemory as e:
            print("nowait", "limit" in str(e))
        try:
            q.put(np.zeros(4 << 20, np.uint8), timeout=0.1)
        except zctipc.OutOfSharedMemory:
            print("timeout")
        got = q.get()
        del got                                      # the slot goes back
        q.put(np.zeros(4 << 20, np.uint8), timeout=5)
        print("after free", q.qsize())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["nowait", "True", "timeout", "after", "free", "1"]


@pytest.mark.slow
def test_queue_passes_to_children(ctx):
    inq, outq = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_workers.echo, args=(inq, outq, 3))
    p.start()
    msgs = ["a", np.arange(5), {"t": torch.ones(2)}]
    for m in msgs:
        inq.put(m)
    got = [outq.get(timeout=60) for _ in msgs]
    p.join(60)
    assert p.exitcode == 0
    assert got[0] == "a"
    np.testing.assert_array_equal(got[1], np.arange(5))
    assert torch.equal(got[2]["t"], torch.ones(2))
    inq.close()
    outq.close()


def test_queue_passes_to_pool_workers(ctx):
    q = ctx.Queue()
    with ctx.Pool(2, initializer=_workers.produce, initargs=(q, 0, 3)) as pool:
        assert pool.map(abs, [-1, -2]) == [1, 2]
        got = sorted(q.get(timeout=60) for _ in range(6))
    assert got == [(0, 0), (0, 0), (0, 1), (0, 1), (0, 2), (0, 2)]
    q.close()


def test_queue_refuses_to_be_pickled_outside_spawning(q):
    with pytest.raises(RuntimeError, match="inheritance"):
        pickle.dumps(q)


@pytest.mark.slow
def test_consumer_modifies_what_the_producer_sees(ctx):
    q, done = ctx.Queue(), ctx.Queue()
    t = zctipc.empty(3, torch.float32)
    t[:] = 1
    a = zctipc.empty(2, "float64")
    a[:] = 5
    p = ctx.Process(target=_workers.modify_tensor, args=(q, done))
    p.start()
    q.put((t, a))
    assert done.get(timeout=60) == ("Tensor", True)
    p.join(60)
    assert t.tolist() == [101, 101, 101] and a[0] == -1


@pytest.mark.slow
def test_four_producers_four_consumers_50000_each(ctx):
    producers, consumers, each = 4, 4, 50_000
    q = ctx.Queue()
    results = ctx.Queue()
    cons = [
        ctx.Process(target=_workers.report, args=(results, _workers.consume_until_none, q, producers))
        for _ in range(consumers)
    ]
    prods = [ctx.Process(target=_workers.produce, args=(q, k, each)) for k in range(producers)]
    for p in cons + prods:
        p.start()
    for p in prods:
        p.join(300)
        assert p.exitcode == 0
    for _ in cons:
        q.put(None)
    totals = [0] * producers
    for _ in cons:
        status, counts = results.get(timeout=300)
        assert status == "ok", counts
        totals = [t + c for t, c in zip(totals, counts, strict=True)]
    for p in cons:
        p.join(60)
    assert totals == [each] * producers, "every message received exactly once"
    assert q.empty()
    q.close()
    results.close()


@pytest.mark.slow
@pytest.mark.parametrize("blob", [0, 100_000], ids=["small", "more-than-16MiB-held"])
def test_killed_consumers_lose_no_other_message(blob):
    """Consumers SIGKILLed at random moments while they take messages that
    hold arrays: each kill may take the message in its hands, no more, and
    the queue keeps working. The slots the killed consumers held are in the
    producer's leak report. With 100 KB pickled in each message, the
    unbounded queue holds 30 MB, and consumers are killed while they give
    back its ring's pages."""
    kills = 12
    env = dict(os.environ, PYTHONPATH=with_pythonpath(os.path.dirname(os.path.abspath(__file__))))
    before = {s.name for s in zctipc.list_segments()}
    producer = subprocess.run(
        [sys.executable, "-c", f"import _workers; _workers.killed_consumers_scenario(kills={kills}, blob={blob})"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert producer.returncode == 0, producer.stderr
    report = json.loads(producer.stdout)
    assert len(report["lost"]) <= kills, f"{len(report['lost'])} messages lost to {kills} kills"
    assert report["twice"] == [], "no message is delivered twice"
    assert report["alive"]
    assert report["leaked_slots"] <= kills
    # The killed consumers held counts on the queue and slots in their
    # hands, which pin their arenas: the cleanup daemon gives them up.
    left = {s.name for s in zctipc.list_segments() if s.name not in before}
    assert wait_until_gone(left) == []


@pytest.mark.slow
@pytest.mark.parametrize("wait", ["sleep", "poll"])
def test_a_blocked_get_uses_the_cpu_its_wait_policy_says(wait):
    code = textwrap.dedent(f"""
        import queue, time, zctipc
        q = zctipc.Queue(wait={wait!r})
        start = time.process_time()
        try:
            q.get(timeout=1.0)
        except queue.Empty:
            pass
        print(time.process_time() - start)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if wait == "sleep":
        assert float(out.stdout) < 0.1, f"a blocked get used {out.stdout.strip()} s of CPU in 1 s"
    else:
        assert float(out.stdout) > 0.3, f"a polling get used only {out.stdout.strip()} s of CPU in 1 s"


@pytest.mark.parametrize("wait", ["sleep", "poll"])
def test_ctrl_c_interrupts_a_blocked_get(wait):
    code = textwrap.dedent(f"""
        import sys, time, zctipc
        q = zctipc.Queue(wait={wait!r})
        print("blocked", flush=True)
        try:
            q.get()
        except KeyboardInterrupt:
            print(time.monotonic(), flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "blocked"
    time.sleep(0.3)
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=10)
    assert child.returncode == 0
    latency = float(out) - sent
    print(f"Ctrl-C reached the blocked get in {latency * 1000:.1f} ms")
    assert latency < 1.0, "a blocked get is interruptible"


def test_a_get_whose_first_wait_a_signal_ends_goes_on_waiting(q):
    """A blocking get waits first inside the library (Note [a get's first
    wait] in zctipc.queues): a signal that ends that wait runs its handler
    and the get waits on, then returns what comes."""
    hits = []
    old = signal.signal(signal.SIGALRM, lambda *_: hits.append(1))
    signal.setitimer(signal.ITIMER_REAL, 0.0003, 0.0003)  # many times within every brief wait
    late = threading.Timer(0.1, q.put, args=("late",))
    late.start()
    try:
        assert q.get() == "late"
        hits_during = len(hits)
        q.put("again")
        assert q.get() == "again"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        late.join()
    assert hits_during > 0


def test_a_polling_get_gets_what_another_process_puts():
    q = zctipc.Queue(wait="poll", spin=0.001)  # polls 1 ms, then sleeps
    q.set_wait("poll")
    ctx = zctipc.get_context()
    p = ctx.Process(target=_workers.put_later, args=(q, "late", 0.2))
    p.start()
    assert q.get(timeout=30) == "late"
    p.join(30)
    q.set_wait("sleep", spin=0)
    q.put(1)
    assert q.get() == 1
    for bad, exc in [("spin", ValueError), (None, ValueError), (3, ValueError)]:
        with pytest.raises(exc):
            q.set_wait(bad)
    for spin, exc in [(-1, ValueError), ("1", TypeError)]:
        with pytest.raises(exc):
            q.set_wait("poll", spin)
    with pytest.raises(ValueError):
        zctipc.Queue(wait="busy")
    q.close()
    with pytest.raises(zctipc.HandleClosed):
        q.set_wait("poll")


@pytest.mark.parametrize("max_bytes, first, then", [(4096, 2000, 3000), (16 << 20, 6_000_000, 11_000_000)])
def test_an_empty_ring_takes_any_message_that_fits_it(max_bytes, first, then):
    # A message that would run past the end of the ring goes on at its
    # start: after any earlier message, an empty queue takes whatever fits
    # its ring.
    q = zctipc.Queue(max_bytes=max_bytes)
    q.put(b"a" * first)
    assert q.get() == b"a" * first
    assert q.qsize() == 0 and q.empty() and not q.full()
    q.put_nowait(b"b" * then)
    assert q.qsize() == 1 and not q.full()
    assert q.get_nowait() == b"b" * then
    pickled = {"blob": "c" * (then - 100)}  # a pickle, not bytes
    q.put_nowait(pickled)
    assert q.get_nowait() == pickled
    with pytest.raises(ValueError, match="max_bytes"):
        q.put(b"d" * max_bytes)  # more than the ring itself
    q.close()


def test_a_polled_message_is_kept_for_recv():
    # Note [polling a reader]: Pool's shutdown drains its task queue with
    # `while _reader.poll(): _reader.recv()`; another consumer (here another
    # handle on the queue) must not take what poll() saw.
    q = zctipc.Queue()
    other = zctipc.Queue.attach(q.name)
    q.put("task")
    assert q._reader.poll() and q.qsize() == 1 and not q.empty()
    with pytest.raises(queue.Empty):
        other.get(timeout=0.05)
    assert q._reader.poll(), "still there for this reader"
    assert q._reader.recv() == "task"
    assert not q._reader.poll() and q.empty()
    q.put_many([1, 2, 3])
    assert q._reader.poll(timeout=None)
    assert q.get_many() == [1], "the polled message comes first, alone"
    assert q.get_many() == [2, 3]
    other.close()
    q.close()


def test_empty_of_a_closed_queue_is_multiprocessings():
    # As Python 3.13's multiprocessing tests ask: closing a queue this process
    # never put into closes nothing, and empty() still answers; after a put,
    # and for a SimpleQueue always, it raises OSError, as a closed pipe does.
    for cls in (zctipc.Queue, zctipc.JoinableQueue):
        q = cls()
        q.close()
        q.join_thread()
        assert q.empty()
        q = cls()
        q.put("foo")
        q.close()
        q.join_thread()
        with pytest.raises(OSError, match="is closed"):
            q.empty()
    q = zctipc.SimpleQueue()
    q.close()
    with pytest.raises(OSError, match="is closed"):
        q.empty()
    with pytest.raises(ValueError, match="is closed"):  # put and get stay multiprocessing's ValueError
        q.put(1)


@pytest.mark.parametrize("what", ["shared_tensor", "numpy_view", "in_a_list"])
def test_putting_an_unlinked_tensor_raises_and_loses_nothing(q, what):
    """A segment whose name was removed cannot be attached by a receiver:
    the put raises, the queue holds nothing half-sent, and the tensor is
    still usable (its handle holds the memory)."""
    t = zctipc.create_shared_tensor(data=np.arange(6.0))
    t.unlink()
    obj = {"shared_tensor": t, "numpy_view": t.numpy(), "in_a_list": [1, t.numpy()]}[what]
    with pytest.raises(zctipc.SegmentNotFound, match="unlinked"):
        q.put(obj)
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    q.put("after")
    assert q.get(timeout=5) == "after"
    assert t.numpy().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    t.close()
