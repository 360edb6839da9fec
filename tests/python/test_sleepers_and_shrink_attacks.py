"""Attacks on a stream reader's count of its own sleepers (`armed`, at
offset 56 of its slot; Note [a dead party's sleepers] in package futex)
and on closing endpoints and segments after another process shrank their
file. The data word's waiting readers (offset 388) must never hold fewer
than the live sleepers (a lost wake-up), never wrap round, and go back to
0 once everyone left; a close after a shrink says CorruptHeader or
succeeds, never crashes or hangs, and unmaps the file.

Nothing here asserts a timing: the counts are read from shared memory."""

import os
import random
import subprocess
import sys
import threading

import numpy as np
import pytest
from _procs import killed_at_random, settle
from _stream_words import WRAPPED, armed, sleepers
from conftest import with_pythonpath

import zctipc
from zctipc._core import native

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {**os.environ, "PYTHONPATH": with_pythonpath(os.path.join(os.path.dirname(HERE), "python"))}

#: Far above anything the behaviour needs: only a hang reaches it.
HANG = 60


def frame(i):
    return np.full(4, i, np.float32)


def arm(reader):
    ffi = native.ffi()
    word, seen = ffi.new("uint32_t **"), ffi.new("uint32_t *")
    native.check(native.lib().zct_stream_reader_arm(reader._handle, word, seen))


def disarm(reader):
    native.check(native.lib().zct_stream_reader_disarm(reader._handle))


def test_a_forged_count_on_a_free_slot_never_makes_the_word_wrap():
    """A forged `armed` on a free slot takes the live readers' sleepers
    out of the data word when the slot is taken (forged memory may cost
    wake-ups), but the live reader's disarm after that must not take the
    word below 0: it wrapped round to 2**32 - 1, and every publish after
    that made a wake-up call for nobody, for the life of the stream."""
    s = zctipc.Stream.create(shape=4, frames=2, readers=2)
    live = s.reader(0)
    try:
        arm(live)
        assert sleepers(s) == 1 and armed(s, 0)[0] == 1
        armed(s, 1)[0] = 0xFFFFFFFF  # forged on the free slot
        taker = s.reader(1)
        assert armed(s, 1)[0] == 0 and sleepers(s) == 0
        disarm(live)
        assert sleepers(s) < WRAPPED, f"wrapped round: {sleepers(s):#x}"
        assert sleepers(s) == 0
        taker.close()
    finally:
        live.close()
        s.close()


def test_a_forged_count_on_a_free_slot_never_makes_the_word_wrap_in_go():
    """The same, with a reader asleep in Go (a policy that spins then
    sleeps there) when the forged slot is taken: once woken and back, the
    word holds no sleeper, and did not wrap."""
    s = zctipc.Stream.create(shape=4, frames=2, readers=2)
    w, live = s.writer(), s.reader(0)
    live.set_wait("sleep", spin=20e-6)
    got = []
    t = threading.Thread(target=lambda: got.append(live.read(timeout=HANG)), daemon=True)
    t.start()
    try:
        assert settle(lambda: sleepers(s) == 1)
        armed(s, 1)[0] = 0x80000000
        taker = s.reader(1)
        # The take removed the live sleeper from the word; the reader may
        # have armed again since (Python waits in slices of 50 ms, each
        # one a disarm and an arm), so 1 is right too.
        assert sleepers(s) in (0, 1), f"{sleepers(s):#x}"
        w.write(frame(1))
        t.join(HANG)
        assert not t.is_alive()
        np.testing.assert_array_equal(got[0], frame(1))
        assert sleepers(s) == 0, f"{sleepers(s):#x}"
        taker.close()
    finally:
        for e in (w, live, s):
            e.close()


