"""Attacks on the hand-off of pool memory that runs without entering Go
(go/capi/handoff.c): a put of a zctipc.empty array (put_array_here) and a
take of a record of slot descriptors (zct_fast_adopt, whose views hold
light refs, released by zct_ref_release in C). Real processes are killed
with SIGKILL at random instants of loops of hand-offs, or stopped with
SIGSTOP first; a shared-memory directory runs full under the put; four
takers share one queue; a record is replayed in the ring; a process forks
after taking. Each scenario runs in a segment directory and a cleanup
daemon of its own (the ``isolated`` fixture), so what it leaves is counted
exactly.

Note [what a kill may leak]: a count changes hands in steps that no
ledger entry covers: a record taken off the ring before its tickets are
won, tickets won before the counts are written in the taker's ledger, and
on the way out the ledger's entry dropped just before the ticket is armed
and the record put (package ledger, Note [never give up what was not
taken]). A process killed inside one of them leaks the counts of that one
record (never gives one up twice); the slot stays in use until its pool's
owner exits. So the scenarios assert that a killed process's counts come
back but for at most one record's descriptors per kill (a taker that lost
every count it holds would leak at least eight: it holds eight views or
more when it is killed), that no count is given up twice (every view a
survivor holds keeps its bytes, and a pool's count of slots in use never
falls below the views held), and that nothing is left in the directory
once the processes are gone.
"""

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import left_in

RUN = 150  # seconds a scenario may take: the machine may be loaded


def run(tmp_path, env, program, *args):
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(COMMON) + textwrap.dedent(program))
    out = subprocess.run(
        [sys.executable, str(path), *map(str, args)], env=env, capture_output=True, text=True, timeout=RUN
    )
    assert out.returncode == 0, f"rc {out.returncode}: {out.stdout}{out.stderr}"
    for bad in ("Traceback", "Fatal Python error", "Exception ignored"):
        assert bad not in out.stderr, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


# Helpers every scenario program starts with.
COMMON = """
    import gc, json, os, queue as pyqueue, random, signal, sys, threading, time
    import numpy as np
    import zctipc
    from zctipc import observe

    N = 4096  # int64 elements: 32 KiB, a pool slot, never inline

    def pool_in_use(owner):
        # Slots of owner's pool in use, and its tickets in flight, as the
        # arenas' own words say (observing takes nothing).
        for p in observe.sample()["pools"]:
            if p["owner"] == owner:
                return p["slots_in_use"], p["tickets_in_flight"]
        return 0, 0

    def ledger_of(pid):
        return any(s.kind == "ledger" and s.creator_pid == pid for s in zctipc.list_segments())

    def swept(pid, timeout=15):
        # The daemon swept the ledger of pid, a process that was killed.
        deadline = time.monotonic() + timeout
        while ledger_of(pid):
            assert time.monotonic() < deadline, f"the ledger of {pid} was never swept"
            time.sleep(0.02)

    def arrays(m):
        if isinstance(m, tuple):
            return list(m)
        if isinstance(m, dict):
            return list(m.values())
        return [m]

    def message(k, shape):
        # One array (a tensor record), a tuple of three or a dict of two
        # (pickles whose views the C take adopts together).
        made = []
        for _ in range(shape):
            a = zctipc.empty((N,), "int64")
            a[:] = k
            made.append(a)
        if shape == 1:
            return made[0], made
        if shape == 2:
            return {"x": made[0], "y": made[1]}, made
        return tuple(made), made

    def intact(held):
        return all(int(a[0]) == k and int(a[-1]) == k and int(a[N // 2]) == k for a, k in held)
"""


