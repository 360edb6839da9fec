"""Streams, events and pipelines, across real processes."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import _streams
import numpy as np
import pytest
import torch

import zctipc


def start_readers(ctx, target, stream, n, *args):
    """Start n reader processes and wait until each has joined."""
    ready, results = zctipc.Queue(), zctipc.Queue()
    procs = [ctx.Process(target=target, args=(stream, ready, results, *args)) for _ in range(n)]
    for p in procs:
        p.start()
    joined = sorted(ready.get(timeout=60) for _ in procs)
    return procs, joined, results


@pytest.mark.slow
@pytest.mark.parametrize("readers, wait", [(1, "sleep"), (2, "sleep"), (4, "sleep"), (1, "poll"), (2, "poll")])
def test_block_every_reader_gets_every_frame_whole_and_in_order(readers, wait):
    ctx = zctipc.get_context()
    s = zctipc.Stream.create(shape=(1024,), dtype=np.int64, frames=8, readers=readers)
    procs, joined, results = start_readers(ctx, _streams.read_every_frame, s, readers, None, wait)
    assert joined == list(range(readers))
    assert s.readers == readers
    w = s.writer()
    w.set_wait(wait)
    n = 3000
    for i in range(n):
        frame = w.look()
        frame[:512] = i  # filled in two steps: a reader must never see half
        frame[512:] = i
        w.increment()
    s.end()
    reports = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for r in reports:
        assert r == {"index": r["index"], "count": n, "bad": [], "dropped": 0}, r
    assert s.published == n and s.dropped == 0
    w.close()
    s.close()


def test_overwrite_a_slow_reader_counts_what_it_drops():
    ctx = zctipc.get_context()
    s = zctipc.Stream.create(shape=(4096,), dtype=np.int32, frames=4, readers=1, policy="overwrite")
    procs, _, results = start_readers(ctx, _streams.read_slowly, s, 1)
    w = s.writer()
    n = 3000
    for i in range(n):
        assert w.write(np.full(4096, i, np.int32), block=False), "overwrite never waits"
    time.sleep(0.2)
    s.end()
    r = results.get(timeout=60)
    procs[0].join(60)
    assert r["torn"] == 0, "a copied frame is checked whole"
    assert r["ordered"]
    assert r["dropped"] > 0, "the slow reader was lapped"
    assert r["received"] + r["dropped"] == n, r
    assert r["reader_received"] == r["received"]
    assert s.dropped == r["dropped"]
    w.close()


def test_a_late_reader_starts_at_the_next_frame():
    s = zctipc.Stream.create(shape=3, dtype=np.float64, frames=4, readers=2)
    w = s.writer()
    for i in range(10):
        w.write(np.full(3, i, np.float64))  # no reader yet: nothing to wait for
    r = s.reader()
    assert r.look(block=False) is None
    assert r.position == 10
    w.write(np.full(3, 10.0))
    assert r.read().tolist() == [10.0, 10.0, 10.0]
    r.close()
    again = s.reader()
    assert again.index == 0, "a reader that left freed its slot"
    again.close()
    w.close()


@pytest.mark.slow
def test_a_killed_reader_does_not_stop_the_others():
    ctx = zctipc.get_context()
    s = zctipc.Stream.create(shape=(256,), dtype=np.int64, frames=4, readers=3)
    ready = zctipc.Queue()
    victim = ctx.Process(target=_streams.hold_a_frame, args=(s, ready))
    victim.start()
    ready.get(timeout=60)
    procs, _, results = start_readers(ctx, _streams.read_every_frame, s, 2)
    w = s.writer()
    w.write(np.zeros(256, np.int64))
    assert ready.get(timeout=60) == "holding"
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    for i in range(1, 500):
        assert w.write(np.full(256, i, np.int64), timeout=10), "the writer is not stalled by the dead reader"
    s.end()
    for _ in procs:
        r = results.get(timeout=60)
        assert (r["count"], r["bad"], r["dropped"]) == (500, [], 0)
    for p in procs:
        p.join(60)
    assert s.readers == 0
    w.close()


def test_a_writer_killed_mid_frame_publishes_nothing_half_written():
    ctx = zctipc.get_context()
    s = zctipc.Stream.create(shape=(1000,), dtype=np.int16, frames=4, readers=1)
    r = s.reader()
    ready = zctipc.Queue()
    writer = ctx.Process(target=_streams.write_half_a_frame, args=(s, ready))
    writer.start()
    assert ready.get(timeout=60) == "half"
    os.kill(writer.pid, signal.SIGKILL)
    writer.join()
    assert r.read().tolist() == [1] * 1000
    assert r.read(timeout=0.05) is None, "the half-written frame was never published"
    w = s.writer()  # the dead writer's role is taken over
    w.write(np.full(1000, 3, np.int16))
    assert r.read().tolist() == [3] * 1000
    w.close()
    r.close()


def test_torch_views_and_bfloat16():
    s = zctipc.Stream.create(shape=(2, 3), dtype=torch.bfloat16, frames=2, readers=1)
    r, w = s.reader(), s.writer()
    t = w.look(torch=True)
    assert t.dtype == torch.bfloat16 and t.shape == (2, 3)
    t.copy_(torch.arange(6, dtype=torch.bfloat16).reshape(2, 3))
    w.increment()
    got = r.look(torch=True)
    assert got.dtype == torch.bfloat16 and got.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert r.increment()
    assert w.write(torch.ones(2, 3, dtype=torch.bfloat16))
    assert r.read(torch=True).sum().item() == 6
    with pytest.raises(ValueError, match=r"dtype float32 does not fit .* \(2, 3\) bfloat16"):
        w.write(torch.ones(2, 3))
    w.close()
    r.close()


def test_zero_copy_views():
    s = zctipc.Stream.create(shape=8, dtype=np.uint8, frames=2, readers=1)
    r, w = s.reader(), s.writer()
    frame = w.look()
    frame[:] = 5
    w.increment()
    view = r.read(copy=False)
    assert view.ctypes.data == frame.ctypes.data, "the reader sees the writer's memory"
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0] = 1
    assert r.position == 0, "held until the next read"
    assert r.read(block=False) is None
    assert r.position == 1
    w.close()
    r.close()


def test_bad_input():
    with pytest.raises(zctipc.InvalidArgument, match="block, overwrite"):
        zctipc.Stream.create(shape=4, policy="drop")
    with pytest.raises(zctipc.InvalidArgument, match="frames"):
        zctipc.Stream.create(shape=4, frames=1)
    with pytest.raises(zctipc.InvalidArgument, match="readers"):
        zctipc.Stream.create(shape=4, readers=0)
    with pytest.raises(zctipc.InvalidArgument, match="negative"):
        zctipc.Stream.create(shape=(4, -1))
    with pytest.raises(zctipc.UnsupportedDtype):
        zctipc.Stream.create(shape=4, dtype=object)
    with pytest.raises(zctipc.InvalidArgument, match="reader_timeout"):
        zctipc.Stream.create(shape=4, reader_timeout=0)
    with pytest.raises(zctipc.SegmentNotFound):
        zctipc.Stream.attach("no_such_stream")
    s = zctipc.Stream.create(shape=(4, 4), dtype=np.float32, frames=2, readers=2)
    with pytest.raises(zctipc.InvalidArgument, match="reader slot 5: the stream has 2"):
        s.reader(5)
    a, b = s.reader(), s.reader()
    with pytest.raises(zctipc.StreamBusy, match="all 2 reader slots"):
        s.reader()
    with pytest.raises(zctipc.StreamBusy, match="reader slot 0 is held"):
        s.reader(0)
    w = s.writer()
    with pytest.raises(zctipc.StreamBusy, match="already has a writer"):
        s.writer()
    with pytest.raises(ValueError, match=r"shape \(4, 3\) and dtype float32 does not fit"):
        w.write(np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match=r"shape \(4, 4\) and dtype float64 does not fit"):
        w.write(np.zeros((4, 4)))
    with pytest.raises(zctipc.InvalidArgument, match="look first"):
        w.increment()
    with pytest.raises(zctipc.InvalidArgument, match="look first"):
        a.increment()
    s.end()
    with pytest.raises(zctipc.StreamEnded):
        w.look()
    with pytest.raises(zctipc.StreamEnded):
        a.look()
    for e in (a, b, w):
        e.close()
    with pytest.raises(ValueError, match="closed"):
        a.look()


@pytest.mark.slow
def test_blocked_look_uses_no_cpu_and_ctrl_c_interrupts_it():
    code = textwrap.dedent("""
        import sys, time, zctipc
        s = zctipc.Stream.create(shape=4, frames=2, readers=1)
        r = s.reader()
        start = time.process_time()
        assert r.look(timeout=1.0) is None
        print(time.process_time() - start, flush=True)
        try:
            r.look()
        except KeyboardInterrupt:
            print(time.monotonic(), flush=True)
    """)
    # NumPy, which the reader imports, starts OpenBLAS threads that spin for a
    # while, and process_time counts them: the child runs without them.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    cpu = float(child.stdout.readline())
    assert cpu < 0.1, f"a blocked look used {cpu} s of CPU in 1 s"
    time.sleep(0.3)
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=10)
    assert child.returncode == 0
    latency = float(out) - sent
    print(f"Ctrl-C reached the blocked look in {latency * 1000:.1f} ms")
    assert latency < 1.0


def test_event_across_processes():
    ctx = zctipc.get_context()
    e = zctipc.Event()
    assert not e.is_set()
    assert e.wait(0.02) is False
    results = zctipc.Queue()
    p = ctx.Process(target=_streams.wait_for_event, args=(e, results))
    p.start()
    assert results.get(timeout=60)[0] == "waiting"
    time.sleep(0.1)
    e.set()
    what, got, _ = results.get(timeout=60)
    assert (what, got) == ("set", True)
    p.join(60)
    assert e.is_set() and e.wait() is True
    e.clear()
    assert not e.is_set()
    assert zctipc.Event is zctipc.get_context().Event().__class__


@pytest.mark.slow
def test_pipeline_of_three_stages():
    results = zctipc.Queue()
    p = zctipc.Pipeline()
    p.add_stream("numbers", shape=(1000,), dtype=np.int64, frames=8)
    p.add_stream("doubled", shape=(1000,), dtype=np.int64, frames=8)
    p.add_task(_streams.count_up, writes=["numbers"], args=(2000,))
    p.add_task(_streams.double, reads=["numbers"], writes=["doubled"])
    p.add_task(_streams.collect, reads=["doubled"], args=(results,))
    assert p.run() is True
    assert results.get(timeout=10) == {"count": 2000, "total": 2 * sum(range(2000)), "whole": True}
    names = {s.name for s in p.streams.values()}
    assert not names & {s.name for s in zctipc.list_segments()}, "the streams are gone"


@pytest.mark.slow
def test_a_crashing_task_stops_the_pipeline_with_its_traceback():
    p = zctipc.Pipeline()
    p.add_stream("a", shape=16, dtype=np.int64)
    p.add_stream("b", shape=16, dtype=np.int64)
    p.add_task(_streams.run_forever, writes=["a"])
    p.add_task(_streams.explode, reads=["a"], writes=["b"])
    p.add_task(_streams.drain, reads=["b"])
    with pytest.raises(zctipc.PipelineError) as err:
        p.run()
    assert err.value.task == "explode"
    assert "ValueError: boom at frame 5" in str(err.value)
    assert "in explode" in err.value.traceback
    for t in p._tasks:
        assert t.process.exitcode is not None, "every task stopped"
    names = {s.name for s in p.streams.values()}
    assert not names & {s.name for s in zctipc.list_segments()}, "no segment left behind"


def test_pipeline_stop_ends_an_endless_source_and_bad_declarations():
    p = zctipc.Pipeline()
    p.add_stream("a", shape=16, dtype=np.int64)
    p.add_task(_streams.run_forever, writes=["a"])
    p.start()
    time.sleep(0.2)
    p.stop()
    assert p._tasks[0].process.exitcode == 0
    with pytest.raises(ValueError, match="never declared"):
        zctipc.Pipeline().add_task(_streams.double, reads=["x"])
    q = zctipc.Pipeline().add_stream("a", shape=1)
    with pytest.raises(ValueError, match="already"):
        q.add_stream("a", shape=1)
    q.add_task(_streams.run_forever, writes=["a"])
    with pytest.raises(ValueError, match="has a writer already"):
        q.add_task(_streams.run_forever, writes=["a"])
