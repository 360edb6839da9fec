"""torch.multiprocessing's sharing semantics for CPU tensors: a tensor sent
through a zctipc queue, a multiprocessing channel or a child's arguments is
shared with the receiver, not copied; tensors of one storage arrive over
one storage; a tensor in torch's own shared memory goes without a copy;
is_shared() and share_memory_() know zctipc memory. NumPy arrays keep
their rule (one copy into the pool)."""

import gc
import multiprocessing
import pickle
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest
import torch

import zctipc

pytestmark = pytest.mark.slow

GET = 60  # seconds any get may wait for a child


# -- the children's side (top level, for spawn and forkserver) ----------------


def _write_then_read(inq, outq):
    """Write into what arrives, say so, then report what the producer wrote."""
    t = inq.get()
    d = inq.get()
    t[0] = 100
    d["x"][0] = 200
    outq.put("written")
    assert inq.get() == "go"
    outq.put((t[1].item(), d["x"][1].item()))


def _views(inq, outq):
    vs = inq.get()
    same = all(v.untyped_storage() is vs[0].untyped_storage() for v in vs)
    layout = [(v.storage_offset(), tuple(v.shape), v.stride()) for v in vs]
    vs[1][0] = -7  # the producer's base[2]
    outq.put((same, layout, vs[0][2].item(), vs[2][0, 1].item()))


def _fill_each(inq, outq, n):
    """Take n messages; report each one's layout and values, then fill every
    tensor in it with -1."""
    for _ in range(n):
        obj = inq.get()
        ts = obj if isinstance(obj, list) else [obj]
        outq.put([(t.tolist(), tuple(t.shape), t.stride(), t.storage_offset(), str(t.dtype)) for t in ts])
        for t in ts:
            t.fill_(-1)
    outq.put("filled")


def _first_gets_last(inq, outq):
    """Take a dict of tensors; report their dtypes, then copy each one's
    last element into its first."""
    d = inq.get()
    outq.put({k: str(v.dtype) for k, v in d.items()})
    for v in d.values():
        v[0] = v[-1]
    outq.put("written")


def _grad_leafs(inq, outq):
    ts = [inq.get(), inq.get()[0]]
    outq.put([(t.requires_grad, t.is_leaf) for t in ts])
    with torch.no_grad():
        for t in ts:
            t.add_(1)
    outq.put("written")


def _write_args(t, view, outq):
    t[0] = 1
    view[0] = 2  # the parent's t[2]
    outq.put((view.untyped_storage() is t.untyped_storage(), view.storage_offset()))


def _write_array(inq, outq):
    a = inq.get()
    a[0] = 1
    outq.put("written")


def _run(ctx, target, *args):
    p = ctx.Process(target=target, args=args)
    p.start()
    return p


def _join(p):
    p.join(GET)
    assert p.exitcode == 0


# -- queues -----------------------------------------------------------------


def test_an_ordinary_cpu_tensor_put_into_a_queue_is_shared_not_copied():
    """The issue: "An ordinary CPU tensor put into zctipc.Queue arrives as
    a copy"."""
    q = zctipc.Queue()
    try:
        t = torch.arange(6.0)
        q.put(t)
        got = q.get()
        got[0] = 42
        assert t[0] == 42, "the receiver's write is the sender's"
        t[5] = -5
        assert got[5] == -5, "and the sender's the receiver's"
        q.put({"t": t, "n": 1})
        got = q.get()["t"]
        got[1] = 43
        assert t[1] == 43
    finally:
        q.close()


OLD_TORCH = textwrap.dedent("""
    import pickle, sys
    import torch
    from multiprocessing.reduction import ForkingPickler
    torch.UntypedStorage._swap_data_ptr_ = None  # as torch before 2.12 has none
    import zctipc
    from zctipc._wire import storages
    assert not storages.can_move()
    q = zctipc.Queue()
    big, small = torch.arange(1 << 18, dtype=torch.float32), torch.arange(8.0)
    where = big.untyped_storage().data_ptr()
    q.put(big)  # a bare tensor
    q.put({"a": small[:4], "b": small[2:]})  # pickled: two views of one storage
    got, views = q.get(timeout=60), q.get(timeout=60)
    big[0] = -1.0
    views["a"][2] = 50.0
    shared = ForkingPickler.loads(bytes(ForkingPickler.dumps(small)))  # a channel torch uses too
    shared[0] = 60.0
    print(pickle.dumps(dict(
        stayed=big.untyped_storage().data_ptr() == where and not storages.is_zctipc(big.untyped_storage()),
        equal=bool(torch.equal(got[1:], big[1:])), copy=got[0].item(), received=got.is_shared(),
        one_storage=views["b"][0].item(), sender=small[2].item(),
        torch_way=storages.is_torch_shared(small.untyped_storage()), channel=small[0].item(),
    )).hex())
""")