# The pool's owner puts; each round a consumer takes in a loop, holding 8
# to 24 views (and checking every one of them after each take), until it
# is killed: after a random delay, or stopped first (SIGSTOP) while the
# owner goes on allocating and putting, then continued and killed, or
# killed while stopped.
CONSUMERS_KILLED = """
    def consume(q, ready, seed):
        rnd = random.Random(seed)
        held = []
        told = False
        while True:
            m = q.get()
            held.extend((a, int(a[0])) for a in arrays(m))
            del m
            if not intact(held):
                os._exit(3)  # a view's slot was given to someone else
            while len(held) > rnd.randrange(8, 25):
                held.pop(rnd.randrange(len(held)))
            if not told and len(held) >= 8:
                ready.put(os.getpid())
                told = True

    if __name__ == "__main__":
        rounds, seed = int(sys.argv[1]), int(sys.argv[2])
        rnd = random.Random(seed)
        ctx = zctipc.get_context("spawn")
        q, ready = zctipc.Queue(maxsize=8), zctipc.Queue()
        stop, bad, puts = threading.Event(), [], [0]

        def produce():
            mine, k = [], 0
            while not stop.is_set():
                k += 1
                m, made = message(k, rnd.choice([1, 1, 1, 2, 3]))
                try:
                    q.put(m, timeout=0.02)
                    puts[0] += 1
                except pyqueue.Full:
                    continue
                mine = (mine + [(a, k) for a in made])[-32:]
                if not intact(mine):
                    bad.append(k)

        t = threading.Thread(target=produce)
        t.start()
        codes = []
        for r in range(rounds):
            p = ctx.Process(target=consume, args=(q, ready, seed * 1000 + r))
            p.start()
            assert ready.get(timeout=60) == p.pid
            how = r % 3
            if how == 0:
                time.sleep(rnd.uniform(0, 0.02))
            else:
                time.sleep(rnd.uniform(0, 0.005))
                os.kill(p.pid, signal.SIGSTOP)
                time.sleep(0.05)  # the owner allocates and puts meanwhile: held slots are not reused
                if how == 1:
                    os.kill(p.pid, signal.SIGCONT)
                    time.sleep(rnd.uniform(0, 0.01))
            os.kill(p.pid, signal.SIGKILL)
            p.join()
            codes.append(p.exitcode)
            swept(p.pid)
        stop.set()
        t.join()
        left = 0
        while True:
            try:
                m = q.get(timeout=0.2)
            except pyqueue.Empty:
                break
            left += 1
            assert all(int(a[0]) == int(a[-1]) for a in arrays(m))
            del m
        del t
        gc.collect()
        in_use, tickets = pool_in_use(os.getpid())
        print(json.dumps({"codes": codes, "puts": puts[0], "bad": bad, "in_use": in_use, "tickets": tickets}))
        q.close(); ready.close()
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_consumers_killed_mid_take_give_their_counts_back(isolated, tmp_path, seed):
    """Consumers SIGKILLed at random instants of a loop of C takes (some
    stopped first while the pool's owner allocates and puts): none ever
    sees a view change, the owner's own arrays keep their bytes, the
    daemon gives back what each held but at most one record's counts per
    kill (Note [what a kill may leak]), and nothing is left."""
    rounds = 9
    r = run(tmp_path, isolated, CONSUMERS_KILLED, rounds, seed)
    assert r["codes"] == [-9] * rounds, "a consumer saw a view it held change"
    assert r["bad"] == [], "the owner saw an array it held change"
    assert r["puts"] > rounds * 8
    assert r["in_use"] <= 3 * rounds, r
    assert r["tickets"] <= r["in_use"], r
    assert left_in(isolated) == []


# Each round a producer (its pool its own) puts in a loop; the parent
# takes, holding every view and checking them all after each take, and
# kills the producer at a random instant (or stops it first). Once the
# daemon swept the producer, the parent drains what is left of it and
# checks that the dead pool counts every view the parent holds (none
# given up twice) and at most one record more (Note [what a kill may
# leak]); after letting go, at most that record's.
PRODUCERS_KILLED = """
    def produce(q, seed):
        rnd = random.Random(seed)
        k = 0
        while True:
            k += 1
            m, made = message(k, rnd.choice([1, 1, 2, 3]))
            q.put(m)
            del m, made

    if __name__ == "__main__":
        rounds, seed = int(sys.argv[1]), int(sys.argv[2])
        rnd = random.Random(seed)
        ctx = zctipc.get_context("spawn")
        report = []
        for r in range(rounds):
            q = zctipc.Queue(maxsize=4)
            p = ctx.Process(target=produce, args=(q, seed * 1000 + r))
            p.start()
            held = []
            for _ in range(rnd.randrange(2, 30)):
                held.extend((a, int(a[0])) for a in arrays(q.get(timeout=60)))
            if r % 2:
                os.kill(p.pid, signal.SIGSTOP)
            else:
                time.sleep(rnd.uniform(0, 0.003))  # the producer is mid-put, or waits for room
            os.kill(p.pid, signal.SIGKILL)
            p.join()
            swept(p.pid)
            while True:
                try:
                    held.extend((a, int(a[0])) for a in arrays(q.get(timeout=0.2)))
                except pyqueue.Empty:
                    break
            gc.collect()
            holding, _ = pool_in_use(p.pid)
            ok = intact(held)
            n = len(held)
            del held
            gc.collect()
            after, tickets = pool_in_use(p.pid)
            report.append([p.exitcode, ok, n, holding, after, tickets])
            q.close()
        print(json.dumps(report))
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_producers_killed_mid_put_lose_nothing_a_consumer_holds(isolated, tmp_path, seed):
    """Producers SIGKILLed at random instants of a loop of C puts (or
    stopped first): every view the consumer took keeps its bytes after the
    daemon swept the producer, the dead pool still counts each of them,
    and once the consumer lets go at most one record's counts stay (Note
    [what a kill may leak]); nothing is left at the end."""
    report = run(tmp_path, isolated, PRODUCERS_KILLED, 8, seed)
    for code, ok, n, holding, after, tickets in report:
        assert code == -9
        assert ok, "a view lost its bytes when the producer was swept"
        assert n <= holding <= n + 3, report
        # A ticket handed out for a put and not yet armed is in no ledger: it may stay, its slot count not.
        assert after <= 3 and tickets <= 3, report
    assert left_in(isolated) == []


# The pool's owner puts into q1; a forwarder takes each array (a C take)
# and puts it on into q2, which holds one message and nobody reads: its
# second put waits for room. It is killed while it waits. Once the daemon
# swept it, the owner drains q2 and lets go of everything: its pool has no
# slot in use.
FORWARDER_KILLED = """
    def forward(q1, q2, ready, waits):
        from zctipc._core import native
        from zctipc._wire import exports

        for i in range(2):
            a = q1.get()
            ready.put(i)
            if not waits:
                q2.put(a)  # the second waits for room (Python's wait, then a put of one try)
                continue
            # The C ABI's put, asked to wait: its first try (in C) finds no
            # room, and Go's put waits for room.
            code, flags, address = exports.contiguous_view(a)
            status = native.lib().zct_queue_put_array(
                q2._handle, native.lib().ZCT_RECORD_TENSOR, address, a.nbytes, code, a.ndim, a.shape, a.strides,
                flags, 600_000,
            )
            assert status == 0, status

    if __name__ == "__main__":
        ctx = zctipc.get_context("spawn")
        q1, q2, ready = zctipc.Queue(), zctipc.Queue(maxsize=1), zctipc.Queue()
        for k in (1, 2):
            m, made = message(k, 1)
            q1.put(m)
            del m, made
        p = ctx.Process(target=forward, args=(q1, q2, ready, sys.argv[1] == "abi"))
        p.start()
        assert [ready.get(timeout=60), ready.get(timeout=60)] == [0, 1]
        deadline = time.monotonic() + 30
        while pool_in_use(p.pid)[1] < 2:  # its tickets (of its own arena): the second put's is armed, and waits
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        swept(p.pid)
        m = q2.get(timeout=5)
        got = int(m[0])
        del m
        gc.collect()
        print(json.dumps({"got": got, "in_use": pool_in_use(os.getpid())}))
        q1.close(); q2.close(); ready.close()
"""


@pytest.mark.parametrize("put", ["python", "abi"])
def test_a_forwarder_killed_while_its_put_waits_gives_its_count_back(isolated, tmp_path, put):
    """A process that received a view of another's pool and puts it on
    into a full queue is SIGKILLed while the put waits for room (Python's
    put, which waits outside the put and tries in one go; or the C ABI's
    zct_queue_put_array with a timeout, whose wait is Go's): the count it
    was sending is in no message, so the daemon gives it back, and the
    owner's pool ends with no slot in use."""
    r = run(tmp_path, isolated, FORWARDER_KILLED, put)
    assert r["got"] == 1
    assert r["in_use"] == [0, 0], "the count the killed forwarder was sending is lost"
    assert left_in(isolated) == []


# Four takers share one queue of hand-offs (singles, tuples, dicts); each
# keeps every view it took until the owner is done, and reports the keys
# it saw and whether its views kept their bytes. Then a record (a tuple of
# three descriptors) is replayed: its bytes, copied from the ring before a
# taker took it, are written over a record of the same size put after it.
TAKERS = """
    import mmap, struct

    def take(q, out, go):
        held, seen = [], []
        while True:
            m = q.get()
            if isinstance(m, str):
                break
            for a in arrays(m):
                held.append((a, int(a[0])))
                seen.append(int(a[0]))
            del m
        out.put((os.getpid(), seen, intact(held)))
        go.get()  # held until the owner has seen every report

    if __name__ == "__main__":
        ctx = zctipc.get_context("spawn")
        q, out, go = zctipc.Queue(maxsize=16), zctipc.Queue(), zctipc.Queue()
        ps = [ctx.Process(target=take, args=(q, out, go)) for _ in range(4)]
        for p in ps:
            p.start()
        sent = []
        for k in range(1, 401):
            m, made = message(k, 1 + k % 3)
            q.put(m)
            sent.extend([k] * len(made))
            del m, made
        for p in ps:
            q.put("done")
        reports = [out.get(timeout=60) for p in ps]
        seen = sorted(k for _, s, _ in reports for k in s)
        ok = all(r[2] for r in reports)
        for p in ps:
            go.put("go")
        for p in ps:
            p.join()
        gc.collect()
        after_takers = pool_in_use(os.getpid())

        # The replay, in a queue of its own.
        r = zctipc.Queue(max_bytes=1 << 16)
        f = open(os.path.join(os.environ["ZCTIPC_SHM_DIR"], r.name), "r+b")
        ring = mmap.mmap(f.fileno(), 0)
        data = struct.unpack_from("<Q", ring, 16)[0]
        at = data + 512

        def tail():
            return struct.unpack_from("<Q", ring, data + 96)[0] & 0xFFFFFFFF

        m, made = message(7, 3)
        t0 = tail()
        r.put(m)
        size = struct.unpack_from("<I", ring, at + t0)[0]
        raw = bytes(ring[at + t0 : at + t0 + size])
        del m, made
        first = r.get(timeout=5)  # adopted in C: the counts are this process's now
        from zctipc._core import native
        lib = native.lib()
        t1 = tail()
        filler = b"z" * (size - 16)
        assert lib.zct_queue_put(r._handle, lib.ZCT_RECORD_BYTES, filler, len(filler), lib.NULL_VIEWS, 0, 0) == 0
        assert struct.unpack_from("<I", ring, at + t1)[0] == size
        ring[at + t1 : at + t1 + size] = raw
        try:
            r.get(timeout=5)
            replay = "taken"
        except zctipc.DescriptorTaken:
            replay = "DescriptorTaken"
        r.put("after")
        after = r.get(timeout=5)
        holding = pool_in_use(os.getpid())
        ok_first = all((a == 7).all() for a in first)
        del first
        gc.collect()
        ring.close(); f.close()
        print(json.dumps({"sent": sent, "seen": seen, "ok": ok, "after_takers": after_takers, "replay": replay,
                          "after": after, "holding": holding, "ok_first": ok_first,
                          "end": pool_in_use(os.getpid())}))
        q.close(); out.close(); go.close(); r.close()
"""


def test_four_takers_and_a_replayed_record(isolated, tmp_path):
    """Four processes take from one queue of hand-offs: every array is
    taken exactly once, every view keeps its bytes while held, and every
    count comes back. A record of three descriptors written again into the
    ring after it was taken is refused (DescriptorTaken): the first taker's
    views keep their three counts, the next message flows, and the counts
    come back once it lets go."""
    r = run(tmp_path, isolated, TAKERS)
    assert r["seen"] == r["sent"], "an array was taken twice, or never"
    assert r["ok"], "a view held by a taker changed"
    assert r["after_takers"] == [0, 0]
    assert r["replay"] == "DescriptorTaken"
    assert r["after"] == "after"
    assert r["holding"] == [3, 0] and r["ok_first"]
    assert r["end"] == [0, 0]
    assert left_in(isolated) == []


# A process takes views (through the C take), then forks: the child lets
# go of them and exits, as a program that forked would. The parent's views
# keep their bytes and the owner's pool still counts each of them once.
FORK = """
    def produce(q, n):
        for k in range(1, n + 1):
            m, made = message(k, 1 + k % 3)
            q.put(m)
            del m, made

    if __name__ == "__main__":
        ctx = zctipc.get_context("spawn")
        q = zctipc.Queue()
        p = ctx.Process(target=produce, args=(q, 12))
        p.start()
        held = []
        for _ in range(12):
            held.extend((a, int(a[0])) for a in arrays(q.get(timeout=60)))
        p.join()  # its arrays are in flight or held here; it exited
        before = pool_in_use(p.pid)
        rfd, wfd = os.pipe()
        child = os.fork()
        if child == 0:
            said = "nothing"
            try:
                del held
                gc.collect()
                zctipc.pool_stats()
            except Exception as e:
                said = type(e).__name__
            os.write(wfd, said.encode())
            os._exit(0)
        os.close(wfd)
        said = os.read(rfd, 100).decode()
        os.waitpid(child, 0)
        time.sleep(0.2)
        mid, ok = pool_in_use(p.pid), intact(held)
        n = len(held)
        del held
        gc.collect()
        print(json.dumps({"child": said, "n": n, "before": before, "mid": mid, "ok": ok, "end": pool_in_use(p.pid)}))
        q.close()
"""


def test_a_fork_after_taking_leaves_the_parents_views_alone(isolated, tmp_path):
    """A child forked after its parent took views through the C take drops
    them and calls into the library: it is refused, and the parent's
    views keep their bytes and their counts (the child gave none up)."""
    r = run(tmp_path, isolated, FORK)
    assert r["child"] == "ForkedProcessError", r
    assert r["n"] == 24 and r["ok"]
    assert r["before"][0] == r["mid"][0] == 24, r
    assert r["end"] == [0, 0], r
    assert left_in(isolated) == []


# The segment directory is a small tmpfs. The queue and 64 arrays are
# made, then a file fills what is left: the first put of an array needs
# the process's first ticket arena, for which there is no room. Once the
# file goes, the puts go in, and every count comes back.
FULL = """
    if __name__ == "__main__":
        q = zctipc.Queue(max_bytes=1 << 16)
        held = []
        for k in range(64):
            a = zctipc.empty((N,), "int64", block=False)
            a[:] = k
            held.append((a, k))
        filler = os.path.join(os.environ["ZCTIPC_SHM_DIR"], "filler")
        fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
        size = 0
        for step in (1 << 20, 1 << 16, 1 << 12):
            while True:
                try:
                    os.posix_fallocate(fd, size, step)
                    size += step
                except OSError:
                    break
        refused = []
        for a, k in held[:8]:
            try:
                q.put(a, timeout=0)
                refused.append("put")
            except zctipc.OutOfSharedMemory as e:
                refused.append("OutOfSharedMemory" if "shm" in str(e) or "memory" in str(e) else str(e))
        in_use_full = pool_in_use(os.getpid())
        ok_full = intact(held)
        os.close(fd)
        os.unlink(filler)
        for a, k in held:
            q.put(a, timeout=5)
        got = []
        while True:
            try:
                m = q.get(timeout=0.2)
            except pyqueue.Empty:
                break
            got.append(int(m[0]) == int(m[-1]) and int(m[0]))
            del m
        ok = intact(held)
        del held, a
        gc.collect()
        print(json.dumps({"refused": refused, "in_use_full": in_use_full, "ok_full": ok_full, "got": got,
                          "ok": ok, "end": pool_in_use(os.getpid())}))
        q.close()
"""


def test_a_put_on_a_full_directory_raises_and_recovers(isolated, tmp_path):
    """The C put of an array needs a ticket; on a full shared-memory
    directory there is no room for the first ticket arena: each put raises
    OutOfSharedMemory, the arrays keep their bytes and their one count
    each, and once room comes back every put goes in and every array is
    taken whole, with every count back at the end."""
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        env = dict(isolated, ZCTIPC_SHM_DIR=str(mount))
        r = run(tmp_path, env, FULL)
        assert r["refused"] == ["OutOfSharedMemory"] * 8, r
        assert r["in_use_full"] == [64, 0] and r["ok_full"], r
        assert r["got"] == list(range(64)) and r["ok"], r
        assert r["end"] == [0, 0], r
        assert left_in(env) == []
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


# One pool buffer is put thousands of times before any is taken: each put
# takes a ticket, more than the process's first ticket arena holds, so the
# puts go on in the arenas made after it, and come back to the first once
# the takes freed its tickets (Note [the ticket arena tried first] in
# go/capi/handoff.c). Every round, every message is taken whole.
TICKETS = """
    if __name__ == "__main__":
        q = zctipc.Queue()
        a = zctipc.empty((N,), "int64")
        a[:] = 7
        seen = []
        for sends in (5000, 300, 5000):
            for _ in range(sends):
                q.put(a)
            full = pool_in_use(os.getpid())
            got = 0
            for _ in range(sends):
                m = q.get(timeout=10)
                got += int(m[0]) == 7 and int(m[-1]) == 7
                del m
            seen.append([sends, full, got, pool_in_use(os.getpid())])
        del a
        gc.collect()
        print(json.dumps({"seen": seen, "end": pool_in_use(os.getpid())}))
        q.close()
"""


def test_sends_past_a_ticket_arena_take_tickets_from_the_next_and_back(isolated, tmp_path):
    """The C put of an array takes its ticket from the arena that gave the
    last one, and from the others when that one has none: thousands of
    tickets in flight at once, in rounds, each message taken whole, every
    ticket and count back at the end, and the process exits with nothing
    left (an arena held and never let go would hang its removal)."""
    r = run(tmp_path, isolated, TICKETS)
    assert r["seen"] == [[n, [1, n], n, [1, 0]] for n in (5000, 300, 5000)], r
    assert r["end"] == [0, 0], r
    assert left_in(isolated) == []
