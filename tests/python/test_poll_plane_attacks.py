"""Attacks on the waits that poll in the data plane and on a stream
reader's arms in it (fast.c): a get or a look of the policy that polls for
ever waits in C without entering Go, the other policies wait in Go, and a
reader that sleeps outside the library (sleep_outside in zctipc._core.wait)
arms and disarms through zct_stream_reader_arm and _disarm, which count it
on the stream's data word in C. Each attack here is on that surface:
deadlines and Ctrl-C under the poll policies; policies switched and
handles closed by another thread while a call waits; more pollers than
cores; a producer stopped and continued while consumers poll; a file
shrunk under a poller; readers that sleep between frames 5 to 50 ms apart,
are closed while asleep, or are killed while armed. The C ABI's side is
go/capi/abitest/testdata/abi_poll_plane_attacks.c.

Nothing here asserts a timing but the lower bound a timeout sets and upper
bounds far above what the behaviour needs (a hang, or a call starved)."""

import os
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from _procs import closed_while_blocked, settle
from conftest import with_pythonpath

import zctipc
from zctipc import streams
from zctipc._core import native

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {**os.environ, "PYTHONPATH": with_pythonpath(os.path.join(os.path.dirname(HERE), "python"))}

# Far above anything the behaviour needs: only a hang reaches it.
HANG = 60
# A call that waits for at most one wait slice of another thread's
# (zctipc._core.wait.WAIT_SLICE, 50 ms) takes far less than this; one that
# its slices starve took tens of seconds.
STARVED = 10

#: The data word of a stream and its sleepers' count (docs/format.md, "Streams").
DATA_WORD, SLEEPERS = 384 // 4, 388 // 4

#: sleep; poll for ever (in C); spin then sleep, and poll a while then sleep (in Go); sleep.
CYCLE = [("sleep", None), ("poll", None), ("sleep", 20e-6), ("poll", 1e-4), ("sleep", None)]


def start(target, *args):
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def sleepers(stream):
    """The count of the stream's readers asleep on its data word."""
    return native.ffi().cast("uint32_t *", stream._memory)[SLEEPERS]


def frame(i):
    return np.full(4, i, np.float32)


# -- deadlines ------------------------------------------------------------------------------


@pytest.mark.parametrize("spin", [None, 0.0, 0.001], ids=["for-ever", "spin-0", "spin-1ms"])
def test_a_get_that_polls_waits_out_its_timeout_and_no_less(spin):
    """Polling for ever (in C) or a while then sleeping (in Go): a get
    that finds nothing raises Empty once its timeout passed, never before
    (a wait that went to Go with less than a millisecond left did not wait
    at all)."""
    q = zctipc.Queue(wait="poll", spin=spin)
    try:
        for timeout in (0, 1e-9, 0.001, 0.2):
            start_at = time.monotonic()
            with pytest.raises(queue.Empty):
                q.get(timeout=timeout)
            took = time.monotonic() - start_at
            assert timeout <= took < HANG
        with pytest.raises(queue.Empty):
            q.get(block=False)
        threading.Timer(0.05, q.put, ("late",)).start()
        assert q.get(timeout=HANG) == "late"
    finally:
        q.close()


@pytest.mark.parametrize("spin", [None, 0.0, 0.001], ids=["for-ever", "spin-0", "spin-1ms"])
def test_a_read_that_polls_waits_out_its_timeout_and_no_less(spin):
    s = zctipc.Stream.create(shape=4, frames=2, readers=1)
    w, r = s.writer(), s.reader()
    r.set_wait("poll", spin)
    try:
        for timeout in (0, 1e-9, 0.001, 0.2):
            for call in (r.read, r.look):
                start_at = time.monotonic()
                assert call(timeout=timeout) is None
                took = time.monotonic() - start_at
                assert timeout <= took < HANG
        threading.Timer(0.05, w.write, (frame(3),)).start()
        np.testing.assert_array_equal(r.read(timeout=HANG), frame(3))
    finally:
        for e in (w, r, s):
            e.close()


# -- Ctrl-C ---------------------------------------------------------------------------------

