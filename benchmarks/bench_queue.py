"""Queue benchmarks, every peer in one run on one machine.

local      put+get in one process of a 5-tuple, 32 bytes, 10 float32 and a
           64 KiB array: the per-message cost of each side, with the
           floor of a message (one pickle, one load, two native calls)
latency    one small message in flight between two processes, 1 ms apart:
           put to get, p50 and p99, with the consumer's CPU; zctipc asleep
           on a futex (the default) and polling
rate       small messages (a 5-tuple of ints), 1 producer / 1 consumer and
           4 / 4: messages per second for zctipc.Queue, multiprocessing.Queue
           and faster-fifo (when installed)
big        a 1 GiB tensor already in shared memory: put to a usable tensor in
           the consumer, vs torch.multiprocessing's Queue and a pickling
           multiprocessing.Queue
copy-in    a 1 GiB plain NumPy array (not shared): the cost of put, against
           one np.copyto of 1 GiB in the same run
alloc      zctipc.empty((256, 1024), float32) and release, from the pool vs
           a fresh segment each time, per second
pool       concurrent.futures.ProcessPoolExecutor mapping a function over
           1,000 arrays of 4 MiB that returns arrays of the same size: with
           zctipc's context vs the standard library's (fork and forkserver)
state-dict a fresh torch state dict of 98 tensors (33.6 MB, not in shared
           memory) put to a consumer: how long put blocks the caller and
           how long until the consumer has the dict, for a process's first
           put and later ones, vs torch.multiprocessing's Queue (whose put
           returns at once: its feeder thread shares the tensors later)

  python benchmarks/bench_queue.py [--only local,rate,latency,big,copy-in,alloc,pool,state-dict] [--quick]
                                   [--json PATH]
"""

import contextlib
import multiprocessing
import os
import sys
import time

import numpy as np

import zctipc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    PlainPickling,
    arguments,
    finish,
    fmt_bytes,
    fmt_ratio,
    fmt_us,
    latency_cells,
    left_out,
    machine_line,
    markdown_table,
    new_report,
    summarize,
)

MSG = (1, 2, 3, 4, 5)
GIB = 1 << 30
BIG = GIB  # the big tensor and the copy-in array; 256 MiB with --quick, 1 MiB with --tiny
TINY = False


# -- rate ------------------------------------------------------------------


BATCH = 100


