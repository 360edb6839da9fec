"""Ray: a torch tensor from one actor to another on the same node, through
zctipc's Ray transport, Ray's object store (the default) and Ray's GLOO
transport, in one run on one local Ray node.

The time is from the driver's call of the producer's method (which returns
a tensor the producer made before the clock started: the one it returned
before, or, in the "fresh" row, a new one that zctipc moves into its pool) to the consumer actor
holding a usable tensor (it checks 256 values spread over it), median and
p99 over the rounds: two actor calls each, whatever the transport (the
same two calls passing an int are measured too: the floor Ray's calls set).
Sizes:
1 MiB, 100 MiB and 1 GiB (--quick: 1 MiB and 100 MiB).

    python benchmarks/bench_ray.py [--quick | --tiny] [--json PATH]
"""

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    arguments,
    finish,
    fmt_bytes,
    latency_cells,
    left_out,
    machine_line,
    markdown_table,
    new_report,
    summarize,
)

MIB = 1 << 20
MARKS = 256
# name: (tensor_transport, what it does, whether the producer makes a fresh
# tensor for each round, before the clock starts: zctipc then moves its
# storage into the pool, one copy; otherwise it sends the one it sent before,
# already in the pool).
TRANSPORTS = {
    "zctipc": ("zctipc", "descriptors (zctipc.ray), the tensor sent before", False),
    "object store": (None, "Ray's object store (the default)", False),
    "gloo": ("gloo", "Ray's GLOO transport (torch.distributed)", False),
    "zctipc, fresh": ("zctipc", "descriptors, a new tensor moved into the pool", True),
}


def plan(args):
    """(bytes, rounds) of each size."""
    if args.tiny:
        return [(MIB, 3)]
    if args.quick:
        return [(MIB, 20), (100 * MIB, 5)]
    return [(MIB, 50), (100 * MIB, 20), (1024 * MIB, 10)]


def measure(sizes):
    """Every transport at every size, taking turns; rows of results."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    import torch
    from ray.experimental.collective import create_collective_group

    import zctipc.ray  # noqa: F401  (registers the transport before the actors exist)

    biggest = max(n for n, _ in sizes)
    tmp = tempfile.mkdtemp(prefix="zctipc-bench-ray-")
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=tmp,
        object_store_memory=max(3 * biggest, 512 * MIB),
    )
    try:

        @ray.remote(enable_tensor_transport=True)
        class Producer:
            def make(self, nbytes, marks=MARKS):
                self.t = torch.empty(nbytes // 4, dtype=torch.float32).fill_(0.5)  # every page written
                at = torch.arange(marks) * (len(self.t) - 1) // (marks - 1)
                self.t[at] = torch.arange(marks, dtype=torch.float32)

            def send(self):
                return self.t

            def nothing(self):
                return 0

        @ray.remote(enable_tensor_transport=True)
        class Consumer:
            def take(self, t, nbytes, marks=MARKS):
                at = torch.arange(marks) * (len(t) - 1) // (marks - 1)
                ok = t.nbytes == nbytes and bool(torch.equal(t[at], torch.arange(marks, dtype=torch.float32)))
                return time.perf_counter_ns(), ok

            def take_nothing(self, x):
                return time.perf_counter_ns()

        p, c = Producer.remote(), Consumer.remote()
        create_collective_group([p, c], backend="gloo")
        calls = []
        for i in range(max(r for _, r in sizes) + 2):
            start = time.perf_counter_ns()
            done = ray.get(c.take_nothing.remote(p.nothing.remote()))
            if i >= 2:
                calls.append(done - start)
        rows = [
            {
                "transport": "no tensor",
                "how": "the same two actor calls, passing an int",
                "bytes": 0,
                **summarize(calls),
            }
        ]
        print(f"  ray {'-':>8} {'no tensor':<13} p50 {rows[0]['median_us']:10.1f} us", flush=True)
        for nbytes, rounds in sizes:
            ray.get(p.make.remote(nbytes))
            samples = {name: [] for name in TRANSPORTS}
            for i in range(rounds + 2):  # two rounds of warm-up each
                for name, (transport, _, fresh) in TRANSPORTS.items():
                    if fresh:
                        ray.get(p.make.remote(nbytes))
                    send = p.send.options(tensor_transport=transport) if transport else p.send
                    start = time.perf_counter_ns()
                    ref = send.remote()
                    done, ok = ray.get(c.take.remote(ref, nbytes))
                    del ref
                    if not ok:
                        raise RuntimeError(f"ray {name}: the consumer did not see the producer's data")
                    if i >= 2:
                        samples[name].append(done - start)
            for name, (_, how, _) in TRANSPORTS.items():
                stats = summarize(samples[name])
                rows.append({"transport": name, "how": how, "bytes": nbytes, **stats})
                print(f"  ray {fmt_bytes(nbytes):>8} {name:<13} p50 {stats['median_us']:10.1f} us", flush=True)
        return rows
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def render(report):
    v = ", ".join(f"{k} {val}" for k, val in report["versions"].items() if val)
    head = f"Ray, actor to actor on one node, {report['date']}, on {machine_line(report['machine'])}; {v}."
    if report["skipped"]:
        return head + "\n\n" + "".join(f"Not measured: {why}." for why in report["skipped"].values())
    base = {r["bytes"]: r["median_us"] for r in report["results"] if r["transport"] in ("zctipc", "no tensor")}
    rows = [
        (fmt_bytes(r["bytes"]) if r["bytes"] else "-", r["transport"], r["how"], *latency_cells(r, base[r["bytes"]]))
        for r in report["results"]
    ]
    table = markdown_table(["size", "transport", "how", "median", "p99", "rounds", "median vs zctipc"], rows)
    return head + "\n\n" + table


def main(argv=None):
    parser = arguments(__doc__, "ray")
    args = parser.parse_args(argv)
    report = new_report("ray", ("zctipc", "torch", "ray"), results=[], skipped={})
    why = left_out("ray", "ray") or left_out("torch", "torch")
    if why:
        report["skipped"]["ray"] = why
    else:
        report["results"] = measure(plan(args))
    finish(report, render(report), args.json)


if __name__ == "__main__":
    main()
