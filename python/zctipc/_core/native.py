"""The one module that owns libzctipc.so.

It loads the library on first use (``import zctipc`` loads no Go), refuses
calls in a child forked after the library was loaded (a Go runtime does not
survive ``fork()``; such calls would hang), and turns native status codes
into exceptions. Every other module calls the library through :func:`lib`
and :func:`check`.

The library is the ``libzctipc.so`` shipped inside the package, next to the
cffi extension that binds it. For development, ``ZCTIPC_LIBRARY`` names
another build to use instead.

On load, the process starts recording the counts it holds in a ledger and
says hello to the user's cleanup daemon (``zctipcd``, shipped next to the
library; ``ZCTIPC_DAEMON`` names another), which is started when none runs.
``ZCTIPC_CLEANUP=0`` turns that off.
"""

import atexit
import errno as _errno
import gc
import importlib
import os
import queue as _queue
import signal
import sys
import threading
import warnings
import weakref

from .. import errors

# Note [types without typing]: zctipc's modules are annotated without
# importing typing where they did not before (it costs milliseconds, and
# ``import zctipc`` imports it not: Note [a lazy package]). A module binds
# ``TYPE_CHECKING = False``, which type checkers take as typing's, true, and
# imports what its annotations name under ``if TYPE_CHECKING:``. The modules
# that ``import zctipc`` loads (zctipc, zctipc.errors and this one) do without
# ``from __future__ import annotations`` too, which imports __future__: their
# annotations are valid at run time as they stand, and name what only type
# checkers import as strings.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any

ABI_VERSION = 15
LIBRARY_ENV = "ZCTIPC_LIBRARY"
DAEMON_ENV = "ZCTIPC_DAEMON"
CLEANUP_ENV = "ZCTIPC_CLEANUP"

# Whether loading the library enables crash cleanup; the command line turns
# it off so that `zctipc doctor` does not start the daemon it reports on.
auto_cleanup = True

_lock = threading.Lock()
# cffi's objects have no Python types: the FFI, the library's functions and
# the C values they take and return are Any to a type checker.
_ffi: "Any" = None
_lib: "Any" = None
_loaded_in_pid: int | None = None  # the pid that loaded the library; a forked child differs
_load_hooks: "list[Callable[[], object]]" = []


def when_loaded(hook: "Callable[[], object]") -> None:
    """Call hook() when this process loads the library (before its first
    call returns)."""
    _load_hooks.append(hook)


_exit_hooks: "list[Callable[[], object]]" = []


def before_letting_go(hook: "Callable[[], object]") -> None:
    """Call hook() at exit (or SIGTERM) before this process lets go of what
    it holds, while its counts still say who else holds what it sent (the
    CUDA codec's last look at the tensors it sent)."""
    _exit_hooks.append(hook)


# Note [calls bound for a hot path]: a put, a get or a stream's look that
# reads native.lib() and an attribute of it on every call pays more for
# that than for some of the calls. So such a caller binds the functions it
# needs as its own attributes (bind), and the at-fork hook below rebinds
# every one of them, in a forked child, to a call that goes through lib()
# again: one bound earlier would call straight into the Go runtime that
# did not survive the fork, where lib() raises ForkedProcessError.
_bound: "weakref.WeakKeyDictionary[Any, dict[str, str]]" = weakref.WeakKeyDictionary()


def bind(owner: "Any", **calls: str) -> None:
    """Set owner's attributes to the library's functions (attribute name:
    function name), Note [calls bound for a hot path]: each becomes a call
    that raises ForkedProcessError in a forked child."""
    library = lib()
    # Remembered before any is set: a fork between the two (another
    # thread's, at a switch) then finds the owner, and rebinds in the child
    # what was set here; set first, the child kept a direct call.
    _bound.setdefault(owner, {}).update(calls)
    for attr, name in calls.items():
        setattr(owner, attr, getattr(library, name))
    if _lib is not library:  # this thread forked while binding: it is the child
        for attr, name in calls.items():
            setattr(owner, attr, _through_lib(name))


def _through_lib(name: str) -> "Callable[..., Any]":
    """The library's function name, looked up through lib() on every call."""

    def call(*args: "Any") -> "Any":
        return getattr(lib(), name)(*args)

    return call


def _after_fork_in_child() -> None:
    global _lib
    # The child's Go runtime is gone: drop the library so that every call
    # goes through _load, which raises ForkedProcessError at once.
    _lib = None
    for owner, calls in list(_bound.items()):
        for attr, name in calls.items():
            setattr(owner, attr, _through_lib(name))


os.register_at_fork(after_in_child=_after_fork_in_child)


def lib() -> "Any":
    """Return the bound library, loading it on first use."""
    library = _lib
    if library is None:
        library = _load()
    return library


