"""torch.multiprocessing's process face (zctipc.spawning): spawn and
start_processes run fn(rank, *args) in zctipc's contexts, join as torch's
do, end every rank when one fails and raise the failure; and every name of
torch.multiprocessing is offered or listed in docs/pytorch-names.md."""

import gc
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import time

import _spawn_workers
import numpy as np
import pytest
import torch
import torch.multiprocessing
from _procs import exited
from conftest import HERE, library_files, own_ledgers, wait_until_gone, with_pythonpath

import zctipc as mp
from zctipc import spawning

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES_DOC = os.path.join(ROOT, "docs", "pytorch-names.md")


def error_files():
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("zctipc-spawn-")}


@pytest.fixture
def leaves_nothing():
    """The test leaves no zctipc file in the segment directory (once the
    daemon has swept the ranks that were killed), and no traceback file."""
    before, files = library_files(), error_files()
    yield
    gc.collect()  # the queues of a test whose frame a caught exception's traceback holds
    left = wait_until_gone(library_files() - before - own_ledgers())
    assert left == [], [(s.name, s.kind, s.creator_pid) for s in mp.list_segments() if s.name in left]
    assert error_files() - files == set()


def assert_reaped(pids):
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_each_rank_runs_fn_with_its_rank_and_args(method, leaves_nothing):
    queue = mp.Queue()
    assert mp.spawn(_spawn_workers.put_rank, args=(queue, "hello"), nprocs=3, start_method=method) is None
    got = sorted((queue.get(timeout=60) for _ in range(3)), key=lambda item: item[0])
    assert [(rank, arg) for rank, arg, _, _ in got] == [(0, "hello"), (1, "hello"), (2, "hello")]
    for rank, _, array, tensor in got:
        assert np.array_equal(array, np.full(1 << 18, rank, np.float32))
        assert torch.equal(tensor, torch.full((3, 4), float(rank)))
    del got, array, tensor
    queue.close()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_raising_rank_raises_its_traceback_and_the_others_are_ended(method, leaves_nothing):
    pids, barrier, forever = mp.Queue(), mp.get_context(method).Barrier(3), mp.Queue()
    with pytest.raises(mp.ProcessRaisedException) as info:
        mp.spawn(_spawn_workers.fail_or_block, args=(1, pids, barrier, forever), nprocs=3, start_method=method)
    e = info.value
    assert e.error_index == 1
    assert str(e).startswith(
        "\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):"
    )
    assert "_spawn_workers.py" in str(e) and "ValueError: rank 1 fails on purpose" in str(e)
    ranks = dict(pids.get(timeout=10) for _ in range(3))
    assert e.pid == e.error_pid == ranks[1]
    assert_reaped(ranks.values())


@pytest.mark.slow
def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace_period(leaves_nothing):
    barrier, forever = mp.get_context("spawn").Barrier(2), mp.Queue()  # held until the ranks have them
    ctx = mp.start_processes(_spawn_workers.stubborn_or_fail, args=(barrier, forever), nprocs=2, join=False)
    with pytest.raises(mp.ProcessRaisedException, match="RuntimeError: rank 1 fails"):
        while not ctx.join(grace_period=0.5):
            pass
    assert ctx.processes[0].exitcode == -9  # SIGTERM was ignored
    assert_reaped(ctx.pids())
    with pytest.raises(mp.ProcessRaisedException):  # a later join says it again
        ctx.join()


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_names_it(leaves_nothing):
    forever = mp.Queue()
    ctx = mp.start_processes(_spawn_workers.kill_self, args=(forever,), nprocs=3, join=False)
    with pytest.raises(mp.ProcessExitedException) as info:
        while not ctx.join():
            pass
    e = info.value
    assert (e.error_index, e.pid, e.exit_code, e.signal_name) == (1, ctx.pids()[1], -9, "SIGKILL")
    assert str(e) == "process 1 terminated with signal SIGKILL"
    assert_reaped(ctx.pids())


@pytest.mark.slow
def test_a_rank_that_exits_nonzero_says_its_code(leaves_nothing):
    with pytest.raises(mp.ProcessExitedException) as info:
        mp.spawn(_spawn_workers.exit_with, args=(3,), nprocs=2)
    e = info.value
    assert (e.error_index, e.exit_code, e.signal_name) == (0, 3, None)
    assert str(e) == "process 0 terminated with exit code 3"


