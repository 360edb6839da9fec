"""torch.multiprocessing's process face: ``spawn``, ``start_processes`` and
the ``ProcessContext`` that joins their processes.

``zctipc.spawn(fn, args, nprocs)`` runs ``fn(rank, *args)`` in ``nprocs``
processes, as ``torch.multiprocessing.spawn`` does, started with zctipc's
contexts so that every rank can use zctipc. With ``join=True`` it returns
once all have ended; when one fails, the others are ended (SIGTERM, then
SIGKILL after a grace period) and reaped, and the parent raises
``ProcessRaisedException`` with the rank's traceback, or
``ProcessExitedException`` with its exit code or signal. With
``join=False`` it returns the ``ProcessContext``. A rank gets SIGINT when
the process that started it exits, and then ends quietly.

How it differs from torch's: the start methods are zctipc's, ``"spawn"``
and ``"forkserver"``, and ``"fork"`` is refused (ValueError); ``spawn``
honours its ``start_method``, where torch's warns and uses spawn; the
exceptions are zctipc's (zctipc.errors), which ``except`` clauses naming
torch's do not catch; ranks start one after another
(``TORCH_MP_PARALLEL_START`` is not read); ranks die with their parent
under forkserver too (Note [a rank dies with its parent]); a failed rank's
traceback file is removed once read. And where torch's has faults: any
exception of a rank's function but SystemExit is raised as
ProcessRaisedException (torch's: only an Exception's), and so is a failure
to unpickle ``fn`` or ``args`` in the rank (Note [a rank's call]);
forkserver ranks get the environment of the call, as spawn's do; a spawn
interrupted while it waits ends its ranks before it raises (Note [an
interrupted spawn]); ``join`` may be called from several threads; a
negative ``nprocs`` raises InvalidArgument. torch is not imported.
"""

from __future__ import annotations

import multiprocessing.connection
import operator
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
import warnings
from multiprocessing.reduction import ForkingPickler

from . import context
from .errors import InvalidArgument, ProcessException, ProcessExitedException, ProcessRaisedException

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from multiprocessing.process import BaseProcess
    from typing import Any, Literal, overload

__all__ = [
    "spawn",
    "start_processes",
    "ProcessContext",
    "SpawnContext",
    "ProcessException",
    "ProcessRaisedException",
    "ProcessExitedException",
]

# Note [a rank's traceback]: a rank whose function raises writes its
# traceback to a file the parent named for it, and exits 1; the parent reads
# the file once the rank has ended (as torch does: a file, not a queue, so
# that nothing waits on a reader, and a rank killed while writing breaks no
# channel). The rank writes a file of its own (O_EXCL, mode 0600) and
# renames it into place, so the parent never reads half a traceback. The
# parent removes every rank's file once the ranks are reaped, whether they
# failed, the start failed or the wait was interrupted. A rank whose parent
# has died writes none: nobody would read or remove it.


# Note [a rank dies with its parent]: torch's ranks ask Linux for SIGINT
# when their parent dies (PR_SET_PDEATHSIG); under forkserver their parent
# is the fork server, which lives as long as they do (Note [a worker of a
# fork server] in zctipc.context), so they outlived a killed program. A
# zctipc rank watches the process that started it (context.when_parent_exits)
# and sends itself SIGINT when that process exits: fn gets
# KeyboardInterrupt, and the rank ends quietly (exit code 0), under either
# method. The watch starts inside the rank's try: a parent that died before
# the rank ran is seen at once, and SIGINT may land while the watch starts.
# Once fn has returned there is nothing to interrupt.
_orphaned = threading.Event()
_returned = threading.Event()


# Note [a rank's call]: fn and args travel to a rank pickled apart, as bytes
# inside the rank's process object (_Call). They are pickled while that
# object is, so that locks, queues and descriptors go as a Process's args
# do; and the rank unpickles them as it unpickles that object, but under a
# try: a function of a module the rank cannot import, or an argument that
# fails to load, is the rank's error, raised in the parent with its
# traceback, and not an exit code 1 before the rank's code runs (torch's).
# Under forkserver the call carries the parent's environment, which the
# rank takes before it unpickles fn and args: a fork server has the
# environment of the moment it started, where a spawned rank (and every
# rank of torch's spawn, which always spawns) has that of the call.


class _Call:
    """fn and args for a rank (Note [a rank's call]); in the rank, ``error``
    is the traceback of their unpickling when it failed."""

    def __init__(self, fn: Callable[..., object], args: tuple[Any, ...], environ: dict[str, str] | None) -> None:
        self.fn, self.args, self.environ = fn, args, environ
        self.error: str | None = None

    def __reduce__(self) -> tuple[Callable[..., _Call], tuple[bytes, dict[str, str] | None]]:
        return _load_call, (bytes(ForkingPickler.dumps((self.fn, self.args))), self.environ)


