"""Streams: one writer publishes fixed-size frames into a shared ring, and
every reader sees every frame, in place.

::

    s = zctipc.Stream.create("mic", shape=8192, dtype="float32", frames=32, readers=2)
    w = s.writer()
    frame = w.look()          # a writable view of the next frame
    frame[:] = samples        # fill it in place
    w.increment()             # publish it

    # in another process
    r = zctipc.Stream.attach("mic").reader()
    for frame in r:           # read-only views, released as the loop goes on
        spectrum = np.fft.rfft(frame)

Under ``policy="block"`` the writer waits for the slowest live reader; under
``"overwrite"`` it never waits, and a reader that falls a ring behind skips
to the oldest whole frame, counting what it lost in ``dropped``. A reader
whose process died (or, with ``reader_timeout``, that held the writer back
for that long without taking a frame) stops holding the writer back;
waiting for frames counts as alive. Frames are published only on
``increment()``: a writer killed mid-frame publishes nothing.
"""

from __future__ import annotations

import threading
import time
import weakref

from ._core import args, dtypes, layout, lazy, memory, native, wait
from .errors import HandleClosed, InvalidArgument, UnsupportedDtype
from .events import Event  # offered here too, where it was first

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any, Literal, SupportsIndex, overload

    import numpy as np
    import torch
    from numpy.typing import ArrayLike, NDArray
    from typing_extensions import Self

    from ._core.dtypes import DTypeSpec
    from ._core.layout import ShapeLike
else:
    np = lazy.numpy(__name__)

_wait = wait  # the module, in methods whose parameter is named wait

__all__ = ["Event", "Stream", "StreamWriter", "StreamReader"]

POLICIES = ("block", "overwrite")


