"""Attacks on ``zctipc tail`` and ``zctipc top``: hostile pickles in a
message, forged cursors passed to the C calls, a ring truncated under a
peek, and a segment directory holding garbage."""

import io
import os
import pickle
import struct
import subprocess
import sys

import pytest

from zctipc import observe
from zctipc._core import native

pytestmark = pytest.mark.slow


def G(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def INT(n):
    return b"I%d\n" % n


def _memo_bomb(wrap):
    """A pickle of a 1000-long list L of one 1000-long list M, then wrap
    (whose memo refs h\\x01 are to L): small, with a repr of 10^9 items."""
    p = b"\x80\x02]q\x00(" + b"K\x07" * 1000 + b"e"
    p += b"]q\x01(" + b"h\x00" * 1000 + b"e"
    return p + b"0" + wrap + b"."


BOMBS = {
    "list of a huge range": G("builtins", "list") + b"(" + G("builtins", "range") + b"(" + INT(10**12) + b"tRtR.",
    "bytearray of 16 GiB": G("builtins", "bytearray") + b"(" + INT(1 << 34) + b"tR.",
    "frozenset of a range": G("builtins", "frozenset") + b"(" + G("builtins", "range") + b"(" + INT(10**10) + b"tRtR.",
    "Counter of a range": G("collections", "Counter") + b"(" + G("builtins", "range") + b"(" + INT(10**10) + b"tRtR.",
    "Fraction 1e999999999": G("fractions", "Fraction") + b"(V1e999999999\ntR.",
    "1 GiB claimed bytes": b"\x80\x04\x8e" + struct.pack("<Q", 1 << 30) + b"abc.",
    "a list copied a million times": b"\x80\x02]q\x00("
    + b"K\x07" * 100_000
    + b"e0"
    + (G("builtins", "tuple") + b"h\x00\x85R0") * 1_000_000
    + b"N.",
    "deque of a memo bomb": _memo_bomb(G("collections", "deque") + b"]q\x02(" + b"h\x01" * 1000 + b"e\x85R"),
    "slice of a memo bomb": _memo_bomb(G("builtins", "slice") + b"]q\x02(" + b"h\x01" * 1000 + b"eh\x02h\x02\x87R"),
    "deep nesting": b"\x80\x02" + b"]" * 200_000 + b"a" * 199_999 + b".",
}

SHOW = """
import io, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from zctipc import observe
data = sys.stdin.buffer.read()
try:
    print(observe.summarize(observe._Unpickler(io.BytesIO(data), []).load()))
except Exception as exc:
    print("refused", type(exc).__name__, exc)
"""


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_hostile_pickle_takes_bounded_time_and_memory(name):
    # In a child with 2 GiB of address space and 30 s: list(range(10**12))
    # grew until killed, the repr of a deque or slice of memo references
    # and Fraction("1e999999999") never ended.
    out = subprocess.run(
        [sys.executable, "-c", SHOW], input=BOMBS[name], capture_output=True, timeout=30, env=os.environ
    )
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    text = out.stdout.decode()
    assert len(text) <= observe.WIDTH + 1
    assert "MemoryError" not in text, text


def test_a_pickle_runs_none_of_the_senders_code(tmp_path):
    mark = tmp_path / "ran"
    for p in (
        G("os", "system") + b"(V touch " + str(mark).encode() + b"\ntR.",
        G("builtins", "eval") + b"(V__import__('os').system('touch " + str(mark).encode() + b"')\ntR.",
        G("builtins", "getattr") + b"(" + G("builtins", "object") + b"V__subclasses__\ntR.",
        # copyreg._reconstructor with a stand-in base runs nothing either
        G("copyreg", "_reconstructor") + b"(" + G("os", "system") + G("os", "system") + b"Vtouch x\ntR.",
    ):
        text = observe.summarize(observe._Unpickler(io.BytesIO(p), []).load())
        assert text.startswith("<os.system") or text.startswith("<builtins."), text
    assert not mark.exists()


def test_legitimate_pickles_still_show():
    import collections
    import fractions

    for obj, want in (
        (fractions.Fraction(3, 7), "Fraction(3, 7)"),
        (collections.deque([1, 2, 3], maxlen=10**9), "deque([1, 2, 3])"),
        (slice(1, 5, 2), "slice(1, 5, 2)"),
        (set(range(100)), "set({0, 1"),
        (bytearray(b"abc"), "bytearray[3]"),
        (collections.Counter("hello"), "'l': 2"),
    ):
        for protocol in (0, 2, 3, 5):  # 0 to 2 name __builtin__ (Note [pickles of protocols 0 to 2])
            data = pickle.dumps(obj, protocol=protocol)
            assert want in observe.summarize(observe._Unpickler(io.BytesIO(data), []).load()), (obj, protocol)


# -- the C calls, through cffi -----------------------------------------------


def _peek(q, cursor, cap=4096, vcap=4, buf=True):
    ffi, lib = native.ffi(), native.lib()
    c = ffi.new("uint64_t *", cursor)
    raw = ffi.new("char[]", max(cap, 1)) if buf else ffi.NULL
    out = [ffi.new(t) for t in ("int32_t *", "uint64_t *", "uint64_t *")]
    nviews, missed = ffi.new("int32_t *"), ffi.new("uint64_t *")
    views = ffi.new("zct_view[]", vcap) if vcap else ffi.NULL
    status = lib.zct_queue_peek(q, c, raw, cap if buf else 0, *out, views, vcap, nviews, missed)
    return status, c[0], missed[0]


def _handle(q):
    return q._handle


@pytest.mark.parametrize("maxsize", [0, 50])
def test_forged_cursors_through_the_c_call(maxsize):
    import zctipc

    lib, ffi = native.lib(), native.ffi()
    q = zctipc.Queue(maxsize=maxsize)
    try:
        for i in range(3):
            q.put(b"x" * (10 + i))
        h = _handle(q)
        status, first, _ = _peek(h, lib.ZCT_PEEK_OLDEST)
        assert status == 0
        count, pos = first >> 32, first & 0xFFFFFFFF
        w = lambda c, p: (c % (1 << 32)) << 32 | (p % (1 << 32))  # noqa: E731
        for cursor in (
            w(count + 1000, pos),
            w(count + (1 << 31) - 1, pos),
            w(count + 1, pos + 4),
            w(count + 1, pos + (1 << 31)),
        ):
            status, after, _ = _peek(h, cursor)
            assert status == native.E_INVALID, (hex(cursor), native.error(status))
            assert after == cursor, "left as it was"
        # Far behind: counted as passed, then the oldest record.
        status, _, missed = _peek(h, w(count - 1000, pos))
        assert status in (0, -7) and missed <= 1000
        # A buffer too small: the record's size, the cursor kept; NULL: passed over.
        status, after, _ = _peek(h, first, cap=8)
        assert status == native.E_RANGE and after == first
        status, after, _ = _peek(h, first, buf=False)
        assert status == 0 and after != first
        # NULL pointers where a pointer is needed.
        out = [ffi.new(t) for t in ("int32_t *", "uint64_t *", "uint64_t *", "int32_t *", "uint64_t *")]
        c = ffi.new("uint64_t *", first)
        assert lib.zct_queue_peek(h, ffi.NULL, ffi.NULL, 0, *out[:3], ffi.NULL, 0, out[3], out[4]) == native.E_INVALID
        assert lib.zct_queue_peek(h, c, ffi.NULL, 64, *out[:3], ffi.NULL, 0, out[3], out[4]) == native.E_INVALID
        assert (
            lib.zct_queue_peek(h, c, ffi.new("char[]", 64), 64, *out[:3], ffi.NULL, 4, out[3], out[4])
            == native.E_INVALID
        )
        # A handle that is no queue's.
        for bad in (0, h + 12345, (1 << 64) - 1):
            assert _peek(bad, first)[0] not in (0, native.E_EMPTY, native.E_RANGE)
        assert q.qsize() == 3, "peeking took nothing"
    finally:
        q.close()
    assert _peek(h, first)[0] not in (0, native.E_EMPTY, native.E_RANGE), "a closed handle"
