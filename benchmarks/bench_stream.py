"""Stream benchmarks: one writer, several readers, every peer in one run.

  throughput  float32 frames of 8,192 samples (32 KiB) and of 1 MiB, one
              writer and 1, 2 and 4 readers, each reader touching every byte
              of every frame (a checksum), for a fixed time in three runs
              taking turns with the peers (the median run counts): aggregate
              Gbit/s and frames/s of zctipc.Stream against pythusa's shared
              ring and iceoryx2 publish-subscribe (a u8 slice payload, no loss)
  latency     one 32 KiB frame in flight: writer-to-reader time, p50 and p99,
              and the reader's CPU; zctipc with its reader asleep (the
              default) and polling
  floor       single-core memcpy bandwidth in the same run, which one reader
              is compared against

The writer copies each frame from a prepared array (one copy, as an
application producing data would); zctipc readers block on futexes, pythusa's
poll (yielding the CPU between polls, its best case on a busy machine).

    python benchmarks/bench_stream.py [--only throughput,latency] [--quick] [--seconds S] [--rounds N]
                                      [--json PATH]
"""

import contextlib
import ctypes
import multiprocessing
import os
import shutil
import sys
import time

import numpy as np

import zctipc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    arguments,
    finish,
    fmt_ratio,
    fmt_us,
    latency_cells,
    left_out,
    machine_line,
    markdown_table,
    new_report,
    positive,
    summarize,
)
from _floor import memcpy_bytes_per_s

FRAMES = 32  # slots in every ring
SIZES = {"32 KiB": 8192, "1 MiB": 262144}  # float32 samples per frame
READERS = (1, 2, 4)


def checksum(frame):
    """Touch every byte of a frame (the frames of these runs are multiples
    of 8 bytes)."""
    return int(np.add.reduce(frame.view(np.uint64)))


# -- zctipc ------------------------------------------------------------------------


def zctipc_reader(stream, ready, results, go):
    r = stream.reader()
    ready.put(r.index)
    go.wait()
    count = total = 0
    for frame in r:
        total += checksum(frame)
        count += 1
    results.put(count)


def zctipc_writer(stream, seconds, ready, results, go):
    w = stream.writer()
    src = np.random.default_rng(1).random(stream.shape, dtype=np.float32)
    ready.put("writer")
    go.wait()
    start = time.perf_counter()
    end = start + seconds
    n = 0
    while True:
        frame = w.look()
        np.copyto(frame, src)
        w.increment()
        n += 1
        if n % 64 == 0 and time.perf_counter() >= end:
            break
    stream.end()
    results.put(("writer", n, time.perf_counter() - start))


def zctipc_latency_reader(stream, ready, results, wait="sleep"):
    r = stream.reader()
    r.set_wait(wait)
    ready.put(r.index)
    samples = []
    wall, cpu = time.perf_counter(), time.process_time()
    for frame in r:
        got = time.perf_counter_ns()
        samples.append(got - int(frame.view(np.int64)[0]))
    results.put((samples, (time.process_time() - cpu) / (time.perf_counter() - wall)))


def zctipc_latency_writer(stream, rounds, ready):
    w = stream.writer()
    src = np.ones(stream.shape, np.float32)
    ready.put("writer")
    for _ in range(rounds):
        time.sleep(0.001)
        frame = w.look()
        np.copyto(frame, src)
        frame.view(np.int64)[0] = time.perf_counter_ns()
        w.increment()
    stream.end()


def run_zctipc(samples, readers, seconds):
    ctx = zctipc.get_context()
    s = zctipc.Stream.create(shape=(samples,), dtype=np.float32, frames=FRAMES, readers=readers)
    ready, results, go = zctipc.Queue(), zctipc.Queue(), zctipc.Event()
    procs = [ctx.Process(target=zctipc_reader, args=(s, ready, results, go)) for _ in range(readers)]
    procs.append(ctx.Process(target=zctipc_writer, args=(s, seconds, ready, results, go)))
    return _run(procs, ready, results, go)