class Stream:
    """A shared ring of frames of one shape and dtype, with one writer and
    up to ``readers`` readers. Made with :meth:`create`, opened elsewhere
    with :meth:`attach` (or by passing the Stream to a child process).

    The segment lives while any process holds it; frame views keep it
    mapped in their process after the Stream is closed or dropped.
    """

    __slots__ = (
        "_handle",
        "_info",
        "_memory",
        "_name",
        "_shape",
        "_code",
        "_frames_rw",
        "_frames_ro",
        "_closed",
        "__weakref__",
    )

    _handle: int
    _info: Any  # the zct_stream_info struct
    _memory: Any  # the owner (a cffi pointer), None once closed
    _name: str
    _shape: tuple[int, ...]
    _code: int
    _frames_rw: list[NDArray[Any]] | None
    _frames_ro: list[NDArray[Any]] | None
    _closed: bool

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("use zctipc.Stream.create() or zctipc.Stream.attach()")

    @classmethod
    def create(
        cls,
        name: str | None = None,
        shape: ShapeLike = (),
        dtype: DTypeSpec = "float32",
        frames: SupportsIndex = 32,
        readers: SupportsIndex = 1,
        policy: str = "block",
        reader_timeout: float | None = None,
    ) -> Self:
        """Make a stream of ``frames`` slots, each a C-contiguous array of
        ``shape`` and ``dtype``, for up to ``readers`` readers at once.

        ``name`` gets the ``zctipc_`` prefix (random when None). ``policy``
        is ``"block"`` (the writer waits for the slowest live reader) or
        ``"overwrite"`` (it never waits; slow readers lose frames and count
        them). ``reader_timeout`` (seconds, None for none) lets the writer
        evict a reader that holds it back for that long without taking a
        frame (a reader waiting for frames is alive); a reader whose process
        died is evicted in any case.
        """
        if policy not in POLICIES:
            raise InvalidArgument(f"unknown stream policy {policy!r}; the policies are {', '.join(POLICIES)}")
        frames = args.integer("frames", frames, 2, 1 << 20)
        readers = args.integer("readers", readers, 1, 64)
        timeout_ms = 0
        if reader_timeout is not None:
            reader_timeout = args.timeout(reader_timeout, "reader_timeout")
            if not 0 < reader_timeout < (1 << 32) / 1000:
                raise InvalidArgument(
                    f"reader_timeout must be positive seconds (below 49 days) or None, not {reader_timeout!r}"
                )
            timeout_ms = max(1, round(reader_timeout * 1000))
        dims = layout.shape_tuple(shape)
        code = dtypes.code_of(dtype)
        ffi, lib = native.ffi(), native.lib()
        handle = ffi.new("zct_handle *")
        info = ffi.new("zct_stream_info *")
        cname = ffi.NULL if name is None else layout.segment_name(name)
        native.check(
            lib.zct_stream_create(
                cname,
                code,
                len(dims),
                ffi.new("int64_t[]", dims) if dims else ffi.NULL,
                frames,
                readers,
                POLICIES.index(policy),
                timeout_ms,
                handle,
                info,
            )
        )
        return cls._wrap(handle[0], info)

    @classmethod
    def attach(cls, name: str) -> Self:
        """Open the stream ``name`` (with or without the prefix)."""
        ffi, lib = native.ffi(), native.lib()
        handle = ffi.new("zct_handle *")
        info = ffi.new("zct_stream_info *")
        native.check(lib.zct_stream_attach(layout.segment_name(name), handle, info))
        return cls._wrap(handle[0], info)

    @classmethod
    def _wrap(cls, handle: int, info: Any) -> Self:
        ffi = native.ffi()
        self = object.__new__(cls)
        self._handle = handle
        self._info = info
        self._name = ffi.string(info.name).decode()
        self._shape = tuple(info.shape[0 : info.ndim])
        self._code = info.dtype
        self._memory = memory.owner(info.data, "zct_stream_close", handle, "closing a stream")
        self._frames_rw = self._frames_ro = None
        self._closed = False
        return self

    # -- description ----------------------------------------------------------

    @property
    def name(self) -> str:
        """The segment's full name (with the ``zctipc_`` prefix)."""
        return self._name

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of one frame."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any] | str:
        """The NumPy dtype of a frame (``'bfloat16'`` when NumPy cannot say it)."""
        return dtypes.public_dtype(self._code)

    @property
    def frames(self) -> int:
        """The number of frames in the ring."""
        return self._info.frames

    @property
    def max_readers(self) -> int:
        """The number of reader slots."""
        return self._info.readers

    @property
    def policy(self) -> str:
        return POLICIES[self._info.policy]

    @property
    def reader_timeout(self) -> float | None:
        ms = self._info.reader_timeout_ms
        return ms / 1000 if ms else None

    @property
    def frame_nbytes(self) -> int:
        return self._info.frame_bytes

    def _stats(self) -> tuple[int, int, int, bool]:
        ffi = native.ffi()
        published, dropped = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        readers, ended = ffi.new("int32_t *"), ffi.new("int32_t *")
        native.check(native.lib().zct_stream_stats(self._live(), published, dropped, readers, ended))
        return published[0], dropped[0], readers[0], bool(ended[0])

    @property
    def published(self) -> int:
        """Frames published so far."""
        return self._stats()[0]

    @property
    def dropped(self) -> int:
        """Frames lost by all readers together."""
        return self._stats()[1]

    @property
    def readers(self) -> int:
        """How many readers hold a slot now."""
        return self._stats()[2]

    @property
    def ended(self) -> bool:
        return self._stats()[3]

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"published={self.published}"
        return (
            f"<Stream {self._name!r} frames={self.frames} shape={self._shape} dtype={dtypes.NAMES.get(self._code)} "
            f"policy={self.policy} {state}>"
        )

    # -- use ------------------------------------------------------------------

    def writer(self) -> StreamWriter:
        """Become the stream's writer (:class:`StreamBusy` while another live
        process is; the role of one that died is taken over)."""
        handle = native.ffi().new("zct_handle *")
        native.check(native.lib().zct_stream_writer(self._live(), handle))
        return StreamWriter(self, handle[0])

    def reader(self, index: SupportsIndex | None = None) -> StreamReader:
        """Join as a reader: of slot ``index``, or of the first free slot.
        The reader starts at the next frame published. Raises
        :class:`StreamBusy` when the slot, or every slot, is held."""
        if index is not None:
            index = args.integer("a reader slot", index, 0)  # the library says how many there are
        ffi = native.ffi()
        handle, slot = ffi.new("zct_handle *"), ffi.new("int32_t *")
        native.check(native.lib().zct_stream_reader(self._live(), -1 if index is None else index, handle, slot))
        return StreamReader(self, handle[0], slot[0])

    def end(self) -> None:
        """End the stream: the writer can write no more, readers read what
        was published and then get :class:`StreamEnded`; waiters wake."""
        native.check(native.lib().zct_stream_end(self._live()))

    def close(self) -> None:
        """Let go of this object's hold; views and open readers and writers
        keep the memory until they are gone too."""
        if not self._closed:
            self._closed = True
            self._frames_rw = self._frames_ro = None
            self._memory = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Callable[[str], Stream], tuple[str]]:
        self._live()
        return _attach_stream, (self._name,)

    def _live(self) -> int:
        if self._closed:
            raise HandleClosed(f"stream {self._name!r} is closed")
        return self._handle

    # -- frame views ----------------------------------------------------------

    def _views(self, writable: bool) -> list[NDArray[Any]]:
        """NumPy views of every slot, made once; they hold the mapping."""
        cache = self._frames_rw if writable else self._frames_ro
        if cache is None:
            info = self._info
            size = info.ring_offset + info.stride * info.frames
            buf = native.ffi().buffer(self._memory, size)
            base = np.frombuffer(buf if writable else memoryview(buf).toreadonly(), dtype=np.uint8)
            dt = dtypes.storage_dtype(self._code)
            cache = []
            for i in range(info.frames):
                at = info.ring_offset + i * info.stride
                cache.append(base[at : at + info.frame_bytes].view(dt).reshape(self._shape))
            if writable:
                self._frames_rw = cache
            else:
                self._frames_ro = cache
        return cache


