"""Requests that can never succeed raise OutOfSharedMemory at once, with the
numbers; requests that could succeed later wait as block and timeout say."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import zctipc


@pytest.fixture
def small_pool():
    """This process's pool limited to 32 MiB for the test."""
    before = zctipc.pool_stats().limit
    zctipc.set_pool_limit(32 << 20)
    yield
    zctipc.set_pool_limit(before)


def raises_at_once(fn, *args, **kwargs):
    start = time.monotonic()
    with pytest.raises(zctipc.OutOfSharedMemory) as err:
        fn(*args, **kwargs)
    assert time.monotonic() - start < 1, "an impossible request raises at once"
    assert isinstance(err.value, MemoryError)
    return str(err.value)


def test_a_buffer_larger_than_the_pool_limit_raises_at_once(small_pool):
    message = raises_at_once(zctipc.empty, (64 << 20,), "uint8")
    assert "64.0 MiB" in message and "32.0 MiB" in message and "set_pool_limit" in message
    q = zctipc.Queue()
    raises_at_once(q.put, np.ones(48 << 20, np.uint8))  # no timeout given: it would wait for ever
    raises_at_once(q.put, {"frame": np.zeros(2 << 30, np.uint8)})  # 2 GiB inside an object
    raises_at_once(q.put_many, [1, np.zeros(40 << 20, np.uint8)])
    assert q.get() == 1, "what came before the impossible one went in"
    assert q.empty()
    q.close()


def test_a_full_pool_waits_as_block_and_timeout_say(small_pool):
    q = zctipc.Queue()
    held = []
    while True:  # fill the pool with buffers this test holds
        try:
            held.append(zctipc.empty((6 << 20,), "uint8", block=False))
        except zctipc.OutOfSharedMemory:
            break
    assert held
    raises_at_once(q.put, np.ones(6 << 20, np.uint8), block=False)
    raises_at_once(zctipc.empty, (6 << 20,), "uint8", timeout=0)
    start = time.monotonic()
    with pytest.raises(zctipc.OutOfSharedMemory, match="pool is full"):
        q.put(np.ones(6 << 20, np.uint8), timeout=0.3)
    assert time.monotonic() - start >= 0.29, "the timeout is waited out"
    # Blocking without a timeout: it goes in once a buffer comes back.
    threading.Timer(0.3, held.clear).start()
    q.put(np.ones(6 << 20, np.uint8))
    assert q.get().sum() == 6 << 20
    q.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_shared_memory_file_system_filled_mid_run(tmp_path):
    """Someone else fills a 32 MiB /dev/shm while a process puts arrays:
    its puts that need a new arena raise OutOfSharedMemory at once, naming
    the file system, rather than wait for ever; puts that reuse its buffers
    go on."""
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        code = textwrap.dedent("""
            import os, time, numpy as np, zctipc
            q = zctipc.Queue(max_bytes=1 << 16)
            q.put(np.ones(1000, np.float32)); keep = q.get()   # an arena for small arrays, in use
            free = os.statvfs(os.environ["ZCTIPC_SHM_DIR"])
            with open(os.path.join(os.environ["ZCTIPC_SHM_DIR"], "someone-else"), "wb") as f:
                os.posix_fallocate(f.fileno(), 0, free.f_bavail * free.f_frsize - (1 << 20))
            start = time.monotonic()
            try:
                q.put(np.ones(300_000, np.float32))              # a new class: a new arena
                print("no error", q.get().shape)
            except zctipc.OutOfSharedMemory as e:
                print("OOM", round(time.monotonic() - start, 1), "--shm-size" in str(e))
            for i in range(100):                                  # the small arrays reuse their arena
                q.put(np.full(1000, i, np.float32)); assert q.get()[0] == i
            print("small ok")
            q.close()
        """)
        env = dict(os.environ, ZCTIPC_SHM_DIR=str(mount), ZCTIPC_CLEANUP="0")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["OOM", "0.0", "True", "small", "ok"]
    finally:
        subprocess.run(["umount", str(mount)], check=True)
