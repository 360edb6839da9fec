"""Attacks on inline arrays through the data plane (go/capi/fast.c,
go/internal/plane/inline.c): forged inline records the plane's take must
refuse as Go's get does (the same status, the record gone, the next one
read), at the ring's end and at positions past 2^31 and 2^32;
zct_queue_put_inline and zct_queue_take at the edges of their arguments;
a full queue; many threads putting and taking at once; a queue closed
while a take waits."""

import mmap
import os
import struct
import threading

import numpy as np
import pytest
from _procs import closed_while_blocked
from test_handover_attacks import BYTES, INLINE, LIES, SHM, U8, forge, inline, record

import zctipc
from zctipc._core import dtypes, native
from zctipc._wire import records

HANG = 30  # seconds that only a hang takes
RING_AT = 512  # where a queue's ring starts in its data (docs/format.md, "Queues")
I32 = dtypes.CODES["int32"]
E_CORRUPT = -7  # ZCT_E_CORRUPT


@pytest.fixture
def q():
    q = zctipc.Queue(max_bytes=1 << 20)
    yield q
    q.close()


def take(q, s=None, views_cap=None, timeout=0):
    """The plane's take of q's next record into s: its status or packed result."""
    s = s or records.Scratch()
    cap = s.vcap if views_cap is None else views_cap
    return native.lib().zct_queue_take(q._handle, s.buf, s.cap, timeout, s.views, cap, s.nviews)


def go_get(q, s=None):
    """Go's get of q's next record into s: its status."""
    s = s or records.Scratch()
    return native.lib().zct_queue_get(q._handle, s.buf, s.cap, 0, *s.get_args())


def message(status):
    """What the last failed call said of itself."""
    return str(native.error(status)) if status < 0 else ""


