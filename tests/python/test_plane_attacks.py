"""Attacks on the queue's data plane as Python meets it: the steps of a put,
a get and a sleep run in C without entering Go (Note [a data plane the
runtime never enters] in go/internal/plane), under a SIGBUS guard that the
library installs over the Go runtime's handler. A queue file shrunk under
threads that put and get, records forged in the ring, a full /dev/shm
under an unbounded queue, and Python's faulthandler enabled before the
library loads (as pytest does) or after: the calls raise zctipc's errors,
the process lives on, and a SIGBUS outside the library still reaches
faulthandler or kills the process as it did before. Each scenario runs in
a child process, so that a crash is seen as one."""

import os
import signal
import subprocess
import textwrap

import pytest
from _procs import run_program as run
from _procs import succeeded

# The file cut to nothing, or after the queue's words and the ring's first
# page (the steps that hold a lock fault past it: they let it go).
SHRINK = """
    import os, queue, struct, sys, threading, time, zctipc

    unbounded, to_nothing = sys.argv[1] == "unbounded", sys.argv[2] == "nothing"
    q = zctipc.Queue() if unbounded else zctipc.Queue(max_bytes=1 << 16)
    path = os.path.join(os.environ["ZCTIPC_SHM_DIR"], q.name)
    with open(path, "rb") as f:
        data_offset = struct.unpack_from("<Q", f.read(24), 16)[0]
    stop, seen, lock = threading.Event(), set(), threading.Lock()

    def work(i):
        after = 0
        while not stop.is_set() or after < 100:
            after += stop.is_set()
            try:
                if i % 2:
                    q.put(bytes(1 + (after * 397) % 3000), timeout=0.005)
                else:
                    q.get(timeout=0.005)  # sleeps outside Go: arm, look, sleep, disarm
            except (queue.Empty, queue.Full):
                pass
            except zctipc.CorruptHeader:
                with lock:
                    seen.add("CorruptHeader")
            except zctipc.OutOfSharedMemory:  # an unbounded queue's pages past the cut
                with lock:
                    seen.add("OutOfSharedMemory")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    size = 0 if to_nothing else (data_offset + 512 + 4096 + 4095) & ~4095
    os.truncate(path, size)  # the hostile process
    stop.set()
    for t in threads:
        t.join()
    print(*sorted(seen))
    try:
        q.close()
    except zctipc.CorruptHeader:
        pass  # its count lay in the file
    if os.path.exists(path):
        os.unlink(path)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bounded", "unbounded"])
@pytest.mark.parametrize("cut", ["nothing", "words"])
def test_a_queue_shrunk_under_threads_raises_corrupt_header(isolated, tmp_path, kind, cut):
    """Threads put and get (sleeping outside Go between looks) while the
    queue's file is cut: each call raises CorruptHeader (or, for an
    unbounded queue's pages past the cut, OutOfSharedMemory), none a fault
    or another error, and none waits for ever on a lock its own process
    held when its step faulted."""
    seen = succeeded(run(tmp_path, isolated, SHRINK, kind, cut))
    assert len(seen) == 1
    if kind == "bounded" or cut == "nothing":
        assert "CorruptHeader" in seen[0].split()


ASLEEP = """
    import os, queue, struct, threading, time, zctipc
    q = zctipc.Queue(max_bytes=1 << 16)
    path = os.path.join(os.environ["ZCTIPC_SHM_DIR"], q.name)
    with open(path, "rb") as f:
        data_offset = struct.unpack_from("<Q", f.read(24), 16)[0]

    def waiters():
        with open(path, "rb") as f:
            f.seek(data_offset + 260)  # waiting consumers (docs/format.md, "Queues")
            return struct.unpack("<I", f.read(4))[0]

    def consume():
        try:
            q.get(timeout=1)
            print("got")
        except zctipc.CorruptHeader:
            print("CorruptHeader")
        except queue.Empty:
            print("Empty")

    t = threading.Thread(target=consume)
    t.start()
    while waiters() == 0:  # asleep in Go for its first 2 ms (BRIEF_MS), then armed: asleep outside Go
        time.sleep(0.001)
    time.sleep(0.1)
    assert waiters() == 1
    os.truncate(path, 0)
    t.join()
    os.unlink(path)
