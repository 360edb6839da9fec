"""Attacks on the one implementation of a word's sleeper count (the data
plane's zp_count_sleeper, zp_uncount_sleepers, zp_take_back_sleepers), on
a writer evicting a dead reader while a new one joins the slot (Note
[evicting a dead reader] in package stream), and on the warm slots a
writer goes round (Note [how far apart a writer reuses a slot]).

A waiters word must never wrap round (stay far below 2**31) and go back to
0 once every live sleeper left; a slot held joining by a live process is
refused with StreamBusy after a moment, never waited on for ever, and
taken once that process is gone; every frame a reader gets is whole.
Nothing here asserts a timing: counts are read from shared memory."""

import mmap
import os
import random
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from _procs import killed_at_random
from _stream_words import WRAPPED, sleepers, slot_word
from conftest import SHM, with_pythonpath

import zctipc
from zctipc._core import native

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {**os.environ, "PYTHONPATH": with_pythonpath(os.path.join(os.path.dirname(HERE), "python"))}

#: Far above anything the behaviour needs: only a hang reaches it.
HANG = 60
#: A queue's three waiters words (docs/format.md, "Queues"): data, space, join.
QUEUE_WAITERS = (260, 324, 388)
JOINING = 3


# -- a queue's words through the C ABI ---------------------------------------------------------


