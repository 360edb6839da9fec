"""Attacks on a stream writer's steps in the data plane: the C ABI's
zct_stream_write_look and _increment claim and publish a frame without
entering Go, on the writer's state in C memory (the frame claimed, the next
position, the warm and cold free slots), and fall back to Go for a wait for
room, an eviction, an end or an error. Each attack here is on that
surface: slot table entries forged by another process, positions past
2**31 and 2**32, readers killed while the writer is full, a close from
another thread, a writer killed mid-frame and taken over, a file shrunk
under the writer; and a model, drawn by hypothesis, of what every reader
sees while the writer's steps run in C and the counts are read in Go."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import zctipc
from zctipc._core import native

hypothesis = pytest.importorskip("hypothesis", reason="make test installs hypothesis (constraints.txt)")
from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule  # noqa: E402

#: Longer than any test waits: a call that ends ended for its own reason.
LONG_MS = 60_000
#: Bounds every wait for a thread or a process.
JOIN_S = 60

CLAIM, PUBLISHED = 320 // 8, 328 // 8  # u64 words of the data region


def words(stream):
    """The stream's data region as u64 and u32 words."""
    ffi = native.ffi()
    return ffi.cast("uint64_t *", stream._memory), ffi.cast("uint32_t *", stream._memory)


def table_word(stream, pos):
    """The index (in u32 words) of the slot table's entry of frame pos."""
    return (576 + 64 * stream.max_readers) // 4 + pos % stream.frames


def position_word(stream, index):
    """The index (in u64 words) of reader slot index's position."""
    return (576 + 64 * index + 8) // 8


def slot_of(endpoint, view):
    """The slot whose memory view is."""
    return next(i for i, f in enumerate(endpoint._frames) if np.shares_memory(f, view))


def start(target, *args):
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def c_write_look(writer, ms):
    """zct_stream_write_look straight from the C ABI: its status and slot."""
    slot = native.ffi().new("int32_t *")
    return native.lib().zct_stream_write_look(writer._handle, ms, slot), slot[0]


def last_error():
    return native.ffi().string(native.lib().zct_last_error()).decode()


def filled(stream, frames, readers=None, start_at=0):
    """Write frames frames (each all its position), reading each with
    readers as it goes so that the ring never fills."""
    w = stream.writer()
    for i in range(frames):
        assert w.write(np.full(stream.shape, start_at + i, np.float32), timeout=JOIN_S)
        for r in readers or ():
            assert float(r.read(timeout=0)[0]) == start_at + i
    return w


# -- forged slot tables ----------------------------------------------------------


@pytest.mark.parametrize("forged", [4, 5, 1 << 31, 0xFFFFFFFF])
def test_a_slot_past_the_ring_is_corrupt_through_c_and_go_alike(forged):
    """The table says a frame a reader released lives past the ring: the
    claim refuses it (the C step's answer, said by Go), with the same
    message through the fast call, Python's look and a Go-only wait,
    naming the frame and the slot; nothing is claimed, and once the entry
    is right again the writer goes on."""
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    r = s.reader()
    w = filled(s, 4)
    assert r.read(timeout=0) is not None and r.read(timeout=0) is not None
    _, u32 = words(s)
    was = u32[table_word(s, 0)]
    u32[table_word(s, 0)] = forged
    want = f"frame 0 in slot {forged} of 4"
    status, _ = c_write_look(w, 0)
    assert status == native.lib().ZCT_E_CORRUPT
    fast = last_error()
    assert want in fast
    for call in (lambda: w.look(timeout=0), lambda: w.look(block=False), lambda: w.look(timeout=0.05)):
        with pytest.raises(zctipc.CorruptHeader) as e:
            call()
        assert str(e.value) == fast
    w.set_wait("poll")  # Go's own wait
    with pytest.raises(zctipc.CorruptHeader) as e:
        w.look(timeout=0.05)
    assert str(e.value) == fast
    assert s.published == 4 and words(s)[0][CLAIM] == 4, "nothing was claimed"
    u32[table_word(s, 0)] = was
    view = w.look(timeout=0)
    assert view is not None and slot_of(w, view) == was
    view[:] = 4
    w.increment()
    assert [float(r.read(timeout=0)[0]) for _ in range(3)] == [2.0, 3.0, 4.0]
    for e in (w, r, s):
        e.close()


def test_one_slot_twice_in_the_table_is_corrupt_not_two_frames_in_one_slot():
    """Another process writes the slot of frame 0 into the entry of frame 1
    before the writer takes both back: taking that slot back twice would
    hand it to two frames in flight at once (a reader of the first reads
    the second, as a whole frame), and leave slot 1 out for good. The
    writer refuses it, naming the frame and both slots, through C and Go
    alike; and goes on once the entry is right again."""
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    r = s.reader()
    w = filled(s, 4)
    assert [float(r.read(timeout=0)[0]) for _ in range(2)] == [0.0, 1.0]
    _, u32 = words(s)
    assert [u32[table_word(s, p)] for p in range(4)] == [0, 1, 2, 3]
    u32[table_word(s, 1)] = 0
    status, _ = c_write_look(w, 0)
    assert status == native.lib().ZCT_E_CORRUPT
    fast = last_error()
    assert "frame 1 in slot 0" in fast and "slot 1" in fast
    with pytest.raises(zctipc.CorruptHeader) as e:
        w.look(timeout=0)
    assert str(e.value) == fast
    u32[table_word(s, 1)] = 1
    for i in range(4, 40):
        view = w.look(timeout=0)
        assert view is not None
        view[:] = i
        w.increment()
        assert float(r.read(timeout=0)[0]) == i - 2, "every frame in a slot of its own"
    for e in (w, r, s):
        e.close()


