"""multiprocessing contexts whose queues are zctipc's, and the start methods
that are safe with a Go runtime in the process.

A Go runtime does not survive ``fork()``, so zctipc's contexts use
``forkserver`` (the default, Python 3.14's own default) or ``spawn``. Their
``Queue``, ``SimpleQueue``, ``JoinableQueue`` and ``Event`` are zctipc's;
``Pool`` is multiprocessing's pool over zctipc's queues, started with the
context; ``Manager`` is multiprocessing's SyncManager, whose values are
copies as the standard library's are (zctipc._wire.values); everything
else (``Process``, ``Pipe``, ``Lock``, ...) is multiprocessing's own,
started with the context. Each context returns
itself from ``get_context()``.

Note [the fork default]: on Pythons whose default start method is fork
(Linux before 3.14), a program that never chose one would fork children
that cannot use zctipc. So when this process first loads zctipc's library
and no start method was chosen, multiprocessing's *default* becomes
forkserver (choose_start_method), quietly: a DEBUG record of the "zctipc"
log says so. It becomes so as well when this process starts a process
with one of zctipc's contexts before it loads the library: multiprocessing
fixes the parent's start method as it starts a spawn or forkserver child,
and tells the child that method (a zctipc.Process's child keeps it); fixed
as fork, the parent would keep fork once it loads the library, and the
child would fork children that cannot use zctipc. The method is not fixed:
set_start_method("spawn") still works afterwards, and a program that chose
fork keeps it (its children then raise ForkedProcessError).

Note [the start method warning]: the switch is news only to a program that
never chose a start method and starts a process it would have forked: one
started through the default context (multiprocessing.Process,
multiprocessing.Pool and Manager, multiprocessing.get_context() without a
method, a ProcessPoolExecutor or a DataLoader given no context). That
start warns, once per process, before the process is made: a
RuntimeWarning at the caller's line (warn_start_method). Nothing else
warns: importing zctipc, loading its library, queues, arrays, the command
line; zctipc's own Process, Pool and Manager (documented to start with
forkserver: a program that calls them chose zctipc's method); a process
started with a context the program passed
(zctipc.get_context(), multiprocessing.get_context("spawn"), a
ProcessPoolExecutor's mp_context); a program that chose a method
(set_start_method); a child that multiprocessing started (a spawn or
forkserver child is told its parent's method, which fixes its own) and a
Ray worker (zctipc.ray). ZCTIPC_NO_START_METHOD_WARNING=1 silences it, for
a program content with forkserver. Under ``python -W error`` the warning is
an exception, raised by that first start before anything is started: such
a program fails there, and only there; one that passes its contexts or
chooses its method runs as it does without the flag.

The module also carries every name of multiprocessing.context, so that it
stands in for it (``import zctipc as multiprocessing``).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
import threading
import warnings
from multiprocessing import context as _mpcontext

from ._core import lazy, log
from ._wire import batches, values
from .events import Event
from .queues import JoinableQueue, Queue, SimpleQueue

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    import multiprocessing.pool
    from collections.abc import Callable, Iterable
    from multiprocessing.process import BaseProcess
    from types import FrameType
    from typing import Any, Literal, SupportsIndex, overload

    from typing_extensions import Self

__all__ = ["get_context", "ForkServerContext", "SpawnContext", "DefaultContext", "DEFAULT_START_METHOD"]

DEFAULT_START_METHOD = "forkserver"


class _ZctipcContext:
    """What zctipc's contexts change in multiprocessing's."""

    def Queue(self, maxsize: SupportsIndex = 0, **options: Any) -> Queue:
        """zctipc.Queue (options: max_bytes, inline_bytes, wait, spin)."""
        return Queue(maxsize, ctx=self, **options)

    def JoinableQueue(self, maxsize: SupportsIndex = 0, **options: Any) -> JoinableQueue:
        return JoinableQueue(maxsize, ctx=self, **options)

    def SimpleQueue(self, **options: Any) -> SimpleQueue:
        return SimpleQueue(ctx=self, **options)

    def Manager(self) -> values.SyncManager:
        """A started SyncManager whose values are copies, as the standard
        library's are (Note [managers hand out copies] in
        zctipc._wire.values)."""
        m = values.SyncManager(ctx=self.get_context())
        m.start()
        return m

    def Event(self) -> Event:
        return Event(ctx=self)

    def Pool(
        self,
        processes: int | None = None,
        initializer: Callable[..., object] | None = None,
        initargs: Iterable[Any] = (),
        maxtasksperchild: int | None = None,
    ) -> multiprocessing.pool.Pool:
        import multiprocessing.pool  # on first use: it costs a third of importing zctipc

        return multiprocessing.pool.Pool(processes, initializer, initargs, maxtasksperchild, context=self.get_context())

    def get_context(self, method: str | None = None) -> Self | ForkServerContext | SpawnContext:
        if method is None:
            return self
        return get_context(method)


# The contexts' Queue, JoinableQueue, SimpleQueue, Event and get_context are
# zctipc's, which type checkers see as incompatible with multiprocessing's
# (they return zctipc's objects): each class says so once, with an ignore.


def _run(process: BaseProcess) -> None:
    """In a child that a zctipc context started, before its target runs: a
    DataLoader worker stacks its batches in the pool (Note [batches in the
    pool] in zctipc._wire.batches), and leaves when its main process dies
    (Note [a worker of a fork server])."""
    if batches.is_worker_loop(getattr(process, "_target", None)):
        batches.install()
        _watch_parent()


# Note [a worker of a fork server]: a DataLoader worker watches its main
# process by its parent pid (torch's ManagerWatchdog: it leaves once
# os.getppid() changes), and torch's spawn ranks ask Linux for a signal when
# their parent dies (PR_SET_PDEATHSIG). A process that the fork server
# started is the fork server's child, and the fork server lives as long as
# any child of it holds its alive pipe, as every one does: when the main
# process was killed, its workers never saw it go, and lived on for ever,
# holding their pools' segments (which the cleanup daemon sweeps only once
# they die). So such a process waits, in a daemon thread, on
# multiprocessing's sentinel of the process that started it (the end of the
# pipe it was started through, under spawn and forkserver alike), and acts
# when it closes (when_parent_exits): a DataLoader worker whose parent is
# not its main process terminates itself (zctipc's SIGTERM handler lets go
# first where it is the one installed, and the cleanup daemon sweeps what is
# left); a rank of zctipc.spawn interrupts itself (Note [a rank dies with
# its parent] in zctipc.spawning).


def when_parent_exits(action: Callable[[], object]) -> None:
    """Call action, in a daemon thread, when the process that started this
    one with a zctipc or multiprocessing context exits (Note [a worker of a
    fork server])."""
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return
    sentinel = parent.sentinel

    def watch() -> None:
        wait([sentinel])
        action()

    threading.Thread(target=watch, name="zctipc-parent-watch", daemon=True).start()


def _watch_parent() -> None:
    """Terminate this DataLoader worker when its main process dies, if that
    is not its parent (Note [a worker of a fork server])."""
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # else torch's watchdog sees it go
        when_parent_exits(lambda: os.kill(os.getpid(), signal.SIGTERM))


class ForkServerProcess(_mpcontext.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: BaseProcess) -> Any:
        choose_start_method()  # Note [the fork default]: before multiprocessing fixes it
        return _mpcontext.ForkServerProcess._Popen(process_obj)

    def run(self) -> None:
        _run(self)
        super().run()


class SpawnProcess(_mpcontext.SpawnProcess):
    @staticmethod
    def _Popen(process_obj: BaseProcess) -> Any:
        choose_start_method()  # Note [the fork default]: before multiprocessing fixes it
        return _mpcontext.SpawnProcess._Popen(process_obj)

    def run(self) -> None:
        _run(self)
        super().run()


class ForkServerContext(_ZctipcContext, _mpcontext.ForkServerContext):  # type: ignore[misc]
    Process = ForkServerProcess


class SpawnContext(_ZctipcContext, _mpcontext.SpawnContext):  # type: ignore[misc]
    Process = SpawnProcess


_CONTEXTS: dict[str, ForkServerContext | SpawnContext] = {"forkserver": ForkServerContext(), "spawn": SpawnContext()}


def get_context(method: str | None = None) -> ForkServerContext | SpawnContext:
    """Return zctipc's multiprocessing context for ``method``: "forkserver"
    or "spawn", or with None the current one (forkserver unless
    set_start_method chose). "fork" is refused: a child forked from a
    process that loaded zctipc cannot use it."""
    lazy.check()  # NumPy imported since: its arrays go to children zctipc's way
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

    _start_method: str | None = None

    @staticmethod
    def _Popen(process_obj: BaseProcess) -> Any:
        lazy.check()
        return _default.get_context().Process._Popen(process_obj)

    def run(self) -> None:
        _run(self)
        super().run()

    @staticmethod
    def _after_fork() -> None:
        return _mpcontext.Process._after_fork()  # type: ignore[attr-defined]  # private, not in typeshed


class DefaultContext(_ZctipcContext, _mpcontext.BaseContext):  # type: ignore[misc]
    """The context behind zctipc's module-level names, like
    multiprocessing's default context but with zctipc's start methods. The
    start method is multiprocessing's own (set_start_method sets both), so
    that multiprocessing.Process and children agree with zctipc."""

    Process = Process

    def Pool(
        self,
        processes: int | None = None,
        initializer: Callable[..., object] | None = None,
        initargs: Iterable[Any] = (),
        maxtasksperchild: int | None = None,
    ) -> multiprocessing.pool.Pool:
        return _ZctipcContext.Pool(self, processes, initializer, initargs, maxtasksperchild)

    def Manager(self) -> values.SyncManager:
        return _ZctipcContext.Manager(self)

    def get_context(self, method: str | None = None) -> ForkServerContext | SpawnContext:  # type: ignore[override]
        if method is None:
            # multiprocessing's choice (a spawned child's parent made it),
            # else its default, when zctipc has a context for it.
            return _CONTEXTS.get(_multiprocessing_method(), _CONTEXTS[DEFAULT_START_METHOD])
        return get_context(method)

    def set_start_method(self, method: str | None, force: bool = False) -> None:
        if method is not None:
            get_context(method)  # refuses fork
        multiprocessing.set_start_method(method, force)

    if TYPE_CHECKING:

        @overload
        def get_start_method(self, allow_none: Literal[False] = ...) -> str: ...
        @overload
        def get_start_method(self, allow_none: bool) -> str | None: ...

    def get_start_method(self, allow_none: bool = False) -> str | None:
        if allow_none and multiprocessing.get_start_method(allow_none=True) is None:
            return None
        return self.get_context().get_start_method()

    def get_all_start_methods(self) -> list[str]:
        return list(_CONTEXTS)


_default: DefaultContext = DefaultContext()


def _multiprocessing_method() -> str:
    """The start method multiprocessing has fixed, else its default, without
    fixing it."""
    default: Any = _mpcontext._default_context  # its private state, which typeshed does not describe
    return (default._actual_context or default._default_context).get_start_method()


def choose_start_method() -> None:
    """Note [the fork default]: make forkserver multiprocessing's default
    start method when its default is fork and no method was chosen, without
    a word but a DEBUG record. Called when this process first loads
    zctipc's library, and as it starts a process with a zctipc context."""
    default: Any = _mpcontext._default_context  # its private state, which typeshed does not describe
    if default._actual_context is None and default._default_context.get_start_method() == "fork":
        default._default_context = _ChosenForkServerContext()
        log.debug(
            "made forkserver multiprocessing's default start method: its default was fork, which a process "
            "that loaded zctipc cannot use, and none was chosen"
        )


