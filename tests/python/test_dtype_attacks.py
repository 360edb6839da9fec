"""Attacks on element-type codes from Python: every valid code round-trips
through the package's own tables and the library's; an unknown code (0,
negative, past 16 bits, past the last) is UnsupportedDtype at every call of
the library that takes one; and a dtype forged into what another process
wrote (a segment header, a stream's layout, a descriptor in a pickle) is
refused, never read as another type nor past its bytes. Every attack is
kept, whether it found something broken or not; the C ABI's own are in
go/capi/abitest/testdata/abi_dtype_attacks.c."""

import gc
import mmap
import os
import pickle
import struct
import zlib
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
from conftest import SHM, slots_in_use

import zctipc
from zctipc import observe
from zctipc._core import dtypes, native

# Codes no call may take: none, negative, past 16 bits (their low 16 bits
# a valid code, which a conversion would wrap onto), past the last.
F32 = dtypes.CODES["float32"]
BAD = {
    "0": 0,
    "-1": -1,
    "INT32_MIN": -(1 << 31),
    "INT32_MAX": (1 << 31) - 1,
    "1<<16": 1 << 16,
    "(1<<16)+float32": (1 << 16) + F32,
    "-65536+float32": -(1 << 16) + F32,
    "past the last": max(dtypes.NAMES) + 1,
    "0xFFFF": 0xFFFF,
}
STREAM_DTYPE = 28  # the u32 dtype code of a stream's frames, in its data (docs/format.md, "Streams")


def _data_at(path):
    """Where the data of the segment file at path starts."""
    with open(path, "rb") as f:
        return struct.unpack_from("<Q", f.read(24), 16)[0]


# -- every valid code ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(dtypes.CODES))
def test_every_valid_code_round_trips(name):
    """A tensor segment and a stream of each dtype say its code back, by
    the library's itemsize, which is the package's; their views are of it."""
    code, size = dtypes.CODES[name], dtypes.ITEMSIZE[dtypes.CODES[name]]
    t = zctipc.create_shared_tensor(shape=(2, 3), dtype=name)
    try:
        assert (t.dtype_name, t.nbytes, t.strides) == (name, 6 * size, (3 * size, size))
        assert t.torch().dtype == getattr(torch, name) and t.torch().element_size() == size
        if code == dtypes.BFLOAT16:
            assert t.dtype == "bfloat16"  # NumPy has none without ml_dtypes
        else:
            assert t.numpy().dtype == np.dtype(name) and t.numpy().itemsize == size
        other = zctipc.attach_shared_tensor(t.name)
        assert (other.dtype_name, other.nbytes) == (name, t.nbytes)
        other.close()
        assert zctipc.attach_ref(t.ref(), torch=True).dtype == getattr(torch, name)
        [listed] = [s for s in zctipc.list_segments() if s.name == t.name]
        assert (listed.dtype, listed.shape, listed.error) == (name, (2, 3), None)
    finally:
        t.close()
    s = zctipc.Stream.create(shape=3, dtype=name, frames=2)
    try:
        a = zctipc.Stream.attach(s.name)
        assert a.dtype == s.dtype == dtypes.public_dtype(code)
        assert a._info.frame_bytes == 3 * size
        a.close()
    finally:
        s.close()


# -- unknown codes at every call ---------------------------------------------------------------


@pytest.fixture
def segment():
    t = zctipc.create_shared_tensor(shape=(2, 3), dtype="float32")
    yield t
    t.close()


@pytest.mark.parametrize("code", BAD.values(), ids=BAD.keys())
def test_an_unknown_code_is_unsupported_dtype_at_every_call(segment, code):
    """Each call that takes a dtype refuses the code with UnsupportedDtype
    (a TypeError), making nothing, putting nothing and taking no count."""
    ffi, lib = native.ffi(), native.lib()
    shape, strides = ffi.new("int64_t[]", [2, 3]), ffi.new("int64_t[]", [12, 4])
    handle, info = ffi.new("zct_handle *"), ffi.new("zct_info *")
    data = ffi.cast("void *", segment.numpy().ctypes.data)
    q = zctipc.Queue()
    calls = {
        "segment_create": lambda: lib.zct_segment_create(ffi.NULL, code, 2, shape, handle, info),
        "segment_create_uninit": lambda: lib.zct_segment_create_uninit(
            ffi.NULL, lib.ZCT_KIND_TENSOR, code, 2, shape, handle, info
        ),
        "stream_create": lambda: lib.zct_stream_create(
            ffi.NULL, code, 2, shape, 2, 1, 0, 0, handle, ffi.new("zct_stream_info *")
        ),
        "queue_put_inline": lambda: lib.zct_queue_put_inline(q._handle, data, 24, code, 2, shape, 0, 0),
        "queue_put_array": lambda: lib.zct_queue_put_array(
            q._handle, lib.ZCT_RECORD_TENSOR, data, 24, code, 2, shape, strides, 0, 0
        ),
    }
    try:
        for call, run in calls.items():
            with pytest.raises(zctipc.UnsupportedDtype, match="dtype code") as err:
                native.check(run())
            assert isinstance(err.value, TypeError), call
        # A view's code, in a put and in describing it.
        view = ffi.new("zct_view *")
        offset = ffi.new("uint64_t *")
        native.check(lib.zct_ref_find(data, 24, ffi.addressof(view, "ref"), offset))
        view.dtype, view.ndim = code, 2
        view.shape[0:2], view.strides[0:2] = [2, 3], [12, 4]
        buf, size = ffi.new("char[]", 2048), ffi.new("uint64_t *")
        for run in (
            lambda: lib.zct_queue_put(q._handle, lib.ZCT_RECORD_TENSOR, ffi.NULL, 0, view, 1, 0),
            lambda: lib.zct_ref_describe(view, buf, 2048, size),
            lambda: lib.zct_ref_encode(view, buf, 2048, size),
        ):
            with pytest.raises(zctipc.UnsupportedDtype):
                native.check(run())
        assert segment.refcount == 2, "the ref is still the caller's"
        native.check(lib.zct_ref_release(view.ref))
        assert q.empty() and segment.refcount == 1
    finally:
        q.close()


