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
import textwrap
import threading

import numpy as np
import pytest
from _procs import settle
from conftest import with_pythonpath

import zctipc
from zctipc._core import native

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = {**os.environ, "PYTHONPATH": with_pythonpath(os.path.join(os.path.dirname(HERE), "python"))}

#: Far above anything the behaviour needs: only a hang reaches it.
HANG = 60
#: The data word's sleepers (u32), and a reader slot's table and size
#: (docs/format.md, "Streams"), with the slot's `armed` (u32).
SLEEPERS, READERS_AT, READER_SIZE, ARMED = 388, 576, 64, 56
#: Far above any count of real sleepers: a count here wrapped round.
WRAPPED = 1 << 20


def u32(stream, offset):
    return native.ffi().cast("uint32_t *", stream._memory + offset)


def sleepers(stream):
    return u32(stream, SLEEPERS)[0]


def armed(stream, index):
    return u32(stream, READERS_AT + index * READER_SIZE + ARMED)


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
        assert sleepers(s) == 0
        w.write(frame(1))
        t.join(HANG)
        assert not t.is_alive()
        np.testing.assert_array_equal(got[0], frame(1))
        assert sleepers(s) == 0, f"{sleepers(s):#x}"
        taker.close()
    finally:
        for e in (w, live, s):
            e.close()
