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
traceback file is removed once read. torch is not imported.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
import warnings

from . import context
from .errors import ProcessException, ProcessExitedException, ProcessRaisedException

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
# parent removes every rank's file once the ranks are reaped.


# Note [a rank dies with its parent]: torch's ranks ask Linux for SIGINT
# when their parent dies (PR_SET_PDEATHSIG); under forkserver their parent
# is the fork server, which lives as long as they do (Note [a worker of a
# fork server] in zctipc.context), so they outlived a killed program. A
# zctipc rank watches the process that started it (context.when_parent_exits)
# and sends itself SIGINT when that process exits: fn gets
# KeyboardInterrupt, and the rank ends quietly (exit code 0), under either
# method.
_orphaned = threading.Event()


def _run_rank(fn: Callable[..., object], rank: int, args: tuple[Any, ...], error_file: str) -> None:
    """A rank's target: fn(rank, *args), its traceback to error_file if it raises."""
    _watch()
    try:
        fn(rank, *args)
    except KeyboardInterrupt:
        if _orphaned.is_set():
            return
        _write_traceback(error_file)
        sys.exit(128 + signal.SIGINT)
    except Exception:
        _write_traceback(error_file)
        sys.exit(1)


def _watch() -> None:
    """Note [a rank dies with its parent]."""

    def orphaned() -> None:
        _orphaned.set()
        os.kill(os.getpid(), signal.SIGINT)

    context.when_parent_exits(orphaned)


def _write_traceback(path: str) -> None:
    """Note [a rank's traceback]."""
    part = f"{path}.part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
        f.write(traceback.format_exc())
    os.rename(part, path)


class ProcessContext:
    """The processes of one ``start_processes`` call, by rank, and their
    joining. ``error_files`` names each rank's traceback file."""

    def __init__(self, processes: Sequence[BaseProcess], error_files: Sequence[str]) -> None:
        self.processes = list(processes)
        self.error_files = list(error_files)
        self.sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        self._error: ProcessException | None = None

    def pids(self) -> list[int]:
        return [int(p.pid or 0) for p in self.processes]

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: without end) for a rank to
        end; True once all have ended well, False while some run.

        When a rank has failed, the others are given ``grace_period``
        seconds to end by themselves (None: none), then SIGTERM, then, after
        ``grace_period`` more seconds (None: 30), SIGKILL; all are reaped,
        and the first failed rank's error is raised (again by later calls).
        """
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
        self._end_all(grace_period)
        self._error = self._failure(failed)
        self._remove_error_files()
        raise self._error

    def _end_all(self, grace_period: float | None) -> None:
        if grace_period is not None:
            self._join_all(grace_period)
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        self._join_all(30 if grace_period is None else grace_period)
        for p in self.processes:
            if p.is_alive():
                p.kill()
            p.join()

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

    def _remove_error_files(self) -> None:
        for path in self.error_files:
            for name in (path, f"{path}.part"):
                try:
                    os.unlink(name)
                except FileNotFoundError:
                    pass


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
    ctx = context.get_context(start_method)  # refuses fork
    args = tuple(args)
    stem = os.path.join(tempfile.gettempdir(), f"zctipc-spawn-{uuid.uuid4().hex[:16]}-")
    error_files = [f"{stem}{rank}" for rank in range(nprocs)]
    processes = []
    try:
        for rank in range(nprocs):
            p = ctx.Process(target=_run_rank, args=(fn, rank, args, error_files[rank]), daemon=daemon)
            p.start()
            processes.append(p)
    except BaseException:  # a rank that could not start: none runs
        for p in processes:
            p.kill()
            p.join()
        raise
    ranks = ProcessContext(processes, error_files)
    if not join:
        return ranks
    while not ranks.join():
        pass
    return None


if TYPE_CHECKING:
    spawn = start_processes
else:  # a function of its own, for its name and docstring

    def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        """start_processes, by torch's name for it. ``start_method`` is
        honoured, where torch's spawn warns and uses "spawn"."""
        return start_processes(fn, args, nprocs, join, daemon, start_method)
