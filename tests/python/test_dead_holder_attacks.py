"""Attacks on a queue's waiters behind a lock whose holder dies (Note [a
lock holder that died wakes nobody] in zctipc._core.wait): every kind of
blocked call (get with and without a timeout, get_many, put and put_many,
SimpleQueue's, Reader.poll, the readiness descriptor, get_async, join)
goes through within about a second of the holder's death, whether the
holder is a zombie or reaped, recorded with another start time, or killed
before it recorded itself; a live (stopped) holder is not taken over;
real consumers and producers killed at random points lose nothing but
what they held and duplicate nothing; and an idle blocked get costs no
CPU. Each scenario runs in a child process with a directory of its own."""

import json

import pytest
from _procs import run_program as run
from _procs import succeeded

# A lock of the queue forged as held by a real process (a `sleep` child,
# recorded by pid and start time as a get or put stopped in the lock would
# be), calls that then block behind it in threads, and the holder's fate.
# It prints one JSON line: what each call returned, which are still
# blocked, when they went through after the fate, and the lock word.
FORGED = """
    import asyncio, json, mmap, os, queue, signal, struct, subprocess, sys, threading, time, zctipc
    from multiprocessing import connection

    spec = json.loads(sys.argv[1])
    which, fate, calls, kind = spec["lock"], spec["fate"], spec["calls"], spec["kind"]
    q = {
        "Queue": lambda: zctipc.Queue(),
        "bounded": lambda: zctipc.Queue(maxsize=1000),
        "Joinable": lambda: zctipc.JoinableQueue(),
        "Simple": lambda: zctipc.SimpleQueue(),
    }[kind]()
    if which == "get":  # messages wait, and no put comes
        for i in range(spec.get("messages", len(calls))):
            q.put(f"m{i}")
    if "wait" in calls or "fileno" in calls:
        q._reader.fileno()  # the readiness thread, started before the lock is forged
    f = open(os.path.join(os.environ["ZCTIPC_SHM_DIR"], q.name), "r+b")
    m = mmap.mmap(f.fileno(), 0)
    data = struct.unpack_from("<Q", m, 16)[0]
    LOCK, WAITERS = (data + 128, data + 260) if which == "get" else (data + 64, data + 324)
    holder = subprocess.Popen(["sleep", "300"])
    try:
        start = int(open(f"/proc/{holder.pid}/stat").read().rsplit(")", 1)[1].split()[19])
        pid, recorded = holder.pid, start
        if fate == "wrongstart":
            recorded = start + 7919  # its pid now names another process: the holder is gone
        elif fate == "unrecorded":
            pid = recorded = 0  # killed between its claim and its record
        struct.pack_into("<IIQ", m, LOCK, holder.pid | 1 << 31, pid, recorded)
        done, went, lock = {}, {}, threading.Lock()

        def call(i, what):
            try:
                if what == "get":
                    r = q.get(timeout=60)
                elif what == "get_forever":
                    r = q.get()
                elif what == "get_many":
                    r = q.get_many(1, timeout=60)
                elif what == "poll":
                    r = (q._reader.poll(60), q.get(timeout=60))
                elif what == "wait":
                    r = (len(connection.wait([q._reader], 60)), q.get(timeout=60))
                elif what == "get_async":
                    r = asyncio.run(asyncio.wait_for(q.get_async(), 60))
                elif what == "simple_get":
                    r = q.get()
                elif what == "simple_put":
                    r = q.put(f"p{i}")
                elif what == "put":
                    r = q.put(f"p{i}", timeout=60)
                elif what == "put_forever":
                    r = q.put(f"p{i}")
                elif what == "put_many":
                    r = q.put_many([f"p{i}a", f"p{i}b"], timeout=60)
                elif what == "get_done":
                    r = q.get(timeout=60)
                    q.task_done()
                elif what == "join":
                    r = q.join()
            except Exception as e:
                r = type(e).__name__
            with lock:
                done[i] = r
                went[i] = time.monotonic()

        threads = [threading.Thread(target=call, args=(i, w), daemon=True) for i, w in enumerate(calls)]
        for t in threads:
            t.start()
        sleepers = spec.get("sleepers", len(calls))
        until = time.monotonic() + 20
        asleep = lambda: struct.unpack_from("<I", m, WAITERS)[0]  # noqa: E731
        while asleep() < sleepers and len(done) < len(calls) and time.monotonic() < until:
            time.sleep(0.01)
        time.sleep(0.3)
        early = sorted(done)  # nothing goes through while the lock is held
        if fate == "stopped":
            # Alive, if stopped: never taken over. Then it is killed.
            holder.send_signal(signal.SIGSTOP)
            time.sleep(2.5)
            early += ["still held"] if struct.unpack_from("<I", m, LOCK)[0] & ~(1 << 31) == holder.pid else []
            early += sorted(done)
        if fate != "wrongstart":
            holder.kill()  # a zombie until waited for
        if fate in ("reaped", "stopped"):
            holder.wait()
        died = time.monotonic()
        for t in threads:
            t.join(max(0.0, died + 15 - time.monotonic()))
        late = [i for i in range(len(calls)) if i not in went or went[i] - died > 15]
        rest = []
        if which == "put":
            while not q.empty():
                rest.append(q.get())
        print(json.dumps({
            "early": early,
            "done": [done.get(i, "blocked") for i in range(len(calls))],
            "late": late,
            "rest": sorted(map(str, rest)),
            "lock": struct.unpack_from("<I", m, LOCK)[0],
        }))
    finally:
        holder.kill()
        holder.wait()
    m.close()
    f.close()
    os._exit(0)  # threads still blocked (a failure, reported above) must not hold the exit
"""


