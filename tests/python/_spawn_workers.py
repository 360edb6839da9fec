"""The functions that tests/python/test_spawn.py runs as ranks (importable
under spawn and forkserver): each is called as fn(rank, *args)."""

import os
import signal
import sys

import numpy as np
import torch


def put_rank(rank, queue, arg):
    """Put (rank, arg, an array, a tensor), both filled with the rank; the
    array is big enough to travel through the pool."""
    queue.put((rank, arg, np.full(1 << 18, rank, np.float32), torch.full((3, 4), float(rank))))


def fail_or_block(rank, failing, pids, barrier, forever):
    """Say this rank's pid and wait for every rank; then the failing rank
    raises, the others block in a zctipc queue's get until they are ended."""
    pids.put((rank, os.getpid()))
    barrier.wait(60)
    if rank == failing:
        raise ValueError(f"rank {rank} fails on purpose")
    forever.get()


def stubborn_or_fail(rank, barrier, forever):
    """Rank 0 ignores SIGTERM and blocks; rank 1 raises once rank 0 does."""
    if rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    barrier.wait(60)
    if rank == 1:
        raise RuntimeError("rank 1 fails")
    forever.get()


def kill_self(rank, forever):
    """Rank 1 dies of SIGKILL; the others block."""
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    forever.get()


def exit_with(rank, code):
    """Rank 0 exits with code; the others return."""
    if rank == 0:
        sys.exit(code)


def wait_for(rank, event, queue):
    """Wait until the parent sets event, then say so."""
    if not event.wait(60):
        raise TimeoutError("never set")
    queue.put(rank)


def say_and_block(rank, ready, forever):
    """Say this rank runs, then block."""
    ready.put(rank)
    forever.get()


def orphaned_ranks(method):
    """A parent that starts two blocked ranks, prints their pids once they
    run and dies of SIGKILL, leaving them behind."""
    import zctipc

    ready, forever = zctipc.Queue(), zctipc.Queue()
    ctx = zctipc.start_processes(say_and_block, args=(ready, forever), nprocs=2, join=False, start_method=method)
    assert sorted(ready.get(timeout=60) for _ in range(2)) == [0, 1]
    print(*ctx.pids(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def interrupt_self(rank):
    """Rank 0 gets SIGINT while its parent lives."""
    if rank == 0:
        os.kill(os.getpid(), signal.SIGINT)
        signal.pause()