def test_a_code_past_32_bits_never_reaches_the_library():
    """cffi refuses a code that does not fit the int32_t of zctipc.h, so a
    Python caller cannot pass one the library would see truncated."""
    ffi, lib = native.ffi(), native.lib()
    for code in (1 << 31, -(1 << 31) - 1, (1 << 32) + F32):
        with pytest.raises(OverflowError):
            lib.zct_segment_create(ffi.NULL, code, 0, ffi.NULL, ffi.new("zct_handle *"), ffi.new("zct_info *"))


def test_a_table_is_uint8_in_one_dimension():
    """A table segment made to be written (as zctipc.arrow makes one) holds
    uint8 in one dimension, as docs/format.md says: another type or shape
    is refused."""
    ffi, lib = native.ffi(), native.lib()
    handle, info = ffi.new("zct_handle *"), ffi.new("zct_info *")
    for code, dims in ((F32, [4]), (dtypes.CODES["int8"], [4]), (dtypes.CODES["uint8"], [2, 2])):
        with pytest.raises(zctipc.InvalidArgument, match="uint8 in one dimension"):
            native.check(
                lib.zct_segment_create_uninit(
                    ffi.NULL, lib.ZCT_KIND_TABLE, code, len(dims), ffi.new("int64_t[]", dims), handle, info
                )
            )


# -- forged headers ------------------------------------------------------------------------------


def _forged_header(content, code):
    """content (a segment file's bytes) with dtype code in its header,
    its checksum written again (docs/format.md, "Checksum")."""
    b = bytearray(content)
    struct.pack_into("<H", b, 12, code)
    hlen = struct.unpack_from("<H", b, 6)[0]
    struct.pack_into("<I", b, 56, zlib.crc32(bytes(b[128:hlen]), zlib.crc32(bytes(b[:56]))))
    return bytes(b)


@pytest.fixture(scope="module")
def float32_file():
    """The bytes of a float32 (2, 3) tensor segment's file."""
    t = zctipc.create_shared_tensor(data=np.arange(6, dtype=np.float32).reshape(2, 3))
    with open(os.path.join(SHM, t.name), "rb") as f:
        content = f.read()
    t.close()
    return content


FORGED_HEADERS = {
    "0": (0, zctipc.UnsupportedDtype),
    "past the last": (max(dtypes.NAMES) + 1, zctipc.UnsupportedDtype),
    "0xFFFF": (0xFFFF, zctipc.UnsupportedDtype),
    "0x8000|float32": (0x8000 | F32, zctipc.UnsupportedDtype),
    "float64": (dtypes.CODES["float64"], zctipc.CorruptHeader),  # past its 24 bytes
    "complex128": (dtypes.CODES["complex128"], zctipc.CorruptHeader),
}


@pytest.mark.parametrize("code, error", FORGED_HEADERS.values(), ids=FORGED_HEADERS.keys())
def test_a_forged_header_dtype_is_refused(shm_file, float32_file, code, error):
    name = shm_file(_forged_header(float32_file, code))
    with pytest.raises(error):
        zctipc.attach_shared_tensor(name)
    ref = {"segment": name, "dtype": "float32", "shape": [2, 3], "strides": [12, 4], "nbytes": 24}
    with pytest.raises(error):
        zctipc.attach_ref(ref)
    [listed] = [s for s in zctipc.list_segments() if s.name == name]
    assert (listed.kind, listed.dtype, listed.shape) == ("unknown", None, None)
    assert listed.error and ("dtype" in listed.error or "reaches past" in listed.error)