def test_a_torch_that_cannot_move_storages_copies_them_into_a_message(isolated):
    """Under torch before 2.12 (no UntypedStorage._swap_data_ptr_), a put
    copies an ordinary tensor's storage into the pool, and the storage stays
    where it was; a channel torch uses too shares it torch's way (Note [a
    torch that cannot move storages])."""
    out = subprocess.run([sys.executable, "-c", OLD_TORCH], env=isolated, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = pickle.loads(bytes.fromhex(out.stdout.split()[-1]))
    assert got["stayed"], "the sender's storage was not moved"
    assert got["equal"] and got["copy"] == 0.0, "the receiver holds a copy: the sender's write is not in it"
    assert got["received"], "in zctipc memory"
    assert got["one_storage"] == 50.0, "two views of one storage arrive over one storage"
    assert got["sender"] == 2.0, "a copy of it"
    assert got["torch_way"] and got["channel"] == 60.0, "through a channel torch uses, shared torch's way"


def test_a_moved_tensor_gives_its_buffer_back_when_dropped():
    q = zctipc.Queue()
    try:
        zctipc.empty(1)  # the pool exists
        before = zctipc.pool_stats().slots_in_use
        t = torch.ones(1000)
        q.put({"t": t, "view": t[10:]})
        got = q.get()
        assert zctipc.pool_stats().slots_in_use == before + 1, "one buffer for the storage"
        del t
        gc.collect()
        assert got["view"][0] == 1 and zctipc.pool_stats().slots_in_use == before + 1, "the receiver holds it"
        del got
        gc.collect()
        assert zctipc.pool_stats().slots_in_use == before
    finally:
        q.close()


def test_writes_are_seen_both_ways(ctx):
    q, out = ctx.Queue(), ctx.Queue()
    p = _run(ctx, _write_then_read, q, out)
    t, x = torch.zeros(4), torch.zeros(4, dtype=torch.float64)
    q.put(t)  # bare: a tensor record
    q.put({"x": x})  # pickled
    assert out.get(timeout=GET) == "written"
    assert t[0] == 100 and x[0] == 200, "the consumer's writes are the producer's"
    t[1], x[1] = 5, 6
    q.put("go")
    assert out.get(timeout=GET) == (5.0, 6.0), "and the producer's the consumer's"
    _join(p)
    assert t.is_shared() and zctipc.is_shared(t) and zctipc.is_shared(x)


def test_views_of_one_storage_arrive_over_one_storage(ctx):
    q, out = ctx.Queue(), ctx.Queue()
    p = _run(ctx, _views, q, out)
    base = torch.arange(24.0)
    views = [base, base[2:10], base.view(4, 6).t(), base[1::3]]
    q.put(views)
    same, layout, seen, through_t = out.get(timeout=GET)
    _join(p)
    assert same, "one storage in the receiver"
    assert layout == [(v.storage_offset(), tuple(v.shape), v.stride()) for v in views]
    assert seen == -7, "a write through one view is read through another"
    assert through_t == 6.0, "the transposed view reads what it read here"
    assert base[2] == -7, "and the producer sees it"


def test_a_tensor_in_torch_shared_memory_is_shared_through_a_queue(ctx):
    """In a zctipc message it is moved into the pool, which the message
    holds (Note [torch's shared memory in a message]); sender and receiver
    still write the same memory."""
    q, out = ctx.Queue(), ctx.Queue()
    p = _run(ctx, _fill_each, q, out, 2)
    t = torch.zeros(5).share_memory_()
    u = torch.zeros(3, dtype=torch.int32).share_memory_()
    assert t.is_shared() and not zctipc.is_shared(t)
    q.put(t)
    q.put([u, u[1:]])
    assert out.get(timeout=GET)[0][0] == [0.0] * 5
    assert out.get(timeout=GET)[1][:2] == ([0, 0], (2,))
    assert out.get(timeout=GET) == "filled"
    _join(p)
    assert t.tolist() == [-1.0] * 5 and u.tolist() == [-1] * 3, "the consumer wrote into the same memory"
    assert zctipc.is_shared(t) and zctipc.is_shared(u) and t.is_shared()


def test_a_tensor_in_torch_shared_memory_goes_without_a_copy_through_multiprocessing():
    mp = multiprocessing.get_context("spawn")
    q, out = mp.Queue(), mp.Queue()
    p = _run(mp, _fill_each, q, out, 1)
    t = torch.zeros(5).share_memory_()
    ptr = t.data_ptr()
    q.put(t)
    assert out.get(timeout=GET)[0][0] == [0.0] * 5
    assert out.get(timeout=GET) == "filled"
    _join(p)
    assert t.tolist() == [-1.0] * 5, "the consumer wrote into the same memory"
    assert t.data_ptr() == ptr and not zctipc.is_shared(t), "not moved: torch's way, in torch's channels"


def _share_and_put(q, bare):
    t = torch.arange(10.0).share_memory_()
    q.put(t if bare else {"t": t, "view": t[2:]})


@pytest.mark.parametrize("bare", [True, False], ids=["bare", "in-a-dict"])
def test_a_share_memory_tensor_in_a_message_outlives_its_producer(bare):
    """A message holds what it carries: a share_memory_() tensor put by a
    process that exits before the get still arrives (torch's own route
    raised FileNotFoundError)."""
    ctx = zctipc.get_context("forkserver")
    q = ctx.Queue()
    try:
        p = _run(ctx, _share_and_put, q, bare)
        _join(p)
        got = q.get(timeout=GET)
        t = got if bare else got["t"]
        assert t.tolist() == list(range(10))
        if not bare:
            assert got["view"].untyped_storage() is t.untyped_storage()
            got["view"][0] = -1
            assert t[2] == -1
    finally:
        q.close()


def _write_storages(inq, outq):
    """Write 7 at the start of everything that arrives, and say how the
    typed storage and the tensors of the first message lie."""
    data = inq.get()
    outq.put([type(s).__name__ for s in data[:3]])
    outq.put(all(t.untyped_storage() is data[0]._untyped_storage for t in data[3:]))
    for s in data[:3]:
        s[0] = 7
    outq.put("written")


@pytest.mark.parametrize("channel", ["zctipc", "multiprocessing"])
def test_storages_are_shared_not_copied(channel):
    """x.storage(), torch.FloatStorage and torch.UntypedStorage are shared
    as torch.multiprocessing shares them (its test_fd_preserve_sharing): the
    receiver's writes reach the sender, and tensors sent beside a storage
    arrive over it."""
    ctx = zctipc.get_context("forkserver") if channel == "zctipc" else multiprocessing.get_context("forkserver")
    q, out = ctx.Queue(), ctx.Queue()
    p = _run(ctx, _write_storages, q, out)
    x = torch.zeros(5, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        typed, legacy = x.storage(), torch.FloatStorage(4)
    legacy.fill_(0)
    untyped = torch.UntypedStorage(8)
    untyped.fill_(0)
    q.put([typed, legacy, untyped, x, x[2], x[:, 1]])
    assert out.get(timeout=GET) == ["TypedStorage", "TypedStorage", "UntypedStorage"]
    assert out.get(timeout=GET), "the tensors arrived over the storage sent beside them"
    assert out.get(timeout=GET) == "written"
    _join(p)
    assert x[0, 0] == 7 and legacy[0] == 7 and untyped[0] == 7, "the receiver's writes are the sender's"


def test_non_contiguous_tensors(ctx):
    q, out = ctx.Queue(), ctx.Queue()
    p = _run(ctx, _fill_each, q, out, 3)
    a = torch.arange(12.0).view(3, 4)
    at = a.t()
    b = torch.arange(20, dtype=torch.int64)
    stepped = b[1::3]
    c = torch.arange(30.0).view(5, 6)
    block = c[1:4, 2:5]
    # (the child writes into them: what it must see is taken first)
    expected = [
        [(t.tolist(), tuple(t.shape), t.stride(), t.storage_offset(), str(t.dtype)) for t in ts]
        for ts in ([at], [stepped], [block, c[::2, ::3]])
    ]
    expected[1][0] = expected[1][0][:3] + (0,) + expected[1][0][4:]  # bare: over its own elements
    q.put(at)  # bare
    q.put(stepped)  # bare
    q.put([block, c[::2, ::3]])  # pickled: over the whole storage
    for want in expected:
        assert out.get(timeout=GET) == want
    assert out.get(timeout=GET) == "filled"
    _join(p)
    assert (a == -1).all(), "the whole transposed tensor was written"
    assert (stepped == -1).all() and b[0] == 0 and b[2] == 2, "only the stepped elements"
    assert (block == -1).all() and c[0, 0] == -1 and c[0, 1] == 1 and c[1, 1] == 7


def test_views_of_zctipc_memory_go_bare_as_they_lie(ctx):
    """Tensors over pool buffers go by descriptor in one call into the
    library (Queue._put_tensor): transposed, stepped, offset to the
    buffer's last element, expanded and a block, each arriving over the
    sender's elements with its own shape and strides."""
    q, out = ctx.Queue(), ctx.Queue()
    bases = [zctipc.empty(48, torch.float32).copy_(torch.arange(48.0)) for _ in range(5)]
    sent = [
        bases[0].view(6, 8).t(),
        bases[1][1::5],
        bases[2][40:],
        bases[3][47:].expand(3, 4),
        bases[4].view(6, 8)[2:5, 3:7],
    ]
    expected = [[(t.tolist(), tuple(t.shape), t.stride(), 0, str(t.dtype))] for t in sent]
    p = _run(ctx, _fill_each, q, out, len(sent))
    for t in sent:
        q.put(t)
    for want in expected:
        assert out.get(timeout=GET) == want
    assert out.get(timeout=GET) == "filled"
    _join(p)
    assert (bases[0] == -1).all(), "the whole transposed tensor was written"
    for base, t in zip(bases[1:], sent[1:], strict=True):
        assert (t == -1).all(), "written through what arrived"
        covered = torch.as_strided(torch.arange(48), t.shape, t.stride(), t.storage_offset()).unique().numel()
        assert int((base == -1).sum()) == covered, "and nothing else"


def test_empty_tensors(ctx):
    q, out = ctx.Queue(), ctx.Queue()
    p = _run(ctx, _fill_each, q, out, 4)
    sent = [torch.empty(0), torch.empty(0, 3, dtype=torch.int16), torch.arange(5.0)[5:], torch.empty(2, 0)]
    q.put(sent[0])
    q.put(sent[1])
    q.put(sent[2])
    q.put([sent[3], sent[0]])
    for ts in ([sent[0]], [sent[1]], [sent[2]], [sent[3], sent[0]]):
        got = out.get(timeout=GET)
        assert [(g[1], g[4]) for g in got] == [(tuple(t.shape), str(t.dtype)) for t in ts]
    assert out.get(timeout=GET) == "filled"
    _join(p)


DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.uint16,
    torch.uint32,
    torch.uint64,
]


def test_every_dtype(ctx):
    q, out = ctx.Queue(), ctx.Queue()
    p = _run(ctx, _first_gets_last, q, out)
    sent = {}
    for dt in DTYPES:
        name = str(dt).removeprefix("torch.")
        if dt is torch.bool:
            sent[name] = torch.tensor([False, False, True])
        else:
            sent[name] = torch.tensor([1, 2, 3]).to(dt)
    q.put(sent)
    assert out.get(timeout=GET) == {k: str(v.dtype) for k, v in sent.items()}
    assert out.get(timeout=GET) == "written"
    _join(p)
    for name, t in sent.items():
        assert t[0].item() == t[2].item(), name


@pytest.mark.parametrize("dt", [torch.bool, torch.bfloat16, torch.int16, torch.complex128], ids=str)
def test_dtypes_as_bare_tensors(dt):
    q = zctipc.Queue()
    try:
        t = torch.zeros(4, dtype=dt)
        q.put(t)
        got = q.get()
        assert got.dtype == dt
        got[1] = 1
        assert t[1].item() == 1
    finally:
        q.close()


def test_requires_grad_leafs_keep_requires_grad(ctx):
    q, out = ctx.Queue(), ctx.Queue()
    p = _run(ctx, _grad_leafs, q, out)
    w = torch.ones(3, requires_grad=True)
    v = torch.zeros(2, requires_grad=True)
    q.put(w)
    q.put([v])
    assert out.get(timeout=GET) == [(True, True), (True, True)]
    assert out.get(timeout=GET) == "written"
    _join(p)
    assert w.tolist() == [2.0, 2.0, 2.0] and v.tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError, match="non-leaf"):
        q.put(w * 2)
    q.close()
    out.close()


