"""Events: multiprocessing.Event's API over a futex in shared memory."""

from __future__ import annotations

import weakref

from ._core import native, wait

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Event"]


class Event:
    """multiprocessing.Event's API over a futex in shared memory: ``set``,
    ``clear``, ``is_set``, ``wait(timeout=None)``. Passed to child
    processes (as Process arguments, through queues), it names the same
    event. Threads may share it."""

    def __init__(self, *, ctx: object = None) -> None:
        ffi, lib = native.ffi(), native.lib()
        handle = ffi.new("zct_handle *")
        name = ffi.new("char[]", 256)
        native.check(lib.zct_event_create(ffi.NULL, handle, name, 256))
        self._setup(handle[0], ffi.string(name).decode())

    def _setup(self, handle: int, name: str) -> None:
        self._handle = handle
        self._name = name
        self._finalizer = weakref.finalize(self, native.finalize, "zct_event_close", handle, "closing an event")

    def __reduce__(self) -> tuple[Callable[[str], Event], tuple[str]]:
        return _attach_event, (self._name,)

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} at {id(self):#x} {self._name!r} {'set' if self.is_set() else 'unset'}>"

    def is_set(self) -> bool:
        out = native.ffi().new("int32_t *")
        native.check(native.lib().zct_event_is_set(self._handle, out))
        return bool(out[0])

    def set(self) -> None:
        native.check(native.lib().zct_event_set(self._handle))

    def clear(self) -> None:
        native.check(native.lib().zct_event_clear(self._handle))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the event is set or ``timeout`` seconds pass; return
        whether it is set."""
        if isinstance(timeout, (int, float)) and timeout < 0:
            timeout = 0  # as threading.Event.wait
        out = native.ffi().new("int32_t *")
        lib = native.lib()

        def attempt(ms: int) -> int:
            status = lib.zct_event_wait(self._handle, ms, out)
            return native.E_EMPTY if status == native.OK and not out[0] else status  # not set yet

        status = wait.retry(attempt, native.E_EMPTY, True, timeout)
        if status == native.E_EMPTY:
            return self.is_set()
        native.check(status)
        return True


def _attach_event(name: str) -> Event:
    ffi, lib = native.ffi(), native.lib()
    handle = ffi.new("zct_handle *")
    native.check(lib.zct_event_attach(name.encode(), handle))
    e = Event.__new__(Event)
    e._setup(handle[0], name)
    return e
