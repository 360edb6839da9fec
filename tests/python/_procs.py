"""What tests share to drive other processes and threads: Python children
run from a string of code, a Go example program that echoes a queue, and
threads blocked in zctipc's calls that a close must end."""

import contextlib
import subprocess
import sys
import textwrap
import threading
import time

import zctipc


def python(*argv, env, timeout):
    """Run ``python ARGV...`` to its end, its output captured as text; it
    must exit 0. The finished process (stdout, stderr)."""
    out = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out


#: Seconds a program file run by run_program may take: the machine may be loaded.
PROGRAM_TIMEOUT = 120


def run_program(tmp_path, env, program, *args):
    """Run program (Python source, dedented) as a file in tmp_path with env
    and args; the finished process, whatever its return code (succeeded
    checks it)."""
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(program))
    return subprocess.run(
        [sys.executable, str(path), *args], env=env, capture_output=True, text=True, timeout=PROGRAM_TIMEOUT
    )


def succeeded(out):
    """out's stdout lines, after checking that it exited cleanly: a return
    code of 0, and no traceback or fatal error on stderr."""
    assert out.returncode == 0, f"rc {out.returncode}: {out.stdout}{out.stderr}"
    assert "Traceback" not in out.stderr and "Fatal Python error" not in out.stderr, out.stderr
    return out.stdout.splitlines()


# What forking() runs before its code: in_child(body) forks, runs body() in
# the child (killed by SIGALRM after alarm seconds, so that a hang shows as
# "killed:14") and returns what it said; kinds(*calls) says what each call
# raised ("ok" when nothing), comma-joined; queue_calls and stream_calls
# make the calls of a queue's and a stream's that a child must not make.
FORK_PRELUDE = """
import gc, os, signal, sys, threading, time
import numpy as np
import zctipc
from zctipc import errors

def kinds(*calls):
    said = []
    for call in calls:
        try:
            call()
            said.append("ok")
        except BaseException as e:
            said.append(type(e).__name__)
    return ",".join(said)

def in_child(body, alarm=20):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(alarm)
        try:
            out = body()
        except BaseException as e:
            out = "raised:" + type(e).__name__
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    out = os.read(r, 1 << 16).decode()
    os.close(r)
    return out if os.WIFEXITED(status) else "killed:%d" % os.WTERMSIG(status)

def queue_calls(q):
    return kinds(lambda: q.put(1), lambda: q.get(timeout=1), lambda: q.get(block=False),
                 lambda: q.put(np.zeros(4)), lambda: q.put(np.zeros(1 << 16)))

def stream_calls(w, rd):
    return kinds(lambda: rd.read(timeout=1), lambda: w.write(np.zeros(4, np.float32)),
                 lambda: rd.look(timeout=1), lambda: w.look(timeout=1), lambda: next(iter(rd)))

FE5 = ",".join(["ForkedProcessError"] * 5)
"""


def forking(code, timeout=90):
    """Run code (indented as a test writes it) in a Python child after
    FORK_PRELUDE, to its end; it must exit 0. What it printed, split."""
    out = subprocess.run(
        [sys.executable, "-c", FORK_PRELUDE + textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@contextlib.contextmanager
def held(code, *args, env):
    """A Python child that runs code with args, its stdin and stdout pipes
    of text, for the block; killed if it runs still when the block ends."""
    p = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def killed_at_random(code, *args, env, rng):
    """Run a Python child that runs code with args and prints "ready", and
    SIGKILL it a random moment (up to 30 ms, from rng) after it did."""
    child = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline() == "ready\n"
        threading.Event().wait(rng.uniform(0, 0.03))
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def go_on(p):
    """Tell a child that waits for a line on its stdin (held) to go on."""
    p.stdin.write("\n")
    p.stdin.flush()


def go_echo(consumer, sent, timeout=60):
    """Put each of sent, then b"done", into a queue that the Go example
    consumer (its path) echoes into another, and get them back: (what came
    back, the program's stdout). The program exits 0."""
    there, back = zctipc.Queue(), zctipc.Queue()
    echo = subprocess.Popen([consumer, "echo", there.name, back.name], stdout=subprocess.PIPE, text=True)
    try:
        for a in sent:
            there.put(a)
        there.put(b"done")
        got = [back.get(timeout=timeout) for _ in sent]
        assert back.get(timeout=timeout) == b"done"
        out, _ = echo.communicate(timeout=timeout)
        assert echo.returncode == 0
        return got, out
    finally:
        echo.kill()
        echo.wait()
        there.close()
        back.close()


def closed_while_blocked(call, close, n, hang, asleep=0.3):
    """Start n threads that each call call(), give them asleep seconds to
    fall asleep in it, call close(), and join each for up to hang seconds:
    what each call came to ("returned", "closed" for HandleClosed, or the
    exception it raised) and the threads that run still."""
    outcome = []

    def block():
        try:
            call()
            outcome.append("returned")
        except zctipc.HandleClosed:
            outcome.append("closed")
        except BaseException as e:
            outcome.append(e)

    threads = [threading.Thread(target=block, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    time.sleep(asleep)
    close()
    for t in threads:
        t.join(hang)
    return outcome, [t for t in threads if t.is_alive()]


def settle(condition, timeout=60, every=0.002):
    """Wait until condition() holds, looking every so often; False if it
    did not within timeout seconds (by default far above what any behaviour
    needs: only a hang reaches it)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def exited(pid):
    """Whether pid has exited (a zombie nobody reaped has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped, before the open or the read
        return True
