"""One run of the task-pool benchmark (bench_queue.py's pool suite), in a
process of its own, so that a standard-library peer runs as a program that
never imported zctipc would:

    python benchmarks/_pool.py CONTEXT TASKS NBYTES

CONTEXT is zctipc (zctipc.get_context()) or a standard-library start method
(fork, forkserver, spawn). Prints the seconds that
concurrent.futures.ProcessPoolExecutor took to map plus_one over TASKS
arrays of NBYTES and hand back every result, its two workers started and
warm beforehand. Each result is checked.
"""

import concurrent.futures
import sys
import time

import numpy as np


def plus_one(a):
    return a + 1


def run(context, tasks, nbytes, workers=2):
    if context == "zctipc":
        import zctipc

        ctx = zctipc.get_context()
    else:
        import multiprocessing

        ctx = multiprocessing.get_context(context)
    arrays = [np.full(nbytes // 4, i, np.float32) for i in range(8)]
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as ex:
        list(ex.map(plus_one, arrays * 2))  # start the workers, and warm them and the buffers they use
        start = time.perf_counter()
        for i, r in enumerate(ex.map(plus_one, (arrays[i % len(arrays)] for i in range(tasks)))):
            if r.shape != arrays[0].shape or r[0] != arrays[i % len(arrays)][0] + 1:
                raise AssertionError(f"task {i} returned a wrong result")
        return time.perf_counter() - start


if __name__ == "__main__":
    print(run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