def _load_call(data: bytes, environ: dict[str, str] | None) -> _Call:
    """Rebuild a _Call in the rank: its environment first, then fn and args."""
    if environ is not None:
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        os.environ.update(environ)
    call = _Call(_not_loaded, (), None)
    try:
        call.fn, call.args = pickle.loads(data)
    except Exception:
        call.error = traceback.format_exc()
    return call


def _not_loaded(rank: int) -> None:
    """fn of a _Call that could not be unpickled."""


def _run_rank(call: _Call, rank: int, error_file: str) -> None:
    """A rank's target: call.fn(rank, *call.args), its traceback to
    error_file if it raises (Note [a rank's traceback])."""
    try:
        try:
            _watch()
            if call.error is not None:
                _write_traceback(error_file, call.error)
                sys.exit(1)
            call.fn(rank, *call.args)
        finally:
            _returned.set()
    except SystemExit:
        raise
    except KeyboardInterrupt:
        if _orphaned.is_set():
            return
        _write_traceback(error_file, traceback.format_exc())
        sys.exit(128 + signal.SIGINT)
    except BaseException:  # any exception, as the parent says "raised"
        if not _orphaned.is_set():
            _write_traceback(error_file, traceback.format_exc())
        sys.exit(1)


def _watch() -> None:
    """Note [a rank dies with its parent]."""

    def orphaned() -> None:
        _orphaned.set()
        if not _returned.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    context.when_parent_exits(orphaned)


def _write_traceback(path: str, text: str) -> None:
    """Note [a rank's traceback]."""
    part = f"{path}.part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
        f.write(text)
    os.rename(part, path)


def _remove_error_files(paths: Iterable[str]) -> None:
    for path in paths:
        for name in (path, f"{path}.part"):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass


class ProcessContext:
    """The processes of one ``start_processes`` call, by rank, and their
    joining. ``error_files`` names each rank's traceback file. Safe to join
    from several threads: one waits at a time, and all see the failure."""

    def __init__(self, processes: Sequence[BaseProcess], error_files: Sequence[str]) -> None:
        self.processes = list(processes)
        self.error_files = list(error_files)
        self.sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        self._error: ProcessException | None = None
        self._joining = threading.Lock()

    def pids(self) -> list[int]:
        return [int(p.pid or 0) for p in self.processes]

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: without end) for a rank to
        end; True once all have ended well, False while some run (or while
        another thread joins for longer than ``timeout``).

        When a rank has failed, the others are given ``grace_period``
        seconds to end by themselves (None: none), then SIGTERM, then, after
        ``grace_period`` more seconds (None: 30), SIGKILL (at once if this
        is interrupted); all are reaped, and the first failed rank's error
        is raised (again by later calls).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._joining.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            return False
        try:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            return self._join(left, grace_period)
        finally:
            self._joining.release()

    def _join(self, timeout: float | None, grace_period: float | None) -> bool:
        if self._error is not None:
            raise self._error
        if not self.sentinels:
            return True
        ready: list[Any] = multiprocessing.connection.wait(list(self.sentinels), timeout)  # the sentinels: ints
        failed = None
        for rank in sorted(self.sentinels.pop(s) for s in ready):
            self.processes[rank].join()
            if self.processes[rank].exitcode != 0 and failed is None:
                failed = rank
        if failed is None:
            return not self.sentinels
        self.sentinels.clear()
        self._error = self._failure(failed)  # the failed rank has ended: its file is whole
        try:
            self._end_all(grace_period)
        finally:
            _remove_error_files(self.error_files)
        raise self._error

    def _end_all(self, grace_period: float | None) -> None:
        """Give the ranks grace_period seconds to end, SIGTERM them, SIGKILL
        them after grace_period (None: 30) more, and reap them all; SIGKILL
        at once when this is interrupted."""
        try:
            if grace_period is not None:
                self._join_all(grace_period)
            for p in self.processes:
                if p.is_alive():
                    p.terminate()
            self._join_all(30 if grace_period is None else grace_period)
        finally:
            for p in self.processes:
                if p.is_alive():
                    p.kill()
                p.join()
            self.sentinels.clear()

    def _join_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))

    def _failure(self, rank: int) -> ProcessException:
        pid, code = int(self.processes[rank].pid or 0), self.processes[rank].exitcode or 0
        try:
            with open(self.error_files[rank], encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            if code >= 0:
                return ProcessExitedException(f"process {rank} terminated with exit code {code}", rank, pid, code)
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"<Unknown signal {-code}>"
            return ProcessExitedException(f"process {rank} terminated with signal {name}", rank, pid, code, name)
        return ProcessRaisedException(f"\n\n-- Process {rank} terminated with the following error:\n{text}", rank, pid)


# Note [an interrupted spawn]: spawn(join=True) interrupted while it waits
# (KeyboardInterrupt, or any exception but a rank's failure) ends its ranks
# before it raises, where torch's leaves them running and the program waits
# for them as it exits. Ranks that got the same SIGINT from a terminal may be
# saving their state: they are given _INTERRUPTED_GRACE seconds to end by
# themselves, then SIGTERM, then SIGKILL after as long again; a second
# interrupt kills them at once. A rank whose own parent has died ends its
# ranks at once: else it would wait for them as it exits, and they, watching
# it, for it, for ever (Note [a rank dies with its parent]).
_INTERRUPTED_GRACE = 30.0


class SpawnContext(ProcessContext):
    """ProcessContext by the name torch gave it before 1.4; warns when made."""

    def __init__(self, processes: Sequence[BaseProcess], error_files: Sequence[str]) -> None:
        warnings.warn("SpawnContext is renamed to ProcessContext", FutureWarning, stacklevel=2)
        super().__init__(processes, error_files)


if TYPE_CHECKING:

    @overload
    def start_processes(
        fn: Callable[..., object],
        args: Iterable[Any] = ...,
        nprocs: int = ...,
        join: Literal[True] = ...,
        daemon: bool = ...,
        start_method: str | None = ...,
    ) -> None: ...
    @overload
    def start_processes(
        fn: Callable[..., object],
        args: Iterable[Any] = ...,
        nprocs: int = ...,
        *,
        join: Literal[False],
        daemon: bool = ...,
        start_method: str | None = ...,
    ) -> ProcessContext: ...
    @overload
    def start_processes(
        fn: Callable[..., object],
        args: Iterable[Any] = ...,
        nprocs: int = ...,
        join: bool = ...,
        daemon: bool = ...,
        start_method: str | None = ...,
    ) -> ProcessContext | None: ...


def start_processes(
    fn: Callable[..., object],
    args: Iterable[Any] = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str | None = "spawn",
) -> ProcessContext | None:
    """Run ``fn(rank, *args)`` for each rank in ``range(nprocs)``, each in a
    process of zctipc's context for ``start_method`` ("spawn" or
    "forkserver"; "fork" is refused). With ``join``, wait for all (see
    ProcessContext.join) and return None; else return the ProcessContext.
    ``fn`` and ``args`` are pickled: ``fn`` must be a module's function."""
    nprocs = _count(nprocs)
    ctx = context.get_context(start_method)  # refuses fork
    call = _Call(fn, tuple(args), dict(os.environ) if ctx.get_start_method() == "forkserver" else None)
    stem = os.path.join(tempfile.gettempdir(), f"zctipc-spawn-{uuid.uuid4().hex[:16]}-")
    error_files = [f"{stem}{rank}" for rank in range(nprocs)]
    processes: list[BaseProcess] = []
    ranks = None
    try:
        for rank in range(nprocs):
            p = ctx.Process(target=_run_rank, args=(call, rank, error_files[rank]), daemon=daemon)
            processes.append(p)
            p.start()
        ranks = ProcessContext(processes, error_files)
        if not join:
            return ranks
        while not ranks.join():
            pass
    except ProcessException:  # the ranks are ended and reaped
        raise
    except BaseException:
        if ranks is None:  # a rank that could not start: none runs
            for started in processes:
                if started.pid is not None:
                    started.kill()
                    started.join()
            _remove_error_files(error_files)
        else:  # Note [an interrupted spawn]
            try:
                ranks._end_all(None if _orphaned.is_set() else _INTERRUPTED_GRACE)
            finally:
                _remove_error_files(error_files)
        raise
    return None


def _count(nprocs: int) -> int:
    try:
        n = operator.index(nprocs)
    except TypeError:
        raise TypeError(f"nprocs must be an int, not {type(nprocs).__name__}") from None
    if n < 0:
        raise InvalidArgument(f"nprocs must be 0 or more, not {n}")
    return n


if TYPE_CHECKING:
    spawn = start_processes
else:  # a function of its own, for its name and docstring

    def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        """start_processes, by torch's name for it. ``start_method`` is
        honoured, where torch's spawn warns and uses "spawn"."""
        return start_processes(fn, args, nprocs, join, daemon, start_method)