def _producer(q, n, go, batched):
    go.wait()
    if batched:
        batch = [MSG] * BATCH
        for _ in range(n // BATCH):
            q.put_many(batch)
        return
    put = q.put
    for _ in range(n):
        put(MSG)


def _consumer(q, n, go, done, batched):
    go.wait()
    if batched:
        got = 0
        while got < n:
            got += len(
                q.get_many(max_items=min(BATCH, n - got))
                if hasattr(q, "get_nowait") and not _is_ff(q)
                else q.get_many(max_messages_to_get=min(BATCH, n - got))
            )
    else:
        get = q.get
        for _ in range(n):
            get()
    done.put(time.perf_counter())


def _is_ff(q):
    return type(q).__module__ == "faster_fifo"


def _make_queue(peer):
    if peer == "zctipc.Queue":
        return zctipc.Queue(), zctipc.get_context()
    ctx = multiprocessing.get_context("forkserver")
    if peer == "multiprocessing.Queue":
        return ctx.Queue(), ctx
    import faster_fifo
    import faster_fifo_reduction  # noqa: F401  lets a faster_fifo.Queue be passed to children

    return faster_fifo.Queue(max_size_bytes=100 << 20), ctx


def rate(peer, producers, consumers, total, batched=False):
    """Messages per second through one queue with all processes started
    before the clock starts; batched uses put_many and get_many."""
    q, ctx = _make_queue(peer)
    std = multiprocessing.get_context("forkserver")
    go, done = std.Event(), std.SimpleQueue()
    per_p = total // producers // BATCH * BATCH
    total = per_p * producers
    per_c = [total // consumers + (1 if i < total % consumers else 0) for i in range(consumers)]
    procs = [ctx.Process(target=_consumer, args=(q, n, go, done, batched)) for n in per_c]
    procs += [ctx.Process(target=_producer, args=(q, per_p, go, batched)) for _ in range(producers)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let every process reach go.wait()
    start = time.perf_counter()
    go.set()
    end = max(done.get() for _ in range(consumers))
    for p in procs:
        p.join(60)
    if hasattr(q, "close"):
        q.close()
    return total / (end - start)


# (peer, batched): multiprocessing.Queue has no batch API; its put hands
# messages to a feeder thread, which batches them itself.
RATE_PEERS = [
    ("zctipc.Queue", False),
    ("multiprocessing.Queue", False),
    ("faster-fifo", False),
    ("zctipc.Queue", True),
    ("faster-fifo", True),
]


def suite_rate(quick, report):
    total = 2_000 if TINY else 50_000 if quick else 400_000
    rows = []
    for producers, consumers in ((1, 1), (4, 4)):
        results = {}
        for peer, batched in RATE_PEERS:
            why = left_out("faster-fifo", "faster_fifo") if peer == "faster-fifo" else None
            if why:
                if not batched:
                    report["skipped"].append({"peer": peer, "reason": why})
                continue
            label = f"{peer} {'put_many/get_many' if batched else 'put/get'}"
            print(f"  rate {producers}/{consumers} {label:<40}", end="", flush=True)
            results[label] = rate(peer, producers, consumers, total, batched)
            print(f" {results[label] / 1e3:,.0f} K msg/s", flush=True)
        best = max(v for k, v in results.items() if k.startswith("zctipc"))
        single = results["zctipc.Queue put/get"]
        for label, r in results.items():
            report["rate"].append(
                {"peer": label, "producers": producers, "consumers": consumers, "messages": total, "per_second": r}
            )
            rows.append(
                [f"{producers}/{consumers}", label, f"{r / 1e3:,.0f} K/s", fmt_ratio(single / r), fmt_ratio(best / r)]
            )
    return rows


# -- local -----------------------------------------------------------------


def _local_objects():
    return {
        "5-tuple of ints": MSG,
        "32 bytes": b"x" * 32,
        "10 float32": np.arange(10, dtype=np.float32),
        "64 KiB float32": np.ones(16384, np.float32),
    }


def _per_pair(put, get, obj, seconds):
    """Seconds per put+get of obj in this process, the best of three runs."""
    for _ in range(200):
        put(obj)
        get()
    best = None
    for _ in range(3):
        n, start = 0, time.perf_counter()
        while True:
            for _ in range(100):
                put(obj)
                get()
            n += 100
            elapsed = time.perf_counter() - start
            if elapsed > seconds:
                break
        best = min(best or elapsed / n, elapsed / n)
    return best


def message_floor(obj, seconds=0.2):
    """What a message that is not an array cannot cost less than: one
    pickle of obj, one load of it, and two calls into the native library
    (one to put, one to get) that do nothing; bytes are not pickled. None
    for an array, which zctipc does not pickle."""
    import pickle

    from zctipc._core import native

    noop = native.lib().zct_abi_version
    if isinstance(obj, np.ndarray):
        return None
    if type(obj) is bytes:
        return _per_pair(lambda o: noop(), lambda: noop(), obj, seconds)
    data = pickle.dumps(obj, 5)
    dumps, loads = pickle.dumps, pickle.loads
    return _per_pair(lambda o: (dumps(o, 5), noop()), lambda: (loads(data), noop()), obj, seconds)


def suite_local(quick, report):
    """put+get pairs in one process: the cost of a message on each side,
    without a second process or a wake-up."""
    seconds = 0.05 if TINY else 0.2 if quick else 1.0
    peers = ["zctipc.Queue", "faster-fifo", "multiprocessing.Queue"]
    rows = []
    for label, obj in _local_objects().items():
        results = {}
        for peer in peers:
            if peer == "faster-fifo" and left_out("faster-fifo", "faster_fifo"):
                continue
            q, _ = _make_queue(peer)
            with PlainPickling(np.ndarray) if peer == "multiprocessing.Queue" else contextlib.nullcontext():
                results[peer] = _per_pair(q.put, q.get, obj, seconds)
            if hasattr(q, "close"):
                q.close()
        floor = message_floor(obj, seconds)
        base = results["zctipc.Queue"]
        for peer, per in results.items():
            report["local"].append(
                {
                    "object": label,
                    "peer": peer,
                    "per_pair_us": per * 1e6,
                    "floor_us": None if floor is None else floor * 1e6,
                }
            )
            print(f"  local {label:<16} {peer:<24} {per * 1e6:8.2f} us", flush=True)
            rows.append(
                [
                    label,
                    peer,
                    fmt_us(per * 1e6),
                    fmt_ratio(per / base),
                    "-" if floor is None else fmt_ratio(per / floor),
                ]
            )
        if floor is not None:
            rows.append([label, "floor: a pickle, a load, 2 native calls", fmt_us(floor * 1e6), "-", "1.0x"])
    return rows


# -- latency ---------------------------------------------------------------


def _latency_consumer(q, rounds, wait, results):
    if wait:
        q.set_wait(wait)
    lat = []
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        sent = q.get()[1]
        lat.append(time.perf_counter_ns() - sent)
    results.put((lat, (time.process_time() - cpu) / (time.perf_counter() - wall)))


def latency(peer, rounds, wait=None):
    """One small message in flight, 1 ms apart: the time from put to the
    consumer holding it, and the consumer's CPU use while it waits."""
    q, ctx = _make_queue(peer)
    results = multiprocessing.get_context("forkserver").SimpleQueue()
    p = ctx.Process(target=_latency_consumer, args=(q, rounds + 10, wait, results))
    p.start()
    time.sleep(1.0)
    for i in range(rounds + 10):
        time.sleep(0.001)
        q.put((i, time.perf_counter_ns()))
    lat, cpu = results.get()
    p.join(60)
    if hasattr(q, "close"):
        q.close()
    return lat[10:], cpu


def suite_latency(quick, report):
    rounds = 20 if TINY else 300 if quick else 2000
    peers = [
        ("zctipc.Queue", "sleep"),
        ("zctipc.Queue", "poll"),
        ("multiprocessing.Queue", None),
        ("faster-fifo", None),
    ]
    rows, base = [], None
    for peer, wait in peers:
        if peer == "faster-fifo" and left_out("faster-fifo", "faster_fifo"):
            continue
        label = f"{peer} ({wait})" if wait else peer
        lat, cpu = latency(peer, rounds, wait)
        st = summarize(lat)
        report["latency"].append({"peer": label, "consumer_cpu": cpu, **st})
        print(
            f"  latency {label:<28} p50 {fmt_us(st['median_us'])} p99 {fmt_us(st['p99_us'])} CPU {cpu:.0%}", flush=True
        )
        base = base or st["median_us"]
        rows.append([label, *latency_cells(st, base), f"{cpu:.0%}"])
    return rows


# -- big -------------------------------------------------------------------


def _big_consumer(q, rounds, ctl, torch_mp):
    if torch_mp:
        import torch.multiprocessing  # noqa: F401
    for _ in range(rounds):
        t = q.get()
        done = time.perf_counter_ns()
        ok = float(t[-1]) == 42.0
        del t
        ctl.send((done, ok))


def big(peer, rounds):
    """put of a 1 GiB tensor already in shared memory to a usable tensor in
    the consumer (a NumPy array where torch is not installed): a list of
    nanoseconds."""
    n = BIG // 4
    torch_mp = peer.startswith("torch")
    if peer == "zctipc.Queue":
        q, ctx = zctipc.Queue(), zctipc.get_context()
        if left_out("torch", "torch"):
            t = zctipc.empty(n, np.float32)
        else:
            import torch

            t = zctipc.empty(n, torch.float32)
    elif torch_mp:
        import torch
        import torch.multiprocessing as tmp

        ctx = tmp.get_context("forkserver")
        q = ctx.Queue()
        t = torch.empty(n, dtype=torch.float32).share_memory_()
    else:
        # A NumPy array: torch.multiprocessing's reducers, once imported,
        # would share a tensor instead of pickling it; and pickled without
        # zctipc's reducers, as a program without zctipc pickles it.
        ctx = multiprocessing.get_context("forkserver")
        q = ctx.Queue()
        t = np.full(n, 0.5, dtype=np.float32)
        plain = PlainPickling(np.ndarray)
    t[-1] = 42.0
    here, there = multiprocessing.get_context("forkserver").Pipe()
    p = ctx.Process(target=_big_consumer, args=(q, rounds + 2, there, torch_mp))
    p.start()
    times = []
    for i in range(rounds + 2):
        start = time.perf_counter_ns()
        q.put(t)
        done, ok = here.recv()
        if not ok:
            raise RuntimeError(f"{peer}: the consumer did not see the data")
        if i >= 2:
            times.append(done - start)
    p.join(120)
    if hasattr(q, "close"):
        q.close()
    if not torch_mp and peer != "zctipc.Queue":
        plain.close()
    return times


def suite_big(quick, report):
    rounds = 2 if TINY else 5 if quick else 20
    results = {}
    for peer in ("zctipc.Queue", "torch.multiprocessing.Queue", "multiprocessing.Queue (pickling)"):
        why = left_out("torch", "torch") if peer.startswith("torch") else None
        if why:
            report["skipped"].append({"peer": f"{peer} (big)", "reason": why})
            continue
        r = rounds if not peer.startswith("multiprocessing") else max(3, rounds // 4)
        print(f"  big {peer:<34}", end="", flush=True)
        results[peer] = summarize(big(peer, r))
        print(f" median {fmt_us(results[peer]['median_us'])}", flush=True)
    base = results["zctipc.Queue"]["median_us"]
    rows = []
    for peer, r in results.items():
        report["big"].append({"peer": peer, "bytes": BIG, **r})
        rows.append(
            [
                f"{peer}, {fmt_bytes(BIG)}",
                fmt_us(r["median_us"]),
                fmt_us(r["p99_us"]),
                r["rounds"],
                fmt_ratio(r["median_us"] / base),
            ]
        )
    return rows


# -- copy-in -----------------------------------------------------------------


def _drain(q, rounds, ctl):
    for _ in range(rounds):
        a = q.get()
        del a
        ctl.send(True)


def suite_copy_in(quick, report):
    """put of a plain 1 GiB array into warm pool pages, against np.copyto."""
    nbytes = BIG if TINY else (64 << 20) if quick else GIB
    rounds = 2 if TINY else 3 if quick else 8
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    copyto = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        np.copyto(dst, src)
        copyto.append(time.perf_counter_ns() - start)
    del dst
    q, ctx = zctipc.Queue(), zctipc.get_context()
    here, there = multiprocessing.get_context("forkserver").Pipe()
    p = ctx.Process(target=_drain, args=(q, rounds + 2, there))
    p.start()
    puts = []
    for i in range(rounds + 2):  # the first puts warm the pool's pages
        start = time.perf_counter_ns()
        q.put(src)
        elapsed = time.perf_counter_ns() - start
        here.recv()  # the consumer let go of the slot: the next put reuses it
        if i >= 2:
            puts.append(elapsed)
    p.join(60)
    q.close()
    c, z = summarize(copyto), summarize(puts)
    report["copy_in"] = {"bytes": nbytes, "copyto": c, "put": z}
    print(f"  copy-in put {fmt_us(z['median_us'])}, np.copyto {fmt_us(c['median_us'])}", flush=True)
    return [
        [fmt_bytes(nbytes), "np.copyto", fmt_us(c["median_us"]), "1.0x"],
        [
            fmt_bytes(nbytes),
            "zctipc.Queue.put (one copy into the pool)",
            fmt_us(z["median_us"]),
            fmt_ratio(z["median_us"] / c["median_us"]),
        ],
    ]


# -- alloc ---------------------------------------------------------------------


def suite_alloc(quick, report):
    seconds = 0.1 if TINY else 0.5 if quick else 2.0
    results = {}
    for peer in ("zctipc.empty (pool)", "create_shared_tensor (a segment each time)"):
        make = (
            (lambda: zctipc.empty((256, 1024), np.float32))
            if "pool" in peer
            else (lambda: zctipc.create_shared_tensor(shape=(256, 1024), dtype=np.float32))
        )
        for _ in range(10):
            make()
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            x = make()
            del x
            n += 1
        results[peer] = n / (time.perf_counter() - start)
        print(f"  alloc {peer:<44} {results[peer]:,.0f}/s", flush=True)
    base = results["zctipc.empty (pool)"]
    report["alloc"] = [{"peer": k, "per_second": v} for k, v in results.items()]
    return [[k, f"{v:,.0f}/s", fmt_ratio(base / v)] for k, v in results.items()]


# -- pool ----------------------------------------------------------------------


def suite_pool(quick, report):
    """ProcessPoolExecutor.map over 4 MiB arrays, each peer in a process of
    its own (_pool.py): the standard library's as a program without zctipc
    runs it. The peers take turns, three rounds in a full run, and each
    reports its median."""
    import statistics
    import subprocess

    tasks = 10 if TINY else 200 if quick else 1000
    rounds = 1 if TINY or quick else 3
    nbytes = (64 << 10) if TINY else 4 << 20
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_pool.py")
    peers = {"zctipc.get_context()": "zctipc", "stdlib fork": "fork", "stdlib forkserver": "forkserver"}
    times = {peer: [] for peer in peers}
    for _ in range(rounds):
        for peer, context in peers.items():
            out = subprocess.run(
                [sys.executable, script, context, str(tasks), str(nbytes)],
                capture_output=True,
                text=True,
                timeout=1800,
                check=True,
            )
            times[peer].append(float(out.stdout.split()[-1]))
    results = {}
    for peer in peers:
        results[peer] = statistics.median(times[peer])
        print(f"  pool {peer:<24} {results[peer]:.2f} s (median of {rounds})", flush=True)
    base = results["zctipc.get_context()"]
    report["pool"] = [
        {"peer": k, "tasks": tasks, "bytes": nbytes, "seconds": v, "rounds": times[k]} for k, v in results.items()
    ]
    return [
        [f"{tasks:,} x {fmt_bytes(nbytes)}", k, f"{v:.2f} s", f"{tasks / v:,.0f}/s", fmt_ratio(v / base)]
        for k, v in results.items()
    ]


# -- state-dict ----------------------------------------------------------------


def suite_state_dict(quick, report):
    """A fresh state dict put to a consumer, each peer in processes of its
    own (_state_dict.py), so that round 0 is a process's first put (a pool
    with no arenas yet); the peers take turns. Medians over the runs."""
    import statistics
    import subprocess

    why = left_out("torch", "torch")
    if why:  # a state dict is torch's
        report["skipped"].append({"peer": "the state-dict rows", "reason": why})
        return []
    runs = 1 if TINY else 3 if quick else 6
    rounds = 2 if TINY else 6
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_state_dict.py")
    peers = {"zctipc.Queue": "zctipc", "torch.multiprocessing.Queue": "torch"}
    first = {peer: [] for peer in peers}
    later = {peer: [] for peer in peers}
    for _ in range(runs):
        for peer, name in peers.items():
            command = [sys.executable, script, name, str(rounds), "1"]
            out = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
            lines = [tuple(map(float, line.split())) for line in out.stdout.splitlines() if line.strip()]
            first[peer].append(lines[0])
            later[peer] += lines[1:]
    rows, report["state_dict"] = [], []
    for peer in peers:
        for when, samples in (("first put", first[peer]), ("later puts", later[peer])):
            put = statistics.median(s[0] for s in samples)
            end = statistics.median(s[1] for s in samples)
            report["state_dict"].append({"peer": peer, "when": when, "put_ms": put, "end_to_end_ms": end})
            rows.append([peer, when, f"{put:.1f} ms", f"{end:.1f} ms", len(samples)])
            print(f"  state-dict {peer:<28} {when:<10} put {put:6.1f} ms, end to end {end:6.1f} ms", flush=True)
    return rows


SUITES = {
    "local": suite_local,
    "rate": suite_rate,
    "latency": suite_latency,
    "big": suite_big,
    "copy-in": suite_copy_in,
    "alloc": suite_alloc,
    "pool": suite_pool,
    "state-dict": suite_state_dict,
}
HEADERS = {
    "local": ["object", "peer, put+get in one process", "per message", "vs zctipc", "vs the message floor"],
    "latency": [
        "one message in flight, 1 ms apart",
        "p50",
        "p99",
        "messages",
        "p50 vs zctipc sleeping",
        "consumer CPU",
    ],
    "rate": ["producers/consumers", "peer and API", "messages per second", "zctipc put/get is", "zctipc at best is"],
    "big": ["big tensor, put to usable tensor", "median", "p99", "rounds", "vs zctipc"],
    "copy-in": ["plain array", "operation", "median", "vs np.copyto"],
    "alloc": ["allocation of a 1 MiB float32 array and release", "rate", "zctipc pool is"],
    "pool": ["ProcessPoolExecutor.map, a + 1", "context", "end to end (median)", "tasks per second", "zctipc is"],
    "state-dict": ["state dict of 98 tensors, 33.6 MB", "puts", "put blocks (median)", "to the consumer", "samples"],
}


def render(report):
    v = report["versions"]
    out = [
        f"Queues, {report['date']}, on {machine_line(report['machine'])}; "
        + ", ".join(f"{k} {val}" for k, val in v.items() if val)
        + "."
    ]
    for name, rows in report["tables"].items():
        out += ["", markdown_table(HEADERS[name], rows)]
    for s in report["skipped"]:
        out += ["", f"Skipped {s['peer']}: {s['reason']}."]
    return "\n".join(out)


def main(argv=None):
    parser = arguments(__doc__, "queue", SUITES)
    args = parser.parse_args(argv)
    global BIG, TINY
    TINY = args.tiny
    BIG = (1 << 20) if TINY else (256 << 20) if args.quick else GIB  # --quick: under two minutes in all
    report = new_report(
        "queue",
        ("zctipc", "numpy", "torch", "faster-fifo"),
        local=[],
        rate=[],
        latency=[],
        big=[],
        skipped=[],
        tables={},
    )
    for name in args.only:
        report["tables"][name] = SUITES[name](args.quick, report)
    finish(report, render(report), args.json)


if __name__ == "__main__":
    main()