_LOOPER = """
import sys, threading, zctipc
from zctipc._core import native
s = zctipc.Stream.attach(sys.argv[1])
r = s.reader(int(sys.argv[2]))
lib, ffi = native.lib(), native.ffi()
def loop():
    word, seen = ffi.new("uint32_t **"), ffi.new("uint32_t *")
    while True:
        lib.zct_stream_reader_arm(r._handle, word, seen)
        lib.zct_stream_reader_disarm(r._handle)
for _ in range(3):
    threading.Thread(target=loop, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


def test_readers_killed_at_random_in_arm_and_disarm_loops_never_lose_a_live_sleeper():
    """Processes whose threads arm and disarm through the C ABI in a loop,
    killed (-9) at random moments, each taking the slot of the last: the
    data word always holds the live reader's sleeper, never wraps, and once
    the live reader is back holds only what a kill between a step's two
    counts left (a wasted wake-up each; docs/format.md, "Sleepers")."""
    rng = random.Random(5)
    s = zctipc.Stream.create(shape=4, frames=2, readers=2, policy="overwrite")
    w, live = s.writer(), s.reader(0)
    arm(live)  # asleep outside the library, for the whole attack
    rounds = 8
    try:
        for _ in range(rounds):
            killed_at_random(_LOOPER, s.name, "1", env=ENV, rng=rng)
            assert 1 <= sleepers(s) < WRAPPED, f"{sleepers(s):#x}"
            w.write(frame(0))  # publishes go on
        taker = s.reader(1)  # takes back what the last one left
        assert armed(s, 1)[0] == 0
        assert 1 <= sleepers(s) <= 1 + rounds, f"{sleepers(s):#x}"
        disarm(live)
        assert sleepers(s) <= rounds
        taker.close()
    finally:
        for e in (w, live, s):
            e.close()


def test_a_live_reader_evicted_while_armed_loses_its_sleeper_and_rejoins():
    """A reader armed outside the library and not reading holds the ring:
    the writer evicts it for its reader timeout and takes its sleeper back
    (its process may die evicted, where no writer looks again); its disarm
    then leaves the word alone, and it rejoins, arms and disarms again, and
    the word ends at 0."""
    s = zctipc.Stream.create(shape=4, frames=2, readers=1, reader_timeout=0.1)
    w, r = s.writer(), s.reader()
    try:
        arm(r)
        for i in range(3):  # the third waits for the reader, and evicts it
            assert w.write(frame(i), timeout=HANG)
        assert sleepers(s) == 0 and armed(s, 0)[0] == 0
        disarm(r)
        assert sleepers(s) == 0 and armed(s, 0)[0] == 0
        r.read(timeout=0)  # rejoins, at the next frame
        arm(r)
        assert sleepers(s) == 1 and armed(s, 0)[0] == 1
        assert w.write(frame(9), timeout=HANG)
        disarm(r)
        assert sleepers(s) == 0
    finally:
        for e in (w, r, s):
            e.close()


_SHRUNK = """
import gc, os, sys, numpy as np, zctipc
kind = sys.argv[1]
d = os.environ["ZCTIPC_SHM_DIR"]
def shrink(name):
    os.truncate(os.path.join(d, name), 0)
said = []
def close(e):
    try:
        e.close()
        said.append("closed")
    except zctipc.CorruptHeader:
        said.append("CorruptHeader")
if kind == "stream-armed":
    s = zctipc.Stream.create(shape=4, frames=2, readers=2)
    name, r, w = s.name, s.reader(), s.writer()
    from zctipc._core import native
    ffi = native.ffi()
    for _ in range(3):
        native.lib().zct_stream_reader_arm(r._handle, ffi.new("uint32_t **"), ffi.new("uint32_t *"))
    shrink(name)
    for e in (w, r, s):
        close(e)
    del r, w, s
elif kind == "queue":
    q = zctipc.Queue()
    q.put(np.ones(1000, np.float32))
    name = q.name
    shrink(name)
    close(q)
    del q
elif kind == "tensor":
    t = zctipc.create_shared_tensor(shape=(1000,))
    name = t.name
    a = zctipc.attach_shared_tensor(name)
    shrink(name)
    close(a)
    close(t)
    try:
        t.unlink()
    except Exception:
        pass
    del a, t
gc.collect()
with open("/proc/self/maps") as f:
    mapped = name in f.read()
print(" ".join(said), "mapped" if mapped else "unmapped", flush=True)
"""


@pytest.mark.parametrize("cache", ["1", "0"], ids=["map-cache", "no-map-cache"])
@pytest.mark.parametrize("kind", ["stream-armed", "queue", "tensor"])
def test_closes_after_the_file_shrank_say_so_and_unmap(isolated, kind, cache):
    """A stream whose reader has sleepers armed through the C ABI, a queue
    holding a message, a shared tensor with two handles: each closed after
    another process truncated the file says CorruptHeader or closes, never
    crashes or hangs, and leaves the file unmapped."""
    env = dict(isolated, ZCTIPC_MAP_CACHE=cache)
    child = subprocess.run([sys.executable, "-c", _SHRUNK, kind], env=env, capture_output=True, text=True, timeout=HANG)
    assert child.returncode == 0, child.stderr
    *said, mapping = child.stdout.split()
    assert said and all(x in ("closed", "CorruptHeader") for x in said), child.stdout
    assert mapping == "unmapped", child.stdout
