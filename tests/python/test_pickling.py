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
from conftest import slots_in_use

import zctipc
from zctipc._wire import reducers


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


@pytest.mark.slow
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
    before = slots_in_use()
    x = zctipc.empty(100)
    a.send(x)
    y = b.recv()
    assert zctipc.pool_stats().slots_in_use == before + 1
    del x, y
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before


@pytest.mark.slow
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


@pytest.mark.slow
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
    before = slots_in_use()
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


@pytest.mark.parametrize("channel", ["pipe", "queue"])
def test_a_refused_pickle_gives_back_the_buffers_it_took(channel):
    """A non-leaf tensor that requires grad is refused after the tensors and
    arrays before it took pool buffers: a pickle that was never made gives
    their counts back (Note [counts of a failed dump])."""
    import torch

    zctipc.empty(1)  # the pool exists
    before = slots_in_use()
    leaf = torch.ones(4, requires_grad=True)
    a, b = multiprocessing.Pipe()
    q = zctipc.Queue()
    for make in (
        lambda: [torch.ones(3), np.ones(reducers.COPY_BYTES), leaf * 2],
        lambda: {"x": torch.ones(5), "shared": zctipc.empty(8), "y": leaf * 2},
        lambda: [torch.eye(3).to_sparse(), leaf * 2],
    ):
        with pytest.raises(RuntimeError, match="non-leaf tensor which requires_grad"):
            a.send(make()) if channel == "pipe" else q.put(make())
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before
    q.close()


@pytest.mark.parametrize("layout", ["coo", "csr", "csc", "bsr"])
def test_a_sparse_leaf_that_requires_grad_is_sent(layout):
    import torch

    dense = torch.tensor([[0.0, 1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 3.0]])
    make = {
        "coo": lambda: dense.to_sparse(),
        "csr": dense.to_sparse_csr,
        "csc": dense.to_sparse_csc,
        "bsr": lambda: dense.to_sparse_bsr((1, 2)),
    }[layout]
    q = zctipc.Queue()
    zctipc.empty(1)
    before = slots_in_use()
    q.put([make().requires_grad_()])
    (got,) = q.get()
    assert got.requires_grad and got.is_leaf and got.layout == make().layout
    assert torch.equal(got.detach().to_dense(), dense)
    del got
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before
    q.close()


class _Refused:
    """An object whose pickling raises, as an unpicklable one does."""

    def __reduce__(self):
        raise RuntimeError("refused")


def _carriers():
    """One of each thing a ForkingPickler pickle carries a count for."""
    return [
        np.ones(reducers.COPY_BYTES // 8),
        torch.ones(3),
        zctipc.empty(8),
        torch.ones(2).untyped_storage(),
        torch.ones(4, 4)[1:],
    ]


@pytest.mark.parametrize("where", range(6))
def test_a_dump_refused_at_any_position_gives_back_every_count(where):
    """However many descriptors a message made before the object that fails,
    none stays in use; a message made of the same parts then travels."""
    zctipc.empty(1)
    a, b = multiprocessing.Pipe()
    before = slots_in_use()
    message = _carriers()
    message.insert(where, _Refused())
    with pytest.raises(RuntimeError, match="refused"):
        a.send({"nested": [message]})
    del message
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before
    a.send(_carriers())
    got = b.recv()
    assert got[0].sum() == reducers.COPY_BYTES // 8 and torch.equal(got[4], torch.ones(3, 4))
    del got
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before


class _SendsWhenPickled:
    """An object whose reduction sends an array through a pipe before it
    returns, as a manager proxy's call from a reducer would: a pickle made,
    and sent, while another is being made."""

    def __init__(self, conn, array):
        self.conn, self.array = conn, array

    def __reduce__(self):
        self.conn.send(self.array)
        return int, (0,)


@pytest.mark.slow
def test_a_pickle_sent_during_a_dump_that_fails_keeps_its_counts():
    """A dump made (and sent) inside another keeps its counts when the outer
    one fails: the receiver holds its descriptor. The outer dump gave them
    back, and the receiver read a stale slot, or another message's bytes."""
    zctipc.empty(1)
    a, b = multiprocessing.Pipe()
    before = slots_in_use()
    array = np.full(reducers.COPY_BYTES // 8, 3.0)
    with pytest.raises(RuntimeError, match="refused"):
        multiprocessing.reduction.ForkingPickler.dumps([_SendsWhenPickled(a, array), _Refused()])
    a.send(np.full(reducers.COPY_BYTES // 8, 4.0))  # would take the slot given back
    got, other = b.recv(), b.recv()
    assert (got == 3.0).all() and (other == 4.0).all()
    del got, other
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before


@pytest.mark.slow
def test_a_refused_value_sent_to_a_manager_gives_back_its_counts():
    """A value that cannot be pickled, stored into a manager's dict after
    a large array, leaves no pool buffer in use; the manager goes on."""
    zctipc.empty(1)
    before = slots_in_use()
    with zctipc.Manager() as m:
        d = m.dict()
        for where in range(2):
            value = [np.ones(reducers.COPY_BYTES // 8)]
            value.insert(where, _Refused())
            with pytest.raises(RuntimeError, match="refused"):
                d["x"] = value
            gc.collect()
            assert zctipc.pool_stats().slots_in_use == before
        d["x"] = np.ones(reducers.COPY_BYTES // 8)
        assert d["x"].sum() == reducers.COPY_BYTES // 8
        del d["x"]
        gc.collect()
        assert zctipc.pool_stats().slots_in_use == before


_MANAGER_FIRST = """
import gc, zctipc
import numpy as np
from zctipc._wire import reducers

class Refused:
    def __reduce__(self):
        raise RuntimeError("refused")

if __name__ == "__main__":
    with zctipc.Manager() as m:
        d = m.dict()
        try:
            d["x"] = [np.ones(reducers.COPY_BYTES // 8), Refused()]
        except RuntimeError:
            pass
        gc.collect()
        print(zctipc.pool_stats().slots_in_use)
"""


@pytest.mark.slow
def test_a_refused_value_sent_to_a_manager_first_gives_back_its_counts(tmp_path):
    """The same before zctipc has made anything in the process (NumPy
    imported after zctipc: ForkingPickler's dump was not yet zctipc's when
    the manager's connection began its pickle, and its counts stayed)."""
    script = tmp_path / "manager_first.py"
    script.write_text(_MANAGER_FIRST)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"]


def _replay(data):
    """Load pickle bytes that a parent loaded already (bytes saved and
    replayed in another process)."""
    import pickle

    try:
        pickle.loads(data)
    except zctipc.DescriptorTaken:
        return "taken"
    return "loaded"


@pytest.mark.slow
@pytest.mark.parametrize("what", ["pool_array", "shared_tensor", "torch_tensor"])
def test_a_pickle_loaded_twice_takes_its_count_once(what):
    """ForkingPickler bytes carry one count: the first load takes it, a
    second load (here or in another process) raises DescriptorTaken instead
    of making a second owner, whose release would free memory the first
    still views (and a new allocation would write into it)."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    before = slots_in_use()
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
