"""torch.utils.data.DataLoader with two workers, by multiprocessing context,
every peer in one run on one machine.

Shapes (batches of 64, num_workers=2, prefetch_factor=2, persistent
workers, torch's default collate; the main process reads one element of
each batch, checks it, and lets the batch go when the next comes, as a
for loop over the loader does):

  large     each item a precomputed 3x224x224 float32 tensor (256 of them,
            indexed modulo): 38.5 MB a batch, bound by moving it
  small     each item a precomputed 512-float32 tensor and an int label:
            132 KB a batch of 64 small items, bound by per-item costs
  compute   each item a random 224x224 crop of a precomputed 3x256x256
            uint8 image, converted to float32 and normalised (minus the
            mean, over the standard deviation) in the worker: 38.5 MB a
            batch, with real work in the workers

Peers, for every shape: torch's default (the fork start method,
multiprocessing's default on Linux before Python 3.14), forkserver
(multiprocessing.get_context("forkserver")) and zctipc
(multiprocessing_context=zctipc.get_context()). Beside them, for
reference, the same loader without workers (num_workers=0): the work of
its batches (the items, and the collate stacking them into new memory)
on one core, with nothing moved between processes.

Note [a fresh process per peer]: a process that loaded zctipc's library
makes forkserver multiprocessing's default, and a child forked from it
cannot use zctipc; so each measurement runs in a process of its own
(this script with --peer and --shape), which prints one JSON line, and a
peer that is not zctipc never loads it (the line says so). The peers take
turns, three rounds in a full run, each round starting with the next
peer, and the median round counts. The precomputed data is made in each
worker on its first item (not pickled to it), and the first batches
(workers starting, data made, buffers warmed) are not timed; then the
batches of a few seconds are. Batches per second, MB per second of batch
payload (MB = 10^6 bytes), that rate against one core's memcpy
bandwidth, measured in the same run, and the main process's CPU use.

    python benchmarks/bench_dataloader.py [--only large,small,compute] [--quick | --tiny] [--json PATH]

    python benchmarks/bench_dataloader.py --peer torch-fork|forkserver|zctipc|in-process --shape SHAPE
                                          [--quick | --tiny]
"""

import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    arguments,
    finish,
    fmt_ratio,
    machine_line,
    markdown_table,
    new_report,
)
from _floor import memcpy_bytes_per_s

BATCH = 64
WORKERS = 2
PREFETCH = 2
LENGTH = 1 << 24  # items in every dataset: more than any run takes
MB = 1e6

# peer: (label, start method; None for zctipc's context). "in-process" is
# no peer but the reference: the same loader without workers, the work of
# its batches alone on one core.
PEERS = {
    "torch-fork": ("fork (torch's default)", "fork"),
    "forkserver": ("forkserver", "forkserver"),
    "zctipc": ("zctipc.get_context()", None),
    "in-process": ("no workers (num_workers=0)", None),
}
DEFAULT_PEER = "torch-fork"
REFERENCE = "in-process"


# -- datasets (made in each worker on its first item) -------------------------------


class _Precomputed(Dataset):
    """A dataset whose data is made on first use in the process that uses
    it, and never pickled: every peer's workers make their own, the same."""

    def __init__(self):
        self._made = None

    def __len__(self):
        return LENGTH

    def __getstate__(self):
        return {"_made": None}

    def data(self):
        if self._made is None:
            self._made = self.make(torch.Generator().manual_seed(0))
        return self._made


class Large(_Precomputed):
    """Item i: the precomputed 3x224x224 float32 tensor i % 256, whose first
    element is i % 256."""

    DISTINCT = 256

    def make(self, g):
        images = torch.rand((self.DISTINCT, 3, 224, 224), generator=g)
        images[:, 0, 0, 0] = torch.arange(self.DISTINCT, dtype=torch.float32)
        return images

    def __getitem__(self, i):
        return self.data()[i % self.DISTINCT]

    @classmethod
    def check(cls, batch, first):
        return batch.shape == (BATCH, 3, 224, 224) and batch[0, 0, 0, 0].item() == first % cls.DISTINCT


class Small(_Precomputed):
    """Item i: the precomputed 512-float32 tensor i % 4096 (its first element
    i % 4096), and i."""

    DISTINCT = 4096

    def make(self, g):
        rows = torch.rand((self.DISTINCT, 512), generator=g)
        rows[:, 0] = torch.arange(self.DISTINCT, dtype=torch.float32)
        return rows

    def __getitem__(self, i):
        return self.data()[i % self.DISTINCT], i

    @classmethod
    def check(cls, batch, first):
        rows, labels = batch
        return rows.shape == (BATCH, 512) and labels[0].item() == first and rows[0, 0].item() == first % cls.DISTINCT


