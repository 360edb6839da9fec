"""The pickling hooks: zctipc memory crosses any standard multiprocessing
channel (multiprocessing.Queue, Pipe, Pool arguments and results) as a
descriptor; everything else pickles as before."""

import gc
import multiprocessing
import subprocess
import sys
import textwrap

import _workers
import numpy as np
import pytest
import torch

import zctipc


def mp_context(ctx):
    return multiprocessing.get_context(ctx.get_start_method())


def test_through_a_multiprocessing_pipe(ctx):
    here, there = ctx.Pipe()
    a = zctipc.empty(4, "int32")
    a[:] = 1
    p = ctx.Process(target=_workers.read_from_pipe, args=(there,))
    p.start()
    here.send(a)
    assert here.poll(60) and here.recv() is True, "the child got zctipc memory"
    p.join(60)
    assert p.exitcode == 0
    assert a[0] == 9, "the child wrote into the same memory"


def test_through_a_multiprocessing_queue(ctx):
    std = mp_context(ctx)
    q, done = std.Queue(), std.Queue()
    t = zctipc.empty(3, torch.float32)
    t[:] = 1
    a = zctipc.empty(2, "float64")
    p = std.Process(target=_workers.modify_tensor, args=(q, done))
    p.start()
    q.put((t, a))
    assert done.get(timeout=60) == ("Tensor", True)
    p.join(60)
    assert t.tolist() == [101.0, 101.0, 101.0] and a[0] == -1


def test_pool_arguments_and_results(ctx):
    a = zctipc.empty(5, "int64")
    a[:] = 2
    with mp_context(ctx).Pool(1) as pool:
        assert pool.apply(_workers.sum_and_is_shared, (a,)) == (10, True)
        result = pool.apply(_workers.return_shared, (4,))
    assert zctipc.is_shared(result), "a result in zctipc memory comes back by descriptor"
    assert result.tolist() == [3, 3, 3, 3]


def test_plain_objects_pickle_as_before(ctx):
    plain = np.arange(6.0)
    assert not zctipc.is_shared(plain)
    with mp_context(ctx).Pool(1) as pool:
        assert pool.apply(_workers.sum_and_is_shared, (plain,)) == (15, False)
        assert pool.apply(_workers.sum_and_is_shared, (np.array([1, 2], dtype=">i4"),)) == (3, False)


def test_shared_tensor_through_a_pipe():
    a, b = multiprocessing.Pipe()
    st = zctipc.create_shared_tensor(data=np.arange(3.0))
    a.send(st)
    got = b.recv()
    assert isinstance(got, zctipc.SharedTensor) and got.name == st.name
    assert st.refcount == 1, "a process counts once"
    got.close()
    st.close()


def test_counts_in_flight_come_back():
    a, b = multiprocessing.Pipe()
    before = zctipc.pool_stats().slots_in_use
    x = zctipc.empty(100)
    a.send(x)
    y = b.recv()
    assert zctipc.pool_stats().slots_in_use == before + 1
    del x, y
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before


def test_torch_multiprocessing_imported_later_keeps_both_ways():
    code = textwrap.dedent("""
        import multiprocessing as mp, zctipc, torch
        import torch.multiprocessing  # registers torch's reducers over ours
        a, b = mp.Pipe()
        t = zctipc.share(torch.ones(4))  # zctipc meets torch again: ours come back on top
        a.send(t)
        got = b.recv()
        print(zctipc.is_shared(got))
        plain = torch.zeros(3)
        a.send(plain)
        got = b.recv()
        # Shared, as torch.multiprocessing shares it: moved into zctipc memory.
        print(zctipc.is_shared(got), got.is_shared(), zctipc.is_shared(plain))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True", "True"]


def test_is_shared_refuses_other_types():
    import pytest

    with pytest.raises(TypeError):
        zctipc.is_shared([1, 2])


@pytest.mark.parametrize("layout", ["coo", "csr", "csc", "bsr"])
def test_sparse_tensors_release_everything_when_dropped(layout):
    import torch

    q = zctipc.Queue()
    dense = torch.tensor([[0.0, 1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 3.0]])
    make = {
        "coo": lambda: dense.to_sparse(),
        "csr": dense.to_sparse_csr,
        "csc": dense.to_sparse_csc,
        "bsr": lambda: dense.to_sparse_bsr((1, 2)),
    }[layout]
    before = zctipc.pool_stats().slots_in_use
    validate = torch._utils._get_sparse_tensors_to_validate()
    pending = len(validate)
    for _ in range(50):
        q.put({"sparse": make()})
        got = q.get()["sparse"]
        assert got.layout == make().layout and torch.equal(got.to_dense(), dense)
        del got
    assert len(validate) == pending, "nothing waits in torch's list of tensors to validate"
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before, "every buffer under the parts went back"
    q.close()


def _replay(data):
    """Load pickle bytes that a parent loaded already (bytes saved and
    replayed in another process)."""
    import pickle

    try:
        pickle.loads(data)
    except zctipc.DescriptorTaken:
        return "taken"
    return "loaded"


@pytest.mark.parametrize("what", ["pool_array", "shared_tensor", "torch_tensor"])
def test_a_pickle_loaded_twice_takes_its_count_once(what):
    """ForkingPickler bytes carry one count: the first load takes it, a
    second load (here or in another process) raises DescriptorTaken instead
    of making a second owner, whose release would free memory the first
    still views (and a new allocation would write into it)."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    before = zctipc.pool_stats().slots_in_use
    if what == "pool_array":
        obj = zctipc.empty(1000, "float64")
        obj[:] = 7.0
    elif what == "shared_tensor":
        obj = zctipc.create_shared_tensor(data=np.full(1000, 7.0))
    else:
        obj = zctipc.empty(1000, torch.float64)
        obj[:] = 7.0
    data = bytes(ForkingPickler.dumps(obj))
    first = pickle.loads(data)
    with pytest.raises(zctipc.DescriptorTaken, match="already taken"):
        pickle.loads(data)
    ctx = zctipc.get_context("spawn")
    with ctx.Pool(1) as p:
        assert p.apply(_replay, (data,)) == "taken", "a replay in another process takes nothing either"
    view = first.numpy() if what == "shared_tensor" else first
    assert (view == 7.0).all()
    if what == "shared_tensor":
        obj.close()
        first.close()
    del obj, first, view
    gc.collect()
    fresh = zctipc.empty(1000, "float64")
    fresh[:] = 1.0
    del fresh
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before
