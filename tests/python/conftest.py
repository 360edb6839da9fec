"""Fixtures shared by the Python tests.

The session fixture ``no_leaked_segments`` runs once around the whole suite
and fails the run if any file of the library is left in /dev/shm that was
not there before (once the cleanup daemon has swept the processes the tests
killed).
"""

import fcntl
import gc
import os
import shutil
import signal
import tempfile
import time
import uuid

import pytest

# Note [a worker's own directories]: make pytest runs the suite in two
# pytest-xdist workers (PYTEST_WORKERS). Each gives itself a segment directory
# on /dev/shm's tmpfs and a runtime directory (so a cleanup daemon) of its
# own, set before zctipc is imported, for itself and every process its
# tests start: one worker's files never show in the other's leak checks,
# and the session check below counts what this worker's tests left. A run
# that sets ZCTIPC_SHM_DIR itself keeps it.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
OWN_DIRS: tuple[str, str] | None = None
if WORKER and "ZCTIPC_SHM_DIR" not in os.environ:
    OWN_DIRS = (
        tempfile.mkdtemp(prefix=f"pytest-{WORKER}-", dir="/dev/shm"),
        tempfile.mkdtemp(prefix=f"pytest-{WORKER}-run-"),
    )
    os.environ["ZCTIPC_SHM_DIR"], os.environ["ZCTIPC_RUNTIME_DIR"] = OWN_DIRS

# Ray starts its workers at nice 15. Beside the suite's other pytest-xdist
# worker, which keeps a core busy, a Ray worker started for a hand-off
# (the read task of a receive from another node) waited so long that the
# receive outlived Ray's 60 s transfer timeout. Every Ray cluster the tests
# start (test_ray.py's, the documentation's examples, the benchmark's) runs
# its workers at the suite's own priority.
os.environ.setdefault("RAY_worker_niceness", "0")

import zctipc  # noqa: E402  (after the worker's directories are set)

HERE = os.path.dirname(os.path.abspath(__file__))
# Where segments live: the library honours ZCTIPC_SHM_DIR, and so does the suite.
SHM = os.environ.get("ZCTIPC_SHM_DIR") or "/dev/shm"
PREFIX = "zctipc_"
# How long the cleanup daemon may take to sweep a killed process.
SWEEP_TIMEOUT = 15


def with_pythonpath(*dirs):
    """PYTHONPATH for a child: dirs, then the caller's own PYTHONPATH (which
    may point at a zctipc checkout other than the installed one)."""
    return os.pathsep.join(filter(None, [*dirs, os.environ.get("PYTHONPATH")]))


def library_files():
    """The library's files in /dev/shm: segments, and segments being made."""
    return {name for name in os.listdir(SHM) if name.startswith(PREFIX) or name.startswith("zctipc-")}


def slots_in_use():
    """Pool slots held in this process, once the garbage of earlier tests is
    collected: a baseline taken without collecting counts arrays that an
    earlier test left in reference cycles, and a later collection in the
    test then lets them go."""
    gc.collect()
    return zctipc.pool_stats().slots_in_use


def own_ledgers():
    """This process's ledger, which goes when it exits."""
    return {s.name for s in zctipc.list_segments() if s.kind == "ledger" and s.creator_pid == os.getpid()}


def left_in(env, timeout=SWEEP_TIMEOUT):
    """What is left in env's segment directory (the isolated fixture's)
    once the cleanup daemon has swept the processes that exited."""
    d = env["ZCTIPC_SHM_DIR"]
    deadline = time.monotonic() + timeout
    while os.listdir(d) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(os.listdir(d))


def wait_until_gone(names, timeout=SWEEP_TIMEOUT):
    """Wait until none of names is in /dev/shm, and return those left."""
    deadline = time.monotonic() + timeout
    while True:
        left = set(names) & library_files()
        if not left or time.monotonic() > deadline:
            return sorted(left)
        time.sleep(0.05)