class Compute(_Precomputed):
    """Item i: a random 224x224 crop of the precomputed 3x256x256 uint8 image
    i % 16, as float32 less the mean over the standard deviation (ImageNet's,
    per channel, on the 0-255 scale), and i."""

    DISTINCT = 16
    MEAN = torch.tensor([0.485, 0.456, 0.406]).mul_(255).view(3, 1, 1)
    STD = torch.tensor([0.229, 0.224, 0.225]).mul_(255).view(3, 1, 1)

    def make(self, g):
        return torch.randint(0, 256, (self.DISTINCT, 3, 256, 256), dtype=torch.uint8, generator=g)

    def __getitem__(self, i):
        top, left = torch.randint(0, 256 - 224 + 1, (2,)).tolist()
        crop = self.data()[i % self.DISTINCT, :, top : top + 224, left : left + 224]
        return crop.to(torch.float32).sub_(self.MEAN).div_(self.STD), i

    @classmethod
    def check(cls, batch, first):
        images, labels = batch
        mean, std = cls.MEAN[0, 0, 0].item(), cls.STD[0, 0, 0].item()  # the first channel's
        low, high = (0 - mean) / std - 1e-3, (255 - mean) / std + 1e-3  # in float32, 0 and 255 land a hair outside
        return (
            images.shape == (BATCH, 3, 224, 224)
            and labels[0].item() == first
            and low <= images[0, 0, 0, 0].item() <= high
        )


SHAPES = {
    "large": (Large, "3x224x224 float32"),
    "small": (Small, "512 float32 + int label"),
    "compute": (Compute, "crop 256 to 224 + normalise"),
}


def plan(args):
    """How each measurement runs in a mode: rounds per peer, seconds timed,
    and the warm-up (seconds and batches, whichever ends later) before."""
    if args.tiny:
        return {"rounds": 1, "seconds": 0.0, "min_batches": 4, "warm_seconds": 0.0, "warm_batches": 4}
    if args.quick:
        return {"rounds": 1, "seconds": 1.5, "min_batches": 8, "warm_seconds": 0.5, "warm_batches": 8}
    return {"rounds": 3, "seconds": 4.0, "min_batches": 20, "warm_seconds": 1.0, "warm_batches": 8}


# -- one measurement, in a process of its own ----------------------------------------


def _payload(batch):
    """The bytes of a batch's tensors."""
    return batch.nbytes if isinstance(batch, torch.Tensor) else sum(t.nbytes for t in batch)


def measure(peer, shape, p):
    """One peer's loader over one shape in this process: the batches timed,
    their seconds and payload, and this (the main) process's CPU time."""
    if peer == REFERENCE:
        # One thread, as torch gives each worker: torch's threads on a
        # busy machine make a collate's stack many times slower.
        torch.set_num_threads(1)
        workers = {}
    else:
        if peer == "zctipc":
            import zctipc

            ctx = zctipc.get_context()
        else:
            ctx = multiprocessing.get_context(PEERS[peer][1])
        workers = {
            "num_workers": WORKERS,
            "multiprocessing_context": ctx,
            "persistent_workers": True,
            "prefetch_factor": PREFETCH,
        }
    cls = SHAPES[shape][0]
    loader = DataLoader(cls(), batch_size=BATCH, **workers)

    def payloads():
        for i, batch in enumerate(loader):
            if not cls.check(batch, i * BATCH):
                raise RuntimeError(f"{peer}, {shape}: batch {i} is not the one the dataset made")
            yield _payload(batch)

    taken = payloads()
    start, warm = time.perf_counter(), 0
    while warm < p["warm_batches"] or time.perf_counter() - start < p["warm_seconds"]:
        next(taken)
        warm += 1
    n, payload = 0, 0
    start, cpu = time.perf_counter(), time.process_time()
    while n < p["min_batches"] or time.perf_counter() - start < p["seconds"]:
        payload += next(taken)
        n += 1
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    taken.close()  # the workers stop
    return {
        "batches": n,
        "seconds": seconds,
        "bytes_per_batch": payload // n,
        "main_cpu": cpu / seconds,
        "zctipc_loaded": "zctipc" in sys.modules,
    }


