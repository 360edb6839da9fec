"""A soak run, as a program: producer and consumer processes share one
zctipc.Queue for a while, with messages of every size from tuples to 64 MiB
arrays, each with a unique id and a checksum.

    python _soak.py SECONDS [PRODUCERS CONSUMERS]

It prints a JSON report: messages sent and received, ids received twice or
never, checksums that did not match, and the bytes moved.
"""

import json
import os
import random
import sys
import time
import zlib

import numpy as np

STOP = "stop"
LARGE = 64 << 20


def message(k, n, rng):
    """Message n of producer k: (uid, checksum, payload)."""
    uid = k << 32 | n
    roll = rng.random()
    if roll < 0.35:
        payload = (uid, "x" * rng.randrange(100))
    elif roll < 0.50:
        payload = rng.randbytes(rng.randrange(1, 4096))
    elif roll < 0.80:
        payload = np.frombuffer(rng.randbytes(8 * rng.randrange(1, 512)), dtype=np.float64)
    elif roll < 0.95:
        payload = {"frame": np.full(rng.randrange(1, 1 << 18), n % 251, dtype=np.uint8), "id": uid}
    elif roll < 0.998:
        payload = [np.arange(rng.randrange(1 << 18, 1 << 20), dtype=np.int32), uid]
    else:
        payload = np.full(LARGE, n % 253, dtype=np.uint8)
    return uid, checksum(payload), payload


def checksum(payload):
    if isinstance(payload, np.ndarray):
        return zlib.crc32(payload)
    if isinstance(payload, dict):
        return zlib.crc32(payload["frame"]) ^ payload["id"]
    if isinstance(payload, list):
        return zlib.crc32(payload[0]) ^ payload[1]
    if isinstance(payload, bytes):
        return zlib.crc32(payload)
    return zlib.crc32(repr(payload).encode())


def size(payload):
    if isinstance(payload, np.ndarray):
        return payload.nbytes
    if isinstance(payload, dict):
        return payload["frame"].nbytes
    if isinstance(payload, list):
        return payload[0].nbytes
    return len(payload) if isinstance(payload, bytes) else 64


def produce(q, results, k, seconds):
    rng = random.Random(k)
    deadline = time.monotonic() + seconds
    n = moved = 0
    while time.monotonic() < deadline:
        uid, crc, payload = message(k, n, rng)
        q.put((uid, crc, payload))
        moved += size(payload)
        n += 1
    results.put(("sent", k, n, moved))


def consume(q, results, j):
    got, bad = [], []
    while True:
        item = q.get()
        if item == STOP:
            break
        uid, crc, payload = item
        if checksum(payload) != crc:
            bad.append(uid)
        got.append(uid)
        del item, payload
    results.put(("got", j, got, bad))


def main():
    import zctipc

    seconds = float(sys.argv[1])
    producers = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    consumers = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    ctx = zctipc.get_context("forkserver")
    q = zctipc.Queue(maxsize=64)
    results = zctipc.Queue()
    procs = [ctx.Process(target=produce, args=(q, results, k, seconds)) for k in range(producers)]
    procs += [ctx.Process(target=consume, args=(q, results, j)) for j in range(consumers)]
    start = time.monotonic()
    for p in procs:
        p.start()
    sent, moved = {}, 0
    while len(sent) < producers:
        _, k, n, m = results.get(timeout=seconds + 300)
        sent[k] = n
        moved += m
    for _ in range(consumers):
        q.put(STOP)
    seen, bad, received = set(), [], 0
    duplicates = 0
    for _ in range(consumers):
        _, _, got, wrong = results.get(timeout=300)
        received += len(got)
        for uid in got:
            if uid in seen:
                duplicates += 1
            seen.add(uid)
        bad += wrong
    for p in procs:
        p.join(60)
    expected = {k << 32 | n for k, c in sent.items() for n in range(c)}
    print(
        json.dumps(
            {
                "seconds": round(time.monotonic() - start, 1),
                "sent": len(expected),
                "received": received,
                "missing": len(expected - seen),
                "unexpected": len(seen - expected),
                "duplicates": duplicates,
                "corrupt": len(bad),
                "gigabytes": round(moved / 1e9, 2),
                "exit_codes": sorted({p.exitcode for p in procs}),
                "left_in_queue": q.qsize(),
            }
        )
    )
    q.close()
    results.close()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