def test_a_forged_header_of_a_smaller_itemsize_stays_in_its_bytes(shm_file, float32_file):
    """A valid code of a smaller itemsize keeps the array in the segment's
    bytes: it is read as it says, strided over them."""
    name = shm_file(_forged_header(float32_file, dtypes.CODES["uint8"]))
    t = zctipc.attach_shared_tensor(name)
    try:
        a = t.numpy()
        assert (a.dtype, a.shape, a.strides, t.nbytes) == (np.uint8, (2, 3), (12, 4), 24)
        raw = np.arange(6, dtype=np.float32).view(np.uint8).reshape(2, 12)
        assert np.array_equal(a, raw[:, ::4])
    finally:
        t.close()


# -- forged streams --------------------------------------------------------------------------------


FORGED_STREAMS = {
    "0": 0,
    "past the last": max(dtypes.NAMES) + 1,
    "0xFFFF": 0xFFFF,
    "(1<<16)+float32": (1 << 16) + F32,
    "(1<<31)+float32": (1 << 31) + F32,
    "0xFFFFFFFF": 0xFFFFFFFF,
    "float64": dtypes.CODES["float64"],  # the layout is of other frames
    "uint8": dtypes.CODES["uint8"],
}


@pytest.mark.parametrize("code", FORGED_STREAMS.values(), ids=FORGED_STREAMS.keys())
def test_a_forged_stream_dtype_is_refused(code):
    """The dtype word of a stream's layout is a u32: a code past 16 bits
    was read as its low half (float32 here), and attached; it is none. The
    stream is refused, by Stream.attach and by zctipc top, which reads it
    without attaching."""
    s = zctipc.Stream.create(shape=16, dtype="float32", frames=4)
    path = os.path.join(SHM, s.name)
    at = _data_at(path) + STREAM_DTYPE
    try:
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            struct.pack_into("<I", m, at, code)
            try:
                with pytest.raises(zctipc.CorruptHeader, match="dtype|frames of"):
                    zctipc.Stream.attach(s.name)
                frame = observe.sample()
                assert s.name not in [st["name"] for st in frame["streams"]]
                [bad] = [u for u in frame["unreadable"] if u["name"] == s.name]
                assert "corrupt" in bad["error"]
            finally:
                struct.pack_into("<I", m, at, F32)
        a = zctipc.Stream.attach(s.name)
        assert a.dtype == np.float32
        a.close()
        [st] = [st for st in observe.sample()["streams"] if st["name"] == s.name]
        assert st["frame"] == "float32[16]"
    finally:
        s.close()


# -- forged descriptors --------------------------------------------------------------------------


def _pickled_array():
    """A pool array of six float32s pickled for another process, and where
    its descriptor starts in the pickle."""
    a = zctipc.empty(6, "float32")
    a[:] = np.arange(6)
    data = bytes(ForkingPickler.dumps(a))
    del a
    at = [
        p
        for p in range(len(data) - 48)
        if struct.unpack_from("<HB", data, p + 4) == (F32, 1) and struct.unpack_from("<qq", data, p + 32) == (6, 4)
    ]
    assert len(at) == 1
    return data, at[0]


def _patched(data, at, code, nbytes=None):
    b = bytearray(data)
    struct.pack_into("<H", b, at + 4, code)
    if nbytes is not None:
        struct.pack_into("<Q", b, at + 16, nbytes)
    return bytes(b)


FORGED_DESCRIPTORS = {
    "0": 0,
    "past the last": max(dtypes.NAMES) + 1,
    "0xFFFF": 0xFFFF,
    "0x100|float32": 0x100 | F32,
    "float64": dtypes.CODES["float64"],  # past its 24 bytes
}


@pytest.mark.parametrize("code", FORGED_DESCRIPTORS.values(), ids=FORGED_DESCRIPTORS.keys())
def test_a_forged_descriptor_dtype_in_a_pickle_is_refused_and_takes_no_count(code):
    before = slots_in_use()
    data, at = _pickled_array()
    with pytest.raises(zctipc.CorruptHeader, match="malformed"):
        pickle.loads(_patched(data, at, code))
    a = pickle.loads(data)  # the count is still in the true bytes
    assert np.array_equal(a, np.arange(6, dtype=np.float32))
    del a
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before


def test_a_forged_descriptor_made_to_fit_past_its_slot_gives_up_its_count():
    """A descriptor whose bytes were widened to fit a larger dtype passes
    its own checks, and its count is taken; the array would reach past the
    slot, so it is refused, and the count given up, not left taken."""
    before = slots_in_use()
    data, at = _pickled_array()
    with pytest.raises(zctipc.CorruptHeader, match="reaches past"):
        pickle.loads(_patched(data, at, dtypes.CODES["complex128"], nbytes=1 << 40))
    with pytest.raises(zctipc.DescriptorTaken):
        pickle.loads(data)
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before


def test_a_forged_descriptor_of_a_smaller_itemsize_stays_in_its_bytes():
    before = slots_in_use()
    data, at = _pickled_array()
    a = pickle.loads(_patched(data, at, dtypes.CODES["uint8"]))
    assert (a.dtype, a.shape, a.strides) == (np.uint8, (6,), (4,))
    assert np.array_equal(a, np.arange(6, dtype=np.float32).view(np.uint8)[::4])
    del a
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before
