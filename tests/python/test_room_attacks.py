"""Attacks on how senders behave when /dev/shm has little room: a pool
whose arenas reserve a slot's pages only when it is first handed out
(Note [slots reserved when first used] in go/internal/pool/pool.go), producers
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

from zctipc._core import pool

RUN = 120  # seconds a child program may take: the machine may be loaded

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root"), pytest.mark.slow]


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
    holds: a pool with no buffers yet (a fresh process: a slot used before
    is always taken) gets no buffer (the sum does not wrap round to a small
    number)."""
    code = textwrap.dedent(
        """
        from zctipc._core import native, pool
        for leave in ((1 << 64) - 1, (1 << 64) - (1 << 20), 1 << 63):
            got = pool.alloc_leaving(5 << 20 | 12345, leave)
            print(got in (native.E_NO_SPACE, native.E_FULL))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True"] * 3


_POOLS = """
import sys
import numpy as np
import zctipc, concurrent.futures

def double(a):
    return a * 2

def arrays(mib, n):
    return [np.full(mib << 17, i, np.float64) for i in range(n)]

if __name__ == "__main__":
    mib, n = int(sys.argv[1]), int(sys.argv[2])
    with zctipc.get_context().Pool(2) as pool:
        print("imap", all(bool((r == 2 * i).all()) for i, r in enumerate(pool.imap(double, arrays(mib, n)))))
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=zctipc.get_context()) as ex:
        results = list(ex.map(double, arrays(mib, n)))  # every result kept
        print("executor", all(bool((r == 2 * i).all()) for i, r in enumerate(results)))
"""


@pytest.mark.parametrize("mib", [2, 4])
def test_pools_finish_on_a_16_mib_shm(tmp_path, mounted, mib):
    """multiprocessing.Pool.imap and ProcessPoolExecutor.map with zctipc's
    context over arrays of a quarter of a 16 MiB tmpfs finish with every
    result right: a SimpleQueue sends an array in band only once it holds
    no message (Note [in band one at a time] in zctipc.queues), so the
    pool's task handler, which puts every task as soon as it can, no
    longer fills the tmpfs with its ring's tasks while the workers'
    results find no room (they raised OutOfSharedMemory)."""
    mount, env = mounted
    assert run(tmp_path, env, _POOLS, str(mib), str(48 // mib)) == ["imap True", "executor True"]
    assert wait_empty(mount) == []


_TORCH = """
import os, threading, time
import torch
import zctipc

if __name__ == "__main__":
    directory = os.environ["ZCTIPC_SHM_DIR"]
    q, sq = zctipc.Queue(), zctipc.SimpleQueue()
    mine = torch.ones(1 << 18)  # 1 MiB, moved into the pool by its put: a slot of its class in use
    q.put(mine)
    q.get()
    free = os.statvfs(directory)
    with open(os.path.join(directory, "someone-else"), "wb") as f:  # someone else takes what is left
        os.posix_fallocate(f.fileno(), 0, free.f_bavail * free.f_frsize - (16 << 10))
    start = time.monotonic()
    try:
        q.put(torch.ones(1 << 18), timeout=0.5)
    except zctipc.OutOfSharedMemory as e:
        print("Queue waits then raises", time.monotonic() - start < 20, directory in str(e))
    start = time.monotonic()
    try:
        q.put(torch.ones(1 << 16))  # a class with nothing in use: waiting cannot help
    except zctipc.OutOfSharedMemory as e:
        print("Queue raises at once", time.monotonic() - start < 20, directory in str(e))
    done = []
    t = threading.Thread(target=lambda: done.append(sq.put(torch.full((1 << 18,), 3.0))), daemon=True)
    t.start()
    t.join(1.0)
    print("SimpleQueue waits", t.is_alive())
    os.unlink(os.path.join(directory, "someone-else"))
    t.join(20)
    got = sq.get()
    print("then puts", done == [None], bool((got == 3).all()), zctipc.is_shared(got.numpy()))
    del mine, got
    q.close()
    sq.close()
"""


def test_torch_tensors_on_a_full_shm(tmp_path, mounted):
    """Torch tensors are shared, never copied in band: on a tmpfs that
    someone else filled, Queue.put of one whose size class is in use waits
    as its timeout says and raises OutOfSharedMemory, one of a class with
    nothing in use raises at once, and SimpleQueue.put waits (its slot's
    pages may come: here the other file goes) and then sends it shared."""
    mount, env = mounted
    assert run(tmp_path, env, _TORCH) == [
        "Queue waits then raises True True",
        "Queue raises at once True True",
        "SimpleQueue waits True",
        "then puts True True True",
    ]
    assert wait_empty(mount) == []


def _produce(q, n, k):
    for i in range(n):
        q.put((k, i, b"x" * (1000 + (i * 7919) % 30000)))


def test_readiness_while_producers_wait_for_room_on_the_same_queue():
    """A queue of 64 KiB: two threads of this process and another process
    put messages of up to 31 KiB, waiting for room on the space word the
    readiness thread sleeps on while the queue holds messages; a consumer
    that waits only on multiprocessing.connection.wait gets every message,
    and never finds the descriptor unreadable while the queue holds one
    (Note [showing after arming] in zctipc._pipes)."""
    import multiprocessing.connection
    import queue
    import threading
    import time

    import zctipc

    q = zctipc.Queue(max_bytes=64 << 10)
    n = 1000
    p = zctipc.get_context().Process(target=_produce, args=(q, n, 0))
    p.start()
    threads = [threading.Thread(target=_produce, args=(q, n, k)) for k in (1, 2)]
    for t in threads:
        t.start()
    try:
        got, seen = 0, set()
        deadline = time.monotonic() + RUN
        while got < 3 * n and time.monotonic() < deadline:
            if not multiprocessing.connection.wait([q._reader], timeout=10):
                assert q.qsize() == 0, f"the descriptor is unreadable with {q.qsize()} messages in the queue"
                continue
            try:
                while True:
                    k, i, _ = q.get_nowait()
                    seen.add((k, i))
                    got += 1
            except queue.Empty:
                pass
        assert len(seen) == got == 3 * n
    finally:
        for t in threads:
            t.join(30)
        p.join(30)
        q.close()
