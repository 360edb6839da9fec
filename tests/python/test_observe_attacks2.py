"""More attacks on ``zctipc tail`` and ``zctipc top``: segment files shrunk
under them, tail stopped, killed or run eight at once beside a producer
and consumer, segments that come and go under top, garbage and forged
headers in the segment directory, forged descriptors in a message, odd
names, and pickles of protocols 0 to 2."""

import io
import json
import mmap
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest
from conftest import SWEEP_TIMEOUT
from test_observe import CONSUME, PRODUCE, start, start_tail, stop, zctipc_cmd

from zctipc import observe

pytestmark = pytest.mark.slow


def _files(env):
    return sorted(os.listdir(env["ZCTIPC_SHM_DIR"]))


def _wait_empty(env, timeout=SWEEP_TIMEOUT + 15):
    deadline = time.monotonic() + timeout
    while _files(env) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _files(env)


def _path(env, name):
    return os.path.join(env["ZCTIPC_SHM_DIR"], name)


# A queue with a message and a stream with frames, held until killed.
HOLD_BOTH = """
import time, numpy as np, zctipc
q = zctipc.Queue()
q.put(np.arange(6, dtype=np.int32))
s = zctipc.Stream.create(None, shape=(1024,), dtype="float32", frames=4, readers=1, policy="overwrite")
w = s.writer()
for i in range(3):
    w.write(np.full(1024, i, np.float32))
print("ready", q.name, s.name, flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("size", [0, 8])
def test_top_and_tail_of_segments_shrunk_below_their_words(isolated, size):
    # Another process shrinks the files (ftruncate) to nothing (every read of
    # a control word faults) or to 8 bytes (the first page reads as zeros):
    # top says so in a row and goes on; tail says so and exits 1.
    holder, (queue, stream) = start(isolated, HOLD_BOTH)
    try:
        t = start_tail(isolated, stream)
        assert t.stdout.readline().startswith("frame 2: float32[1024]")
        for name in (queue, stream):
            os.truncate(_path(isolated, name), size)
        rc, out, err = zctipc_cmd(isolated, "top", "--once", "--interval", "0.1")
        assert rc == 0 and "Traceback" not in err, err
        for name in (queue, stream):  # a clear row, or a skip
            assert name not in out or f"{name} cannot be read" in out, out
        rc, out, err = zctipc_cmd(isolated, "top", "--json", "--interval", "0.1")
        assert rc == 0 and "Traceback" not in err, err
        json.loads(out)
        out, err = t.communicate(timeout=30)
        assert t.returncode == 1, (t.returncode, err)
        assert "Traceback" not in err, err
        if size == 0:
            assert f"cannot go on watching {stream}" in err, err
        else:  # words of zeros: no frame, and no count of anyone's
            assert f"nobody else holds {stream} any more" in err, err
        for name in (queue, stream):
            rc, out, err = zctipc_cmd(isolated, "tail", "--no-follow", name)
            assert rc == 1 and "zctipc tail:" in err and "Traceback" not in err, err
        assert holder.poll() is None, "the holder, which reads nothing, lives"
    finally:
        stop(holder)


def _producer_and_consumer(env, ring="bounded", pause="0.0"):
    producer, (queue,) = start(env, PRODUCE, ring, stdin=subprocess.PIPE)
    consumer, _ = start(env, CONSUME, queue, pause)
    return producer, consumer, queue


def _finish(producer, consumer):
    """Stop the producer; assert the consumer received every message."""
    producer.stdin.write("stop\n")
    producer.stdin.flush()
    put = producer.stdout.readline().split()
    assert put[0] == "put"
    assert consumer.stdout.readline().split() == ["got", put[1]], "the consumer received every message"
    assert consumer.wait(timeout=30) == 0


def test_tail_stopped_for_seconds_holds_no_consumer_back(isolated):
    producer, consumer, queue = _producer_and_consumer(isolated)
    t = start_tail(isolated, queue)
    try:
        assert t.stdout.readline().startswith("#1 ")
        t.send_signal(signal.SIGSTOP)
        time.sleep(3)
        t.send_signal(signal.SIGCONT)
        time.sleep(0.5)
        _finish(producer, consumer)
        t.send_signal(signal.SIGINT)
        out, err = t.communicate(timeout=30)
        assert t.returncode == 130 and "Traceback" not in err, err
    finally:
        for p in (consumer, producer, t):
            if p.poll() is None:
                p.kill()
            p.wait()
        producer.stdin.close()


def test_tail_killed_leaves_nothing(isolated):
    producer, consumer, queue = _producer_and_consumer(isolated, "unbounded", "0.01")
    t = start_tail(isolated, queue)
    try:
        assert t.stdout.readline().startswith("#1 ")
        t.kill()  # mid-peek, holding counts on the queue and on arrays
        t.wait()
        _finish(producer, consumer)
    finally:
        stop(consumer)
        stop(producer)
        producer.stdin.close()
        t.stdout.close()
        t.stderr.close()
    # tail's count and ledger, and everything else, are swept.
    assert _wait_empty(isolated) == []


# A queue whose creator closes it on a line of stdin, and lives on.
CLOSE_ON_LINE = """
import sys, time, zctipc
q = zctipc.Queue()
q.put(b"one")
print("ready", q.name, flush=True)
sys.stdin.readline()
q.close()
print("closed", flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("how", ["closed", "killed"])
def test_tail_waiting_when_the_queue_is_closed_or_its_producer_killed(isolated, how):
    producer, (queue,) = start(isolated, CLOSE_ON_LINE, stdin=subprocess.PIPE)
    t = start_tail(isolated, queue)
    try:
        assert t.stdout.readline() == "#1 bytes: bytes[3] b'one'\n"
        time.sleep(0.5)
        if how == "closed":
            producer.stdin.write("\n")
            producer.stdin.flush()
            assert producer.stdout.readline() == "closed\n"
        else:
            stop(producer)
        out, err = t.communicate(timeout=SWEEP_TIMEOUT + 30)
        assert t.returncode == 1, err  # as TAIL_HELP says
        assert f"nobody else holds {queue} any more" in err and "Traceback" not in err, err
    finally:
        for p in (producer, t):
            if p.poll() is None:
                p.kill()
            p.wait()
        producer.stdin.close()


def test_eight_tails_at_once(isolated):
    producer, consumer, queue = _producer_and_consumer(isolated, "unbounded", "0.005")
    tails = [start_tail(isolated, queue) for _ in range(8)]
    try:
        for t in tails:
            # Each shows a message; a tail that came late first counts those
            # the consumer took before it could read them.
            line = t.stdout.readline()
            while line.startswith("... ") and "before tail could read them" in line:
                line = t.stdout.readline()
            assert line.startswith("#"), line
        time.sleep(1)
        _finish(producer, consumer)
        for t in tails:
            t.send_signal(signal.SIGINT)
            out, err = t.communicate(timeout=30)
            assert t.returncode == 130 and "Traceback" not in err, err
    finally:
        for p in (consumer, producer, *tails):
            if p.poll() is None:
                p.kill()
            p.wait()
        producer.stdin.close()


# Queues, streams and tensors made and closed as fast as they go, until
# killed.
CHURN = """
import numpy as np, zctipc
print("ready", flush=True)
i = 0
while True:
    q = zctipc.Queue()
    q.put(np.zeros(100_000, np.float32))
    s = zctipc.Stream.create(None, shape=(8,), dtype="float32", frames=2, readers=1)
    t = zctipc.create_shared_tensor(None, shape=(16,))
    q.close(); s.close(); del t
    i += 1
"""


def test_top_json_while_segments_come_and_go(isolated):
    churn, _ = start(isolated, CHURN)
    try:
        for _ in range(6):
            rc, out, err = zctipc_cmd(isolated, "top", "--json", "--interval", "0.05")
            assert rc == 0 and "Traceback" not in err, err
            frame = json.loads(out)
            assert set(frame) >= {"queues", "streams", "pools", "unreadable"}
            rc, out, err = zctipc_cmd(isolated, "top", "--once", "--interval", "0.05")
            assert rc == 0 and "Traceback" not in err, err
    finally:
        stop(churn)


def test_top_once_over_garbage_and_forged_headers(isolated):
    holder, (queue, stream) = start(isolated, HOLD_BOTH)
    try:
        d = isolated["ZCTIPC_SHM_DIR"]
        with open(os.path.join(d, "zctipc_garbage"), "wb") as f:
            f.write(os.urandom(10000))
        open(os.path.join(d, "zctipc_empty"), "wb").close()
        with open(os.path.join(d, "not-ours.txt"), "w") as f:
            f.write("hello")
        os.mkdir(os.path.join(d, "zctipc_a_directory"))
        os.symlink("/etc/passwd", os.path.join(d, "zctipc_link"))
        real = open(_path(isolated, queue), "rb").read()
        for i, (at, value) in enumerate([(0, b"XXXX"), (8, b"\xff" * 8), (16, b"\x00" * 64), (4096, b"\xff" * 64)]):
            forged = bytearray(real)
            forged[at : at + len(value)] = value
            with open(os.path.join(d, f"zctipc_forged{i}"), "wb") as f:
                f.write(forged)
        rc, out, err = zctipc_cmd(isolated, "top", "--once", "--interval", "0.1")
        assert rc == 0 and "Traceback" not in err, err
        assert queue in out and stream in out, "the real ones still show"
        rc, out, err = zctipc_cmd(isolated, "top", "--json", "--interval", "0.1")
        assert rc == 0 and "Traceback" not in err, err
        json.loads(out)
    finally:
        stop(holder)


# A queue holding one message with a shared tensor, whose descriptor names
# it in 15 bytes, and a stream whose name is as long.
HOLD_DESCRIPTOR = """
import time, numpy as np, zctipc
t = zctipc.create_shared_tensor("forgeme1", shape=(4,))
s = zctipc.Stream.create("forgeme2", shape=(8,), dtype="float32", frames=2, readers=1)
q = zctipc.Queue()
q.put({"t": t})
print("ready", q.name, flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize(
    "forged",
    ["notzctipcfile01", "zctipc_garbage1", "zctipc_forgeme2", "zctipc_missing1"],
    ids=["not_zctipc", "garbage", "a_stream", "missing"],
)
def test_tail_of_a_forged_descriptor(isolated, forged):
    # The descriptor of a message names, in place of its tensor, a file of
    # the segment directory that is no zctipc segment, garbage with a
    # zctipc name, another kind of segment, or nothing: tail maps none of
    # them as an array, says so for the message, and goes on.
    holder, (queue,) = start(isolated, HOLD_DESCRIPTOR)
    try:
        for name, data in (("notzctipcfile01", b"\x00" * 8192), ("zctipc_garbage1", os.urandom(8192))):
            with open(os.open(_path(isolated, name), os.O_CREAT | os.O_WRONLY, 0o600), "wb") as f:
                f.write(data)
        with open(_path(isolated, queue), "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            old = b"zctipc_forgeme1"
            at = m.find(old)
            assert at >= 0, "the descriptor's name is in the ring"
            m[at : at + len(old)] = forged.encode()
        rc, out, err = zctipc_cmd(isolated, "tail", "--no-follow", queue)
        assert rc == 0 and "Traceback" not in err, err
        line = out.splitlines()[0]
        assert line.startswith("#1 ") and "float32[4] min=" not in line, line
        assert "cannot be read" in line or "(let go before tail could read it)" in line, line
    finally:
        stop(holder)


@pytest.mark.parametrize(
    "name",
    ["", "../x", "x/../../etc/passwd", "a" * 5000, "é名", "zctipc_", "."],
)
def test_tail_of_odd_names(isolated, name):
    rc, out, err = zctipc_cmd(isolated, "tail", name)
    assert rc == 1 and out == "" and "Traceback" not in err, err
    assert err.startswith("zctipc tail: no queue or stream named"), err


def test_tail_of_names_argv_cannot_hold(isolated):
    # Bytes that are not UTF-8 (argv's), and a NUL, which ended the name in
    # C: tail of "x\\0y" watched segment x.
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "zctipc"), "tail", b"\xff\xfe"], env=isolated)
    assert out.returncode == 1
    code = "import sys\nfrom zctipc import observe\nsys.exit(observe.tail(sys.argv[1].replace('@', chr(0))))"
    holder, (queue, _stream) = start(isolated, HOLD_BOTH)
    try:
        for name in ("x@y", queue + "@z"):
            out = subprocess.run([sys.executable, "-c", code, name], env=isolated, capture_output=True, text=True)
            assert out.returncode == 1 and "a name holds no NUL character" in out.stderr, out.stderr
            assert out.stdout == ""
    finally:
        stop(holder)


@pytest.mark.parametrize("protocol", [0, 1, 2])
def test_pickles_of_protocols_0_to_2_show(protocol):
    import collections
    import datetime

    for obj, want in (
        ({1, 2, 3}, "set({1, 2, 3})"),
        ([1, "a"], "[1, 'a']"),
        ({"k": (1, 2)}, "{'k': (1, 2)}"),
        (frozenset([5]), "frozenset({5})"),
        (b"xy", "bytes[2] b'xy'"),
        (bytearray(b"ab"), "bytearray[2] b'ab'"),
        (range(3), "range(0, 3)"),
        (collections.OrderedDict(a=1), "{'a': 1}"),
        (datetime.date(2020, 1, 2), "datetime.date(2020, 1, 2)"),
    ):
        data = pickle.dumps(obj, protocol=protocol)
        got = observe.summarize(observe._Unpickler(io.BytesIO(data), []).load())
        assert got == want, (obj, protocol, got)


def test_pickles_of_protocols_0_to_2_run_nothing_and_stay_bounded():
    G = lambda m, n: b"c" + m + b"\n" + n + b"\n"  # noqa: E731
    for p in (
        G(b"__builtin__", b"eval") + b"(V1+1\ntR.",
        G(b"__builtin__", b"getattr") + b"(" + G(b"__builtin__", b"object") + b"V__subclasses__\ntR.",
        G(b"_codecs", b"encode") + b"(Vx\nVrot13\ntR.",
    ):
        with pytest.raises(pickle.UnpicklingError) if b"_codecs" in p else _nothing():
            text = observe.summarize(observe._Unpickler(io.BytesIO(p), []).load())
            assert text.startswith("<builtins."), text
    bomb = G(b"__builtin__", b"list") + b"(" + G(b"__builtin__", b"xrange") + b"(I1000000000000\ntRtR."
    with pytest.raises(pickle.UnpicklingError, match="builds more than tail shows"):
        observe._Unpickler(io.BytesIO(bomb), []).load()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
