"""GPU tensors between processes, zctipc vs torch.multiprocessing, in one run.

Hand-off: a tensor already on the GPU (64 MiB and 1 GiB, float32 and
bfloat16) is put in a queue by the producer; the time is until the consumer
holds a usable tensor (its stream ordered after the producer's work).
"first" is the first send of a tensor (the consumer opens the allocation);
"steady" the median of the rest (the allocation is cached). The consumer
has started CUDA before the first round, and each round waits for the one
before, so one message is in flight at a time. Peers: zctipc's
legacy-IPC route (torch's own allocator), zctipc with its shareable
allocator (the tensor goes by file descriptor), torch.multiprocessing.

Model weights: a model's state dict (300 bf16 tensors, 2 GiB and more) goes
from one process to another and is rebuilt there. "first send" is until the
consumer holds every tensor (zctipc: share_state_dict packs the tensors
into one allocation, sent as one message; torch.multiprocessing: the dict,
one IPC handle per tensor). "update" is a new set of weights: zctipc writes
them in place (SharedStateDict.update) and sends a note, torch copies them
into the tensors it sent and sends the dict again; the consumer acknowledges
once it can use them. "update in place" is zctipc with the producer's model
living in the shared memory (nothing to copy). The device's copy bandwidth,
a plain device-to-device copy of the same bytes, is measured in the same run.

Every producer runs in a fresh process, so the shareable allocator goes in
before CUDA starts. Without a GPU the benchmark says why and measures
nothing.

With --profile PATH, each hand-off runs as many rounds again after the
timed ones, its consumer under cProfile, and the functions with the most
time of their own go to PATH.

    python benchmarks/bench_gpu.py [--quick] [--json PATH] [--profile PATH]
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
HANDOFF_PEERS = ("zctipc", "zctipc (shareable allocator)", "torch.multiprocessing")
MODEL_PEERS = ("zctipc", "torch.multiprocessing")
LAYERS = 100  # three tensors each: 300
HIDDEN, WIDTH = 4096, 2624  # a layer's weight: 4096 x 2624 bf16, 20.5 MiB


def _context(peer):
    """(multiprocessing context, queue maker) of a peer."""
    if peer.startswith("zctipc"):
        import zctipc

        return zctipc.get_context("spawn"), zctipc.Queue
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    return ctx, ctx.Queue


# -- hand-off ----------------------------------------------------------------------


def start_cuda():
    """Start CUDA in this process (context, streams), so no round pays it."""
    import torch

    torch.empty(1, device="cuda:0")
    torch.cuda.synchronize()


def handoff_consumer(q, out, rounds, profile=False):
    """Time rounds hand-offs; with profile, as many more after them under
    cProfile (untimed: the profiler slows them)."""
    start_cuda()
    out.put("ready")
    samples = []
    profiler = None
    for i in range(2 * rounds if profile else rounds):
        if i == rounds:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        sent, t = q.get()  # usable: the current stream is ordered after the producer's work
        samples.append(time.perf_counter_ns() - sent)
        del t
        out.put(None)  # the next round starts after this one: one message in flight
    out.put((samples[:rounds], _top(profiler)))


def _top(profiler, n=20):
    """The n functions of profiler's run with the most time of their own,
    as pstats prints them ("" without a profiler)."""
    if profiler is None:
        return ""
    import io
    import pstats

    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(n)
    return text.getvalue()


def handoff_producer(peer, nbytes, dtype, rounds, profile, result):
    import torch

    if peer == "zctipc (shareable allocator)":
        import zctipc

        zctipc.cuda.use_shareable_allocator()
    ctx, make_queue = _context(peer)
    q, out = make_queue(), make_queue()
    p = ctx.Process(target=handoff_consumer, args=(q, out, rounds, profile))
    p.start()
    dt = getattr(torch, dtype)
    t = torch.ones(nbytes // dt.itemsize, dtype=dt, device="cuda:0")
    torch.cuda.synchronize()
    assert out.get() == "ready"
    for _ in range(2 * rounds if profile else rounds):
        q.put((time.perf_counter_ns(), t))
        out.get()
        time.sleep(0.002)
    result.put(out.get())
    p.join()


# -- model weights ---------------------------------------------------------------


def make_model(torch, seed):
    """A state dict of 3 * LAYERS bf16 tensors on cuda:0."""
    g = torch.Generator(device="cuda:0").manual_seed(seed)
    sd = {}
    for i in range(LAYERS):
        sd[f"layers.{i}.weight"] = torch.randn(HIDDEN, WIDTH, device="cuda:0", generator=g, dtype=torch.bfloat16)
        sd[f"layers.{i}.bias"] = torch.randn(HIDDEN, device="cuda:0", generator=g, dtype=torch.bfloat16)
        sd[f"layers.{i}.norm"] = torch.randn(WIDTH, device="cuda:0", generator=g, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    return sd


def model_consumer(peer, q, acks, rounds):
    import torch

    import zctipc

    start_cuda()
    acks.put(("ready", 0))
    msg = q.get()
    tensors = zctipc.cuda.attach_state_dict(msg) if peer == "zctipc" else msg
    torch.cuda.synchronize()
    acks.put((time.perf_counter_ns(), len(tensors)))
    for _ in range(2 * rounds):
        msg = q.get()
        if peer != "zctipc":
            tensors = msg
        torch.cuda.current_stream().synchronize()
        acks.put((time.perf_counter_ns(), len(tensors)))


def model_producer(peer, rounds, result):
    import torch

    import zctipc

    ctx, make_queue = _context(peer)
    q, acks = make_queue(), make_queue()
    p = ctx.Process(target=model_consumer, args=(peer, q, acks, rounds))
    p.start()
    sd = make_model(torch, 1)
    sources = (make_model(torch, 2), make_model(torch, 3))  # new weights, taking turns
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    # The device's copy bandwidth over the same bytes, as one copy.
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    dst.copy_(src)
    torch.cuda.synchronize()
    copy_ns = time.perf_counter_ns() - start
    del src, dst
    assert acks.get()[0] == "ready"
    start = time.perf_counter_ns()
    if peer == "zctipc":
        shared = zctipc.cuda.share_state_dict(sd)
        q.put(shared)
    else:
        q.put(sd)
    done, count = acks.get()
    first = done - start
    assert count == len(sd)
    updates, in_place = [], []
    for i in range(rounds):
        new = sources[i % 2]
        start = time.perf_counter_ns()
        if peer == "zctipc":
            shared.update(new)
            q.put(i)
        else:
            for k, v in new.items():
                sd[k].copy_(v)
            torch.cuda.current_stream().synchronize()
            q.put(sd)
        done, _ = acks.get()
        updates.append(done - start)
    for i in range(rounds):
        # The producer's model lives in the shared memory (zctipc) or is the
        # tensors sent (torch): the weights change in place, by the model.
        target = shared.tensors if peer == "zctipc" else sd
        target["layers.0.bias"].add_(1)
        torch.cuda.current_stream().synchronize()
        start = time.perf_counter_ns()
        q.put(i if peer == "zctipc" else sd)
        done, _ = acks.get()
        in_place.append(done - start)
    p.join()
    result.put(
        {
            "tensors": len(sd),
            "bytes": nbytes,
            "copy_us": copy_ns / 1e3,
            "first_us": first / 1e3,
            "update": summarize(updates),
            "in_place": summarize(in_place),
            "allocations": shared.allocations if peer == "zctipc" else None,
        }
    )


def in_fresh_process(target, *args):
    """Run target(*args, result) in a fresh spawned process; its result."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    result = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, result))
    p.start()
    got = result.get()
    p.join()
    return got