def test_a_table_entry_moved_to_a_slot_in_flight_is_corrupt():
    """The entry of a released frame forged to the slot of a frame still in
    flight: taking that slot back would let the writer fill it under the
    reader that holds it."""
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    r = s.reader()
    w = filled(s, 4)
    held = r.look(timeout=0)
    assert float(held[0]) == 0
    assert r.increment()
    held = r.look(timeout=0)  # frame 1 looked at: frames 1 to 3 in flight
    _, u32 = words(s)
    u32[table_word(s, 0)] = 2
    with pytest.raises(zctipc.CorruptHeader, match="frame 0 in slot 2"):
        w.look(timeout=0)
    u32[table_word(s, 0)] = 0
    view = w.look(timeout=0)
    assert slot_of(w, view) == 0
    view[:] = 4
    w.increment()
    assert float(held[0]) == 1 and r.increment()
    assert [float(r.read(timeout=0)[0]) for _ in range(3)] == [2.0, 3.0, 4.0]
    for e in (w, r, s):
        e.close()


def test_a_writer_taking_over_a_table_with_one_slot_twice_refuses_it():
    """A new writer reads the slots of the frames in flight from the table:
    one slot twice there is corrupt, said at once, and the role is let go."""
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    r = s.reader()
    w = filled(s, 3)
    w.close()
    _, u32 = words(s)
    u32[table_word(s, 2)] = u32[table_word(s, 1)]
    with pytest.raises(zctipc.CorruptHeader, match="slot 1"):
        s.writer()
    u32[table_word(s, 2)] = 2
    w = s.writer()  # the role was let go
    assert [float(r.read(timeout=0)[0]) for _ in range(3)] == [0.0, 1.0, 2.0]
    for i in range(3, 12):
        assert w.write(np.full(4, i, np.float32), timeout=0)
        assert float(r.read(timeout=0)[0]) == i
    for e in (w, r, s):
        e.close()


# -- positions past 2**31 and 2**32 ------------------------------------------------


@pytest.mark.parametrize("base", [(1 << 31) - 3, (1 << 32) - 3, (1 << 33) + 1, (1 << 63) - 100])
@pytest.mark.parametrize("frames", [2, 3, 8])
def test_claims_and_publishes_across_2_to_the_31_and_32(base, frames):
    """A stream whose positions were forged near 2**31, 2**32 and beyond
    before its writer and readers came: every frame still goes to every
    reader once, in order, in a slot of its own, and the counts say so."""
    s = zctipc.Stream.create(shape=4, frames=frames, readers=2)
    u64, u32 = words(s)
    u64[CLAIM] = u64[PUBLISHED] = base
    readers = [s.reader(), s.reader()]
    assert [r.position for r in readers] == [base, base]
    w = s.writer()
    held = {}
    for i in range(3 * frames + 5):
        view = w.look(timeout=0)
        assert view is not None
        slot = slot_of(w, view)
        assert slot not in held.values(), "a slot of a frame in flight"
        held[base + i] = slot
        view[:] = i
        w.increment()
        assert u64[PUBLISHED] == u64[CLAIM] == base + i + 1
        assert u32[table_word(s, base + i)] == slot
        # The readers stay as far behind as the ring lets them: every slot
        # is in flight before the next claim.
        for r in readers:
            while r.position < base + i + 2 - frames:
                p = r.position
                assert float(r.read(timeout=0)[0]) == p - base
        held = {p: sl for p, sl in held.items() if p >= base + i + 2 - frames}
    assert s.published == base + 3 * frames + 5
    for r in readers:
        while r.read(timeout=0) is not None:
            pass
        assert r._counts() == (base + 3 * frames + 5, 3 * frames + 5, 0)
    assert s.dropped == 0
    for e in (w, *readers, s):
        e.close()


FAR_AHEAD = textwrap.dedent("""
    import sys, numpy as np, zctipc
    from zctipc._core import native
    n = int(sys.argv[1])
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    r = s.reader()
    u64 = native.ffi().cast("uint64_t *", s._memory)
    u64[320 // 8] = u64[328 // 8] = n  # claim, published
    w = s.writer()
    assert w.look(timeout=0) is None, "the reader holds the ring"
    for _ in range(4):  # it skips to the oldest frame a ring back
        r.read(timeout=0)
    assert r._counts() == (n, 4, n - 4), r._counts()
    for i in range(40):
        view = w.look(timeout=0)
        view[:] = i
        w.increment()
        assert float(r.read(timeout=0)[0]) == i
    assert r._counts() == (n + 40, 44, n - 4)
    for e in (w, r, s):
        e.close()
    print("ok")
""")


