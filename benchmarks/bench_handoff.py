"""Hand-off latency: from the producer's put to a readable array in another
process, for float32 tensors of 1 MiB, 100 MiB and 1 GiB, with every peer in
one run on one machine.

Peers:
  zctipc.Queue                the array is already zctipc memory (zctipc.empty):
                              put sends its descriptor through the queue, and
                              get gives the consumer a view
  zctipc                      the tensor is already in a zctipc segment; its
                              name crosses a multiprocessing Pipe, the consumer
                              attaches it (as the peers below go)
  multiprocessing.Queue       the array is pickled through the queue's pipe
  shared_memory by hand       multiprocessing.shared_memory, name over a Pipe
  torch.mp file_descriptor    a share_memory_() tensor sent over a Pipe with
  torch.mp file_system        torch.multiprocessing's reducers, per strategy
  ray put/get                 ray.put in the driver, ray.get in an actor (a
                              local cluster of 2 CPUs), when Ray is installed

Each round, the consumer is asleep in its receive (the queue's get, the
Pipe's recv) when the producer puts, as a consumer waits for its next
array, and the clock runs from before the put to the array's first use.

Also measured: the attach alone (open, validate, map, make the array), in a
loop in the consumer, for zctipc and shared_memory by hand; for zctipc both
for a segment the process never mapped and for one it mapped before (the
mapping cache). Prints Markdown
tables with ratios to zctipc and writes JSON.

    python benchmarks/bench_handoff.py [--rounds 20] [--sizes 1M,100M,1G] [--json PATH]
    python benchmarks/bench_handoff.py --render PATH.json   # no new run
"""

import argparse
import json
import multiprocessing
import os
import sys
import time

import numpy as np

import zctipc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    PlainPickling,
    finish,
    fmt_bytes,
    fmt_ratio,
    fmt_us,
    left_out,
    machine_line,
    markdown_table,
    names_of,
    new_report,
    positive,
    summarize,
)
from _floor import futex_wake_ns

SIZES = {"1M": 1 << 20, "100M": 100 << 20, "1G": 1 << 30}
# The producer numbers MARKS values spread over the array and the consumer
# checks them, after the clock stops. As many for every size: checking one
# value per page (as this benchmark once did) faulted 65,536 pages per round
# at 1 GiB, some 30 ms that left both processes cold for the next round's
# clock, and so added a cost of size to every peer's hand-off.
MARKS = 256
# Seconds between rounds: the consumer, which answered the last round,
# is asleep in its receive again when the next array is put.
PAUSE = 0.002
# Rounds of the futex floor measured before each size's peers, 2 ms apart as
# they are, per round of theirs (at most FLOOR_ROUNDS_MOST): on a shared host
# whose load comes and goes, a floor of the same minutes, not the run's start.
FLOOR_ROUNDS_PER_ROUND, FLOOR_ROUNDS_MOST = 25, 300


def marks(n):
    return np.linspace(0, n - 1, MARKS).astype(np.int64)


def fill(a):
    a[marks(len(a))] = np.arange(MARKS, dtype=a.dtype)


def check(a):
    return bool(np.array_equal(np.asarray(a)[marks(len(a))], np.arange(MARKS, dtype=np.float32)))