def test_a_tensor_in_a_childs_arguments_is_shared(ctx):
    out = ctx.Queue()
    t = torch.zeros(6)
    p = _run(ctx, _write_args, t, t[2:], out)
    assert out.get(timeout=GET) == (True, 2), "the view came over the same storage"
    _join(p)
    assert t.tolist() == [1.0, 0.0, 2.0, 0.0, 0.0, 0.0], "the child wrote into the parent's tensor"
    assert zctipc.is_shared(t) and t.is_shared()


def test_through_a_pipe_views_share_one_storage():
    a, b = multiprocessing.Pipe()
    t = torch.arange(8.0)
    a.send((t, t[3:], t.view(2, 4).t()))
    x, y, z = b.recv()
    assert x.untyped_storage() is y.untyped_storage() is z.untyped_storage()
    assert (y.storage_offset(), z.stride()) == (3, (1, 4))
    y[0] = -3
    assert t[3] == -3 and x[3] == -3 and z[3, 0] == -3


def test_conjugate_and_negative_views_read_as_they_did():
    q = zctipc.Queue()
    try:
        z = torch.tensor([1 + 2j, 3 - 1j])
        c = z.conj()  # the conjugate bit over z's storage
        im = c.imag  # the negative bit
        q.put([z, c, im])
        gz, gc, gim = q.get()
        assert gc.is_conj() and gc.tolist() == c.tolist() and gim.tolist() == im.tolist() == [-2.0, 1.0]
        assert gz.untyped_storage() is gc.untyped_storage() is gim.untyped_storage()
        gz[0] = 5 + 5j
        assert z[0] == 5 + 5j and c[0] == 5 - 5j and gc[0] == 5 - 5j
        shared = zctipc.empty(2, torch.complex64)
        shared[:] = z
        q.put(shared.conj())  # bare, zctipc memory: it must not lose the bit
        got = q.get()
        assert got.tolist() == shared.conj().tolist()
    finally:
        q.close()


