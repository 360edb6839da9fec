"""``zctipc top`` and ``zctipc tail`` against live producers and consumers in
other processes: what they show, that they take nothing from anyone, and
that a peek never shows what a record or frame was not."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import HERE, SWEEP_TIMEOUT, daemon_pid, with_pythonpath

import zctipc
from zctipc import observe
from zctipc._core import native

pytestmark = pytest.mark.slow  # each test runs a producer, a consumer and the command

BIN = os.path.dirname(sys.executable)


def zctipc_cmd(env, *args, timeout=60):
    """Run the ``zctipc`` console script to its end: (exit status, stdout, stderr)."""
    out = subprocess.run([os.path.join(BIN, "zctipc"), *args], env=env, capture_output=True, text=True, timeout=timeout)
    return out.returncode, out.stdout, out.stderr


def start(env, code, *args, stdin=None):
    """A Python child running code, whose first line is "ready" and what it
    says after it (split on spaces)."""
    p = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdin=stdin, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().split()
    assert line[:1] == ["ready"], line
    return p, line[1:]


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()


def start_tail(env, *args):
    return subprocess.Popen(
        [os.path.join(BIN, "zctipc"), "tail", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


# Seven messages wait in a queue of at most 50 (an array big enough for a
# pool buffer among them), and a stream has three frames.
HOLD_SOME = """
import time, numpy as np, zctipc
q = zctipc.Queue(maxsize=50)
for i in range(6):
    q.put(np.full((4, 8), i, np.float32))
q.put(np.zeros(100_000, np.float32))
s = zctipc.Stream.create(None, shape=(16,), dtype="float32", frames=8, readers=2, policy="overwrite")
w = s.writer()
for i in range(3):
    w.write(np.full(16, i, np.float32))
print("ready", q.name, s.name, flush=True)
time.sleep(3600)
"""


def test_top_once_and_json_show_depth_and_holders(isolated):
    producer, (queue, stream) = start(isolated, HOLD_SOME)
    try:
        rc, text, err = zctipc_cmd(isolated, "top", "--once", "--interval", "0.2")
        assert rc == 0, err
        assert "\x1b" not in text, "no escape codes off a terminal"
        row = next(ln for ln in text.splitlines() if queue in ln)
        assert re.search(r"\bqueue\s+7/50 msgs", row), row
        assert f"{producer.pid}*" in row, "the creator among the holders"
        row = next(ln for ln in text.splitlines() if stream in ln)
        assert "stream" in row and "/8 frames of float32[16]" in row and f"{producer.pid}*" in row
        row = next(ln for ln in text.splitlines() if f"pool of pid {producer.pid}" in ln)
        assert re.search(r"\b1/\d+ slots", row), row

        rc, out, err = zctipc_cmd(isolated, "top", "--json", "--interval", "0.2")
        assert rc == 0, err
        frame = json.loads(out)
        (q,) = [q for q in frame["queues"] if q["name"] == queue]
        assert (q["messages"], q["max_messages"], q["unbounded"]) == (7, 50, True)
        assert q["creator_pid"] == producer.pid and producer.pid in q["holders"]
        assert q["puts_per_s"] == 0 and q["gets_per_s"] == 0, "rates over the interval: nothing moved"
        (s,) = [s for s in frame["streams"] if s["name"] == stream]
        assert (s["published"], s["frames"], s["frame"], s["policy"]) == (3, 8, "float32[16]", "overwrite")
        assert s["writer"] == producer.pid and s["readers"] == [] and s["frames_behind"] is None
        (p,) = [p for p in frame["pools"] if p["owner"] == producer.pid]
        assert p["slots_in_use"] == 1 and p["bytes_in_use"] >= 400_000
    finally:
        stop(producer)


def test_top_starts_no_daemon_and_prints_frame_after_frame(isolated):
    rc, text, err = zctipc_cmd(isolated, "top", "--once", "--interval", "0.1")
    assert rc == 0, err
    assert "no queue, stream or pool" in text
    assert daemon_pid(isolated["ZCTIPC_RUNTIME_DIR"]) is None, "looking starts no daemon"
    p = subprocess.Popen(
        [os.path.join(BIN, "zctipc"), "top", "--interval", "0.1"], env=isolated, stdout=subprocess.PIPE, text=True
    )
    try:
        frames = [p.stdout.readline() for _ in range(6)]
    finally:
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 0
        p.stdout.close()
    heads = [ln for ln in frames if ln.startswith("zctipc top ")]
    assert len(heads) >= 2, frames
    assert "rates over" in heads[1], "the second frame has rates"


# A producer that puts, every few milliseconds, a pickled message, a bare
# array that goes inline and one that goes through a pool buffer, each
# holding its number, until a line comes on its stdin; then None, and it
# says how many of each it put.
PRODUCE = """
import select, sys, time, numpy as np, zctipc
q = zctipc.Queue(max_bytes=1 << 16) if sys.argv[1] == "bounded" else zctipc.Queue()
print("ready", q.name, flush=True)
i = 0
while not select.select([sys.stdin], [], [], 0)[0]:
    q.put({"i": i, "x": np.full((4, 8), i, np.float32), "tag": "m%d" % i})
    q.put(np.full((3, 5), i, np.int16))
    q.put(np.full((200, 256), i, np.float64))
    i += 1
    time.sleep(0.01)