def counters(q):
    """The queue's ring size and its `puts << 32 | tail` and `gets << 32 | head` words."""
    with open(os.path.join(SHM, q.name), "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        data = struct.unpack_from("<Q", m, 16)[0]
        return (
            struct.unpack_from("<Q", m, data)[0],
            struct.unpack_from("<Q", m, data + 96)[0],
            struct.unpack_from("<Q", m, data + 160)[0],
        )


def move_to(q, position):
    """Move an empty queue's head and tail to position (mod 2^32), as if
    that many bytes had gone through it; its counts of messages stay."""
    with open(os.path.join(SHM, q.name), "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        data = struct.unpack_from("<Q", m, 16)[0]
        tail, head = struct.unpack_from("<Q", m, data + 96)[0], struct.unpack_from("<Q", m, data + 160)[0]
        assert tail == head  # empty
        word = (tail >> 32) << 32 | position & 0xFFFFFFFF
        struct.pack_into("<Q", m, data + 96, word)
        struct.pack_into("<Q", m, data + 160, word)


def advance(q, offset):
    """Move q's next record to ring offset offset by putting and taking
    bytes records (8 bytes at least, a record's header)."""
    ring, tail, _ = counters(q)
    need = (offset - (tail & 0xFFFFFFFF)) % ring
    if 0 < need < 16:
        need += ring
    while need:
        n = min(need, ring // 2)
        if 0 < need - n < 16:
            n -= 16
        native.check(native.lib().zct_queue_put(q._handle, BYTES, bytes(n - 16), n - 16, native.lib().NULL_VIEWS, 0, 0))
        assert q.get(timeout=HANG) == bytes(n - 16)
        need -= n


def assert_same_view(c, go):
    """The views a take and a get wrote of one inline array."""
    ffi = native.ffi()
    for a, b in ((c.views[0], go.views[0]),):
        for f in ("offset", "nbytes", "dtype", "ndim", "kind", "flags"):
            assert getattr(a, f) == getattr(b, f), f
        assert list(a.shape[0 : a.ndim]) == list(b.shape[0 : b.ndim])
        assert list(a.strides[0 : a.ndim]) == list(b.strides[0 : b.ndim])
        at_c = int(ffi.cast("uintptr_t", a.data)) - int(ffi.cast("uintptr_t", c.buf))
        at_go = int(ffi.cast("uintptr_t", b.data)) - int(ffi.cast("uintptr_t", go.buf))
        assert at_c == at_go == a.offset
        assert ffi.buffer(a.data, a.nbytes)[:] == ffi.buffer(b.data, b.nbytes)[:]


# -- forged records: the plane's take refuses each as Go's get does -----------------------------


@pytest.mark.parametrize("lie", LIES.values(), ids=LIES.keys())
def test_the_plane_refuses_a_forged_record_as_go_does(q, lie):
    """The same forged bytes, twice: the plane's take and Go's get give
    the same status, and say it is malformed; a refused record is gone and
    the good one after it is read."""
    forge(q, lie)
    forge(q, lie)
    q.put(np.arange(3))
    r_c = take(q)
    m_c = message(r_c)
    r_go = go_get(q)
    assert r_c == r_go, (m_c, message(r_go))
    if r_c == native.E_RANGE:  # room for its views asked: the record stays, q.get says the rest
        return
    assert r_c == E_CORRUPT
    assert m_c.startswith("malformed message") and message(r_go).startswith("malformed message")
    assert np.array_equal(q.get(timeout=HANG), np.arange(3))
    assert q.empty()


# Inline records that keep every rule but sit where a taker may trip.
GOOD = {
    "a scalar": inline(I32, (), struct.pack("<i", -7)),
    "no element": inline(U8, (0, 5), b""),
    "32 dimensions": inline(U8, (1,) * 32, b"\x2a"),
    "1000 bytes": inline(U8, (10, 100), bytes(range(250)) * 4),
    "read-only": inline(U8, (3,), b"abc", flags=4),
}


@pytest.mark.parametrize("payload", GOOD.values(), ids=GOOD.keys())
@pytest.mark.parametrize("back", [8, 16, 24, 256])
def test_an_inline_record_across_the_ring_s_end(q, payload, back):
    """A record that starts back bytes before the ring's end and goes on
    at offset 0: the plane's take and Go's get give the same view and bytes."""
    ring, _, _ = counters(q)
    rec = record(INLINE, payload)
    c, go = records.Scratch(), records.Scratch()
    advance(q, ring - back)
    forge(q, rec)
    r = take(q, c)
    assert r >= 0, message(r)
    advance(q, ring - back)  # a lap on: the same record where the first was
    forge(q, rec)
    assert go_get(q, go) == 0
    assert r == go.plen[0] | go.off[0] << records.OFFSET_SHIFT | go.typ[0] << records.TYPE_SHIFT
    assert c.nviews[0] == go.nviews[0] == 1
    assert_same_view(c, go)


@pytest.mark.parametrize("lie", ["fewer bytes than the shape's", "reserved word", "ndim past the max"])
def test_a_forged_record_across_the_ring_s_end_is_refused_and_gone(q, lie):
    ring, _, _ = counters(q)
    advance(q, ring - 8)
    forge(q, LIES[lie])
    q.put(np.arange(4))
    r = take(q)
    assert r == E_CORRUPT and message(r).startswith("malformed message")
    assert np.array_equal(q.get(timeout=HANG), np.arange(4))
    assert q.empty()


@pytest.mark.parametrize("position", [(1 << 31) - 8, 1 << 31, (1 << 32) - 8, (1 << 32) - 64, 0])
def test_inline_arrays_at_positions_past_2_31_and_2_32(q, position):
    """Positions count bytes modulo 2^32: inline arrays put and taken by the
    plane across 2^31 and 2^32 arrive whole, and forged ones are refused."""
    move_to(q, position)
    lib = native.lib()
    sent = [np.arange(n, dtype=np.int32) * 3 - 5 for n in range(0, 40, 3)]
    for a in sent:
        native.check(lib.zct_queue_put_inline(q._handle, native.ffi().from_buffer(a), a.nbytes, I32, 1, [a.size], 0, 0))
    for a in sent:
        s = records.Scratch()
        r = take(q, s)
        assert r >= 0 and s.nviews[0] == 1, message(r)
        v = s.views[0]
        got = np.frombuffer(native.ffi().buffer(v.data, v.nbytes), np.int32) if v.nbytes else np.empty(0, np.int32)
        assert list(v.shape[0:1]) == [a.size] and np.array_equal(got, a)
    assert q.empty()
    forge(q, LIES["fewer bytes than the shape's"])
    q.put(np.arange(2))
    assert take(q) == E_CORRUPT
    assert np.array_equal(q.get(timeout=HANG), np.arange(2))
    _, tail, head = counters(q)
    assert tail == head


# -- zct_queue_put_inline at the edges of its arguments -----------------------------------------


def put_inline(q, data, nbytes, dtype, ndim, shape, flags=0, timeout=0):
    return native.lib().zct_queue_put_inline(q._handle, data, nbytes, dtype, ndim, shape, flags, timeout)


def test_put_inline_edges_that_are_arrays(q):
    """A scalar with no shape pointer, an empty array with no data, 32
    dimensions of 1: each put by the plane arrives as it is."""
    ffi = native.ffi()
    one = ffi.new("int32_t *", 41)
    assert put_inline(q, one, 4, I32, 0, ffi.NULL) == 0
    assert put_inline(q, ffi.NULL, 0, I32, 1, [0]) == 0
    assert put_inline(q, ffi.NULL, 0, I32, 3, [2, 0, 1 << 40]) == 0
    assert put_inline(q, one, 4, I32, 32, [1] * 32) == 0
    got = q.get(timeout=HANG)
    assert got.shape == () and got == 41
    assert q.get(timeout=HANG).shape == (0,)
    assert q.get(timeout=HANG).shape == (2, 0, 1 << 40)
    got = q.get(timeout=HANG)
    assert got.shape == (1,) * 32 and got.item() == 41
    assert q.empty()


BAD_PUTS = {
    "dtype 0": (0, 1, [1], 1, 0, zctipc.UnsupportedDtype),
    "dtype 16": (16, 1, [1], 1, 0, zctipc.UnsupportedDtype),
    "dtype 63": (63, 1, [1], 1, 0, zctipc.UnsupportedDtype),
    "dtype 64": (64, 1, [1], 1, 0, zctipc.UnsupportedDtype),
    "dtype 65535": (65535, 1, [1], 1, 0, zctipc.UnsupportedDtype),
    "dtype -1": (-1, 1, [1], 1, 0, zctipc.UnsupportedDtype),
    "dtype 2^16 + uint8": (65536 + U8, 1, [1], 1, 0, zctipc.UnsupportedDtype),
    "dtype 15, 1 byte": (15, 1, [1], 1, 0, zctipc.InvalidArgument),
    "flags -1": (U8, 1, [1], 1, -1, zctipc.InvalidArgument),
    "flags 8": (U8, 1, [1], 1, 8, zctipc.InvalidArgument),
    "ndim -1": (U8, -1, [1], 1, 0, zctipc.InvalidArgument),
    "ndim 2^31 - 1": (U8, (1 << 31) - 1, [1], 1, 0, zctipc.InvalidArgument),
    "shape past the bytes": (U8, 1, [2], 1, 0, zctipc.InvalidArgument),
    "1 GiB, exactly": (U8, 1, [1 << 30], 1 << 30, 0, zctipc.InvalidArgument),
    "1 GiB and one byte": (U8, 1, [(1 << 30) + 1], (1 << 30) + 1, 0, zctipc.InvalidArgument),
    "2^64 - 1 bytes": (U8, 1, [1], (1 << 64) - 1, 0, zctipc.InvalidArgument),
}


@pytest.mark.parametrize("dtype, ndim, shape, nbytes, flags, error", BAD_PUTS.values(), ids=BAD_PUTS.keys())
def test_an_inline_put_past_the_rules_puts_nothing(q, dtype, ndim, shape, nbytes, flags, error):
    """Refused with Go's reason; data of one byte is never read past (a
    length of 1 GiB is bounded by the queue before any byte is copied)."""
    data = native.ffi().new("char[]", 1)
    r = put_inline(q, data, nbytes, dtype, ndim, shape, flags)
    assert r < 0
    with pytest.raises(error):
        native.check(r)
    assert q.empty()


def test_put_inline_null_pointers(q):
    ffi = native.ffi()
    assert put_inline(q, ffi.NULL, 1, U8, 1, [1]) == native.E_INVALID  # bytes, but no data
    assert put_inline(q, ffi.new("char[]", 1), 1, U8, 1, ffi.NULL) == native.E_INVALID  # a dimension, no shape
    assert q.empty()


def test_put_inline_on_a_closed_handle():
    q = zctipc.Queue(max_bytes=1 << 20)
    h = q._handle
    q.close()
    r = native.lib().zct_queue_put_inline(h, native.ffi().new("char[]", 1), 1, U8, 1, [1], 0, 0)
    assert r == native.E_CLOSED


# -- zct_queue_take at the edges of its arguments -----------------------------------------------


def test_take_with_bad_arguments_leaves_the_inline_record(q):
    """A take with no room, or a NULL where it writes, takes nothing."""
    ffi = native.ffi()
    lib = native.lib()
    q.put(np.arange(3, dtype=np.int32))
    s = records.Scratch()
    assert take(q, s, views_cap=-1) == native.E_INVALID
    assert lib.zct_queue_take(q._handle, s.buf, s.cap, 0, ffi.NULL, 1, s.nviews) == native.E_INVALID
    assert lib.zct_queue_take(q._handle, s.buf, s.cap, 0, s.views, 1, ffi.NULL) == native.E_INVALID
    assert lib.zct_queue_take(q._handle, ffi.NULL, s.cap, 0, s.views, 1, s.nviews) == native.E_INVALID
    assert lib.zct_queue_take(q._handle, s.buf, 8, 0, s.views, 1, s.nviews) == native.E_RANGE  # too small a buffer
    assert take(q, s, views_cap=0) == native.E_RANGE
    r = take(q, s, views_cap=1)
    assert r >= 0 and s.nviews[0] == 1 and s.views[0].kind == lib.ZCT_REF_INLINE
    assert q.empty()


# -- full queues, threads, closing ---------------------------------------------------------------


def test_put_inline_into_a_full_queue():
    """With no time to wait: ZCT_E_FULL at once; with time, the put waits
    for a take in another thread and goes in."""
    q = zctipc.Queue(maxsize=2, max_bytes=1 << 20)
    try:
        data = native.ffi().new("char[]", b"abcd")
        assert put_inline(q, data, 4, U8, 1, [4]) == 0
        assert put_inline(q, data, 4, U8, 1, [4]) == 0
        assert put_inline(q, data, 4, U8, 1, [4]) == native.E_FULL
        assert "full" in message(native.E_FULL)
        t = threading.Timer(0.2, lambda: take(q))
        t.start()
        assert put_inline(q, data, 4, U8, 1, [4], timeout=HANG * 1000) == 0
        t.join()
        assert q.qsize() == 2
    finally:
        q.close()


def test_many_threads_put_and_take_inline_arrays():
    """Four threads put by the plane while four take by it: every array
    arrives once, whole."""
    q = zctipc.Queue(maxsize=16, max_bytes=1 << 16)
    per, producers = 300, 4
    got, errors = [], []
    lock = threading.Lock()

    def produce(k):
        try:
            for i in range(per):
                a = np.array([k, i, k * per + i], np.int32)
                native.check(put_inline(q, native.ffi().from_buffer(a), 12, I32, 1, [3], timeout=HANG * 1000))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def consume(n):
        s = records.Scratch()
        try:
            for _ in range(n):
                r = take(q, s, timeout=HANG * 1000)
                native.check(r if r < 0 else 0)
                v = s.views[0]
                assert s.nviews[0] == 1 and v.nbytes == 12 and v.dtype == I32
                with lock:
                    got.append(tuple(np.frombuffer(native.ffi().buffer(v.data, 12), np.int32)))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(producers)]
    threads += [threading.Thread(target=consume, args=(per,)) for _ in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG * 4)
    try:
        assert not errors, errors
        assert not any(t.is_alive() for t in threads)
        assert sorted(got) == sorted((k, i, k * per + i) for k in range(producers) for i in range(per))
        assert q.empty()
    finally:
        q.close()


def test_a_queue_closed_while_the_plane_s_take_waits():
    """Takes asleep in the plane wake when their queue closes and say so."""
    q = zctipc.Queue(max_bytes=1 << 20)
    h = q._handle

    def call():
        s = records.Scratch()
        r = native.lib().zct_queue_take(h, s.buf, s.cap, -1, s.views, s.vcap, s.nviews)
        native.check(r if r < 0 else 0)

    outcome, alive = closed_while_blocked(call, q.close, 3, HANG)
    assert not alive
    assert outcome == ["closed"] * 3
