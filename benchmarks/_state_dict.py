"""One run of the state-dict benchmark (bench_queue.py's state-dict suite),
in a process of its own, so that its first put meets a pool with no arenas
yet, as a program's first put does:

    python benchmarks/_state_dict.py PEER ROUNDS SCALE

PEER is zctipc (zctipc.Queue) or torch (torch.multiprocessing's Queue,
forkserver). Each round makes a fresh state dict of 98 float32 CPU tensors
of mixed sizes (SCALE 1: 33.6 MB) in the process's own memory, puts it, and
waits until a consumer process has the whole dict and has read a value of
each tensor. Prints one line per round: the milliseconds put blocked the
caller, then the milliseconds from put to the consumer having the dict.
Round 0 is the process's first put.
"""

import multiprocessing
import sys
import time

import torch


def state_dict(seed, scale=1):
    """98 float32 tensors of mixed sizes: a stack of 24 convolutions with
    their norms' weight, bias and running mean, an embedding and a
    classifier: 33.6 MB at scale 1."""
    g = torch.Generator().manual_seed(seed)
    sd, prev = {}, 3
    for c in (n * scale for n in (64, 64, 64, 64, 128, 128, 128, 128, 256, 256, 256, 256)):
        for _ in range(2):
            sd[f"layer{len(sd)}.conv.weight"] = torch.randn(c, prev, 3, 3, generator=g)
            for part in ("weight", "bias", "running_mean"):
                sd[f"layer{len(sd)}.bn.{part}"] = torch.randn(c, generator=g)
            prev = c
    sd["embedding.weight"] = torch.randn(2048, 1145 * scale, generator=g)
    sd["fc.weight"] = torch.randn(1000, prev, generator=g)
    return sd


def _consume(q, back, rounds):
    for _ in range(rounds + 1):  # the warm-up message, then the rounds
        sd = q.get()
        total = sum(float(t.reshape(-1)[0]) for t in sd.values())  # every tensor usable
        back.send((time.perf_counter_ns(), len(sd), total))
        del sd


def run(peer, rounds, scale):
    if peer == "zctipc":
        import zctipc

        ctx = zctipc.get_context()
        q = zctipc.Queue()
    else:
        import torch.multiprocessing as tmp

        ctx = tmp.get_context("forkserver")
        q = ctx.Queue()
    here, there = multiprocessing.get_context("forkserver").Pipe()
    p = ctx.Process(target=_consume, args=(q, there, rounds))
    p.start()
    # The consumer is up, with torch imported, before the clock starts: no
    # start-up in the first round (a tensor of 4 bytes warms no buffer of the dict's).
    q.put({"warm-up": torch.zeros(1)})
    here.recv()
    out = []
    for i in range(rounds):
        sd = state_dict(i, scale)
        start = time.perf_counter_ns()
        q.put(sd)
        put = time.perf_counter_ns() - start
        done, n, _ = here.recv()
        if n != len(sd):
            raise AssertionError(f"round {i}: the consumer got {n} tensors of {len(sd)}")
        out.append((put / 1e6, (done - start) / 1e6))
        del sd
    p.join(60)
    return out


if __name__ == "__main__":
    for put, end_to_end in run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])):
        print(f"{put:.2f} {end_to_end:.2f}")
