"""Attacks on the queue hand-over (go/internal/handover, zct_queue_put_inline,
inline views): records a writer who lies puts in the ring (inline headers
that say what their bytes are not, descriptors replayed, a header claiming
every descriptor), get_many over runs with bad messages among good ones,
arrays of every layout and dtype through put, torch tensors of every dtype
inline, consumers and producers killed in the middle, waiters on a full
queue closed, tail of forged records, Go and Python reading each other's
inline records, and zctipc.h against what Python reads of it."""

import inspect
import mmap
import os
import re
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from _procs import closed_while_blocked, go_echo, go_on, held, python
from conftest import SWEEP_TIMEOUT, daemon_pid, slots_in_use

import zctipc
from zctipc import queues
from zctipc._core import dtypes, native
from zctipc._wire import records

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HEADER = os.path.join(ROOT, "go", "capi", "zctipc.h")
HANG = 30  # seconds that only a hang takes
SHM = os.environ.get("ZCTIPC_SHM_DIR") or "/dev/shm"
RING_AT = 512  # where a queue's ring starts in its data (docs/format.md, "Queues")
HEADER_SIZE = 16  # a record's header (docs/format.md, "Records")
U8, F32, F64 = dtypes.CODES["uint8"], dtypes.CODES["float32"], dtypes.CODES["float64"]
INLINE, BYTES = 4, 3


# -- writing records as a writer who lies would ------------------------------------------


def record(typ, payload, ndesc=0, plen=None):
    """A record of type typ claiming ndesc descriptors and a payload of plen
    bytes (len(payload) unless told), whose body is payload, padded."""
    body = struct.pack("<IBBHII", 0, typ, 0, ndesc, len(payload) if plen is None else plen, 0) + payload
    body += b"\0" * (-len(body) % 8)
    return struct.pack("<I", len(body)) + body[4:]


def inline(code, shape, data, flags=0, ndim=None, reserved=0):
    """An inline array's payload as its header says it, true or not."""
    ndim = len(shape) if ndim is None else ndim
    return struct.pack("<HBBI", code, flags, ndim, reserved) + struct.pack(f"<{len(shape)}q", *shape) + data