def main(argv=None):
    parser = arguments(__doc__, "gpu")
    parser.add_argument(
        "--profile", metavar="PATH", help="profile each hand-off consumer in extra rounds; the top functions to PATH"
    )
    args = parser.parse_args(argv)
    profiles = []
    import torch

    import zctipc

    report = new_report("gpu", ("zctipc", "torch"), rows=[], model=[], skipped=None)
    reason = zctipc.cuda.unavailable_reason() or (None if torch.cuda.is_available() else "torch sees no CUDA device")
    if reason:
        report["skipped"] = reason
        print(f"skipping the GPU benchmark: {reason}")
    else:
        report["gpu"] = torch.cuda.get_device_name(0)
        rounds = 20 if args.quick or args.tiny else 200
        for size, nbytes in SIZES.items():
            for dtype in DTYPES:
                for peer in HANDOFF_PEERS:
                    samples, top = in_fresh_process(handoff_producer, peer, nbytes, dtype, rounds, bool(args.profile))
                    profiles.append(f"== {size} {dtype} {peer}\n{top}")
                    r = {"size": size, "dtype": dtype, "peer": peer, "first_us": samples[0] / 1e3}
                    r.update(summarize(samples[1:]))
                    report["rows"].append(r)
                    print(
                        f"  {size} {dtype} {peer:<29} first {fmt_us(r['first_us'])}, steady p50 "
                        f"{fmt_us(r['median_us'])}, p99 {fmt_us(r['p99_us'])}",
                        flush=True,
                    )
        for peer in MODEL_PEERS:
            r = {"peer": peer, **in_fresh_process(model_producer, peer, 5 if args.quick or args.tiny else 20)}
            report["model"].append(r)
            print(
                f"  model {r['tensors']} tensors {r['bytes'] / 2**30:.2f} GiB {peer:<22} first "
                f"{fmt_us(r['first_us'])}, update p50 {fmt_us(r['update']['median_us'])}, in place p50 "
                f"{fmt_us(r['in_place']['median_us'])} (one device copy {fmt_us(r['copy_us'])})",
                flush=True,
            )
    if args.profile:
        with open(args.profile, "w") as f:
            f.write("\n".join(profiles))
    finish(report, render(report), args.json)


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
    text = f"{head}, {report['gpu']}.\n\n" + markdown_table(
        ["size", "dtype", "peer", "first send", "steady p50", "steady p99", "p50 vs zctipc"], rows
    )
    model = report.get("model") or []
    if model:
        m = model[0]
        base = next(x for x in model if x["peer"] == "zctipc")
        rows = []
        for r in model:
            gbps = r["bytes"] / (r["update"]["median_us"] * 1e3)
            rows.append(
                (
                    r["peer"],
                    fmt_us(r["first_us"]),
                    fmt_ratio(r["first_us"] / base["first_us"]),
                    fmt_us(r["update"]["median_us"]),
                    f"{gbps:.0f} GB/s",
                    fmt_us(r["in_place"]["median_us"]),
                )
            )
        copy_gbps = m["bytes"] / (m["copy_us"] * 1e3)
        text += (
            f"\n\nModel weights: {m['tensors']} bf16 tensors, {m['bytes'] / 2**30:.2f} GiB, from one process to "
            f"another on the same GPU (zctipc packs them into {base['allocations']} allocation). One device copy "
            f"of the same bytes: {fmt_us(m['copy_us'])} ({copy_gbps:.0f} GB/s).\n\n"
            + markdown_table(
                ["peer", "first send", "vs zctipc", "update p50", "update bandwidth", "update in place p50"], rows
            )
        )
    return text


if __name__ == "__main__":
    main()