def _attach_stream(name: str) -> Stream:
    return Stream.attach(name)


class _Out(threading.local):
    """Per-thread out-parameters of an endpoint's native calls."""

    def __init__(self) -> None:
        ffi = native.ffi()
        self.slot = ffi.new("int32_t *")
        self.whole = ffi.new("int32_t *")


class _Endpoint:
    """What a writer and a reader share: their stream, native handle, and
    the calls of their hot path, bound once.

    Threads may share an endpoint: the library serializes its calls, and
    read() and write() take a frame whole (look, copy, increment) under the
    endpoint's lock, so each frame goes to one of them. look() and
    increment() move the one position the endpoint has: a frame one thread
    looked at is released by the next increment, whichever thread makes it.
    A thread that wants every frame for itself joins with a reader of its
    own.
    """

    _kind: str | None = None  # "writer" or "reader": names the library's calls
    _writable = False
    _not_ready: int | None = None  # the status of a look that found nothing
    # The library's calls, bound in __init__ (Note [calls bound for a hot
    # path] in zctipc._core.native): look and increment, and a reader's next.
    _look: Callable[..., int]
    _increment: Callable[..., int]
    _read_next: Callable[..., int]

    def __init__(self, stream: Stream, handle: int) -> None:
        self._stream = stream
        self._handle = handle
        self._closed = False
        # Views of every slot, which keep the memory mapped in this process
        # as long as this endpoint (or a view) lives.
        self._frames = stream._views(self._writable)
        self._tensors: list[torch.Tensor] | None = None
        self._out = _Out()
        self._lock = threading.Lock()  # read() and write(): one frame whole
        self._polls = False  # set_wait("poll"): waits stay in the library
        self._armed = wait.Armed()  # per thread: out-parameters of the arm calls
        verb = "write" if self._writable else "read"
        # Note [calls bound for a hot path] in zctipc._core.native.
        calls = {"_look": f"zct_stream_{verb}_look", "_increment": f"zct_stream_{verb}_increment"}
        if not self._writable:
            calls["_read_next"] = "zct_stream_read_next"
        native.bind(self, **calls)
        self._finalizer = weakref.finalize(
            self, native.finalize, f"zct_stream_{self._kind}_close", handle, f"closing a stream {self._kind}"
        )

    def set_wait(self, wait: str = "sleep", spin: float | None = None) -> None:
        """How this endpoint's blocking calls wait (for frames, or for room),
        as Queue.set_wait says: "sleep" (the default) or "poll", which sees
        a frame within a microsecond and takes a core while it waits."""
        poll, spin_ns = _wait.policy(wait, spin)
        native.check(getattr(native.lib(), f"zct_stream_{self._kind}_set_wait")(self._live(), poll, spin_ns))
        self._polls = poll

    @property
    def stream(self) -> Stream:
        return self._stream

    def close(self) -> None:
        """Leave the stream (a reader frees its slot; a writer gives up the
        role, and a frame it looked at and did not publish is not)."""
        if not self._closed:
            self._closed = True
            self._finalizer.detach()
            native.check(getattr(native.lib(), f"zct_stream_{self._kind}_close")(self._handle))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _is_closed(self) -> bool:
        return self._closed

    def _live(self) -> int:
        if self._closed:
            raise HandleClosed(f"this stream {self._kind} of {self._stream.name!r} is closed")
        return self._handle

    def _look_frame(self, block: bool, timeout: float | None, torch: bool) -> NDArray[Any] | torch.Tensor | None:
        """The view of the next slot, or None when it is not ready within
        the timeout: one call when it is ready, wait slices otherwise."""
        if self._closed:
            self._live()
        slot = self._out.slot
        status = self._look(self._handle, 0, slot)
        if status != 0:
            if status == self._not_ready and block:
                status = self._wait(lambda ms: self._look(self._handle, ms, slot), timeout)
            if status == self._not_ready:
                return None
            native.check(status)
        return (self._tensor_views() if torch else self._frames)[slot[0]]

    def _wait(self, call: Callable[[int], int], timeout: float | None) -> int:
        """The status of call(ms), a native call that waits up to ms, once
        it did not return _not_ready or the timeout passed: outside the
        library (Note [sleeping outside Go] in zctipc._core.wait) unless
        this endpoint polls."""
        # _not_ready is None only on _Endpoint itself, which has no instances.
        again: int = self._not_ready  # type: ignore[assignment]
        if self._polls:
            return wait.retry(call, again, True, timeout)
        return wait.sleep_outside(
            call, again, True, timeout, self._arm, self._disarm, self._is_closed, self._look_every
        )

    #: Slices of a sleep outside the library after which the endpoint looks
    #: again even when not woken (0: never): a writer's look evicts readers
    #: that died or stopped, which wake nobody.
    _look_every = 0

    def _arm(self) -> tuple[Any, int]:
        out = self._armed
        native.check(getattr(native.lib(), f"zct_stream_{self._kind}_arm")(self._handle, out.word, out.seen))
        return out.word[0], out.seen[0]

    def _disarm(self, woken: bool) -> None:
        # After a close, the library took the arm back itself.
        status = getattr(native.lib(), f"zct_stream_{self._kind}_disarm")(self._handle)
        if status != native.E_CLOSED:
            native.check(status)

    def _take_lock(self, block: bool, timeout: float | None) -> float | None | Literal[False]:
        """Take the endpoint's lock as block and timeout say; the time
        left of timeout, or False when the lock was not had in time."""
        if not block:
            return timeout if self._lock.acquire(False) else False
        timeout = args.timeout(timeout)
        if timeout is None:
            self._lock.acquire()
            return None
        start = time.monotonic()
        if not self._lock.acquire(timeout=timeout):
            return False
        return max(0.0, timeout - (time.monotonic() - start))

    def _tensor_views(self) -> list[torch.Tensor]:
        """torch views of every slot, made on first use."""
        if self._tensors is None:
            code = self._stream._code
            self._tensors = [memory.tensor(a, code, readonly=not self._writable) for a in self._frames]
        return self._tensors


