"""The functions that tests/python/test_spawn_attacks.py runs as ranks, and
the parents it runs as programs (importable under spawn and forkserver):
each rank is called as fn(rank, *args). NumPy and torch are not imported,
so that a rank starts quickly."""

import os
import signal
import sys
import threading
import time

import zctipc


class Halt(BaseException):
    """Neither an Exception nor KeyboardInterrupt nor SystemExit."""


class NotPicklable(Exception):
    """An exception holding a lock: it cannot be pickled."""

    def __init__(self):
        super().__init__("holds a lock")
        self.lock = threading.Lock()


class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("str() fails")


RAISES = {"halt": Halt("halted on purpose"), "not-picklable": NotPicklable(), "bad-str": BadStr()}


def raise_kind(rank, kind):
    raise RAISES[kind]


def exit_with(rank, code):
    sys.exit(code)


def do_nothing(rank, *args):
    pass


def fail(rank):
    raise ValueError(f"rank {rank} fails")


def say_pid(rank, queue):
    queue.put((rank, os.getpid()))


def fail_after(rank, delay):
    """Rank 1 raises after delay seconds; the others return then."""
    time.sleep(delay)
    if rank == 1:
        raise ValueError("rank 1 fails late")


def say_and_block(rank, ready, forever):
    ready.put((rank, os.getpid()))
    forever.get()


def stop_or_fail(rank, ready, forever):
    """Rank 0 stops itself (SIGSTOP) once it has said its pid; rank 1 raises
    once rank 0 is stopped (the parent says so through forever)."""
    ready.put((rank, os.getpid()))
    if rank == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
    if forever.get() == "fail":
        raise RuntimeError("rank 1 fails while rank 0 is stopped")


def stubborn_or_fail(rank, ready, go, forever):
    """Rank 0 ignores SIGTERM and blocks; rank 1 raises once told to go."""
    if rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.put((rank, os.getpid()))
    if rank == 1:
        go.get()
        raise RuntimeError("rank 1 fails")
    forever.get()


def hold_and_block(rank, ready, barrier, forever):
    """Hold a shared tensor, a pool buffer and a queue of its own, say so,
    and wait for the other rank; then rank 1 raises, rank 0 blocks."""
    import numpy as np

    held = (
        zctipc.create_shared_tensor(None, data=np.full(1000, rank, np.float64)),
        zctipc.empty((1 << 16,), np.uint8),
        zctipc.Queue(),
    )
    held[2].put(np.arange(1 << 16))
    ready.put((rank, os.getpid()))
    barrier.wait(60)
    if rank == 1:
        raise RuntimeError("rank 1 fails while rank 0 holds zctipc memory")
    forever.get()
    del held


def start_child(rank):
    """A rank that starts a process of its own."""
    p = zctipc.get_context("forkserver").Process(target=print)
    p.start()
    p.join()


def spawn_inner(rank, queue, method):
    """A rank that spawns two ranks of its own, each saying its pid."""
    zctipc.spawn(say_pid, args=(queue,), nprocs=2, start_method=method)
    queue.put(("outer", rank))


def which_spawn(rank, queue):
    """Say what zctipc.spawn is in a rank."""
    queue.put((type(zctipc.spawn).__name__, zctipc.spawn.__module__, type(zctipc.spawning).__name__))


def say_env(rank, queue, name):
    queue.put(os.environ.get(name))


def _fails_to_load():
    raise ValueError("this argument cannot be loaded in a rank")


class LoadsNowhere:
    """Pickles, but raises when unpickled."""

    def __reduce__(self):
        return _fails_to_load, ()


class SecondPickleFails:
    """Pickles for rank 0; for rank 1, waits until rank 0 has failed and
    exited (its pid comes through pids), then raises."""

    def __init__(self, pids):
        self.pids = pids
        self.times = 0

    def __reduce__(self):
        self.times += 1
        if self.times > 1:
            pid = self.pids.get(timeout=60)
            deadline = time.monotonic() + 60
            while not _exited(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            raise RuntimeError("rank 1's arguments cannot be pickled")
        return SecondPickleFails, (None,)


def _exited(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def say_pid_and_fail(rank, pids, _):
    pids.put(os.getpid())
    raise ValueError(f"rank {rank} fails at once")


# -- parents, run as programs: python -c "import _spawn_attack_workers as w; w.NAME(...)" --


def _sleep(rank, seconds):
    time.sleep(seconds)


def die_as_ranks_start(method, nprocs):
    """Start ranks and die of SIGKILL before they run: each finds its parent
    gone as it starts."""
    ctx = zctipc.start_processes(_sleep, args=(60,), nprocs=nprocs, join=False, start_method=method)
    print(*ctx.pids(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _spawn_blocked(rank, method, ready, forever):
    zctipc.spawn(say_and_block, args=(ready, forever), nprocs=2, start_method=method)


def die_under_nested_ranks(method):
    """Start a rank that spawns two blocked ranks of its own (join=True);
    print all three pids once they run, and die of SIGKILL."""
    ready, forever = zctipc.Queue(), zctipc.Queue()
    ctx = zctipc.start_processes(
        _spawn_blocked, args=(method, ready, forever), nprocs=1, join=False, start_method=method
    )
    inner = [pid for _, pid in (ready.get(timeout=60) for _ in range(2))]
    print(*ctx.pids(), *inner, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _raise_when_interrupted(rank, ready):
    try:
        ready.put(os.getpid())
        time.sleep(60)
    except KeyboardInterrupt:
        raise RuntimeError("interrupted") from None


def die_under_converting_rank(method):
    """Start a rank that turns KeyboardInterrupt into another exception;
    print its traceback file and pid once it runs, and die of SIGKILL."""
    ready = zctipc.Queue()
    ctx = zctipc.start_processes(_raise_when_interrupted, args=(ready,), nprocs=1, join=False, start_method=method)
    ready.get(timeout=60)
    print(ctx.error_files[0], *ctx.pids(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