#: Set (to anything but 0; empty is unset, as for zctipc's other
#: variables) to silence the start method warning (Note [the start method
#: warning]).
NO_WARNING_ENV = "ZCTIPC_NO_START_METHOD_WARNING"

START_METHOD_WARNING = (
    "zctipc made 'forkserver' multiprocessing's default start method (a process forked after loading zctipc "
    "cannot use it), so this process starts with forkserver, not fork: its target and arguments are pickled. "
    "To choose, call multiprocessing.set_start_method('forkserver') (or 'spawn') before starting processes, or "
    f"pass a context (zctipc.get_context(), multiprocessing.get_context('spawn')); or set {NO_WARNING_ENV}=1"
)

_warned = False
_warned_lock = threading.Lock()


def switched() -> bool:
    """Whether the default context starts processes with a method zctipc
    chose for the program (Note [the fork default]): no method was chosen,
    and multiprocessing's default is fork, which zctipc made forkserver (or
    will, when it loads its library; zctipc.Process and zctipc.Pool use
    forkserver already)."""
    default: Any = _mpcontext._default_context  # its private state, which typeshed does not describe
    context = default._actual_context or default._default_context
    if isinstance(context, _ChosenForkServerContext):
        return True
    return default._actual_context is None and context.get_start_method() == "fork"