"""


def test_a_get_asleep_when_its_queue_is_shrunk_raises_corrupt_header(isolated, tmp_path):
    """A get asleep outside Go (armed) when the queue's file is cut: its
    sleep ends at the timeout, and taking its arm back faults, which is
    CorruptHeader (the arm was never Go's to refuse as unbalanced)."""
    assert succeeded(run(tmp_path, isolated, ASLEEP)) == ["CorruptHeader"]


FAULT_IN_THE_PLANE = """
    import os, zctipc
    q = zctipc.Queue(max_bytes=1 << 16)
    q.put(b"x"); assert q.get() == b"x"  # the steps, and so the guard, at work
    os.truncate(os.path.join(os.environ["ZCTIPC_SHM_DIR"], q.name), 0)
    for call in (lambda: q.put(b"y"), lambda: q.get(timeout=0.05)):
        try:
            call()
        except zctipc.CorruptHeader:
            print("CorruptHeader", flush=True)
    os.unlink(os.path.join(os.environ["ZCTIPC_SHM_DIR"], q.name))
"""

FAULT_OUTSIDE = """
    import mmap, os, tempfile

    def read_a_shrunk_file():
        with tempfile.TemporaryFile() as f:
            f.truncate(4096)
            m = mmap.mmap(f.fileno(), 4096)
            f.truncate(0)
            return m[0]  # SIGBUS, in no step of the library

    read_a_shrunk_file()
    print("survived", flush=True)
"""


@pytest.mark.parametrize("order", ["before", "after", "never"])
def test_faulthandler_and_the_planes_guard(isolated, tmp_path, order):
    """faulthandler enabled before the library loads (pytest's order),
    after the plane's guard is installed, or not at all: a fault in a step
    of the library raises CorruptHeader and the process lives on; a SIGBUS
    in the program's own code afterwards still kills it, through
    faulthandler's report where it is enabled first. Enabled after the
    guard, faulthandler is first in line: it reports the step's fault as
    fatal, lets go of its handler and raises the signal again, which the
    guard then turns into CorruptHeader (the Go runtime, in its place
    before the data plane, crashed there)."""
    enable = "import faulthandler; faulthandler.enable()\n"
    program = (
        (enable if order == "before" else "")
        + "import zctipc\n"
        + textwrap.dedent(FAULT_IN_THE_PLANE)
        + (enable if order == "after" else "")
        + textwrap.dedent(FAULT_OUTSIDE)
    )
    out = run(tmp_path, isolated, program)
    assert out.returncode == -signal.SIGBUS, f"rc {out.returncode}: {out.stdout}{out.stderr}"
    assert out.stdout.split() == ["CorruptHeader", "CorruptHeader"]
    if order == "before":
        assert out.stderr.count("Fatal Python error: Bus error") == 1, out.stderr
        assert "read_a_shrunk_file" in out.stderr, out.stderr
    if order == "never":
        assert "Fatal Python error" not in out.stderr, out.stderr


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_an_unbounded_queue_on_a_full_file_system(isolated, tmp_path):
    """Producer threads fill a 16 MiB /dev/shm through an unbounded queue
    that no one reads: each put goes in or raises OutOfSharedMemory, never
    a fault; once a consumer takes the messages, puts go in again."""
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        env = dict(isolated, ZCTIPC_SHM_DIR=str(mount))
        out = run(
            tmp_path,
            env,
            """
            import threading, zctipc
            q = zctipc.Queue()
            put, refused, lock = [0], [0], threading.Lock()

            def produce(i):
                for k in range(200):
                    try:
                        q.put(bytes([i]) * (100_000 + 4096 * k), timeout=1)
                        with lock:
                            put[0] += 1
                    except zctipc.OutOfSharedMemory:
                        with lock:
                            refused[0] += 1

            threads = [threading.Thread(target=produce, args=(i,)) for i in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            print(put[0] > 0, refused[0] > 0)
            taken = 0
            while True:
                try:
                    q.get(timeout=0.2)
                    taken += 1
                except Exception as e:
                    print(type(e).__name__)
                    break
            print(taken == put[0])
            for k in range(20):
                q.put(bytes(1 << 20)); assert len(q.get()) == 1 << 20
            print("flows")
            q.close()
        """,
        )
        assert succeeded(out) == ["True True", "Empty", "True", "flows"]
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


HELD = """
    import mmap, os, struct, threading, time, zctipc
    q = zctipc.Queue()  # unbounded: room for every put, and no consumer
    f = open(os.path.join(os.environ["ZCTIPC_SHM_DIR"], q.name), "r+b")
    m = mmap.mmap(f.fileno(), 0)
    data = struct.unpack_from("<Q", m, 16)[0]
    PUT_LOCK, SPACE_WAITERS = data + 64, data + 324
    struct.pack_into("<I", m, PUT_LOCK, os.getpid())  # a put of another thread holds the lock
    done = []

    def put():
        try:
            q.put("behind", timeout=60)
            done.append("put")
        except Exception as e:
            done.append(type(e).__name__)

    t = threading.Thread(target=put)
    t.start()
    while struct.unpack_from("<I", m, SPACE_WAITERS)[0] == 0:  # it found the queue "full", and sleeps
        time.sleep(0.01)
    struct.pack_into("<I", m, PUT_LOCK, 0)  # the holder's put ends: another put, which lets the lock go too
    q.put("holder")
    t.join(20)
    print(done, t.is_alive(), sorted([q.get(timeout=5), q.get(timeout=5)]))
    m.close(); f.close()
    q.close()
"""


def test_a_put_asleep_behind_another_put_wakes_when_the_lock_is_let_go(isolated, tmp_path):
    """A put that found the put lock held and went to sleep on the space
    word, on a queue with room and no consumer, is woken by the put that
    lets the lock go (Note [a put that found the lock held] in
    go/internal/plane/queue.c): it goes in, rather than sleeping to its
    timeout and raising queue.Full."""
    lines = succeeded(run(tmp_path, isolated, HELD))
    assert lines == ["['put'] False ['behind', 'holder']"]


DIED = """
    import mmap, os, signal, struct, subprocess, sys, threading, time, zctipc
    which, reaped = sys.argv[1], sys.argv[2] == "reaped"
    q = zctipc.Queue()  # unbounded: room for every put
    if which == "get":
        q.put("there")
    f = open(os.path.join(os.environ["ZCTIPC_SHM_DIR"], q.name), "r+b")
    m = mmap.mmap(f.fileno(), 0)
    data = struct.unpack_from("<Q", m, 16)[0]
    LOCK, WAITERS = (data + 128, data + 260) if which == "get" else (data + 64, data + 324)
    holder = subprocess.Popen(["sleep", "300"])
    start = int(open(f"/proc/{holder.pid}/stat").read().rsplit(")", 1)[1].split()[19])
    # The holder took the lock, contended, and recorded itself: a get or a
    # put of its own, stopped in the lock.
    struct.pack_into("<IIQ", m, LOCK, holder.pid | 1 << 31, holder.pid, start)
    done = []

    def call():
        try:
            done.append(q.get(timeout=60) if which == "get" else q.put("behind", timeout=60))
        except Exception as e:
            done.append(type(e).__name__)

    t = threading.Thread(target=call)
    t.start()
    while struct.unpack_from("<I", m, WAITERS)[0] == 0:  # it found the lock held, and sleeps
        time.sleep(0.01)
    time.sleep(0.2)
    holder.kill()  # a zombie until waited for: gone all the same
    if reaped:
        holder.wait()
    t.join(30)
    print(done, t.is_alive(), struct.unpack_from("<I", m, LOCK)[0])
    if which == "put":
        print(q.get(timeout=5))
    holder.wait()
    m.close(); f.close()
    q.close()
"""


@pytest.mark.parametrize("reaped", ["reaped", "zombie"])
@pytest.mark.parametrize("which", ["get", "put"])
def test_a_call_asleep_behind_a_lock_whose_holder_dies_goes_through(isolated, tmp_path, which, reaped):
    """A get (or put) that found the queue's lock held by another process
    sleeps on the data (or space) word; the holder is then killed in the
    lock, and nothing moves that word again (no put comes; every producer
    waits). The sleeper looks again within a second all the same, takes
    the lock over and goes through, rather than sleeping to its timeout
    (Note [a lock holder that died wakes nobody] in zctipc._core.wait)."""
    lines = succeeded(run(tmp_path, isolated, DIED, which, reaped))
    if which == "get":
        assert lines == ["['there'] False 0"]
    else:
        assert lines == ["[None] False 0", "behind"]


FORGE = """
    import mmap, os, queue, struct, zctipc
    q = zctipc.Queue(max_bytes=4096)
    path = os.path.join(os.environ["ZCTIPC_SHM_DIR"], q.name)
    f = open(path, "r+b")
    m = mmap.mmap(f.fileno(), 0)
    data = struct.unpack_from("<Q", m, 16)[0]
    ring = data + 512

    def forge(offset, fmt, value):
        tail = struct.unpack_from("<Q", m, data + 96)[0] & 0xFFFFFFFF
        q.put(b"z" * 100)
        struct.pack_into(fmt, m, ring + ((tail + offset) % 4096), value)

    for offset, fmt, value in [(0, "<I", 0), (0, "<I", 8), (0, "<I", 36), (0, "<I", 4096), (0, "<I", 0xFFFFFFF8),
                               (4, "<B", 0), (4, "<B", 2), (4, "<B", 0xFF), (6, "<H", 1), (6, "<H", 0xFFFF),
                               (8, "<I", 200), (8, "<I", 0x3FFFFFF0), (8, "<I", 8)]:
        forge(offset, fmt, value)
        try:
            print("taken", q.get(timeout=0))
        except zctipc.CorruptHeader:
            print("CorruptHeader")
        except queue.Empty:
            print("Empty")
        try:
            q.get(timeout=0)
            print("more")
        except queue.Empty:
            pass
        q.put(("after", offset, value)); assert q.get(timeout=0) == ("after", offset, value)
    m.close(); f.close()
    q.close()
"""


def test_forged_records_raise_corrupt_header_and_later_messages_flow(isolated, tmp_path):
    """A record another process forged in the ring (its size, type,
    descriptor count or payload length) is refused as CorruptHeader by a
    get, which takes the fast way for plain records only; the message put
    after it is taken whole."""
    lines = succeeded(run(tmp_path, isolated, FORGE))
    assert lines == ["CorruptHeader"] * 13
