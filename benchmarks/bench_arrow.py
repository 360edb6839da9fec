"""Arrow tables and Go producers, every peer in one run.

arrow   a table of 10 float64 columns (1 GiB; 16 MiB with --quick) handed to
        another process, from the producer's start to a table the consumer
        can use: zctipc.share_table + attach_table (a new segment each time;
        the handle goes over a Pipe), zctipc.Queue (a pool buffer, reused),
        the Arrow IPC stream written through an OS pipe (pa.ipc), and a
        pickling multiprocessing.Queue
go      a 1 MiB float32 tensor handed over through a zctipc.Queue, wall
        clock from just before the put to the consumer holding the array:
        a Go producer (go/examples/producer, built with the Go toolchain)
        next to a Python producer
rates   32-byte messages through a zctipc.Queue, per second and per
        message, with 1 and 4 producers and consumers: Python to Python
        (processes), Go to Go (go/examples producer and consumer,
        goroutines) and Go to Python

  python benchmarks/bench_arrow.py [--only arrow,go,rates] [--quick] [--json PATH]
"""

import multiprocessing
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

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
    machine_line,
    markdown_table,
    new_report,
    summarize,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = 10


def make_table(nbytes):
    rows = nbytes // (8 * COLUMNS)
    rng = np.random.default_rng(1)
    return pa.table({f"c{i}": rng.random(rows) for i in range(COLUMNS)})


# -- arrow -----------------------------------------------------------------------


def consume_handle(conn, out):
    while True:
        handle = conn.recv()
        if handle is None:
            return
        t = zctipc.attach_table(handle)
        out.send((time.perf_counter_ns(), t.num_rows))
        del t


def consume_pipe(reader, out, rounds):
    with os.fdopen(os.dup(reader.fileno()), "rb") as f:  # the raw pipe beneath the Connection
        for _ in range(rounds):
            t = pa.ipc.open_stream(f).read_all()
            out.send((time.perf_counter_ns(), t.num_rows))
            del t


def consume_queue(q, out, rounds):
    for _ in range(rounds):
        t = q.get()
        out.send((time.perf_counter_ns(), t.num_rows))
        del t


def arrow_rounds(peer, table, rounds):
    ctx = zctipc.get_context("spawn")
    out_recv, out_send = ctx.Pipe(duplex=False)
    samples = []
    if peer == "zctipc share/attach":
        conn_recv, conn_send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=consume_handle, args=(conn_recv, out_send))
        p.start()
        for _ in range(rounds):
            start = time.perf_counter_ns()
            h = zctipc.share_table(table)
            conn_send.send(h)
            done, rows = out_recv.recv()
            assert rows == table.num_rows
            samples.append(done - start)
            h.close()
        conn_send.send(None)
    elif peer == "zctipc.Queue":
        q = zctipc.Queue()
        p = ctx.Process(target=consume_queue, args=(q, out_send, rounds))
        p.start()
        for _ in range(rounds):
            start = time.perf_counter_ns()
            q.put(table)  # one IPC stream written into a pool buffer, sent by descriptor
            done, rows = out_recv.recv()
            samples.append(done - start)
    elif peer == "pa.ipc through a pipe":
        reader, writer = ctx.Pipe(duplex=False)  # an OS pipe, handed to the child
        p = ctx.Process(target=consume_pipe, args=(reader, out_send, rounds))
        p.start()
        reader.close()
        with os.fdopen(os.dup(writer.fileno()), "wb") as f:
            for _ in range(rounds):
                start = time.perf_counter_ns()
                with pa.ipc.new_stream(f, table.schema) as w:
                    w.write_table(table)
                f.flush()
                done, rows = out_recv.recv()
                samples.append(done - start)
        writer.close()
    else:
        # Plain pickling: without the reducer zctipc registers for tables,
        # which would send this one through shared memory.
        q = multiprocessing.get_context("spawn").Queue()
        p = ctx.Process(target=consume_queue, args=(q, out_send, rounds))
        p.start()
        with PlainPickling(pa.Table):
            for _ in range(rounds):
                start = time.perf_counter_ns()
                q.put(table)
                done, rows = out_recv.recv()
                samples.append(done - start)
    p.join()
    return samples


ARROW_PEERS = ("zctipc share/attach", "zctipc.Queue", "pa.ipc through a pipe", "multiprocessing.Queue (pickling)")


def suite_arrow(args, report):
    nbytes = (1 << 20) if args.tiny else (16 << 20) if args.quick else (1 << 30)
    table = make_table(nbytes)
    rounds = 2 if args.tiny else 3 if args.quick else 5
    rows, base = [], None
    for peer in ARROW_PEERS:
        stats = summarize(arrow_rounds(peer, table, rounds))
        stats.update(peer=peer, nbytes=table.nbytes)
        report["arrow"].append(stats)
        base = base or stats["median_us"]
        print(f"  arrow {fmt_bytes(table.nbytes)} {peer:<34} median {fmt_us(stats['median_us'])}", flush=True)
        rows.append(
            (
                fmt_bytes(table.nbytes),
                peer,
                fmt_us(stats["median_us"]),
                stats["rounds"],
                fmt_ratio(stats["median_us"] / base),
            )
        )
    return markdown_table(
        ["table (10 float64 columns)", "peer", "median, start to usable table", "rounds", "vs zctipc"], rows
    )


# -- go ----------------------------------------------------------------------------


def python_stamped(q, n, k):
    bufs = [zctipc.empty(n, np.float32) for _ in range(k)]
    for b in bufs:
        time.sleep(0.002)
        b.view(np.int64)[0] = time.time_ns()
        q.put(b)
    bufs.clear()