def test_threads_sending_one_tensor_move_it_once():
    q = zctipc.Queue()
    try:
        for _ in range(20):
            t = torch.zeros(1000)
            views = [t[k:] for k in range(8)]
            start = threading.Barrier(8)

            def put(v):
                start.wait()  # noqa: B023 (the threads are joined in this iteration)
                q.put(v)

            threads = [threading.Thread(target=put, args=(v,)) for v in views]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            got = [q.get() for _ in views]
            for g in got:
                g[-1] += 1  # the last element of every view is t[999]
            assert t[999] == 8, "every receiver writes the one memory"
            assert all(v.data_ptr() == t.data_ptr() + 4 * k for k, v in enumerate(views))
    finally:
        q.close()


# -- is_shared and share_memory_ ---------------------------------------------


def test_is_shared_knows_zctipc_memory():
    t = zctipc.empty(3, torch.float32)
    assert t.is_shared() and t[1:].is_shared() and zctipc.is_shared(t)
    assert zctipc.empty(2, torch.bfloat16).is_shared()
    plain = torch.ones(3)
    assert not plain.is_shared() and not zctipc.is_shared(plain)
    q = zctipc.Queue()
    try:
        q.put(plain)
        got = q.get()
        assert plain.is_shared() and zctipc.is_shared(plain), "moved into zctipc memory when put"
        assert got.is_shared() and zctipc.is_shared(got)
    finally:
        q.close()