class StreamWriter(_Endpoint):
    """The writer of a stream: ``look()`` a frame, fill it, ``increment()``
    to publish it; or ``write(array)``."""

    _kind = "writer"
    _writable = True
    _not_ready = native.E_FULL
    _look_every = 4  # a reader timeout's eviction comes up to 0.2 s late

    if TYPE_CHECKING:

        @overload
        def look(
            self, block: bool = ..., timeout: float | None = ..., torch: Literal[False] = ...
        ) -> NDArray[Any] | None: ...
        @overload
        def look(
            self, block: bool = ..., timeout: float | None = ..., *, torch: Literal[True]
        ) -> torch.Tensor | None: ...
        @overload
        def look(
            self, block: bool = ..., timeout: float | None = ..., torch: bool = ...
        ) -> NDArray[Any] | torch.Tensor | None: ...

    def look(
        self, block: bool = True, timeout: float | None = None, torch: bool = False
    ) -> NDArray[Any] | torch.Tensor | None:
        """A writable view (NumPy, or torch with ``torch=True``) of the next
        frame, waiting for room as ``block`` and ``timeout`` say under the
        block policy; None when there is none. Raises :class:`StreamEnded`
        once the stream ended."""
        return self._look_frame(block, timeout, torch)

    def increment(self) -> None:
        """Publish the frame returned by :meth:`look`."""
        status = self._increment(self._live())
        if status != 0:
            native.check(status)

    def write(self, frame: ArrayLike | torch.Tensor, block: bool = True, timeout: float | None = None) -> bool:
        """Copy ``frame`` (a NumPy array or CPU torch tensor of the stream's
        shape and dtype) into the next frame and publish it. Returns False
        when there was no room within the timeout."""
        s = self._stream
        # frame is a tensor or an array as is_tensor says, which mypy does not
        # see through the variable: the ignores below.
        is_tensor = layout.is_torch_tensor(frame)
        if not is_tensor:
            frame = np.asarray(frame)
        if frame.shape != s._shape or _code_or_none(frame.dtype) != s._code:  # type: ignore[union-attr]
            raise ValueError(
                f"a frame of shape {tuple(frame.shape)} and dtype "  # type: ignore[union-attr]
                f"{dtypes.NAMES.get(_code_or_none(frame.dtype), str(frame.dtype))} does not fit stream "  # type: ignore[union-attr, arg-type]
                f"{s.name!r}, whose frames are {s.shape} {dtypes.NAMES[s._code]}"
            )
        left = self._take_lock(block, timeout)
        if left is False:
            return False
        try:
            view = self._look_frame(block, left, is_tensor)
            if view is None:
                return False
            if is_tensor:
                view.copy_(frame)  # type: ignore[union-attr, arg-type]
            else:
                np.copyto(view, frame)  # type: ignore[arg-type]
            self.increment()
            return True
        finally:
            self._lock.release()