q.put(None)
print("put", i, flush=True)
time.sleep(3600)
"""

# A consumer that takes messages (pausing after each round of three) until
# None, checks every one, and says how many rounds it got.
CONSUME = """
import sys, time, numpy as np, zctipc
q = zctipc.Queue.attach(sys.argv[1])
pause = float(sys.argv[2])
print("ready", flush=True)
i = 0
while (m := q.get(timeout=60)) is not None:
    assert m["i"] == i and m["tag"] == "m%d" % i and (m["x"] == i).all(), m
    a = q.get(timeout=60)
    assert a.shape == (3, 5) and a.dtype == np.int16 and (a == i).all()
    b = q.get(timeout=60)
    assert b.shape == (200, 256) and b.dtype == np.float64 and (b == i).all()
    del m, a, b
    i += 1
    time.sleep(pause)
print("got", i, flush=True)
"""


@pytest.mark.parametrize(
    "ring, pause",
    [("unbounded", 0.02), ("bounded", 0.0)],
    ids=["unbounded_ring_slow_consumer", "bounded_ring_fast_consumer"],
)
def test_tail_queue_shows_messages_and_the_consumer_gets_every_one(isolated, ring, pause):
    producer, (queue,) = start(isolated, PRODUCE, ring, stdin=subprocess.PIPE)
    consumer, _ = start(isolated, CONSUME, queue, str(pause))
    try:
        rc, out, err = zctipc_cmd(isolated, "tail", "-n", "9", queue)
        assert rc == 0, err
        lines = [ln for ln in out.splitlines() if ln.startswith("#")]
        assert len(lines) == 9, out
        for ln in lines:
            kind = ln.split()[1]
            if kind == "pickle:":
                m = re.search(
                    r"\{'i': (\d+), 'x': float32\[4, 8\] min=(\d+) max=(\d+) mean=(\d+), 'tag': 'm(\d+)'\}", ln
                )
                assert m and len(set(m.groups())) == 1, ln
            elif kind == "inline:":
                m = re.fullmatch(r"#\d+ inline: int16\[3, 5\] min=(\d+) max=(\d+) mean=(\d+)", ln)
                assert m and len(set(m.groups())) == 1, ln
            else:
                # Through a pool buffer: tail's own count, or gone already.
                assert kind == "tensor:" and "float64[200, 256]" in ln, ln
                m = re.search(r"min=(\d+) max=(\d+) mean=(\d+)", ln)
                assert (m and len(set(m.groups())) == 1) or "let go before tail could read it" in ln, ln
        producer.stdin.write("stop\n")
        producer.stdin.flush()
        put = producer.stdout.readline().split()
        assert put[0] == "put"
        assert consumer.stdout.readline().split() == ["got", put[1]], "the consumer received every message"
        assert consumer.wait(timeout=30) == 0
    finally:
        stop(consumer)
        stop(producer)
        producer.stdin.close()


# A stream under the block policy whose writer publishes count frames,
# frame i filled with i, each waiting at most 10 s for room; it says how
# long the frames took.
WRITE_FRAMES = """
import sys, time, numpy as np, zctipc
s = zctipc.Stream.create(None, shape=(64, 64), dtype="float32", frames=4, readers=1, policy="block")
w = s.writer()
print("ready", s.name, flush=True)
assert sys.stdin.readline().strip() == "go"
start = time.monotonic()
for i in range(int(sys.argv[1])):
    assert w.write(np.full((64, 64), i, np.float32), timeout=10), "the writer was held back"
    time.sleep(0.002)