def latency_zctipc(samples, rounds, wait="sleep"):
    ctx = zctipc.get_context()
    s = zctipc.Stream.create(shape=(samples,), dtype=np.float32, frames=FRAMES, readers=1)
    ready, results = zctipc.Queue(), zctipc.Queue()
    return _latency(
        ctx.Process(target=zctipc_latency_reader, args=(s, ready, results, wait)),
        ctx.Process(target=zctipc_latency_writer, args=(s, rounds, ready)),
        ready,
        results,
    )


# -- pythusa -----------------------------------------------------------------------


# pythusa's writer re-reads the reader positions every 64 writes or 5 ms by
# default (its Pipeline's stream settings), which caps a 32-frame ring at 32
# frames per 5 ms; "tuned" re-reads them on every write.
PYTHUSA_REFRESH = {"defaults": {}, "tuned": {"min_reader_pos_refresh_interval": 1, "min_reader_pos_refresh_s": 0.0}}


def _ring(name, samples, readers, reader, create=False, tuning="defaults"):
    from pythusa import SharedRingBuffer

    return SharedRingBuffer(
        name,
        create=create,
        size=FRAMES * samples * 4,
        num_readers=readers,
        reader=reader,
        cache_align=True,
        **PYTHUSA_REFRESH[tuning],
    )


def pythusa_reader(name, samples, readers, index, ready, results, go, stop):
    ring = _ring(name, samples, readers, index)
    ring.set_reader_active(True)
    nbytes = samples * 4
    ready.put(index)
    go.wait()
    count = total = 0
    while True:
        mv1, _, size, _ = ring.expose_reader_mem_view(nbytes)
        if size < nbytes:
            if stop.is_set() and ring.get_write_pos() == ring.header[ring.reader_pos_index]:
                break
            os.sched_yield()
            continue
        total += checksum(np.frombuffer(mv1, np.uint8))
        del mv1
        ring.inc_reader_pos(nbytes)
        count += 1
    results.put(count)
    ring.set_reader_active(False)
    _quiet_exit(ring, results)


def pythusa_writer(name, samples, readers, seconds, ready, results, go, stop, tuning):
    ring = _ring(name, samples, readers, -1, tuning=tuning)
    src = np.random.default_rng(1).random(samples, dtype=np.float32)
    ready.put("writer")
    go.wait()
    start = time.perf_counter()
    end = start + seconds
    n = 0
    while True:
        if ring.write_array(src) == 0:
            os.sched_yield()
            continue
        n += 1
        if n % 64 == 0 and time.perf_counter() >= end:
            break
    stop.set()
    results.put(("writer", n, time.perf_counter() - start))
    _quiet_exit(ring, results)


def pythusa_latency_reader(name, samples, rounds, ready, results):
    ring = _ring(name, samples, 1, 0)
    ring.set_reader_active(True)
    nbytes = samples * 4
    ready.put(0)
    out = []
    wall, cpu = time.perf_counter(), time.process_time()
    while len(out) < rounds:
        mv1, _, size, _ = ring.expose_reader_mem_view(nbytes)
        if size < nbytes:
            os.sched_yield()
            continue
        got = time.perf_counter_ns()
        out.append(got - int(np.frombuffer(mv1, np.int64, count=1)[0]))
        del mv1
        ring.inc_reader_pos(nbytes)
    results.put((out, (time.process_time() - cpu) / (time.perf_counter() - wall)))
    _quiet_exit(ring, results)


def pythusa_latency_writer(name, samples, rounds, ready):
    ring = _ring(name, samples, 1, -1)
    src = np.ones(samples, np.float32)
    nbytes = samples * 4
    ready.put("writer")
    for _ in range(rounds):
        time.sleep(0.001)
        while True:
            mv1, _, size, _ = ring.expose_writer_mem_view(nbytes)
            if size == nbytes:
                break
            os.sched_yield()
        frame = np.frombuffer(mv1, np.float32)
        np.copyto(frame, src)
        frame.view(np.int64)[0] = time.perf_counter_ns()
        del frame, mv1
        ring.inc_writer_pos(nbytes)
    _quiet_exit(ring, ready)


