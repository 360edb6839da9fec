"""A sender SIGKILLed at random points of a loop of hand-off puts (a pool
buffer it received, put again into a queue that is full most of the time):
its put step arms a ticket only once the record finds room (package
buffer, Note [counts that wait]), so every count it held is in its ledger,
which the cleanup daemon gives up, or in a record the receiver takes.
No count is given up twice; at most the one message a kill catches in the
last few instructions of its put or of its take stays in use, until its
pool's owner exits (docs/crash-safety.md); and every record the receiver
gets has its ticket armed (no DescriptorTaken)."""

import os
import queue
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import SWEEP_TIMEOUT, slots_in_use, with_pythonpath

import zctipc

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {**os.environ, "PYTHONPATH": with_pythonpath(os.path.join(os.path.dirname(HERE), "python"))}
N = 12  # buffers in play each round

_RELAY = """
import sys, zctipc
inq, outq = zctipc.Queue.attach(sys.argv[1]), zctipc.Queue.attach(sys.argv[2])
print("ready", flush=True)
while True:
    outq.put(inq.get())
"""


def _ledger_of(pid):
    return {s.name for s in zctipc.list_segments() if s.kind == "ledger" and s.creator_pid == pid}


def test_a_sender_killed_in_its_hand_off_puts_loses_and_doubles_no_count():
    rng = random.Random(63)
    # Slots held before (the pool is this process's), and those kills leave
    # in use, in the few instructions they may.
    caught = slots_in_use()
    for _ in range(3):
        inq, outq = zctipc.Queue(), zctipc.Queue(maxsize=2)
        bufs = [zctipc.empty(64, np.int64) for _ in range(N)]
        for i, b in enumerate(bufs):
            b[:] = i
            inq.put(b)
        child = subprocess.Popen(
            [sys.executable, "-c", _RELAY, inq.name, outq.name], stdout=subprocess.PIPE, text=True, env=ENV
        )
        got, stop = [], threading.Event()

        def drain(stop=stop, got=got, outq=outq):
            # Slowly, so that the relay's puts keep finding the queue full.
            while not stop.is_set():
                try:
                    got.append(outq.get(timeout=0.002))
                except queue.Empty:
                    pass
                time.sleep(rng.uniform(0, 0.003))

        t = threading.Thread(target=drain)
        try:
            assert child.stdout.readline() == "ready\n"
            t.start()
            time.sleep(rng.uniform(0, 0.05))
        finally:
            child.kill()
            child.wait()
            child.stdout.close()
            stop.set()
            t.join()
        # What is left, from both queues: every record takes its count (a
        # record whose ticket was not armed raises DescriptorTaken).
        for q in (outq, inq):
            while True:
                try:
                    got.append(q.get(timeout=0.2))
                except queue.Empty:
                    break
        a = None
        for a in got:
            assert (a == a[0]).all() and 0 <= a[0] < N
        assert len({int(a[0]) for a in got}) == len(got), "no buffer arrived twice"
        del a
        got.clear()
        # The relay's ledger swept: the counts it held, given up once.
        deadline = time.monotonic() + SWEEP_TIMEOUT
        while _ledger_of(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _ledger_of(child.pid)
        b = None
        for i, b in enumerate(bufs):
            assert (b == i).all()
        held = zctipc.pool_stats().slots_in_use - caught
        assert held >= N, "a count given up twice freed a slot still held"
        assert held <= N + 1, "more than one message's count lost to one kill"
        caught += held - N
        b = None
        bufs.clear()
        deadline = time.monotonic() + SWEEP_TIMEOUT
        while zctipc.pool_stats().slots_in_use > caught and time.monotonic() < deadline:
            time.sleep(0.05)
        assert zctipc.pool_stats().slots_in_use == caught, "a count was lost"
        inq.close()
        outq.close()