_BLOCKED_POLLER = """
import sys, numpy as np, zctipc
call, spin = sys.argv[1], (None if sys.argv[2] == "none" else float(sys.argv[2]))
q = zctipc.Queue(wait="poll", spin=spin)
s = zctipc.Stream.create(shape=4, frames=2, readers=1)
r = s.reader()
r.set_wait("poll", spin)
print("ready", flush=True)
try:
    {
        "get": q.get,
        "get-timeout": lambda: q.get(timeout=600),
        "read": r.read,
        "look": lambda: r.look(timeout=600),
        "frames": lambda: next(iter(r)),
    }[call]()
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("spin", ["none", "0.001"], ids=["for-ever", "spin-1ms"])
@pytest.mark.parametrize("call", ["get", "get-timeout", "read", "look", "frames"])
def test_ctrl_c_interrupts_a_call_that_polls(call, spin):
    """The poll waits in C, where no signal handler of Python's runs: the
    call comes back to Python every wait slice, so Ctrl-C raises
    KeyboardInterrupt within one (a second, on a loaded machine)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _BLOCKED_POLLER, call, spin], stdout=subprocess.PIPE, text=True, env=ENV
    )
    try:
        assert child.stdout.readline() == "ready\n"
        time.sleep(0.5)  # polling in C
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        assert child.stdout.readline() == "interrupted\n"
        assert time.monotonic() - sent < STARVED
        assert child.wait(HANG) == 0
    finally:
        child.kill()
        child.wait()


# -- policies switched from another thread ----------------------------------------------------


def test_policies_switched_from_another_thread_while_a_get_waits():
    """Each switch is a set_wait of the library's (which the take waiting
    in C reads between its looks) and of the queue object's (which the
    next wait of Python's reads): every message still comes, in order."""
    rng = random.Random(3)
    q = zctipc.Queue()
    got, n = [], 30

    def consume():
        for _ in range(n):
            got.append(q.get(timeout=HANG))

    t = start(consume)
    try:
        for i in range(n):
            put_at = rng.randrange(len(CYCLE))
            for k, (wait, spin) in enumerate(CYCLE):
                q.set_wait(wait, spin)
                time.sleep(rng.random() * 0.003)
                if k == put_at:
                    q.put(i)
        t.join(HANG)
        assert not t.is_alive()
        assert got == list(range(n))
    finally:
        q.close()


def test_calls_on_a_reader_are_not_starved_by_a_read_that_polls_in_slices():
    """A read of the poll policy holds the reader through each of its wait
    slices in C, and takes it again a few nanoseconds after each: a
    set_wait or a stats call of another thread waits for one slice (it
    waited for tens of seconds, its tries almost never meeting the gap)."""
    rng = random.Random(4)
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    w, r = s.writer(), s.reader()
    r.set_wait("poll")
    got, n = [], 6

    def read():
        for _ in range(n):
            got.append(float(r.read(timeout=HANG)[0]))

    t = start(read)
    try:
        for i in range(n):
            for wait, spin in CYCLE[1:] + [("poll", None)]:
                start_at = time.monotonic()
                r.set_wait(wait, spin)
                assert r.position <= i
                assert time.monotonic() - start_at < STARVED
                time.sleep(rng.random() * 0.01)
            assert w.write(frame(i), timeout=HANG)
        t.join(HANG)
        assert not t.is_alive()
        assert got == list(range(n))
        assert sleepers(s) == 0
    finally:
        for e in (w, r, s):
            e.close()


# -- a close from another thread -----------------------------------------------------------------


@pytest.mark.parametrize("spin", [None, 0.001], ids=["for-ever", "spin-1ms"])
def test_a_close_from_another_thread_ends_gets_that_poll(spin):
    q = zctipc.Queue(wait="poll", spin=spin)
    outcome, alive = closed_while_blocked(q.get, q.close, 8, HANG, asleep=0.2)
    assert not alive
    assert outcome == ["closed"] * 8, outcome


@pytest.mark.parametrize("spin", [None, 0.001], ids=["for-ever", "spin-1ms"])
@pytest.mark.parametrize("call", ["read", "look", "frames"])
def test_a_close_from_another_thread_ends_reads_that_poll(call, spin):
    s = zctipc.Stream.create(shape=4, frames=2, readers=2)
    r, other = s.reader(), s.reader()
    r.set_wait("poll", spin)
    run = {"read": r.read, "look": lambda: r.look(timeout=None), "frames": lambda: next(iter(r))}[call]
    outcome, alive = closed_while_blocked(run, r.close, 6, HANG, asleep=0.2)
    try:
        assert not alive
        assert outcome == ["closed"] * 6, outcome
        assert sleepers(s) == 0
        w = s.writer()  # the stream is whole: the other reader reads on
        w.write(frame(1))
        np.testing.assert_array_equal(other.read(timeout=HANG), frame(1))
        w.close()
    finally:
        other.close()
        s.close()


