"""SharedTensor: creation, attachment, views and their lifetime, in one process."""

import ctypes
import gc
import os
import pickle
import stat

import numpy as np
import pytest
import torch
from conftest import SHM, segment_exists, slots_in_use

import zctipc

NUMPY_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


def sample(dtype, shape=(3, 4)):
    n = int(np.prod(shape))
    return (np.arange(n) % 7).astype(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_round_trip_every_numpy_dtype(segname, dtype):
    data = sample(dtype)
    with zctipc.create_shared_tensor(segname, data=data) as t:
        assert t.name == "zctipc_" + segname
        assert t.shape == (3, 4) and t.dtype == np.dtype(dtype) and t.nbytes == data.nbytes
        with zctipc.attach_shared_tensor(segname) as again:
            np.testing.assert_array_equal(again.numpy(), data)
            assert again.dtype_name == dtype
            assert again.torch().dtype == getattr(torch, dtype)
            np.testing.assert_array_equal(again.torch().numpy(), data)
    assert not segment_exists(segname)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64])
def test_round_trip_torch_tensors(segname, dtype):
    data = torch.arange(12).reshape(3, 4).to(dtype)
    with zctipc.create_shared_tensor(segname, data=data) as t:
        assert t.dtype_name == str(dtype).removeprefix("torch.")
        with zctipc.attach_shared_tensor(segname) as again:
            got = again.torch()
            assert got.dtype == dtype
            assert torch.equal(got, data)


def test_bfloat16_tensors_under_a_torch_without_uint16(monkeypatch):
    """torch before 2.3 has no uint16 and its from_numpy refuses one: a
    bfloat16 tensor in zctipc memory (made, attached, or received) is built
    over the bits as int16, which every torch takes."""
    from_numpy = torch.from_numpy

    def old_from_numpy(arr):
        if arr.dtype.kind == "u" and arr.dtype.itemsize > 1:
            raise TypeError(f"can't convert np.ndarray of type numpy.{arr.dtype}")
        return from_numpy(arr)

    monkeypatch.setattr(torch, "from_numpy", old_from_numpy)
    data = torch.arange(12.0).reshape(3, 4).to(torch.bfloat16)
    made = zctipc.empty((3, 4), dtype=torch.bfloat16).copy_(data)
    with zctipc.create_shared_tensor(data=data) as t:
        assert torch.equal(t.torch(), data)
    q = zctipc.Queue()
    try:
        q.put(made)
        q.put(data.t()[1:])  # the long way, copied into the pool
        got, view = q.get(timeout=10), q.get(timeout=10)
        assert got.dtype == torch.bfloat16 and torch.equal(got, data)
        assert view.dtype == torch.bfloat16 and torch.equal(view, data.t()[1:])
        got[0, 0] = 5.0
        assert made[0, 0].item() == 5.0, "zctipc memory is shared"
    finally:
        q.close()


def test_bfloat16_has_no_numpy_view_without_ml_dtypes():
    t = zctipc.create_shared_tensor(shape=(2,), dtype=torch.bfloat16)
    assert t.dtype == "bfloat16"
    with pytest.raises(zctipc.UnsupportedDtype, match="NumPy has no bfloat16"):
        t.numpy()
    t.close()


def test_torch_view_shares_memory_with_numpy_view():
    with zctipc.create_shared_tensor(shape=(4, 4), dtype=np.float32) as t:
        a, b = t.numpy(), t.torch()
        b[1, 2] = 5.0
        assert a[1, 2] == 5.0
        a[3, 3] = -1.0
        assert b[3, 3].item() == -1.0
        assert a.ctypes.data == b.data_ptr()


@pytest.mark.slow
def test_views_outlive_their_shared_tensor(segname):
    t = zctipc.create_shared_tensor(segname, data=np.arange(10, dtype=np.int64))
    view, tview = t.numpy(), t.torch()
    del t
    gc.collect()
    assert segment_exists(segname), "views hold the segment"
    assert view.sum() == 45 and tview[9].item() == 9
    del view
    gc.collect()
    assert segment_exists(segname)
    assert tview.sum().item() == 45
    del tview
    gc.collect()
    assert not segment_exists(segname), "the last view releases it"


