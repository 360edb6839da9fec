"""The physical floor every result is compared with, measured in the same
run: how long a process asleep on a futex takes to wake when another process
wakes it (one way), and how fast one core copies memory."""

import ctypes
import multiprocessing
import time
from multiprocessing import shared_memory

import numpy as np

SYS_FUTEX = 202  # x86-64
FUTEX_WAIT, FUTEX_WAKE = 0, 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _futex(addr, op, val):
    return _libc.syscall(
        ctypes.c_long(SYS_FUTEX),
        ctypes.c_void_p(addr),
        ctypes.c_int(op),
        ctypes.c_int(val),
        None,
        None,
        ctypes.c_int(0),
    )


def _words(shm):
    """The shared words: [0] the futex word, then the send time (ns)."""
    arr = np.ndarray(3, dtype=np.int64, buffer=shm.buf)
    return arr, arr.ctypes.data


def _sleeper(name, rounds, out):
    shm = shared_memory.SharedMemory(name)
    words, addr = _words(shm)
    samples = []
    seen = 0
    for _ in range(rounds):
        while words[0] == seen:
            _futex(addr, FUTEX_WAIT, seen)
        now = time.perf_counter_ns()
        seen = int(words[0])
        samples.append(now - int(words[1]))
        words[2] = seen  # acknowledge
    out.send(samples)
    del words
    shm.close()


def futex_wake_ns(rounds=1000, pause=0.001):
    """Samples of the one-way wake latency between two processes: the sleeper
    is asleep in FUTEX_WAIT, for pause seconds between rounds. How long it
    slept counts (a core idle longer sleeps deeper: on the 2-vCPU host of
    the README's run, 0.5 ms apart took 10 us, 2 ms apart 12.6 us, 10 ms
    apart 55 us), so each latency is set against the floor of its own
    pause."""
    ctx = multiprocessing.get_context("spawn")
    shm = shared_memory.SharedMemory(create=True, size=64)
    try:
        words, addr = _words(shm)
        words[:] = 0
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_sleeper, args=(shm.name, rounds, send))
        p.start()
        for i in range(1, rounds + 1):
            time.sleep(pause)
            words[1] = time.perf_counter_ns()
            words[0] = i
            _futex(addr, FUTEX_WAKE, 1)
            while words[2] != i:
                time.sleep(0)
        samples = recv.recv()
        p.join(60)
        del words
        return samples
    finally:
        shm.close()
        shm.unlink()


def memcpy_bytes_per_s(nbytes=64 << 20):
    """Bytes per second one core copies, best of 5 copies of nbytes."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return src.nbytes / best
