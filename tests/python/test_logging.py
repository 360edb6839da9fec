"""zctipc's log (zctipc._core.log): DEBUG records of the standard library's
logger "zctipc" for what a process does with shared memory, none per
message, none formatted unless taken; ZCTIPC_LOG puts them on stderr; and
``import zctipc`` imports no logging (Note [a log that costs nothing
unasked]). Each case is a real program."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest
from conftest import daemon_pid, with_pythonpath

pytestmark = pytest.mark.slow


def run(env, tmp_path, program, **extra):
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(program))
    out = subprocess.run(
        [sys.executable, str(path)], env=dict(env, **extra), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out


def records(stderr):
    """(pid, level, message) of each record ZCTIPC_LOG's handler wrote."""
    return [m.groups() for m in re.finditer(r"^zctipc\[(\d+)\] (\w+): (.*)$", stderr, re.M)]


LIFE = """
import multiprocessing, os
import numpy as np
import zctipc


def child(q, out):
    out.put(q.get() + 1)


if __name__ == "__main__":
    print(os.getpid(), flush=True)
    t = zctipc.create_shared_tensor(None, data=np.arange(6.0).reshape(2, 3))
    name = t.name
    del t
    zctipc.empty(8 << 20, np.uint8)          # the pool grows by an arena for it
    q, out = zctipc.Queue(), zctipc.Queue()
    p = zctipc.get_context().Process(target=child, args=(q, out))
    p.start()
    q.put(np.zeros(4))
    print(name, p.pid, out.get(timeout=60).tolist(), flush=True)
    p.join()
    q.close()
"""


def test_zctipc_log_debug_says_what_the_process_does(isolated, tmp_path):
    out = run(isolated, tmp_path, LIFE, ZCTIPC_LOG="debug")
    parent, line = out.stdout.splitlines()
    name, child, got = line.split(" ", 2)
    assert got == "[1.0, 1.0, 1.0, 1.0]"
    mine = [message for pid, level, message in records(out.stderr) if pid == parent and level == "DEBUG"]
    text = "\n".join(mine)
    assert "loaded the package's libzctipc.so" in text
    assert re.search(r"crash cleanup on: .* cleanup daemon \(pid \d+, ", text), text
    if sys.version_info < (3, 14):
        assert "made forkserver multiprocessing's default start method" in text
    assert f"made segment {name}: float64[2, 3], 48 bytes" in mine
    assert f"let go of segment {name}" in mine
    assert re.search(r"^pool grew: arenas \d+, reserved \d+ bytes \(limit \d+\)", text, re.M), text
    queue = re.search(r"^made queue (zctipc_\w+): a ring of \d+ bytes, maxsize 0$", text, re.M)
    assert queue, text
    assert f"let go of queue {queue.group(1)}" in mine
    # The child inherits ZCTIPC_LOG, and says so under its own pid.
    theirs = [(level, message) for pid, level, message in records(out.stderr) if pid == child]
    assert ("DEBUG", f"attached queue {queue.group(1)}") in theirs, out.stderr
    assert "Warning" not in out.stderr, "a program that passes its context is not warned"


def test_zctipc_log_at_info_shows_no_debug_record_and_a_bad_level_is_said_on_stderr(isolated, tmp_path):
    out = run(isolated, tmp_path, LIFE, ZCTIPC_LOG="info")
    assert records(out.stderr) == []
    out = run(isolated, tmp_path, LIFE, ZCTIPC_LOG="chatty")
    assert records(out.stderr) == []
    assert "zctipc: ZCTIPC_LOG='chatty' names no level" in out.stderr and "Warning" not in out.stderr


def test_import_imports_no_logging_and_the_logger_follows_the_programs_configuration(isolated, tmp_path):
    out = run(
        isolated,
        tmp_path,
        """
        import sys
        import zctipc

        zctipc.Queue()
        print("logging" in sys.modules)      # nothing imported it: nothing could take a record

        import logging

        log = logging.getLogger("zctipc")
        zctipc.create_shared_tensor(None, shape=(2,), dtype="int8")
        print(any(isinstance(h, logging.NullHandler) for h in log.handlers))
        logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
        zctipc.create_shared_tensor(None, shape=(3,), dtype="int8")
        """,
    )
    assert out.stdout.split() == ["False", "True"]
    # The queue was let go as it was dropped, before logging was configured.
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("zctipc ")]
    assert len(lines) == 2 and "made segment" in lines[0] and "int8[3]" in lines[0], out.stderr
    assert "let go of segment" in lines[1]
    assert "int8[2]" not in out.stderr, "a record nobody took is not shown"


def test_no_record_per_message_and_none_formatted_when_nobody_takes_them(isolated, tmp_path):
    program = """
        import logging, os, sys
        import numpy as np
        import zctipc

        made = []
        real = logging.Logger.makeRecord

        def count(self, *args, **kwargs):
            made.append(args[4] if len(args) > 4 else "")
            return real(self, *args, **kwargs)

        logging.Logger.makeRecord = count
        if os.environ.get("DEBUG") == "1":
            logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(message)s")
        q = zctipc.Queue()
        for i in range(300):
            q.put({"a": np.full(1 << 16, i % 256, np.uint8), "t": zctipc.empty(1 << 12, np.uint8), "i": i})
            got = q.get()
            assert got["i"] == i and int(got["a"][0]) == i % 256
            del got
        q.close()
        print("records", len(made))
        """
    quiet = run(isolated, tmp_path, program)
    assert quiet.stdout.split()[-2:] == ["records", "0"], quiet.stdout
    loud = run(isolated, tmp_path, program, DEBUG="1")
    count = int(loud.stdout.split()[-1])
    assert 0 < count < 30, f"{count} records for 300 messages:\n{loud.stdout}"


@pytest.fixture
def small_shm(tmp_path):
    """An environment whose segments live in a 16 MiB tmpfs of their own."""
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount)], check=True)
    run_dir = str(tmp_path / f"run-{uuid.uuid4().hex[:8]}")
    env = dict(
        os.environ,
        ZCTIPC_SHM_DIR=str(mount),
        ZCTIPC_RUNTIME_DIR=run_dir,
        ZCTIPC_DAEMON_IDLE="2",
        PYTHONPATH=with_pythonpath(os.path.dirname(os.path.abspath(__file__))),
    )
    for name in ("ZCTIPC_POOL_LIMIT", "ZCTIPC_SHARING_STRATEGY", "ZCTIPC_CLEANUP"):
        env.pop(name, None)
    try:
        yield env
    finally:
        pid = daemon_pid(run_dir)
        if pid:
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_the_log_says_when_arrays_go_in_band_and_when_they_go_through_the_pool_again(small_shm, tmp_path):
    out = run(
        small_shm,
        tmp_path,
        """
        import numpy as np
        import zctipc
        from multiprocessing.reduction import ForkingPickler

        zctipc.empty(1)
        for a in (np.ones(5 << 17), np.ones(5 << 17), np.ones(1 << 17), np.ones(5 << 17)):  # 5, 5, 1, 5 MiB
            b = ForkingPickler.loads(ForkingPickler.dumps(a))
            assert b.sum() == a.size
            del b
        """,
        ZCTIPC_LOG="debug",
        PYTHONWARNINGS="ignore::RuntimeWarning",
    )
    messages = [m for _, _, m in records(out.stderr) if "band" in m or "through the pool" in m]
    assert len(messages) == 3, out.stderr
    assert messages[0].startswith("arrays go in band (pickled inside their messages) from now on: no pool buffer")
    assert messages[1] == "arrays go through the pool again: a buffer was found"
    assert messages[2].startswith("arrays go in band")