def warn_start_method() -> None:
    """Note [the start method warning]: say, the first time a process is
    about to start through the default context with the method zctipc
    chose, that it did."""
    global _warned
    if _warned or not switched():
        return
    with _warned_lock:
        if _warned:
            return
        _warned = True
    if os.environ.get(NO_WARNING_ENV, "0") not in ("", "0") or multiprocessing.parent_process() is not None:
        return
    warnings.warn(START_METHOD_WARNING, RuntimeWarning, stacklevel=_caller_level())


#: Added to the pickling error of a process started with the method zctipc
#: chose (Note [the fork default]).
CHOSEN_NOTE = (
    "zctipc made 'forkserver' this program's default start method when it loaded (a process forked after that "
    "cannot use zctipc), so a new process's target and arguments are pickled. To fork this one, pass "
    "multiprocessing.get_context('fork') (a DataLoader: multiprocessing_context=multiprocessing.get_context('fork')), "
    "or call multiprocessing.set_start_method('fork') before starting processes (children that use zctipc then fail)"
)


class _ChosenForkServerProcess(_mpcontext.ForkServerProcess):
    """multiprocessing's forkserver process, whose pickling errors say that
    zctipc chose the method (Note [the fork default])."""

    @staticmethod
    def _Popen(process_obj: BaseProcess) -> Any:
        warn_start_method()
        try:
            return _mpcontext.ForkServerProcess._Popen(process_obj)
        except (AttributeError, TypeError, pickle.PicklingError) as e:
            if isinstance(e, pickle.PicklingError) or "pickle" in str(e) or "local object" in str(e):
                _add_note(e, CHOSEN_NOTE)
            raise


