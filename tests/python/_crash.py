"""Processes that the crash tests start and kill: producers, consumers and
holders, and the scenarios that drive them. Each runs in a process of its
own (``python -c "import _crash; ..."``), with the segment and runtime
directories the test gives it in its environment."""

import gc
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time

import numpy as np

STALL_POINTS = ["create-open", "create-reserve", "create-rename"]


def queue_arg(q):
    """The queue as a command-line argument for a child process."""
    from multiprocessing import context as mpc

    mpc.set_spawning_popen(object())  # hand the queue over as to a spawned child
    try:
        return pickle.dumps(q).hex()
    finally:
        mpc.set_spawning_popen(None)


def queue_from(arg):
    return pickle.loads(bytes.fromhex(arg))


def start(call, *args, env=None):
    """Start ``_crash.call(*args)`` in a new Python process whose stdout is a
    pipe."""
    code = f"import sys, _crash; _crash.{call}(*sys.argv[1:])"
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, text=True, env=env)


def producer(out_arg, back_arg, seed):
    """Make tensors (segments of their own and pool buffers), write them
    whole, send them, and hold the ones that come back, until killed."""
    import zctipc

    out, back = queue_from(out_arg), queue_from(back_arg)
    rng = random.Random(int(seed))
    held = []
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        t = zctipc.create_shared_tensor(shape=(rng.randrange(1, 4 << 20),), dtype=np.uint8)
        t.numpy()[:] = i % 251  # killed mid-write, often
        out.put(t.numpy())
        t.close()
        a = zctipc.empty(rng.randrange(1, 1 << 20), np.uint8)
        a[:] = 7
        out.put(a)
        del a
        try:
            held.append(back.get(timeout=0.005))  # killed holding received tensors
        except Exception:
            pass
        del held[:-3]


def consumer(in_arg, back_arg):
    """Take what producers send, hold the last few, send some back, and exit
    at None."""
    import zctipc

    inq, back = queue_from(in_arg), queue_from(back_arg)
    held = []
    print("ready", flush=True)
    while True:
        item = inq.get()
        if item is None:
            break
        held.append(item)
        del held[:-3]
        if back.qsize() < 8:
            back.put(zctipc.share(np.full(1000, len(held), np.int32)))
    print("done", flush=True)


def producers_scenario(kills, seed):
    """SIGKILL a producer ``kills`` times: a quarter of them stopped at a
    step of making a segment, the rest at random moments. Prints a JSON
    report."""
    import zctipc

    rng = random.Random(int(seed))
    out, back = zctipc.Queue(), zctipc.Queue()
    cons = start("consumer", queue_arg(out), queue_arg(back))
    assert cons.stdout.readline().strip() == "ready"
    stalled = {p: 0 for p in STALL_POINTS}
    for i in range(int(kills)):
        env = dict(os.environ)
        point = STALL_POINTS[i % 4] if i % 4 < 3 and i < int(kills) // 3 else None
        if point:
            env["ZCTIPC_TEST_STALL"] = point
            stalled[point] += 1
        prod = start("producer", queue_arg(out), queue_arg(back), rng.randrange(1 << 30), env=env)
        assert prod.stdout.readline().strip() == "ready"
        time.sleep(0.1 if point else rng.uniform(0, 0.05))
        prod.send_signal(signal.SIGKILL)
        prod.wait()
        prod.stdout.close()
    out.put(None)
    assert cons.stdout.readline().strip() == "done"
    cons.wait()
    # Whatever is still in the queues goes with them.
    print(json.dumps({"kills": int(kills), "stalled": stalled}))


def holder(tag):
    """Hold a segment of its own and a pool buffer; print "ready" and wait
    to be killed."""
    import zctipc

    t = zctipc.create_shared_tensor(data=np.arange(1000))
    a = zctipc.empty(5000, np.float32)
    print("ready", t.name, flush=True)
    time.sleep(3600)
    del t, a


def open_files():
    return len(os.listdir("/proc/self/fd"))


def fd_scenario():
    """Under the file_descriptor strategy: a producer sends tensors to a
    consumer and to this process; every other process (the daemon too) is
    SIGKILLed; this process lets go of what it received. Prints a JSON
    report: the segment directory's contents, and the open files before and
    after."""
    import zctipc

    assert zctipc.get_sharing_strategy() == "file_descriptor"
    shm_dir = os.environ["ZCTIPC_SHM_DIR"]
    to_consumer, to_me = zctipc.Queue(), zctipc.Queue()
    baseline = open_files()
    prod = start("fd_producer", queue_arg(to_consumer), queue_arg(to_me))
    cons = start("fd_consumer", queue_arg(to_consumer))
    assert prod.stdout.readline().strip() == "ready"
    assert cons.stdout.readline().strip() == "ready"
    received = [to_me.get(timeout=30) for _ in range(20)]
    sums = [float(r.sum()) for r in received]
    files_while_running = os.listdir(shm_dir)
    status = zctipc.daemon_status()["status"]
    kept = len(status["memfd_segments"] or [])
    for p in (prod, cons):
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
    os.kill(status["pid"], signal.SIGKILL)
    del received
    to_consumer.close()
    to_me.close()
    del to_consumer, to_me
    gc.collect()
    time.sleep(0.2)
    print(
        json.dumps(
            {
                "files_while_running": files_while_running,
                "files_after": os.listdir(shm_dir),
                "memfd_segments_kept": kept,
                "sums_ok": sums == [1000.0 * (i % 7) for i in range(20)],
                "open_files": [baseline, open_files()],
            }
        )
    )


def fd_producer(consumer_arg, me_arg):
    import zctipc

    to_consumer, to_me = queue_from(consumer_arg), queue_from(me_arg)
    print("ready", flush=True)
    for i in range(20):
        to_me.put(np.full(1000, i % 7, np.float64))  # a pool buffer (memfd arena)
        t = zctipc.create_shared_tensor(data=np.full(50000, i, np.float32))  # a memfd of its own
        to_consumer.put(t.numpy())
        t.close()
    time.sleep(3600)


def fd_consumer(in_arg):
    inq = queue_from(in_arg)
    held = []
    print("ready", flush=True)
    while True:
        held.append(inq.get())