@pytest.mark.slow
def test_an_interrupted_rank_whose_parent_lives_has_failed(leaves_nothing):
    with pytest.raises(mp.ProcessRaisedException, match="KeyboardInterrupt") as info:
        mp.spawn(_spawn_workers.interrupt_self, nprocs=2)
    assert info.value.error_index == 0


@pytest.mark.slow
def test_without_join_the_context_is_joined_until_all_are_done(leaves_nothing):
    event, queue = mp.Event(), mp.Queue()
    ctx = mp.start_processes(_spawn_workers.wait_for, args=(event, queue), nprocs=3, join=False)
    assert isinstance(ctx, mp.ProcessContext)
    assert len(ctx.processes) == 3 and len(set(ctx.pids())) == 3
    assert ctx.join(timeout=0.2) is False  # the ranks wait for the event
    event.set()
    while not ctx.join():
        pass
    assert ctx.join() is True
    assert sorted(queue.get(timeout=10) for _ in range(3)) == [0, 1, 2]
    assert [p.exitcode for p in ctx.processes] == [0, 0, 0]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_ranks_end_when_their_parent_dies(method, leaves_nothing):
    parent = subprocess.run(
        [sys.executable, "-c", f"import _spawn_workers; _spawn_workers.orphaned_ranks({method!r})"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=with_pythonpath(HERE)),
        timeout=120,
    )
    assert parent.returncode == -signal.SIGKILL, parent.stderr
    pids = [int(pid) for pid in parent.stdout.split()]
    assert len(pids) == 2, parent.stdout
    deadline = time.monotonic() + 30
    while not all(exited(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(exited(pid) for pid in pids), "a rank outlived its parent"
    assert "KeyboardInterrupt" not in parent.stderr  # the ranks end quietly


def test_fork_is_refused():
    for start in (mp.spawn, mp.start_processes):
        with pytest.raises(ValueError, match="zctipc does not support the 'fork' start method"):
            start(_spawn_workers.exit_with, args=(0,), start_method="fork")


def test_the_exceptions_pickle_with_their_fields():
    raised = mp.ProcessRaisedException("trace", 2, 1234)
    ended = mp.ProcessExitedException("killed", 1, 99, -9, "SIGKILL")
    for e in (raised, ended):
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is type(e) and vars(again) == vars(e) and str(again) == str(e)
    assert issubclass(mp.ProcessRaisedException, mp.ProcessException)
    assert issubclass(mp.ProcessException, mp.ZctipcError)


def test_spawn_context_is_the_old_name_of_process_context():
    with pytest.warns(FutureWarning, match="renamed to ProcessContext"):
        ctx = mp.SpawnContext([], [])
    assert isinstance(ctx, mp.ProcessContext) and ctx.join() is True


def test_spawn_is_the_function_whatever_was_imported():
    assert mp.spawn is spawning.spawn and mp.spawn.__name__ == "spawn"
    assert mp.start_processes is spawning.start_processes


def documented(heading):
    """The names in the first column of the table under heading."""
    with open(NAMES_DOC) as f:
        text = f.read()
    section = text.split(f"### {heading}\n", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row)}


def test_every_torch_multiprocessing_name_is_offered_or_documented():
    tm = torch.multiprocessing
    spawn_module = sys.modules["torch.multiprocessing.spawn"]  # tm.spawn is the function, as mp.spawn is
    names = set(tm.__all__) | set(spawn_module.__all__) | {n for n in dir(tm) if not n.startswith("_")}
    absent = documented("Not offered")
    for name in sorted(names):
        assert hasattr(mp, name) or name in absent, f"torch.multiprocessing.{name} is neither in zctipc nor listed"
    assert absent <= names, f"listed as not offered but not torch's: {sorted(absent - names)}"
    assert not [n for n in absent if hasattr(mp, n)], "listed as not offered but offered"
    differ = documented("Offered, with a difference")
    assert differ <= names and all(hasattr(mp, n) for n in differ), sorted(differ)
    for name in sorted(names - absent):  # the same kind of thing
        ours, theirs = getattr(mp, name), getattr(tm, name, None) or getattr(spawn_module, name)
        assert callable(ours) == callable(theirs), name
        if isinstance(theirs, type) and issubclass(theirs, BaseException):
            assert issubclass(ours, BaseException), name


def test_the_sharing_strategies_have_torchs_names():
    assert mp.get_all_sharing_strategies() == torch.multiprocessing.get_all_sharing_strategies()
    assert mp.get_sharing_strategy() in mp.get_all_sharing_strategies()