def forge(q, *raws, name=None, shm=SHM):
    """Put each of raws (whole records) into the queue as its next records:
    bytes records of their sizes are put, then overwritten in the ring."""
    lib = native.lib()
    for r in raws:
        assert len(r) % 8 == 0 and len(r) >= HEADER_SIZE
        native.check(
            lib.zct_queue_put(q._handle, BYTES, bytes(len(r) - HEADER_SIZE), len(r) - HEADER_SIZE, lib.NULL_VIEWS, 0, 0)
        )
    with open(os.path.join(shm, name or q.name), "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        data = struct.unpack_from("<Q", m, 16)[0]  # the segment header's data offset
        ring = struct.unpack_from("<Q", m, data)[0]
        at = (struct.unpack_from("<Q", m, data + 96)[0] & 0xFFFFFFFF) - sum(map(len, raws))
        for r in raws:
            for i in range(0, len(r), 8):
                pos = data + RING_AT + (at + i) % ring
                m[pos : pos + 8] = r[i : i + 8]
            at += len(r)


def ring_record(q, shm=SHM):
    """The bytes of the queue's oldest record, read from its ring."""
    with open(os.path.join(shm, q.name), "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        data = struct.unpack_from("<Q", m, 16)[0]
        head = struct.unpack_from("<Q", m, data + 160)[0] & 0xFFFFFFFF
        size = struct.unpack_from("<I", m, data + RING_AT + head)[0]
        return bytes(m[data + RING_AT + head : data + RING_AT + head + size])


@pytest.fixture
def q():
    q = zctipc.Queue(max_bytes=1 << 20)
    yield q
    q.close()


# Forged inline records that lie: each is refused whole, and the queue goes on.
LIES = {
    "ndim past the max": record(INLINE, inline(U8, (1,) * 33, b"\1")),
    "ndim 255": record(INLINE, inline(U8, (), b"", ndim=255)),
    "shape past 2^63": record(INLINE, inline(F64, (1 << 32, 1 << 32), b"")),
    "shape past 2^64": record(INLINE, inline(U8, (1 << 62, 8), b"")),
    "empty shape past 2^63": record(INLINE, inline(F64, (0, 1 << 32, 1 << 32), b"")),
    "negative dimension": record(INLINE, inline(U8, (-1,), b"")),
    "fewer bytes than the shape's": record(INLINE, inline(F32, (3,), bytes(8))),
    "more bytes than the shape's": record(INLINE, inline(F32, (1,), bytes(8))),
    "array past the record": record(INLINE, inline(U8, (100,), bytes(8))),
    "payload past the record": record(INLINE, inline(U8, (8,), bytes(8)), plen=200),
    "shape past the payload": record(INLINE, inline(U8, (0,), b"", ndim=4)),
    "unknown dtype": record(INLINE, inline(99, (1,), b"\0")),
    "dtype 0": record(INLINE, inline(0, (1,), b"\0")),
    "flags high bit": record(INLINE, inline(U8, (1,), b"\0", flags=0x80)),
    "flags bit 3": record(INLINE, inline(U8, (1,), b"\0", flags=8)),
    "reserved word": record(INLINE, inline(U8, (1,), b"\0", reserved=1)),
    "a descriptor claimed": record(INLINE, inline(U8, (1,), b"\0"), ndesc=1),
    "every descriptor claimed": record(INLINE, inline(U8, (1,), b"\0"), ndesc=0xFFFF),
    "no payload": record(INLINE, b""),
    "record type 0": record(0, inline(U8, (1,), b"\0")),
    "record type 9": record(9, b"abc"),
}


@pytest.mark.parametrize("lie", LIES.values(), ids=LIES.keys())
@pytest.mark.parametrize("how", ["get", "get_many"])
def test_a_forged_inline_record_is_refused_and_the_queue_goes_on(q, lie, how):
    forge(q, lie)
    q.put(np.arange(3))
    with pytest.raises(zctipc.CorruptHeader, match="malformed"):
        q.get(timeout=HANG) if how == "get" else q.get_many(10, timeout=HANG)
    got = q.get(timeout=HANG) if how == "get" else q.get_many(10, timeout=HANG)[0]
    assert np.array_equal(got, np.arange(3))
    assert q.empty()


# Inline records at the edges of an array: each is one.
EDGES = {
    "no element": (inline(F32, (0,), b""), np.empty(0, np.float32)),
    "a scalar": (inline(F64, (), struct.pack("<d", 2.5)), np.array(2.5)),
    "a bool scalar": (inline(dtypes.CODES["bool"], (), b"\1"), np.array(True)),
    "0 beside 2^62": (inline(U8, (0, 1 << 62), b""), np.empty((0, 1 << 62), np.uint8)),
    "32 dimensions": (inline(dtypes.CODES["complex128"], (1,) * 32, bytes(16)), np.zeros((1,) * 32, complex)),
    "read-only": (inline(U8, (2,), b"ab", flags=4), np.frombuffer(b"ab", np.uint8)),
}


@pytest.mark.parametrize("payload, want", EDGES.values(), ids=EDGES.keys())
def test_inline_records_at_the_edges(q, payload, want):
    forge(q, record(INLINE, payload), record(INLINE, payload))
    for got in (q.get(timeout=HANG), q.get_many(1, timeout=HANG)[0]):
        assert isinstance(got, np.ndarray)
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        assert np.array_equal(got, want)
        assert got.flags.writeable == want.flags.writeable


# -- get_many over runs with bad messages among good ones -----------------------------------


class Unbuildable:
    """Pickles, and raises when a receiver unpickles it."""

    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise RuntimeError("this message cannot be built here")


def test_get_many_gives_the_good_messages_around_a_bad_one(q):
    """Note [a bad message among good ones] in zctipc.queues: the messages
    before the bad one are returned, it raises at the next get, and those
    after it follow; no count is left behind."""
    base = slots_in_use()
    big = np.arange(100_000, dtype=np.float64)  # past inline_bytes: a pool buffer
    q.put(big)
    q.put({"big": big + 1, "small": np.arange(3)})
    forge(q, LIES["array past the record"])
    q.put(np.arange(4))
    q.put(b"bytes")
    q.put((1, "two"))
    assert slots_in_use() == base + 2
    first = q.get_many(10, timeout=HANG)
    assert len(first) == 2
    assert np.array_equal(first[0], big) and zctipc.is_shared(first[0])
    assert np.array_equal(first[1]["big"], big + 1) and np.array_equal(first[1]["small"], np.arange(3))
    assert q.qsize() == 4, "the bad message and those after it wait"
    with pytest.raises(zctipc.CorruptHeader, match="malformed"):
        q.get_many(10)
    rest = q.get_many(10)
    assert np.array_equal(rest[0], np.arange(4)) and rest[1:] == [b"bytes", (1, "two")]
    assert q.empty()
    del first
    assert slots_in_use() == base


def test_get_many_raises_at_once_for_a_bad_first_message(q):
    forge(q, LIES["unknown dtype"])
    q.put(np.arange(2))
    q.put(b"after")
    with pytest.raises(zctipc.CorruptHeader, match="dtype"):
        q.get_many(10, timeout=HANG)
    assert q.qsize() == 2
    assert np.array_equal(q.get(), np.arange(2))
    assert q.get_many(10) == [b"after"]


def test_two_bad_messages_each_raise_once(q):
    q.put(1)
    forge(q, LIES["flags high bit"], LIES["ndim 255"])
    q.put(2)
    assert q.get_many(10, timeout=HANG) == [1]
    with pytest.raises(zctipc.CorruptHeader):
        q.get()
    with pytest.raises(zctipc.CorruptHeader):
        q.get_many(1)
    assert q.get_many(1) == [2]
    assert q.empty()


def test_a_replayed_descriptor_costs_only_its_message(q):
    """A descriptor record's bytes, saved before its consumer took it and
    put again: the replay takes no count (DescriptorTaken), and the
    messages beside it in a get_many are given whole."""
    base = slots_in_use()
    big = np.full(100_000, 7, np.uint8) + np.zeros(1, np.uint8)  # a pool buffer
    q.put(np.full(300_000, 3, np.uint8))
    saved = ring_record(q)
    first = q.get(timeout=HANG)
    q.put(np.full(300_000, 4, np.uint8))
    forge(q, saved)
    q.put(big)
    got = q.get_many(10, timeout=HANG)
    assert len(got) == 1 and (got[0] == 4).all()
    with pytest.raises(zctipc.DescriptorTaken):
        q.get()
    after = q.get()
    assert np.array_equal(after, big)
    assert (first == 3).all(), "the replay took nothing from the first taker"
    del first, got, after
    assert slots_in_use() == base
    forge(q, saved)
    with pytest.raises(zctipc.DescriptorTaken):
        q.get(timeout=HANG)
    assert slots_in_use() == base


def test_a_message_that_cannot_be_built_costs_only_itself(q):
    """A pickle that raises as it is built, among messages with pool
    buffers: the others are given, and none of their counts is lost."""
    base = slots_in_use()
    for i in range(3):
        q.put(np.full(300_000, i, np.uint8))
        q.put(Unbuildable())
    q.put(np.full(300_000, 3, np.uint8))
    got = q.get_many(10, timeout=HANG)
    assert len(got) == 1 and (got[0] == 0).all()
    for i in range(1, 4):
        with pytest.raises(RuntimeError, match="cannot be built"):
            q.get_many(10)
        (a,) = q.get_many(1)
        assert (a == i).all()
    assert q.empty()
    del got, a
    assert slots_in_use() == base


def test_views_room_of_zero_and_one():
    """Through the C ABI, as any caller: an inline record needs room for
    one view; a pickle with two descriptors for two, and no more."""
    ffi, lib = native.ffi(), native.lib()
    q = zctipc.Queue(max_bytes=1 << 20)
    try:
        q.put(np.arange(3))
        q.put([np.zeros(300_000, np.uint8), np.ones(300_000, np.uint8)])
        buf = bytearray(1 << 20)
        views = ffi.new("zct_view[]", 2)
        n = ffi.new("int32_t *")
        get = ffi.new("int32_t *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
        assert lib.zct_queue_take(q._handle, ffi.from_buffer(buf), len(buf), 0, views, 0, n) == native.E_RANGE
        assert lib.zct_queue_get(q._handle, ffi.from_buffer(buf), len(buf), 0, *get, views, 0, n) == native.E_RANGE
        assert n[0] == 1
        r = lib.zct_queue_take(q._handle, ffi.from_buffer(buf), len(buf), 0, views, 1, n)
        assert r >= 0 and r >> lib.ZCT_TAKE_TYPE_SHIFT == lib.ZCT_RECORD_INLINE and n[0] == 1
        assert views[0].ref == 0 and views[0].kind == lib.ZCT_REF_INLINE
        assert lib.zct_queue_take(q._handle, ffi.from_buffer(buf), len(buf), 0, views, 1, n) == native.E_RANGE
        assert lib.zct_queue_get(q._handle, ffi.from_buffer(buf), len(buf), 0, *get, views, 1, n) == native.E_RANGE
        assert n[0] == 2
        got = q.get(timeout=HANG)
        assert (got[0] == 0).all() and (got[1] == 1).all()
    finally:
        q.close()


# -- arrays of every layout and dtype through put --------------------------------------------

_BASE = np.arange(24, dtype=np.float64).reshape(4, 6)
LAYOUTS = {
    "non-contiguous": _BASE[:, ::2],
    "Fortran order": np.asfortranarray(_BASE),
    "negative strides": _BASE[::-1, ::-2],
    "big-endian": _BASE.astype(">f8"),
    "bool": _BASE > 5,
    "complex64": (_BASE * 1j).astype(np.complex64),
    "complex128": _BASE * 1j,
    "float16": _BASE.astype(np.float16),
    "datetime64": np.arange(3).astype("datetime64[s]"),
    "timedelta64": np.arange(3).astype("timedelta64[ms]"),
    "a scalar": np.array(3.5),
    "a bool scalar": np.array(True),
    "no element": np.empty((0, 3)),
    "32 dimensions": np.zeros((1,) * 32),
    "33 dimensions": np.zeros((1,) * 33),
    "read-only": np.frombuffer(b"abcd", np.uint8),
    "broadcast": np.broadcast_to(np.arange(3), (4, 3)),
    "uint64 max": np.array([2**64 - 1], np.uint64),
}


@pytest.mark.parametrize("a", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("how", ["bare", "in a pickle", "get_many"])
def test_arrays_of_every_layout_arrive_as_they_were(q, a, how):
    q.put({"a": a} if how == "in a pickle" else a)
    got = q.get(timeout=HANG) if how != "get_many" else q.get_many(1, timeout=HANG)[0]
    if how == "in a pickle":
        got = got["a"]
    assert type(got) is np.ndarray
    assert (got.dtype, got.shape) == (a.dtype, a.shape)
    assert np.array_equal(got, a)
    assert not zctipc.is_shared(got), "a small array is a copy of its own"
    if a.dtype == np.float64 and a.ndim == 2 and a.size:
        got[0, 0] = -1  # writable, as the sender's was
        assert a[0, 0] != -1
    if not a.flags.writeable:
        assert not got.flags.writeable, "read-only, as the sender's was"


@pytest.mark.parametrize("inline_bytes", [64, 4096])
def test_arrays_at_the_inline_threshold_and_one_byte_past(inline_bytes):
    """An array of inline_bytes goes inside its message, a copy; one byte
    more goes through a pool buffer, shared."""
    q = zctipc.Queue(max_bytes=1 << 20, inline_bytes=inline_bytes)
    try:
        for n, inline_ in ((inline_bytes - 1, True), (inline_bytes, True), (inline_bytes + 1, False)):
            a = (np.arange(n) % 251).astype(np.uint8)
            for put in (q.put, lambda a: q.put([a])):
                put(a)
                got = q.get(timeout=HANG)
                got = got[0] if isinstance(got, list) else got
                assert np.array_equal(got, a)
                assert zctipc.is_shared(got) is not inline_, n
    finally:
        q.close()


# -- torch tensors of every dtype, inline -------------------------------------------------------


@pytest.mark.parametrize("name", list(dtypes.CODES))
@pytest.mark.parametrize("shape", [(3,), (2, 2), (), (0, 4)], ids=str)
def test_torch_tensors_of_every_dtype_inline(q, name, shape):
    """A record put inline with the torch flag (as a Go program relays a
    torch tensor that came inline) arrives as a torch tensor of its dtype,
    bfloat16 among them, read-only when the flag says so."""
    torch = pytest.importorskip("torch")
    ffi, lib = native.ffi(), native.lib()
    tdt = getattr(torch, name)
    t = (torch.arange(int(np.prod(shape, dtype=np.int64)) if shape else 1) % 2).to(tdt).reshape(shape)
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    for flags in (lib.ZCT_VIEW_TORCH, lib.ZCT_VIEW_TORCH | lib.ZCT_VIEW_READONLY):
        dims = list(shape) if shape else ffi.NULL
        native.check(
            lib.zct_queue_put_inline(
                q._handle, raw or ffi.NULL, len(raw), dtypes.CODES[name], len(shape), dims, flags, 0
            )
        )
        got = q.get(timeout=HANG)
        assert isinstance(got, torch.Tensor)
        assert got.dtype == tdt and tuple(got.shape) == shape
        assert torch.equal(got, t)


# -- processes killed in the middle -------------------------------------------------------------

_SENDER = """
import sys, numpy as np, zctipc
q = zctipc.Queue(max_bytes=1 << 20)
print(q.name, flush=True)
for i in range(6):
    q.put(np.full(300_000, i, np.uint8))  # past inline_bytes: pool buffers, by descriptor
print(zctipc.pool_stats().slots_in_use, flush=True)
sys.stdin.readline()
print(zctipc.pool_stats().slots_in_use, flush=True)
q.close()
"""

# Takes the oldest record as a get commits it (its head moves past it),
# then dies before it adopts the record's count.
_TAKE_AND_DIE = """
import mmap, os, signal, struct, sys, zctipc
name = sys.argv[1]
q = zctipc.Queue.attach(name)
with open(os.path.join(os.environ["ZCTIPC_SHM_DIR"], name), "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
    data = struct.unpack_from("<Q", m, 16)[0]
    word = struct.unpack_from("<Q", m, data + 160)[0]
    gets, head = word >> 32, word & 0xFFFFFFFF
    size = struct.unpack_from("<I", m, data + 512 + head)[0]
    struct.pack_into("<Q", m, data + 160, (gets + 1) << 32 | (head + size))
os.kill(os.getpid(), signal.SIGKILL)
"""

_GETTER = """
import sys, zctipc
q = zctipc.Queue.attach(sys.argv[1])
print(" ".join(str(int(a[0])) for a in (q.get(timeout=30) for _ in range(int(sys.argv[2])))), flush=True)
"""


def _wait_empty(env, timeout=SWEEP_TIMEOUT + 15):
    shm = env["ZCTIPC_SHM_DIR"]
    deadline = time.monotonic() + timeout
    while os.listdir(shm) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = os.listdir(shm)
    pid = daemon_pid(env["ZCTIPC_RUNTIME_DIR"])
    if pid:
        os.kill(pid, signal.SIGKILL)
    return left


def test_a_consumer_killed_between_take_and_adopt(isolated):
    """A consumer that took a record and died before it adopted the count
    the record carried: the other messages come, each once, and the count
    stays its sender's until the sender exits; then nothing is left."""
    with held(_SENDER, env=isolated) as sender:
        name = sender.stdout.readline().strip()
        assert sender.stdout.readline().strip() == "6"
        taker = subprocess.run([sys.executable, "-c", _TAKE_AND_DIE, name], env=isolated, timeout=HANG)
        assert taker.returncode == -signal.SIGKILL
        getter = python("-c", _GETTER, name, "5", env=isolated, timeout=HANG)
        assert getter.stdout.split() == ["1", "2", "3", "4", "5"]
        go_on(sender)
        assert sender.stdout.readline().strip() == "1", "the orphaned count is the sender's still"
        assert sender.wait(HANG) == 0
    assert _wait_empty(isolated) == []


_CONSUMER = """
import sys, time, zctipc
q = zctipc.Queue.attach(sys.argv[1])
print("ready", flush=True)
while True:
    a = q.get()
    assert (a == a[0]).all()
    time.sleep(0.002)  # at most some 80 of the 200 go before the three kills: some are left
"""


_MIXED_SENDER = """
import sys, numpy as np, zctipc
q = zctipc.Queue(max_bytes=1 << 22)
print(q.name, flush=True)
for i in range(200):
    q.put(np.full(10 if i % 2 else 150_000, i, np.uint16))
print('sent', flush=True)
sys.stdin.readline()
q.close()
"""

_GET_THE_REST = """
import sys, queue, zctipc
q = zctipc.Queue.attach(sys.argv[1])
seen = []
while True:
    try:
        a = q.get(timeout=1)
    except queue.Empty:
        break
    assert (a == a[0]).all() and a.size == (10 if a[0] % 2 else 150_000)
    seen.append(int(a[0]))
print(' '.join(map(str, seen)), flush=True)
"""


def test_consumers_killed_while_they_get(isolated):
    """Consumers SIGKILLed at random while they get small and large
    arrays: every message that is left comes whole, once and in order, and
    once all are gone nothing is left in shared memory."""
    with held(_MIXED_SENDER, env=isolated) as sender:
        name = sender.stdout.readline().strip()
        for delay in (0.01, 0.05, 0.1):
            c = subprocess.Popen(
                [sys.executable, "-c", _CONSUMER, name], stdout=subprocess.PIPE, text=True, env=isolated
            )
            assert c.stdout.readline().strip() == "ready"
            time.sleep(delay)
            c.kill()
            c.wait()
        assert sender.stdout.readline().strip() == "sent"
        getter = python("-c", _GET_THE_REST, name, env=isolated, timeout=120)
        seen = [int(i) for i in getter.stdout.split()]
        assert seen and seen == list(range(seen[0], 200)), "those left, each once, in order"
        go_on(sender)
        assert sender.wait(HANG) == 0
    assert _wait_empty(isolated) == []


_BLOCKED_PRODUCER = """
import sys, numpy as np, zctipc
q = zctipc.Queue.attach(sys.argv[1])
print("putting", flush=True)
q.put(np.arange(3, dtype=np.int16))  # the queue is full: it waits
print("put", flush=True)
"""


def test_a_producer_killed_while_it_waits_in_put_inline(isolated):
    """Producers killed while they wait for room in put_inline on a full
    queue: they put nothing, and the queue takes and gives on."""
    env = isolated
    code = (
        "import sys, subprocess, time, numpy as np, zctipc\n"
        "q = zctipc.Queue(1, max_bytes=4096)\n"
        "q.put(np.arange(2, dtype=np.int8))\n"
        "ps = [subprocess.Popen([sys.executable, '-c', sys.argv[1], q.name], stdout=subprocess.PIPE, text=True)"
        " for _ in range(3)]\n"
        "for p in ps:\n"
        "    assert p.stdout.readline().strip() == 'putting'\n"
        "time.sleep(0.5)\n"
        "for p in ps:\n"
        "    p.kill(); p.wait()\n"
        "got = q.get(timeout=5)\n"
        "assert got.dtype == np.int8 and list(got) == [0, 1], got\n"
        "assert q.empty(), q.qsize()\n"
        "q.put(np.arange(5, dtype=np.float32))\n"
        "assert list(q.get(timeout=5)) == [0, 1, 2, 3, 4]\n"
        "q.close()\n"
        "print('ok', flush=True)\n"
    )
    out = python("-c", code, _BLOCKED_PRODUCER, env=env, timeout=120)
    assert out.stdout.strip() == "ok"
    assert _wait_empty(env) == []


_PRODUCER = """
import sys, numpy as np, zctipc
q = zctipc.Queue.attach(sys.argv[1])
print("putting", flush=True)
i = 0
while True:
    i += 1
    q.put(np.full(1 + i % 900, i % 251, np.uint8))
"""


def test_producers_killed_at_random_inside_put_inline(isolated):
    """Producers of small arrays SIGKILLed at random, inside put_inline or
    between: every record in the queue is whole, and puts go on."""
    code = (
        "import sys, subprocess, time, random, queue, numpy as np, zctipc\n"
        "q = zctipc.Queue(max_bytes=1 << 16)\n"
        "rng = random.Random(1)\n"
        "for round in range(6):\n"
        "    p = subprocess.Popen([sys.executable, '-c', sys.argv[1], q.name], stdout=subprocess.PIPE, text=True)\n"
        "    p.stdout.readline()\n"
        "    time.sleep(rng.uniform(0.001, 0.05))\n"
        "    p.kill(); p.wait()\n"
        "    while True:\n"
        "        try:\n"
        "            a = q.get(timeout=0.2)\n"
        "        except queue.Empty:\n"
        "            break\n"
        "        assert a.dtype == np.uint8 and 1 <= a.size <= 900 and (a == a[0]).all(), a\n"
        "q.put(np.arange(3))\n"
        "assert list(q.get(timeout=5)) == [0, 1, 2]\n"
        "q.close()\n"
        "print('ok', flush=True)\n"
    )
    out = python("-c", code, _PRODUCER, env=isolated, timeout=240)
    assert out.stdout.strip() == "ok"
    assert _wait_empty(isolated) == []


def test_many_waiters_in_put_inline_and_a_close():
    """Threads asleep for room in put_inline on a full queue all raise
    HandleClosed when another thread closes the queue, and put nothing."""
    q = zctipc.Queue(1, max_bytes=4096)
    q.put(np.arange(2))
    outcome, alive = closed_while_blocked(lambda: q.put(np.arange(3, dtype=np.int16)), q.close, 50, HANG)
    assert not alive
    assert outcome == ["closed"] * 50, outcome


# -- tail of forged records ---------------------------------------------------------------------


def test_tail_of_forged_inline_records(isolated):
    """zctipc tail peeks forged inline records: each lie is said to be
    unreadable and passed, the arrays at the edges are shown, and the
    records stay for their consumer."""
    code = (
        "import sys, numpy as np, zctipc\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from test_handover_attacks import forge, record, LIES, EDGES\n"
        "q = zctipc.Queue(max_bytes=1 << 16)\n"
        "forge(q, *LIES.values(), shm=sys.argv[2])\n"
        "forge(q, *(record(4, p) for p, _ in EDGES.values()), shm=sys.argv[2])\n"
        "q.put(b'the end')\n"
        "print(q.name, flush=True)\n"
        "sys.stdin.readline()\n"
        "print(q.qsize(), flush=True)\n"
        "for _ in LIES:\n"
        "    try:\n"
        "        q.get(timeout=5)\n"
        "    except zctipc.CorruptHeader:\n"
        "        pass\n"
        "for _ in range(len(EDGES)):\n"
        "    assert isinstance(q.get(timeout=5), np.ndarray)\n"
        "assert q.get(timeout=5) == b'the end'\n"
        "q.close()\n"
    )
    with held(code, os.path.dirname(__file__), isolated["ZCTIPC_SHM_DIR"], env=isolated) as holder:
        name = holder.stdout.readline().strip()
        assert name, "the holder made its queue"
        out = python("-m", "zctipc", "tail", "--no-follow", name, env=isolated, timeout=120)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        lines = out.stdout.splitlines()
        assert len(lines) == len(LIES) + len(EDGES) + 1, lines
        for line in lines[: len(LIES)]:
            assert "cannot be read" in line and "malformed" in line, line
        for line in lines[len(LIES) : -1]:
            assert " inline: " in line and "cannot be" not in line, line
        assert "uint8[0, 4611686018427387904] (empty)" in out.stdout
        assert lines[-1].endswith("bytes: bytes[7] b'the end'"), lines[-1]
        go_on(holder)
        assert holder.stdout.readline().strip() == str(len(lines)), "tail took nothing"
        assert holder.wait(HANG) == 0
    assert _wait_empty(isolated) == []


# -- Go and Python read each other's inline records ----------------------------------------------


@pytest.fixture(scope="module")
def go_consumer(tmp_path_factory):
    out = tmp_path_factory.mktemp("goconsumer") / "consumer"
    subprocess.run(["go", "build", "-o", str(out), "./go/examples/consumer"], cwd=ROOT, check=True, timeout=600)
    return str(out)


def test_go_and_python_read_each_others_inline_records(go_consumer):
    """Python's inline arrays of every dtype and of odd layouts (scalars,
    no elements, Fortran order, negative strides, read-only) reach a Go
    program, which sends each back inline, as it came; Python gets them
    back equal."""
    sent = [(np.arange(6) % 2).astype(dt).reshape(2, 3) for dt in dtypes.CODES if dt != "bfloat16"] + [
        np.array(2.5),
        np.array(True),
        np.empty((3, 0)),
        np.asfortranarray(_BASE),
        _BASE[::-1, ::-2],
        np.frombuffer(b"abcd", np.uint8),
        np.zeros((1,) * 32, np.int8),
    ]
    got, _ = go_echo(go_consumer, sent)
    for a, b in zip(sent, got, strict=True):
        assert type(b) is np.ndarray, (a.dtype, a.shape)
        assert (b.dtype, b.shape) == (a.dtype, a.shape)
        assert np.array_equal(a, b)
        assert b.flags.writeable == a.flags.writeable


# -- zctipc.h and what Python reads of it --------------------------------------------------------


def _header_values():
    """The values of zctipc.h's enumerators and defines, read from its text."""
    with open(HEADER) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    values = {}
    for name, value in re.findall(r"#define\s+(ZCT_\w+)\s+(0x[0-9A-Fa-f]+|-?\d+)\b", text):
        values[name] = int(value, 0)
    for body in re.findall(r"enum\s*\w*\s*\{(.*?)\}", text, flags=re.S):
        last = -1
        for item in body.split(","):
            m = re.match(r"\s*(ZCT_\w+)\s*(?:=\s*(-?(?:0x[0-9A-Fa-f]+|\d+)))?\s*$", item)
            if m:
                last = int(m.group(2), 0) if m.group(2) else last + 1
                values[m.group(1)] = last
    return values


def test_every_framing_fact_python_reads_is_zctipc_hs():
    """read_framing (Note [framing from the library] in
    zctipc._wire.records) reads each of its names from the library, and each is the value
    zctipc.h writes; the header the package carries is that one; and a
    view's fields that Python reads at once lie in zct_view as zctipc.h
    orders them."""
    header = _header_values()
    names = re.findall(r"lib\.(ZCT_\w+)", inspect.getsource(records.read_framing))
    assert len(names) >= 8
    lib = native.lib()
    zctipc.Queue().close()  # the first queue reads the framing
    for name in names:
        assert header[name] == getattr(lib, name), name
    for name, value in {
        "_PICKLE": "ZCT_RECORD_PICKLE",
        "_TENSOR": "ZCT_RECORD_TENSOR",
        "_BYTES": "ZCT_RECORD_BYTES",
        "_INLINE": "ZCT_RECORD_INLINE",
        "_HEADER": "ZCT_RECORD_HEADER",
        "_FIELD_MASK": "ZCT_TAKE_FIELD_MASK",
        "_OFFSET_SHIFT": "ZCT_TAKE_OFFSET_SHIFT",
        "_TYPE_SHIFT": "ZCT_TAKE_TYPE_SHIFT",
    }.items():
        assert getattr(queues, name) == header[value], name
    assert header["ZCT_REF_INLINE"] == lib.ZCT_REF_INLINE == 0
    assert header["ZCT_MAX_NDIM"] == native.MAX_NDIM
    # What the Go side packs: a payload's offset and length below the
    # largest ring fill their fields, and a record type keeps the sign bit.
    assert (1 << header["ZCT_TAKE_OFFSET_SHIFT"]) - 1 == header["ZCT_TAKE_FIELD_MASK"]
    assert header["ZCT_TAKE_FIELD_MASK"] >= (1 << 30) - 1
    assert header["ZCT_RECORD_INLINE"] << header["ZCT_TAKE_TYPE_SHIFT"] < 1 << 63
    with open(HEADER, "rb") as a, open(os.path.join(os.path.dirname(zctipc.__file__), "zctipc.h"), "rb") as b:
        assert a.read() == b.read(), "the package carries go/capi/zctipc.h"
    ffi = native.ffi()
    order = [ffi.offsetof("zct_view", f) for f in ("offset", "nbytes", "dtype", "ndim", "flags")]
    assert order == sorted(order)
