"""Fixtures shared by the Python tests.

The session fixture ``no_leaked_segments`` runs once around the whole suite
and fails the run if any file of the library is left in /dev/shm that was
not there before (once the cleanup daemon has swept the processes the tests
killed).
"""

import os
import time
import uuid

import pytest

import zctipc

SHM = "/dev/shm"
PREFIX = "zctipc_"
# How long the cleanup daemon may take to sweep a killed process.
SWEEP_TIMEOUT = 15


def library_files():
    """The library's files in /dev/shm: segments, and segments being made."""
    return {name for name in os.listdir(SHM) if name.startswith(PREFIX) or name.startswith("zctipc-")}


def own_ledgers():
    """This process's ledger, which goes when it exits."""
    return {s.name for s in zctipc.list_segments() if s.kind == "ledger" and s.creator_pid == os.getpid()}


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
    left = wait_until_gone(library_files() - before - own_ledgers())
    if left:
        pytest.fail(f"the test suite left {len(left)} zctipc files in {SHM}: {left[:10]}", pytrace=False)


@pytest.fixture
def segname(request):
    """A segment name no other test uses."""
    return f"pytest_{request.node.name[:40]}_{uuid.uuid4().hex[:12]}".replace("[", "_").replace("]", "_").replace("-", "_")


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