def ffi() -> "Any":
    """Return the cffi ``FFI`` object of the bindings."""
    lib()
    return _ffi


def loaded() -> bool:
    """Whether this process has loaded the library and may call it."""
    return _lib is not None


def forked() -> bool:
    """Whether this process was forked from one that had loaded the library."""
    return _loaded_in_pid is not None and _loaded_in_pid != os.getpid()


def _load() -> "Any":
    global _ffi, _lib, _loaded_in_pid
    # Checked before taking the lock, which another thread may have held at
    # the moment of the fork.
    if forked():
        raise errors.ForkedProcessError(
            f"this process (pid {os.getpid()}) was forked from pid {_loaded_in_pid} after it loaded "
            "libzctipc, and a Go runtime does not survive fork(); start processes with "
            "zctipc.get_context() (forkserver or spawn) instead"
        )
    with _lock:
        if _lib is not None:
            return _lib
        _refuse_in_fork_server()
        override = os.environ.get(LIBRARY_ENV)
        if override:
            import ctypes

            # Loaded globally first, it satisfies the extension's dependency on
            # the soname libzctipc.so, so the packaged copy is not loaded.
            ctypes.CDLL(os.path.abspath(override), mode=ctypes.RTLD_GLOBAL)
        try:
            # The cffi extension beside the package's modules, imported by
            # name: it is a compiled module, not a part of zctipc's layers.
            _zctipc_cffi = importlib.import_module("zctipc._zctipc_cffi")
        except ImportError as exc:
            raise ImportError(
                f"zctipc's native library is not built or not found ({exc}); build it with `make install`, "
                f"or point {LIBRARY_ENV} at a libzctipc.so"
            ) from exc
        library: "Any" = _FastLib(_zctipc_cffi.ffi, _zctipc_cffi.lib)
        got = library.zct_abi_version()
        if got != ABI_VERSION:
            raise ImportError(f"libzctipc has C ABI version {got}, this package needs {ABI_VERSION}; reinstall zctipc")
        _EXCEPTIONS.update({getattr(library, name): cls for name, cls in _EXCEPTION_NAMES.items()})
        _ffi, _lib, _loaded_in_pid = _zctipc_cffi.ffi, library, os.getpid()
        _register_exit()
        from . import log  # here, not at import: Note [a log that costs nothing unasked]

        log.debug("loaded %s (C ABI %d) in pid %d", override or "the package's libzctipc.so", got, os.getpid())
        if auto_cleanup and os.environ.get(CLEANUP_ENV) != "0":
            _enable_cleanup(library)
        else:
            log.debug(
                "crash cleanup off (%s): no ledger, no cleanup daemon",
                "by the command line" if not auto_cleanup else f"{CLEANUP_ENV}=0",
            )
        for hook in _load_hooks:
            hook()
        return library


def library_path() -> str:
    """The file of the libzctipc.so this process loaded (others that load
    the same file, torch's pluggable allocator among them, share it)."""
    lib()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rstrip("\n").partition("/")[2]
            if path.endswith("/libzctipc.so"):
                return "/" + path
    raise ImportError("libzctipc.so is loaded but not found in /proc/self/maps")


def package_version() -> str:
    """The installed package's version (set from go/internal/version at build time),
    or "0+unknown" in a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zctipc")
    except PackageNotFoundError:
        return "0+unknown"


def daemon_path() -> str:
    """The zctipcd program that a process starts when no daemon runs."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.environ.get(DAEMON_ENV) or os.path.join(package, "zctipcd")


def _enable_cleanup(library: "Any") -> None:
    from . import log

    daemon = daemon_path()
    status = library.zct_cleanup_enable(daemon.encode())
    if status != 0:
        # Not fatal under file_system: the ledger waits for the next daemon.
        # Under file_descriptor, making a segment raises DaemonUnavailable.
        exc = error(status)
        log.debug("crash cleanup: no cleanup daemon: %s", exc)
        warnings.warn(f"zctipc crash cleanup is not running: {exc}", RuntimeWarning, stacklevel=4)
    elif log.enabled():
        import json

        state = json.loads(read_text(library.zct_daemon_status))
        log.debug(
            "crash cleanup on: this process keeps a ledger, which the cleanup daemon (pid %s, %s) watches",
            (state.get("status") or {}).get("pid", "unknown"),
            state.get("dir"),
        )


def _refuse_in_fork_server() -> None:
    """Never load the Go runtime inside a multiprocessing fork server, whose
    children are forked: that happens when a module the fork server preloads
    (set_forkserver_preload, or __main__) calls zctipc at import time. The
    fork server's children run below the same frames, under _serve_one, and
    may load it."""
    in_server = False
    frame: "FrameType | None" = sys._getframe()
    while frame is not None:
        if frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            if frame.f_code.co_name == "_serve_one":
                return
            in_server = in_server or frame.f_code.co_name == "main"
        frame = frame.f_back
    if in_server:
        raise errors.ForkedProcessError(
            "zctipc was called while the multiprocessing fork server imported its preloaded modules; "
            "its children would be forked with a Go runtime that cannot survive fork(). Call zctipc "
            "from functions, or under `if __name__ == '__main__':`, not at import time"
        )


