"""multiprocessing.pool, under zctipc's name (``import zctipc as
multiprocessing``): ``Pool`` starts its workers with zctipc's current
context, so its tasks and results cross zctipc's queues; every other name
(ThreadPool, AsyncResult, ...) is multiprocessing's own."""

from __future__ import annotations

import multiprocessing.pool as _mp
from multiprocessing.pool import *  # noqa: F401,F403

from . import context as _context

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

__all__ = list(_mp.__all__)


# Replaces the Pool that the star import brought: a redefinition to mypy.
class Pool(_mp.Pool):  # type: ignore[no-redef]
    """multiprocessing.pool.Pool with zctipc's current context as its
    default context.

    Its tasks and results go through zctipc SimpleQueues, NumPy arrays in
    them by the pool's buffers. When /dev/shm has no room (Docker gives 64
    MiB), an array goes inside its message instead, with one warning per
    process, and the program goes on (zctipc.queues.SimpleQueue.put); a
    chunk of tasks (map's chunksize) is one message, so a chunk whose
    arrays are more than /dev/shm holds raises OutOfSharedMemory, which
    names a smaller chunksize. The task handler puts every pending task as
    soon as it can, and with room each one's arrays are copied into the
    pool then, not when a worker takes the task."""

    def __init__(
        self,
        processes: int | None = None,
        initializer: Callable[..., object] | None = None,
        initargs: Iterable[Any] = (),
        maxtasksperchild: int | None = None,
        context: Any = None,
    ) -> None:
        super().__init__(processes, initializer, initargs, maxtasksperchild, context or _context.get_context())


def __getattr__(name: str) -> Any:
    return getattr(_mp, name)
