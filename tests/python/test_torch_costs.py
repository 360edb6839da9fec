"""What sending costs where it used to cost too much: a torch state dict's
put reserves shared memory only for the buffers it takes (and is shared
with the consumer), and programs that send NumPy arrays through
ProcessPoolExecutor, multiprocessing.Pool or a zctipc queue on a small
/dev/shm (Docker's 64 MiB) finish, sending arrays in band with one warning
per process where shared memory has no room, or say clearly that a message
can never fit (Note [sending in band when shared memory is full] in
zctipc._wire.exports). The /dev/shm tests mount a tmpfs of their own and
run the program in a child process, so that what it leaves in the mount
after it exits is seen."""

import contextlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import with_pythonpath

import zctipc

pytestmark = pytest.mark.slow

RUN = 300  # seconds a child program may take: the machine may be loaded
MiB = 1 << 20
WARNING = "has no room for a"  # the in-band warning's words


def state_dict(seed=0, scale=1):
    """98 float32 CPU tensors of mixed sizes (a stack of convolution layers
    with their norms, and a classifier) in the process's own memory: 0.4
    MiB at scale 1, 16 MiB at scale 8 (channels grow with scale)."""
    g = torch.Generator().manual_seed(seed)
    sd, prev = {}, 3
    for i, c in enumerate(c * scale // 4 for c in (64, 64, 64, 64, 64, 64, 128, 128, 128, 128, 128, 128)):
        c = max(c, 1)
        sd[f"layer{i}.conv.weight"] = torch.randn(c, prev, 3, 3, generator=g)
        for part in ("weight", "bias", "running_mean", "running_var"):
            sd[f"layer{i}.bn.{part}"] = torch.randn(c, generator=g)
        prev = c
    for i in range(len(sd), 96):
        sd[f"extra{i}"] = torch.randn(17 * i + 1, generator=g)
    sd["fc.weight"] = torch.randn(100, prev, generator=g)
    sd["fc.bias"] = torch.randn(100, generator=g)
    return sd


def _check_and_write(q, back):
    """Take a state dict; report its checksums, then write into it."""
    sd = q.get()
    back.put({k: float(v.double().sum()) for k, v in sd.items()})
    for v in sd.values():
        v.fill_(7)
    back.put("written")


def test_a_state_dict_put_is_shared_with_the_consumer():
    """Each of its 98 storages moves into the pool at put: the consumer gets
    every tensor's values, and its writes are the producer's."""
    sd = state_dict(1)
    sums = {k: float(v.double().sum()) for k, v in sd.items()}
    ctx = zctipc.get_context()
    q, back = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_check_and_write, args=(q, back))
    p.start()
    q.put(sd)
    assert back.get(timeout=RUN) == pytest.approx(sums)
    assert back.get(timeout=RUN) == "written"
    p.join(RUN)
    assert p.exitcode == 0
    assert all(bool((v == 7).all()) for v in sd.values()), "the consumer's writes are seen here"
    assert all(v.is_shared() for v in sd.values())
    q.close()
    back.close()


_RESERVED = """
import os, sys, torch, zctipc
sys.path.insert(0, {here!r})
from test_torch_costs import state_dict
q = zctipc.Queue()
for seed in range(3):  # three state dicts held at once: the pool's arenas grow
    q.put(state_dict(seed, 8))
held = [q.get() for _ in range(3)]
directory = os.environ["ZCTIPC_SHM_DIR"]
resident = sum(os.stat(os.path.join(directory, s.name)).st_blocks * 512
               for s in zctipc.list_segments() if s.kind == "arena" and s.creator_pid == os.getpid())
st = zctipc.pool_stats()
print(st.bytes_in_use, st.reserved, resident)
"""


