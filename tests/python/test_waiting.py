"""How blocked calls wait: they wake when they should (several awaiting
coroutines, close, an infinite timeout under load), stay asleep when they
should not (an idle waiter costs no wake-ups, a readiness descriptor is not
readable on an empty queue), and a stream reader that waits is alive.

Nothing here asserts a timing: wake-ups are counted (context switches of
every thread of the waiting process), and hangs are caught by timeouts far
above what the behaviour needs."""

import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import with_pythonpath

import zctipc

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.path.dirname(HERE), "python")

# -- wake-ups of an idle waiter -----------------------------------------------------------

# Allowed wake-ups a second of a whole process whose one thread is blocked:
# Ctrl-C is seen within 100 ms (~10-20 a second), and the Go runtime's own
# threads wake now and then; a spinning or polling waiter wakes thousands
# of times.
IDLE_WAKEUPS_PER_SECOND = 100


def _switches(pid):
    """Context switches (voluntary and not) of every thread of pid, summed."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except FileNotFoundError:  # a thread that ended
            pass
    return total


_IDLE_CHILD = """
import sys, zctipc
kind = sys.argv[1]
if kind.startswith("queue"):
    q = zctipc.Queue()
    q.put(1); q.get()
    print("ready", flush=True)
    q.get(timeout=float("inf") if kind == "queue-inf" else None)
elif kind == "stream":
    s = zctipc.Stream.create(shape=16, frames=4)
    r = s.reader()
    print("ready", flush=True)
    r.read()
elif kind == "readiness":
    queues = [zctipc.Queue() for _ in range(50)]
    for q in queues:
        q._reader.fileno()
        q.put(1); q.get()
    print("ready", flush=True)
    import multiprocessing.connection
    multiprocessing.connection.wait([q._reader for q in queues])
"""


@pytest.mark.parametrize("kind", ["queue", "queue-inf", "stream"])
def test_an_idle_waiter_does_not_wake(kind):
    child = subprocess.Popen(
        [sys.executable, "-c", _IDLE_CHILD, kind],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": with_pythonpath(PACKAGE)},
    )
    try:
        assert child.stdout.readline() == "ready\n"
        time.sleep(0.5)  # past the first spin and brief wait
        before, start = _switches(child.pid), time.monotonic()
        time.sleep(2)
        rate = (_switches(child.pid) - before) / (time.monotonic() - start)
        assert child.poll() is None, "the waiter returned"
        assert rate < IDLE_WAKEUPS_PER_SECOND, f"{rate:.0f} wake-ups a second while waiting"
    finally:
        child.kill()
        child.wait()


# -- an infinite timeout ---------------------------------------------------------------------

_PAIR = """
import sys, time, zctipc
q = zctipc.Queue.attach(sys.argv[2])
n = int(sys.argv[3])
if sys.argv[1] == "consume":
    for i in range(n):
        assert q.get(timeout=float("inf")) == i
else:
    for i in range(n):
        time.sleep(0.002 * (i % 5))
        q.put(i)
q.close()
"""


def test_gets_with_an_infinite_timeout_all_return_under_load():
    pairs, n = 4, 200
    queues = [zctipc.Queue() for _ in range(pairs)]
    env = {**os.environ, "PYTHONPATH": with_pythonpath(PACKAGE)}
    procs = []
    try:
        for q in queues:
            for role in ("consume", "produce"):
                procs.append(subprocess.Popen([sys.executable, "-c", _PAIR, role, q.name, str(n)], env=env))
        for p in procs:
            assert p.wait(120) == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for q in queues:
            q.close()


def test_an_infinite_timeout_waits_in_one_slice_after_another():
    q = zctipc.Queue()
    try:
        threading.Timer(0.3, q.put, ("late",)).start()
        assert q.get(timeout=float("inf")) == "late"
        threading.Timer(0.3, q.put, ("later",)).start()
        assert q.get(timeout=1e300) == "later"
    finally:
        q.close()
