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


@pytest.mark.slow
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


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_an_unbounded_queue_past_two_to_the_31_on_a_full_file_system(tmp_path):
    """Puts of 1.5 MiB that do not fit the rest of an unbounded queue's warm
    window skip to the next lap, so two put/get pairs take its tail past
    2^31. On a file system filled by someone else a put then raises
    OutOfSharedMemory (it used to write pages it never reserved: a fault, a
    hang or a queue Full for ever), and once there is room again the same
    queue takes and gives messages, in every process."""
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        code = textwrap.dedent("""
            import os, queue, zctipc
            q = zctipc.Queue()
            big = bytes(3 << 19)
            for i in range(4):
                q.put(big); assert len(q.get()) == len(big)
            dirname = os.environ["ZCTIPC_SHM_DIR"]
            free = os.statvfs(dirname)
            filler = os.path.join(dirname, "someone-else")
            with open(filler, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, free.f_bavail * free.f_frsize - (512 << 10))
            larger = bytes(3 << 20)  # past the warm window: pages of its own
            try:
                q.put(larger, timeout=1)
                print("no error")
            except zctipc.OutOfSharedMemory:
                print("OOM")
            except queue.Full:
                print("Full")
            os.unlink(filler)
            q.put(larger, timeout=5)
            print(len(q.get(timeout=5)) == len(larger))
            q.close()
        """)
        env = dict(os.environ, ZCTIPC_SHM_DIR=str(mount), ZCTIPC_CLEANUP="0")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["OOM", "True"]
    finally:
        subprocess.run(["umount", str(mount)], check=True)


_LIMIT = """
import zctipc
try:
    print(zctipc.pool_stats().limit)
    zctipc.empty(10)
    print("made")
except zctipc.InvalidArgument as e:
    print("refused", "ZCTIPC_POOL_LIMIT" in str(e), isinstance(e, ValueError))
    zctipc.set_pool_limit(1 << 20)  # a limit given here replaces the refused one
    zctipc.empty(10)
    print("made")
"""


@pytest.mark.parametrize(
    "value, limit",
    [("536870912", 512 << 20), ("512M", 512 << 20), ("512MiB", 512 << 20), ("1.5G", 3 << 29), ("64k", 64 << 10)],
)
def test_the_pool_limit_variable_takes_units(value, limit):
    env = dict(os.environ, ZCTIPC_POOL_LIMIT=value)
    out = subprocess.run([sys.executable, "-c", _LIMIT], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(limit), "made"]


@pytest.mark.parametrize("value", ["512X", "lots", "-1", "1e9", "1.5.5G", "K", "0.5", "18446744073709551616"])
def test_a_pool_limit_variable_that_is_not_a_size_is_refused_by_name(value):
    env = dict(os.environ, ZCTIPC_POOL_LIMIT=value)
    out = subprocess.run([sys.executable, "-c", _LIMIT], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[1:] == ["refused", "True", "True", "made"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_buffer_larger_than_a_small_shm_names_its_free_space(tmp_path):
    """On a 64 MiB /dev/shm (Docker's default) the pool's limit is 32 MiB;
    a 100 MiB buffer could not fit whatever the limit: the error names the
    file system's free space, not the pool limit (raising that led to a
    second error)."""
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        code = textwrap.dedent("""
            import zctipc
            for size in (100 << 20, 40 << 20):
                try:
                    zctipc.empty(size, "uint8")
                except zctipc.OutOfSharedMemory as e:
                    print("set_pool_limit" in str(e), "free in" in str(e))
        """)
        env = dict(os.environ, ZCTIPC_SHM_DIR=str(mount), ZCTIPC_CLEANUP="0")
        env.pop("ZCTIPC_POOL_LIMIT", None)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["False", "True", "True", "False"], "100 MiB: the free space; 40: the limit"
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.slow
@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_pool_limit_variable_is_unset(value):
    """ZCTIPC_POOL_LIMIT= (empty, as ``ZCTIPC_POOL_LIMIT=$UNSET cmd`` leaves
    it) means no limit was given, as an empty PYTHON* variable does: the
    default limit, where every buffer was refused."""
    env = dict(os.environ)
    env.pop("ZCTIPC_POOL_LIMIT", None)
    default = subprocess.run([sys.executable, "-c", _LIMIT], env=env, capture_output=True, text=True, timeout=60)
    assert default.returncode == 0, default.stderr
    env["ZCTIPC_POOL_LIMIT"] = value
    out = subprocess.run([sys.executable, "-c", _LIMIT], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == default.stdout.split() == [default.stdout.split()[0], "made"]


def test_a_pool_limit_of_zero_refuses_buffers_with_their_sizes_until_set():
    """ZCTIPC_POOL_LIMIT=0 is a pool that holds nothing: a buffer is refused
    at once, naming its bytes and the limit (each read "0.0 MiB"), until
    set_pool_limit gives another."""
    code = textwrap.dedent("""
        import zctipc
        try:
            zctipc.empty(10)
        except zctipc.OutOfSharedMemory as e:
            print(repr(str(e)))
        zctipc.set_pool_limit(1 << 20)
        zctipc.empty(10)
        print("made")
    """)
    env = dict(os.environ, ZCTIPC_POOL_LIMIT="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    message, made = out.stdout.splitlines()
    assert "0.0 MiB" not in message and "limit of 0 B" in message and "set_pool_limit" in message
    assert made == "made"
