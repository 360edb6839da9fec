"""bfloat16 tensors over zctipc memory (built from int16 bits), finalizers at
interpreter shutdown, and DLPack exports under a NumPy or torch whose
__dlpack__ takes no keywords: the edges of each."""

import ctypes
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import left_in, slots_in_use

import zctipc

pytestmark = pytest.mark.slow

# Every bfloat16 bit pattern: negatives, -0.0, infinities, NaNs (with their
# payloads), subnormals and the largest values.
ALL_BITS = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
ALL_BF16 = ALL_BITS.view(torch.bfloat16)


def bits(t):
    assert t.dtype == torch.bfloat16, t.dtype
    return t.view(torch.int16)


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def _capsule_name(capsule):
    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype, get.argtypes = ctypes.c_char_p, [ctypes.py_object]
    return get(capsule)


# -- bfloat16 -----------------------------------------------------------------


def test_every_bfloat16_bit_pattern_survives_each_way_in():
    made = zctipc.empty(ALL_BF16.shape, torch.bfloat16)
    assert made.dtype == torch.bfloat16
    made.copy_(ALL_BF16)
    assert same_bits(made, ALL_BF16)
    with zctipc.create_shared_tensor(data=ALL_BF16) as t:
        assert t.dtype_name == "bfloat16"
        assert same_bits(t.torch(), ALL_BF16)
        with zctipc.attach_shared_tensor(t.name, readonly=True) as ro:
            got = ro.torch()
            assert same_bits(got, ALL_BF16)
            assert np.array_equal(got.view(torch.int16).numpy(), ALL_BITS.numpy())
        back = t.torch()
        back[0] = -0.0
        back[1] = float("nan")
        back[2] = float("-inf")
        assert bits(t.torch())[:3].tolist() == [-32768, bits(back)[1].item(), -128]
    if hasattr(torch, "uint16"):
        assert torch.equal(made.view(torch.uint16).to(torch.int32), ALL_BITS.to(torch.int32) & 0xFFFF)


def test_bfloat16_views_through_a_queue_keep_dtype_bits_and_memory():
    base = zctipc.empty((256, 256), torch.bfloat16).copy_(ALL_BF16.reshape(256, 256))
    plain = ALL_BF16.reshape(256, 256).clone()
    cases = {
        "whole": base,
        "transposed": base.t(),
        "offset": base[3:, 5:],
        "strided": base[::3, ::7],
        "transposed_slice": base.t()[1:],
        "row": base[255],
        "zero_d": base[200, 13],
        "empty": base[:0],
        "empty_cols": base[:, 7:7],
        "expanded": base[0:1, 0:4].expand(5, 4),
        "plain": plain,
        "plain_t": plain.t()[::2],
        "plain_zero_d": plain[128, 0],
        "plain_expanded": plain[5].expand(3, 256),
    }
    q = zctipc.Queue()
    try:
        for value in cases.values():
            q.put(value)
        q.put({"nested": [cases["offset"], {"t": cases["transposed"]}], "z": cases["zero_d"]})
        q.put([cases["plain_t"], (cases["expanded"], cases["empty"])])
        got = {k: q.get(timeout=10) for k in cases}
        d, lst = q.get(timeout=10), q.get(timeout=10)
        for k, v in cases.items():
            assert same_bits(got[k], v), k
            assert got[k].stride() == v.stride() or v.numel() <= 1 or v.stride()[0] == 0, (k, got[k].stride())
        assert same_bits(d["nested"][0], cases["offset"]) and same_bits(d["nested"][1]["t"], cases["transposed"])
        assert same_bits(d["z"], cases["zero_d"]) and d["z"].dim() == 0
        assert same_bits(lst[0], cases["plain_t"]) and same_bits(lst[1][0], cases["expanded"])
        assert lst[1][1].shape == (0, 256)
        # in place: a write through what arrived is seen by the sender
        got["offset"][0, 0] = -0.0
        assert bits(base)[3, 5].item() == -32768
        got["whole"][1, 1] = float("inf")
        assert bits(base)[1, 1].item() == 0x7F80
        # afterwards: reinterpreting, DLPack, and sending it on again
        assert got["whole"].view(torch.int16).dtype == torch.int16
        if hasattr(torch, "uint16"):
            assert got["whole"].view(torch.uint16).dtype == torch.uint16
        dl = torch.from_dlpack(got["transposed"])
        assert dl.dtype == torch.bfloat16 and same_bits(dl, base.t())
        assert dl.data_ptr() == got["transposed"].data_ptr()
        q.put(got["strided"])
        again = q.get(timeout=10)
        assert same_bits(again, base[::3, ::7])
        again[0, 1] = -2.5
        assert base[0, 7].item() == -2.5, "passed on, still the same memory"
    finally:
        q.close()


