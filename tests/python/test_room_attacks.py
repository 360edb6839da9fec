"""Attacks on how senders behave when /dev/shm has little room: a pool
whose arenas reserve a slot's pages only when it is first handed out
(Note [slots reserved when first used] in go/pool/pool.go), producers
SIGKILLed while they reserve them, a SimpleQueue's put that waits for room
(Note [sending in band when shared memory is full] in
zctipc._wire.exports) closed under it or shared by many threads, and the
bounds on what a sender leaves free. Each scenario mounts a small tmpfs
of its own and runs in a child process, so that what it leaves behind is
seen."""

import os
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest
from conftest import daemon_pid, with_pythonpath

from zctipc._core import native, pool

RUN = 120  # seconds a child program may take: the machine may be loaded

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")


@pytest.fixture
def mounted(tmp_path):
    """(mount, env): a tmpfs of 16 MiB for segments and a runtime directory
    of its own (its own cleanup daemon), as an environment for a child
    program. Afterwards the daemon is killed and the tmpfs unmounted."""
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount)], check=True)
    run_dir = str(tmp_path / f"run-{uuid.uuid4().hex[:8]}")
    env = dict(
        os.environ,
        ZCTIPC_SHM_DIR=str(mount),
        ZCTIPC_RUNTIME_DIR=run_dir,
        ZCTIPC_DAEMON_IDLE="2",
        PYTHONWARNINGS="ignore::RuntimeWarning",
        PYTHONPATH=with_pythonpath(os.path.dirname(os.path.abspath(__file__))),
    )
    for name in ("ZCTIPC_POOL_LIMIT", "ZCTIPC_SHARING_STRATEGY", "ZCTIPC_CLEANUP"):
        env.pop(name, None)
    try:
        yield mount, env
    finally:
        pid = daemon_pid(run_dir)
        if pid:
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["umount", "-l", str(mount)], check=True)


def run(tmp_path, env, program, *args):
    """Run program with env; its stdout lines, after checking it succeeded
    (a fault is a signal, not a return code of 0)."""
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(program))
    out = subprocess.run([sys.executable, str(path), *args], env=env, capture_output=True, text=True, timeout=RUN)
    assert out.returncode == 0, f"rc {out.returncode}: {out.stdout}{out.stderr}"
    return out.stdout.splitlines()


def wait_empty(mount, timeout=15):
    """What is left in mount once it is empty, or after timeout seconds."""
    import time

    deadline = time.monotonic() + timeout
    while os.listdir(mount) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.listdir(mount)


_KILLED = """
import os, queue, random, signal, subprocess, sys, time
import numpy as np
import zctipc
from _crash import queue_arg, queue_from

def producer(arg, seed):
    q = queue_from(arg)
    rng = random.Random(int(seed))
    print("ready", flush=True)
    i = 0
    while True:  # arrays of many classes: each new slot reserves its pages
        i += 1
        a = np.full(rng.randrange(40 << 10, 3 << 19), i % 251, np.uint8)
        try:
            q.put(a, timeout=0.02)
        except (zctipc.OutOfSharedMemory, queue.Full):
            pass

if __name__ == "__main__":
    if sys.argv[1:2] == ["producer"]:
        producer(sys.argv[2], sys.argv[3])
    rng = random.Random(20261126)
    q = zctipc.Queue()
    held, got = [], 0
    for round in range(8):
        p = subprocess.Popen([sys.executable, __file__, "producer", queue_arg(q), str(rng.randrange(1 << 30))],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + rng.uniform(0.05, 0.6)
        while time.monotonic() < deadline:
            try:
                a = q.get(timeout=0.02)
            except queue.Empty:
                continue
            v = int(a[0])
            assert (a == v).all(), "what was sent"
            a[:] = 255 - v  # every page of a buffer held is there: no fault
            held.append(a)
            del held[:-4]
            got += 1
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
    while True:  # what the producers left in the queue
        try:
            a = q.get(timeout=0.2)
        except queue.Empty:
            break
        a[:] = 1
    del held, a
    q.close()
    print("got", got > 0)
"""


