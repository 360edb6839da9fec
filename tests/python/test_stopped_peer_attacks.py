"""Attacks on what a stopped process (SIGSTOP) holds up in a queue
(docs/queues.md): one stopped anywhere but inside the few locked
instructions of a get or a put holds up the others for at most one wait
slice (zctipc._core.wait.WAIT_SLICE, 50 ms), even one that a put's (or a
get's) wake-up went to.

A process stopped while asleep on a futex leaves the kernel's queue of
sleepers (the signal ends its wait; SIGCONT starts it again), so a wake-up
never goes to it. The wake-up goes to a stopped process only when it was
woken and then stopped before it ran: a SIGSTOP sent right after the put
that woke it, before its wake-up latency (tens of microseconds) passed. The
tests here do that, several rounds each, so that most rounds catch it.

Nothing here asserts a timing but generous bounds: the live peer must be
through within SEEN seconds where a slice is 50 ms; a hang is caught at
HANG. Every process started is killed in a finally."""

import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import with_pythonpath

import zctipc

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.path.dirname(HERE), "python")
ENV = {**os.environ, "PYTHONPATH": with_pythonpath(PACKAGE)}

HANG = 60
# A live peer must be through within this (a slice is 50 ms).
SEEN = 5
ROUNDS = 4


def _start(code, *argv):
    return subprocess.Popen(
        [sys.executable, "-c", code, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV
    )


def _line(p, timeout=HANG):
    """The next line p prints, or "" when it prints none within timeout."""
    if not select.select([p.stdout], [], [], timeout)[0]:
        return ""
    return p.stdout.readline()


def _end(*procs):
    for p in procs:
        if p is None:
            continue
        try:
            p.send_signal(signal.SIGCONT)
        except ProcessLookupError:
            pass
        p.kill()
        p.wait()


# Waits in the way argv[3] names, on queue argv[2] of class argv[1], after
# printing "ready"; prints what it got, or "timeout" after SEEN seconds.
_WAITER = """
import sys, time, multiprocessing.connection, zctipc
cls, name, how = sys.argv[1], sys.argv[2], sys.argv[3]
q = getattr(zctipc, cls).attach(name)
if how == "readiness":
    q._reader.fileno()
print("ready", flush=True)
SEEN = float(sys.argv[4])
try:
    if how == "readiness":
        if multiprocessing.connection.wait([q._reader], timeout=SEEN):
            print("got", q.get(timeout=SEEN), flush=True)
        else:
            print("timeout", flush=True)
    elif how == "get":
        print("got", q.get(timeout=SEEN), flush=True)
    elif how == "get forever":
        print("got", q.get(), flush=True)
    elif how == "get_many":
        print("got", *q.get_many(10, timeout=SEEN), flush=True)
    elif how == "poll":
        print("got" if q._poll(SEEN) else "timeout", flush=True)
    elif how == "reader poll":
        print("got" if q._reader.poll(SEEN) else "timeout", flush=True)
    elif how == "join":
        q.join()
        print("got", flush=True)
    elif how == "put":
        q.put(sys.argv[5], timeout=SEEN)
        print("got", flush=True)
except Exception as e:
    print("timeout", type(e).__name__, flush=True)
sys.stdin.readline()
"""


def _waiter(cls, name, how, *extra, asleep=0.3):
    p = _start(_WAITER, cls, name, how, str(SEEN), *extra)
    try:
        assert _line(p) == "ready\n"
        time.sleep(asleep)  # asleep in its wait (outside the library by now)
    except BaseException:
        _end(p)
        raise
    return p


def _woken_then_stopped(cls, victim_how, live_how, wake, victim_won, *, qargs=(), prepare=None, args=((), ())):
    """ROUNDS rounds of: a victim asleep in victim_how (first among the
    sleepers, mostly), a live peer asleep in live_how after it, wake(q) (a
    put, a get, a task_done) and at once a SIGSTOP of the victim. Each
    round's outcome: "live" when the live peer was through within SEEN
    seconds; "victim" when it was not, and victim_won(q) says, while the
    victim is stopped still, that the victim ran before its stop and took
    what there was to take (the race is lost then: nothing was held up);
    else what the live peer printed. args: the victim's and the live
    peer's extra arguments."""
    out = []
    for _ in range(ROUNDS):
        q = getattr(zctipc, cls)(*qargs)
        victim = live = None
        try:
            if prepare is not None:
                prepare(q)
            victim = _waiter(cls, q.name, victim_how, *args[0])
            live = _waiter(cls, q.name, live_how, *args[1])
            wake(q)
            victim.send_signal(signal.SIGSTOP)
            line = _line(live, SEEN + 2)
            out.append("live" if line.startswith("got") else "victim" if victim_won(q) else f"held up: {line!r}")
        finally:
            _end(victim, live)
            q.close()
    return out


def _took(q):
    return q.qsize() == 0


def _never(q):
    return False


@pytest.mark.parametrize("victim", ["readiness", "get", "get_many", "poll", "reader poll"])
@pytest.mark.parametrize("live", ["readiness", "get", "get forever"])
def test_a_consumer_woken_then_stopped_holds_up_no_other_consumer(victim, live):
    """A put's wake-up goes to a consumer asleep in a get, a get_many, a
    _poll, a Reader.poll or its readiness thread (q._reader.fileno()), which
    is stopped before it runs: another consumer, asleep in a get or waiting
    on the queue's descriptor, gets the message all the same, in about a
    slice (or a second, on the descriptor)."""
    # A victim waiting on the descriptor gets after its wait returns: when
    # it ran that far before its stop (the test's own process may be
    # preempted between the put and the SIGSTOP), it took the message.
    takes = victim in ("readiness", "get", "get_many", "reader poll")
    out = _woken_then_stopped("Queue", victim, live, lambda q: q.put(7), _took if takes else _never)
    assert set(out) <= {"live", "victim"}, out


def test_a_producer_woken_then_stopped_holds_up_no_other_producer():
    """Producers asleep in a put on a full queue; a get's wake-up goes to
    one, stopped before it runs: the other's put goes through in about a
    slice."""

    def victim_put(q):
        try:
            return q.get_nowait() == "v"
        except Exception:
            return False

    out = _woken_then_stopped(
        "Queue",
        "put",
        "put",
        lambda q: q.get(timeout=HANG),
        victim_put,
        qargs=(1,),
        prepare=lambda q: q.put("x"),
        args=(("v",), ("l",)),
    )
    assert set(out) <= {"live", "victim"}, out


def test_a_joiner_woken_then_stopped_holds_up_no_other_joiner():
    out = _woken_then_stopped(
        "JoinableQueue",
        "join",
        "join",
        lambda q: (q.get(timeout=HANG), q.task_done()),
        _never,
        prepare=lambda q: q.put(1),
    )
    assert out == ["live"] * ROUNDS, out


def test_a_simple_queue_consumer_woken_then_stopped_holds_up_no_other():
    out = _woken_then_stopped("SimpleQueue", "get forever", "get forever", lambda q: q.put(7), _took)
    assert set(out) <= {"live", "victim"}, out


_COUNTER = """
import sys, zctipc
q = zctipc.Queue.attach(sys.argv[1])
print("ready", flush=True)
while True:
    x = q.get()
    if x is None:
        break
    print(x, flush=True)
print("end", flush=True)
"""


def test_a_consumer_stopped_and_continued_mid_get_loses_and_repeats_nothing():
    """A consumer stopped and continued at random while it takes: every
    message arrives once, in order."""
    import random

    rng = random.Random(71)
    q = zctipc.Queue(4)
    p = _start(_COUNTER, q.name)
    try:
        assert _line(p) == "ready\n"
        n = 300
        for i in range(n):
            q.put(i, timeout=HANG)
            if rng.random() < 0.2:
                p.send_signal(signal.SIGSTOP)
                time.sleep(rng.random() * 0.005)
                p.send_signal(signal.SIGCONT)
        q.put(None, timeout=HANG)
        got = []
        while True:
            line = _line(p)
            assert line, "the consumer went quiet"
            if line == "end\n":
                break
            got.append(int(line))
        assert got == list(range(n))
    finally:
        _end(p)
        q.close()


def test_twenty_stopped_sleepers_hold_up_no_live_consumer():
    """Twenty consumers asleep in a get, stopped; one live consumer (a
    thread here) gets every message, each within SEEN seconds."""
    q = zctipc.Queue()
    procs = []
    try:
        procs = [_start(_WAITER, "Queue", q.name, "get forever", str(SEEN)) for _ in range(20)]
        for p in procs:
            assert _line(p) == "ready\n"
        time.sleep(0.5)
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        for i in range(40):
            got = []
            t = threading.Thread(target=lambda got=got: got.append(q.get(timeout=SEEN)), daemon=True)
            t.start()
            time.sleep(0.05)  # asleep among the stopped (or about to be)
            q.put(i)
            t.join(HANG)
            assert got == [i]
    finally:
        _end(*procs)
        q.close()