@pytest.mark.parametrize("published", [9, 100, (1 << 40) + 2])
def test_a_writer_far_ahead_of_a_reader_takes_over_at_once(isolated, published):
    """A reader that holds a position more than a ring behind the frames
    published (a forged word, or one caught joining): a new writer reads
    only the ring's frames in flight (it walked every position in between,
    a trillion here, and then took each ring's slots back again), waits for
    the reader, which skips what was lost, and goes on."""
    child = subprocess.run(
        [sys.executable, "-c", FAR_AHEAD, str(published)], env=isolated, capture_output=True, text=True, timeout=JOIN_S
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout == "ok\n"


# -- readers killed while the writer is full ---------------------------------------

#: How a child process waits to be killed: until its parent is gone, if
#: the test never kills it.
UNTIL_ORPHANED = "parent = os.getppid()\nwhile os.getppid() == parent:\n    time.sleep(0.05)\n"

READER = (
    textwrap.dedent("""
    import os, sys, time, zctipc
    r = zctipc.Stream.attach(sys.argv[1]).reader()
    print(r.index, flush=True)
    if sys.argv[2] == "hold":  # look at the first frame, and keep it
        assert r.look(timeout=60) is not None
        print("holding", flush=True)
""")
    + UNTIL_ORPHANED
)


@pytest.fixture
def children():
    """The child processes a test spawns (spawn()): each is killed and
    reaped afterwards, whatever the test did."""
    procs = []
    yield procs
    for p in procs:
        kill(p)


def spawn(children, code, *args):
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    children.append(p)
    return p


def reader_process(children, stream, how):
    """A reader in a process of its own, joined; how: "idle" (it never
    reads) or "hold" (it holds the first frame once one is published,
    which the caller then publishes and waits for with held())."""
    p = spawn(children, READER, stream.name, how)
    assert p.stdout.readline().strip().isdigit()
    return p


def held(p):
    assert p.stdout.readline() == "holding\n"


def kill(p, reap=True):
    """Kill p -9 and wait until it is dead: reaped, or with reap False a
    zombie (which holds no mapping, and which /proc still shows)."""
    if p.returncode is None:
        os.kill(p.pid, signal.SIGKILL)
    if reap:
        p.wait(JOIN_S)
        if p.stdout is not None:
            p.stdout.close()
        return
    deadline = time.monotonic() + JOIN_S
    while state(p.pid) != "Z":
        assert time.monotonic() < deadline, "the killed process never died"
        time.sleep(0.01)


def state(pid):
    """The state letter /proc gives process pid."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def full_with_a_reader_process(children, how, policy="block", readers=2):
    """A stream of 4 frames, full under block: a local reader that keeps up
    and a reader process (how as reader_process says) that holds the ring."""
    s = zctipc.Stream.create(shape=4, frames=4, readers=readers, policy=policy)
    mine = s.reader()
    p = reader_process(children, s, how)
    w = s.writer()
    for i in range(4):
        assert w.write(np.full(4, i, np.float32), block=False)
        if i == 0 and how == "hold":
            held(p)
        assert float(mine.read(timeout=0)[0]) == i
    return s, w, mine, p


def goes_on_from_4(s, w, mine):
    """mine reads frame 4, which the writer wrote once the ring had room;
    then the writer goes on (goes_on), and all three close."""
    assert float(mine.read(timeout=0)[0]) == 4
    goes_on(s, w, mine, 5)
    for e in (w, mine, s):
        e.close()


def goes_on(s, w, mine, first, n=20):
    """The writer writes n frames from first on without waiting for anyone
    but mine, which reads every one of them."""
    for i in range(first, first + n):
        assert w.write(np.full(4, i, np.float32), timeout=JOIN_S)
        assert float(mine.read(timeout=0)[0]) == i
    assert s.readers == 1


@pytest.mark.slow
@pytest.mark.parametrize("how", ["idle", "hold"])
@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
@pytest.mark.parametrize("look", ["block=False", "timeout=0"])
def test_a_look_that_does_not_wait_evicts_a_killed_reader(children, how, reap, look):
    """A full ring, the reader holding it killed -9 (reaped or not yet: a
    zombie holds no mapping): the claim runs in C, finds no room and goes to
    Go, which evicts the dead reader even though the look does not wait."""
    s, w, mine, p = full_with_a_reader_process(children, how)
    assert w.look(block=False) is None and w.look(timeout=0) is None, "a live reader holds the ring"
    assert s.readers == 2
    kill(p, reap)
    kwargs = {"block": False} if look == "block=False" else {"timeout": 0}
    view = w.look(**kwargs)
    assert view is not None, "the dead reader was evicted"
    view[:] = 4
    w.increment()
    goes_on_from_4(s, w, mine)


@pytest.mark.slow
def test_looks_that_do_not_wait_evict_a_reader_as_soon_as_it_is_dead(children):
    """Looks that do not wait, one after another from the moment SIGKILL is
    sent (the process may take a while to die): each one that finds the
    ring full looks at the reader again, and one evicts it."""
    s, w, mine, p = full_with_a_reader_process(children, "hold")
    os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + JOIN_S
    while (view := w.look(block=False)) is None:
        assert time.monotonic() < deadline, "the dead reader was never evicted"
    view[:] = 4
    w.increment()
    goes_on_from_4(s, w, mine)


#: A reader slot's start time (u64) within it: its process's, recorded
#: after its claim (docs/format.md, "Streams").
START_AT = 16


@pytest.mark.slow
def test_a_waiting_writer_evicts_a_reader_whose_pid_another_process_took():
    """A reader holds the ring, and its slot now names a live process that
    is not it (its recorded start time forged, as when its pid went to a new
    process): the data plane sees the pid alive and never suspects it
    (Note [a writer's look for the dead]), but a writer asleep for room
    still asks Go now and then, which tells by the start time, evicts it and
    writes."""
    s = zctipc.Stream.create(shape=4, frames=4, readers=2, policy="block")
    mine, stuck = s.reader(), s.reader()
    w = filled(s, 4, [mine])
    results = {}
    t = start(_write_into, w, results, "write", True, JOIN_S)
    t.join(0.3)
    assert t.is_alive(), "a live reader holds the ring"
    start_time = native.ffi().cast("uint64_t *", s._memory + 576 + 64 * stuck.index + START_AT)
    start_time[0] += 1  # while the writer sleeps: only a later look of Go's sees it
    t.join(JOIN_S)
    assert results["write"] is True, "the reader was never evicted"
    assert s.readers == 1
    assert float(mine.read(timeout=0)[0]) == 4
    for e in (w, mine, stuck, s):
        e.close()


def _write_into(w, results, key, *args):
    try:
        results[key] = w.write(np.full(4, 4, np.float32), *args)
    except Exception as e:  # noqa: BLE001
        results[key] = e


def _c_look_into(w, results, key):
    results[key] = c_write_look(w, LONG_MS)


@pytest.mark.slow
@pytest.mark.parametrize("wait", ["python sleep", "python poll", "c call"])
def test_a_writer_waiting_for_room_evicts_a_reader_killed_meanwhile(children, wait):
    """The writer already waits for room (asleep outside Go, polling in Go,
    or in a C call that waits in Go) when the reader holding the ring is
    killed: it evicts it and goes on, however it waits."""
    s, w, mine, p = full_with_a_reader_process(children, "hold")
    results = {}
    if wait == "c call":
        t = start(_c_look_into, w, results, "look")
    else:
        w.set_wait(wait.split()[1])
        t = start(_write_into, w, results, "look", True, JOIN_S)
    t.join(0.3)
    assert t.is_alive(), "the writer waits"
    kill(p)
    t.join(JOIN_S)
    assert not t.is_alive()
    if wait == "c call":
        status, slot = results["look"]
        assert status == 0
        w._frames[slot][:] = 4
        w.increment()
    else:
        assert results["look"] is True
    goes_on_from_4(s, w, mine)


@pytest.mark.slow
def test_overwrite_never_waits_for_a_slow_reader_nor_a_killed_one(children):
    """Under overwrite a reader process that holds a frame, alive and then
    killed, never holds the writer back; a slow local reader loses the
    frames a ring behind, counted, and reads the rest in order."""
    s, w, mine, p = full_with_a_reader_process(children, "hold", policy="overwrite", readers=3)
    slow = s.reader()
    for i in range(4, 14):
        assert w.write(np.full(4, i, np.float32), block=False)
        assert float(mine.read(timeout=0)[0]) == i
    kill(p)
    for i in range(14, 24):
        assert w.write(np.full(4, i, np.float32), block=False)
        assert float(mine.read(timeout=0)[0]) == i
    assert slow.position == 4
    assert [float(slow.read(timeout=0)[0]) for _ in range(4)] == [20.0, 21.0, 22.0, 23.0]
    assert slow._counts() == (24, 4, 16)
    assert slow.read(timeout=0) is None
    assert mine._counts() == (24, 24, 0)
    for e in (w, mine, slow, s):
        e.close()


# -- closes, and handles after them --------------------------------------------------


@pytest.mark.parametrize("wait", ["python sleep", "python poll", "c call"])
def test_a_close_from_another_thread_ends_a_look_waiting_for_room(wait):
    s = zctipc.Stream.create(shape=4, frames=2, readers=1)
    r = s.reader()
    w = filled(s, 2)
    results = {}
    if wait == "c call":
        t = start(_c_look_into, w, results, "look")
    else:
        w.set_wait(wait.split()[1])
        t = start(_write_into, w, results, "look", True, None)
    t.join(0.3)
    assert t.is_alive(), "the writer waits"
    w.close()
    t.join(JOIN_S)
    assert not t.is_alive()
    if wait == "c call":
        assert results["look"][0] == native.E_CLOSED
    else:
        assert isinstance(results["look"], zctipc.HandleClosed)
    assert s.published == 2 and words(s)[0][CLAIM] == 2, "nothing was claimed"
    w = s.writer()  # the role was let go
    assert w.look(timeout=0) is None
    assert r.read(timeout=0) is not None
    assert w.write(np.full(4, 2, np.float32), timeout=0)
    for e in (w, r, s):
        e.close()


def _hammer(w, counts, stop):
    """look and increment on w until it is closed: each increment publishes
    the frame some look claimed, or finds none (another thread published it
    first); counts gets how it ended and the increments that published."""
    lib, slot = native.lib(), native.ffi().new("int32_t *")
    increments = 0
    try:
        while not stop.is_set():
            w.look(timeout=JOIN_S)
            try:
                w.increment()
                increments += 1
            except zctipc.InvalidArgument:
                pass
            # The raw calls too, as another binding makes them.
            lib.zct_stream_write_look(w._handle, 0, slot)
            status = lib.zct_stream_write_increment(w._handle)
            if status == 0:
                increments += 1
            elif status != native.E_INVALID:
                native.check(status)
    except zctipc.HandleClosed:
        counts.append(("closed", increments))
    except Exception as e:  # noqa: BLE001
        counts.append((e, increments))


def _watch(s, r, w, seen, stop):
    """Read the counts in Go while the others call C: they only grow."""
    last = (0, 0)
    try:
        while not stop.is_set():
            published, position = s.published, r.position
            assert published >= last[0] and position >= last[1]
            assert w._stream is s
            last = (published, position)
        seen.append(last)
    except Exception as e:  # noqa: BLE001
        seen.append(e)


def _drain(r, got, stop):
    """Read every frame, each once, until stop and nothing is left."""
    try:
        while True:
            view = r.look(timeout=0.05)
            if view is None:
                if stop.is_set():
                    return
                continue
            got.append(r.position)
            assert r.increment()
    except Exception as e:  # noqa: BLE001
        got.append(e)


@pytest.mark.slow
@pytest.mark.parametrize("frames", [2, 8])
def test_threads_claim_publish_and_read_counts_while_one_closes_the_writer(frames):
    """Eight threads look and increment on one writer (through the Python
    methods and the raw C calls), one reads every frame, one reads the
    counts in Go, and the main thread closes the writer under them: every
    call before the close ran whole, every one after says closed, the
    frames published are those the increments made, read once each in
    order, and nothing but closed and no-frame errors is seen."""
    s = zctipc.Stream.create(shape=4, frames=frames, readers=1)
    r, w = s.reader(), s.writer()
    counts, seen, got = [], [], []
    stop, done = threading.Event(), threading.Event()
    hammers = [start(_hammer, w, counts, stop) for _ in range(8)]
    watcher = start(_watch, s, r, w, seen, done)
    drainer = start(_drain, r, got, done)
    deadline = time.monotonic() + JOIN_S
    while s.published < 2000 and time.monotonic() < deadline:
        time.sleep(0.01)
    w.close()
    for t in hammers:
        t.join(JOIN_S)
        assert not t.is_alive()
    done.set()
    for t in (watcher, drainer):
        t.join(JOIN_S)
        assert not t.is_alive()
    assert len(counts) == 8 and all(c[0] == "closed" for c in counts), counts
    assert not [e for e in seen if isinstance(e, Exception)], seen
    assert not [e for e in got if isinstance(e, Exception)], got
    published = s.published
    assert published >= 2000
    assert published == sum(c[1] for c in counts), "one frame per increment that said so"
    assert got == list(range(published)), "every frame read once, in order"
    assert r._counts() == (published, published, 0)
    with pytest.raises(zctipc.HandleClosed):
        w.look(timeout=0)
    r.close()
    s.close()


def test_a_stale_writer_handle_never_reaches_the_writer_after_it():
    """A closed writer's handle, its raw calls made again, while a new
    writer of the same stream holds the role (its state in C memory likely
    where the old one was): every call says closed, and the new writer's
    claim and position are untouched. Reader, stream and queue handles in
    the writer's calls, and forged ones, say closed too."""
    lib = native.lib()
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    r = s.reader()
    old = s.writer()
    assert old.write(np.zeros(4, np.float32))
    stale = old._handle
    old.close()
    with pytest.raises(zctipc.HandleClosed):
        old.look()
    with pytest.raises(zctipc.HandleClosed):
        old.increment()
    assert lib.zct_stream_writer_close(stale) == native.E_CLOSED
    w = s.writer()
    view = w.look(timeout=0)
    assert view is not None
    slot = slot_of(w, view)
    q = zctipc.Queue()
    for h in (stale, r._handle, s._handle, q._handle, 0, 2**64 - 1, stale + 1000):
        for _ in range(3):
            status, _ = c_write_look(type("W", (), {"_handle": h})(), 0)
            assert status == native.E_CLOSED, (h, status)
            assert lib.zct_stream_write_increment(h) == native.E_CLOSED
            uw, us = native.ffi().new("uint32_t **"), native.ffi().new("uint32_t *")
            assert lib.zct_stream_writer_arm(h, uw, us) == native.E_CLOSED
            assert lib.zct_stream_writer_disarm(h) == native.E_CLOSED
    assert s.published == 1 and words(s)[0][CLAIM] == 2, "the new writer's claim stands"
    assert slot_of(w, w.look(timeout=0)) == slot, "and is the same"
    w._frames[slot][:] = 1
    w.increment()
    assert [float(r.read(timeout=0)[0]) for _ in range(2)] == [0.0, 1.0]
    q.close()
    for e in (w, r, s):
        e.close()


def test_a_second_writer_while_the_first_lives_is_refused_and_takes_nothing():
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    w = s.writer()
    assert w.look(timeout=0) is not None
    with pytest.raises(zctipc.StreamBusy):
        s.writer()
    w.increment()
    assert s.published == 1
    w.close()
    s.close()


# -- a writer killed mid-frame, and the writer after it ------------------------------

WRITER = (
    textwrap.dedent("""
    import os, sys, time, numpy as np, zctipc
    s = zctipc.Stream.attach(sys.argv[1])
    w = s.writer()
    for i in range(int(sys.argv[2])):
        assert w.write(np.full(s.shape, i, np.float32), timeout=60)
    view = w.look(timeout=60)
    view[:] = 999  # claimed, filled, never published
    print("claimed", flush=True)
""")
    + UNTIL_ORPHANED
)


@pytest.mark.slow
@pytest.mark.parametrize("policy, unread", [("block", 0), ("block", 2), ("block", 3), ("overwrite", 3)])
def test_a_writer_taking_over_from_one_killed_mid_frame(children, policy, unread):
    """A writer process publishes frames, claims one more, fills it and is
    killed -9. The claim stands (a reader of that slot's old frame sees it
    overwritten), the frame is never published, and a new writer takes the
    role over: it keeps the slots of the frames still unread, and its
    first frame is published at the dead one's position, in its place.
    Every frame a reader reads is the one of its position."""
    s = zctipc.Stream.create(shape=4, frames=4, readers=2, policy=policy)
    r, lagging = s.reader(), s.reader()
    n = 5
    p = spawn(children, WRITER, s.name, str(n))
    # Under block the readers keep up until the last frames, which stay
    # unread; under overwrite they read nothing, and lose the frames more
    # than a ring behind the claim.
    for i in range(n - unread if policy == "block" else 0):
        assert float(r.read(timeout=JOIN_S)[0]) == i
        assert float(lagging.read(timeout=JOIN_S)[0]) == i
    assert p.stdout.readline() == "claimed\n"
    kill(p)
    u64, _ = words(s)
    assert (u64[PUBLISHED], u64[CLAIM]) == (n, n + 1)
    assert [float(r.read(timeout=0)[0]) for _ in range(unread)] == list(range(n - unread, n))
    assert r.read(timeout=0) is None, "the claimed frame was never published"
    w = s.writer()
    assert u64[CLAIM] == n + 1, "the dead writer's claim stands"

    def read_lagging():
        view = lagging.read(timeout=0)
        assert view is not None and float(view[0]) == lagging.position - 1, "the frame of its position"

    for i in range(n, n + 12):
        if policy == "block" and i - lagging.position == 4:
            read_lagging()  # under block the ring is full: the lagging reader holds it
        assert w.write(np.full(4, i, np.float32), block=False)
        assert float(r.read(timeout=0)[0]) == i
    while lagging.position < n + 12:
        read_lagging()
    lost = 0 if policy == "block" else n + 1 - 4  # a ring behind the dead writer's claim
    assert r._counts() == (n + 12, n + 12 - lost, lost)
    if policy == "block":
        assert lagging._counts() == (n + 12, n + 12, 0)
    else:
        assert lagging.dropped > 0
    for e in (w, r, lagging, s):
        e.close()


# -- a file shrunk under the writer ----------------------------------------------------

SHRUNK = textwrap.dedent("""
    import os, threading, time, numpy as np, zctipc
    from zctipc._core import native
    lib, ffi = native.lib(), native.ffi()

    def shrink(s):
        os.truncate(os.path.join(os.environ["ZCTIPC_SHM_DIR"], s.name), 0)

    def full():
        s = zctipc.Stream.create(shape=4, frames=2, readers=1)
        r, w = s.reader(), s.writer()
        for i in range(2):
            assert w.write(np.full(4, i, np.float32), block=False)
        return s, r, w

    def said(call):
        try:
            call()
        except zctipc.CorruptHeader:
            return "CorruptHeader"
        except Exception as e:
            return type(e).__name__
        return "nothing"

    out = {}
    # A look asleep outside Go, waiting for room; one in a C call, in Go.
    sleeping, polling = full(), full()
    slot = ffi.new("int32_t *")
    threads = [
        threading.Thread(target=lambda: out.setdefault("sleep", said(lambda: sleeping[2].look(timeout=None)))),
        threading.Thread(
            target=lambda: out.setdefault("c call", lib.zct_stream_write_look(polling[2]._handle, 60000, slot))
        ),
    ]
    for t in threads:
        t.start()
    time.sleep(0.3)  # both wait (or are about to: either way they must end)
    shrink(sleeping[0])
    shrink(polling[0])
    for t in threads:
        t.join(30)
    out["alive"] = any(t.is_alive() for t in threads)
    # A writer with room, then the file shrunk: the claim faults.
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    r, w = s.reader(), s.writer()
    assert w.write(np.zeros(4, np.float32), block=False)
    shrink(s)
    out["look"] = said(lambda: w.look(timeout=0))
    out["block=False"] = said(lambda: w.look(block=False))
    out["raw look"] = lib.zct_stream_write_look(w._handle, 0, slot)
    out["stats"] = said(lambda: s.published)
    # A frame claimed, then the file shrunk: the publish faults. (A look
    # gives the frame claimed again, touching no shared memory.)
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    r, w = s.reader(), s.writer()
    assert w.look(timeout=0) is not None
    shrink(s)
    out["increment"] = said(w.increment)
    out["raw increment"] = lib.zct_stream_write_increment(w._handle)
    out["look again"] = said(lambda: w.look(timeout=0))
    print(sorted(out.items()), flush=True)
    os._exit(0)  # closing the endpoints says the fault again
""")


def test_a_file_shrunk_under_the_writer_is_corrupt_header_not_a_crash(isolated):
    """ftruncate of the stream's file under a writer: its claim and publish
    (in C), its wait for room (asleep outside Go, or in Go) and the counts
    each end with CorruptHeader (ZCT_E_CORRUPT), never a SIGBUS."""
    child = subprocess.run(
        [sys.executable, "-c", SHRUNK], env=isolated, capture_output=True, text=True, timeout=2 * JOIN_S
    )
    assert child.returncode == 0, child.stderr
    corrupt = native.lib().ZCT_E_CORRUPT
    assert child.stdout.strip() == str(
        sorted(
            {
                "alive": False,
                "sleep": "CorruptHeader",
                "c call": corrupt,
                "increment": "CorruptHeader",
                "look": "CorruptHeader",
                "block=False": "CorruptHeader",
                "raw look": corrupt,
                "raw increment": corrupt,
                "look again": "nothing",
                "stats": "CorruptHeader",
            }.items()
        )
    )


# -- a model of what every reader sees ---------------------------------------------------


class ReaderModel:
    def __init__(self, pos):
        self.pos, self.received, self.dropped = pos, 0, 0
        self.looking = None  # the slot looked at


class StreamWriterModel(RuleBasedStateMachine):
    """A writer and up to three readers of a small ring under either policy,
    driven by hypothesis through the C ABI's steps (Python's look,
    increment, write and read, and the raw calls), with the counts read in
    Go after every step, against a model: under block every reader reads
    every frame published after it joined, once, in order, from the slot
    the writer filled, and the writer finds the ring full exactly when the
    slowest reader is a ring behind; under overwrite the writer never
    waits, and a reader a ring behind the claim skips to the oldest frame
    left, counting each one lost once."""

    @initialize(
        frames=st.integers(2, 8),
        nreaders=st.integers(1, 3),
        policy=st.sampled_from(["block", "overwrite"]),
        big=st.booleans(),
    )
    def setup(self, frames, nreaders, policy, big):
        # Frames of 4 MiB: a ring larger than the writer's warm slots (4
        # MiB, or twice the L3 on AMD family 23: 16 MiB on a machine with
        # an 8 MiB L3, so once it has more than 4 frames there), whose writer
        # reads the readers on every claim.
        self.shape = (1 << 20,) if big else (3,)
        self.s = zctipc.Stream.create(shape=self.shape, frames=frames, readers=nreaders, policy=policy)
        self.w = self.s.writer()
        self.frames, self.nreaders, self.block = frames, nreaders, policy == "block"
        self.readers = {}  # slot index -> (StreamReader, ReaderModel)
        self.published = 0
        self.claim = 0  # the stream's claim word
        self.claimed = None  # the slot of the frame claimed
        self.slot_of = {}  # position -> the slot the writer filled
        self.dropped = 0  # every reader's, those closed too

    def teardown(self):
        if hasattr(self, "s"):
            for r, _ in self.readers.values():
                r.close()
            self.w.close()
            self.s.close()

    # -- the writer

    def room(self):
        """Whether the model says a claim finds room."""
        if not self.block or self.claimed is not None:
            return True
        return all(self.published - m.pos < self.frames for _, m in self.readers.values())

    def claimed_slot(self, slot, fill=True):
        if self.claimed is not None:
            assert slot == self.claimed, "a look again gives the frame claimed"
            return
        if self.block:
            low = min([m.pos for _, m in self.readers.values()], default=self.published)
            in_flight = {self.slot_of[p] for p in range(low, self.published)}
            assert slot not in in_flight, "the slot of a frame a reader may still read"
        else:
            assert slot == self.published % self.frames
        if fill:
            self.w._frames[slot][:] = self.published  # filled at once: the claim is stored
        self.claimed = slot
        self.claim = max(self.claim, self.published + 1)
        self.slot_of[self.published] = slot

    @rule(raw=st.booleans())
    def writer_look(self, raw):
        room = self.room()
        if raw:
            status, slot = c_write_look(self.w, 0)
            assert status == (0 if room else native.E_FULL)
        else:
            view = self.w.look(block=False)
            assert (view is not None) == room
            slot = slot_of(self.w, view) if room else None
        if room:
            self.claimed_slot(slot)

    def published_one(self):
        self.published += 1
        self.claimed = None

    @rule(raw=st.booleans())
    def writer_increment(self, raw):
        if raw:
            status = native.lib().zct_stream_write_increment(self.w._handle)
            assert status == (0 if self.claimed is not None else native.E_INVALID)
        elif self.claimed is None:
            with pytest.raises(zctipc.InvalidArgument):
                self.w.increment()
        else:
            self.w.increment()
        if self.claimed is not None:
            self.published_one()

    @rule(n=st.integers(1, 12))
    def writer_writes(self, n):
        """write() n times (look, copy, increment; the frame claimed, if
        any, is the first it fills), as far as there is room."""
        for _ in range(n):
            room = self.room()
            assert self.w.write(np.full(self.shape, self.published, np.float32), block=False) == room
            if not room:
                return
            if self.claimed is None:
                _, u32 = words(self.s)  # the slot the table gives the frame
                self.claimed_slot(u32[table_word(self.s, self.published)], fill=False)
            self.published_one()

    @rule()
    def writer_taken_over(self):
        """The writer closes (a frame claimed and not published is not) and
        a new one takes the role: it reads the frames in flight from the
        table."""
        self.w.close()
        self.w = self.s.writer()
        self.claimed = None

    # -- the readers

    @precondition(lambda self: len(self.readers) < self.nreaders)
    @rule()
    def reader_joins(self):
        r = self.s.reader()
        assert r.index == min(set(range(self.nreaders)) - set(self.readers))
        self.readers[r.index] = (r, ReaderModel(self.published))

    def some_reader(self, data):
        return data.draw(st.sampled_from(sorted(self.readers)))

    def skip(self, m):
        """Under overwrite, a look first skips the frames a ring behind the claim."""
        if self.claim > m.pos + self.frames:
            assert not self.block, "under block no reader is ever a ring behind"
            lost = self.claim - self.frames - m.pos
            m.dropped += lost
            self.dropped += lost
            m.pos = self.claim - self.frames

    @precondition(lambda self: self.readers)
    @rule(data=st.data())
    def reader_looks(self, data):
        r, m = self.readers[self.some_reader(data)]
        view = r.look(block=False)
        if m.looking is not None:
            assert slot_of(r, view) == m.looking, "a look again gives the frame looked at"
            return
        self.skip(m)
        if m.pos == self.published:
            assert view is None
            return
        assert view is not None
        m.looking = slot_of(r, view)
        assert m.looking == self.slot_of[m.pos]
        assert (view == m.pos).all(), "the frame of its position, whole"

    @precondition(lambda self: self.readers)
    @rule(data=st.data())
    def reader_increments(self, data):
        r, m = self.readers[self.some_reader(data)]
        if m.looking is None:
            with pytest.raises(zctipc.InvalidArgument):
                r.increment()
            return
        whole = self.claim <= m.pos + self.frames
        assert r.increment() == whole
        assert whole or not self.block, "under block a frame looked at is never overwritten"
        if whole:
            m.received += 1
        else:
            m.dropped += 1
            self.dropped += 1
        m.pos += 1
        m.looking = None

    @precondition(lambda self: any(m.looking is None for _, m in self.readers.values()))
    @rule(data=st.data())
    def reader_reads(self, data):
        index = data.draw(st.sampled_from(sorted(i for i, (_, m) in self.readers.items() if m.looking is None)))
        r, m = self.readers[index]
        got = r.read(block=False)
        self.skip(m)
        if m.pos == self.published:
            assert got is None
            return
        assert got is not None and (got == m.pos).all()
        m.received += 1
        m.pos += 1

    @precondition(lambda self: self.readers)
    @rule(data=st.data())
    def reader_closes(self, data):
        index = self.some_reader(data)
        self.readers.pop(index)[0].close()

    @precondition(lambda self: self.readers)
    @rule(data=st.data(), wait=st.sampled_from(["sleep", "poll"]))
    def reader_waits_otherwise(self, data, wait):
        self.readers[self.some_reader(data)][0].set_wait(wait)

    # -- the counts, read in Go

    @invariant()
    def counts(self):
        if not hasattr(self, "s"):
            return
        assert self.s._stats() == (self.published, self.dropped, len(self.readers), False)
        for r, m in self.readers.values():
            assert r._counts() == (m.pos, m.received, m.dropped)


StreamWriterModel.TestCase.settings = settings(max_examples=150, stateful_step_count=80, deadline=None)
test_a_writer_and_its_readers_against_a_model = StreamWriterModel.TestCase


#: The space word's waiting writer (u32) and `wanted` (u64) in the data
#: region (docs/format.md, "Streams").
SPACE_WAITERS, WANTED = 452, 456

#: A reader timeout, seconds: the tests below wait half of one more.
TIMEOUT_S = 0.5


@pytest.mark.slow
@pytest.mark.parametrize("look", ["block=False", "c look 0"])
def test_a_polling_writer_evicts_an_unseen_reader_a_timeout_after_it_first_found_no_room(look):
    """Note [waiting is alive]: a reader unseen is evicted a reader timeout
    after the later of its seen time and the moment the writer began to
    wait for the frame it has not passed. A writer that only polls (looks
    that do not wait, which the data plane answers) finds no room for a
    frame a moment after its reader was seen, and looks again once a
    timeout and a half passed without the reader moving: that look evicts
    it. The data plane's first look used to tell Go nothing (the reader was
    not suspect, and Go had looked a moment before), so Go began to count
    at the second look, and the reader held the ring a whole timeout more."""
    s = zctipc.Stream.create(shape=4, frames=2, readers=1, reader_timeout=TIMEOUT_S)
    r, w = s.reader(), s.writer()

    def poll():
        if look == "block=False":
            return w.look(block=False) is not None
        status, _ = c_write_look(w, 0)
        assert status in (0, native.E_FULL), last_error()
        return status == 0

    for i in range(2):
        assert w.write(np.full(4, i, np.float32), block=False)
    assert not poll(), "the reader holds the ring"  # Go looks here: its first
    assert float(r.read(timeout=0)[0]) == 0  # seen now, at frame 1
    assert w.write(np.full(4, 2, np.float32), block=False)
    assert not poll(), "the reader, seen a moment ago, holds frame 1"
    time.sleep(TIMEOUT_S * 1.5)
    assert poll(), "the reader was not seen for a timeout and a half since the writer waited for it"
    assert s.readers == 0
    for e in (w, r, s):
        e.close()


def stopped_reader(children, reader_timeout):
    """A stream of 4 frames full under block, with a local reader that keeps
    up and a reader process that holds the first frame, stopped (SIGSTOP):
    its process lives (state T) and never moves."""
    s = zctipc.Stream.create(shape=4, frames=4, readers=2, policy="block", reader_timeout=reader_timeout)
    mine = s.reader()
    p = reader_process(children, s, "hold")
    w = s.writer()
    for i in range(4):
        assert w.write(np.full(4, i, np.float32), block=False)
        if i == 0:
            held(p)
        assert float(mine.read(timeout=0)[0]) == i
    os.kill(p.pid, signal.SIGSTOP)
    deadline = time.monotonic() + JOIN_S
    while state(p.pid) != "T":
        assert time.monotonic() < deadline, "the reader never stopped"
        time.sleep(0.01)
    return s, w, mine, p


def left_no_waiter(s):
    u32 = native.ffi().cast("uint32_t *", s._memory + SPACE_WAITERS)
    u64 = native.ffi().cast("uint64_t *", s._memory + WANTED)
    assert u32[0] == 0, "a writer's sleep stayed counted on the space word"
    assert u64[0] == 0, "the writer still says it waits"


@pytest.mark.slow
@pytest.mark.parametrize("wait", ["sleep", "poll"])
def test_a_stopped_reader_is_alive_without_a_timeout_and_evicted_once_a_zombie(children, wait):
    """A reader process stopped by SIGSTOP holds the ring: the data plane
    does not take it for dead (its /proc state is T), and without a reader
    timeout a writer waiting across several of its periodic looks (still
    armed, Python's sleep) gives up at its own timeout, leaving no sleeper
    counted and the reader joined. Killed into a zombie, the next wait
    evicts it, and the writer goes on."""
    s, w, mine, p = stopped_reader(children, None)
    w.set_wait(wait)
    assert w.write(np.full(4, 4, np.float32), timeout=1.5) is False, "a stopped reader is alive"
    assert s.readers == 2
    left_no_waiter(s)
    assert w.look(block=False) is None and w.look(timeout=0) is None
    kill(p, reap=False)  # a zombie: /proc shows it, and it holds no mapping
    assert w.write(np.full(4, 4, np.float32), timeout=JOIN_S)
    left_no_waiter(s)
    goes_on_from_4(s, w, mine)


@pytest.mark.slow
@pytest.mark.parametrize("wait", ["sleep", "poll"])
def test_a_stopped_reader_is_evicted_by_the_reader_timeout(children, wait):
    """With a reader timeout, a stopped reader process (alive to /proc)
    holding the ring is evicted by a writer that waits, asleep (its looks
    every few slices answered by the data plane while armed) or polling in
    Go; the wait leaves no sleeper counted."""
    s, w, mine, p = stopped_reader(children, TIMEOUT_S)
    w.set_wait(wait)
    assert w.write(np.full(4, 4, np.float32), timeout=JOIN_S)
    assert s.readers == 1
    assert state(p.pid) == "T"
    left_no_waiter(s)
    goes_on_from_4(s, w, mine)


@pytest.mark.slow
def test_threads_looking_at_once_without_waiting_evict_a_killed_reader_and_claim_once(children):
    """Four threads call zct_stream_write_look(0) at once on one full
    writer while the reader that holds the ring is killed: each call says
    full or claims, no call fails, and every claim is the one frame's slot
    (a look again before the increment). The writer then goes on."""
    s, w, mine, p = full_with_a_reader_process(children, "hold")
    barrier = threading.Barrier(5)
    statuses, slots = [], []

    def looker():
        barrier.wait()
        deadline = time.monotonic() + JOIN_S
        while time.monotonic() < deadline:
            status, slot = c_write_look(w, 0)
            statuses.append(status)
            if status == 0:
                slots.append(slot)
                if len(slots) >= 20:
                    return

    threads = [start(looker) for _ in range(4)]
    barrier.wait()
    kill(p, reap=False)
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive()
    assert set(statuses) <= {0, native.E_FULL}, (set(statuses), last_error())
    assert len(set(slots)) == 1, "one claim, however many looks"
    w._frames[slots[0]][:] = 4
    w.increment()
    goes_on_from_4(s, w, mine)


@pytest.mark.slow
def test_a_polling_writer_evicts_a_reader_whose_pid_another_process_took():
    """The reader holding the ring names a live process that is not it (its
    recorded start time forged): the data plane never suspects it, and a
    writer that only polls (looks that do not wait, answered in C) still
    evicts it, through the look that goes to Go every few seconds (Note [a
    writer's look for the dead])."""
    s = zctipc.Stream.create(shape=4, frames=4, readers=2, policy="block")
    mine, stuck = s.reader(), s.reader()
    w = filled(s, 4, [mine])
    assert w.look(block=False) is None, "a live reader holds the ring"
    start_time = native.ffi().cast("uint64_t *", s._memory + 576 + 64 * stuck.index + START_AT)
    start_time[0] += 1
    deadline = time.monotonic() + JOIN_S
    while (view := w.look(block=False)) is None:
        assert time.monotonic() < deadline, "the reader was never evicted"
        time.sleep(0.01)
    view[:] = 4
    w.increment()
    assert s.readers == 1
    assert float(mine.read(timeout=0)[0]) == 4
    for e in (w, mine, stuck, s):
        e.close()


def test_a_full_ring_answered_in_c_says_why_as_go_does():
    """The C ABI's rule: after a failure, zct_last_error and _errno say why,
    for the calling thread. A look that does not wait on a full ring, once
    the data plane answers it (Note [a writer's look for the dead]), says
    what Go's look said, not the thread's failure before it."""
    s = zctipc.Stream.create(shape=4, frames=2, readers=1, policy="block")
    r = s.reader()
    w = filled(s, 2)
    assert c_write_look(w, 0)[0] == native.E_FULL  # the first goes to Go
    said = last_error()
    slot = native.ffi().new("int32_t *")
    assert native.lib().zct_stream_write_look(0, 0, slot) != 0  # no such writer
    assert last_error() != said
    assert c_write_look(w, 0)[0] == native.E_FULL  # the data plane's answer
    assert last_error() == said
    assert native.lib().zct_last_errno() == 0
    for e in (w, r, s):
        e.close()