def test_share_memory_keeps_zctipc_memory_where_it_is():
    t = zctipc.empty(4, torch.float32)
    t[:] = 3
    ptr = t.data_ptr()
    assert t.share_memory_() is t
    assert t.data_ptr() == ptr and zctipc.is_shared(t) and t.tolist() == [3.0] * 4
    t.untyped_storage().share_memory_()
    assert t.data_ptr() == ptr and zctipc.is_shared(t)
    plain = torch.ones(2)
    plain.share_memory_()  # torch's own, as before
    assert plain.is_shared() and not zctipc.is_shared(plain)


def test_a_stream_view_is_copied_not_moved():
    stream = zctipc.Stream.create(shape=(4,), dtype=np.float32, frames=2)
    try:
        with stream.writer() as w:
            frame = w.look(torch=True)
            frame[:] = 1
            q = zctipc.Queue()
            try:
                q.put(frame)
                got = q.get()
                got[0] = 9
                q.put([frame])
                got2 = q.get()[0]
                got2[1] = 9
            finally:
                q.close()
            frame[2] = 5
            assert frame.tolist() == [1.0, 1.0, 5.0, 1.0], "the writer's view is still the stream's slot"
            assert w.look(torch=True) is frame
            assert got.tolist() == [9.0, 1.0, 1.0, 1.0] and got2.tolist() == [1.0, 9.0, 1.0, 1.0]
    finally:
        stream.close()