def test_close_releases_when_no_view_is_left(segname):
    t = zctipc.create_shared_tensor(segname, shape=3)
    assert segment_exists(segname)
    t.close()
    t.close()  # twice is fine
    assert t.closed
    assert not segment_exists(segname)
    with pytest.raises(zctipc.HandleClosed):
        t.numpy()
    with pytest.raises(ValueError):
        _ = t.refcount
    assert "closed" in repr(t)


def test_repr_names_what_matters(segname):
    with zctipc.create_shared_tensor(segname, shape=(2, 3), dtype="int16") as t:
        text = repr(t)
    assert segname in text and "(2, 3)" in text and "int16" in text and "refcount=1" in text


def test_array_protocol_and_dlpack_share_memory():
    with zctipc.create_shared_tensor(shape=(5,), dtype=np.float64) as t:
        a = np.asarray(t)
        a[0] = 7
        assert t.numpy()[0] == 7
        d = np.from_dlpack(t)
        d[1] = 8
        assert t.numpy()[1] == 8
        tt = torch.from_dlpack(t)
        tt[2] = 9
        assert t.numpy()[2] == 9
        assert t.__dlpack_device__() == (1, 0)
        assert np.array(t, dtype=np.float32).dtype == np.float32
        with pytest.raises(ValueError):
            np.asarray(t, dtype=np.float32, copy=False)


def _capsule_name(capsule):
    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype, get.argtypes = ctypes.c_char_p, [ctypes.py_object]
    return get(capsule)


