"""multiprocessing.pool, under zctipc's name (``import zctipc as
multiprocessing``): ``Pool`` starts its workers with zctipc's current
context, so its tasks and results cross zctipc's queues; every other name
(ThreadPool, AsyncResult, ...) is multiprocessing's own."""

import multiprocessing.pool as _mp
from multiprocessing.pool import *  # noqa: F401,F403

from . import context as _context

__all__ = list(_mp.__all__)


class Pool(_mp.Pool):
    """multiprocessing.pool.Pool with zctipc's current context as its
    default context."""

    def __init__(self, processes=None, initializer=None, initargs=(), maxtasksperchild=None, context=None):
        super().__init__(processes, initializer, initargs, maxtasksperchild, context or _context.get_context())


def __getattr__(name):
    return getattr(_mp, name)