def test_pickling_a_received_bfloat16_tensor_again():
    base = zctipc.empty((4, 8), torch.bfloat16).copy_(ALL_BF16[-32:].reshape(4, 8))
    q = zctipc.Queue()
    try:
        q.put(base.t()[2:])
        got = q.get(timeout=10)
    finally:
        q.close()
    for tensor in (got, base):
        back = pickle.loads(pickle.dumps(tensor))  # plain pickle: a copy
        assert same_bits(back, tensor)


def _receive_and_write(queue, answers):
    got = queue.get(timeout=60)
    answers.put({k: (str(v.dtype), v.view(torch.int16).tolist()) for k, v in got.items()})
    got["a"][0] = -0.0
    got["b"][0, 0] = float("nan")
    got["c"].fill_(-3.0)
    answers.put("written")


def test_bfloat16_shared_in_place_with_another_process():
    a = zctipc.empty((16,), torch.bfloat16).copy_(ALL_BF16[32760:32776])  # around 0: -tiny..., +0, subnormals
    b = zctipc.empty((4, 4), torch.bfloat16).copy_(ALL_BF16[-16:].reshape(4, 4)).t()
    c = zctipc.empty((3,), torch.bfloat16)
    want_a, want_b = bits(a).tolist(), bits(b).tolist()
    ctx = zctipc.get_context()
    queue, answers = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_receive_and_write, args=(queue, answers))
    p.start()
    try:
        queue.put({"a": a, "b": b, "c": c})
        seen = answers.get(timeout=60)
        assert seen["a"] == ("torch.bfloat16", want_a)
        assert seen["b"] == ("torch.bfloat16", want_b)
        assert answers.get(timeout=60) == "written"
        assert bits(a)[0].item() == -32768
        assert torch.isnan(b[0, 0]).item()
        assert c.tolist() == [-3.0] * 3
    finally:
        p.join(60)
        queue.close()
        answers.close()
    assert p.exitcode == 0