# -- more pollers than cores -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("spin", [None, 0.001], ids=["for-ever", "spin-1ms"])
def test_more_pollers_than_cores_take_each_message_once(spin):
    q = zctipc.Queue(wait="poll", spin=spin)
    n, threads = 2000, 8
    got = [[] for _ in range(threads)]

    def consume(mine):
        while (x := q.get(timeout=HANG)) is not None:
            mine.append(x)

    consumers = [start(consume, mine) for mine in got]
    try:
        for i in range(n):
            q.put(i)
        for _ in consumers:
            q.put(None)
        for t in consumers:
            t.join(HANG)
            assert not t.is_alive()
        assert sorted(x for mine in got for x in mine) == list(range(n))
        assert all(mine == sorted(mine) for mine in got)  # each take takes the oldest
    finally:
        q.close()


@pytest.mark.slow
@pytest.mark.parametrize("spin", [None, 0.001], ids=["for-ever", "spin-1ms"])
def test_more_pollers_than_cores_on_one_reader_read_each_frame_once(spin):
    """Threads that share a reader each read a frame whole (read() takes it
    under the endpoint's lock), and readers of their own read every
    frame, in order."""
    n, sharing, own = 300, 6, 3
    s = zctipc.Stream.create(shape=4, frames=8, readers=1 + own)
    w, shared = s.writer(), s.reader()
    owners = [s.reader() for _ in range(own)]
    for r in (shared, *owners):
        r.set_wait("poll", spin)
    got = [[] for _ in range(sharing + own)]

    def read(r, mine):
        try:
            while True:
                mine.append(float(r.read(timeout=HANG)[0]))
        except zctipc.StreamEnded:
            pass

    threads = [start(read, shared, got[i]) for i in range(sharing)]
    threads += [start(read, r, got[sharing + i]) for i, r in enumerate(owners)]
    try:
        for i in range(n):
            assert w.write(frame(i), timeout=HANG)
        s.end()
        for t in threads:
            t.join(HANG)
            assert not t.is_alive()
        assert sorted(x for mine in got[:sharing] for x in mine) == list(range(n))
        assert all(mine == sorted(mine) for mine in got[:sharing])
        for mine in got[sharing:]:
            assert mine == list(range(n))
        assert sleepers(s) == 0
    finally:
        for e in (w, shared, *owners, s):
            e.close()


# -- a producer stopped and continued ------------------------------------------------------------

_PRODUCER = """
import sys, time, zctipc
q = zctipc.Queue.attach(sys.argv[1])
n, consumers = int(sys.argv[2]), int(sys.argv[3])
print("ready", flush=True)
for i in range(n):
    q.put(i)
    if i % 20 == 0:
        time.sleep(0.001)
for _ in range(consumers):
    q.put(None)
"""


@pytest.mark.slow
def test_a_producer_stopped_and_continued_while_consumers_poll():
    """SIGSTOP and SIGCONT at random, mid-put or between puts: the
    consumers poll on, and each message comes once."""
    rng = random.Random(9)
    q = zctipc.Queue(wait="poll")
    n, consumers = 3000, 3
    got = [[] for _ in range(consumers)]

    def consume(mine):
        while (x := q.get(timeout=HANG)) is not None:
            mine.append(x)

    threads = [start(consume, mine) for mine in got]
    producer = subprocess.Popen(
        [sys.executable, "-c", _PRODUCER, q.name, str(n), str(consumers)], stdout=subprocess.PIPE, text=True, env=ENV
    )
    try:
        assert producer.stdout.readline() == "ready\n"
        stops = 0
        while producer.poll() is None:
            time.sleep(rng.random() * 0.02)
            producer.send_signal(signal.SIGSTOP)
            stops += 1
            time.sleep(rng.random() * 0.03)
            producer.send_signal(signal.SIGCONT)
        assert producer.wait(HANG) == 0
        for t in threads:
            t.join(HANG)
            assert not t.is_alive()
        assert sorted(x for mine in got for x in mine) == list(range(n))
        assert stops > 0
    finally:
        producer.kill()
        producer.wait()
        q.close()