def receive_stamped(q, k):
    samples = []
    for _ in range(k):
        a = q.get()
        got = time.time_ns()
        samples.append(got - int(a.view(np.int64)[0]))
        del a
    return samples


def build_example(name):
    out = os.path.join(tempfile.mkdtemp(prefix="zctipc-bench-"), name)
    subprocess.run(["go", "build", "-o", out, f"./go/examples/{name}"], cwd=ROOT, check=True)
    return out


def suite_go(args, report):
    n, k = 1 << 18, (10 if args.tiny else 50 if args.quick else 500)
    rows, base = [], None
    try:
        producer = build_example("producer")
    except (OSError, subprocess.CalledProcessError) as exc:
        report["skipped"]["go"] = f"the Go producer could not be built: {exc}"
        return f"Go producer: skipped ({report['skipped']['go']})"
    for peer in ("Python producer", "Go producer"):
        q = zctipc.Queue()
        if peer == "Go producer":
            p = subprocess.Popen([producer, "stamped", q.name, str(n), str(k)])
        else:
            p = zctipc.get_context("spawn").Process(target=python_stamped, args=(q, n, k))
            p.start()
        stats = summarize(receive_stamped(q, k))
        p.wait() if peer == "Go producer" else p.join()
        stats["peer"] = peer
        report["go"].append(stats)
        base = base or stats["median_us"]
        print(f"  go {peer:<16} median {fmt_us(stats['median_us'])}, p99 {fmt_us(stats['p99_us'])}", flush=True)
        rows.append((peer, *latency_cells(stats, base)))
    return markdown_table(
        ["1 MiB float32 tensor to a Python consumer", "median", "p99", "rounds", "vs Python producer"], rows
    )


# -- rates ---------------------------------------------------------------------------

MESSAGE = b"m" * 32


def python_burst(q, k, start):
    start.put(time.time_ns())
    for _ in range(k):
        q.put(MESSAGE)


def python_take(q, k, end):
    for _ in range(k):
        q.get()
    end.put(time.time_ns())


def burst(pair, k, n, programs):
    """Seconds from the first producer's start to the last message taken:
    k messages of 32 bytes, n producers and n consumers (processes for
    Python, goroutines of one process for Go)."""
    q = zctipc.Queue()
    ctx = zctipc.get_context("forkserver")
    ends, starts, procs = ctx.SimpleQueue(), ctx.SimpleQueue(), []
    share = [k // n + (1 if i < k % n else 0) for i in range(n)]
    if pair.endswith("Python"):
        procs = [ctx.Process(target=python_take, args=(q, s, ends)) for s in share]
    else:
        consumer = subprocess.Popen(
            [programs["consumer"], "burst", q.name, str(k), str(n)], stdout=subprocess.PIPE, text=True
        )
    for p in procs:
        p.start()
    time.sleep(0.5)  # the consumers wait on the empty queue
    if pair.startswith("Python"):
        producers = [ctx.Process(target=python_burst, args=(q, s, starts)) for s in share]
        for p in producers:
            p.start()
        first = min(starts.get() for _ in producers)
        for p in producers:
            p.join()
    else:
        out = subprocess.run(
            [programs["producer"], "burst", q.name, str(k), str(n)], capture_output=True, text=True, check=True
        )
        first = int(out.stdout.split()[1])
    if procs:
        last = max(ends.get() for _ in procs)
        for p in procs:
            p.join()
    else:
        last = int(consumer.communicate(timeout=600)[0].split()[1])
    q.close()
    return (last - first) / 1e9


RATE_PAIRS = ("Python to Python", "Go to Go", "Go to Python")


def suite_rates(args, report):
    k = 2_000 if args.tiny else 50_000 if args.quick else 400_000
    try:
        programs = {name: build_example(name) for name in ("producer", "consumer")}
    except (OSError, subprocess.CalledProcessError) as exc:
        report["skipped"]["rates"] = f"the Go examples could not be built: {exc}"
        return f"Go rates: skipped ({report['skipped']['rates']})"
    rows = []
    for n in (1, 4):
        base = None
        for pair in RATE_PAIRS:
            seconds = burst(pair, k, n, programs)
            per_second, per_message = k / seconds, seconds / k * 1e6
            report["rates"].append(
                {
                    "pair": pair,
                    "producers": n,
                    "consumers": n,
                    "messages": k,
                    "per_second": per_second,
                    "per_message_us": per_message,
                }
            )
            base = base or per_message
            print(
                f"  rates {n}/{n} {pair:<18} {per_second / 1e3:,.0f} K msg/s, {fmt_us(per_message)} per message",
                flush=True,
            )
            rows.append(
                (f"{n}/{n}", pair, f"{per_second / 1e3:,.0f} K/s", fmt_us(per_message), fmt_ratio(base / per_message))
            )
    return markdown_table(
        ["producers/consumers", "32-byte messages through a zctipc.Queue", "rate", "per message", "x Python to Python"],
        rows,
    )


SUITES = {"arrow": suite_arrow, "go": suite_go, "rates": suite_rates}


def render(report):
    v = ", ".join(f"{k} {val}" for k, val in report["versions"].items() if val)
    parts = [f"Arrow and Go, {report['date']}, on {machine_line(report['machine'])}; {v}."]
    parts += [report["tables"][name] for name in SUITES if name in report["tables"]]
    return "\n\n".join(parts)


def main(argv=None):
    parser = arguments(__doc__, "arrow", SUITES)
    args = parser.parse_args(argv)
    report = new_report("arrow", ("zctipc", "pyarrow"), arrow=[], go=[], rates=[], skipped={}, tables={})
    for name in args.only:
        report["tables"][name] = SUITES[name](args, report)
    finish(report, render(report), args.json)


if __name__ == "__main__":
    main()