r = s.reader()  # tail took no reader slot: the one slot is free
print("wrote", time.monotonic() - start, flush=True)
time.sleep(3600)
"""


def test_tail_stream_never_holds_the_writer_back(isolated):
    p = subprocess.Popen(
        [sys.executable, "-c", WRITE_FRAMES, "2000"],
        env=isolated,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready = p.stdout.readline().split()
        assert ready[0] == "ready"
        stream = ready[1]
        t = start_tail(isolated, stream)
        time.sleep(1)
        t.send_signal(signal.SIGSTOP)  # tail stopped dead holds nothing back
        p.stdin.write("go\n")
        p.stdin.flush()
        wrote = p.stdout.readline().split()
        assert wrote[:1] == ["wrote"], "every frame went, through a ring of 4, with tail stopped"
        t.send_signal(signal.SIGCONT)
        time.sleep(0.5)
        t.send_signal(signal.SIGINT)
        out, err = t.communicate(timeout=30)
        assert t.returncode == 130, err
        frames = [ln for ln in out.splitlines() if ln.startswith("frame ")]
        assert frames, out
        for ln in frames:
            m = re.fullmatch(r"frame (\d+): float32\[64, 64\] min=(\d+) max=(\d+) mean=(\d+)", ln)
            assert m and len(set(m.groups())) == 1, f"a frame whole, of its own number: {ln}"
        assert "passed before tail could read them" in out, "what the writer overwrote is said"
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
        p.stdin.close()


def test_tail_of_a_name_that_is_no_queue_or_stream(isolated):
    rc, out, err = zctipc_cmd(isolated, "tail", "no_such_queue")
    assert rc == 1 and out == ""
    assert "zctipc tail: no queue or stream named 'no_such_queue'" in err and "zctipc ls" in err
    holder, _ = start(
        isolated,
        "import time, zctipc\nt = zctipc.create_shared_tensor('observe_t', shape=(2,))\n"
        "print('ready', flush=True)\ntime.sleep(3600)",
    )
    try:
        rc, out, err = zctipc_cmd(isolated, "tail", "observe_t")
        assert rc == 1 and "zctipc_observe_t is a tensor, not a queue or stream" in err
    finally:
        stop(holder)


HOLD_A_QUEUE = """
import sys, time, numpy as np, zctipc
q = zctipc.Queue()
q.put(np.arange(6, dtype=np.int32))
print("ready", q.name, flush=True)
time.sleep(3600)
"""

HOLD_ATTACHED = """
import sys, time, zctipc
q = zctipc.Queue.attach(sys.argv[1])
print("ready", flush=True)
time.sleep(3600)
"""


def test_tail_waits_while_others_hold_the_queue_and_leaves_when_nobody_does(isolated):
    producer, (queue,) = start(isolated, HOLD_A_QUEUE)
    consumer, _ = start(isolated, HOLD_ATTACHED, queue)
    t = start_tail(isolated, queue)
    try:
        assert t.stdout.readline() == "#1 inline: int32[6] min=0 max=5 mean=2.5\n"
        stop(producer)  # killed mid-tail: the consumer still holds the queue
        time.sleep(2)
        assert t.poll() is None, "tail waits on while the consumer holds the queue"
        stop(consumer)
        out, err = t.communicate(timeout=SWEEP_TIMEOUT + 30)
        assert t.returncode == 1
        assert f"nobody else holds {queue} any more" in err and "Traceback" not in err
    finally:
        for p in (producer, consumer, t):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_tail_of_a_stream_whose_writer_is_killed(isolated):
    code = """