def test_a_state_dict_put_reserves_only_the_buffers_it_takes(isolated):
    """A pool's arenas grow by doubling, and each new page costs its
    zeroing: three state dicts of 98 tensors held at once took arenas of
    2.7 times their bytes, all reserved, and a cold put spent most of its
    time there. Now an arena reserves a slot's pages when it is first
    handed out (Note [slots reserved when first used] in go/internal/pool/pool.go):
    the memory the arenas hold is about the buffers in use."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", _RESERVED.format(here=here)], env=isolated, capture_output=True, text=True, timeout=RUN
    )
    assert out.returncode == 0, out.stderr
    in_use, reserved, resident = map(int, out.stdout.split())
    assert in_use > 3 * 15 * MiB
    assert reserved > 1.5 * in_use, "arenas larger than what is in them, as they grow by doubling"
    assert resident < 1.1 * in_use + 4 * MiB, f"{resident} bytes of memory for {in_use} in use"


# -- a 64 MiB /dev/shm ----------------------------------------------------------


@contextlib.contextmanager
def _mounted(tmp_path, size="64m"):
    """A tmpfs of size at tmp_path/shm while the block runs."""
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def _run(tmp_path, mount, program, *args):
    """Run program (a file, so that workers can import its functions) with
    its segments in mount; returns its stdout lines, after checking that it
    succeeded and that each of its processes warned at most once (the
    program prints WARNED <pid> for each in-band warning)."""
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(program))
    env = dict(
        os.environ,
        ZCTIPC_SHM_DIR=str(mount),
        ZCTIPC_CLEANUP="0",
        PYTHONWARNINGS="always::RuntimeWarning",  # the once is zctipc's own
        PYTHONPATH=with_pythonpath(os.path.dirname(os.path.abspath(__file__))),
    )
    env.pop("ZCTIPC_POOL_LIMIT", None)
    out = subprocess.run([sys.executable, str(path), *args], env=env, capture_output=True, text=True, timeout=RUN)
    assert out.returncode == 0, out.stdout + out.stderr
    warned = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("WARNED")]
    assert len(warned) == len(set(warned)), f"a process warned more than once: {out.stdout}"
    assert os.listdir(mount) == [], "nothing is left in the mount"
    return [line for line in out.stdout.splitlines() if not line.startswith("WARNED")], warned


# Each process of the programs reports the in-band warnings it shows.
_PROLOGUE = """
import os, sys, warnings
import numpy as np
import zctipc

_show = warnings.showwarning

def report_warnings():
    def show(message, category, *args, **kwargs):
        if "{warning}" in str(message):
            # one write of a whole line: the processes share this pipe
            os.write(1, f"WARNED {os.getpid()}\\n".encode())
            if os.environ["ZCTIPC_SHM_DIR"] not in str(message) or "64.0 MiB" not in str(message):
                os.write(1, f"BAD WARNING {message}\\n".encode())
        else:
            _show(message, category, *args, **kwargs)
    warnings.showwarning = show

report_warnings()

def double(a):
    return a * 2

def arrays(n):
    return [np.full(MIB, i, np.float64) for i in range(n)]  # 8 MiB each

MIB = 1 << 20
""".replace("{warning}", WARNING)

_EXECUTOR = (
    _PROLOGUE
    + """
import concurrent.futures

if __name__ == "__main__":
    n, keep = int(sys.argv[1]), sys.argv[2] == "keep"
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=zctipc.get_context(), initializer=report_warnings) as ex:
        results = ex.map(double, arrays(n))
        if keep:  # every result held until the last one comes
            results = list(results)
        ok = [bool((r == 2 * i).all()) for i, r in enumerate(results)]
    print(len(ok), all(ok))
"""
)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
@pytest.mark.parametrize("keep", ["keep", "drop"])
def test_a_process_pool_executor_finishes_on_a_64_mib_shm(tmp_path, keep):
    """ProcessPoolExecutor(mp_context=zctipc.get_context()) maps a function
    over 48 arrays of 8 MiB (six times /dev/shm), its results kept in a
    list or dropped one by one: the arguments that find no pool buffer go
    pickled through the executor's pipe, the results inline through the
    result queue, each process says so once, and the program finishes
    with every result right (it failed with OutOfSharedMemory, or waited
    for ever)."""
    with _mounted(tmp_path) as mount:
        lines, warned = _run(tmp_path, mount, _EXECUTOR, "48", keep)
        assert lines == ["48 True"]
        assert warned, "shared memory ran out: some process said so"


_POOL = (
    _PROLOGUE
    + """