def _code_or_none(dtype: DTypeSpec) -> int | None:
    try:
        return dtypes.code_of(dtype)
    except UnsupportedDtype:
        return None


class StreamReader(_Endpoint):
    """A reader of a stream: ``look()`` at the next frame in place and
    ``increment()`` past it; ``read()``; or iterate."""

    _kind = "reader"
    _not_ready = native.E_EMPTY

    def __init__(self, stream: Stream, handle: int, index: int) -> None:
        super().__init__(stream, handle)
        self._index = index
        self._pending = False  # a frame handed out by read(copy=False) or iteration

    @property
    def index(self) -> int:
        """The reader's slot."""
        return self._index

    def _counts(self) -> tuple[int, int, int]:
        ffi = native.ffi()
        position, received, dropped = ffi.new("uint64_t *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
        native.check(native.lib().zct_stream_reader_stats(self._live(), position, received, dropped))
        return position[0], received[0], dropped[0]

    @property
    def position(self) -> int:
        """The position of the next frame to read, counted from the first
        frame the stream published."""
        return self._counts()[0]

    @property
    def received(self) -> int:
        """Frames this reader took whole."""
        return self._counts()[1]

    @property
    def dropped(self) -> int:
        """Frames this reader lost (overwritten before it read them)."""
        return self._counts()[2]

    if TYPE_CHECKING:

        @overload
        def look(
            self, block: bool = ..., timeout: float | None = ..., torch: Literal[False] = ...
        ) -> NDArray[Any] | None: ...
        @overload
        def look(
            self, block: bool = ..., timeout: float | None = ..., *, torch: Literal[True]
        ) -> torch.Tensor | None: ...
        @overload
        def look(
            self, block: bool = ..., timeout: float | None = ..., torch: bool = ...
        ) -> NDArray[Any] | torch.Tensor | None: ...

    def look(
        self, block: bool = True, timeout: float | None = None, torch: bool = False
    ) -> NDArray[Any] | torch.Tensor | None:
        """A read-only view of the next frame, waiting for it as ``block``
        and ``timeout`` say; None when there is none. Raises
        :class:`StreamEnded` when the stream ended and every frame was
        read."""
        if self._pending:
            self.increment()
        return self._look_frame(block, timeout, torch)

    def increment(self) -> bool:
        """Release the frame returned by :meth:`look`. Returns False when
        the writer overwrote it while it was looked at (the overwrite policy,
        or an evicted reader): its contents may be torn, and it counts as
        dropped."""
        self._pending = False
        whole = self._out.whole
        status = self._increment(self._live(), whole)
        if status != 0:
            native.check(status)
        return whole[0] != 0

    if TYPE_CHECKING:

        @overload
        def read(
            self, copy: bool = ..., block: bool = ..., timeout: float | None = ..., torch: Literal[False] = ...
        ) -> NDArray[Any] | None: ...
        @overload
        def read(
            self, copy: bool = ..., block: bool = ..., timeout: float | None = ..., *, torch: Literal[True]
        ) -> torch.Tensor | None: ...
        @overload
        def read(
            self, copy: bool = ..., block: bool = ..., timeout: float | None = ..., torch: bool = ...
        ) -> NDArray[Any] | torch.Tensor | None: ...

    def read(
        self, copy: bool = True, block: bool = True, timeout: float | None = None, torch: bool = False
    ) -> NDArray[Any] | torch.Tensor | None:
        """The next frame, or None when there is none within the timeout.

        With ``copy`` (the default) it is a private copy, checked whole:
        a frame overwritten while it was copied is skipped. Without, it is
        the zero-copy view, released at the next read, look or close.
        """
        if not copy:
            view = self.look(block, timeout, torch)
            self._pending = view is not None
            return view
        left = self._take_lock(block, timeout)
        if left is False:
            return None
        try:
            while True:
                view = self.look(block, left, torch)
                if view is None:
                    return None
                out = view.clone() if torch else view.copy()  # type: ignore[union-attr]  # a tensor as torch says
                if self.increment():
                    return out
        finally:
            self._lock.release()

    if TYPE_CHECKING:

        @overload
        def frames(self, torch: Literal[False] = ...) -> Iterator[NDArray[Any]]: ...
        @overload
        def frames(self, torch: Literal[True]) -> Iterator[torch.Tensor]: ...
        @overload
        def frames(self, torch: bool = ...) -> Iterator[NDArray[Any]] | Iterator[torch.Tensor]: ...

    def frames(self, torch: bool = False) -> Iterator[NDArray[Any] | torch.Tensor]:
        """Iterate over the frames as zero-copy views until the stream ends;
        each is released when the next is asked for (one native call per
        frame). A reader has one position: iterate it in one thread at a
        time, since the next frame any thread asks for releases the one
        another iteration holds (a reader each, for threads that read
        alongside)."""
        out = self._out
        handle, slot, whole = self._live(), out.slot, out.whole
        views = self._tensor_views() if torch else self._frames
        empty, ended = native.E_EMPTY, native.E_ENDED
        try:
            while True:
                # Read each time, not held: Note [calls bound for a hot path].
                status = self._read_next(handle, 0, slot, whole)
                self._pending = False
                if status == empty:
                    status = self._wait(lambda ms: self._read_next(handle, ms, slot, whole), None)
                if status != 0:
                    if status == ended:
                        return
                    native.check(status)
                self._pending = True
                yield views[slot[0]]
        finally:
            if self._pending and not self._closed:
                self.increment()

    def __iter__(self) -> Iterator[NDArray[Any]]:
        return self.frames()

    def torch(self) -> Iterator[torch.Tensor]:
        """Iterate over the frames as zero-copy torch tensors (``frames(torch=True)``)."""
        return self.frames(torch=True)

    def close(self) -> None:
        self._pending = False
        super().close()
