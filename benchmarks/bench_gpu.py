"""GPU tensor hand-off, zctipc vs torch.multiprocessing, in one run.

A tensor already on the GPU (64 MiB and 1 GiB, float32 and bfloat16) is put
in a queue by the producer; the time is until the consumer holds a usable
tensor (its stream ordered after the producer's work). "first" is the first
send of a tensor (the consumer opens the allocation); "steady" the median of
the rest (zctipc's consumer has the allocation cached). Without a GPU the
benchmark says why and measures nothing.

    python benchmarks/bench_gpu.py [--quick] [--json PATH] [--readme README.md]
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    arguments,
    finish,
    fmt_ratio,
    fmt_us,
    machine_line,
    markdown_table,
    new_report,
    summarize,
)

SIZES = {"64 MiB": 64 << 20, "1 GiB": 1 << 30}
DTYPES = ("float32", "bfloat16")


def consumer(q, out, rounds):
    samples = []
    for _ in range(rounds):
        sent, t = q.get()  # usable: the current stream is ordered after the producer's work
        samples.append(time.perf_counter_ns() - sent)
        del t
    out.put(samples)


def run(peer, nbytes, dtype, rounds):
    import torch

    if peer == "zctipc":
        import zctipc

        ctx = zctipc.get_context("spawn")
        q, out = zctipc.Queue(), zctipc.Queue()
    else:
        import torch.multiprocessing as tmp

        ctx = tmp.get_context("spawn")
        q, out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=consumer, args=(q, out, rounds))
    p.start()
    t = torch.ones(
        nbytes // torch.tensor([], dtype=getattr(torch, dtype)).element_size(),
        dtype=getattr(torch, dtype),
        device="cuda:0",
    )
    torch.cuda.synchronize()
    for _ in range(rounds):
        q.put((time.perf_counter_ns(), t))
        time.sleep(0.002)
    samples = out.get()
    p.join()
    return samples


def main(argv=None):
    parser = arguments(__doc__, "gpu")
    args = parser.parse_args(argv)
    import torch

    import zctipc

    report = new_report("gpu", ("zctipc", "torch"), rows=[], skipped=None)
    reason = zctipc.cuda.unavailable_reason() or (None if torch.cuda.is_available() else "torch sees no CUDA device")
    if reason:
        report["skipped"] = reason
        print(f"skipping the GPU benchmark: {reason}")
    else:
        report["gpu"] = torch.cuda.get_device_name(0)
        rounds = 20 if args.quick or args.tiny else 200
        for size, nbytes in SIZES.items():
            for dtype in DTYPES:
                for peer in ("zctipc", "torch.multiprocessing"):
                    samples = run(peer, nbytes, dtype, rounds)
                    r = {
                        "size": size,
                        "dtype": dtype,
                        "peer": peer,
                        "first_us": samples[0] / 1e3,
                        **summarize(samples[1:]),
                    }
                    report["rows"].append(r)
                    print(
                        f"  {size} {dtype} {peer:<22} first {fmt_us(r['first_us'])}, steady p50 "
                        f"{fmt_us(r['median_us'])}, p99 {fmt_us(r['p99_us'])}",
                        flush=True,
                    )
    finish(report, render(report), args.json, "bench_gpu", args.readme)


def render(report):
    head = f"GPU hand-off, {report['date']}, on {machine_line(report['machine'])}"
    if report["skipped"]:
        return f"{head}: not measured ({report['skipped']})."
    rows = []
    for r in report["rows"]:
        base = next(
            x for x in report["rows"] if (x["size"], x["dtype"], x["peer"]) == (r["size"], r["dtype"], "zctipc")
        )
        rows.append(
            (
                r["size"],
                r["dtype"],
                r["peer"],
                fmt_us(r["first_us"]),
                fmt_us(r["median_us"]),
                fmt_us(r["p99_us"]),
                fmt_ratio(r["median_us"] / base["median_us"]),
            )
        )
    return f"{head}, {report['gpu']}.\n\n" + markdown_table(
        ["size", "dtype", "peer", "first send", "steady p50", "steady p99", "p50 vs zctipc"], rows
    )


if __name__ == "__main__":
    main()