# -- NumPy keeps its rule ------------------------------------------------------


def test_numpy_arrays_are_still_copied(ctx):
    q, out = ctx.Queue(), ctx.Queue()
    p = _run(ctx, _write_array, q, out)
    a = np.zeros(3)
    q.put(a)
    assert out.get(timeout=GET) == "written"
    _join(p)
    assert a[0] == 0, "a plain array goes as one copy"
    assert not zctipc.is_shared(a)


# -- a tensor's route does not depend on the order of imports -----------------

_ROUTE = """
import sys
for step in sys.argv[1].split(","):
    if step == "load":
        import zctipc
        zctipc.Queue().close()  # the library is loaded
    else:
        __import__(step)
import torch
import zctipc
from multiprocessing.reduction import ForkingPickler
from zctipc._core import memory, native
from zctipc._wire import records, reducers

q = zctipc.Queue()
q.put(torch.ones(1024))
s = records.Scratch()
lib = native.lib()
r = lib.zct_queue_take(q._handle, s.buf, s.cap, 10000, s.views, s.vcap, s.nviews)
assert r >= 0, r
for i in range(s.nviews[0]):
    memory.release_ref(s.views[i].ref)
q.close()
print(r >> lib.ZCT_TAKE_TYPE_SHIFT, getattr(ForkingPickler._extra_reducers.get(torch.Tensor), "_zctipc_reducer", False))
"""


@pytest.mark.parametrize(
    "order", ["torch,zctipc", "zctipc,torch", "numpy,zctipc,torch", "zctipc,numpy,torch", "numpy,zctipc,load,torch"]
)
def test_a_bare_tensor_goes_as_a_tensor_record_whatever_was_imported_first(order):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _ROUTE, order], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "True"], "a tensor record (ZCT_RECORD_TENSOR), zctipc's reducer"


# -- the finder that meets torch, among other import hooks --------------------

_FINDERS = """
import sys
import warnings


class Delegating:
    '''An import hook that asks every other finder, as import hooks that
    wrap modules (lazy importers, type checkers' claws) do.'''

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    return spec
        return None


class Failing:
    def find_spec(self, name, path=None, target=None):
        if name.startswith("torch"):
            raise ImportError(f"refused {name}")


import multiprocessing

multiprocessing.set_start_method("spawn")  # chosen: zctipc need not warn
import zctipc

for where in sys.argv[1].split(","):
    if where == "front":
        sys.meta_path.insert(0, Delegating())
    elif where == "behind":
        sys.meta_path.insert(1, Delegating())
    elif where == "failing-last":
        sys.meta_path.append(Failing())
    elif where == "numpy":
        import numpy as np

        q = zctipc.Queue()
        q.put(np.ones(4))
        q.get()
        q.close()
        assert "torch" not in sys.modules, "zctipc imported torch itself"
        print("no-torch", end=" ")
        sys.exit(0)
import torch
from multiprocessing.reduction import ForkingPickler
from zctipc._wire import reducers

print(getattr(ForkingPickler._extra_reducers.get(torch.Tensor), "_zctipc_reducer", False), end=" ")
import multiprocessing.managers  # zctipc's other watched module: then nothing is left to watch

print(sum(type(f).__name__ == "_Watch" for f in sys.meta_path))
"""


@pytest.mark.parametrize("hooks", ["front", "behind", "front,failing-last", "failing-last", "numpy"])
def test_torch_is_met_among_other_import_hooks(hooks):
    """Another finder in front of zctipc's or behind it that asks the
    others (zctipc's asked it back, without end: a RecursionError made
    ``import torch`` fail), one that fails, and a program that never
    imports torch (zctipc does not import it either); under -W error."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", _FINDERS, hooks],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == (["no-torch"] if hooks == "numpy" else ["True", "0"]), "registered, and gone"
