"""The one table of reducers (Note [one table of reducers] in
zctipc._wire.reductions): every channel, a zctipc queue's pickler,
multiprocessing's ForkingPickler, the managers' and Ray's, takes its
reducers from it, and the channel alone decides how a buffer travels."""

import pickle
import sys
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

import zctipc
from zctipc._wire import exports, pickler, reducers, reductions


def marked(reducer):
    return getattr(reducer, reductions.MARK, False)


def test_the_table_holds_every_type_zctipc_sends_its_own_way():
    table = reductions.table()
    for t in (np.ndarray, torch.Tensor, torch.UntypedStorage, zctipc.SharedTensor, pa.Table, pa.RecordBatch):
        assert t in table, t
    assert pd.DataFrame in table
    assert torch.FloatStorage in table and torch.storage.TypedStorage in table
    assert reductions.table() is table, "built once for the modules imported"


def test_the_queue_pickler_and_forking_pickler_take_the_tables_reducers():
    zctipc.init_reductions()
    queue_table = pickler.pickler().pickler.dispatch_table
    for t in reductions.table():
        assert marked(queue_table[t]), f"the queue pickler's reducer of {t.__name__} is the table's"
        if t.__module__.partition(".")[0] != "torch":
            assert marked(ForkingPickler._extra_reducers[t]), f"ForkingPickler's reducer of {t.__name__}"
    assert marked(ForkingPickler._extra_reducers[torch.Tensor])
    assert marked(ForkingPickler._extra_reducers[torch.UntypedStorage])
    # torch.multiprocessing's are kept for what zctipc leaves to torch.
    assert not marked(reductions.torch_reducers["tensor"])
    assert not marked(reductions.torch_reducers["storage"])


def test_registering_again_never_takes_zctipcs_reducer_for_torchs():
    """A second init finds zctipc's reducers registered: it keeps torch's
    as the fallback (a loop otherwise: zctipc's calling itself)."""
    before = dict(reductions.torch_reducers)
    zctipc.init_reductions()
    reducers.init_torch_reductions()
    assert reductions.torch_reducers == before
    t = torch.arange(4.0)
    assert torch.equal(pickle.loads(ForkingPickler.dumps(t)), t)


def test_a_table_imported_later_joins_every_channel():
    """A module imported after zctipc adds its types to the table, and the
    queue pickler made next takes them."""
    import subprocess

    code = """
import zctipc
from zctipc._wire import pickler, reductions
before = set(reductions.table())
import pyarrow
after = set(reductions.table())
assert pyarrow.Table in after and pyarrow.Table not in before, (before, after)
p = pickler.pickler()
assert getattr(p.pickler.dispatch_table[pyarrow.Table], reductions.MARK, False)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_each_channel_decides_how_an_array_travels():
    small = np.arange(10, dtype=np.float32)
    large = np.ones(reducers.COPY_BYTES // 4, dtype=np.float32)
    # multiprocessing's channel: a small array as NumPy pickles it, a large one by descriptor.
    forking = reductions.bound(reducers.FORKING)[np.ndarray]
    assert forking(small)[0] is not exports.rebuild_in_band
    rebuild, args = forking(large)
    assert rebuild is exports.decode
    got = rebuild(*args)
    assert zctipc.is_shared(got) and np.array_equal(got, large)
    # A queue's: a small array in band as its bytes, a large one out of band beside the pickle.
    p = pickler.pickler()
    payload, out = p.dumps((small, large), inline=4096)
    try:
        assert len(out) == 1 and out[0].shape == large.shape
        assert b"rebuild_in_band" in payload
    finally:
        exports.release_all(out)


def test_zctipc_memory_goes_by_descriptor_in_every_channel_whatever_its_size():
    a = zctipc.empty(3, "int32")
    a[:] = 7
    rebuild, args = reductions.bound(reducers.FORKING)[np.ndarray](a)
    assert rebuild is exports.decode
    got = rebuild(*args)
    got[0] = 1
    assert a[0] == 1, "the same memory"
    payload, out = pickler.pickler().dumps([a], inline=4096)
    assert len(out) == 1
    exports.release_all(out)


def test_the_refusal_of_a_tensor_is_the_same_rule_everywhere():
    """What zctipc does not send of a tensor as its memory is one rule
    (exports.torch_layout): the queue pickles such a tensor as torch does,
    and Ray's transport refuses it with the reason."""
    t = torch.arange(4.0).to(torch.complex64).conj()
    refusal = exports.torch_layout(t)
    assert isinstance(refusal, zctipc.errors.InvalidArgument)
    assert "conjugate or negative view" in str(refusal)
    assert isinstance(exports.torch_layout(torch.zeros(2, dtype=torch.float8_e4m3fn)), zctipc.errors.UnsupportedDtype)
    assert "sparse" in str(exports.torch_layout(torch.zeros(2, 2).to_sparse()))
    assert isinstance(exports.torch_layout(torch.zeros(2, 3)), tuple)
    q = zctipc.Queue()
    try:
        q.put(t)
        got = q.get(timeout=30)
        assert torch.equal(got.resolve_conj(), t.resolve_conj())
    finally:
        q.close()


def test_a_channel_that_takes_objects_whole_sees_them_first():
    taken = []

    class Whole(reductions.Channel):
        def whole(self, obj):
            taken.append(obj)
            return (str, ("taken",))

    table = reductions.bound(Whole())
    a, t = np.zeros(2), torch.zeros(2)
    assert table[np.ndarray](a) == (str, ("taken",)) and table[torch.Tensor](t) == (str, ("taken",))
    assert taken == [a, t]


@pytest.mark.parametrize("kind", ["csr", "coo"])
def test_sparse_tensors_go_as_their_parts_through_multiprocessing_too(kind):
    dense = torch.eye(3)
    s = dense.to_sparse_csr() if kind == "csr" else dense.to_sparse()
    rebuild, args = reductions.bound(reducers.FORKING)[torch.Tensor](s)
    assert rebuild is reductions.rebuild_sparse
    got = pickle.loads(ForkingPickler.dumps(s))
    assert torch.equal(got.to_dense(), dense)