def _quiet_exit(ring, queue):
    """Exit once what was put is flushed, without pythusa's finalizers,
    which complain at exit about the views its ring exports."""
    ring._release_local_views()
    queue.close()
    queue.join_thread()
    sys.stdout.flush()
    os._exit(0)


def _pythusa_ring_owner(samples, readers):
    name = f"bench_pythusa_{os.getpid()}_{time.monotonic_ns()}"
    return name, _ring(name, samples, readers, -1, create=True)


def run_pythusa(samples, readers, seconds, tuning):
    ctx = multiprocessing.get_context("forkserver")
    name, owner = _pythusa_ring_owner(samples, readers)
    ready, results, go, stop = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(target=pythusa_reader, args=(name, samples, readers, i, ready, results, go, stop))
        for i in range(readers)
    ]
    procs.append(
        ctx.Process(target=pythusa_writer, args=(name, samples, readers, seconds, ready, results, go, stop, tuning))
    )
    try:
        return _run(procs, ready, results, go)
    finally:
        _drop_ring(owner)


def latency_pythusa(samples, rounds):
    ctx = multiprocessing.get_context("forkserver")
    name, owner = _pythusa_ring_owner(samples, 1)
    ready, results = ctx.Queue(), ctx.Queue()
    try:
        return _latency(
            ctx.Process(target=pythusa_latency_reader, args=(name, samples, rounds, ready, results)),
            ctx.Process(target=pythusa_latency_writer, args=(name, samples, rounds, ready)),
            ready,
            results,
        )
    finally:
        _drop_ring(owner)


def _drop_ring(ring):
    ring._release_local_views()
    ring.close()
    ring.unlink()


# -- iceoryx2 ----------------------------------------------------------------------
# Publish-subscribe with a u8 slice payload. Safe overflow is off and the
# publisher retries until delivered, so every subscriber gets every frame (as
# zctipc's block policy); subscribers block on an event service the publisher
# notifies after each send (iceoryx2's subscribers have no blocking receive).


def _ice(svc, nbytes, readers):
    import iceoryx2 as iox2

    iox2.set_log_level_from_env_or(iox2.LogLevel.Error)
    node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
    pubsub = (
        node.service_builder(iox2.ServiceName.new(svc))
        .publish_subscribe(iox2.Slice[ctypes.c_uint8])
        .enable_safe_overflow(False)
        .subscriber_max_buffer_size(FRAMES)  # as deep as the other peers' rings
        .subscriber_max_borrowed_samples(2)
        .max_publishers(1)
        .max_subscribers(readers)
        .history_size(0)
        .open_or_create()
    )
    event = node.service_builder(iox2.ServiceName.new(svc + "/data")).event().open_or_create()
    return iox2, node, pubsub, event


# Where iceoryx2 keeps its state by default: files in /dev/shm whose names
# start with this, and a directory.
ICEORYX2_SHM_PREFIX, ICEORYX2_ROOT = "iox2_", "/tmp/iceoryx2"


@contextlib.contextmanager
def _iceoryx2_leaves_nothing():
    """Remove, once every process of the runs inside has ended, what
    iceoryx2 made on this machine during them and keeps after its last node
    ends (its global management segment, its root directory), so that the
    benchmark leaves /dev/shm as it found it. What was there before (another
    iceoryx2 user's) stays."""
    shm = "/dev/shm"
    before = {n for n in os.listdir(shm) if n.startswith(ICEORYX2_SHM_PREFIX)}
    root_was_there = os.path.exists(ICEORYX2_ROOT)
    try:
        yield
    finally:
        for name in os.listdir(shm):
            if name.startswith(ICEORYX2_SHM_PREFIX) and name not in before:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(shm, name))
        if not root_was_there:
            shutil.rmtree(ICEORYX2_ROOT, ignore_errors=True)


