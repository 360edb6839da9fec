"""Attacks on the one table of reducers (Note [one table of reducers] in
zctipc._wire.reductions) and its channels: a zctipc queue's pickler,
multiprocessing's ForkingPickler, the managers' and Ray's. Import orders,
registration from many threads, subclasses and odd tensors through every
channel, pickles that fail half way, the standard library's managers, and
forked children."""

import io
import json
import multiprocessing
import pickle
import subprocess
import sys
import textwrap
import threading
import warnings
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
from conftest import slots_in_use

import zctipc
from zctipc._wire import reducers, reductions, values

MIB = 1 << 20


def marked(reducer):
    return getattr(reducer, reductions.MARK, False)


def run_python(code, timeout=180):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out


# -- import orders ------------------------------------------------------------------------

# What a fresh process says of its table and of ForkingPickler's reducers,
# after the import order under test.
REPORT = """
import json, sys
from multiprocessing.reduction import ForkingPickler
from zctipc._wire import pickler, reductions

def marked(r):
    return getattr(r, reductions.MARK, False)

report = {}
queue_table = pickler.pickler().pickler.dispatch_table
for mod, attr in [("numpy", "ndarray"), ("torch", "Tensor"), ("torch", "UntypedStorage"),
                  ("pyarrow", "Table"), ("pandas", "DataFrame")]:
    if mod in sys.modules:
        t = getattr(sys.modules[mod], attr)
        report[attr] = [t in reductions.table(), marked(queue_table.get(t)),
                        marked(ForkingPickler._extra_reducers.get(t))]
if "torch" in sys.modules:
    import torch
    from torch.multiprocessing import reductions as torch_mp
    report["fallbacks"] = [reductions.torch_reducers.get("tensor") is torch_mp.reduce_tensor,
                           reductions.torch_reducers.get("storage") is torch_mp.reduce_storage]
    t = torch.arange(4.0)
    report["tensor"] = torch.equal(ForkingPickler.loads(ForkingPickler.dumps(t)), t)
    meta = torch.empty(3, device="meta")  # torch's way: RecursionError if zctipc's were its fallback
    report["meta"] = ForkingPickler.loads(ForkingPickler.dumps(meta)).is_meta
print(json.dumps(report))
"""

ORDERS = {
    "torch, then zctipc": "import torch, zctipc",
    "zctipc, then torch": "import zctipc, torch",
    "torch.multiprocessing, then zctipc": "import torch.multiprocessing, zctipc",
    "zctipc, then torch.multiprocessing": "import zctipc, torch.multiprocessing",
    "numpy, pyarrow and pandas after the first queue": """
        import zctipc
        q = zctipc.Queue(); q.put(1); assert q.get() == 1
        import numpy
        q.put(numpy.arange(3)); q.get()
        import pyarrow, pandas
        q.put(pyarrow.table({"a": [1]})); q.get()
        zctipc.init_reductions()  # the tables join ForkingPickler when asked (its docstring)
        q.close()
    """,
}


@pytest.mark.slow
@pytest.mark.parametrize("order", ORDERS)
def test_every_import_order_gives_every_channel_the_tables_reducers(order):
    out = run_python(textwrap.dedent(ORDERS[order]) + REPORT)
    report = json.loads(out.stdout.splitlines()[-1])
    for name, seen in report.items():
        if name == "fallbacks":
            assert seen == [True, True], "torch.multiprocessing's own reducers are the fallbacks"
        elif name in ("tensor", "meta"):
            assert seen
        else:
            assert seen == [True, True, True], f"{name}: in the table, the queue's pickler, ForkingPickler"
    assert "ndarray" in report
    if "torch" in order:
        assert "Tensor" in report and "UntypedStorage" in report
    else:
        assert "Table" in report and "DataFrame" in report


# -- registering again, from many threads -------------------------------------------------