def forged(tmp_path, env, lock, fate, calls, kind="Queue", **extra):
    spec = dict(lock=lock, fate=fate, calls=calls, kind=kind, **extra)
    (line,) = succeeded(run(tmp_path, env, FORGED, json.dumps(spec)))
    return json.loads(line)


GETS = ["get", "get_forever", "get_many", "poll", "wait", "get_async"]


@pytest.mark.slow
@pytest.mark.parametrize("fate", ["zombie", "reaped", "wrongstart"])
def test_every_kind_of_get_goes_through_when_the_get_lock_holder_dies(isolated, tmp_path, fate):
    """Messages wait, no put comes, and the get lock is held by a process
    that then dies (or whose pid names another process already): every
    get-like call asleep behind it goes through, each taking one message,
    and the lock is let go. (wait and get_async are not asleep on the data
    word: the descriptor is readable, and they take after it.)"""
    r = forged(tmp_path, isolated, "get", fate, GETS, sleepers=4)
    assert fate == "wrongstart" or r["early"] == [], r  # a holder of another start time is gone at once
    assert r["late"] == [], r
    taken = []
    for got in r["done"]:
        taken += got if isinstance(got, list) else [got]
    taken = [x for x in taken if x not in (True, 1)]
    assert sorted(taken) == sorted(f"m{i}" for i in range(len(GETS))), r
    assert r["lock"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("fate", ["zombie", "reaped", "wrongstart"])
@pytest.mark.parametrize("kind", ["Queue", "bounded"])
def test_every_kind_of_put_goes_through_when_the_put_lock_holder_dies(isolated, tmp_path, fate, kind):
    """The put lock is held by a process that then dies, and no get
    comes: every put asleep behind it goes through, exactly once each."""
    calls = ["put", "put_forever", "put_many", "put", "put_many"]
    r = forged(tmp_path, isolated, "put", fate, calls, kind=kind)
    assert fate == "wrongstart" or r["early"] == [], r
    assert r["late"] == [], r
    assert r["done"] == [None] * len(calls)
    assert r["rest"] == sorted(["p0", "p1", "p2a", "p2b", "p3", "p4a", "p4b"])
    assert r["lock"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("lock", ["get", "put"])
def test_simple_queue_calls_go_through_when_the_holder_dies(isolated, tmp_path, lock):
    """SimpleQueue's get and put (no timeout: they would wait for ever)."""
    calls = ["simple_get"] * 3 if lock == "get" else ["simple_put"] * 3
    r = forged(tmp_path, isolated, lock, "zombie", calls, kind="Simple")
    assert r["early"] == [] and r["late"] == [], r
    if lock == "get":
        assert sorted(r["done"]) == ["m0", "m1", "m2"]
    else:
        assert r["done"] == [None] * 3 and r["rest"] == ["p0", "p1", "p2"]
    assert r["lock"] == 0


@pytest.mark.slow
def test_join_goes_through_when_the_get_lock_holder_dies(isolated, tmp_path):
    """join waits on consumers that wait behind a dead holder's get lock:
    they take over, mark their messages done, and join returns."""
    r = forged(
        tmp_path, isolated, "get", "reaped", ["get_done", "get_done", "join"], kind="Joinable", sleepers=2, messages=2
    )
    assert r["early"] == [] and r["late"] == [], r
    assert sorted(map(str, r["done"])) == ["None", "m0", "m1"]


@pytest.mark.slow
@pytest.mark.parametrize("lock", ["get", "put"])
def test_ten_sleepers_behind_one_dead_holder_all_go_through(isolated, tmp_path, lock):
    calls = ["get"] * 10 if lock == "get" else ["put"] * 10
    r = forged(tmp_path, isolated, lock, "zombie", calls)
    assert r["early"] == [] and r["late"] == [], r
    if lock == "get":
        assert sorted(r["done"]) == sorted(f"m{i}" for i in range(10))
    else:
        assert r["rest"] == sorted(f"p{i}" for i in range(10))
    assert r["lock"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("lock", ["get", "put"])
def test_a_stopped_holder_is_not_taken_over_until_it_is_killed(isolated, tmp_path, lock):
    """A stopped holder is alive: nobody takes its lock for seconds (the
    calls keep waiting, the lock names it); killed, the calls go through."""
    calls = ["get", "get_many"] if lock == "get" else ["put", "put_many"]
    r = forged(tmp_path, isolated, lock, "stopped", calls)
    assert r["early"] == ["still held"], r
    assert r["late"] == [], r
    assert r["lock"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("lock", ["get", "put"])
def test_a_holder_killed_before_it_recorded_itself_is_taken_over_as_a_zombie(isolated, tmp_path, lock):
    """A holder killed between its claim of the lock word and its record
    (pid and start time) is a zombie until its parent waits for it, and a
    parent that is itself blocked behind the lock never does. A zombie is
    gone whoever it is (the claimant, or a process that took its pid after
    it died), so the lock is taken over without the record."""
    calls = ["get", "get_forever"] if lock == "get" else ["put", "put_forever"]
    r = forged(tmp_path, isolated, lock, "unrecorded", calls)
    assert r["early"] == [] and r["late"] == [], r
    assert r["lock"] == 0


# Real consumers and producers killed at random points of their loops
# (SIGKILL, or SIGSTOP and SIGKILL later), while others go on. Every
# message a survivor takes is one no one else took; what is missing is at
# most what the killed consumers held; the survivors never hang.
CHAOS = """
    import os, queue, random, signal, subprocess, sys, textwrap, threading, time, zctipc

    seed, rounds = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    PER = 60
    # Each child attaches to the queue, says it is ready, and loops; what a
    # consumer takes it writes at once to the pipe (a killed one may take
    # a message and die before it writes it: that one is missing).
    CHILD = '''
        import os, queue, sys, zctipc
        role, name, out, n, base = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        q = zctipc.Queue.attach(name)
        os.write(out, b"r\\\\n")
        i = 0
        while n < 0 or i < n:
            if role == "put":
                q.put(base + i, timeout=60)
            else:
                try:
                    v = q.get(timeout=60)
                except queue.Empty:
                    break
                if v == 10**9:
                    break  # the end, put after every producer stopped
                os.write(out, b"%d\\\\n" % v)
            i += 1
    '''

    q = zctipc.Queue(maxsize=8)
    r, w = os.pipe()
    kills, got, procs = 0, [], []

    def child(role, n, base):
        argv = [sys.executable, "-c", textwrap.dedent(CHILD), role, q.name, str(w), str(n), str(base)]
        p = subprocess.Popen(argv, pass_fds=(w,))
        procs.append(p)
        return p

    # A thread reads what the children write (a full pipe would stop them).
    got_lock, ready = threading.Lock(), [0]

    def reader():
        pending = b""
        while chunk := os.read(r, 65536):
            *lines, pending = (pending + chunk).split(b"\\n")
            with got_lock:
                for x in lines:
                    if x == b"r":
                        ready[0] += 1
                    else:
                        got.append(int(x))

    reading = threading.Thread(target=reader, daemon=True)
    reading.start()

    def wait_ready(count):
        until = time.monotonic() + 60
        while ready[0] < count and time.monotonic() < until:
            time.sleep(0.01)

    try:
        for k in range(rounds):
            base = k * 1000
            # The victims: a consumer and a producer that loop for ever (its values negative).
            victims = [child("get", -1, 0), child("put", -1, -(10**6) * (k + 1))]
            good = [child("put", PER, base), child("put", PER, base + PER), child("get", -1, 0)]
            wait_ready(5 * (k + 1))
            for v in victims:
                time.sleep(rng.uniform(0, 0.03))
                if rng.random() < 0.5:
                    v.kill()
                else:
                    v.send_signal(signal.SIGSTOP)
                    time.sleep(rng.uniform(0, 0.02))
                    v.kill()
                kills += 1
                if rng.random() < 0.5:
                    v.wait()  # reaped; else a zombie for the round
            stuck = []
            for p in good:
                if p is good[-1]:
                    try:
                        q.put(10**9, timeout=30)  # after every message: the consumer stops there
                    except queue.Full:
                        stuck.append("the end")
                try:
                    if p.wait(30) != 0:
                        stuck.append(p.args[3])
                except subprocess.TimeoutExpired:
                    stuck.append(p.args[3])
            for v in victims:
                v.wait()
            # What the victim producer left, so that the next round starts empty.
            while True:
                try:
                    got.append(q.get(timeout=1.5))
                except queue.Empty:
                    break
            if stuck:
                print("round", k, "stuck", stuck)
                break
        os.close(w)  # every child exited: the reader reads to the end
        reading.join(60)
        mine = [v for v in got if v >= 0]
        theirs = [v for v in got if v < 0]
        expected = {k * 1000 + i for k in range(rounds) for i in range(2 * PER)}
        missing = expected - set(mine)
        print("dups", len(mine) - len(set(mine)), len(theirs) - len(set(theirs)))
        print("extra", sorted(set(mine) - expected))
        print("missing-within-kills", len(missing) <= kills)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    q.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_consumers_and_producers_killed_in_their_calls_wedge_nothing(isolated, tmp_path, seed):
    lines = succeeded(run(tmp_path, isolated, CHAOS, str(seed), "4"))
    assert lines == ["dups 0 0", "extra []", "missing-within-kills True"]


# A get blocked for ever on an empty queue, while its CPU time is read.
IDLE = """
    import os, sys, threading, time, zctipc
    q = zctipc.Queue()
    t = threading.Thread(target=q.get, daemon=True)
    t.start()
    time.sleep(1.5)  # asleep outside the library by now

    def cpu():
        with open(f"/proc/{os.getpid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before = cpu()
    time.sleep(5)
    print(round(cpu() - before, 2) < 0.25, t.is_alive())
    os._exit(0)
"""


@pytest.mark.slow
def test_an_idle_blocked_get_costs_no_cpu_with_its_rechecks(isolated, tmp_path):
    """The recheck every second is one look in C: a get blocked for
    five seconds spends (far) less than a quarter second of CPU."""
    assert succeeded(run(tmp_path, isolated, IDLE)) == ["True True"]
