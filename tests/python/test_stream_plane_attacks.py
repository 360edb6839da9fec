"""Attacks on a stream reader's steps in the data plane: the C ABI's
zct_stream_read_look, _increment and _next run them (and wait for a frame)
without entering Go, on the reader's state in C memory, and fall back to
Go for what they cannot finish. Each attack here is on that surface: a
close, a stats call, an end or a shrunk file while a look sleeps in C;
forged words; counts against the Go-only path (the poll policy)."""

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import zctipc
from zctipc._core import native

#: Longer than any test waits: a call that ends ended for its own reason.
LONG_MS = 60_000


def c_look(reader, ms, results, key):
    """zct_stream_read_look straight from the C ABI (the wait in C, not
    Python's sleep outside it), its status and slot put in results[key]."""
    slot = native.ffi().new("int32_t *")
    results[key] = (native.lib().zct_stream_read_look(reader._handle, ms, slot), slot[0])


def start(target, *args):
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def words(stream):
    """The stream's data region as u64 and u32 words."""
    ffi = native.ffi()
    return ffi.cast("uint64_t *", stream._memory), ffi.cast("uint32_t *", stream._memory)


def table_word(stream, pos):
    """The index (in u32 words) of the slot table's entry of frame pos."""
    return (576 + 64 * stream.max_readers) // 4 + pos % stream.frames


