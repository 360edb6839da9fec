"""Stream readers, writers and pipeline tasks that the stream tests run in
other processes."""

import os
import time

import numpy as np

import zctipc


def read_every_frame(stream, ready, results, index=None, wait="sleep"):
    """Join as a reader (waiting as wait says), say so, and check every
    frame until the stream ends: each must be whole (every element its
    sequence number) and come in order, exactly once."""
    r = stream.reader(index)
    r.set_wait(wait)
    ready.put(r.index)
    expected, bad = 0, []
    for frame in r:
        if not (frame == expected).all():
            bad.append(expected)
        expected += 1
    results.put({"index": r.index, "count": expected, "bad": bad[:10], "dropped": r.dropped})


def read_slowly(stream, ready, results):
    """Read with copy=True, slowly, under the overwrite policy; report what
    came whole and what was dropped."""
    r = stream.reader()
    ready.put(r.index)
    got, torn = [], 0
    while True:
        try:
            frame = r.read()
        except zctipc.StreamEnded:
            break
        if not (frame == frame.flat[0]).all():
            torn += 1
        got.append(int(frame.flat[0]))
        time.sleep(0.0005)
    results.put(
        {
            "received": len(got),
            "dropped": r.dropped,
            "torn": torn,
            "ordered": got == sorted(got),
            "reader_received": r.received,
        }
    )


def hold_a_frame(stream, ready):
    """Look at the first frame and hold it until killed."""
    r = stream.reader()
    ready.put(r.index)
    r.look()
    ready.put("holding")
    time.sleep(3600)


def write_half_a_frame(stream, ready):
    """Publish frame 0 (all ones), fill half of frame 1 with twos, and wait
    to be killed."""
    w = stream.writer()
    w.write(np.ones(stream.shape, stream.dtype))
    frame = w.look()
    frame[: len(frame) // 2] = 2
    ready.put("half")
    time.sleep(3600)


def wait_for_event(event, results):
    results.put(("waiting", os.getpid()))
    start = time.monotonic()
    got = event.wait(30)
    results.put(("set", got, time.monotonic() - start))


# -- pipeline tasks ------------------------------------------------------------


def count_up(out, n):
    for i in range(n):
        frame = out.look()
        frame[:] = i
        out.increment()


def double(inp, out):
    for frame in inp:
        out.write(frame * 2)


def collect(inp, results):
    total, count, whole = 0, 0, True
    for frame in inp:
        whole &= bool((frame == frame[0]).all())
        total += int(frame[0])
        count += 1
    results.put({"count": count, "total": total, "whole": whole})


def explode(inp, out):
    for i, frame in enumerate(inp):
        if i == 5:
            raise ValueError("boom at frame 5")
        out.write(frame)


def run_forever(out):
    while True:
        out.write(np.zeros(out.stream.shape, out.stream.dtype))


def drain(inp):
    for _ in inp:
        pass