class _BF16Data(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return ALL_BF16[i * 1024 : (i + 1) * 1024].reshape(32, 32).t()


def test_bfloat16_batches_through_a_dataloader():
    loader = torch.utils.data.DataLoader(
        _BF16Data(), batch_size=2, num_workers=2, multiprocessing_context=zctipc.get_context()
    )
    for i, batch in enumerate(loader):
        want = torch.stack([_BF16Data()[2 * i], _BF16Data()[2 * i + 1]])
        assert same_bits(batch, want), i
    assert i == 3


# -- finalizers at interpreter shutdown ----------------------------------------

SHUTDOWN = """
import atexit, gc, os, sys, threading, time
import numpy as np, torch, zctipc
MODE = sys.argv[1]
G = zctipc.empty((1024,), torch.bfloat16)
A = zctipc.empty((1 << 16,), np.uint8)
class Holder:
    cls_attr = zctipc.empty((8,), torch.float32)
q = zctipc.Queue()
for x in (np.ones(1 << 20, np.uint8), torch.ones(1 << 18), G[1:].view(torch.int16)):
    q.put(x)
R = [q.get(), q.get(), q.get()]
cycle = {"t": zctipc.empty((4,), torch.float64), "arr": R[0]}
cycle["self"] = cycle
with zctipc.create_shared_tensor(data=np.arange(10.0)) as st:
    S_VIEW = st.numpy()
    S_T = st.torch()
BF = zctipc.create_shared_tensor(data=torch.ones(4, dtype=torch.bfloat16)).torch()
# a normal del still releases at once
before = zctipc.pool_stats().slots_in_use
tmp = q.put(np.zeros(1 << 20, np.uint8)) or q.get()
assert zctipc.pool_stats().slots_in_use == before + 1, (before, zctipc.pool_stats().slots_in_use)
del tmp
assert zctipc.pool_stats().slots_in_use == before, "del releases at once"
def spin(held):
    while True:
        held[0] += 1
        time.sleep(0.001)
# (a daemon thread still running torch ops at exit may abort in torch itself:
# this one writes through NumPy, the other only holds its tensor)
threading.Thread(target=spin, args=(zctipc.empty((4,), np.float32),), daemon=True).start()
threading.Thread(target=time.sleep, args=(60,), kwargs={}, daemon=True).start()
HELD = zctipc.empty((4,), torch.bfloat16)
HELD_BY_THREAD = threading.Thread(target=lambda t: time.sleep(60), args=(HELD,), daemon=True)
HELD_BY_THREAD.start()
if MODE == "atexit_exit":
    atexit.register(lambda: sys.exit(3))
elif MODE == "atexit_raise":
    def late():
        global LATE
        LATE = zctipc.empty((16,), torch.bfloat16)
    atexit.register(late)
del q
print("ready", flush=True)
if MODE == "os_exit":
    os._exit(0)
if MODE == "sys_exit":
    sys.exit(0)
"""


@pytest.mark.parametrize("mode", ["plain", "sys_exit", "atexit_exit", "atexit_raise", "os_exit"])
@pytest.mark.parametrize("dev", [False, True])
def test_shutdown_with_zctipc_memory_everywhere(isolated, mode, dev):
    argv = [sys.executable] + (["-X", "dev"] if dev else []) + ["-c", SHUTDOWN, mode]
    out = subprocess.run(argv, env=isolated, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["ready"], (out.stdout, out.stderr)
    stderr = out.stderr
    assert out.returncode == 0, stderr
    if mode == "atexit_exit":
        # Python's own report of the handler's SystemExit, and nothing else
        assert stderr.count("Exception ignored") == 1 and "Exception ignored in atexit callback" in stderr, stderr
        assert stderr.count("Traceback") == 1 and stderr.rstrip().endswith("SystemExit: 3"), stderr
    else:
        assert "Exception ignored" not in stderr and "Traceback" not in stderr, stderr
    assert "zctipc" not in stderr, stderr
    assert left_in(isolated) == []


def test_a_normal_del_still_releases_at_once():
    q = zctipc.Queue()
    try:
        before = slots_in_use()
        q.put(np.ones(1 << 20, np.uint8))
        q.put(torch.ones(1 << 18).to(torch.bfloat16))  # (its storage goes into the pool, and with it)
        a, b = q.get(timeout=10), q.get(timeout=10)
        assert slots_in_use() == before + 2
        del a
        assert slots_in_use() == before + 1
        del b
        assert slots_in_use() == before
    finally:
        q.close()


# -- DLPack under a NumPy or torch whose __dlpack__ takes only stream --------


class _NoKeywords:
    """An array or tensor whose __dlpack__ takes only stream, as NumPy's
    before 2.1 and torch 2.2's."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack__(self, *, stream=None):
        return self.inner.__dlpack__()

    def copy(self):
        return _NoKeywords(self.inner.copy())

    def clone(self):
        return _NoKeywords(self.inner.clone())


NUMPY, TORCH = zctipc.SharedTensor.numpy, zctipc.SharedTensor.torch


@pytest.fixture
def old_exporters(monkeypatch):
    """Call it once the segments are made (and filled)."""

    def patch():
        monkeypatch.setattr(zctipc.SharedTensor, "numpy", lambda self: _NoKeywords(NUMPY(self)))
        monkeypatch.setattr(zctipc.SharedTensor, "torch", lambda self: _NoKeywords(TORCH(self)))

    return patch


def test_bfloat16_dlpack_with_keywords_under_a_torch_without_them(old_exporters):
    """torch 2.2's Tensor.__dlpack__ takes only stream: a bfloat16 segment's
    export with max_version raised TypeError."""
    tensor = TORCH
    with zctipc.create_shared_tensor(data=ALL_BF16[:8]) as t:
        old_exporters()
        assert _capsule_name(t.__dlpack__(max_version=(1, 0))) == b"dltensor"
        shared = torch.from_dlpack(t.__dlpack__(max_version=(1, 0), copy=False, dl_device=(1, 0)))
        assert shared.dtype == torch.bfloat16 and same_bits(shared, ALL_BF16[:8])
        shared[0] = 9.0
        assert tensor(t)[0].item() == 9.0, "the capsule is over the segment"
        copied = torch.from_dlpack(t.__dlpack__(max_version=(1, 0), copy=True))
        copied[1] = 42.0
        assert tensor(t)[1].item() != 42.0, "copy=True gives a copy"
        with pytest.raises(BufferError, match="device"):
            t.__dlpack__(max_version=(1, 0), dl_device=(2, 0))


@pytest.mark.parametrize("old", [False, True])
def test_a_readonly_bfloat16_segment_hands_out_no_writable_capsule(old_exporters, old):
    """torch has no read-only tensors: a bfloat16 segment's capsules, legacy
    or versioned, said its PROT_READ mapping was writable."""
    with zctipc.create_shared_tensor(data=ALL_BF16[:8]) as t, zctipc.attach_shared_tensor(t.name, readonly=True) as ro:
        if old:
            old_exporters()
        for kwargs in ({}, {"max_version": (1, 0)}, {"max_version": (1, 0), "copy": False}, {"dl_device": (1, 0)}):
            with pytest.raises(BufferError):
                ro.__dlpack__(**kwargs)
        copied = torch.from_dlpack(ro.__dlpack__(max_version=(1, 0), copy=True))
        assert same_bits(copied, ALL_BF16[:8])
        copied[0] = 1.0
        assert same_bits(TORCH(ro), ALL_BF16[:8])


def test_readonly_segments_under_a_numpy_without_keywords(old_exporters):
    numpy = NUMPY
    with (
        zctipc.create_shared_tensor(data=np.arange(6.0)) as t,
        zctipc.attach_shared_tensor(t.name, readonly=True) as ro,
    ):
        old_exporters()
        for kwargs in ({}, {"max_version": (1, 0)}, {"max_version": (1, 0), "copy": False}, {"dl_device": (1, 0)}):
            with pytest.raises(BufferError):
                ro.__dlpack__(**kwargs)
        with pytest.raises(BufferError):
            torch.from_dlpack(ro)
        copied = torch.from_dlpack(ro.__dlpack__(max_version=(1, 0), copy=True))
        copied[0] = 42.0
        assert numpy(t)[0] == 0.0
        # the legacy capsule for a consumer that asks for a version, not a TypeError
        assert _capsule_name(t.__dlpack__(max_version=(1, 0))) == b"dltensor"
        with pytest.raises(BufferError, match="device"):
            t.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
        # copy=False over a writable segment: no copy needed, none made
        shared = torch.from_dlpack(t.__dlpack__(max_version=(1, 0), copy=False))
        shared[1] = 7.0
        assert numpy(t)[1] == 7.0
        assert np.from_dlpack(t)[1] == 7.0


def test_the_rest_under_a_numpy_without_keywords(request):
    t = zctipc.create_shared_tensor(data=np.arange(6.0))
    request.getfixturevalue("old_exporters")()
    with pytest.raises(zctipc.InvalidArgument):
        t.__dlpack__(stream=1, max_version=(1, 0))
    t.close()
    with pytest.raises(zctipc.HandleClosed):
        t.__dlpack__(max_version=(1, 0))
    with pytest.raises(zctipc.HandleClosed):
        t.__dlpack__()


def test_a_type_error_not_about_the_keywords_surfaces(monkeypatch):
    class Broken:
        def __dlpack__(self, **kwargs):
            raise TypeError("this array cannot be exported")

    with zctipc.create_shared_tensor(data=np.arange(6.0)) as t:
        monkeypatch.setattr(zctipc.SharedTensor, "numpy", lambda self: Broken())
        for kwargs in ({}, {"max_version": (1, 0)}, {"copy": False}):
            with pytest.raises(TypeError, match="cannot be exported"):
                t.__dlpack__(**kwargs)


# -- read-only segments' DLPack exports, every dtype and keyword ---------------


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY


def _capsule_view(capsule):
    """The capsule's name, its data address and whether it says read-only
    (a legacy capsule cannot)."""
    name = _capsule_name(capsule)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    ptr = get(capsule, name)
    if name == b"dltensor_versioned":
        m = _DLManagedTensorVersioned.from_address(ptr)
        return name, m.dl_tensor.data + m.dl_tensor.byte_offset, bool(m.flags & _READ_ONLY)
    assert name == b"dltensor", name
    t = _DLTensor.from_address(ptr)
    return name, t.data + t.byte_offset, False


DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
DTYPES += ["float16", "float32", "float64", "bfloat16", "complex64", "complex128"]
KEYWORDS = [
    {k: v for k, v in (("max_version", mv), ("copy", cp), ("dl_device", dev)) if v is not None}
    for mv in (None, (0, 8), (1, 0), (1, 1), (2, 0))
    for cp in (None, False, True)
    for dev in (None, (1, 0), (2, 0))
]


def _readonly_pair(dtype):
    data = torch.arange(8).to(torch.bfloat16) if dtype == "bfloat16" else np.arange(8).astype(dtype)
    t = zctipc.create_shared_tensor(data=data)
    ro = zctipc.attach_shared_tensor(t.name, readonly=True)
    assert ro.readonly
    base = ro.numpy().ctypes.data if dtype != "bfloat16" else TORCH(ro).data_ptr()
    return t, ro, range(base, base + ro.nbytes)


def _check_export(ro, mapping, kwargs):
    try:
        capsule = ro.__dlpack__(**kwargs)
    except RuntimeError:
        # torch copies a bfloat16 segment to the CUDA device asked for,
        # and says so when there is none
        assert kwargs.get("dl_device") == (2, 0) and kwargs.get("copy"), kwargs
        return
    except BufferError:
        assert not kwargs.get("copy") or kwargs.get("dl_device") == (2, 0), f"{kwargs}: a copy refused"
        return
    name, addr, readonly = _capsule_view(capsule)
    if addr in mapping:
        assert readonly, f"{kwargs}: a {name} capsule that says writable over a PROT_READ mapping"
        assert not kwargs.get("copy"), f"{kwargs}: copy=True exported the mapping itself"
    else:
        assert kwargs.get("copy"), f"{kwargs}: a copy nobody asked for"


@pytest.mark.parametrize("old", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_no_readonly_export_says_writable(old_exporters, dtype, old):
    """Every dtype, every keyword combination, with exporters that take them
    and ones that do not: a capsule over the read-only mapping is versioned
    and flagged read-only; copy=True exports a copy."""
    t, ro, mapping = _readonly_pair(dtype)
    try:
        if old:
            old_exporters()
        for kwargs in KEYWORDS:
            _check_export(ro, mapping, kwargs)
        # a copy on the CPU is always there to be had
        for kwargs in ({"copy": True}, {"copy": True, "max_version": (1, 0)}, {"copy": True, "dl_device": (1, 0)}):
            assert _capsule_view(ro.__dlpack__(**kwargs))[1] not in mapping
    finally:
        ro.close()
        t.close()


@pytest.mark.parametrize("dtype", DTYPES)
def test_consumers_of_readonly_segments(dtype):
    """np.from_dlpack gives a read-only array or refuses; torch.from_dlpack
    refuses or gives the data (torch decides what it does with the flag)."""
    t, ro, mapping = _readonly_pair(dtype)
    try:
        expect = TORCH(t).clone()
        if dtype == "bfloat16":
            with pytest.raises(BufferError):
                np.from_dlpack(ro)
            with pytest.raises(BufferError):
                torch.from_dlpack(ro)
        else:
            arr = np.from_dlpack(ro)
            assert not arr.flags.writeable
            assert arr.ctypes.data in mapping
            np.testing.assert_array_equal(arr, t.numpy())
            try:
                got = torch.from_dlpack(ro)
            except BufferError:
                pass
            else:
                assert torch.equal(got, expect)
        copied = np.from_dlpack(ro, copy=True) if dtype != "bfloat16" else None
        if copied is not None:
            assert copied.flags.writeable and copied.ctypes.data not in mapping
            copied[0] = copied[1]
        again = pickle.loads(pickle.dumps(ro))
        assert again.readonly
        _check_export(again, mapping, {"max_version": (1, 0)})
        _check_export(again, mapping, {})
        again.close()
    finally:
        ro.close()
        t.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("readonly", [False, True])
def test_a_capsule_outlives_its_closed_segment_and_a_closed_one_exports_nothing(dtype, readonly):
    t, ro, _ = _readonly_pair(dtype)
    src = ro if readonly else t
    expect = TORCH(t).clone()
    kwargs = {"max_version": (1, 0), "copy": True} if readonly and dtype == "bfloat16" else {"max_version": (1, 0)}
    capsule = src.__dlpack__(**kwargs)
    name = t.name
    ro.close()
    t.close()
    del src, ro, t
    import gc

    gc.collect()
    got = torch.utils.dlpack.from_dlpack(capsule)
    if dtype == "bfloat16":
        got, expect = bits(got), bits(expect)
    assert torch.equal(got, expect)
    del got, capsule
    gc.collect()
    with pytest.raises(zctipc.SegmentNotFound):
        zctipc.attach_shared_tensor(name)
    closed = zctipc.create_shared_tensor(data=np.arange(3.0))
    closed_ro = zctipc.attach_shared_tensor(closed.name, readonly=True)
    closed_ro.close()
    for kwargs in KEYWORDS:
        with pytest.raises((zctipc.HandleClosed, BufferError)):
            closed_ro.__dlpack__(**kwargs)
    closed.close()


def test_a_closed_readonly_bfloat16_segment_says_closed():
    """A closed handle says so (HandleClosed), whatever the dtype and the
    keywords: a closed read-only bfloat16 segment said it is exported only
    as a copy."""
    with zctipc.create_shared_tensor(data=ALL_BF16[:4]) as t:
        ro = zctipc.attach_shared_tensor(t.name, readonly=True)
        ro.close()
        for kwargs in ({}, {"max_version": (1, 0)}, {"copy": False}, {"copy": True}):
            with pytest.raises(zctipc.HandleClosed):
                ro.__dlpack__(**kwargs)
