"""Attacks, through the Python streams API, on the time a wait hands from
the data plane to Go (rounded up to the millisecond, never cut short) and
on many threads calling next on one reader while its policy switches (Note
[the rest of a next in Go]): a look, a read or a claim of a timeout from 0
to a few milliseconds, under every wait policy, never returns empty before
its timeout; and each frame goes to exactly one thread."""

import threading
import time

import numpy as np
import pytest

import zctipc

#: Waits, by their wait and spin: in the data plane (sleep, poll for ever)
#: and in Go (a spin, then a sleep).
POLICIES = [("sleep", None), ("poll", None), ("sleep", 20e-6), ("poll", 100e-6)]
TIMEOUTS = [0, 1e-9, 1e-6, 0.0005, 0.000999, 0.001, 0.0015, 0.003]


@pytest.mark.parametrize("wait,spin", POLICIES)
def test_a_look_and_a_claim_never_return_empty_before_their_timeout(wait, spin):
    with zctipc.Stream.create(shape=(4,), dtype="float32", frames=2, readers=1, policy="block") as s:
        r, w = s.reader(), s.writer()
        r.set_wait(wait, spin)
        w.set_wait(wait, spin)
        for timeout in TIMEOUTS:
            for _ in range(3):
                start = time.monotonic()
                assert r.look(timeout=timeout) is None
                assert time.monotonic() - start >= timeout
                start = time.monotonic()
                assert r.read(timeout=timeout) is None
                assert time.monotonic() - start >= timeout
        assert w.write(np.zeros(4, np.float32))
        assert w.write(np.ones(4, np.float32))
        for timeout in TIMEOUTS:
            start = time.monotonic()
            assert not w.write(np.zeros(4, np.float32), timeout=timeout)
            assert time.monotonic() - start >= timeout
        assert r.read()[0] == 0 and r.read()[0] == 1
        assert r.look(block=False) is None
        r.close()
        w.close()


def test_threads_reading_one_reader_while_its_policy_switches_get_each_frame_once():
    frames, threads = 2000, 8
    with zctipc.Stream.create(shape=(1,), dtype="int64", frames=8, readers=1, policy="block") as s:
        r, w = s.reader(), s.writer()
        got, errors = [], []
        lock = threading.Lock()

        def read():
            try:
                while True:
                    try:
                        frame = r.read(timeout=0.002)
                    except zctipc.StreamEnded:
                        return
                    if frame is not None:
                        with lock:
                            got.append(int(frame[0]))
            except Exception as e:  # noqa: BLE001  # said below, in the test's thread
                errors.append(e)

        switching = threading.Event()

        def switch():
            i = 0
            while not switching.is_set():
                r.set_wait(*POLICIES[i % len(POLICIES)])
                assert r.position <= frames
                i += 1
                time.sleep(0.001)

        readers = [threading.Thread(target=read) for _ in range(threads)]
        switcher = threading.Thread(target=switch)
        for t in [*readers, switcher]:
            t.start()
        for i in range(frames):
            assert w.write(np.array([i]), timeout=60)
        s.end()
        for t in readers:
            t.join(60)
            assert not t.is_alive()
        switching.set()
        switcher.join(60)
        assert not errors
        assert sorted(got) == list(range(frames))
        assert (r.position, r.received, r.dropped) == (frames, frames, 0)
        r.close()
        w.close()
