"""Attacks on torch.multiprocessing's process face (zctipc.spawning) with
real processes: ranks that raise what is hard to report, ranks that cannot
start, joins from two threads or interrupted, ranks stopped or killed,
parents killed under ranks and under ranks of ranks, the traceback files
on every path, the environment, the import order, and torch's names for
what failed. The ranks' functions are in _spawn_attack_workers.py.

Nothing here asserts a timing: hangs are caught by timeouts far above what
the behaviour needs."""

import gc
import importlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time

import _spawn_attack_workers as w
import pytest
from _procs import exited
from conftest import HERE, library_files, own_ledgers, wait_until_gone, with_pythonpath

import zctipc as mp

# Far above anything the behaviour needs: only a hang reaches it.
HANG = 60
ENV = dict(os.environ, PYTHONPATH=with_pythonpath(HERE))


def error_files():
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("zctipc-spawn-")}


@pytest.fixture
def leaves_nothing():
    """The test leaves no zctipc file in the segment directory (once the
    daemon has swept the ranks that were killed), no traceback file, and no
    child running."""
    before, files = library_files(), error_files()
    yield
    gc.collect()
    assert mp.active_children() == []
    left = wait_until_gone(library_files() - before - own_ledgers())
    assert left == [], left
    assert error_files() - files == set()


