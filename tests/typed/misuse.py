"""Misuse of zctipc's API that mypy must report: tests/python/test_types.py
checks that each line marked ``# expect: CODE`` gets an error of that
mypy error code, and that no other line gets one. It is never run."""

from __future__ import annotations

import torch

import zctipc


def sizes(t: zctipc.SharedTensor) -> str:
    n: str = t.nbytes  # expect: assignment
    return n


def queues(q: zctipc.Queue) -> None:
    zctipc.Queue(maxsize="4")  # expect: arg-type
    zctipc.SimpleQueue(max_bytes=1.5)  # expect: arg-type
    q.get(timeout="1s")  # expect: arg-type
    q.put_item(1)  # expect: attr-defined


def handles(t: zctipc.SharedTensor) -> None:
    zctipc.attach_shared_tensor(t)  # expect: arg-type
    zctipc.attach_table(42)  # expect: arg-type
    t.shape = (1, 2)  # expect: misc


def arrays() -> torch.Tensor:
    a: torch.Tensor = zctipc.empty((2, 3), "float32")  # expect: assignment
    return a


def streams(w: zctipc.StreamWriter) -> None:
    frame = w.look()
    frame[0] = 1.0  # expect: index
    zctipc.Stream.create(frames="8")  # expect: arg-type


def others() -> None:
    zctipc.Queu()  # expect: attr-defined
    zctipc.Event().wait("soon")  # expect: arg-type
    zctipc.set_pool_limit("1G")  # expect: arg-type