class _FastLib:
    """The library's functions and constants as plain attributes: looking a
    name up on the cffi module costs more than many of the calls do."""

    def __init__(self, ffi: "Any", lib: "Any") -> None:
        for name in dir(lib):
            setattr(self, name, getattr(lib, name))
        self.NULL_VIEWS = ffi.cast("zct_view *", 0)


class _ExitHook:
    """Re-registers release_all with multiprocessing after a child process
    starts: Process._bootstrap clears the finalizers that unpickling its
    arguments (which may load the library) registered."""


_exit_hook = _ExitHook()


def _register_exit() -> None:
    # Let go after multiprocessing's exit function has stopped its pools
    # and joined its children (they may still use zctipc queues): from its
    # last finalizers, which run at exit in the main process and in every
    # child, forkserver's too (they leave through os._exit). It is
    # registered with atexit again so that it runs before the handlers
    # registered since multiprocessing was imported; a second run does
    # nothing.
    from multiprocessing import util

    atexit.register(util._exit_function)  # type: ignore[attr-defined]  # private, not in typeshed

    def finalize(_: object = None) -> None:
        util.Finalize(None, _at_exit, exitpriority=-100)

    finalize()
    util.register_after_fork(_exit_hook, finalize)
    # SIGTERM (Pool.terminate, a scheduler's stop) kills without running any
    # of that: let go first, then die of it as before. Only where nobody
    # handles SIGTERM yet, and only from the main thread, which Python
    # requires. SIGKILL is the cleanup daemon's to repair.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _release_and_die)


def _at_exit() -> None:
    """Let go of everything, then remove the ledger: nothing is left to
    sweep. What fails is said on stderr: the process is leaving, and one
    broken segment (shrunk by another process, say) must not stop it."""
    while _exit_hooks:  # each once: a SIGTERM during a later exit handler runs this again, the counts gone
        hook = _exit_hooks.pop(0)
        try:
            hook()
        except Exception as exc:
            sys.stderr.write(f"zctipc: at exit: {exc}\n")
    for step in (release_all, _disable_cleanup):
        try:
            step()
        except errors.ZctipcError as exc:
            sys.stderr.write(f"zctipc: at exit: {exc}\n")


def _disable_cleanup() -> None:
    if _lib is not None:
        check(_lib.zct_cleanup_disable())


def _release_and_die(signum: int, frame: "FrameType | None") -> None:
    try:
        _at_exit()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def release_all() -> int:
    """Drop this process's count on every segment it holds (mappings stay)."""
    if _lib is None:
        return 0
    count = _ffi.new("int64_t *")
    check(_lib.zct_release_all(count))
    return count[0]


# Note [closing after a collection]: the garbage collector calls the
# weakref callbacks of a cycle's objects (weakref.finalize, which closes a
# zctipc handle) before their __del__ methods, so a __del__ that still uses a
# zctipc object of its cycle found its handle closed: a DataLoader iterator
# collected after an error, whose __del__ tells its workers to stop through a
# zctipc Event and queues, printed HandleClosed and killed them instead. So
# the handles that finalizers close during a collection are closed when it
# ends, after every __del__ of it has run. Only those of the thread that
# collects: the collector runs the cycle's finalizers, and a __del__ of it
# that waits (on a queue, a join) lets other threads run, whose own
# finalizers close as ever; deferred too, the buffers those threads freed
# stayed taken until the collection ended, and a thread that the __del__
# waited for could wait in turn for a pool slot that never came back.
_collector: int | None = None  # the thread that is collecting, while one is
_deferred: list[tuple[str, int, str]] = []


def _collection(phase: str, info: object) -> None:
    global _collector
    _collector = threading.get_ident() if phase == "start" else None
    while _collector is None and _deferred:
        finalize(*_deferred.pop())


gc.callbacks.append(_collection)


def finalize(function: str, handle: int, what: str) -> None:
    """Call the library's ``function(handle)`` (a name: "zct_queue_close")
    from a finalizer: it never raises, and it is a no-op in a forked child or
    where the library was never loaded; during a garbage collection that
    this thread runs, when it ends (Note [closing after a collection]). A
    failure is reported on stderr as what failed."""
    library = _lib
    if library is None:
        return
    if _collector == threading.get_ident():
        _deferred.append((function, handle, what))
        return
    status = getattr(library, function)(handle)
    if status != 0:
        report_finalizer_error(what, status)


