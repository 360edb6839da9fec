"""Attacks on how blocked calls wait (Note [sleeping outside Go] in
zctipc._core.wait): many waiters, closes while they sleep or are about to,
waiters killed, stopped or interrupted while armed, timeouts at their
edges, the readiness thread against consumers and producers.

Nothing here asserts a timing: wake-ups and events are counted, and hangs
are caught by timeouts far above what the behaviour needs."""

import os
import select
import subprocess
import sys
import time

from conftest import with_pythonpath

import zctipc

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.path.dirname(HERE), "python")
ENV = {**os.environ, "PYTHONPATH": with_pythonpath(PACKAGE)}

# Far above anything the behaviour needs: only a hang reaches it.
HANG = 60


def _settle(condition, timeout=HANG):
    """Wait until condition() holds; False if it never did."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


# -- the readiness thread -------------------------------------------------------------------


def _readable(q):
    import multiprocessing.connection

    return bool(multiprocessing.connection.wait([q._reader], timeout=0))


def test_the_readiness_thread_follows_the_queue_while_it_is_open():
    """The thread that keeps the descriptor readable lives as long as the
    queue is open, and the descriptor follows the queue both ways."""
    q = zctipc.Queue()
    try:
        q._reader.fileno()
        for i in range(20):
            q.put(i)
            assert _settle(lambda: _readable(q))
            assert q.get(timeout=HANG) == i
            assert _settle(lambda: not _readable(q)), "readable on an empty queue"
        assert q._ready.thread.is_alive()
    finally:
        q.close()
    assert _settle(lambda: not q._ready.thread.is_alive())
    # As a pipe whose writer closed: whoever still watches it looks, and
    # finds the queue closed.
    assert select.select([q._ready.read_fd], [], [], 0)[0]


_EXIT_WITH_WAITABLE_QUEUES = """
import zctipc
queues = [zctipc.Queue() for _ in range(100)]
for q in queues:
    q._reader.fileno()
for q in queues:
    q.close()
"""


def test_readiness_threads_leave_no_error_at_exit():
    """A process that closes waitable queues and exits at once: their
    threads, still ending, never write to a pipe closed at exit (a closed
    descriptor, or one another file took meanwhile)."""
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", _EXIT_WITH_WAITABLE_QUEUES], env=ENV, capture_output=True, text=True, timeout=HANG
        )
        assert done.returncode == 0, done.stderr
        assert "Exception in thread" not in done.stderr, done.stderr