END = 8  # a payload of 8 bytes ends the run
HELLO = 16  # a payload of 16 bytes only says the connection is up


def ice_receive(svc, nbytes, readers, on_frame):
    """Subscribe, then call on_frame(array) for every frame until the end
    (hellos are skipped)."""
    iox2, node, pubsub, event = _ice(svc, nbytes, readers)
    sub = pubsub.subscriber_builder().create()
    listener = event.listener_builder().create()
    yield  # subscribed
    while True:
        sample = sub.receive()
        if sample is None:
            listener.timed_wait(iox2.Duration.from_millis(100))
            continue
        frame = np.frombuffer(sample.payload().as_memory_view(), np.uint8)
        size = frame.size
        if size not in (HELLO, END):
            on_frame(frame)
        del frame
        sample.delete()
        if size == END:
            break
    sub.delete()
    listener.delete()


def ice_reader(svc, samples, readers, ready, results):
    count = [0]

    def on_frame(frame):
        checksum(frame)
        count[0] += 1

    steps = ice_receive(svc, samples * 4, readers, on_frame)
    next(steps)
    ready.put("subscribed")  # and reads at once: the publisher's hellos must not fill its buffer
    for _ in steps:
        pass
    results.put(count[0])


def ice_publisher(svc, nbytes, readers):
    """A publisher that has said hello for 200 ms once every subscriber is
    there, so that each one's connection is up before the first frame."""
    iox2, node, pubsub, event = _ice(svc, nbytes, readers)
    pub = (
        pubsub.publisher_builder()
        .initial_max_slice_len(nbytes)
        .allocation_strategy(iox2.AllocationStrategy.Static)
        .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered)
        .create()
    )
    notifier = event.notifier_builder().create()
    deadline = time.monotonic() + 30
    while pubsub.dynamic_config.number_of_subscribers < readers and time.monotonic() < deadline:
        time.sleep(0.001)

    def send(src, stamp=False):
        sample = pub.loan_slice_uninit(src.nbytes)
        frame = np.frombuffer(sample.payload().as_memory_view(), np.uint8)
        np.copyto(frame, src.view(np.uint8))
        if stamp:
            frame[:8].view(np.int64)[0] = time.perf_counter_ns()
        del frame
        sample.assume_init().send()
        notifier.notify()

    for _ in range(200):
        pub.update_connections()
        send(np.zeros(HELLO, np.uint8))
        time.sleep(0.001)
    return pub, send


def ice_writer(svc, samples, readers, seconds, ready, results, go):
    pub, send = ice_publisher(svc, samples * 4, readers)
    src = np.random.default_rng(1).random(samples, dtype=np.float32)
    ready.put("writer")
    go.wait()
    start = time.perf_counter()
    end = start + seconds
    n = 0
    while True:
        send(src)
        n += 1
        if n % 64 == 0 and time.perf_counter() >= end:
            break
    elapsed = time.perf_counter() - start
    send(np.zeros(END, np.uint8))
    results.put(("writer", n, elapsed))


def run_iceoryx2(samples, readers, seconds):
    ctx = zctipc.get_context("spawn")
    svc = f"zctipc-bench/{os.getpid()}/{time.monotonic_ns()}"
    ready, results, go = zctipc.Queue(), zctipc.Queue(), zctipc.Event()
    procs = [ctx.Process(target=ice_reader, args=(svc, samples, readers, ready, results)) for _ in range(readers)]
    procs.append(ctx.Process(target=ice_writer, args=(svc, samples, readers, seconds, ready, results, go)))
    return _run(procs, ready, results, go)


def ice_latency_reader(svc, samples, ready, results):
    out = []
    steps = ice_receive(
        svc, samples * 4, 1, lambda f: out.append(time.perf_counter_ns() - int(f[:8].view(np.int64)[0]))
    )
    next(steps)
    ready.put("subscribed")
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in steps:
        pass
    results.put((out, (time.process_time() - cpu) / (time.perf_counter() - wall)))