def test_producers_killed_while_slots_are_reserved(tmp_path, mounted):
    """Producers that copy arrays of many sizes into their pools on a
    16 MiB tmpfs (each slot's pages reserved as it is first handed out,
    until the file system is full) are SIGKILLed at random moments, eight
    times; the consumer writes every byte of the buffers it holds and
    never faults, and once it exits the daemon leaves nothing in the
    mount."""
    mount, env = mounted
    assert run(tmp_path, env, _KILLED) == ["got True"]
    assert wait_empty(mount) == []


_CLOSED = """
import threading
import numpy as np
import zctipc

if __name__ == "__main__":
    big = np.ones(1 << 20, np.uint8)
    sq = zctipc.SimpleQueue()
    result = []

    def put():
        try:
            while True:  # the queue holds them all: a put waits for room while it does
                sq.put(big)
                result.append("put")
        except Exception as e:
            result.append(type(e).__name__)

    t = threading.Thread(target=put, daemon=True)
    t.start()
    t.join(3.0)
    waited = t.is_alive()
    sq.close()
    t.join(20)
    print("waited", waited, "ended", not t.is_alive(), result[-1], 3 <= len(result) < 16)
"""


def test_a_simple_queue_closed_while_a_put_waits_for_room(tmp_path, mounted):
    """A SimpleQueue whose messages hold the pool's buffers on a 16 MiB
    tmpfs: a put of one more array waits for room while the queue holds
    messages; closing the queue from another thread ends that put with a
    clear error rather than leaving it asleep, and the mount is left
    empty."""
    mount, env = mounted
    lines = run(tmp_path, env, _CLOSED)
    assert lines == ["waited True ended True HandleClosed True"], lines
    assert wait_empty(mount) == []


_THREADS = """
import threading
import numpy as np
import zctipc

if __name__ == "__main__":
    sq = zctipc.SimpleQueue()
    n, per = 6, 20
    errors = []

    def put(k):
        try:
            for i in range(per):
                sq.put(np.full(1 << 17, k * per + i, np.float64))  # 1 MiB each
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=put, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    seen = set()
    for _ in range(n * per):
        a = sq.get()
        v = int(a[0])
        assert (a == v).all()
        seen.add(v)
    for t in threads:
        t.join(60)
    print(len(seen) == n * per, errors, any(t.is_alive() for t in threads))
    sq.close()
"""


def test_many_threads_put_to_one_simple_queue_on_a_full_shm(tmp_path, mounted):
    """Six threads put 1 MiB arrays to one SimpleQueue on a 16 MiB tmpfs
    while a reader takes them: every array arrives whole, in band where
    the pool had no room, and no put fails or waits for ever."""
    mount, env = mounted
    assert run(tmp_path, env, _THREADS) == ["True [] False"]
    assert wait_empty(mount) == []


@pytest.mark.parametrize("leave", [-1, -(1 << 63), 1 << 64, 1 << 100])
def test_alloc_leaving_refuses_what_is_no_byte_count(leave):
    """alloc_leaving's leave is a byte count: negative or past 2^64, it is
    an OverflowError before anything is taken."""
    with pytest.raises(OverflowError):
        pool.alloc_leaving(1 << 20, leave)


@pytest.mark.parametrize("leave", [1.5, "8M", None])
def test_alloc_leaving_refuses_what_is_no_integer(leave):
    with pytest.raises(TypeError):
        pool.alloc_leaving(1 << 20, leave)


def test_alloc_leaving_all_of_2_64_takes_no_new_pages():
    """A leave of 2^64 - 1 (or near it) leaves more than any file system
    holds: a class never used before gets no buffer (it does not wrap round
    to a small number). A class a test is unlikely to have used: 2.6 GiB
    slots are never made, the arena alone would not fit."""
    for leave in ((1 << 64) - 1, (1 << 64) - (1 << 20), 1 << 63):
        assert pool.alloc_leaving(5 << 20 | 12345, leave) in (native.E_NO_SPACE, native.E_FULL)