class Zctipc:
    name = "zctipc"
    transport = "name over a Pipe"

    def __init__(self, ctx, nbytes):
        self.tensor = zctipc.create_shared_tensor(shape=(nbytes // 4,), dtype=np.float32)
        fill(self.tensor.numpy())
        self.recv_end, self.send_end = ctx.Pipe(duplex=False)

    def put(self):
        self.send_end.send(self.tensor.name)

    @staticmethod
    def get(chan):
        return Zctipc.attach(chan.recv())

    @staticmethod
    def attach(name):
        tensor = zctipc.attach_shared_tensor(name)
        return tensor.numpy(), tensor.close

    def descriptor(self):
        return self.tensor.name

    def consumer_end(self):
        return self.recv_end

    def close(self):
        self.tensor.close()


class _QueuePeer:
    """A peer whose consumer gets the array from self.queue."""

    @staticmethod
    def get(chan):
        return chan.get(), lambda: None

    def consumer_end(self):
        return self.queue


class ZctipcQueue(_QueuePeer):
    name = "zctipc.Queue"
    transport = "descriptor through the queue"

    def __init__(self, ctx, nbytes):
        self.array = zctipc.empty(nbytes // 4, np.float32)  # a pool buffer: zctipc memory
        fill(self.array)
        self.queue = zctipc.Queue()

    def put(self):
        self.queue.put(self.array)

    def close(self):
        self.queue.close()
        del self.array


class PickleQueue(_QueuePeer):
    name = "multiprocessing.Queue"
    transport = "pickled through the queue"

    def __init__(self, ctx, nbytes):
        self.array = np.full(nbytes // 4, 0.5, dtype=np.float32)  # every page real
        fill(self.array)
        self.queue = multiprocessing.get_context(ctx.get_start_method()).Queue()  # not zctipc's
        self.plain = PlainPickling(np.ndarray)  # nor zctipc's reducers

    def put(self):
        self.queue.put(self.array)

    def close(self):
        self.queue.close()
        self.queue.join_thread()  # the feeder has pickled everything
        self.plain.close()


class SharedMemoryByHand:
    name = "shared_memory by hand"
    transport = "name over a Pipe"

    def __init__(self, ctx, nbytes):
        from multiprocessing import shared_memory

        self.shm = shared_memory.SharedMemory(create=True, size=nbytes)
        fill(np.ndarray((nbytes // 4,), np.float32, buffer=self.shm.buf))
        self.recv_end, self.send_end = ctx.Pipe(duplex=False)
        self.count = nbytes // 4

    def put(self):
        self.send_end.send((self.shm.name, self.count))

    @staticmethod
    def get(chan):
        return SharedMemoryByHand.attach(chan.recv())

    @staticmethod
    def attach(descriptor):
        from multiprocessing import shared_memory

        name, count = descriptor
        # The consumer shares the producer's resource tracker, which already
        # knows the name: registering it again changes nothing.
        shm = shared_memory.SharedMemory(name)
        return np.ndarray((count,), np.float32, buffer=shm.buf), shm.close

    def descriptor(self):
        return (self.shm.name, self.count)

    def consumer_end(self):
        return self.recv_end

    def close(self):
        self.shm.close()
        self.shm.unlink()


class TorchMP:
    transport = "tensor over a Pipe"

    def __init__(self, ctx, nbytes):
        import torch
        import torch.multiprocessing as tmp

        tmp.set_sharing_strategy(self.strategy)
        self.tensor = torch.empty(nbytes // 4, dtype=torch.float32)
        fill(self.tensor.numpy())
        self.tensor.share_memory_()
        self.recv_end, self.send_end = ctx.Pipe(duplex=False)

    def put(self):
        self.send_end.send(self.tensor)

    @classmethod
    def get(cls, chan):
        import torch.multiprocessing as tmp

        tmp.set_sharing_strategy(cls.strategy)
        return chan.recv(), lambda: None

    def consumer_end(self):
        return self.recv_end

    def close(self):
        del self.tensor


class TorchFD(TorchMP):
    name = "torch.mp file_descriptor"
    strategy = "file_descriptor"


class TorchFS(TorchMP):
    name = "torch.mp file_system"
    strategy = "file_system"


PEERS = [ZctipcQueue, Zctipc, PickleQueue, SharedMemoryByHand, TorchFD, TorchFS]


def consumer(peer, chan, ctl, rounds):
    """Take rounds hand-offs, each waited for asleep in the peer's own
    receive (a queue's get, a Pipe's recv), as a consumer waits for its
    next array; report when each array was readable."""
    if issubclass(peer, TorchMP):
        import torch.multiprocessing  # noqa: F401  registers torch's reducers
    ctl.send("ready")
    for _ in range(rounds):
        a, release = peer.get(chan)
        done = time.perf_counter_ns()
        ok = check(a)
        del a
        release()  # before answering, so the next round finds this process idle
        ctl.send((done, ok))


def attach_loop(peer, descriptor, rounds, cache, ctl):
    """Attach, make the array and let go, rounds times in a row; report the
    time of each attach with its array. Without the cache, zctipc maps the
    segment afresh every time, as for a segment this process never saw."""
    if not cache:
        os.environ["ZCTIPC_MAP_CACHE"] = "0"  # read when the library loads, below
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        a, release = peer.attach(descriptor)
        times.append(time.perf_counter_ns() - start)
        del a
        release()
    ctl.send(times)


def measure(ctx, peer, nbytes, rounds, warmup=2):
    producer = peer(ctx, nbytes)
    ctl, ctl_there = ctx.Pipe()
    proc = ctx.Process(target=consumer, args=(peer, producer.consumer_end(), ctl_there, warmup + rounds))
    proc.start()
    handoff = []
    try:
        if ctl.recv() != "ready":
            raise RuntimeError(f"{peer.name}: the consumer did not start")
        for i in range(warmup + rounds):
            time.sleep(PAUSE)  # the consumer is back asleep in its receive
            start = time.perf_counter_ns()
            producer.put()
            done, ok = ctl.recv()
            if not ok:
                raise RuntimeError(f"{peer.name}: the consumer did not see the producer's data")
            if i >= warmup:
                handoff.append(done - start)
        proc.join(60)
        result = {"peer": peer.name, "transport": peer.transport, "bytes": nbytes, **summarize(handoff)}
        for cache in (False, True) if peer is Zctipc else (False,) if hasattr(peer, "attach") else ():
            proc = ctx.Process(
                target=attach_loop, args=(peer, producer.descriptor(), 10 * rounds + 10, cache, ctl_there)
            )
            proc.start()
            result["attach_cached" if cache else "attach"] = summarize(ctl.recv()[10:])
            proc.join(60)
    finally:
        if proc.is_alive():
            proc.kill()
        producer.close()
    return result


def measure_ray(nbytes, rounds, warmup=2):
    """ray.put in the driver to a usable array in an actor (Ray's object
    store, a local cluster of 2 CPUs), as Ray users hand arrays over."""
    import shutil
    import tempfile

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    tmp = tempfile.mkdtemp(prefix="zctipc-bench-ray-")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=tmp,
        object_store_memory=max(3 * nbytes, 512 << 20),
    )
    try:

        @ray.remote
        class Consumer:
            def consume(self, refs, n, marks=MARKS):
                a = ray.get(refs[0])  # zero copy out of the object store
                # check(a), written out: the actor cannot import this module
                at = np.linspace(0, len(a) - 1, marks).astype(np.int64)
                ok = a.nbytes == n and bool(np.array_equal(a[at], np.arange(marks, dtype=np.float32)))
                return time.perf_counter_ns(), ok

        c = Consumer.remote()
        ray.get(c.consume.remote([ray.put(np.zeros(4097, np.float32))], 4097 * 4))  # the actor is up (ok is False)
        a = np.empty(nbytes // 4, np.float32)
        fill(a)
        samples = []
        for i in range(warmup + rounds):
            start = time.perf_counter_ns()
            ref = ray.put(a)
            done, ok = ray.get(c.consume.remote([ref], a.nbytes))
            del ref
            if not ok:
                raise RuntimeError("ray: the actor did not see the driver's data")
            if i >= warmup:
                samples.append(done - start)
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"peer": "ray put/get", "transport": "object store, actor call", "bytes": nbytes, **summarize(samples)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=positive(int), default=20)
    parser.add_argument("--sizes", type=names_of(list(SIZES)), default="1M,100M,1G", help=f"of {', '.join(SIZES)}")
    parser.add_argument(
        "--json", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "handoff.json")
    )
    parser.add_argument("--render", metavar="JSON", help="report a saved run instead of running")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            report = json.load(f)
        print(render(report))
        return

    ctx = zctipc.get_context()
    sizes = [SIZES[s] for s in args.sizes]
    report = new_report("handoff", ("zctipc", "numpy", "torch", "ray"), results=[], floors=[], skipped=[])
    ray_missing = left_out("ray", "ray")
    if ray_missing:
        report["skipped"].append({"peer": "ray", "reason": ray_missing})
    peers = PEERS
    torch_missing = left_out("torch", "torch")
    if torch_missing:
        peers = [p for p in PEERS if not issubclass(p, TorchMP)]
        report["skipped"].append({"peer": "torch.mp", "reason": torch_missing})
    for nbytes in sizes:
        floor = summarize(futex_wake_ns(min(FLOOR_ROUNDS_MOST, FLOOR_ROUNDS_PER_ROUND * args.rounds), PAUSE))
        report["floors"].append({"bytes": nbytes, **floor})
        print(f"{fmt_bytes(nbytes):>8}  {'futex floor':<26} median {fmt_us(floor['median_us'])}", flush=True)
        for peer in peers + ([] if ray_missing else ["ray"]):
            name = peer if peer == "ray" else peer.name
            print(f"{fmt_bytes(nbytes):>8}  {name:<26}", end="", flush=True)
            r = measure_ray(nbytes, args.rounds) if peer == "ray" else measure(ctx, peer, nbytes, args.rounds)
            r["floor_us"] = floor["median_us"]
            report["results"].append(r)
            print(f" median {fmt_us(r['median_us'])}, p99 {fmt_us(r['p99_us'])}", flush=True)

    finish(report, render(report), args.json)


def render(report):
    """The Markdown tables of a hand-off report."""
    results = report["results"]
    rows = []
    for r in results:
        same = [x for x in results if x["bytes"] == r["bytes"]]
        base = next((x for x in same if x["peer"] == "zctipc.Queue"), same[0])
        rows.append(
            [
                fmt_bytes(r["bytes"]),
                r["peer"],
                r["transport"],
                fmt_us(r["median_us"]),
                fmt_us(r["p99_us"]),
                fmt_ratio(r["median_us"] / base["median_us"]),
            ]
        )
    attach_rows = []
    for r in results:
        for key, what in (("attach", "not mapped before"), ("attach_cached", "mapped before (cache)")):
            if key in r:
                attach_rows.append(
                    [fmt_bytes(r["bytes"]), r["peer"], what, fmt_us(r[key]["median_us"]), fmt_us(r[key]["p99_us"])]
                )
    v = report["versions"]
    return "\n".join(
        [
            f"Hand-off, put to readable array in another process ({results[0]['rounds']} rounds each), "
            f"{report['date']}, on {machine_line(report['machine'])}; "
            + ", ".join(f"{k} {val}" for k, val in v.items() if val)
            + ".",
            "",
            markdown_table(["size", "peer", "transport", "median", "p99", "median vs zctipc.Queue"], rows),
            "",
        ]
        + (
            [
                f"Futex floor, a process asleep {PAUSE * 1000:g} ms woken by another, measured before each size's "
                "peers: "
                + ", ".join(f"{fmt_bytes(f['bytes'])} {fmt_us(f['median_us'])}" for f in report["floors"])
                + ".",
                "",
            ]
            if report.get("floors")
            else []
        )
        + [
            "Attach alone, in a loop in the consumer (open, validate, map, make the array; "
            f"{next(r['attach']['rounds'] for r in results if 'attach' in r)} rounds):",
            "",
            markdown_table(["size", "peer", "segment", "median", "p99"], attach_rows),
        ]
        + [f"\nSkipped {s['peer']}: {s['reason']}." for s in report.get("skipped", [])]
    )


if __name__ == "__main__":
    main()
