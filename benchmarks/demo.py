"""make demo: a producer process hands a 1 GiB float32 array to a consumer
process, through a zctipc.Queue and through a pickling multiprocessing.Queue,
and prints how long each hand-off took (from the producer's put to a
readable array in the consumer). The consumer checks the data both times."""

import multiprocessing
import statistics
import sys
import time

import numpy as np
from _common import PlainPickling, fmt_ratio, fmt_us, machine, machine_line, markdown_table

import zctipc

N = (1 << 30) // 4  # float32 elements in 1 GiB
STRIDE = 4096
ROUNDS = 3


def fill(a):
    a[::STRIDE] = np.arange(len(a[::STRIDE]), dtype=np.float32)


def check(a):
    return a.shape == (N,) and bool(np.array_equal(a[::STRIDE], np.arange(len(a[::STRIDE]), dtype=np.float32)))


def consume_zctipc(queue, conn):
    while (a := queue.get()) is not None:  # a view of the producer's memory
        done = time.perf_counter_ns()
        ok = check(a)
        del a
        conn.send((done, ok))


def consume_queue(queue, conn):
    while (a := queue.get()) is not None:
        done = time.perf_counter_ns()
        ok = check(a)
        del a
        conn.send((done, ok))


def hand_off(send, conn):
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter_ns()
        send()
        done, ok = conn.recv()
        if not ok:
            sys.exit("the consumer did not get the producer's data")
        times.append((done - start) / 1e3)
    return statistics.median(times)


def main():
    multiprocessing.set_start_method("forkserver")  # chosen, so zctipc has nothing to say about it
    ctx = zctipc.get_context()
    print(
        f"zctipc demo: a 1 GiB float32 tensor from a producer process to a consumer process "
        f"(median of {ROUNDS}), on {machine_line(machine())}\n",
        flush=True,
    )

    # zctipc: the array lives in shared memory; only a descriptor crosses.
    array = zctipc.empty(N, np.float32)
    fill(array)
    queue = zctipc.Queue()
    here, there = ctx.Pipe()
    consumer = ctx.Process(target=consume_zctipc, args=(queue, there))
    consumer.start()
    zctipc_us = hand_off(lambda: queue.put(array), here)
    queue.put(None)
    consumer.join()
    queue.close()
    del array

    # multiprocessing.Queue: the array is pickled, piped and unpickled.
    array = np.full(N, 0.5, dtype=np.float32)  # every page real, as data is
    fill(array)
    queue = multiprocessing.get_context("forkserver").Queue()  # multiprocessing's own, not zctipc's
    here, there = ctx.Pipe()
    consumer = ctx.Process(target=consume_queue, args=(queue, there))
    consumer.start()
    with PlainPickling(np.ndarray):  # nor with zctipc's reducers
        queue_us = hand_off(lambda: queue.put(array), here)
        queue.put(None)
        consumer.join()

    print(
        markdown_table(
            ["hand-off of 1 GiB", "time", "vs zctipc"],
            [
                ["zctipc.Queue (a descriptor; zero copy)", fmt_us(zctipc_us), "1x"],
                ["multiprocessing.Queue (pickled copy)", fmt_us(queue_us), fmt_ratio(queue_us / zctipc_us) + " slower"],
            ],
        )
    )
    zctipc.cleanup_all_segments()  # what this process's exit does
    left = [s.name for s in zctipc.list_segments() if s.kind != "ledger"]  # this process's ledger goes at exit
    print(
        "\nThe consumer checked the data both times. Left in shared memory:",
        ", ".join(left) if left else "nothing (the two processes freed every segment they used)",
    )


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
