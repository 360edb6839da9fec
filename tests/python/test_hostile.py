"""What other processes of the same user can do to zctipc, on purpose or by
accident, and what zctipc does about it: a stopped daemon, a segment file
shrunk under its holders."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import daemon_pid


def start(code, env):
    """A Python process running code, with line-oriented stdin and stdout."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(code, env, timeout=60):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=timeout
    )


HOLDER = """
    import sys, zctipc
    t = zctipc.create_shared_tensor(shape=4)
    print(t.name, flush=True)
    sys.stdin.readline()
"""


@pytest.fixture
def stopped_daemon(isolated):
    """A daemon that answers no more (SIGSTOP), with a client it watches."""
    holder = start(HOLDER, isolated)
    holder.stdout.readline()
    pid = daemon_pid(isolated["ZCTIPC_RUNTIME_DIR"])
    assert pid, "the holder started a daemon"
    os.kill(pid, signal.SIGSTOP)
    yield isolated
    os.kill(pid, signal.SIGCONT)
    holder.communicate("\n", timeout=30)


@pytest.mark.slow
def test_a_stopped_daemon_delays_a_new_client_but_a_moment(stopped_daemon):
    start_time = time.monotonic()
    out = run(
        """
        import numpy as np, zctipc
        t = zctipc.create_shared_tensor(data=np.arange(10))
        q = zctipc.Queue()
        q.put({"a": np.ones(3)}); print(q.get()["a"].sum(), t.numpy()[9])
        q.close(); t.close()
    """,
        stopped_daemon,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3.0", "9"], "file_system works without the daemon"
    assert "crash cleanup is not running" in out.stderr and "did not answer" in out.stderr, out.stderr
    assert out.stderr.count("crash cleanup is not running") == 1, "warned once"
    assert time.monotonic() - start_time < 20, "bounded: every exchange with the daemon has a deadline"


@pytest.mark.slow
def test_a_stopped_daemon_is_an_error_where_it_is_needed(stopped_daemon):
    env = dict(stopped_daemon, ZCTIPC_SHARING_STRATEGY="file_descriptor")
    start_time = time.monotonic()
    out = run(
        """
        import zctipc
        try:
            zctipc.create_shared_tensor(shape=4)
            print("made")
        except zctipc.DaemonUnavailable as e:
            print("DaemonUnavailable", isinstance(e, ConnectionError))
    """,
        env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["DaemonUnavailable", "True"], "memfd segments need the daemon to pass them"
    assert time.monotonic() - start_time < 20


CREATOR = """
    import sys, numpy as np, zctipc
    t = zctipc.create_shared_tensor(data=np.arange(1 << 16, dtype=np.float64))
    q = zctipc.Queue(max_bytes=1 << 16)
    q.put(np.ones(1000)); q.put(("a", "tuple"))
    print(t.name, q.name, flush=True)
    sys.stdin.readline()  # the files are shrunk now
    for what, fn in [("refcount", lambda: t.refcount), ("qsize", q.qsize), ("get", lambda: q.get(timeout=1)),
                     ("put", lambda: q.put(1))]:
        try:
            fn()
            print(what, "worked", flush=True)
        except zctipc.CorruptHeader as e:
            print(what, "CorruptHeader", "shrank" in str(e), flush=True)
"""


@pytest.mark.slow
def test_a_shrunk_segment_is_an_error_not_a_crash(isolated):
    creator = start(CREATOR, isolated)
    tensor, queue_name = creator.stdout.readline().split()
    reader = start(
        """
        import sys, zctipc
        t = zctipc.attach_shared_tensor(input())
        q = zctipc.Queue.attach(input())
        print("attached", flush=True)
        sys.stdin.readline()
        for what, fn in [("refcount", lambda: t.refcount), ("get", lambda: q.get(timeout=1))]:
            try:
                fn()
                print(what, "worked", flush=True)
            except zctipc.CorruptHeader:
                print(what, "CorruptHeader", flush=True)
    """,
        isolated,
    )
    reader.stdin.write(f"{tensor}\n{queue_name}\n")
    reader.stdin.flush()
    assert reader.stdout.readline().strip() == "attached"
    shm_dir = isolated["ZCTIPC_SHM_DIR"]
    for name in (tensor, queue_name):  # a hostile (or buggy) process of the same user
        os.truncate(os.path.join(shm_dir, name), 0)
    out, err = reader.communicate("\n", timeout=60)
    assert reader.returncode == 0, err
    assert out.split() == ["refcount", "CorruptHeader", "get", "CorruptHeader"]
    out, err = creator.communicate("\n", timeout=60)
    assert creator.returncode == 0, f"the creator exits cleanly: {err}"
    assert out.split() == [
        "refcount",
        "CorruptHeader",
        "True",
        "qsize",
        "CorruptHeader",
        "True",
        "get",
        "CorruptHeader",
        "True",
        "put",
        "CorruptHeader",
        "True",
    ]
    assert "Traceback" not in err and "fatal error" not in err, err
    # What the shrunk files held is lost: zctipc gc removes what is left.
    gc = subprocess.run(
        [sys.executable, "-m", "zctipc", "gc"], env=isolated, capture_output=True, text=True, timeout=60
    )
    assert gc.returncode == 0, gc.stderr
    deadline = time.monotonic() + 15
    while os.listdir(shm_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.listdir(shm_dir) == []


def test_a_view_of_a_shrunk_segment_faults_in_the_users_code(isolated):
    """zctipc cannot guard the user's own reads of a NumPy view: a segment a
    hostile process shrank raises SIGBUS there, as docs/format.md says."""
    out = run(
        """
        import os, numpy as np, zctipc
        t = zctipc.create_shared_tensor(data=np.arange(1 << 16, dtype=np.float64))
        a = t.numpy()
        os.truncate(os.path.join(os.environ["ZCTIPC_SHM_DIR"], t.name), 0)
        print(a.sum())
    """,
        isolated,
    )
    assert out.returncode == -signal.SIGBUS


def test_memfd_segments_cannot_be_shrunk(isolated):
    env = dict(isolated, ZCTIPC_SHARING_STRATEGY="file_descriptor")
    holder = start(
        """
        import sys, numpy as np, zctipc
        t = zctipc.create_shared_tensor(data=np.arange(1 << 16, dtype=np.float64))
        print(flush=True)
        sys.stdin.readline()
        print(t.numpy().sum(), flush=True)
    """,
        env,
    )
    holder.stdout.readline()
    fds = [os.path.join(f"/proc/{holder.pid}/fd", fd) for fd in os.listdir(f"/proc/{holder.pid}/fd")]
    memfds = [fd for fd in fds if "memfd:zctipc" in os.readlink(fd)]
    assert memfds
    for fd in memfds:
        with pytest.raises(PermissionError):
            os.truncate(fd, 0)  # sealed against shrinking
    out, err = holder.communicate("\n", timeout=60)
    assert holder.returncode == 0, err
    assert float(out.split()[-1]) == float(sum(range(1 << 16)))
