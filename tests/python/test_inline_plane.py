"""Inline arrays through the data plane (go/capi/fast.c and
go/internal/plane/inline.c): a put and a take of one run in C without
entering Go. hypothesis draws arrays of every dtype, shape and flag a
NumPy user sends; each is taken once by the plane's take and once by Go's
(zct_queue_get), which must give the same view, and the get gives back an
array equal to the one put."""

import math

import numpy as np
import pytest

import zctipc
from zctipc._core import native
from zctipc._wire import records

hypothesis = pytest.importorskip("hypothesis", reason="make test installs hypothesis (constraints.txt)")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

DTYPES = [
    np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128,
]  # fmt: skip

FIELDS = ("offset", "nbytes", "dtype", "ndim", "kind", "flags")


@pytest.fixture(scope="module")
def q():
    q = zctipc.Queue()
    yield q
    q.close()


def view_of(s, n):
    """The fields of the view s.views[0] a take wrote, shape and strides
    cut to its ndim, and where its data lies in s's buffer."""
    v = s.views[0]
    ffi = native.ffi()
    got = {f: getattr(v, f) for f in FIELDS}
    got["shape"] = list(v.shape[0 : v.ndim])
    got["strides"] = list(v.strides[0 : v.ndim])
    got["at"] = int(ffi.cast("uintptr_t", v.data)) - int(ffi.cast("uintptr_t", s.buf))
    got["nviews"] = n
    return got


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 4), max_size=5),
    readonly=st.booleans(),
    reverse=st.booleans(),
)
def test_the_plane_takes_an_inline_array_as_go_does(q, dtype, shape, readonly, reverse):
    arr = (np.arange(math.prod(shape)) * 37 % 251).astype(dtype).reshape(shape)
    if reverse and arr.ndim:
        arr = arr[::-1]  # not C-contiguous: sent in C order
    if readonly:
        arr.flags.writeable = False
    lib = native.lib()
    q.put(arr)
    q.put(arr)
    q.put(arr)
    c, go = records.Scratch(), records.Scratch()
    r = lib.zct_queue_take(q._handle, c.buf, c.cap, 0, c.views, c.vcap, c.nviews)  # the plane's take
    assert r >= 0, native.error(r)
    assert lib.zct_queue_get(q._handle, go.buf, go.cap, 0, *go.get_args()) == 0  # Go's
    packed = go.plen[0] | go.off[0] << records.OFFSET_SHIFT | go.typ[0] << records.TYPE_SHIFT
    assert r == packed
    assert view_of(c, c.nviews[0]) == view_of(go, go.nviews[0])
    assert bytes(c.raw[: go.off[0] + go.plen[0]]) == bytes(go.raw[: go.off[0] + go.plen[0]])
    got = q.get()
    assert got.dtype == arr.dtype and got.shape == arr.shape
    assert np.array_equal(got, arr)
    assert got.flags.writeable == (not readonly) and got.flags.c_contiguous
    assert not zctipc.is_shared(got)


def test_a_take_with_no_room_for_a_view_leaves_an_inline_array_for_go_to_refuse(q):
    """The plane takes an inline array only when the caller has room for
    its view; with none, Go's take says so and the array stays."""
    lib = native.lib()
    q.put(np.arange(3, dtype=np.int32))
    s = records.Scratch()
    r = lib.zct_queue_take(q._handle, s.buf, s.cap, 0, s.views, 0, s.nviews)
    assert r == native.E_RANGE
    assert np.array_equal(q.get(), np.arange(3, dtype=np.int32))


@pytest.mark.parametrize(
    "dtype, ndim, shape, nbytes, flags, error",
    [
        (99, 1, [1], 1, 0, zctipc.UnsupportedDtype),  # no such dtype
        (6, 33, [1] * 33, 1, 0, zctipc.InvalidArgument),  # ndim past the max
        (6, 1, [-1], 0, 0, zctipc.InvalidArgument),  # a negative dimension
        (11, 1, [3], 8, 0, zctipc.InvalidArgument),  # fewer bytes than the shape's
        (6, 1, [1], 1, 8, zctipc.InvalidArgument),  # flags past 7
        (11, 3, [0, 1 << 32, 1 << 32], 0, 0, zctipc.InvalidArgument),  # empty, its other dimensions past 2^63
    ],
)
def test_an_inline_put_the_plane_refuses_is_go_s_to_explain(q, dtype, ndim, shape, nbytes, flags, error):
    """A put_inline that breaks a rule is refused with Go's message, and
    puts nothing."""
    lib, ffi = native.lib(), native.ffi()
    data = ffi.new("char[]", max(nbytes, 1))
    r = lib.zct_queue_put_inline(q._handle, data, nbytes, dtype, ndim, shape, flags, 0)
    assert r < 0
    with pytest.raises(error):
        native.check(r)
    assert q.empty()
