"""What sending a torch state dict costs: its put moves each of its
storages into the pool (shared with the consumer), and reserves shared
memory only for the buffers it takes (Note [a put moves its storages
before it returns] in zctipc._wire.storages)."""

import os
import subprocess
import sys

import pytest
import torch

import zctipc

RUN = 300  # seconds a child program may take: the machine may be loaded
MiB = 1 << 20


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
    handed out (Note [slots reserved when first used] in go/pool/pool.go):
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
