"""Functions that tests run in child processes (importable under spawn and
forkserver)."""

import hashlib
import os
import traceback

import numpy as np


def report(queue, fn, *args):
    """Run fn(*args) and put ("ok", result) or ("error", type name, message)."""
    try:
        queue.put(("ok", fn(*args)))
    except BaseException as exc:  # the parent asserts on it
        queue.put(("error", type(exc).__name__, str(exc), traceback.format_exc()))


def read_and_write_big(name):
    """Check the pattern the parent wrote into a big float32 tensor, write
    another one back, and return the sum of every element."""
    import zctipc

    with zctipc.attach_shared_tensor(name) as t:
        a = t.numpy()
        stride = 4096
        n = len(a[::stride])
        if not np.array_equal(a[::stride], np.arange(n, dtype=np.float32)):
            raise AssertionError("the parent's pattern is not there")
        if a[-1] != 42.0:
            raise AssertionError(f"last element is {a[-1]}")
        total = float(a.sum(dtype=np.float64))  # touches every page
        a[1::stride] = -np.arange(n, dtype=np.float32)
        del a
    return total


def digest_of(name):
    import zctipc

    with zctipc.attach_shared_tensor(name, readonly=True) as t:
        return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def create_hold_and_exit(name, ready, release):
    """Process A: create a tensor, say so, and exit once told to."""
    import zctipc

    t = zctipc.create_shared_tensor(name, data=np.arange(1 << 16, dtype=np.int32))
    ready.set()
    if not release.wait(60):
        raise TimeoutError("never released")
    t.close()


def hold_until(name, attached, release):
    """Attach a tensor, say so, and let go once told to."""
    import zctipc

    t = zctipc.attach_shared_tensor(name)
    attached.set()
    release.wait(60)
    t.close()


def call_zctipc():
    """Use zctipc; in a child forked after the library loaded this raises."""
    import zctipc

    zctipc.empty(4)
    return os.getpid()


def attach_twice(name):
    """Attach, let go, attach again: the mapping cache gives the same address."""
    import zctipc

    first = zctipc.attach_shared_tensor(name)
    address = first.numpy().ctypes.data
    first.close()
    second = zctipc.attach_shared_tensor(name)
    again = second.numpy().ctypes.data
    refcount = second.refcount
    second.close()
    return address == again, refcount


def produce(q, producer, n):
    """Put (producer, i) for i in range(n)."""
    for i in range(n):
        q.put((producer, i))


def consume_until_none(q, producers):
    """Take messages until None; check that each producer's come in order;
    return how many of each producer's were taken."""
    last = [-1] * producers
    counts = [0] * producers
    while (m := q.get()) is not None:
        p, i = m
        if i <= last[p]:
            raise AssertionError(f"producer {p}: message {i} after {last[p]}")
        last[p] = i
        counts[p] += 1
    return counts


def echo(inq, outq, n):
    """Take n objects and put each back."""
    for _ in range(n):
        outq.put(inq.get())


def modify_tensor(q, done):
    """Take a tensor and a plain array, and write into both."""
    t, a = q.get()
    t += 100
    a[0] = -1
    done.put((type(t).__name__, bool(__import__("zctipc").is_shared(t))))


def getter_pid(q):
    """Say our pid, then take messages one by one, writing each id to
    stdout as soon as it is taken (the parent kills us at random)."""
    import sys

    print("ready", flush=True)
    while True:
        m = q.get()
        sys.stdout.write(f"{m['id']}\n")
        sys.stdout.flush()


def put_arrays(q, n, nbytes, blob=0):
    """Put n messages, each a dict with an id, an array of nbytes and blob
    bytes (pickled in band)."""
    import numpy as np

    for i in range(n):
        q.put({"id": i, "data": np.full(nbytes, i % 251, dtype=np.uint8), "blob": bytes([i % 256]) * blob})


def pool_in_use():
    import zctipc

    return zctipc.pool_stats().slots_in_use


def return_shared(n):
    """A Pool task: an array in zctipc memory as the result."""
    import zctipc

    a = zctipc.empty(n, "int64")
    a[:] = 3
    return a


def sum_and_is_shared(a):
    import zctipc

    return int(a.sum()), bool(zctipc.is_shared(a))


def read_from_pipe(conn):
    """Take an array from a Pipe, say whether it is shared, and write 9 into it."""
    import zctipc

    a = conn.recv()
    shared = zctipc.is_shared(a)
    a[0] = 9
    conn.send(shared)


def killed_consumers_scenario(total=300, kills=12, seed=7, blob=0):
    """Consumers are SIGKILLed at random moments while they take messages
    holding arrays (and blob bytes pickled in band each). Prints a JSON
    report: what was lost, what came twice, whether the queue still works,
    and the leak report."""
    import json
    import pickle
    import queue
    import random
    import signal
    import subprocess
    import sys
    import time
    from multiprocessing import context as mpc

    import zctipc

    q = zctipc.Queue()
    put_arrays(q, total, 5000, blob)
    seen, rng = set(), random.Random(seed)
    code = "import sys, pickle, _workers; _workers.getter_pid(pickle.loads(bytes.fromhex(sys.argv[1])))"
    for _ in range(kills):
        mpc.set_spawning_popen(object())  # hand the queue over as to a spawned child
        try:
            payload = pickle.dumps(q).hex()
        finally:
            mpc.set_spawning_popen(None)
        child = subprocess.Popen([sys.executable, "-c", code, payload], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.001, 0.02))
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
        seen.update(int(line) for line in out.split())
    rest = []
    while True:
        try:
            rest.append(q.get(timeout=0.5)["id"])
        except queue.Empty:
            break
    q.put("alive")
    alive = q.get(timeout=5) == "alive"
    import gc

    gc.collect()
    print(
        json.dumps(
            {
                "lost": sorted(set(range(total)) - seen - set(rest)),
                "twice": sorted(seen & set(rest)) + [i for i in set(rest) if rest.count(i) > 1],
                "alive": alive,
                "leaked_slots": zctipc.pool_stats().slots_in_use,
                "queue": q._name,
            }
        )
    )


def hold_received(q, ready):
    """Take two messages, hold them, say so, and wait to be killed."""
    import time

    held = [q.get(timeout=60), q.get(timeout=60)]
    ready.put("holding")
    time.sleep(3600)
    del held


def plus_one(a):
    """A pool task: a new array (or tensor) of the same size."""
    return a + 1


def start_method_seen(q):
    """Put the start method this child reports, through zctipc and
    multiprocessing."""
    import multiprocessing

    import zctipc

    q.put((zctipc.get_start_method(), multiprocessing.get_start_method(), zctipc.get_context().get_start_method()))


def put_later(q, obj, delay):
    import time

    time.sleep(delay)
    q.put(obj)


def process_name():
    import multiprocessing

    return multiprocessing.current_process().name


def take_tasks(tasks, results):
    """Take tasks until None, and put back each task's id and blob size."""
    while (task := tasks.get()) is not None:
        results.put((task["id"], len(task["blob"])))


def write_into_managed(d, key):
    """Read d[key] (an array), write into it in place, and store what this
    process reads back: its own copy."""
    a = d[key]
    a[0] = 99
    d["seen"] = float(a[0])