def run_peer(peer, shape, mode_flags):
    """measure() in a fresh process (Note [a fresh process per peer])."""
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--peer", peer, "--shape", shape, *mode_flags],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode != 0:
        raise RuntimeError(f"the {peer} loader over {shape} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["zctipc_loaded"] != (peer == "zctipc"):
        raise RuntimeError(f"the {peer} loader's process {'loaded' if result['zctipc_loaded'] else 'lacked'} zctipc")
    return result


# -- the suite ----------------------------------------------------------------------------


def run(shapes, p, mode_flags, report):
    """Every peer over every shape, taking turns; results in report."""
    peers = list(PEERS)
    for shape in shapes:
        rounds = {peer: [] for peer in peers}
        for r in range(p["rounds"]):
            for peer in peers[r % len(peers) :] + peers[: r % len(peers)]:
                one = run_peer(peer, shape, mode_flags)
                rounds[peer].append(one)
                rate = one["batches"] / one["seconds"]
                print(
                    f"  dataloader {shape:<8} {PEERS[peer][0]:<26} round {r + 1}: {rate:8.1f} batches/s, "
                    f"{rate * one['bytes_per_batch'] / MB:8,.0f} MB/s",
                    flush=True,
                )
        for peer in peers:
            rates = [one["batches"] / one["seconds"] for one in rounds[peer]]
            median = statistics.median(rates)
            per_batch = rounds[peer][0]["bytes_per_batch"]
            report["results"].append(
                {
                    "shape": shape,
                    "peer": PEERS[peer][0],
                    "batches_per_s": median,
                    "bytes_per_batch": per_batch,
                    "bytes_per_s": median * per_batch,
                    "main_cpu": statistics.median(one["main_cpu"] for one in rounds[peer]),
                    "rounds": rates,
                    "batches": [one["batches"] for one in rounds[peer]],
                }
            )
        mine = {r["peer"]: r["batches_per_s"] for r in report["results"] if r["shape"] == shape}
        zctipc = mine.pop(PEERS["zctipc"][0])
        del mine[PEERS[REFERENCE][0]]
        best = max(mine, key=mine.get)
        report["ratios"].append(
            {
                "shape": shape,
                "best_peer": best,
                "vs_best_peer": zctipc / mine[best],
                "vs_torch_default": zctipc / mine[PEERS[DEFAULT_PEER][0]],
            }
        )


def render(report):
    v = ", ".join(f"{k} {val}" for k, val in report["versions"].items() if val)
    s = report["settings"]
    copy = report["memcpy_bytes_per_s"]
    head = (
        f"DataLoader, {report['date']}, on {machine_line(report['machine'])}; {v}. "
        f"num_workers={s['num_workers']}, batch_size={s['batch_size']}, prefetch_factor={s['prefetch_factor']}, "
        f"persistent workers; each peer in a fresh process, {s['rounds']} round(s) taking turns (the median "
        f"counts), {s['seconds']:g} s timed after at least {s['warm_batches']} batches and "
        f"{s['warm_seconds']:g} s of warm-up. Single-core memcpy in the same run: {copy / 1e9:.1f} GB/s."
    )
    zctipc = {r["shape"]: r["batches_per_s"] for r in report["results"] if r["peer"] == PEERS["zctipc"][0]}
    rows = [
        (
            f"{r['shape']}: {SHAPES[r['shape']][1]}, {r['bytes_per_batch'] / MB:.3g} MB a batch",
            r["peer"],
            f"{r['batches_per_s']:,.1f}",
            f"{r['bytes_per_s'] / MB:,.0f}",
            f"{100 * r['bytes_per_s'] / copy:.0f}%",
            f"{r['main_cpu']:.0%}",
            ", ".join(f"{x:,.1f}" for x in r["rounds"]),
            fmt_ratio(zctipc[r["shape"]] / r["batches_per_s"]),
        )
        for r in report["results"]
    ]
    table = markdown_table(
        [
            "shape",
            "multiprocessing context",
            "batches/s (median)",
            "MB/s",
            "vs memcpy",
            "main process CPU",
            "rounds, batches/s",
            "zctipc is",
        ],
        rows,
    )
    ratios = markdown_table(
        ["shape", "best other peer", "zctipc vs it", "zctipc vs torch's default"],
        [
            (r["shape"], r["best_peer"], fmt_ratio(r["vs_best_peer"]), fmt_ratio(r["vs_torch_default"]))
            for r in report["ratios"]
        ],
    )
    return head + "\n\n" + table + "\n\n" + ratios


def main(argv=None):
    parser = arguments(__doc__, "dataloader", list(SHAPES))
    parser.add_argument("--peer", choices=list(PEERS), help="one measurement in this process; prints a JSON line")
    parser.add_argument("--shape", choices=list(SHAPES), default="large", help="the shape --peer measures")
    args = parser.parse_args(argv)
    p = plan(args)
    mode_flags = ["--tiny"] if args.tiny else ["--quick"] if args.quick else []
    if args.peer:
        print(json.dumps(measure(args.peer, args.shape, p)), flush=True)
        return
    shapes = args.only  # each one of SHAPES (arguments checks)
    report = new_report(
        "dataloader",
        ("zctipc", "torch", "numpy"),
        settings={
            "num_workers": WORKERS,
            "batch_size": BATCH,
            "prefetch_factor": PREFETCH,
            "persistent_workers": True,
            **p,
        },
        memcpy_bytes_per_s=memcpy_bytes_per_s(),
        results=[],
        ratios=[],
    )
    print(f"  floor: single-core memcpy {report['memcpy_bytes_per_s'] / 1e9:.1f} GB/s", flush=True)
    run(shapes, p, mode_flags, report)
    finish(report, render(report), args.json)


if __name__ == "__main__":
    main()