def ice_latency_writer(svc, samples, rounds, ready):
    pub, send = ice_publisher(svc, samples * 4, 1)
    src = np.ones(samples, np.float32)
    ready.put("writer")
    for _ in range(rounds):
        time.sleep(0.001)
        send(src, stamp=True)
    send(np.zeros(END, np.uint8))


def latency_iceoryx2(samples, rounds):
    ctx = zctipc.get_context("spawn")
    svc = f"zctipc-bench/{os.getpid()}/{time.monotonic_ns()}"
    ready, results = zctipc.Queue(), zctipc.Queue()
    return _latency(
        ctx.Process(target=ice_latency_reader, args=(svc, samples, ready, results)),
        ctx.Process(target=ice_latency_writer, args=(svc, samples, rounds, ready)),
        ready,
        results,
    )


# -- running -----------------------------------------------------------------------


def _run(procs, ready, results, go):
    """Start the processes, wait until all are ready, let them go, and
    return (frames the writer published, seconds, frames each reader read)."""
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    go.set()
    reads, writer = [], None
    for _ in procs:
        msg = results.get(timeout=600)
        if isinstance(msg, tuple):
            writer = msg
        else:
            reads.append(msg)
    for p in procs:
        p.join(60)
    _, published, seconds = writer
    return published, seconds, reads


def _latency(reader, writer, ready, results):
    """Start the reader, then the writer, each once the one before is
    ready, and return what the reader reports."""
    for p in (reader, writer):
        p.start()
        ready.get(timeout=120)
    out = results.get(timeout=600)
    for p in (reader, writer):
        p.join(60)
    return out


PEERS = {
    "zctipc": (run_zctipc, latency_zctipc),
    "zctipc polling": (None, lambda samples, rounds: latency_zctipc(samples, rounds, "poll")),
    "pythusa": (lambda *a: run_pythusa(*a, "defaults"), latency_pythusa),
    "pythusa tuned": (lambda *a: run_pythusa(*a, "tuned"), None),
    "iceoryx2": (run_iceoryx2, latency_iceoryx2),
}