# -- a file shrunk under a poller -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("what", ["queue", "reader"])
def test_a_file_shrunk_under_a_poller_is_an_error_not_a_crash(isolated, what):
    code = textwrap.dedent("""
        import os, sys, threading, time, zctipc
        what = sys.argv[1]
        if what == "queue":
            q = zctipc.Queue(wait="poll")
            name, call = q.name, lambda: q.get(timeout=30)
        else:
            s = zctipc.Stream.create(shape=4, frames=2, readers=1)
            r = s.reader()
            r.set_wait("poll")
            name, call = s.name, lambda: r.read(timeout=30)
        out = {}
        def wait():
            try:
                out["got"] = call()
            except Exception as e:
                out["got"] = e
        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.3)  # polling in C
        os.truncate(os.path.join(os.environ["ZCTIPC_SHM_DIR"], name), 0)
        t.join(30)
        print(type(out.get("got")).__name__, "alive" if t.is_alive() else "ended", flush=True)
        os._exit(0)  # closing says the fault again
    """)
    child = subprocess.run(
        [sys.executable, "-c", code, what], env=isolated, capture_output=True, text=True, timeout=HANG * 2
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["CorruptHeader", "ended"]


# -- readers asleep outside the library between frames ---------------------------------------------


@pytest.fixture
def arms(monkeypatch):
    """The arms of readers' sleeps outside the library, counted."""
    count = [0]
    arm = streams.StreamReader._arm

    def counted(self):
        count[0] += 1
        return arm(self)

    monkeypatch.setattr(streams.StreamReader, "_arm", counted)
    return count


@pytest.mark.slow
@pytest.mark.parametrize("readers", [1, 2])
def test_readers_asleep_between_frames_5_to_50_ms_apart_read_each_once_in_order(readers, arms):
    """A read waits in the library for 2 ms, then sleeps outside it, armed
    in C: every frame comes once, in order, to each reader, and the count
    of sleepers comes back to 0."""
    rng = random.Random(readers)
    n = 40
    s = zctipc.Stream.create(shape=4, frames=4, readers=readers)
    w = s.writer()
    rs = [s.reader() for _ in range(readers)]
    got = [[] for _ in rs]

    def read(r, mine):
        for _ in range(n):
            mine.append(float(r.read(timeout=HANG)[0]))

    threads = [start(read, r, mine) for r, mine in zip(rs, got, strict=True)]
    try:
        for i in range(n):
            time.sleep(rng.uniform(0.005, 0.05))
            assert w.write(frame(i), timeout=HANG)
        for t in threads:
            t.join(HANG)
            assert not t.is_alive()
        assert got == [list(range(n))] * readers
        assert arms[0] > 0  # they slept outside
        assert sleepers(s) == 0
    finally:
        for e in (w, *rs, s):
            e.close()


@pytest.mark.slow
def test_the_end_of_a_stream_ends_readers_asleep_outside_after_every_frame(arms):
    rng = random.Random(12)
    n = 20
    s = zctipc.Stream.create(shape=4, frames=4, readers=2)
    w = s.writer()
    rs = [s.reader(), s.reader()]
    got = [[], []]

    def iterate(r, mine):
        for view in r:
            mine.append(float(view[0]))

    threads = [start(iterate, r, mine) for r, mine in zip(rs, got, strict=True)]
    try:
        for i in range(n):
            time.sleep(rng.uniform(0.005, 0.05))
            assert w.write(frame(i), timeout=HANG)
        assert settle(lambda: sleepers(s) == 2)  # both asleep outside, armed
        s.end()
        for t in threads:
            t.join(HANG)
            assert not t.is_alive()
        assert got == [list(range(n))] * 2
        assert arms[0] > 0
        assert sleepers(s) == 0
    finally:
        for e in (w, *rs, s):
            e.close()


def test_a_close_while_threads_sleep_outside_takes_their_arms_back():
    """Four threads asleep outside the library on one reader, and one on
    another: the close wakes the four (HandleClosed) and takes back their
    arms; the other sleeps on, armed, and reads the next frame."""
    s = zctipc.Stream.create(shape=4, frames=2, readers=2)
    r, other = s.reader(), s.reader()
    got = []
    t = start(lambda: got.append(other.read(timeout=HANG)))
    assert settle(lambda: sleepers(s) == 1)

    def close():
        assert settle(lambda: sleepers(s) == 5)
        r.close()

    outcome, alive = closed_while_blocked(lambda: r.look(timeout=None), close, 4, HANG, asleep=0)
    w = s.writer()
    try:
        assert not alive
        assert outcome == ["closed"] * 4, outcome
        assert sleepers(s) == 1
        w.write(frame(2))
        t.join(HANG)
        np.testing.assert_array_equal(got[0], frame(2))
        assert sleepers(s) == 0
    finally:
        for e in (w, other, s):
            e.close()


_ARMED_READER = """
import sys, threading, zctipc
s = zctipc.Stream.attach(sys.argv[1])
r = s.reader()
if sys.argv[2] != "default":
    r.set_wait("sleep", spin=float(sys.argv[2]))  # a policy that waits in Go
for _ in range(int(sys.argv[3]) - 1):
    threading.Thread(target=r.look, daemon=True).start()
print("ready", flush=True)
r.look()  # asleep, armed: outside the library (default), or in Go
"""

#: A reader's wait: the default (outside the library, armed through C),
#: and a spin then a sleep, which waits in Go.
WAITS = pytest.mark.parametrize("wait", ["default", "20e-6"], ids=["in-c", "in-go"])


def armed_reader(s, wait, threads=1):
    """A process with a reader of s asleep in threads threads, armed."""
    before = sleepers(s)
    child = subprocess.Popen(
        [sys.executable, "-c", _ARMED_READER, s.name, wait, str(threads)], stdout=subprocess.PIPE, text=True, env=ENV
    )
    try:
        assert child.stdout.readline() == "ready\n"
        assert settle(lambda: sleepers(s) == before + threads)
    except BaseException:
        child.kill()  # the test that failed here has no child to kill
        child.wait()
        raise
    return child


@pytest.mark.slow
@WAITS
def test_a_reader_killed_while_armed_is_evicted_with_its_sleepers(wait):
    """The writer that evicts a reader killed asleep (it held the ring)
    takes its sleepers back (Note [a dead party's sleepers] in package
    futex): publishing wakes nobody for nothing after that, the other
    reader reads every frame, and the slot is free again."""
    s = zctipc.Stream.create(shape=4, frames=2, readers=2)
    w, r = s.writer(), s.reader()
    child = armed_reader(s, wait, threads=3)
    try:
        child.kill()
        child.wait()
        assert sleepers(s) == 3, "nobody took them back yet"
        for i in range(8):  # past the ring: the dead reader held it
            assert w.write(frame(i), timeout=HANG)
            np.testing.assert_array_equal(r.read(timeout=HANG), frame(i))
        assert sleepers(s) == 0, "the eviction took the dead reader's sleepers back"
        again = s.reader()
        again.close()
    finally:
        child.kill()
        child.wait()
        for e in (w, r, s):
            e.close()


@pytest.mark.slow
@WAITS
def test_a_reader_that_takes_a_dead_readers_slot_takes_its_sleepers_back(wait):
    """Under the overwrite policy nobody is evicted: the reader that takes
    the slot of one killed asleep takes back what it had armed, and a live
    reader's sleepers stay counted, and woken."""
    s = zctipc.Stream.create(shape=4, frames=2, readers=2, policy="overwrite")
    w, live = s.writer(), s.reader()
    got = []
    t = start(lambda: got.append(live.read(timeout=HANG)))
    assert settle(lambda: sleepers(s) == 1)
    child = armed_reader(s, wait, threads=2)
    try:
        # A sleeper waiting in Go leaves the count for an instant each time
        # its sleep's slice ends (100 ms), then counts itself again: the
        # three are seen together, not at every instant.
        assert settle(lambda: sleepers(s) == 3)
        child.kill()
        child.wait()
        again = s.reader()  # the only slot left is the dead one's
        assert sleepers(s) == 1, "the dead reader's two taken back, the live one's kept"
        w.write(frame(1))
        t.join(HANG)
        np.testing.assert_array_equal(got[0], frame(1))
        assert sleepers(s) == 0
        again.close()
    finally:
        child.kill()
        child.wait()
        for e in (w, live, s):
            e.close()