import time, numpy as np, zctipc
s = zctipc.Stream.create(None, shape=(3,), dtype="int64", frames=4, policy="overwrite")
w = s.writer()
print("ready", s.name, flush=True)
i = 0
while True:
    w.write(np.full(3, i, np.int64))
    i += 1
    time.sleep(0.01)
"""
    writer, (stream,) = start(isolated, code)
    t = start_tail(isolated, stream)
    try:
        first = t.stdout.readline()
        assert re.fullmatch(r"frame (\d+): int64\[3\] min=\1 max=\1 mean=\1\n", first), first
        stop(writer)
        out, err = t.communicate(timeout=SWEEP_TIMEOUT + 30)
        assert t.returncode == 1 and f"nobody else holds {stream} any more" in err, err
        assert "Traceback" not in err
    finally:
        for p in (writer, t):
            if p.poll() is None:
                p.kill()
                p.wait()


# A class the consumer knows and tail cannot import, and a message whose
# unpickling would run a command.
SEND_STRANGERS = """
import os, sys, time, zctipc
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
class Trap:
    def __reduce__(self):
        return os.system, ("touch " + sys.argv[1],)
q = zctipc.Queue()
q.put([Point(1, 2), {"k": (3, b"raw")}])
q.put(Trap())
q.put(b"bytes as they are")
print("ready", q.name, flush=True)
time.sleep(3600)
"""


def test_tail_runs_none_of_the_senders_code(isolated, tmp_path):
    trap = tmp_path / "trap"
    producer, (queue,) = start(isolated, SEND_STRANGERS, str(trap))
    try:
        rc, out, err = zctipc_cmd(isolated, "tail", "-n", "3", queue)
        assert rc == 0, err
        lines = out.splitlines()
        assert lines[0] == "#1 pickle: [<__main__.Point {'x': 1, 'y': 2}>, {'k': (3, bytes[3] b'raw')}]", lines
        assert lines[1].startswith("#2 pickle: <posix.system('touch "), lines
        assert lines[2] == "#3 bytes: bytes[17] b'bytes as they are'"
        assert not trap.exists(), "the command was shown, not run"
    finally:
        stop(producer)


def test_tail_without_follow_shows_what_waits_and_stops(isolated):
    producer, (queue,) = start(isolated, HOLD_A_QUEUE)
    try:
        rc, out, err = zctipc_cmd(isolated, "tail", "--no-follow", queue[len("zctipc_") :])
        assert rc == 0, err
        assert out == "#1 inline: int32[6] min=0 max=5 mean=2.5\n"
    finally:
        stop(producer)


def test_summaries():
    assert observe.summarize(np.arange(10_000, dtype=np.uint8).reshape(100, 100)) == (
        "uint8[100, 100] min=0 max=255 mean=127.5 (of the first 4096)"
    )
    assert observe.summarize(np.array([1.0, np.nan, 3.0])) == "float64[3] min=1 max=3 mean=2 nan=1"
    assert observe.summarize(np.zeros((0, 3))) == "float64[0, 3] (empty)"
    assert observe.summarize(np.array([True, False])) == "bool[2] min=0 max=1 mean=0.5"
    assert observe.summarize("x" * 1000).endswith("...") and len(observe.summarize("x" * 1000)) <= 80
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t()
    assert observe.summarize(t) == "torch.bfloat16[3, 2] min=0 max=5 mean=2.5"
    assert observe.summarize({"a": torch.ones(2)}) == "{'a': torch.float32[2] min=1 max=1 mean=1}"


# -- attacking the peek --------------------------------------------------------

# Producers put records whose every byte says their number (bytes records),
# arrays filled with their number (bare, through pool buffers) and pickles
# of both, as fast as they can; consumers take them as fast as they can. A
# copy that is not the record shows two numbers.
FLOOD = """
import sys, numpy as np, zctipc
q = zctipc.Queue.attach(sys.argv[1])
print("ready", flush=True)
for i in range(int(sys.argv[2])):
    n = 65 + i % 26
    q.put(bytes([n]) * (8 + 8 * (i % 50)))
    q.put(np.full(200_000, n, np.uint8))
    q.put({"n": n, "a": np.full(7, n, np.int64), "b": np.full(50_000, n, np.int32)})
