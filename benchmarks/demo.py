"""make demo: a producer process hands a 1 GiB float32 tensor to a consumer
process, through zctipc and through a pickling multiprocessing.Queue, and
prints how long each hand-off took (from the producer's put to a readable
array in the consumer). The consumer checks the data both times."""

import multiprocessing
import statistics
import sys
import time

import numpy as np

import zctipc

from _common import fmt_ratio, fmt_us, machine, machine_line, markdown_table

N = (1 << 30) // 4  # float32 elements in 1 GiB
STRIDE = 4096
ROUNDS = 3


def fill(a):
    a[::STRIDE] = np.arange(len(a[::STRIDE]), dtype=np.float32)


def check(a):
    return a.shape == (N,) and bool(np.array_equal(a[::STRIDE], np.arange(len(a[::STRIDE]), dtype=np.float32)))


def consume_zctipc(conn):
    while (msg := conn.recv()) is not None:
        t = msg  # unpickling a SharedTensor attaches it by name
        a = t.numpy()
        done = time.perf_counter_ns()
        ok = check(a)
        del a
        t.close()  # before answering, so the next round finds this process idle
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
    ctx = zctipc.get_context()
    print(f"zctipc demo: a 1 GiB float32 tensor from a producer process to a consumer process "
          f"(median of {ROUNDS}), on {machine_line(machine())}\n", flush=True)

    # zctipc: the tensor lives in shared memory; only its name crosses.
    tensor = zctipc.create_shared_tensor(shape=(N,), dtype=np.float32)
    fill(tensor.numpy())
    here, there = ctx.Pipe()
    consumer = ctx.Process(target=consume_zctipc, args=(there,))
    consumer.start()
    zctipc_us = hand_off(lambda: here.send(tensor), here)
    here.send(None)
    consumer.join()
    tensor.close()

    # multiprocessing.Queue: the array is pickled, piped and unpickled.
    array = np.empty(N, dtype=np.float32)
    fill(array)
    queue = ctx.Queue()
    here, there = ctx.Pipe()
    consumer = ctx.Process(target=consume_queue, args=(queue, there))
    consumer.start()
    queue_us = hand_off(lambda: queue.put(array), here)
    queue.put(None)
    consumer.join()

    print(markdown_table(
        ["hand-off of 1 GiB", "time", "vs zctipc"],
        [["zctipc (a descriptor; zero copy)", fmt_us(zctipc_us), "1x"],
         ["multiprocessing.Queue (pickled copy)", fmt_us(queue_us), fmt_ratio(queue_us / zctipc_us) + " slower"]],
    ))
    print("\nThe consumer checked the data both times. Leftover zctipc segments:", len(zctipc.list_segments()))


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