@pytest.fixture(scope="session", autouse=True)
def no_leaked_segments():
    before = library_files()
    yield
    # This process lets go as it would at exit (its pool's arenas live as
    # long as it does); what is left then was leaked.
    zctipc.cleanup_all_segments()
    if OWN_DIRS is None:
        left = wait_until_gone(library_files() - before - own_ledgers())
    else:
        # Every file of the worker's own directory is its tests': wait for
        # all of them, those a process that ends late makes too, while the
        # daemon that sweeps them runs.
        shm_dir, run_dir = OWN_DIRS
        deadline = time.monotonic() + SWEEP_TIMEOUT
        while (left := sorted(set(os.listdir(shm_dir)) - own_ledgers())) and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = daemon_pid(run_dir)
        if pid:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(run_dir, ignore_errors=True)
        if not left:
            shutil.rmtree(shm_dir, ignore_errors=True)
    if left:
        pytest.fail(
            f"the test suite left {len(left)} zctipc files in {SHM}: {left[:10]}; {describe(left[:10])}",
            pytrace=False,
        )


def describe(names):
    """What the library says of each of names (its kind, and its creator
    and whether that runs, with the creator's command line), for a leak's
    report."""
    said = []
    for info in zctipc.list_segments():
        if info.name in names:
            try:
                with open(f"/proc/{info.creator_pid}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
            except OSError:
                command = "?"
            said.append(f"{info.name}: {info.kind}, creator {info.creator_pid} ({command}), alive {info.creator_alive}")
    return "; ".join(said) or "none of them is a segment the library reads"


@pytest.fixture
def segname(request):
    """A segment name no other test uses."""
    return (
        f"pytest_{request.node.name[:40]}_{uuid.uuid4().hex[:12]}".replace("[", "_").replace("]", "_").replace("-", "_")
    )


@pytest.fixture
def shm_file(request):
    """Write raw bytes into /dev/shm under a fresh library name, as a hostile
    or broken peer could; the file is removed after the test."""
    made = []

    def write(content, mode=0o600, name=None):
        name = name or f"{PREFIX}pytest_raw_{uuid.uuid4().hex[:12]}"
        path = os.path.join(SHM, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
        try:
            os.write(fd, content)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        made.append(path)
        return name

    yield write
    for path in made:
        if os.path.lexists(path):
            os.unlink(path)


@pytest.fixture(params=["spawn", "forkserver"])
def ctx(request):
    """A multiprocessing context of each start method zctipc supports."""
    return zctipc.get_context(request.param)


def segment_exists(name):
    return os.path.lexists(os.path.join(SHM, name if name.startswith(PREFIX) else PREFIX + name))


@pytest.fixture
def isolated(tmp_path):
    """A segment directory on /dev/shm and a runtime directory of its own,
    as an environment for child processes. The daemon started for them is
    killed and both directories removed afterwards."""
    shm_dir = os.path.join(SHM, f"zctipc-pytest-{uuid.uuid4().hex[:12]}")
    os.mkdir(shm_dir, 0o700)
    run_dir = str(tmp_path / "run")
    env = dict(
        os.environ,
        ZCTIPC_SHM_DIR=shm_dir,
        ZCTIPC_RUNTIME_DIR=run_dir,
        ZCTIPC_DAEMON_IDLE="2",
        PYTHONPATH=with_pythonpath(HERE),
    )
    env.pop("ZCTIPC_SHARING_STRATEGY", None)
    yield env
    pid = daemon_pid(run_dir)
    if pid:
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(shm_dir, ignore_errors=True)


def daemon_pid(run_dir):
    """The pid of the daemon serving run_dir, or None (read from its lock
    file, which it holds while it runs)."""
    try:
        with open(os.path.join(run_dir, "daemon.lock")) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return None  # nobody holds it
            except BlockingIOError:
                return int(f.read().strip())
    except FileNotFoundError:
        return None


def pytest_terminal_summary(terminalreporter):
    """Print the counts of CPython's multiprocessing tests run against
    zctipc (test_cpython_conformance.py), when they ran."""
    lines = [
        line
        for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", [])
        for name, value in getattr(report, "user_properties", ())
        if name == "conformance"
        for line in value
    ]
    if lines:
        terminalreporter.section("CPython's multiprocessing tests with zctipc")
        for line in lines:
            terminalreporter.write_line(line)