print("done", flush=True)
"""

DRAIN = """
import sys, zctipc
q = zctipc.Queue.attach(sys.argv[1])
print("ready", flush=True)
n = 0
while q.get() is not None:
    n += 1
print("took", n, flush=True)
"""


def _check_peeked(line):
    """A peeked message says one number throughout (or that its buffer was
    let go before it could be read)."""
    body = line.split(": ", 1)[1]
    numbers = set()
    if body.startswith("bytes["):
        m = re.match(r"bytes\[\d+\] b'([A-Z]+)", body)
        assert m, line
        numbers |= {ord(c) for c in m.group(1)}
    else:
        numbers |= {int(n) for n in re.findall(r"'n': (\d+)", body)}
        for a in re.findall(r"min=(\d+) max=(\d+) mean=(\d+)", body):
            numbers |= {int(n) for n in a}
        assert numbers or "let go before tail could read it" in body, line
    assert len(numbers) <= 1, f"a peek showed what no record was: {line}"


@pytest.fixture
def here():
    """An environment for children that share this process's segment and
    runtime directories (the queue is this process's)."""
    return dict(os.environ, PYTHONPATH=with_pythonpath(HERE))


@pytest.mark.parametrize("bounded", [False, True], ids=["unbounded", "bounded"])
def test_peek_against_consumers_taking_at_once(here, bounded):
    """Peek in a loop while two consumers take every record as soon as it is
    put and give its buffers back: every record peeked is whole, and the
    consumers take every one."""
    rounds = 1500
    q = zctipc.Queue(max_bytes=1 << 16) if bounded else zctipc.Queue()
    drains = [start(here, DRAIN, q.name)[0] for _ in range(2)]
    flood, _ = start(here, FLOOD, q.name, str(rounds))
    watcher = observe._QueueWatcher(q.name)
    seen = missed = 0
    try:
        while True:
            status, line, lost = watcher.next()
            missed += lost
            if line is not None:
                seen += 1
                _check_peeked(line)
            elif status == native.E_EMPTY:
                if flood.poll() is not None:
                    break
                time.sleep(0)
        assert flood.stdout.readline() == "done\n"
        for _ in drains:
            q.put(None)
        took = sum(int(d.stdout.readline().split()[1]) for d in drains)
        assert took == 3 * rounds, "the consumers took every message: the peeks took none"
        assert seen > 0 and seen + missed <= 3 * rounds + 2
    finally:
        watcher.close()
        for p in (*drains, flood):
            stop(p)
        q.close()


WRITE_FAST = """
import sys, numpy as np, zctipc
s = zctipc.Stream.attach(sys.argv[1])
w = s.writer()
print("ready", flush=True)
for i in range(int(sys.argv[2])):
    frame = w.look()
    frame[:] = i
    w.increment()
s.end()
print("done", flush=True)
"""


@pytest.mark.parametrize("policy", ["block", "overwrite"])
def test_peek_a_stream_whose_writer_reuses_slots_at_once(here, policy):
    """Copy frames of a stream without readers, whose writer takes every
    slot again as fast as it can (under block, any free slot; under
    overwrite, the next): every frame the peek says it copied is that frame,
    whole."""
    s = zctipc.Stream.create(None, shape=(16384,), dtype="int32", frames=3, readers=1, policy=policy)
    writer, _ = start(here, WRITE_FAST, s.name, "20000")
    ffi, lib = native.ffi(), native.lib()
    h = ffi.new("zct_handle *")
    info = ffi.new("zct_stream_info *")
    native.check(lib.zct_stream_attach(s.name.encode(), h, info))
    buf = np.empty(16384, np.int32)
    pos = ffi.new("uint64_t *", lib.ZCT_PEEK_LATEST)
    seen = 0
    try:
        while True:
            status = lib.zct_stream_peek(h[0], pos, ffi.from_buffer(buf), buf.nbytes)
            if status == native.E_ENDED:
                break
            if status == native.E_EMPTY:
                continue
            native.check(status)
            assert buf.min() == buf.max() == pos[0], f"frame {pos[0]} copied torn or from another frame"
            seen += 1
            pos[0] += 1
        assert writer.stdout.readline() == "done\n"
        assert seen > 0
    finally:
        lib.zct_stream_close(h[0])
        stop(writer)
        s.close()
