"""multiprocessing contexts whose queues are zctipc's, and the start methods
that are safe with a Go runtime in the process.

A Go runtime does not survive ``fork()``, so zctipc's contexts use
``forkserver`` (the default, Python 3.14's own default) or ``spawn``. Their
``Queue``, ``SimpleQueue``, ``JoinableQueue`` and ``Event`` are zctipc's;
``Pool`` is multiprocessing's pool, started with the context; everything
else (``Process``, ``Pipe``, ``Lock``, ``Manager``, ...) is
multiprocessing's own.
"""

import multiprocessing
import multiprocessing.pool
from multiprocessing import context as _mpcontext

from .events import Event
from .queues import DEFAULT_MAX_BYTES, JoinableQueue, Queue, SimpleQueue

__all__ = ["get_context", "ForkServerContext", "SpawnContext", "DefaultContext", "DEFAULT_START_METHOD"]

DEFAULT_START_METHOD = "forkserver"


class _ZctipcContext:
    """What zctipc's contexts change in multiprocessing's."""

    def Queue(self, maxsize=0, *, max_bytes=None):
        return Queue(maxsize, max_bytes=max_bytes or DEFAULT_MAX_BYTES, ctx=self)

    def JoinableQueue(self, maxsize=0, *, max_bytes=None):
        return JoinableQueue(maxsize, max_bytes=max_bytes or DEFAULT_MAX_BYTES, ctx=self)

    def SimpleQueue(self, *, max_bytes=None):
        return SimpleQueue(max_bytes=max_bytes or DEFAULT_MAX_BYTES, ctx=self)

    def Event(self):
        return Event(ctx=self)

    def Pool(self, processes=None, initializer=None, initargs=(), maxtasksperchild=None):
        # The pool reaches inside its own task queues, which must stay
        # multiprocessing's: it gets multiprocessing's context of the same
        # start method.
        mp_context = multiprocessing.get_context(self.get_context().get_start_method())
        return multiprocessing.pool.Pool(processes, initializer, initargs, maxtasksperchild, context=mp_context)

    def get_context(self, method=None):
        return get_context(method)


class ForkServerContext(_ZctipcContext, _mpcontext.ForkServerContext):
    pass


class SpawnContext(_ZctipcContext, _mpcontext.SpawnContext):
    pass


_CONTEXTS = {"forkserver": ForkServerContext(), "spawn": SpawnContext()}


def get_context(method=None):
    """Return zctipc's multiprocessing context for ``method``: "forkserver"
    or "spawn", or with None the current one (forkserver unless
    set_start_method chose). "fork" is refused: a child forked from a
    process that loaded zctipc cannot use it."""
    if method is None:
        return _default.get_context()
    try:
        return _CONTEXTS[method]
    except KeyError:
        raise ValueError(
            f"zctipc does not support the {method!r} start method: a Go runtime does not survive fork(); "
            f"use one of {', '.join(_CONTEXTS)}"
        ) from None


class Process(multiprocessing.process.BaseProcess):
    """multiprocessing.Process started with zctipc's current start method
    (forkserver unless set_start_method chose spawn)."""

    _start_method = None

    @staticmethod
    def _Popen(process_obj):
        return _default.get_context().Process._Popen(process_obj)

    @staticmethod
    def _after_fork():
        return _mpcontext.Process._after_fork()


class DefaultContext(_ZctipcContext, _mpcontext.BaseContext):
    """The context behind zctipc's module-level names, like
    multiprocessing's default context but with zctipc's start methods."""

    Process = Process

    def __init__(self):
        self._actual = None

    def get_context(self, method=None):
        if method is None:
            return self._actual or _CONTEXTS[DEFAULT_START_METHOD]
        return get_context(method)

    def set_start_method(self, method, force=False):
        if self._actual is not None and not force:
            raise RuntimeError("context has already been set")
        self._actual = None if method is None and force else get_context(method)

    def get_start_method(self, allow_none=False):
        if self._actual is None and allow_none:
            return None
        return self.get_context().get_start_method()

    def get_all_start_methods(self):
        return list(_CONTEXTS)


_default = DefaultContext()

#: The names zctipc provides in place of multiprocessing's, for
#: ``import zctipc as multiprocessing``. Queue, SimpleQueue, JoinableQueue,
#: Event and Process are classes; the rest are functions of the default
#: context.
MULTIPROCESSING_NAMES = [
    "Process", "Queue", "SimpleQueue", "JoinableQueue", "Pool", "Pipe", "Manager",
    "Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier",
    "Value", "Array", "RawValue", "RawArray",
    "cpu_count", "current_process", "parent_process", "active_children", "freeze_support",
    "get_context", "get_start_method", "set_start_method", "get_all_start_methods",
    "get_logger", "log_to_stderr", "set_forkserver_preload",
    "ProcessError", "BufferTooShort", "TimeoutError", "AuthenticationError",
]


def namespace():
    """The objects of MULTIPROCESSING_NAMES, as zctipc exports them."""
    names = {name: getattr(_default, name) for name in MULTIPROCESSING_NAMES}
    names.update(Queue=Queue, SimpleQueue=SimpleQueue, JoinableQueue=JoinableQueue, Event=Event, Process=Process)
    return names
