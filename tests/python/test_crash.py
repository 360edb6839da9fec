"""Crash safety: processes, and the cleanup daemon itself, are SIGKILLed,
and nothing of zctipc's is left behind.

The scenarios that kill many processes run in a segment directory and a
daemon of their own (``ZCTIPC_SHM_DIR`` on /dev/shm's tmpfs, and
``ZCTIPC_RUNTIME_DIR``), so that what they leave can be counted exactly.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _format import decode
from conftest import SHM, daemon_pid, slots_in_use

import zctipc

SWEEP_TIMEOUT = 10  # seconds the daemon may take to leave nothing


def files(env):
    return sorted(os.listdir(env["ZCTIPC_SHM_DIR"]))


def wait_empty(env, timeout=SWEEP_TIMEOUT):
    """Wait until the segment directory is empty; return what is left."""
    deadline = time.monotonic() + timeout
    while files(env) and time.monotonic() < deadline:
        time.sleep(0.02)
    return files(env)


def run_scenario(env, call, *args, timeout=600):
    out = subprocess.run(
        [sys.executable, "-c", f"import sys, _crash; _crash.{call}(*sys.argv[1:])", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def start(env, call, *args):
    p = subprocess.Popen(
        [sys.executable, "-c", f"import sys, _crash; _crash.{call}(*sys.argv[1:])", *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    return p


def kill(p):
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()


def creators(env):
    """The creator pid of each file in the segment directory."""
    out = {}
    for name in files(env):
        path = os.path.join(env["ZCTIPC_SHM_DIR"], name)
        try:
            with open(path, "rb") as f:
                head = f.read(1024)
            out[name] = decode(head, os.path.getsize(path))["creator_pid"]
        except Exception:
            out[name] = None
    return out


@pytest.mark.slow
def test_a_producer_killed_100_times_leaves_nothing(isolated):
    """100 producers SIGKILLed: some stopped inside segment creation (after
    the file is made, after its pages are reserved, after it is renamed),
    the rest at random moments: mid-write, mid-put, holding tensors they
    received. Once the last process is gone, the daemon leaves nothing."""
    report = run_scenario(isolated, "producers_scenario", 100, 20261122)
    assert report["kills"] == 100
    assert all(n > 0 for n in report["stalled"].values()), report
    assert wait_empty(isolated) == []


def test_a_killed_consumers_counts_are_repaired():
    """A consumer that holds received tensors is SIGKILLed: its counts are
    given up, the producer's data stays valid, and a second sweep changes
    nothing."""
    t = zctipc.create_shared_tensor(data=np.arange(100000, dtype=np.int64))
    q, ready = zctipc.Queue(), zctipc.Queue()
    ctx = zctipc.get_context("spawn")
    import _workers

    child = ctx.Process(target=_workers.hold_received, args=(q, ready))
    child.start()
    q.put(t.numpy())
    q.put(np.ones(100000))  # a pool buffer (a small array would go inline)
    assert ready.get(timeout=60) == "holding"
    assert t.refcount == 2
    slots = slots_in_use()
    assert slots >= 1
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    deadline = time.monotonic() + SWEEP_TIMEOUT
    while (t.refcount, zctipc.pool_stats().slots_in_use) != (1, slots - 1) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert t.refcount == 1, "the consumer's count was given up"
    assert zctipc.pool_stats().slots_in_use == slots - 1, "its pool buffer went back"
    assert t.numpy().sum() == 100000 * 99999 // 2, "the producer's data is intact"
    again = zctipc.collect_garbage()
    assert t.name not in [r["name"] for r in again["removed"]]
    assert again["ledgers"] == [], "nothing is swept twice"
    assert t.refcount == 1
    t.close()


def test_a_consumer_that_exits_normally_leaves_the_producers_segment(ctx, segname):
    import _workers

    t = zctipc.create_shared_tensor(segname, data=np.arange(1 << 16, dtype=np.int32))
    digest = ctx.Pool(1).apply(_workers.digest_of, (segname,))
    assert len(digest) == 64
    assert t.refcount == 1
    assert segname in {s.name.removeprefix("zctipc_") for s in zctipc.list_segments()}
    zctipc.collect_garbage()
    assert t.numpy()[-1] == (1 << 16) - 1, "still there, still valid"
    t.close()


@pytest.mark.slow
def test_a_killed_daemon_is_replaced_and_recovers(isolated):
    """The daemon is SIGKILLed while clients run; a client dies while no
    daemon runs. The next daemon (started by the next client) sweeps what
    the dead one held and watches the live ones."""
    run_dir = isolated["ZCTIPC_RUNTIME_DIR"]
    a = start(isolated, "holder", "a")
    assert a.stdout.readline().startswith("ready")
    b = start(isolated, "holder", "b")
    assert b.stdout.readline().startswith("ready")
    first = daemon_pid(run_dir)
    assert first
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + SWEEP_TIMEOUT
    while daemon_pid(run_dir) and time.monotonic() < deadline:
        time.sleep(0.01)
    kill(a)
    held_by_a = {n for n, pid in creators(isolated).items() if pid == a.pid}
    assert len(held_by_a) >= 3, "its ledger, its tensor and its arena are still there"
    c = start(isolated, "holder", "c")  # starts the next daemon
    assert c.stdout.readline().startswith("ready")
    second = daemon_pid(run_dir)
    assert second and second != first
    deadline = time.monotonic() + SWEEP_TIMEOUT
    while held_by_a & set(files(isolated)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not held_by_a & set(files(isolated)), "what the dead client held is gone"
    assert {pid for pid in creators(isolated).values()} == {b.pid, c.pid}, "the live clients keep theirs"
    kill(b)
    kill(c)
    assert wait_empty(isolated) == []


@pytest.mark.slow
def test_two_daemons_started_at_once_one_wins(isolated):
    daemon = os.path.join(os.path.dirname(zctipc.__file__), "zctipcd")
    args = [daemon, "-dir", isolated["ZCTIPC_RUNTIME_DIR"], "-shm-dir", isolated["ZCTIPC_SHM_DIR"], "-idle", "500ms"]
    procs = [subprocess.Popen(args, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [p.communicate(timeout=30)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert sum("another zctipcd serves this directory" in e for e in errs) == 1, errs


@pytest.mark.slow
def test_the_file_descriptor_strategy_leaves_nothing_whatever_dies(isolated):
    env = dict(isolated, ZCTIPC_SHARING_STRATEGY="file_descriptor")
    report = run_scenario(env, "fd_scenario")
    assert report["sums_ok"]
    assert report["memfd_segments_kept"] >= 4, "queues, arenas and tensors are memfds the daemon keeps"
    assert report["files_while_running"] == [], "nothing is ever in the segment directory"
    assert report["files_after"] == []
    before, after = report["open_files"]
    assert after == before, "the survivor leaked no file descriptor"
    assert files(env) == []


def test_sharing_strategies():
    assert zctipc.get_all_sharing_strategies() == {"file_system", "file_descriptor"}
    assert zctipc.get_sharing_strategy() == "file_system"
    with pytest.raises(zctipc.InvalidArgument, match="file_system, file_descriptor"):
        zctipc.set_sharing_strategy("cuda_ipc")
    assert zctipc.get_sharing_strategy() == "file_system"


@pytest.mark.slow
def test_queues_and_pickling_work_under_the_file_descriptor_strategy(monkeypatch):
    import _workers

    monkeypatch.setenv("ZCTIPC_SHARING_STRATEGY", "file_system")
    zctipc.set_sharing_strategy("file_descriptor")
    try:
        assert os.environ["ZCTIPC_SHARING_STRATEGY"] == "file_descriptor", "children inherit it"
        ctx = zctipc.get_context("spawn")
        inq, outq = zctipc.Queue(), zctipc.Queue()
        before = set(os.listdir(SHM))
        p = ctx.Process(target=_workers.echo, args=(inq, outq, 2))
        p.start()
        t = zctipc.create_shared_tensor(data=np.arange(10.0))
        assert t.name.startswith("zctipc-fd-")
        inq.put(t.numpy())
        inq.put({"a": np.arange(5)})
        first, second = outq.get(timeout=60), outq.get(timeout=60)
        assert first.tolist() == list(range(10)) and zctipc.is_shared(first)
        assert second["a"].tolist() == list(range(5))
        p.join(60)
        parent, child = ctx.Pipe()
        q = ctx.Process(target=_workers.read_from_pipe, args=(child,))
        q.start()
        a = zctipc.empty(4)
        a[:] = 1
        parent.send(a)
        assert parent.recv() is True, "it went by descriptor"
        assert a[0] == 9, "and the child wrote into our memory"
        q.join(60)
        assert {n for n in os.listdir(SHM) if n.startswith("zctipc")} <= before
        del first, second, a
        t.close()
        inq.close()
        outq.close()
    finally:
        zctipc.set_sharing_strategy("file_system")