def test_init_reductions_from_many_threads_at_once():
    errors = []
    barrier = threading.Barrier(8)

    def register():
        try:
            barrier.wait()
            for _ in range(20):
                zctipc.init_reductions()
                reducers.init_torch_reductions()
        except BaseException as exc:  # noqa: BLE001  (any failure is the test's)
            errors.append(exc)

    threads = [threading.Thread(target=register) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    from torch.multiprocessing import reductions as torch_mp

    assert reductions.torch_reducers == {"tensor": torch_mp.reduce_tensor, "storage": torch_mp.reduce_storage}
    assert marked(ForkingPickler._extra_reducers[torch.Tensor])
    t = torch.arange(3.0)
    assert torch.equal(pickle.loads(ForkingPickler.dumps(t)), t) and t.is_shared()


def test_a_reducer_registered_over_zctipcs_never_becomes_its_fallback():
    """A reducer registered over zctipc's that hands on to it (a wrapper)
    was taken for torch's at the next init_reductions: zctipc's then called
    the wrapper for what it leaves to torch, which called zctipc's, for ever."""
    registered = ForkingPickler._extra_reducers
    saved = registered[torch.Tensor]
    calls = []

    def wrapper(t):
        calls.append(t)
        return saved(t)

    ForkingPickler.register(torch.Tensor, wrapper)
    try:
        zctipc.init_reductions()
        assert registered[torch.Tensor] is not wrapper and marked(registered[torch.Tensor])
        assert not marked(reductions.torch_reducers["tensor"]) and reductions.torch_reducers["tensor"] is not wrapper
        meta = torch.empty(3, device="meta")  # torch's to send, as any tensor not on the CPU
        assert pickle.loads(ForkingPickler.dumps(meta)).is_meta  # RecursionError before
    finally:
        ForkingPickler.register(torch.Tensor, saved)


@pytest.mark.slow
def test_patching_torch_from_two_threads_at_once_never_loops():
    """Two threads that both found torch's storage unpatched wrapped each
    other's is_shared: every is_shared() and share_memory_() then called
    itself for ever. The second thread is held, by a trace function, right
    where it found it unpatched, while the first patches."""
    run_python(
        """
        import inspect, sys, threading
        import torch
        import zctipc
        from zctipc._wire import storages

        cls = torch.UntypedStorage
        cls.is_shared, cls.share_memory_ = storages._original_is_shared, storages._original_share_memory_
        storages._original_is_shared = storages._original_share_memory_ = None
        lines, first = inspect.getsourcelines(storages)
        line = next(n for n, text in enumerate(lines, first or 1)
                    if "_original_is_shared, _original_share_memory_ = cls.is_shared" in text)
        at_line, patched = threading.Event(), threading.Event()

        def trace(frame, event, arg):
            if frame.f_code.co_filename != storages.__file__:
                return None
            def local(frame, event, arg):
                if event == "line" and frame.f_lineno == line and not at_line.is_set():
                    at_line.set()
                    patched.wait(1)  # held here, unless the first waits on it
                return local
            return local

        def second():
            sys.settrace(trace)
            storages.patch_torch()
            sys.settrace(None)

        t = threading.Thread(target=second)
        t.start()
        assert at_line.wait(30)
        storages.patch_torch()
        patched.set()
        t.join(30)
        torch.ones(2).is_shared()
        torch.ones(2).share_memory_()
        """
    )


# -- subclasses and odd tensors through every channel ------------------------------------


class UserTensor(torch.Tensor):
    pass


def _sparse(layout, grad=False):
    d = torch.eye(4)
    s = {
        "coo": d.to_sparse,
        "csr": d.to_sparse_csr,
        "csc": d.to_sparse_csc,
        "bsr": lambda: d.to_sparse_bsr((2, 2)),
        "bsc": lambda: d.to_sparse_bsc((2, 2)),
    }[layout]()
    return s.requires_grad_() if grad else s


def _read_only():
    a = np.arange(6.0)
    a.flags.writeable = False
    return a


OBJECTS = {
    "Parameter": lambda: torch.nn.Parameter(torch.arange(4.0)),
    "Parameter without grad": lambda: torch.nn.Parameter(torch.arange(4.0), requires_grad=False),
    "Tensor subclass": lambda: torch.arange(4.0).as_subclass(UserTensor),
    "np.matrix": lambda: np.matrix([[1, 2], [3, 4]]),
    "large np.matrix": lambda: np.matrix(np.ones((512, 512))),
    "MaskedArray": lambda: np.ma.MaskedArray(np.arange(4.0), mask=[0, 1, 0, 1]),
    "large MaskedArray": lambda: np.ma.MaskedArray(np.arange(MIB // 4.0), mask=np.arange(MIB // 4) % 2),
    "recarray": lambda: np.rec.fromarrays([np.arange(3), np.arange(3.0)], names="a,b"),
    "read-only array": _read_only,
    "leaf that requires grad": lambda: torch.arange(4.0, requires_grad=True),
    "non-leaf that requires grad": lambda: torch.arange(4.0, requires_grad=True) * 2,
    "conj view": lambda: torch.arange(4.0).to(torch.complex64).conj(),
    "neg view": lambda: torch._neg_view(torch.arange(4.0)),
    "quantized": lambda: torch.quantize_per_tensor(torch.arange(4.0), 0.1, 0, torch.quint8),
    "meta": lambda: torch.empty(3, device="meta"),
    "FloatStorage": lambda: torch.FloatStorage([1, 2, 3]),
    "TypedStorage": lambda: torch.arange(3.0).storage(),
    "UntypedStorage": lambda: torch.arange(3.0).untyped_storage(),
    "empty UntypedStorage": lambda: torch.UntypedStorage(0),
    "empty FloatStorage": lambda: torch.FloatStorage(),
    "empty array": lambda: np.empty((0, 3)),
    "empty tensor": lambda: torch.empty(0, 3),
    "object array": lambda: np.array([1, "a", None], dtype=object),
    "large object array": lambda: np.array([None] * (MIB // 4), dtype=object),
    "structured array": lambda: np.zeros(3, dtype=[("a", "i4"), ("b", "f8")]),
    "large structured array": lambda: np.zeros(MIB // 8, dtype=[("a", "i4"), ("b", "f8")]),
    **{f"sparse {layout}": (lambda layout=layout: _sparse(layout)) for layout in ("coo", "csr", "csc", "bsr", "bsc")},
    **{
        f"sparse {layout} with grad": (lambda layout=layout: _sparse(layout, True))
        for layout in ("coo", "csr", "csc", "bsr", "bsc")
    },
    "sparse non-leaf": lambda: torch.eye(3).to_sparse().requires_grad_() * 2,
}


@pytest.fixture(scope="module")
def queue():
    q = zctipc.Queue()
    yield q
    q.close()


def through_queue(q, obj):
    q.put(obj)
    return q.get(timeout=30)


def through_forking(obj):
    return pickle.loads(ForkingPickler.dumps(obj))


def through_manager(obj):
    buf = io.BytesIO()
    values._ValuePickler(buf).dump(obj)
    return pickle.loads(buf.getvalue())


def through_ray(obj):
    """Ray's channel as zctipc.ray.put packs it, the transport's tensors
    handed over as copies."""
    zr = pytest.importorskip("zctipc.ray")
    packed = zr._pack(obj)
    return zr._unpack(packed.data, [t.clone() for t in packed.tensors], packed.arrays, packed.refs)


def as_ray_pickles(obj):
    from ray import cloudpickle

    return pickle.loads(cloudpickle.dumps(obj))


def assert_same(a, b):
    """b is what a went as: same type, grad, layout and values."""
    assert type(b) is type(a)
    if isinstance(a, torch.Tensor):
        assert (b.requires_grad, b.layout, b.dtype, b.shape) == (a.requires_grad, a.layout, a.dtype, a.shape)
        if a.is_meta:
            return
        if a.is_quantized:
            a, b = a.dequantize(), b.dequantize()
        a, b = a.detach(), b.detach()
        if a.layout != torch.strided:
            a, b = a.to_dense(), b.to_dense()
        assert torch.equal(a.resolve_conj().resolve_neg(), b.resolve_conj().resolve_neg())
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        if isinstance(a, np.ma.MaskedArray):
            assert np.array_equal(a.mask, b.mask)
        if a.dtype != object:
            assert np.array_equal(np.asarray(a), np.asarray(b))
    else:  # a storage
        assert a.nbytes() == b.nbytes()
        a, b = (s if isinstance(s, torch.UntypedStorage) else s.untyped() for s in (a, b))
        assert bytes(a) == bytes(b)


@pytest.mark.parametrize("channel", ["queue", "forking", "manager", "ray"])
@pytest.mark.parametrize("name", OBJECTS)
def test_subclasses_and_odd_tensors_through_every_channel(queue, channel, name):
    """Each object arrives as it went (its type, grad, layout and values),
    or is refused as torch refuses it; Ray's channel gives what Ray's own
    pickling gives. A tensor that requires grad, a non-leaf too, went
    through zctipc.ray's put as torch.multiprocessing refuses it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obj = OBJECTS[name]()
        if channel == "ray":
            try:
                expected = as_ray_pickles(obj)
            except Exception as exc:  # noqa: BLE001  (Ray cannot pickle it either: the same error)
                with pytest.raises(type(exc)):
                    through_ray(obj)
                return
            got = through_ray(obj)
            assert_same(expected, got)
            return
        send = {"queue": lambda o: through_queue(queue, o), "forking": through_forking, "manager": through_manager}
        if "non-leaf" in name:
            with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
                send[channel](obj)
            return
        if name == "quantized" and channel != "queue":
            # torch's way, through torch.multiprocessing's reducer (which
            # cannot rebuild one in the process that made it).
            table = reductions.bound(values._VALUES if channel == "manager" else reducers.FORKING)
            assert table[torch.Tensor](obj)[0] is reductions.torch_reducers["tensor"](obj)[0]
            return
        got = send[channel](obj)
    assert_same(obj, got)


# -- pickles that fail half way ----------------------------------------------------------


class Boom:
    def __reduce__(self):
        raise RuntimeError("boom")


class Closer:
    """Closes a SharedTensor when it is pickled."""

    def __init__(self, st):
        self.st = st

    def __reduce__(self):
        self.st.close()
        return int, (0,)


def _mp_queue_put(q, obj):
    q.put(obj)
    q.put("after")  # the feeder thread pickles in order: once this is here, obj was tried
    assert q.get(timeout=30) == "after"


@pytest.mark.slow
def test_a_failed_pickle_gives_back_every_count_it_took(queue, capfd):
    """A dump that fails after it exported buffers (an array copied into
    the pool, a tensor's storage, zctipc memory, a SharedTensor) gives
    back their counts, in every channel, and nothing is left taken."""
    here, there = multiprocessing.Pipe()
    mp_queue = multiprocessing.Queue()
    st = zctipc.create_shared_tensor(shape=(1024,), dtype="float32")
    z = zctipc.empty(MIB // 8, "float64")
    channels = {
        "queue": queue.put,
        "forking": ForkingPickler.dumps,
        "manager": lambda obj: values._ValuePickler(io.BytesIO()).dump(obj),
        "pipe": here.send,
        "multiprocessing.Queue": lambda obj: _mp_queue_put(mp_queue, obj),
    }
    try:
        for channel, send in channels.items():
            for fails in (Boom(), torch.arange(2.0, requires_grad=True) * 2):
                before = slots_in_use()
                objs = [np.ones(MIB // 4), [torch.ones(MIB // 4), z], {"st": st, "fails": fails}]
                if channel == "multiprocessing.Queue":
                    send(objs)  # the feeder thread says it failed, on stderr
                else:
                    with pytest.raises(RuntimeError):
                        send(objs)
                del objs
                assert slots_in_use() == before, f"{channel}: a failed dump left pool buffers taken"
                assert st.refcount == 1, f"{channel}: a failed dump left a count on the SharedTensor"
    finally:
        mp_queue.close()
        mp_queue.join_thread()
        here.close()
        there.close()
        st.close()
    assert capfd.readouterr().err.count("RuntimeError: boom") == 1, "the feeder thread said so"


def test_a_shared_tensor_closed_while_its_message_is_pickled(queue):
    """Closed after it was sent, in the same pickle, it arrives (the
    message holds its count); closed before, the put raises HandleClosed
    and takes nothing."""
    st = zctipc.create_shared_tensor(shape=(256,), dtype="float32")
    st.numpy()[:] = 3
    queue.put([st, Closer(st)])
    got, _ = queue.get(timeout=30)
    assert st.closed and got.refcount == 1 and got.numpy()[0] == 3
    got.close()
    before = slots_in_use()
    st = zctipc.create_shared_tensor(shape=(256,), dtype="float32")
    for send in (queue.put, ForkingPickler.dumps):
        with pytest.raises(zctipc.HandleClosed):
            send([np.ones(MIB // 4), Closer(st), st])
    assert slots_in_use() == before and queue.empty()


# -- the standard library's managers -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_the_standard_librarys_manager_still_hands_out_copies(method):
    """multiprocessing.Manager(), with zctipc imported: a value is the
    reader's own copy, as without zctipc (Note [the standard library's
    managers] in zctipc.managers). A client's write reached the stored value,
    and a forked server could not read an array sent by descriptor."""
    zctipc.empty(1)  # the library is loaded: a forked server cannot call it
    with multiprocessing.get_context(method).Manager() as m:
        d = m.dict()
        d["a"] = np.zeros(MIB // 4)
        mine = d["a"]
        mine[0] = 99
        assert d["a"][0] == 0, "a client's write reached the stored value"
        z = zctipc.empty(MIB // 8, "float64")
        z[:] = 1
        d["z"] = z
        z[1] = 7
        assert d["z"][1] == 1, "the sender's write after storing reached the stored value"
        ro = np.ones(MIB // 8)
        ro.flags.writeable = False
        d["ro"] = ro
        copy = d["ro"]
        assert copy.flags.writeable, "a read-only array comes back as a writable copy"
        copy[0] = 5
        assert d["ro"][0] == 1
        if method == "spawn":  # tensors are shared, as torch.multiprocessing shares them
            t = torch.zeros(4)
            d["t"] = t
            d["t"].add_(1)
            assert t[0] == 1


@pytest.mark.slow
def test_zctipcs_manager_hands_out_copies_too():
    with zctipc.Manager() as m:
        d = m.dict()
        d["a"] = np.zeros(MIB // 4)
        mine = d["a"]
        mine[0] = 99
        assert d["a"][0] == 0
        ro = np.ones(MIB // 8)
        ro.flags.writeable = False
        d["ro"] = ro
        assert d["ro"].flags.writeable


# -- forked children ---------------------------------------------------------------------


def _send_from_a_forked_child(objs, out, done):
    """In a child forked after zctipc loaded its library: pickle arrays,
    tensors, storages, tables and the rest (made by the parent: Arrow's
    thread pool does not survive fork) as without zctipc, never calling
    into the library."""
    from zctipc._core import native

    calls = []
    real = native.lib

    def spy():
        calls.append(1)
        return real()

    native.lib = spy
    mentions = [type(o).__name__ for o in objs if b"zctipc" in bytes(ForkingPickler.dumps(o))]
    for o in objs:
        out.put(o)
    out.put((mentions, len(calls)))
    done.wait(60)  # torch's shared memory is fetched from this process


@pytest.mark.slow
def test_a_forked_child_pickles_as_without_zctipc():
    import pandas as pd
    import pyarrow as pa

    zctipc.init_reductions()
    zctipc.empty(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        objs = [  # small tensors: torch copies a large one with threads, which a forked child has not
            np.ones(MIB // 4),
            torch.ones(64),
            torch.ones(3).untyped_storage(),
            torch.ones(4).storage(),
            pa.table({"a": [1, 2]}),
            pd.DataFrame({"a": [1.0, 2.0]}),
            torch.eye(3).to_sparse(),
            torch.nn.Parameter(torch.ones(3)),
        ]
    ctx = multiprocessing.get_context("fork")
    out, done = ctx.Queue(), ctx.Event()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
        p = ctx.Process(target=_send_from_a_forked_child, args=(objs, out, done), daemon=True)
        p.start()
    try:
        got = [out.get(timeout=60) for _ in range(len(objs) + 1)]
    finally:
        done.set()
        p.join(60)
    mentions, calls = got[-1]
    assert mentions == [] and calls == 0, "nothing of zctipc's in the child's pickles, no call into the library"
    assert np.array_equal(got[0], objs[0]) and torch.equal(got[1], objs[1])
    assert got[4].num_rows == 2 and list(got[5]["a"]) == [1.0, 2.0]
    assert type(got[7]) is torch.nn.Parameter and p.exitcode == 0


# -- Ray ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_ray_put_and_get_of_nested_objects():
    """zctipc.ray.put of an object holding tensors, arrays, ObjectRefs and
    what zctipc does not send itself: each comes back as ray.put gives it
    (a non-leaf that requires grad raised), and an object Ray cannot
    pickle raises as ray.put does, leaving no pool buffer taken."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        import zctipc.ray as zr

        inner = ray.put("inner")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = {
                "nest": [(torch.arange(6.0).reshape(2, 3), np.arange(5)), {"deep": [np.ones((3, 3), np.float32)]}],
                "refs": [inner, [inner]],
                "non-leaf": torch.arange(3.0, requires_grad=True) * 2,
                "csr with grad": torch.eye(3).to_sparse_csr().requires_grad_(),
                "quantized": torch.quantize_per_tensor(torch.arange(4.0), 0.1, 0, torch.quint8),
                "objects": np.array([1, "a"], dtype=object),
                "matrix": np.matrix([[1, 2]]),
                "parameter": torch.nn.Parameter(torch.ones(2)),
                "function": lambda x: x + 1,
            }
            got = ray.get(zr.put(obj))
            plain = ray.get(ray.put(obj))
        assert torch.equal(got["nest"][0][0], obj["nest"][0][0]) and np.array_equal(got["nest"][0][1], np.arange(5))
        assert ray.get(got["refs"][0]) == "inner" and ray.get(got["refs"][1][0]) == "inner"
        for key in ("non-leaf", "csr with grad", "quantized", "parameter"):
            assert_same(plain[key], got[key])
        assert type(got["matrix"]) is np.matrix and got["function"](1) == 2
        before = slots_in_use()
        with pytest.raises(TypeError):
            zr.put({"t": torch.ones(3), "lock": threading.Lock()})
        assert zctipc.pool_stats().slots_in_use == before
    finally:
        if started:
            ray.shutdown()