if __name__ == "__main__":
    n, how = int(sys.argv[1]), sys.argv[2]
    with zctipc.get_context().Pool(2, initializer=report_warnings) as pool:
        if how == "imap":
            ok = [bool((r == 2 * i).all()) for i, r in enumerate(pool.imap(double, arrays(n)))]
        else:
            try:
                ok = [bool((r == 2 * i).all()) for i, r in enumerate(pool.map(double, arrays(n), int(how)))]
            except zctipc.OutOfSharedMemory as e:
                print("OutOfSharedMemory", "chunksize" in str(e), os.environ["ZCTIPC_SHM_DIR"] in str(e))
                sys.exit(0)
    print(len(ok), all(ok))
"""
)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
@pytest.mark.parametrize("how", ["imap", "1"])
def test_a_multiprocessing_pool_finishes_on_a_64_mib_shm(tmp_path, how):
    """multiprocessing.Pool with zctipc's context sends its tasks and
    results through SimpleQueues: on a 64 MiB /dev/shm, imap and map with
    chunks of one array finish, with the arrays that find no pool buffer
    sent inline and one warning per process."""
    with _mounted(tmp_path) as mount:
        lines, warned = _run(tmp_path, mount, _POOL, "48", how)
        assert lines == ["48 True"]
        assert warned


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_pool_task_larger_than_the_shm_is_a_clear_error(tmp_path):
    """A task of ten 8 MiB arrays travels as one message, which can never
    fit a 64 MiB /dev/shm once its arrays go inside it: map raises
    OutOfSharedMemory at once, naming the directory and what to do (a
    smaller chunksize), rather than wait for ever."""
    with _mounted(tmp_path) as mount:
        lines, _ = _run(tmp_path, mount, _POOL, "20", "10")
        assert lines == ["OutOfSharedMemory True True"]


_QUEUES = (
    _PROLOGUE
    + """
import queue, time

if __name__ == "__main__":
    big = np.arange(MIB, dtype=np.float64)  # 8 MiB
    q, sq = zctipc.Queue(), zctipc.SimpleQueue()
    held = []
    try:  # fill /dev/shm with buffers this process holds
        while True:
            q.put(big, timeout=0.2)
            held.append(q.get())
    except zctipc.OutOfSharedMemory as e:
        print("Queue", "pool is full" in str(e) or "no room" in str(e))
    # A SimpleQueue sends it inline instead, with the warning (once).
    for _ in range(3):
        sq.put(big)
        got = sq.get()
        print("SimpleQueue", bool((got == big).all()), zctipc.is_shared(got))
    # Someone else fills what is left: a message that can never fit raises.
    directory = os.environ["ZCTIPC_SHM_DIR"]
    free = os.statvfs(directory)
    with open(os.path.join(directory, "someone-else"), "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(free.f_bavail * free.f_frsize - MIB, 4096))
    start = time.monotonic()
    try:
        sq.put(big)
        print("no error")
    except zctipc.OutOfSharedMemory as e:
        print("full", time.monotonic() - start < 30, directory in str(e))
    os.unlink(os.path.join(directory, "someone-else"))
    del held
    sq.put(big)
    print("again", bool((sq.get() == big).all()))
    q.close()
    sq.close()
"""
)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_queues_on_a_full_shm(tmp_path):
    """On a 64 MiB /dev/shm filled with buffers the process holds, Queue.put
    of an 8 MiB array waits as its timeout says and raises
    OutOfSharedMemory (it never sends in band); SimpleQueue.put, which has
    no timeout, sends it inline (a copy, not shared memory) with one
    warning; once someone else fills the rest, a message that finds no
    room raises OutOfSharedMemory (after a few seconds on an empty queue,
    for other queues' readers to give pages back); with room again, puts
    go on."""
    with _mounted(tmp_path) as mount:
        lines, warned = _run(tmp_path, mount, _QUEUES)
        assert lines == [
            "Queue True",
            "SimpleQueue True False",
            "SimpleQueue True False",
            "SimpleQueue True False",
            "full True True",
            "again True",
        ]
        assert len(warned) == 1