def report_finalizer_error(what: str, status: int) -> None:
    """Say on stderr that a finalizer failed: it cannot raise. A handle that
    release_all already gave up (at exit, or cleanup_all_segments) is not a
    failure."""
    if status != E_CLOSED:
        sys.stderr.write(f"zctipc: {what} failed: {error(status)}\n")


# The most dimensions a descriptor holds: ZCT_MAX_NDIM of zctipc.h, here
# so that deciding how to send an array loads no library (tests check it).
MAX_NDIM = 32

# Status codes of zctipc.h that callers branch on, here so that the hot
# paths compare plain ints (tests check each against the library's enum).
OK = 0
E_INVALID = -1
E_NOT_FOUND = -2
E_NO_SPACE = -8
E_CLOSED = -10
E_RANGE = -11
E_FULL = -12
E_EMPTY = -13
E_INTERRUPTED = -14
E_NO_DAEMON = -15
E_BUSY = -16
E_ENDED = -17
E_NO_CUDA = -18
E_CUDA = -19

# The exception each status of zctipc.h becomes, by the status's name in the
# library's enum.
_EXCEPTION_NAMES = {
    "ZCT_E_FULL": _queue.Full,
    "ZCT_E_EMPTY": _queue.Empty,
    "ZCT_E_INVALID": errors.InvalidArgument,
    "ZCT_E_NOT_FOUND": errors.SegmentNotFound,
    "ZCT_E_EXISTS": errors.SegmentExists,
    "ZCT_E_PERMISSION": errors.PermissionDenied,
    "ZCT_E_NOT_ZCTIPC": errors.NotAZctipcSegment,
    "ZCT_E_VERSION": errors.IncompatibleVersion,
    "ZCT_E_CORRUPT": errors.CorruptHeader,
    "ZCT_E_NO_SPACE": errors.OutOfSharedMemory,
    "ZCT_E_DTYPE": errors.UnsupportedDtype,
    "ZCT_E_CLOSED": errors.HandleClosed,
    "ZCT_E_RANGE": errors.InvalidArgument,
    "ZCT_E_NO_DAEMON": errors.DaemonUnavailable,
    "ZCT_E_BUSY": errors.StreamBusy,
    "ZCT_E_ENDED": errors.StreamEnded,
    "ZCT_E_NO_CUDA": errors.CudaUnavailable,
    "ZCT_E_CUDA": errors.CudaError,
    "ZCT_E_CUDA_OOM": errors.CudaOutOfMemory,
    "ZCT_E_TAKEN": errors.DescriptorTaken,
    "ZCT_E_OS": errors.ZctipcOSError,
    "ZCT_E_INTERNAL": errors.LibraryPoisoned,
    "ZCT_E_POISONED": errors.LibraryPoisoned,
}
_EXCEPTIONS: "dict[int, type[Exception]]" = {}  # status -> exception, from _EXCEPTION_NAMES once the library is loaded

# Statuses whose errno (zct_last_errno) names a narrower exception: a CUDA
# share server at its limit is ZCT_E_BUSY with EAGAIN, a stream's role or
# slot held is ZCT_E_BUSY with EBUSY.
_BY_ERRNO: "dict[tuple[int, int], type[Exception]]" = {(E_BUSY, _errno.EAGAIN): errors.CudaShareBusy}

# The errno an OSError subclass carries when the native side gave none.
_DEFAULT_ERRNO: "dict[type[Exception], int]" = {
    errors.SegmentNotFound: _errno.ENOENT,
    errors.SegmentExists: _errno.EEXIST,
    errors.PermissionDenied: _errno.EACCES,
}


def error(status: int) -> Exception:
    """Return the exception for a failed call's status, with the message the
    library kept for this thread."""
    message = _ffi.string(_lib.zct_last_error()).decode("utf-8", "replace")
    errno = _lib.zct_last_errno()
    cls = _BY_ERRNO.get((status, errno)) or _EXCEPTIONS.get(status, errors.ZctipcError)
    if status == E_INTERRUPTED:
        return InterruptedError(message)
    if issubclass(cls, OSError):
        code = errno or _DEFAULT_ERRNO.get(cls, 0)
        return cls(code, message)
    return cls(message)


def read_text(function: "Callable[..., int]", *args: object) -> str:
    """Call a function of the library that writes text into a buffer (as
    zct_segment_list does), growing the buffer until the text fits, and
    return the text."""
    size = _ffi.new("uint64_t *")
    capacity = 4096
    while True:
        buf = _ffi.new("char[]", capacity)
        status = function(*args, buf, capacity, size)
        if status == E_RANGE:
            capacity = size[0] + 1
            continue
        check(status)
        return _ffi.string(buf).decode()


def check(status: int) -> None:
    """Raise the exception for ``status`` unless it is 0."""
    if status != 0:
        raise error(status)