class QueueWords:
    """The waiters words of a queue, mapped from its file (offsets from
    the segment header's data_offset)."""

    def __init__(self, q):
        fd = os.open(os.path.join(SHM, q.name), os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self._at = int(np.frombuffer(self._map, np.uint64, count=1, offset=16)[0])
        self._words = np.frombuffer(self._map, np.uint32, count=128, offset=self._at)

    def __getitem__(self, which):
        return int(self._words[QUEUE_WAITERS[which] // 4])

    def __setitem__(self, which, value):
        self._words[QUEUE_WAITERS[which] // 4] = value

    def close(self):
        del self._words
        self._map.close()


def q_arm(q, which):
    ffi, lib = native.ffi(), native.lib()
    word, seen = ffi.new("uint32_t **"), ffi.new("uint32_t *")
    native.check(lib.zct_queue_arm(q._handle, which, word, seen))


def q_disarm(q, which):
    native.check(native.lib().zct_queue_disarm(q._handle, which, 0))


@pytest.fixture
def fs_queue():
    previous = zctipc.get_sharing_strategy()
    zctipc.set_sharing_strategy("file_system")
    q = zctipc.Queue(maxsize=4)
    words = QueueWords(q)
    try:
        yield q, words
    finally:
        words.close()
        q.close()
        zctipc.set_sharing_strategy(previous)


@pytest.mark.parametrize("forged", [0, 1, 1 << 31, (1 << 32) - 1])
def test_forged_queue_waiters_never_wrap_on_arm_disarm_and_close(fs_queue, forged):
    """A queue's waiters word forged before an arm, and again between the
    arm and its disarm, and under an arm that close takes back: an arm
    stops at 2**32 - 1, a disarm or a close at 0 (before, the C disarm took 1 from 0 and left
    2**32 - 1: every put made a wake-up call for nobody)."""
    q, words = fs_queue
    for which in range(3):
        words[which] = forged
        q_arm(q, which)
        # A count forged at 2**32 - 1 stays there on the arm, never round
        # to 0, which would cost the sleeper its wake-up (forged memory may
        # cost wake-ups for nobody); the disarm takes its one.
        assert words[which] == min(forged + 1, (1 << 32) - 1)
        q_disarm(q, which)
        assert words[which] == (forged if forged < (1 << 32) - 1 else (1 << 32) - 2), f"{words[which]:#x}"
        q_arm(q, which)
        words[which] = 0  # the arm's sleeper forged away
        q_disarm(q, which)
        assert words[which] == 0, f"wrapped round: {words[which]:#x}"
    for which in range(3):
        q_arm(q, which)
        q_arm(q, which)
        words[which] = 1  # one of two forged away; close takes back both
    q.put("m")
    assert q.get(timeout=HANG) == "m"
    native.check(native.lib().zct_queue_disarm(q._handle, 0, 1))
    assert words[0] == 0, f"wrapped round: {words[0]:#x}"
    # close (the fixture's) takes back the arms still held: see the next test


def test_a_close_under_forged_arms_never_wraps(fs_queue):
    q, words = fs_queue
    other = zctipc.Queue.attach(q.name)
    try:
        for which in range(3):
            for _ in range(3):
                q_arm(other, which)
            words[which] = 1
        other.close()
        for which in range(3):
            assert words[which] == 0, f"wrapped round: {words[which]:#x}"
    finally:
        other.close()


def test_threads_arming_and_disarming_while_others_put_and_get_leave_no_sleeper(fs_queue):
    """Threads arm and disarm every word through the C ABI in a loop while
    others put and get: no word ever wraps, and each is 0 once all left."""
    q, words = fs_queue
    stop = threading.Event()
    errors = []

    def armer(which):
        try:
            while not stop.is_set():
                q_arm(q, which)
                q_disarm(q, which)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def mover():
        try:
            i = 0
            while not stop.is_set():
                q.put(i, timeout=HANG)
                assert q.get(timeout=HANG) == i
                i += 1
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=armer, args=(w,), daemon=True) for w in (0, 1, 2, 0, 1)]
    threads.append(threading.Thread(target=mover, daemon=True))
    for t in threads:
        t.start()
    try:
        for _ in range(200):
            for which in range(3):
                assert words[which] < WRAPPED, f"wrapped round: {words[which]:#x}"
            threading.Event().wait(0.002)
    finally:
        stop.set()
        for t in threads:
            t.join(HANG)
    assert not errors, errors
    assert [words[w] for w in range(3)] == [0, 0, 0]


_QUEUE_LOOPER = """
import sys, threading, zctipc
from zctipc._core import native
q = zctipc.Queue.attach(sys.argv[1])
lib, ffi = native.lib(), native.ffi()
def loop(which):
    word, seen = ffi.new("uint32_t **"), ffi.new("uint32_t *")
    while True:
        lib.zct_queue_arm(q._handle, which, word, seen)
        lib.zct_queue_disarm(q._handle, which, 1)
for which in (0, 1, 2):
    threading.Thread(target=loop, args=(which,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


def test_processes_killed_in_queue_arm_loops_never_make_a_word_wrap(fs_queue):
    """Processes arming and disarming a queue's words, killed (-9) at
    random: a queue has no per-party count, so each kill may leave its
    sleeper counted (a wasted wake-up, Note [a dead party's sleepers]), but
    no word wraps, each holds at most one per kill, and the live party's
    arm and disarm after that leave the word as they found it."""
    q, words = fs_queue
    rng = random.Random(11)
    rounds = 6
    for _ in range(rounds):
        killed_at_random(_QUEUE_LOOPER, q.name, env=ENV, rng=rng)
        q.put("x", timeout=HANG)
        assert q.get(timeout=HANG) == "x"
    for which in range(3):
        left = words[which]
        assert left <= rounds, f"{left:#x}"
        q_arm(q, which)
        q_disarm(q, which)
        assert words[which] == left


# -- a stream's eviction and joins -------------------------------------------------------------


def frame(i, n=4):
    return np.full(n, i, np.float32)


_SLEEPY_READER = """
import sys, threading, zctipc
from zctipc._core import native
s = zctipc.Stream.attach(sys.argv[1])
r = s.reader(int(sys.argv[2]))
ffi = native.ffi()
word, seen = ffi.new("uint32_t **"), ffi.new("uint32_t *")
native.check(native.lib().zct_stream_reader_arm(r._handle, word, seen))
print("joined", flush=True)
threading.Event().wait()  # asleep outside the library, taking no frame
"""

_JOINER = """
import sys, zctipc
s = zctipc.Stream.attach(sys.argv[1])
index = int(sys.argv[2])
while True:
    try:
        r = s.reader(None if index < 0 else index)
        break
    except zctipc.StreamBusy:
        pass
print("joined", r.index, flush=True)
got = []
while not got or got[-1] != int(sys.argv[3]):
    f = r.read(timeout=60)
    got.append(int(f[0]) if (f == f[0]).all() else -1)
print(" ".join(map(str, got)), flush=True)
r.close()
"""


def _write_two(w, done):
    done.append([w.write(frame(1000 + i), timeout=HANG) for i in range(2)])


def test_a_reader_killed_asleep_in_a_full_ring_while_a_new_one_joins_its_slot():
    """A reader asleep in a full ring holds the writer back; it is killed
    while the writer waits for room, and a new reader (another process)
    asks for the same slot at once. The writer evicts the dead one and goes
    on, the new reader gets every frame it joined for whole, and once it
    left the data word holds no sleeper: its own was never taken back with
    the dead one's, and the dead one's was taken back."""
    for attempt in range(3):
        s = zctipc.Stream.create(shape=4, frames=2, readers=1)
        w = s.writer()
        sleepy = subprocess.Popen(
            [sys.executable, "-c", _SLEEPY_READER, s.name, "0"], stdout=subprocess.PIPE, text=True, env=ENV
        )
        joiner = None
        try:
            assert sleepy.stdout.readline() == "joined\n"
            w.write(frame(100))
            w.write(frame(101))  # the ring is full of frames the reader has not taken
            assert sleepers(s) == 1
            done = []
            writer = threading.Thread(target=_write_two, args=(w, done), daemon=True)
            writer.start()
            joiner = subprocess.Popen(
                [sys.executable, "-c", _JOINER, s.name, "0", "4"], stdout=subprocess.PIPE, text=True, env=ENV
            )
            threading.Event().wait(0.01 * attempt)
            sleepy.kill()
            sleepy.wait()
            writer.join(HANG)
            assert done == [[True, True]]
            assert joiner.stdout.readline() == "joined 0\n"
            # The joiner reads from the next frame published once it joined
            # (before the writer's two, or between, or after them): every
            # frame after that, whole and in order.
            for i in range(5):
                assert w.write(frame(i), timeout=HANG)
            got = joiner.stdout.readline().split()
            sent = ["1000", "1001", "0", "1", "2", "3", "4"]
            assert got == sent[len(sent) - len(got) :], got
            assert joiner.wait(HANG) == 0
            assert sleepers(s) == 0, f"{sleepers(s):#x}"
        finally:
            for p in (sleepy, joiner):
                if p is not None:
                    p.kill()
                    p.wait()
                    p.stdout.close()
            w.close()
            s.close()


def test_a_slot_held_joining_by_a_live_process_is_refused_not_waited_on_for_ever():
    """A slot held joining, as a writer evicting its dead reader holds it,
    by a process that is stopped there (here: forged, under a live pid): a
    reader asking for it is refused with StreamBusy after a moment, one
    asking for any slot takes another, and once that process is gone the
    slot is taken."""
    s = zctipc.Stream.create(shape=4, frames=2, readers=2)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=ENV)
    try:
        word = slot_word(s, 0)
        word[0] = (holder.pid << 32) | (7 << 2) | JOINING
        with pytest.raises(zctipc.StreamBusy):
            s.reader(0)
        other = s.reader()
        assert other.index == 1
        with pytest.raises(zctipc.StreamBusy):
            s.reader()
        os.kill(holder.pid, signal.SIGSTOP)  # stopped is alive
        with pytest.raises(zctipc.StreamBusy):
            s.reader(0)
        holder.kill()
        holder.wait()
        taken = s.reader(0)
        assert taken.index == 0
        w = s.writer()
        w.write(frame(1))
        np.testing.assert_array_equal(taken.read(timeout=HANG), frame(1))
        np.testing.assert_array_equal(other.read(timeout=HANG), frame(1))
        for e in (w, taken, other):
            e.close()
    finally:
        holder.kill()
        holder.wait()
        s.close()


def test_a_slot_held_joining_under_this_process_pid_is_refused_then_free():
    """The same slot held joining under the asking process's own pid (a
    writer of this process evicting): refused, not a hang, and free once
    the word says evicted again."""
    s = zctipc.Stream.create(shape=4, frames=2, readers=1)
    try:
        word = slot_word(s, 0)
        word[0] = (os.getpid() << 32) | (3 << 2) | JOINING
        with pytest.raises(zctipc.StreamBusy):
            s.reader(0)
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        word[0] = (int(dead.stdout) << 32) | (3 << 2) | 2  # evicted, its process gone
        r = s.reader(0)
        assert (slot_word(s, 0)[0] >> 32) == os.getpid()
        r.close()
    finally:
        s.close()


_RACER = """
import sys, zctipc
s = zctipc.Stream.attach(sys.argv[1])
sys.stdin.readline()
try:
    r = s.reader()
    print("slot", r.index, flush=True)
except zctipc.StreamBusy:
    print("busy", flush=True)
sys.stdin.readline()
"""


def test_many_readers_joining_at_once_get_distinct_slots_or_busy():
    """Processes join one stream at the same moment with no index: each
    gets a slot no other holds, or StreamBusy when none is left."""
    slots, racers = 3, 6
    s = zctipc.Stream.create(shape=4, frames=2, readers=slots)
    ps = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, s.name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV
        )
        for _ in range(racers)
    ]
    try:
        for p in ps:
            p.stdin.write("\n")
        for p in ps:
            p.stdin.flush()
        got = [p.stdout.readline().split() for p in ps]
        taken = [int(g[1]) for g in got if g[0] == "slot"]
        assert len(taken) == slots and sorted(taken) == list(range(slots)), got
        assert sum(g == ["busy"] for g in got) == racers - slots, got
    finally:
        for p in ps:
            p.kill()
            p.wait()
            p.stdin.close()
            p.stdout.close()
        s.close()


# -- warm slots --------------------------------------------------------------------------------


def _check_stream(frame_bytes, frames, readers, count, lag):
    """A writer writes count frames, each all its number, to readers that
    fall behind (every lag-th frame they stop a while) and catch up: each
    reader gets every frame whole and in order (block)."""
    n = frame_bytes // 4
    s = zctipc.Stream.create(shape=n, dtype="uint32", frames=frames, readers=readers)
    rs = [s.reader(i) for i in range(readers)]
    w = s.writer()
    bad = []

    def read(r, k):
        for i in range(count):
            got = r.read(timeout=HANG)
            if got is None or got.shape != (n,) or got[0] != i or got[-1] != i or not (got == i).all():
                bad.append((k, i, None if got is None else (got[0], got[-1])))
                return
            if lag and i % lag == k % lag:
                threading.Event().wait(0.001)

    threads = [threading.Thread(target=read, args=(r, k), daemon=True) for k, r in enumerate(rs)]
    for t in threads:
        t.start()
    try:
        for i in range(count):
            f = w.look(timeout=HANG)
            f[...] = i
            w.increment()
        for t in threads:
            t.join(HANG)
            assert not t.is_alive()
        assert not bad, bad
    finally:
        for e in (w, *rs, s):
            e.close()


MiB = 1 << 20


@pytest.mark.parametrize(
    ("frame_bytes", "frames"),
    [
        (4, 2),
        (4 * MiB, 1 + 0),  # one frame is refused at create: see below
        (4 * MiB - 4, 2),
        (4 * MiB, 2),
        (2 * MiB, 3),
        (1 * MiB, 5),
        (1 * MiB, 16),
        (1 * MiB, 17),
        (1 * MiB - 64, 20),
        (64 * 1024, 300),
    ],
)
def test_frames_stay_whole_around_the_warm_distance(frame_bytes, frames):
    """Rings just below, at and above the warm distance (4 MiB, or twice
    the L3 on AMD family 23), frames of a few bytes to megabytes: every frame whole,
    in order, with two readers falling behind and catching up."""
    if frames < 2:
        with pytest.raises(zctipc.InvalidArgument):
            zctipc.Stream.create(shape=frame_bytes // 4, dtype="uint32", frames=frames)
        return
    _check_stream(frame_bytes, frames, readers=2, count=max(3 * frames, 12), lag=3)


def test_a_large_frame_ring_of_two_keeps_every_frame():
    """A 64 MiB frame, two of them: far past any warm distance."""
    _check_stream(64 * MiB, 2, readers=1, count=4, lag=0)


_SHRUNK_IN_EVICTION = """
import os, subprocess, sys, zctipc
import numpy as np
s = zctipc.Stream.create(shape=4, frames=2, readers=1)
w = s.writer()
sleepy = subprocess.Popen([sys.executable, "-c", sys.argv[1], s.name, "0"], stdout=subprocess.PIPE, text=True)
assert sleepy.stdout.readline() == "joined\\n"
w.write(np.zeros(4, np.float32))
w.write(np.zeros(4, np.float32))
sleepy.kill()
sleepy.wait()
sleepy.stdout.close()
os.truncate(os.path.join(os.environ.get("ZCTIPC_SHM_DIR", "/dev/shm"), s.name), int(sys.argv[2]))
said = []
for call in (lambda: w.write(np.zeros(4, np.float32), timeout=1), w.close, s.close):
    try:
        call()
        said.append("ok")
    except zctipc.ZctipcError as e:
        said.append(type(e).__name__)
print(" ".join(said), flush=True)
"""


def test_a_file_shrunk_under_an_eviction_is_an_error_not_a_crash(isolated):
    """The stream's file shrunk to nothing (by another process of the
    user) once its reader died asleep: the writer that waits for room, to
    evict the dead reader and take its sleepers back, meets the fault as an
    error, never a crash or a hang, and closes after. (A file cut only past
    the words, through the frames, lets the look succeed: the caller's own
    copy into the frame's view then faults, as any write to a mapping of a
    shrunk file does.)"""
    child = subprocess.run(
        [sys.executable, "-c", _SHRUNK_IN_EVICTION, _SLEEPY_READER, "0"],
        env=isolated,
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert child.returncode == 0, child.stderr
    said = child.stdout.split()
    assert len(said) == 3 and said[0] != "ok", child.stdout
