"""DataLoader batches in pool memory: what zctipc changes in a
torch.utils.data DataLoader worker started with zctipc's context.

Note [batches in the pool]: inside a worker, torch's default collate stacks
each batch of tensors into a fresh shared-memory storage that it asks of
``torch.UntypedStorage._new_shared`` (a new file, a new mapping and fresh
zeroed pages for every batch), which a zctipc queue then had to move into
its pool. In a worker that zctipc's context started (zctipc.context runs
``install`` in the child when the process's target is torch's worker loop),
``_new_shared`` gives a storage over a pool buffer instead: its pages stay
mapped and warm from batch to batch, the batch is sent as a descriptor, the
main process gets views of it, and when it drops the batch the buffer goes
back to the worker's pool for a later one. That is all this touches:
- one class attribute, ``torch.UntypedStorage._new_shared``, in the worker
  process only (the main process and workers of other contexts keep
  torch's), for CPU storages; other devices keep torch's;
- nothing else in torch: custom collate functions that stack without
  ``_new_shared`` take the usual path (their tensors are moved into the pool
  when they are sent; tensors already in zctipc memory go as they are).
When the pool has no room (the main process holds many batches, or a batch
is larger than the pool's limit), the batch gets a segment of its own, as
torch's storage is a file of its own, rather than waiting in the worker:
so does everything else the worker's queue moves into the pool then
(labels, a custom collate's tensors; pool.overflow), since the main process
may hold every buffer for ever, and the worker would wait for it in vain
(or, for a batch larger than the limit, fail). A process forked from the
worker (it cannot call zctipc) gets torch's storages.
``pin_memory=True`` is unchanged: the main process's pin thread copies each
batch into page-locked memory, as it does for torch's storages.
"""

from __future__ import annotations

import sys

from .._core import native, pool
from ..errors import OutOfSharedMemory

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any

    import torch

_WORKER_LOOP = ("torch.utils.data._utils.worker", "_worker_loop")
_torch_new_shared: Any = None  # torch's UntypedStorage._new_shared, once replaced


def is_worker_loop(target: object) -> bool:
    """Whether target is torch's DataLoader worker loop (judged by name,
    without importing torch)."""
    return (getattr(target, "__module__", None), getattr(target, "__name__", None)) == _WORKER_LOOP


def install() -> None:
    """Make torch's collate stack batches into pool buffers in this process
    (Note [batches in the pool]). Idempotent; for DataLoader workers only."""
    global _torch_new_shared
    torch = sys.modules["torch"]  # imported: the worker loop is torch's
    if _torch_new_shared is not None:
        return
    pool.overflow = True
    cls = torch.UntypedStorage
    # The classmethod itself (UntypedStorage inherits it), to call for any class.
    _torch_new_shared = next(k.__dict__["_new_shared"] for k in cls.__mro__ if "_new_shared" in k.__dict__)
    cls._new_shared = classmethod(_new_shared)


def _new_shared(cls: type[torch.UntypedStorage], size: int, *, device: Any = "cpu") -> torch.UntypedStorage:
    """A storage of size bytes (an int) in a pool buffer, or a segment of
    its own when the pool has no room, for CPU storages of at least a byte;
    torch's shared storage otherwise: in a process forked from the worker,
    or when /dev/shm cannot hold it."""
    torch = sys.modules["torch"]
    if (
        type(size) is int
        and size > 0
        and cls is torch.UntypedStorage
        and torch.device(device).type == "cpu"
        and not native.forked()
    ):
        try:
            return pool.empty((size,), torch.uint8, block=False).untyped_storage()
        except OutOfSharedMemory:
            pass
    return _torch_new_shared.__get__(None, cls)(size, device=device)