def suite_throughput(args, report):
    seconds = 0.1 if args.tiny else 0.5 if args.quick else args.seconds
    rounds = 1 if args.tiny or args.quick else args.rounds
    rows = []
    for size, samples in SIZES.items():
        for readers in READERS:
            runs = {}  # peer: the runs it made, the peers taking turns
            for _ in range(rounds):
                for peer, (run, _) in PEERS.items():
                    if run is None or peer.split()[0] in report["skipped_peers"] or peer in runs and not runs[peer]:
                        continue
                    runs.setdefault(peer, [])
                    try:
                        published, elapsed, reads = run(samples, readers, seconds / rounds)
                        if not all(r == published for r in reads):
                            raise RuntimeError(f"a reader missed frames: {reads} of {published}")
                    except Exception as exc:  # a peer that fails is reported, and the run goes on
                        report["skipped_peers"][f"{peer} ({size}, {readers} readers)"] = f"failed: {exc}"
                        print(f"  {size:>7} {readers} readers  {peer:<14} failed: {exc}", flush=True)
                        runs[peer] = []
                        continue
                    runs[peer].append((published, elapsed))
            by_peer = {}
            for peer, made in runs.items():
                if not made:
                    continue
                published, elapsed = sorted(made, key=lambda m: m[0] / m[1])[len(made) // 2]  # the median run
                nbytes = samples * 4
                r = {
                    "size": size,
                    "frame_bytes": nbytes,
                    "readers": readers,
                    "peer": peer,
                    "seconds": elapsed,
                    "rounds": len(made),
                    "frames_per_s": published / elapsed,
                    "gbit_per_s": readers * published * nbytes * 8 / elapsed / 1e9,
                }
                print(
                    f"  {size:>7} {readers} readers  {peer:<14} {r['gbit_per_s']:7.1f} Gbit/s "
                    f"{r['frames_per_s']:10,.0f} frames/s (median of {len(made)})",
                    flush=True,
                )
                by_peer[peer] = r
                report["throughput"].append(r)
            base = by_peer["zctipc"]["gbit_per_s"]
            for peer, r in by_peer.items():
                rows.append(
                    (
                        size,
                        readers,
                        peer,
                        f"{r['gbit_per_s']:.1f}",
                        f"{r['frames_per_s']:,.0f}",
                        fmt_ratio(base / r["gbit_per_s"]) if peer != "zctipc" else "1.0x",
                        f"{100 * r['gbit_per_s'] * 1e9 / 8 / report['memcpy_bytes_per_s']:.0f}%"
                        if readers == 1
                        else "-",
                    )
                )
    return markdown_table(
        ["frame", "readers", "peer", "aggregate Gbit/s", "frames/s", "zctipc is", "one reader vs memcpy"], rows
    )


def suite_latency(args, report):
    rounds = 20 if args.tiny else 200 if args.quick else 2000
    samples = SIZES["32 KiB"]
    rows = []
    base = None
    for peer, (_, latency) in PEERS.items():
        if latency is None or peer in report["skipped_peers"]:
            continue
        samples_ns, cpu = latency(samples, rounds)
        stats = summarize(samples_ns)
        stats["peer"] = peer
        stats["reader_cpu"] = cpu
        report["latency"].append(stats)
        print(
            f"  latency {peer:<8} p50 {fmt_us(stats['median_us'])}, p99 {fmt_us(stats['p99_us'])}, "
            f"reader CPU {cpu:.0%}",
            flush=True,
        )
        base = base or stats["median_us"]
        rows.append(
            (
                peer,
                *latency_cells(stats, base),
                f"{cpu:.0%}",
            )
        )
    return markdown_table(
        [
            "peer (32 KiB frames, one in flight, 1 ms apart)",
            "p50",
            "p99",
            "frames",
            "p50 vs zctipc",
            "reader CPU while waiting",
        ],
        rows,
    )


SUITES = {"throughput": suite_throughput, "latency": suite_latency}


def main(argv=None):
    parser = arguments(__doc__, "stream", SUITES)
    parser.add_argument(
        "--seconds", type=positive(float), default=6.0, help="how long each peer writes in each throughput cell"
    )
    parser.add_argument(
        "--rounds",
        type=positive(int),
        default=3,
        help="throughput runs per peer and cell, the peers taking turns; the median counts",
    )
    args = parser.parse_args(argv)
    report = new_report(
        "stream", ("zctipc", "numpy", "pythusa", "iceoryx2"), throughput=[], latency=[], skipped_peers={}, tables={}
    )
    for peer, module in (("pythusa", "pythusa"), ("iceoryx2", "iceoryx2")):
        missing = left_out(peer, module)
        if missing:
            print(f"skipping {peer}: {missing}")
            report["skipped_peers"][peer] = missing
    report["memcpy_bytes_per_s"] = memcpy_bytes_per_s()
    print(f"  floor: single-core memcpy {report['memcpy_bytes_per_s'] * 8 / 1e9:.1f} Gbit/s", flush=True)
    with _iceoryx2_leaves_nothing():
        for name in args.only:
            report["tables"][name] = SUITES[name](args, report)
    finish(report, render(report), args.json)


def render(report):
    m = report["machine"]
    v = ", ".join(f"{k} {val}" for k, val in report["versions"].items() if val)
    parts = [
        f"Streams, {report['date']}, on {machine_line(m)}; {v}. Single-core memcpy in the same run: "
        f"{report['memcpy_bytes_per_s'] * 8 / 1e9:.1f} Gbit/s ({report['memcpy_bytes_per_s'] / 1e9:.1f} GB/s)."
    ]
    for peer, why in report["skipped_peers"].items():
        parts.append(f"{peer} was skipped: {why}.")
    for name in ("throughput", "latency"):
        if name in report["tables"]:
            parts.append(report["tables"][name])
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