def test_dlpack_versioned_capsules_when_asked(segname):
    with zctipc.create_shared_tensor(segname, data=np.arange(6.0)) as t:
        assert _capsule_name(t.__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"
        assert _capsule_name(t.__dlpack__()) == b"dltensor", "the legacy capsule for an old consumer"
        with zctipc.attach_shared_tensor(segname, readonly=True) as ro:
            assert _capsule_name(ro.__dlpack__(max_version=(1, 1))) == b"dltensor_versioned"
            a = np.from_dlpack(ro)  # NumPy asks for version 1: the read-only flag travels
            assert not a.flags.writeable and a.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
            assert torch.from_dlpack(ro).tolist() == a.tolist()
            with pytest.raises(BufferError, match="readonly"):
                ro.__dlpack__()  # a legacy capsule cannot say read-only
        copied = np.from_dlpack(t, copy=True)
        copied[0] = 42
        assert t.numpy()[0] == 0.0, "copy=True gives a copy"
        with pytest.raises(zctipc.InvalidArgument, match="no DLPack stream"):
            t.__dlpack__(stream=1)
        with pytest.raises(TypeError):
            t.__dlpack__((1, 0))  # keywords only, as the standard says


def test_dlpack_of_bfloat16_goes_through_torch():
    t = zctipc.create_shared_tensor(data=torch.tensor([1.5, 2.5], dtype=torch.bfloat16))
    back = torch.from_dlpack(t)
    assert back.dtype == torch.bfloat16 and back.tolist() == [1.5, 2.5]
    t.close()


def test_readonly_attach(segname):
    with zctipc.create_shared_tensor(segname, data=np.ones(4)) as t:
        with zctipc.attach_shared_tensor(segname, readonly=True) as ro:
            assert ro.readonly
            a = ro.numpy()
            assert not a.flags.writeable
            with pytest.raises(ValueError):
                a.flags.writeable = True
            with pytest.raises(ValueError):
                a[0] = 2
            t.numpy()[0] = 3
            assert a[0] == 3, "a read-only view still sees the writer"
            assert ro.torch()[0].item() == 3
            assert "readonly" in repr(ro)


def test_zero_size_and_scalar_tensors(segname):
    for shape in [(), (0,), (3, 0)]:
        name = f"{segname}_{len(shape)}"
        data = np.full(shape, 2.5)
        with zctipc.create_shared_tensor(name, data=data) as _, zctipc.attach_shared_tensor(name) as a:
            assert a.shape == shape
            np.testing.assert_array_equal(a.numpy(), data)
            assert a.torch().shape == torch.Size(shape)


def test_create_from_shape_is_zeroed_and_defaults_to_float32():
    with zctipc.create_shared_tensor(shape=[2, 2]) as t:
        assert t.dtype == np.float32
        assert not t.numpy().any()


def test_empty_and_share():
    a = zctipc.empty((3, 2), np.int32)
    assert isinstance(a, np.ndarray) and a.shape == (3, 2) and a.dtype == np.int32
    a[:] = 7
    b = zctipc.empty(4, torch.bfloat16)
    assert isinstance(b, torch.Tensor) and b.dtype == torch.bfloat16 and b.shape == (4,)
    src = np.arange(12, dtype=np.float32).reshape(3, 4).T  # not contiguous
    shared = zctipc.share(src)
    assert shared.flags.c_contiguous
    np.testing.assert_array_equal(shared, src)
    src_t = torch.arange(6.0).reshape(2, 3)[:, 1:]
    shared_t = zctipc.share(src_t)
    assert isinstance(shared_t, torch.Tensor) and torch.equal(shared_t, src_t) and shared_t.is_contiguous()
    in_use = slots_in_use()
    names = {s.name for s in zctipc.list_segments()}
    del a, b, shared, shared_t
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == in_use - 2, "empty() buffers go back to the pool"
    assert len(names - {s.name for s in zctipc.list_segments()}) >= 2, "share() segments are removed"


def test_create_checks_its_arguments():
    with pytest.raises(zctipc.InvalidArgument, match="needs data, or a shape"):
        zctipc.create_shared_tensor()
    with pytest.raises(zctipc.InvalidArgument, match="does not match"):
        zctipc.create_shared_tensor(data=np.zeros((2, 3)), shape=(3, 2))
    with pytest.raises(zctipc.InvalidArgument, match=r"shape \(4,\) does not match"):
        zctipc.create_shared_tensor(data=np.zeros(3), shape=4)
    with pytest.raises(zctipc.InvalidArgument, match="negative"):
        zctipc.create_shared_tensor(shape=(2, -1))
    with pytest.raises(zctipc.InvalidArgument, match="33 dimensions; a zctipc array has at most 32"):
        zctipc.create_shared_tensor(shape=(1,) * 33)
    with pytest.raises(zctipc.InvalidArgument):
        zctipc.create_shared_tensor(shape="big")
    with pytest.raises(TypeError):
        zctipc.SharedTensor()


def test_create_casts_to_a_given_dtype():
    with zctipc.create_shared_tensor(data=[1.7, 2.2], dtype=np.int16) as t:
        assert t.dtype == np.int16 and t.numpy().tolist() == [1, 2]
    with zctipc.create_shared_tensor(data=np.array([1.25, 2.5]), dtype=torch.bfloat16) as t:
        assert t.torch().tolist() == [1.25, 2.5]


def test_permissions_are_0600_under_umask_000(segname):
    old = os.umask(0)
    try:
        t = zctipc.create_shared_tensor(segname, shape=1)
    finally:
        os.umask(old)
    mode = os.stat(os.path.join(SHM, t.name)).st_mode
    assert stat.S_IMODE(mode) == 0o600
    t.close()


def test_unlink_keeps_holders_memory(segname):
    t = zctipc.create_shared_tensor(segname, data=np.arange(3))
    t.unlink()
    assert not segment_exists(segname)
    with pytest.raises(zctipc.SegmentNotFound):
        zctipc.attach_shared_tensor(segname)
    assert t.numpy().tolist() == [0, 1, 2]
    t.close()


def test_refcount_counts_each_process_once(segname):
    with zctipc.create_shared_tensor(segname, shape=1) as t:
        a = zctipc.attach_shared_tensor(segname)
        b = zctipc.attach_shared_tensor(segname, readonly=True)
        assert t.refcount == a.refcount == b.refcount == 1
        a.close()
        b.close()


def test_pickle_sends_the_name(segname):
    with zctipc.create_shared_tensor(segname, data=np.arange(4.0)) as t:
        back = pickle.loads(pickle.dumps(t))
        assert back.name == t.name
        back.numpy()[0] = 9
        assert t.numpy()[0] == 9
        back.close()


def test_list_segments_describes_ours(segname):
    with zctipc.create_shared_tensor(segname, shape=(2, 5), dtype=np.uint16) as t:
        info = next(s for s in zctipc.list_segments() if s.name == t.name)
        assert info.kind == "tensor" and info.dtype == "uint16" and info.shape == (2, 5)
        assert info.nbytes == 20 and info.creator_pid == os.getpid() and info.refcount == 1
        assert info.error is None and info.file_size >= 20
        assert zctipc.list_active_segments is zctipc.list_segments


def test_list_segments_reports_broken_files(shm_file):
    name = shm_file(b"garbage bytes that are not a header")
    info = next(s for s in zctipc.list_segments() if s.name == name)
    assert info.kind == "unknown" and "not a zctipc segment" in info.error
