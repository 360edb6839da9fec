"""A queue shared by producer and consumer threads of one process, run as a
program so that a crash is a failed exit rather than a dead test run.

    python _threads.py SWITCH_INTERVAL SECONDS

Four producers put numbered messages of every kind a queue carries (tuples,
bytes, bare arrays and tensors, dicts of arrays, batches) until the time is
up; four consumers take them with get and get_many. It prints a JSON report:
how many were put and taken, duplicates, and corrupt messages.
"""

import json
import sys
import threading
import time

import numpy as np
import torch

import zctipc

PRODUCERS = CONSUMERS = 4
DONE = "done"


def produce(q, k, stop, sent):
    n = 0
    while not stop.is_set():
        uid = k << 32 | n
        kind = n % 6
        if kind == 0:
            q.put((uid, "x" * (n % 50)))
        elif kind == 1:
            q.put(uid.to_bytes(8, "little") * (1 + n % 4))
        elif kind == 2:
            q.put(np.full(1 + n % 40, uid, dtype=np.int64))
        elif kind == 3:
            q.put(torch.full((1 + n % 7,), uid, dtype=torch.int64))
        elif kind == 4:
            q.put({"id": uid, "a": np.full(3, uid), "t": torch.arange(4)})
        else:
            q.put_many([(uid, i) for i in range(3)])
        n += 1
    sent[k] = n
    q.put(DONE)


def check(msg):
    """The message's id, or raise for a corrupt one."""
    if isinstance(msg, tuple):
        return msg[0]
    if isinstance(msg, bytes):
        uid = int.from_bytes(msg[:8], "little")
        assert msg == msg[:8] * (len(msg) // 8), "bytes"
        return uid
    if isinstance(msg, np.ndarray):
        assert (msg == msg[0]).all(), "array"
        return int(msg[0])
    if isinstance(msg, torch.Tensor):
        assert bool((msg == msg[0]).all()), "tensor"
        return int(msg[0])
    assert (msg["a"] == msg["id"]).all() and msg["t"].tolist() == [0, 1, 2, 3], "dict"
    return msg["id"]


def consume(q, j, taken, corrupt, done):
    while True:
        msgs = q.get_many(8, timeout=60) if j % 2 else [q.get(timeout=60)]
        for i, msg in enumerate(msgs):
            if msg is None:  # the end: hand any other end in the batch on
                for _ in range(msgs[i + 1 :].count(None)):
                    q.put(None)
                return
            if isinstance(msg, str) and msg == DONE:
                with done[0]:
                    done[1] += 1
                    last = done[1] == PRODUCERS
                if last:  # every producer is done: let the consumers go
                    for _ in range(CONSUMERS):
                        q.put(None)
                continue
            try:
                taken.append(check(msg))
            except AssertionError as exc:
                corrupt.append(str(exc))


def main():
    sys.setswitchinterval(float(sys.argv[1]))
    seconds = float(sys.argv[2])
    q = zctipc.Queue()
    stop = threading.Event()
    sent = [0] * PRODUCERS
    taken, corrupt, done = [], [], [threading.Lock(), 0]
    threads = [threading.Thread(target=produce, args=(q, k, stop, sent)) for k in range(PRODUCERS)]
    threads += [threading.Thread(target=consume, args=(q, j, taken, corrupt, done)) for j in range(CONSUMERS)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    # A batch put sends three messages with one id.
    expected = sum(n + 2 * (n // 6) for n in sent)
    ids = {}
    for uid in taken:
        ids[uid] = ids.get(uid, 0) + 1
    duplicates = sum(1 for uid, c in ids.items() if c > (3 if (uid & 0xFFFFFFFF) % 6 == 5 else 1))
    print(
        json.dumps(
            {"sent": expected, "taken": len(taken), "duplicates": duplicates, "corrupt": corrupt[:5], "left": q.qsize()}
        )
    )
    q.close()


if __name__ == "__main__":
    main()