def _add_note(e: BaseException, note: str) -> None:
    if sys.version_info >= (3, 11):
        e.add_note(note)
    elif e.args and isinstance(e.args[0], str):  # no notes before 3.11: the message says it
        e.args = (f"{e.args[0]}\n{note}",) + e.args[1:]


class _ChosenForkServerContext(_mpcontext.ForkServerContext):
    """multiprocessing's forkserver context, as zctipc makes it the default
    (its queues and locks are the standard library's)."""

    Process = _ChosenForkServerProcess


#: The modules between a program and a process start, whose frames a
#: warning skips to point at the program's line.
_PLUMBING = ("zctipc", "multiprocessing", "concurrent.futures", "torch.multiprocessing", "torch.utils.data")


def _caller_level() -> int:
    """The stacklevel, for a warning of the caller's caller, of the first
    frame outside zctipc, multiprocessing and the modules that start
    processes for a program (_PLUMBING)."""
    frame: FrameType | None
    frame, level = sys._getframe(1), 1
    while frame is not None and (level == 1 or _plumbing(frame.f_globals.get("__name__") or "")):
        frame, level = frame.f_back, level + 1
    return level


def _plumbing(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in _PLUMBING)


#: The names zctipc provides in place of multiprocessing's, for
#: ``import zctipc as multiprocessing``. Queue, SimpleQueue, JoinableQueue,
#: Event and Process are classes; the rest are functions of the default
#: context.
MULTIPROCESSING_NAMES = [
    "Process",
    "Queue",
    "SimpleQueue",
    "JoinableQueue",
    "Pool",
    "Pipe",
    "Manager",
    "Lock",
    "RLock",
    "Semaphore",
    "BoundedSemaphore",
    "Condition",
    "Event",
    "Barrier",
    "Value",
    "Array",
    "RawValue",
    "RawArray",
    "cpu_count",
    "current_process",
    "parent_process",
    "active_children",
    "freeze_support",
    "get_context",
    "get_start_method",
    "set_start_method",
    "get_all_start_methods",
    "get_logger",
    "log_to_stderr",
    "set_forkserver_preload",
    "set_executable",
    "allow_connection_pickling",
    "ProcessError",
    "BufferTooShort",
    "TimeoutError",
    "AuthenticationError",
]


def namespace() -> dict[str, Any]:
    """The objects of MULTIPROCESSING_NAMES, as zctipc exports them, and
    ``reducer``, multiprocessing's reduction module."""
    names = {name: getattr(_default, name) for name in MULTIPROCESSING_NAMES}
    names.update(Queue=Queue, SimpleQueue=SimpleQueue, JoinableQueue=JoinableQueue, Event=Event, Process=Process)
    names["reducer"] = _default.reducer
    return names


def __getattr__(name: str) -> Any:
    # The rest of multiprocessing.context: BaseContext, ForkServerProcess,
    # assert_spawning, reduction, ...
    try:
        return getattr(_mpcontext, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