def settle(condition, timeout=HANG):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def kill_all(pids):
    """Kill what a failed test left running."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_parent(call, stderr_path):
    """Run ``_spawn_attack_workers.<call>`` as a program that prints pids and
    dies of SIGKILL; return the words it printed."""
    with open(stderr_path, "w") as err:
        parent = subprocess.Popen(
            [sys.executable, "-c", f"import _spawn_attack_workers as w; w.{call}"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=ENV,
        )
        words = parent.stdout.readline().split()
        parent.stdout.close()  # the ranks hold it too
        assert parent.wait(HANG) == -signal.SIGKILL, open(stderr_path).read()
    return words


# -- what a rank raises ---------------------------------------------------------------------


def test_a_rank_raising_a_base_exception_raises_its_traceback(leaves_nothing):
    """Not only an Exception: any exception a rank's function raises but
    SystemExit comes back as ProcessRaisedException with its traceback."""
    with pytest.raises(mp.ProcessRaisedException) as info:
        mp.spawn(w.raise_kind, args=("halt",), start_method="forkserver")
    assert info.value.error_index == 0
    assert "_spawn_attack_workers.Halt: halted on purpose" in str(info.value)


@pytest.mark.parametrize(
    "kind, last_line",
    [
        ("not-picklable", "_spawn_attack_workers.NotPicklable: holds a lock"),
        ("bad-str", "_spawn_attack_workers.BadStr: <exception str() failed>"),
    ],
)
def test_an_exception_that_cannot_be_pickled_or_printed_is_reported(kind, last_line, leaves_nothing):
    with pytest.raises(mp.ProcessRaisedException) as info:
        mp.spawn(w.raise_kind, args=(kind,), start_method="forkserver")
    assert str(info.value).rstrip().endswith(last_line)


@pytest.mark.parametrize("code, exit_code", [(0, None), (None, None), ("a message", 1), (4, 4)])
def test_system_exit_is_an_exit_code_as_in_torch(code, exit_code, leaves_nothing):
    if exit_code is None:
        assert mp.spawn(w.exit_with, args=(code,), nprocs=2, start_method="forkserver") is None
        return
    with pytest.raises(mp.ProcessExitedException) as info:
        mp.spawn(w.exit_with, args=(code,), nprocs=1, start_method="forkserver")
    e = info.value
    assert (e.error_index, e.exit_code, e.signal_name) == (0, exit_code, None)
    assert str(e) == f"process 0 terminated with exit code {exit_code}"


def test_all_ranks_failing_at_once_raise_one_rank_and_leave_no_file(leaves_nothing):
    ctx = mp.start_processes(w.fail, nprocs=3, join=False, start_method="forkserver")
    with pytest.raises(mp.ProcessRaisedException) as info:
        while not ctx.join():
            pass
    e = info.value
    assert f"ValueError: rank {e.error_index} fails" in str(e)
    assert e.error_pid == ctx.pids()[e.error_index]
    assert all(exited(pid) for pid in ctx.pids())
    assert not any(os.path.exists(f) for f in ctx.error_files)


# -- ranks that cannot start ----------------------------------------------------------------


@pytest.mark.parametrize(
    "fn, args, error",
    [(lambda rank: None, (), pickle.PicklingError), (w.do_nothing, (threading.Lock(),), TypeError)],
    ids=["fn", "args"],
)
def test_what_cannot_be_pickled_starts_no_rank(fn, args, error, leaves_nothing):
    with pytest.raises(error):
        mp.spawn(fn, args=args, nprocs=2, start_method="forkserver")


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_arguments_a_rank_cannot_unpickle_raise_the_ranks_traceback(method, leaves_nothing):
    """Pickled in the parent, they fail in the rank before its function
    runs: the parent says why, not only "exit code 1"."""
    with pytest.raises(mp.ProcessRaisedException) as info:
        mp.spawn(w.do_nothing, args=(w.LoadsNowhere(),), nprocs=2, start_method=method)
    assert "ValueError: this argument cannot be loaded in a rank" in str(info.value)


def test_a_start_that_fails_after_a_rank_failed_leaves_no_traceback_file(leaves_nothing):
    """Rank 1's arguments fail to pickle once rank 0 has failed and written
    its traceback: the start raises, and the file goes with the ranks."""
    pids = mp.Queue()
    with pytest.raises(RuntimeError, match="rank 1's arguments cannot be pickled"):
        mp.spawn(w.say_pid_and_fail, args=(pids, w.SecondPickleFails(pids)), nprocs=2, start_method="forkserver")


@pytest.mark.parametrize(
    "nprocs, error", [(-1, mp.InvalidArgument), (2.0, TypeError), ("2", TypeError), (None, TypeError)]
)
def test_nprocs_must_be_a_count(nprocs, error, leaves_nothing):
    with pytest.raises(error, match="nprocs"):
        mp.spawn(w.do_nothing, nprocs=nprocs)


def test_no_ranks_is_nothing_to_do(leaves_nothing):
    assert mp.spawn(w.do_nothing, nprocs=0) is None
    ctx = mp.start_processes(w.do_nothing, nprocs=0, join=False)
    assert ctx.join(timeout=0) is True and ctx.pids() == []


# -- joining --------------------------------------------------------------------------------


def test_join_with_timeout_zero_polls_and_a_joined_context_stays_joined(leaves_nothing):
    ready, forever = mp.Queue(), mp.Queue()
    ctx = mp.start_processes(w.say_and_block, args=(ready, forever), nprocs=2, join=False, start_method="forkserver")
    for _ in range(2):
        ready.get(timeout=HANG)
    assert [ctx.join(timeout=0) for _ in range(100)] == [False] * 100
    forever.put(None)
    forever.put(None)
    assert settle(lambda: ctx.join(timeout=0))
    assert [ctx.join(), ctx.join(timeout=0), ctx.join(grace_period=0)] == [True] * 3


@pytest.mark.slow
def test_join_from_two_threads_raises_the_failure_in_both(leaves_nothing):
    """Both threads wait on the same ranks: neither fails on the other's
    bookkeeping, and both see the rank that failed."""
    for _ in range(3):
        ctx = mp.start_processes(w.fail_after, args=(0.5,), nprocs=2, join=False, start_method="forkserver")
        results = {}

        def join(name, ctx=ctx, results=results):
            try:
                while not ctx.join():
                    pass
                results[name] = "joined"
            except BaseException as e:  # noqa: BLE001  (what each thread saw)
                results[name] = e

        threads = [threading.Thread(target=join, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(HANG)
        assert [type(results[i]) for i in range(2)] == [mp.ProcessRaisedException] * 2, results
        assert results[0] is results[1]


@pytest.mark.slow
def test_a_rank_stopped_then_killed_is_reported_as_killed(leaves_nothing):
    ready, forever = mp.Queue(), mp.Queue()
    ctx = mp.start_processes(w.say_and_block, args=(ready, forever), nprocs=2, join=False, start_method="forkserver")
    pids = dict(ready.get(timeout=HANG) for _ in range(2))
    os.kill(pids[1], signal.SIGSTOP)
    assert ctx.join(timeout=0.2) is False  # stopped is not ended
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(mp.ProcessExitedException) as info:
        while not ctx.join():
            pass
    e = info.value
    assert (e.error_index, e.error_pid, e.exit_code, e.signal_name) == (1, pids[1], -9, "SIGKILL")
    assert all(exited(pid) for pid in pids.values())


@pytest.mark.slow
def test_a_stopped_rank_is_killed_after_the_grace_period(leaves_nothing):
    """A stopped rank cannot act on SIGTERM: SIGKILL ends it."""
    ready, forever = mp.Queue(), mp.Queue()
    ctx = mp.start_processes(w.stop_or_fail, args=(ready, forever), nprocs=2, join=False, start_method="forkserver")
    pids = dict(ready.get(timeout=HANG) for _ in range(2))
    assert settle(lambda: open(f"/proc/{pids[0]}/stat").read().rsplit(")", 1)[1].split()[0] == "T")
    forever.put("fail")
    with pytest.raises(mp.ProcessRaisedException, match="rank 1 fails while rank 0 is stopped"):
        while not ctx.join(grace_period=0.2):
            pass
    assert ctx.processes[0].exitcode == -signal.SIGKILL
    assert all(exited(pid) for pid in pids.values())


class Interrupts:
    """SIGINT for the main thread, sent by another: KeyboardInterrupt while
    armed, nothing once the test has disarmed it."""

    def __init__(self):
        self.main, self.armed = threading.get_ident(), True
        self.previous = signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum, frame):
        if self.armed:
            raise KeyboardInterrupt

    def send(self):
        signal.pthread_kill(self.main, signal.SIGINT)

    def disarm(self):
        self.armed = False
        signal.signal(signal.SIGINT, self.previous)


def test_a_join_interrupted_while_it_ends_the_ranks_kills_them_and_raises_later(leaves_nothing):
    """KeyboardInterrupt while the ranks get their grace period: they are
    killed at once, and the next join raises the rank that failed, not True."""
    ready, go, forever = mp.Queue(), mp.Queue(), mp.Queue()
    ctx = mp.start_processes(
        w.stubborn_or_fail, args=(ready, go, forever), nprocs=2, join=False, start_method="forkserver"
    )
    pids = dict(ready.get(timeout=HANG) for _ in range(2))
    interrupts = Interrupts()

    def interrupt():  # once rank 1 has failed and been reaped: the parent is ending rank 0
        if settle(lambda: not os.path.exists(f"/proc/{pids[1]}")):
            interrupts.send()

    go.put(None)
    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            while not ctx.join(grace_period=HANG):
                pass
        interrupts.disarm()
        interrupter.join()
        assert ctx.processes[0].exitcode == -signal.SIGKILL and all(exited(pid) for pid in pids.values())
        with pytest.raises(mp.ProcessRaisedException, match="RuntimeError: rank 1 fails"):
            ctx.join()
    finally:
        interrupts.disarm()
        kill_all(pids.values())
        for p in ctx.processes:
            p.join()


@pytest.mark.slow
def test_an_interrupted_spawn_ends_its_ranks(leaves_nothing):
    """KeyboardInterrupt in the parent while spawn waits (as when only the
    parent gets SIGINT): the ranks are given time to end, and a second
    interrupt kills them; they are reaped before spawn raises."""
    ready, forever = mp.Queue(), mp.Queue()
    pids = []
    interrupts = Interrupts()
    stop = threading.Event()

    def interrupt():
        pids.extend(pid for _, pid in (ready.get(timeout=HANG) for _ in range(2)))
        while not stop.wait(0.2):  # until spawn has raised: the first may come before it waits
            interrupts.send()

    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            mp.spawn(w.say_and_block, args=(ready, forever), nprocs=2, start_method="forkserver")
        interrupts.disarm()
        stop.set()
        interrupter.join()
        assert len(pids) == 2 and all(exited(pid) for pid in pids)
    finally:
        interrupts.disarm()
        stop.set()
        kill_all(pids)
        for p in mp.active_children():
            p.join()


# -- parents that die -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_ranks_that_find_their_parent_gone_as_they_start_end_quietly(method, tmp_path, leaves_nothing):
    """The parent dies before its ranks run: each sees it gone at once and
    ends without a KeyboardInterrupt traceback, wherever SIGINT lands."""
    pids = [int(pid) for pid in run_parent(f"die_as_ranks_start({method!r}, 4)", tmp_path / "stderr")]
    try:
        assert settle(lambda: all(exited(pid) for pid in pids)), "a rank outlived its parent"
        assert "KeyboardInterrupt" not in (tmp_path / "stderr").read_text()
    finally:
        kill_all(pids)


@pytest.mark.slow
def test_ranks_of_a_rank_end_when_the_outer_parent_dies(tmp_path, leaves_nothing):
    """The rank in the middle gets KeyboardInterrupt in its own spawn,
    which ends the inner ranks (else it would wait for them at exit, and
    they for it, for ever)."""
    pids = [int(pid) for pid in run_parent("die_under_nested_ranks('forkserver')", tmp_path / "stderr")]
    assert len(pids) == 3
    try:
        assert settle(lambda: all(exited(pid) for pid in pids)), [pid for pid in pids if not exited(pid)]
    finally:
        kill_all(pids)


@pytest.mark.slow
def test_an_orphaned_rank_that_raises_leaves_no_traceback_file(tmp_path, leaves_nothing):
    """A rank whose parent died turns its KeyboardInterrupt into another
    error: nobody will read its traceback, so none is written."""
    words = run_parent("die_under_converting_rank('forkserver')", tmp_path / "stderr")
    error_file, pid = words[0], int(words[1])
    try:
        assert settle(lambda: exited(pid))
        assert not os.path.exists(error_file) and not os.path.exists(error_file + ".part")
    finally:
        kill_all([pid])
        for name in (error_file, error_file + ".part"):
            if os.path.exists(name):
                os.unlink(name)


@pytest.mark.slow
def test_ranks_holding_zctipc_memory_when_killed_leave_nothing(leaves_nothing):
    ready, barrier, forever = mp.Queue(), mp.get_context("forkserver").Barrier(2), mp.Queue()
    with pytest.raises(mp.ProcessRaisedException, match="rank 1 fails while rank 0 holds zctipc memory"):
        mp.spawn(w.hold_and_block, args=(ready, barrier, forever), nprocs=2, start_method="forkserver")
    pids = dict(ready.get(timeout=HANG) for _ in range(2))
    assert all(exited(pid) for pid in pids.values())
    ready.close()
    forever.close()


# -- daemons, ranks of ranks, imports, the environment ---------------------------------------


def test_daemon_ranks_are_daemons_and_cannot_start_processes(leaves_nothing):
    ctx = mp.start_processes(w.do_nothing, nprocs=2, join=False, daemon=True, start_method="forkserver")
    assert [p.daemon for p in ctx.processes] == [True, True]
    while not ctx.join():
        pass
    with pytest.raises(mp.ProcessRaisedException, match="daemonic processes are not allowed to have children"):
        mp.spawn(w.start_child, daemon=True, start_method="forkserver")


def test_a_rank_can_spawn_ranks_of_its_own(leaves_nothing):
    queue = mp.Queue()
    mp.spawn(w.spawn_inner, args=(queue, "forkserver"), nprocs=1, start_method="forkserver")
    got = [queue.get(timeout=HANG) for _ in range(3)]
    assert sorted(rank for rank, _ in got[:2]) == [0, 1] and got[2] == ("outer", 0)


@pytest.mark.parametrize(
    "imports",
    [
        "import zctipc.spawning; import zctipc",
        "import zctipc; import zctipc.spawning",
        "from zctipc.spawning import spawn; import zctipc",
        "import zctipc; from zctipc import *",
    ],
)
@pytest.mark.slow
def test_zctipc_spawn_is_the_function_in_any_import_order(imports):
    check = "import types; assert type(zctipc.spawn) is types.FunctionType and zctipc.spawn is zctipc.spawning.spawn"
    subprocess.run([sys.executable, "-c", f"{imports}; {check}"], env=ENV, check=True, timeout=HANG)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_zctipc_spawn_is_the_function_in_a_rank(method, leaves_nothing):
    queue = mp.Queue()
    mp.spawn(w.which_spawn, args=(queue,), start_method=method)
    assert queue.get(timeout=HANG) == ("function", "zctipc.spawning", "module")


@pytest.mark.slow
def test_forkserver_ranks_see_the_environment_of_the_call(monkeypatch, leaves_nothing):
    """As spawn's do (and torch's spawn, which always spawns): not the
    environment the fork server started with."""
    queue, name = mp.Queue(), "SPAWN_ATTACK_ENV_PROBE"
    seen = []
    for value in ("first", "second", None):
        if value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
        mp.spawn(w.say_env, args=(queue, name), start_method="forkserver")
        seen.append(queue.get(timeout=HANG))
    assert seen == ["first", "second", None]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_script_without_a_main_guard_fails_clearly(method, tmp_path):
    """Each rank runs the script again as it starts, and that spawn is
    refused: the program fails, naming the idiom, and does not hang."""
    script = tmp_path / "no_guard.py"
    script.write_text(
        "import zctipc as mp\nimport _spawn_attack_workers as w\n"
        f"mp.spawn(w.do_nothing, nprocs=2, start_method={method!r})\n"
    )
    ran = subprocess.run([sys.executable, str(script)], env=ENV, capture_output=True, text=True, timeout=HANG)
    assert ran.returncode == 1
    assert "if __name__ == '__main__':" in ran.stderr
    assert "zctipc.errors.ProcessExitedException: process" in ran.stderr


# -- torch's names --------------------------------------------------------------------------


def test_the_exceptions_have_torchs_fields_and_messages(leaves_nothing):
    tm = importlib.import_module("torch.multiprocessing.spawn")  # the module; torch.multiprocessing.spawn: the function
    fields = ("msg", "error_index", "error_pid", "exit_code", "signal_name", "args")

    def same(a, b):
        assert type(a).__name__ == type(b).__name__ and str(a) == str(b)
        assert [getattr(a, f, None) for f in fields] == [getattr(b, f, None) for f in fields]

    for ours, theirs, args in [
        (mp.ProcessRaisedException, tm.ProcessRaisedException, ("trace", 1, 1234)),
        (mp.ProcessExitedException, tm.ProcessExitedException, ("killed", 1, 99, -9, "SIGKILL")),
        (mp.ProcessExitedException, tm.ProcessExitedException, ("exited", 0, 99, 3)),
    ]:
        same(ours(*args), theirs(*args))
        same(pickle.loads(pickle.dumps(ours(*args))), theirs(*args))
    with pytest.raises(mp.ProcessExitedException) as info:
        mp.spawn(w.exit_with, args=(3,), start_method="forkserver")
    e = info.value
    same(e, tm.ProcessExitedException("process 0 terminated with exit code 3", 0, e.pid, 3))
