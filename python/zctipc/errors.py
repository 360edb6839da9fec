"""Exceptions raised by zctipc.

Every exception derives from :class:`ZctipcError` and also from the builtin
that matches it, so ``except FileNotFoundError`` or ``except MemoryError``
works as it would for the same failure elsewhere in Python.
"""

__all__ = [
    "ZctipcError",
    "InvalidArgument",
    "SegmentNotFound",
    "SegmentExists",
    "PermissionDenied",
    "NotAZctipcSegment",
    "IncompatibleVersion",
    "CorruptHeader",
    "OutOfSharedMemory",
    "UnsupportedDtype",
    "HandleClosed",
    "ForkedProcessError",
    "LibraryPoisoned",
    "DaemonUnavailable",
    "CudaUnavailable",
    "CudaError",
    "CudaOutOfMemory",
    "StreamBusy",
    "CudaShareBusy",
    "StreamEnded",
    "ZctipcOSError",
    "CorruptTable",
    "PipelineError",
    "DescriptorTaken",
    "ProcessException",
    "ProcessRaisedException",
    "ProcessExitedException",
]


class ZctipcError(Exception):
    """Base class of every zctipc error."""


class InvalidArgument(ZctipcError, ValueError):
    """A bad argument: a segment name, shape, or a segment of the wrong kind."""


class SegmentNotFound(ZctipcError, FileNotFoundError):
    """No segment has that name, or it is being removed."""


class SegmentExists(ZctipcError, FileExistsError):
    """A segment of that name already exists; it was left untouched."""


class PermissionDenied(ZctipcError, PermissionError):
    """The segment belongs to another user, is not mode 0600, or is not a plain file."""


class NotAZctipcSegment(ZctipcError, ValueError):
    """The file does not start with the zctipc magic number."""


class IncompatibleVersion(ZctipcError, ValueError):
    """The segment's layout version is not one this library reads."""


class CorruptHeader(ZctipcError, ValueError):
    """The segment header fails validation (checksum, bounds, truncation)."""


class OutOfSharedMemory(ZctipcError, MemoryError):
    """The shared-memory file system (/dev/shm) cannot hold the segment.

    The message says how many bytes were asked, how many are free, and how to
    make room (``docker run --shm-size=...``).
    """


class UnsupportedDtype(ZctipcError, TypeError):
    """The element type cannot live in shared memory (object, structured,
    non-native byte order, strings, ...), or the header names an unknown one."""


class HandleClosed(ZctipcError, ValueError):
    """The object was closed."""


class ForkedProcessError(ZctipcError, RuntimeError):
    """This process was forked after the Go library was loaded.

    A Go runtime does not survive ``fork()``; start processes with
    ``zctipc.get_context()`` (forkserver or spawn) instead.
    """


class LibraryPoisoned(ZctipcError, RuntimeError):
    """The native library caught an internal error and refuses further calls."""


class DaemonUnavailable(ZctipcError, ConnectionError):
    """The cleanup daemon ``zctipcd`` could not be started or reached.

    The ``file_descriptor`` sharing strategy needs it to pass file
    descriptors; under ``file_system`` only crash cleanup waits for the next
    daemon (or ``zctipc gc``).
    """


class CudaUnavailable(ZctipcError, RuntimeError):
    """No CUDA driver or device can be used here; the message says why.
    Everything but GPU memory works without one."""


class CudaError(ZctipcError, RuntimeError):
    """The CUDA driver refused a call; the message names the call and its
    CUresult."""


class CudaOutOfMemory(CudaError, MemoryError):
    """A GPU had not the memory an allocation asked for; the message names
    the device, the bytes asked and the bytes free."""


class StreamBusy(ZctipcError, RuntimeError):
    """A stream's writer role, or the reader slot asked for (or every one),
    is held by a live process."""


class CudaShareBusy(ZctipcError, BlockingIOError):
    """The process that shares a CUDA allocation by name serves as many
    consumers as it may at once, or has no file descriptor left for another:
    try again later. ``errno`` is ``EAGAIN``; the message names the process
    and its limit."""


class StreamEnded(ZctipcError, EOFError):
    """The stream has ended: a writer can write no more, and a reader has
    read every frame that was published."""


class ZctipcOSError(ZctipcError, OSError):
    """Another operating-system error, with its ``errno``."""


class CorruptTable(ZctipcError, ValueError):
    """A shared buffer does not hold a whole, valid Arrow IPC stream."""


class PipelineError(ZctipcError, RuntimeError):
    """A task of a pipeline raised or died; the message holds its traceback,
    ``task`` names the task and ``traceback`` holds the traceback's text."""

    def __init__(self, message: str, task: str | None = None, traceback: str | None = None) -> None:
        super().__init__(message)
        self.task = task
        self.traceback = traceback


class DescriptorTaken(ZctipcError, RuntimeError):
    """A received descriptor (a pickle's, a queue record's) whose count was
    already taken: the same bytes were loaded before. Each sent tensor has
    one receiver; loading its bytes again takes nothing."""


class ProcessException(ZctipcError):
    """A process that ``zctipc.spawn`` or ``start_processes`` started failed
    (torch.multiprocessing's exception of that name): ``error_index`` is its
    rank, ``error_pid`` (also ``pid``) its process id, ``msg`` the message."""

    def __init__(self, msg: str, error_index: int, error_pid: int) -> None:
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.error_pid = error_pid

    @property
    def pid(self) -> int:
        return self.error_pid

    def __reduce__(self) -> "tuple[type[ProcessException], tuple[object, ...]]":
        return type(self), (self.msg, self.error_index, self.error_pid)


class ProcessRaisedException(ProcessException):
    """A rank's function raised; the message holds the rank's traceback."""


class ProcessExitedException(ProcessException):
    """A rank exited with a nonzero ``exit_code``, or was killed by a signal:
    then ``exit_code`` is minus its number and ``signal_name`` its name
    (``"SIGKILL"``), else ``signal_name`` is None."""

    def __init__(
        self, msg: str, error_index: int, error_pid: int, exit_code: int, signal_name: str | None = None
    ) -> None:
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self) -> "tuple[type[ProcessException], tuple[object, ...]]":
        return type(self), (self.msg, self.error_index, self.error_pid, self.exit_code, self.signal_name)