def test_a_file_shrunk_under_a_reader_asleep_in_c_is_corrupt_header_not_a_crash(isolated):
    """The sleeper's count on the data word is taken back after the futex
    faulted: on a shrunk file that is a fault too, which must be guarded
    (it was a SIGBUS that killed the process)."""
    code = textwrap.dedent("""
        import os, threading, time, zctipc
        from zctipc._core import native
        s = zctipc.Stream.create(shape=4, frames=2, readers=1)
        r = s.reader()
        slot = native.ffi().new("int32_t *")
        out = {}
        def look():
            out["status"] = native.lib().zct_stream_read_look(r._handle, 60000, slot)
        t = threading.Thread(target=look)
        t.start()
        time.sleep(0.3)  # asleep in C (or about to be: either way it must end)
        os.truncate(os.path.join(os.environ["ZCTIPC_SHM_DIR"], s.name), 0)
        t.join(30)
        print(out.get("status"), flush=True)
        try:
            r.look(timeout=0.1)
        except zctipc.CorruptHeader:
            print("CorruptHeader", flush=True)
        os._exit(0)  # closing the endpoints says the fault again on stderr
    """)
    child = subprocess.run([sys.executable, "-c", code], env=isolated, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    status, again = child.stdout.split()
    assert int(status) == native.lib().ZCT_E_CORRUPT
    assert again == "CorruptHeader"


def test_a_close_from_another_thread_ends_a_look_asleep_in_c():
    s = zctipc.Stream.create(shape=4, frames=2, readers=1)
    r = s.reader()
    results = {}
    t = start(c_look, r, LONG_MS, results, "look")
    t.join(0.3)
    r.close()
    t.join(30)
    assert not t.is_alive()
    assert results["look"][0] == native.E_CLOSED
    s.close()


@pytest.mark.parametrize("wait", ["sleep", "poll"])
def test_a_close_from_another_thread_ends_frames_and_look_for_ever(wait):
    s = zctipc.Stream.create(shape=4, frames=2, readers=2)
    readers = [s.reader(), s.reader()]
    errors = {}

    def iterate():
        try:
            for _ in readers[0].frames():
                pass
        except Exception as e:  # noqa: BLE001
            errors["frames"] = e

    def look():
        try:
            readers[1].look(timeout=None)
        except Exception as e:  # noqa: BLE001
            errors["look"] = e

    for r in readers:
        r.set_wait(wait)
    threads = [start(iterate), start(look)]
    threads[0].join(0.3)
    for r in readers:
        r.close()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert isinstance(errors["frames"], zctipc.HandleClosed)
    assert isinstance(errors["look"], zctipc.HandleClosed)
    s.close()


def test_stats_from_another_thread_while_a_look_sleeps_in_c_come_once_a_frame_does():
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    w, r = s.writer(), s.reader()
    results = {}
    looker = start(c_look, r, LONG_MS, results, "look")
    looker.join(0.2)
    asker = start(lambda: results.setdefault("counts", r._counts()))
    asker.join(0.2)
    w.write(np.full(4, 7, np.float32))
    for t in (looker, asker):
        t.join(30)
        assert not t.is_alive()
    assert results["look"][0] == 0
    # The stats saw the reader before or after its look: never in between.
    assert results["counts"] == (0, 0, 0)
    np.testing.assert_array_equal(r.read(), np.full(4, 7, np.float32))
    assert r._counts() == (1, 1, 0)
    for e in (w, r, s):
        e.close()


def test_the_end_wakes_a_look_asleep_in_c():
    s = zctipc.Stream.create(shape=4, frames=2, readers=1)
    w, r = s.writer(), s.reader()
    w.write(np.zeros(4, np.float32))
    r.read()
    results = {}
    t = start(c_look, r, LONG_MS, results, "look")
    t.join(0.3)
    s.end()
    t.join(30)
    assert not t.is_alive()
    assert results["look"][0] == native.E_ENDED
    for e in (w, r, s):
        e.close()


def test_one_publish_wakes_64_looks_asleep_in_c():
    s = zctipc.Stream.create(shape=4, frames=2, readers=64)
    w = s.writer()
    readers = [s.reader() for _ in range(64)]
    results = {}
    threads = [start(c_look, r, LONG_MS, results, i) for i, r in enumerate(readers)]
    threads[0].join(0.5)
    w.write(np.arange(4, dtype=np.float32))
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert {status for status, _ in results.values()} == {0}
    for r in readers:
        np.testing.assert_array_equal(r.read(), np.arange(4, dtype=np.float32))
        assert r._counts() == (1, 1, 0)
        r.close()
    w.close()
    s.close()


@pytest.mark.parametrize("wait", ["sleep", "poll"])
def test_a_forged_slot_table_entry_is_corrupt_header(wait):
    """A slot past the ring in the table: the C step refuses it, and so
    does Go (the poll policy's path), with the same error; nothing is read
    from past the ring, and the reader's position stays."""
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    w, r = s.writer(), s.reader()
    r.set_wait(wait)
    w.write(np.zeros(4, np.float32))
    _, u32 = words(s)
    u32[table_word(s, 0)] = 4
    with pytest.raises(zctipc.CorruptHeader, match="slot 4 of 4"):
        r.look(timeout=0)
    with pytest.raises(zctipc.CorruptHeader, match="slot 4 of 4"):
        next(iter(r))
    u32[table_word(s, 0)] = 0xFFFFFFFF
    status = native.lib().zct_stream_read_look(r._handle, 0, native.ffi().new("int32_t *"))
    assert status == native.lib().ZCT_E_CORRUPT
    assert r._counts() == (0, 0, 0)
    u32[table_word(s, 0)] = 1  # a slot in the ring again: the reader takes it as the table says
    assert r.look(timeout=0) is not None
    assert r.increment()
    for e in (w, r, s):
        e.close()


def test_positions_past_2_to_the_32_frames():
    """Forged claim and published words past 2**32: the reader's u64
    position, the table's index (pos % frames) and the counts stay right."""
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    u64, u32 = words(s)
    base = (1 << 32) + 5
    u64[320 // 8] = u64[328 // 8] = base  # claim, published: no writer here
    r = s.reader()
    assert r.position == base
    assert r.look(timeout=0) is None
    u32[table_word(s, base)] = 2
    u64[320 // 8] = u64[328 // 8] = base + 1
    view = r.look(timeout=0)
    assert view is not None and np.shares_memory(view, r._frames[2])
    assert r.increment()
    assert r._counts() == (base + 1, 1, 0)
    # A claim a ring and more ahead: the frames in between are dropped.
    u64[320 // 8] = u64[328 // 8] = base + 1 + 4 + 3
    u32[table_word(s, base + 4)] = 1
    assert r.look(timeout=0) is not None
    assert r._counts() == (base + 4, 1, 3)
    assert r.increment()
    assert r._counts() == (base + 5, 2, 3)
    r.close()
    s.close()


def lapped_counts(wait):
    """A reader that looks at a frame while an overwrite writer laps it:
    what increment says, and the counts after, under the wait policy."""
    s = zctipc.Stream.create(shape=4, frames=4, readers=1, policy="overwrite")
    w, r = s.writer(), s.reader()
    r.set_wait(wait)
    w.write(np.zeros(4, np.float32))
    r.look(timeout=0)
    for i in range(1, 10):
        w.write(np.full(4, i, np.float32))
    whole = r.increment()
    got = [r.read(timeout=0) for _ in range(5)]
    out = (whole, r._counts(), [None if g is None else float(g[0]) for g in got], s._stats()[1])
    for e in (w, r, s):
        e.close()
    return out


def test_a_lapped_reader_counts_as_the_go_only_path_does():
    whole, counts, got, dropped = lapped_counts("sleep")
    assert not whole
    # 10 frames: the looked-at one torn, 1 to 5 overwritten, 6 to 9 whole.
    assert got == [6.0, 7.0, 8.0, 9.0, None]
    assert counts == (10, 4, 6)
    assert dropped == 6
    assert lapped_counts("poll") == (whole, counts, got, dropped)


def test_a_reader_that_polls_then_sleeps_again_waits_in_c():
    s = zctipc.Stream.create(shape=4, frames=4, readers=1)
    w, r = s.writer(), s.reader()
    r.set_wait("poll")
    assert r.look(timeout=0.05) is None
    r.set_wait("sleep")
    results = {}
    t = start(c_look, r, LONG_MS, results, "look")
    t.join(0.2)
    w.write(np.ones(4, np.float32))
    t.join(30)
    assert not t.is_alive()
    assert results["look"][0] == 0
    np.testing.assert_array_equal(r.read(), np.ones(4, np.float32))
    for e in (w, r, s):
        e.close()


def test_an_evicted_reader_rejoins_through_go_and_counts_what_it_skipped():
    s = zctipc.Stream.create(shape=4, frames=2, readers=2, reader_timeout=0.05)
    w, idle, busy = s.writer(), s.reader(), s.reader()
    w.write(np.zeros(4, np.float32))
    busy.read()
    # idle holds the writer back, and takes no frame: the writer evicts it.
    for i in range(1, 6):
        assert w.write(np.full(4, i, np.float32), timeout=30)
        assert float(busy.read(timeout=30)[0]) == i
    assert s.readers == 1
    # Back: it rejoins at the next frame published, and what it skipped is dropped.
    assert idle.look(timeout=0) is None
    assert idle._counts() == (6, 0, 6)
    w.write(np.full(4, 6, np.float32))
    results = {}
    c_look(idle, LONG_MS, results, "look")
    assert results["look"][0] == 0
    assert idle.increment()
    assert idle._counts() == (7, 1, 6)
    for e in (w, idle, busy, s):
        e.close()


def test_a_readers_arms_are_counted_on_the_data_word_and_a_close_takes_back_what_it_left():
    """zct_stream_reader_arm and _disarm count the sleeper in C: two arms
    are two sleepers on the data word (388: its count), a disarm takes one
    back, one more than were armed is refused, and a close takes back what
    its handle left armed, so a publish after it costs no wake-up call."""
    lib, ffi = native.lib(), native.ffi()
    s = zctipc.Stream.create(shape=4, frames=2, readers=2)
    r, other = s.reader(), s.reader()
    _, u32 = words(s)
    word, seen = ffi.new("uint32_t **"), ffi.new("uint32_t *")
    for reader in (r, r, other):
        assert lib.zct_stream_reader_arm(reader._handle, word, seen) == 0
        assert word[0] == u32 + 384 // 4 and seen[0] == u32[384 // 4]
    assert u32[388 // 4] == 3
    assert lib.zct_stream_reader_disarm(other._handle) == 0
    status = lib.zct_stream_reader_disarm(other._handle)
    assert status == lib.ZCT_E_INVALID
    assert "not armed" in str(native.error(status))
    assert u32[388 // 4] == 2
    r.close()
    assert u32[388 // 4] == 0
    assert lib.zct_stream_reader_disarm(r._handle) == lib.ZCT_E_CLOSED
    w = s.writer()
    w.write(np.arange(4, dtype=np.float32))
    assert np.array_equal(other.read(timeout=10), np.arange(4, dtype=np.float32))
    other.close()
    w.close()
    s.close()


def test_endpoints_closed_after_the_file_shrank_let_go_of_what_they_hold(isolated):
    """Closing a reader and a writer whose stream's file shrank says so
    (CorruptHeader), and still lets go of what they hold in this process:
    their state in C memory and the mapping (it was kept, and the C state
    leaked, when the fault came before them)."""
    code = textwrap.dedent("""
        import gc, os, numpy as np, zctipc
        s = zctipc.Stream.create(shape=4, frames=2, readers=1)
        name, r, w = s.name, s.reader(), s.writer()
        w.write(np.ones(4, np.float32))
        os.truncate(os.path.join(os.environ["ZCTIPC_SHM_DIR"], name), 0)
        said = []
        for e in (r, w, s):
            try:
                e.close()
                said.append("closed")
            except zctipc.CorruptHeader:
                said.append("CorruptHeader")
        del r, w, s
        gc.collect()
        with open("/proc/self/maps") as f:
            mapped = name in f.read()
        print(" ".join(said), "mapped" if mapped else "unmapped", flush=True)
    """)
    child = subprocess.run([sys.executable, "-c", code], env=isolated, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    reader, writer, stream, mapping = child.stdout.split()
    assert (reader, writer) == ("CorruptHeader", "CorruptHeader")
    assert mapping == "unmapped", child.stdout
    assert stream in ("closed", "CorruptHeader")
