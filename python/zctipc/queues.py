"""Drop-in replacements for multiprocessing's Queue, SimpleQueue and
JoinableQueue, over a ring in shared memory.

Objects are pickled (protocol 5) with NumPy arrays, CPU torch tensors and
SharedTensors out of band (see zctipc._wire.pickler): what is already zctipc
memory crosses as a descriptor; other buffers are copied once into this
process's pool. The receiver gets views of shared memory.

Differences from multiprocessing.Queue, all in the caller's favour: there is
no feeder thread, so put() has finished when it returns (join_thread and
cancel_join_thread have nothing to wait for), and an object that cannot be
pickled raises in the caller of put() (multiprocessing's feeder thread
prints the error and drops the object).

The standard library waits on a queue through the pipe ends that
multiprocessing's queues have (``_reader``, ``_writer``), which
zctipc._pipes makes over the ring (Note [waiting on a queue among other
things] there).
"""

from __future__ import annotations

import errno
import io
import pickle
import queue as _queue
import sys
import threading
import time
import weakref
from multiprocessing import context as _mpcontext
from multiprocessing import queues as _mpqueues

from ._core import args, log, memory, native, pool, wait
from ._core.segments import SharedTensor
from ._pipes import Reader, Readiness, Writer
from ._wire import exports, pickler, records
from ._wire.records import RECORDS_PER_CALL
from .errors import HandleClosed, OutOfSharedMemory, ZctipcOSError

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any, SupportsIndex, TypeAlias

    import torch
    from numpy.typing import NDArray
    from typing_extensions import Self

    from ._wire.exports import Export

    #: A record as put() makes it: (payload, exports, record type).
    Record: TypeAlias = tuple[bytes, Sequence[Export], int]

__all__ = ["Queue", "SimpleQueue", "JoinableQueue", "DEFAULT_MAX_BYTES", "INLINE_BYTES"]

#: The ring of a queue made without max_bytes on a kernel that cannot
#: reserve memory pages on demand (before Linux 5.14): the bound such a
#: queue has, in pickled bytes. Elsewhere a queue without max_bytes is
#: unbounded.
DEFAULT_MAX_BYTES = 16 << 20

# The framing facts that put and get read (Note [framing from the library]
# in zctipc._wire.records), bound as this module's globals when the first
# queue is set up: a global is read faster than another module's attribute,
# which a put and a get would read half a dozen times.
_PICKLE = _TENSOR = _BYTES = _INLINE = -1
_HEADER = 0
_FIELD_MASK = _OFFSET_SHIFT = _TYPE_SHIFT = 0
_PICKLE_AT_HEADER = -1  # take's result >> _OFFSET_SHIFT for a pickle with no descriptor
# And the calls that the fast paths of a put and a get make (Note [calls
# bound for a hot path] in zctipc._core.native), for the same reason.
_queue_put: Any = None
_queue_put_array: Any = None
_queue_put_inline: Any = None
_queue_take: Any = None
_NULL_VIEWS: Any = None


def _read_framing() -> None:
    """Read the framing facts from the library, and bind them here."""
    global _PICKLE, _TENSOR, _BYTES, _INLINE, _HEADER, _FIELD_MASK, _OFFSET_SHIFT, _TYPE_SHIFT
    global _NULL_VIEWS, _PICKLE_AT_HEADER
    native.bind(
        sys.modules[__name__],
        _queue_put="zct_queue_put",
        _queue_put_array="zct_queue_put_array",
        _queue_put_inline="zct_queue_put_inline",
        _queue_take="zct_queue_take",
    )
    _NULL_VIEWS = native.lib().NULL_VIEWS
    records.read_framing()
    _PICKLE, _TENSOR, _BYTES, _INLINE = records.PICKLE, records.TENSOR, records.BYTES, records.INLINE
    _HEADER = records.HEADER
    _FIELD_MASK, _OFFSET_SHIFT, _TYPE_SHIFT = records.FIELD_MASK, records.OFFSET_SHIFT, records.TYPE_SHIFT
    _PICKLE_AT_HEADER = _PICKLE << (_TYPE_SHIFT - _OFFSET_SHIFT) | _HEADER


#: The default of a queue's inline_bytes: NumPy arrays of this many bytes or
#: fewer travel inside their message (Note [inline arrays] in
#: zctipc._wire.exports), larger ones through a pool buffer. Measured on
#: put+get in one process (benchmarks/bench_queue.py): the copies cost less
#: than a pool buffer's bookkeeping up to about 200 KiB.
INLINE_BYTES = 128 << 10
_loads = pickle.loads
_dumps = pickler.dumps
_wait = wait  # the module, in methods whose parameter is named wait
_BARE = exports.BARE  # the set, which grows when torch is met
_SENT: Any = object()  # _bare's answer for an array it sent itself (Any: it stands where a record would)

# Note [a get's first wait]: a get that blocks without a timeout makes its
# first call into the library wait there up to wait.BRIEF_MS (spinning,
# then asleep on the queue's word), as sleep_outside's first call would:
# a message that comes within it is taken and returned through the fewest
# Python frames, which right after a wake-up run cold and cost several
# microseconds each. A get that finds none by then sleeps outside as
# before (Note [sleeping outside Go] in zctipc._core.wait).
_E_INTERRUPTED = native.E_INTERRUPTED

#: How long a SimpleQueue's put whose message finds no room in /dev/shm
#: waits on an empty queue, for other queues' readers to give pages back,
#: before it raises OutOfSharedMemory (seconds).
_ROOM_WAIT = 5.0

#: How many wait slices a SimpleQueue's put that waits for room sleeps
#: before it looks again, woken or not: room comes from more than the gets
#: that wake it (buffers freed, other queues read).
_LOOK_EVERY = 2


# Note [a bad message among good ones]: get_many takes many messages in one
# call, and one of them may be bad: the library refused its record (it did
# not decode, or a count it carried could not be taken: a descriptor
# replayed, memory gone), or it cannot be built here (a pickle of a class
# this process lacks). It costs only itself, as gets one by one would have
# it: get_many returns the messages before it; the next get or get_many
# raises its error; the messages after it follow (they wait in the stash:
# Note [polling a reader]). When it comes first, get_many raises at once.
# No count is left behind: each good message holds its own, and a bad one
# kept none (the library gave them up; a builder that failed released its
# views).


class _Failed:
    """A message that get_many took but could not give: the error that the
    get that comes to it raises (Note [a bad message among good ones])."""

    __slots__ = ("exc",)

    def __init__(self, exc: Exception) -> None:
        self.exc = exc


class Queue:
    """A process-shared FIFO queue with multiprocessing.Queue's API.

    ``maxsize`` bounds the messages in the queue (0: no bound).
    ``max_bytes``, when given, bounds the pickled bytes in it: it is the
    size of its ring, and so of the largest message (a larger one raises
    ValueError at put). Without it the queue is unbounded, as
    multiprocessing's is: its ring (of 1 GiB of pickled bytes; arrays and
    tensors go beside it) uses the memory of the messages it holds, and a
    put waits, or raises OutOfSharedMemory, only when /dev/shm is full.
    """

    def __init__(
        self,
        maxsize: SupportsIndex = 0,
        *,
        max_bytes: SupportsIndex | None = None,
        inline_bytes: SupportsIndex | None = None,
        wait: str = "sleep",
        spin: float | None = None,
        ctx: object = None,
    ) -> None:
        maxsize = args.integer("maxsize", maxsize, high=1 << 30)  # 0 or less: no bound, as multiprocessing's
        # 0 asks the library for an unbounded ring.
        max_bytes = 0 if max_bytes is None else args.integer("max_bytes", max_bytes, 4096, 1 << 30)
        inline_bytes = _inline_bytes(inline_bytes)
        policy = _wait.policy(wait, spin)  # checked before the queue is made
        ffi, lib = native.ffi(), native.lib()
        handle = ffi.new("zct_handle *")
        native.check(lib.zct_queue_create(ffi.NULL, max_bytes, max(maxsize, 0), handle))
        self._setup(handle[0], inline_bytes)
        if log.enabled():
            log.logger().debug("made queue %s: a ring of %d bytes, maxsize %d", self._name, self._capacity, maxsize)
        native.check(lib.zct_queue_set_wait(handle[0], *policy))
        self._polls = policy[0]

    def _setup(self, handle: int, inline_bytes: int | None) -> None:
        ffi, lib = native.ffi(), native.lib()
        name = ffi.new("char[]", 256)
        capacity = ffi.new("uint64_t *")
        maxsize = ffi.new("uint64_t *")
        native.check(lib.zct_queue_describe(handle, name, 256, capacity, maxsize))
        if _HEADER == 0:
            _read_framing()
        self._handle = handle
        self._name: str = ffi.string(name).decode()
        self._capacity: int = capacity[0]
        self._payload_room = self._capacity - _HEADER  # the largest payload of a record with no views
        self._inline_bytes = inline_bytes  # as given: children get the same
        if inline_bytes is None:
            inline_bytes = INLINE_BYTES
        # An inline array takes at most a quarter of a bounded ring; with
        # inline_bytes=0 none goes inline, not even an empty one.
        self._inline = min(inline_bytes, self._capacity // 4) if inline_bytes else -1
        self._maxsize: int = maxsize[0]
        self._closed = False
        self._sent = False  # this process put something (Note [closed and never used])
        self._scratches = [records.Scratch(handle)]  # free ones (see zctipc._wire.records.Scratch)
        self._stash: list[Any] = []  # Note [polling a reader] in zctipc._pipes
        self._ready: Readiness | None = None
        self._async_waiting: dict[Any, set[Any]] = {}  # event loop: futures awaiting readiness (get_async)
        # The ends the standard library waits on, which hold this queue weakly
        # (Note [an end holds its queue weakly] in zctipc._pipes).
        self._reader, self._writer = Reader(self, self._name), Writer(self, self._name)
        # What multiprocessing's queues lock around their pipe ends (its
        # pool's shutdown takes _rlock); the ring needs neither.
        self._rlock, self._wlock = threading.Lock(), threading.Lock()
        self._polls = False  # set_wait("poll"): waits stay in the library
        self._armed = wait.Armed()  # per thread: out-parameters of zct_queue_arm
        # How arrays find pool buffers when /dev/shm is full (Note [sending
        # in band when shared memory is full] in zctipc._wire.exports).
        self._in_band = _InBandOnceEmpty(self) if self._in_band_once_empty else None
        self._finalizer = weakref.finalize(self, _let_go_of_queue, handle, self._name)
        self._finalizer.atexit = False  # Note [a queue at exit]

    @classmethod
    def attach(cls, name: str, *, inline_bytes: SupportsIndex | None = None) -> Self:
        """Open the queue ``name`` that another process made (a Go program,
        say: zctipc.NewQueue), by its full segment name. (A child process
        that unpickles a queue attaches it so: Note [queues handed to
        children].) inline_bytes is how this process puts small arrays,
        as for Queue()."""
        inline_bytes = _inline_bytes(inline_bytes)
        ffi, lib = native.ffi(), native.lib()
        handle = ffi.new("zct_handle *")
        native.check(lib.zct_queue_attach(name.encode(), 0, handle))
        q = cls.__new__(cls)
        q._setup(handle[0], inline_bytes)
        log.debug("attached queue %s", name)
        return q

    @property
    def name(self) -> str:
        """The queue's full segment name, by which other processes (in any
        language) attach it."""
        return self._name

    def set_wait(self, wait: str = "sleep", spin: float | None = None) -> None:
        """How this process's blocking put and get on this queue object wait
        (zctipc._core.wait.POLICIES): "sleep" (the default) spins for spin
        seconds yielding the CPU (by default 50 us, stretched up to 200 us
        while messages come that often), then sleeps on a futex and uses
        no CPU; "poll" looks at the queue without yielding and without a
        system call, for spin seconds (for ever by default) before it
        sleeps: a message is seen within a microsecond, and a waiting
        process takes a whole core."""
        poll, spin_ns = _wait.policy(wait, spin)
        self._check_open()
        native.check(native.lib().zct_queue_set_wait(self._handle, poll, spin_ns))
        self._polls = poll

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"qsize={self._qsize()}"
        return f"<{type(self).__name__} {self._name!r} maxsize={self._maxsize} max_bytes={self._capacity} {state}>"

    # -- pickling: only to child processes, like multiprocessing's queues ---

    def __reduce__(self) -> tuple[Callable[[type[Queue], str, int | None], Queue], tuple[type[Queue], str, int | None]]:
        _mpcontext.assert_spawning(self)
        self._check_open()
        _hold_for_child(self._name, _mpcontext.get_spawning_popen())
        return _rebuild_queue, (type(self), self._name, self._inline_bytes)

    # -- putting --------------------------------------------------------------

    #: Whether puts send arrays in band once the pool has no room and the
    #: queue is empty (SimpleQueue's), rather than wait as block and timeout say.
    _in_band_once_empty = False

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        """Put obj into the queue, waiting for room as block and timeout say,
        else raise queue.Full.

        When shared memory is full: an array that must be copied into the
        pool waits for a buffer as block and timeout say, then raises
        OutOfSharedMemory (at once when waiting cannot help: the array is
        larger than the pool's limit, or /dev/shm is full and nothing of the
        pool's can come back); a message whose pickled bytes find no room
        in /dev/shm for the queue's ring raises OutOfSharedMemory at once.
        A SimpleQueue sends arrays in band instead (SimpleQueue.put)."""
        if self._closed:
            self._check_open()
        if timeout is not None:
            timeout = args.timeout(timeout)
        payload: bytes
        buffers: Sequence[Export]
        t = type(obj)
        if t is bytes:
            payload, buffers, typ = obj, (), _BYTES
        elif t in _BARE and (bare := self._bare(obj, block, timeout)) is not None:
            if bare is _SENT:
                self._sent = True
                return
            payload, buffers, typ = bare
        else:
            payload, buffers = _dumps(obj, block, timeout, self._inline, self._in_band)
            typ = _PICKLE
        self._sent = True
        if not buffers and len(payload) <= self._payload_room:
            # Fast path: one try without waiting; _put waits.
            if _queue_put(self._handle, typ, payload, len(payload), _NULL_VIEWS, 0, 0) == 0:
                return
        self._put(typ, payload, buffers, block, timeout)

    def _bare(self, obj: Any, block: bool, timeout: float | None) -> Record | None:
        """The record of a bare array, tensor or SharedTensor: (payload,
        buffers, record type) of a tensor record whose one buffer is zctipc
        memory; _SENT when it is sent already, in one native call; None to
        pickle it. An array goes, the first that applies: inline when small
        and not zctipc memory (Note [inline arrays] in
        zctipc._wire.exports); by descriptor when zctipc memory (sent at
        once when C-contiguous); else copied into a pool buffer, which a
        SimpleQueue may find none for (Note [sending in band when shared
        memory is full] there): then inline whatever its size; else
        pickled (a dtype or rank a descriptor cannot hold)."""
        if obj.__class__ is not exports.ndarray:
            if obj.__class__ is not SharedTensor and self._put_tensor(obj):
                return _SENT  # zctipc memory, by descriptor in one call
            e = exports.export_bare(obj, block, timeout)
            return None if e is None else (b"", [e], _TENSOR)
        small = obj.nbytes <= self._inline
        if small and (found := exports.inline_array(obj)) is not None:
            self._put_inline(found, block, timeout)
            return _SENT
        sent = self._put_array(obj)  # zctipc memory (a small one did not go inline)
        if sent:
            return _SENT
        # False: not zctipc memory the library can send (or a segment since
        # unlinked): a large array is copied without asking again; a small one,
        # which inline_array took for zctipc memory, goes by descriptor, and
        # its put says why it cannot.
        e = None if sent is False and not small else exports.find_array(obj)
        if e is None:
            e = exports.copy_array(obj, block, timeout, self._in_band)
        if e is not None:
            return b"", [e], _TENSOR
        if self._in_band is None or (found := exports.inline_array(obj)) is None:
            return None
        self._put_inline(found, block, timeout)  # no pool buffer: its bytes in band
        return _SENT

    def _put_inline(self, found: tuple[int, int, NDArray[Any]], block: bool, timeout: float | None) -> None:
        """Put an array inline (Note [inline arrays] in
        zctipc._wire.exports), as exports.inline_array found it, in one call
        into the library, waiting for room as block and timeout say."""
        code, flags, arr = found  # arr, C-contiguous, holds its elements' address until the put returned
        address, put, handle = exports.elements(arr), _queue_put_inline, self._handle
        nbytes, shape = arr.nbytes, arr.shape
        if put(handle, address, nbytes, code, len(shape), shape, flags, 0) != 0:  # fast path: one try, no wait

            def call(ms: int) -> int:
                return put(handle, address, nbytes, code, len(shape), shape, flags, ms)

            self._send(call, nbytes, (), block, timeout)

    def _put_array(self, arr: NDArray[Any]) -> bool | None:
        """Put a C-contiguous NumPy array that is zctipc memory as a tensor
        record, in one try without waiting: True when it went, False when
        it is not zctipc memory, None when it must take the long way (the
        queue is full, or the array is of another layout or dtype)."""
        found = exports.contiguous_view(arr)
        if found is None:
            return None
        code, flags, address = found
        return _sent(
            _queue_put_array(
                self._handle, _TENSOR, address, arr.nbytes, code, arr.ndim, arr.shape, arr.strides, flags, 0
            )
        )

    def _put_tensor(self, t: torch.Tensor) -> bool | None:
        """Put a plain torch tensor whose memory is zctipc's as a tensor
        record, as _put_array puts an array: True when it went, else False
        or None as _put_array says (None too for a tensor whose memory
        cannot go as it is), and export_bare takes it the long way. One
        call into the library, which runs without Go for a pool buffer's
        (a hand-off's) tensor."""
        found = exports.tensor_view(t)
        if found is None:
            return None
        code, flags, address, extent, shape, strides = found
        return _sent(
            _queue_put_array(self._handle, _TENSOR, address, extent, code, len(shape), shape, strides, flags, 0)
        )

    def put_nowait(self, obj: object) -> None:
        return self.put(obj, False)

    def put_many(self, objs: Iterable[object], block: bool = True, timeout: float | None = None) -> None:
        """Put the objects in order, as put would one by one, but crossing
        into the library once per run of messages that fit in the queue
        together. block and timeout apply to the whole call; on queue.Full,
        the objects before the one that did not fit are in the queue."""
        if self._closed:
            self._check_open()
        timeout = args.timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        self._sent = True
        p = pickler.pickler()
        # Pickle a run of objects into one buffer, one after another, until
        # one has out-of-band buffers (it goes on its own) or the run would
        # not fit in the queue.
        objs = iter(objs)
        pending = None
        while True:
            payloads, ends, single = p.dump_run(objs, self._payload_room, block, timeout, pending, self._inline)
            pending = None
            if ends:
                self._put_batch(payloads, ends, block, deadline)
            if single is None:
                return
            obj, payload, buffers = single
            if type(obj) is pickler.Oversized:
                pending = obj.obj  # alone, in the next run
                continue
            if type(obj) is pickler.Failed:
                raise obj.exc
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            # payload is a pickle here: only Oversized and Failed come with None.
            self._put(native.lib().ZCT_RECORD_PICKLE, payload, buffers, block, left)  # type: ignore[arg-type]

    def _put_batch(self, data: bytes, ends: list[int], block: bool, deadline: float | None) -> None:
        """Put pickled payloads with no buffers (data, split at ends), in as
        few calls as they fit."""
        ffi, lib = native.ffi(), native.lib()
        buf = ffi.from_buffer(data)
        written = ffi.new("int32_t *")
        done, count, base = 0, len(ends), 0
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        while done < count:
            rest = ends if done == 0 else [e - base for e in ends[done:]]
            status = self._wait_on(
                lib.ZCT_WAIT_SPACE,
                # mypy cannot infer a lambda whose defaults bind the loop's values
                lambda ms, base=base, rest=rest, left=count - done: lib.zct_queue_put_many(  # type: ignore[misc]
                    self._handle, lib.ZCT_RECORD_PICKLE, buf + base, rest, left, ms, written
                ),
                native.E_FULL,
                block,
                timeout,
            )
            native.check(status)
            done += written[0]
            base = ends[done - 1]
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())

    @staticmethod
    def _dumps(obj: object, block: bool, timeout: float | None) -> tuple[bytes, list[Export]]:
        return _dumps(obj, block, timeout)

    def _put(self, typ: int, payload: bytes, buffers: Sequence[Export], block: bool, timeout: float | None) -> None:
        ffi, lib = native.ffi(), native.lib()
        n = len(buffers)
        if n == 1 and len(payload) + _HEADER + 1024 <= self._capacity:
            # Fast path for one buffer (a bare array): one try without waiting.
            free = self._scratches
            s = free.pop() if free else records.Scratch(self._handle)
            try:
                buffers[0].fill(s.put_view)
                if lib.zct_queue_put(self._handle, typ, payload, len(payload), s.put_view, 1, 0) == 0:
                    return
            finally:
                free.append(s)
        if len(payload) + _HEADER > self._capacity:
            exports.release_all(buffers)
            raise ValueError(
                f"the object pickles to {len(payload)} bytes, more than this queue takes "
                f"(max_bytes={self._capacity}); make the queue with a larger max_bytes"
            )
        views = ffi.NULL
        if n:
            views = ffi.new("zct_view[]", n)
            for i, e in enumerate(buffers):
                e.fill(views[i])
        put, handle, size = lib.zct_queue_put, self._handle, len(payload)
        self._send(lambda ms: put(handle, typ, payload, size, views, n, ms), size, buffers, block, timeout)

    def _send(
        self, put: Callable[[int], int], size: int, buffers: Sequence[Export], block: bool, timeout: float | None
    ) -> None:
        """Call put(ms), a native put that waits up to ms for room, until
        the message went in, waiting for room as block and timeout say (a
        SimpleQueue's for room in shared memory too); else raise, releasing
        buffers, whose counts a failed put leaves. size: the message's
        bytes, which the error of one that finds no room names."""
        if self._in_band is None:
            call = put
        else:
            since: list[float] = []  # when the queue was first found empty without room

            def call(ms: int) -> int:
                status = put(ms)
                if status != native.E_NO_SPACE:
                    return status
                # No room in /dev/shm for the record's pages. The pool's idle
                # arenas go back first: their pages may be all it lacks, and
                # nobody else can give them back. Then it is full while the
                # queue holds messages, whose gets give pages back, and for a
                # while on an empty one, while other queues' readers may
                # (Note [sending in band when shared memory is full]).
                pool.trim()
                status = put(0)
                if status != native.E_NO_SPACE:
                    return status
                if self._holds():
                    since.clear()
                    return native.E_FULL
                now = time.monotonic()
                if not since:
                    since.append(now)
                return native.E_FULL if now - since[0] < _ROOM_WAIT else status

        try:
            # A SimpleQueue's look checks more than the space word says: it looks every few slices.
            look_every = wait.RECHECK_SLICES if self._in_band is None else _LOOK_EVERY
            status = self._wait_on(
                native.lib().ZCT_WAIT_SPACE, call, native.E_FULL, block, timeout, look_every=look_every
            )
        except BaseException:  # Ctrl-C between slices: the refs are still ours
            exports.release_all(buffers)
            raise
        if status != 0:
            exports.release_all(buffers)
            if status == native.E_NO_SPACE and self._in_band is not None:
                # A SimpleQueue's message that can never go in (its consumers
                # took every message, and still there is no room): say what to do.
                raise OutOfSharedMemory(
                    f"a message of {size / (1 << 20):.1f} MiB (arrays that found no pool buffer go inside "
                    "it) finds no room in shared memory for the queue's ring, and the queue holds no message "
                    "whose get would make some: send less at once (multiprocessing.Pool: a smaller chunksize), "
                    f"or give shared memory more room: {native.error(status).args[0]}"
                )
            native.check(status)

    # -- getting --------------------------------------------------------------

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Remove and return an object, waiting for one as block and timeout
        say, else raise queue.Empty."""
        if self._closed:
            self._check_open()
        if timeout is not None:
            timeout = args.timeout(timeout)
        if self._stash:
            if self._stash[0].__class__ is _Failed:
                raise self._stash.pop(0).exc
            return self._stash.pop(0)
        free = self._scratches
        s = free.pop() if free else records.Scratch(self._handle)
        try:
            # Fast path: one call, which waits briefly inside the library when
            # the get blocks without a timeout (Note [a get's first wait]).
            r = _queue_take(*(s.take_brief if block and timeout is None and not self._polls else s.take_now))
            if r < 0:
                if r == _E_INTERRUPTED:  # a signal ended the brief wait: its handler runs on return
                    r = native.E_EMPTY
                try:
                    r = self._take(s, r, block, timeout)
                except _queue.Empty:
                    if self._ready is not None:  # another consumer may have taken what it showed
                        self._ready.rearm(self._empty)
                    raise
            if self._ready is not None:
                self._ready.rearm(self._empty)
            at = r >> _OFFSET_SHIFT  # the type above the offset (zctipc.h)
            if at == _PICKLE_AT_HEADER:  # a pickle with no descriptor, the most common
                return _loads(s.payload)  # a pickle ends at its STOP
            off, typ = at & _FIELD_MASK, r >> _TYPE_SHIFT
            if off == _HEADER:  # no descriptor, and so no view but an inline array's
                if typ == _INLINE:
                    return exports.build_inline(s.mem, s.vbuf, 0)
                return records.decode(s.mem, typ, off, r & _FIELD_MASK, s.vbuf, 0, 0)
            if typ == _TENSOR:  # a bare array's (a hand-off's): its one view
                return exports.build(s.vbuf, 0)
            return records.decode(s.mem, typ, off, r & _FIELD_MASK, s.vbuf, 0, s.nviews[0])
        finally:
            free.append(s)

    def _take(self, s: records.Scratch, status: int, block: bool, timeout: float | None) -> int:
        """Take a record into s after a first try found none (status), as
        block and timeout say; what zct_queue_take returns."""
        lib = native.lib()
        take = lib.zct_queue_take

        def attempt(ms: int) -> int:
            while True:
                r = take(self._handle, s.buf, s.cap, ms, s.views, s.vcap, s.nviews)
                if r != native.E_RANGE:
                    return r
                # What it needs, said by zct_queue_get (which takes it).
                status = lib.zct_queue_get(self._handle, s.buf, s.cap, 0, *s.get_args())
                if status == native.E_RANGE:
                    s.resize(max(s.cap, s.plen[0]), max(s.vcap, s.nviews[0]))  # and take it at once
                elif status == 0:  # packed as zct_queue_take packs it; s.nviews holds the views
                    return s.plen[0] | s.off[0] << _OFFSET_SHIFT | s.typ[0] << _TYPE_SHIFT
                else:
                    return status

        if status == native.E_RANGE:
            status = attempt(0)
        if status == native.E_EMPTY and block:
            status = self._wait_for_data(attempt, timeout)
        if status < 0:
            native.check(status)
        return status

    def _wait_for_data(
        self, call: Callable[[int], int], timeout: float | None, block: bool = True, takes: bool = True
    ) -> int:
        """The status of call(ms), a native call that waits up to ms for a
        message, once one came or the timeout passed. takes: call takes the
        message it finds (a get), or only says that one is there (_poll)."""
        return self._wait_on(native.lib().ZCT_WAIT_DATA, call, native.E_EMPTY, block, timeout, takes)

    def _wait_on(
        self,
        which: int,
        call: Callable[[int], int],
        again: int,
        block: bool,
        timeout: float | None,
        takes: bool = True,
        look_every: int = wait.RECHECK_SLICES,
    ) -> int:
        """The status of call(ms), a native call that waits up to ms on the
        queue's word which (ZCT_WAIT_DATA, ZCT_WAIT_SPACE or ZCT_WAIT_JOIN)
        and returns again while it must wait on, once it returned something
        else or the timeout passed: outside the library (Note [sleeping
        outside Go] in zctipc._core.wait) unless this queue object polls.
        takes=False: call only says that a message is there, and passes on
        the wake-up of a put (which wakes one sleeper) that it took.
        look_every: call again after that many slices without a wake-up,
        for a call that looks at more than the word: every second by
        default, for a lock whose holder died (Note [a lock holder that
        died wakes nobody] in zctipc._core.wait)."""
        if self._polls:
            return wait.retry(call, again, block, timeout)
        lib = native.lib()

        def arm() -> tuple[Any, int]:
            out = self._armed
            native.check(lib.zct_queue_arm(self._handle, which, out.word, out.seen))
            return out.word[0], out.seen[0]

        def disarm(woken: bool) -> None:
            status = lib.zct_queue_disarm(self._handle, which, woken and not takes)
            if status != native.E_CLOSED:  # after a close, the library took the arm back itself
                native.check(status)

        return wait.sleep_outside(call, again, block, timeout, arm, disarm, self._is_closed, look_every)

    def _is_closed(self) -> bool:
        return self._closed

    def _holds(self) -> bool:
        """Whether the queue holds messages now (False once closed)."""
        items = native.ffi().new("int64_t[2]")
        return native.lib().zct_queue_len(self._handle, items, items + 1) == 0 and items[0] > 0

    def get_nowait(self) -> Any:
        return self.get(False)

    def get_many(
        self, max_items: SupportsIndex = 1 << 30, block: bool = True, timeout: float | None = None
    ) -> list[Any]:
        """Return a list of up to max_items objects (and at most
        RECORDS_PER_CALL), taken in one call into the library: the first
        waited for as get does, then those already behind it. A message
        among them that cannot be read raises as get would, once the
        messages before it were returned (Note [a bad message among good
        ones])."""
        if self._closed:
            self._check_open()
        max_items = args.integer("max_items", max_items, 1)
        if self._stash:
            return self._unstash(max_items)
        free = self._scratches
        s = free.pop() if free else records.Scratch(self._handle)
        try:
            return self._get_many(s, max_items, block, timeout)
        finally:
            free.append(s)

    def _get_many(self, s: records.Scratch, max_items: int, block: bool, timeout: float | None) -> list[Any]:
        lib = native.lib()
        took, filled, recs = s.records, s.filled, s.recs

        def attempt(ms: int) -> int:
            while True:
                status = lib.zct_queue_get_many(
                    self._handle,
                    s.buf,
                    s.cap,
                    min(max_items, RECORDS_PER_CALL),
                    ms,
                    took,
                    recs,
                    filled,
                    s.views,
                    s.vcap,
                    s.nviews,
                )
                if status != native.E_RANGE:
                    return status
                s.resize(max(s.cap, filled[0]), max(s.vcap, s.nviews[0]))  # and take it at once

        status = self._wait_for_data(attempt, timeout) if block else attempt(0)
        taken = took[0]  # 0 when the call failed before it took a message (zctipc.h)
        refused: Exception | None = None
        if status != 0:
            if not taken:
                native.check(status)
            refused = native.error(status)  # read now: the message is this thread's last error
        if self._ready is not None:
            self._ready.rearm(self._empty)
        out: list[Any] = []
        append, mem, vbuf, size = out.append, s.mem, s.vbuf, native.ffi().sizeof("zct_view")
        # One unpickler reads every pickle in place: each stops at its STOP
        # opcode, and memo entries of one are never read by the next.
        stream = io.BytesIO(mem[: filled[0]])
        seek, load = stream.seek, pickle.Unpickler(stream).load
        v = given = 0  # views read, and views handed to what builds their message
        failed = False
        try:
            for i in range(taken):
                r = recs[i]
                typ, nviews, off = r.type, r.nviews, r.payload_offset
                given = v + nviews
                try:
                    if typ == _PICKLE and nviews == 0:
                        seek(off)
                        append(load())
                    elif typ == _INLINE:
                        append(exports.build_inline(mem, vbuf, v * size))
                    elif typ == 0:  # refused by the library, which kept none of its counts (zctipc.h)
                        append(_Failed(refused))  # type: ignore[arg-type]  # a record is refused only with a status
                        failed = True
                    else:
                        append(records.decode(mem, typ, off, r.payload_len, vbuf, v * size, nviews))
                except Exception as exc:  # this message's alone (Note [a bad message among good ones])
                    # Its traceback from the builder on: this frame, which
                    # holds the messages, would make a cycle through it.
                    append(_Failed(exc.with_traceback(exc.__traceback__.tb_next if exc.__traceback__ else None)))
                    failed = True
                    load = pickle.Unpickler(stream).load  # one that failed midway keeps its stack
                v = given
        except BaseException:  # Ctrl-C: the counts of the messages not built yet go
            views = s.views
            for k in range(given, s.nviews[0]):
                if views[k].ref:
                    memory.release_ref(views[k].ref)
            raise
        if refused is not None and not failed:  # the ring's error, after the messages it gave
            append(_Failed(refused))
            failed = True
        return self._deliver(out) if failed else out

    def _deliver(self, out: list[Any]) -> list[Any]:
        """What get_many returns of out, the messages it took, some of them
        _Failed (Note [a bad message among good ones]): those before the
        first that failed; it and the rest wait in the stash. When it is
        the first, its error is raised now. (No frame that an error's
        traceback holds keeps a reference to the error: a cycle would keep
        the messages, and their counts, until the collector ran.)"""
        k = next(i for i, obj in enumerate(out) if obj.__class__ is _Failed)
        rest = out[k:]
        del out[k:]
        if k:
            self._stash[0:0] = rest
            return out
        self._stash[0:0] = rest[1:]
        raise rest.pop(0).exc

    def _unstash(self, max_items: int) -> list[Any]:
        """get_many from the stash: up to max_items messages before the
        first that failed, or that one's error when it is first."""
        stash = self._stash
        k = 0
        while k < max_items and k < len(stash) and stash[k].__class__ is not _Failed:
            k += 1
        if not k:
            raise stash.pop(0).exc
        out, self._stash = stash[:k], stash[k:]
        return out

    # -- state ------------------------------------------------------------------

    def _counts(self) -> tuple[int, int]:
        ffi = native.ffi()
        items = ffi.new("int64_t[2]")
        native.check(native.lib().zct_queue_len(self._handle, items, items + 1))
        return items[0], items[1]

    def _qsize(self) -> int:
        return self._counts()[0] + len(self._stash)

    def qsize(self) -> int:
        """The number of messages in the queue now (others may change it)."""
        self._check_open()
        return self._qsize()

    def empty(self) -> bool:
        if self._closed:
            self._check_usable()
            return True
        return self._qsize() == 0

    def full(self) -> bool:
        """Whether put_nowait of a small message would raise queue.Full now:
        maxsize messages are in the queue, or its ring has no room (a queue
        of max_bytes). Others may change it."""
        self._check_open()
        room = native.ffi().new("uint64_t *")
        native.check(native.lib().zct_queue_room(self._handle, room))
        return room[0] < _HEADER + 8  # the smallest record with a payload

    def _empty(self) -> bool:
        return self._qsize() == 0

    # -- waiting among other things (Note [waiting on a queue among other
    # things] in zctipc._pipes) ---------------------------------------------

    def _readiness(self) -> Readiness:
        self._check_open()
        if self._ready is None:
            with self._rlock:
                if self._ready is None:
                    self._ready = Readiness(self._handle, self._name)
                    weakref.finalize(self, self._ready.stop)  # a queue collected unclosed
        return self._ready

    def _poll_take(self, timeout: float | None = 0.0) -> bool:
        """Reader.poll (Note [polling a reader] in zctipc._pipes)."""
        if self._stash:
            return True
        try:
            obj = Queue.get(self, timeout is None or timeout > 0, timeout)  # SimpleQueue's takes no timeout
        except _queue.Empty:
            return False
        self._stash.append(obj)
        return True

    def _poll(self, timeout: float | None = 0.0) -> bool:
        """Whether a message is there, waiting up to timeout seconds (None:
        for ever) for one; it is not taken."""
        self._check_open()
        if self._stash:
            return True
        lib = native.lib()
        status = self._wait_for_data(
            lambda ms: lib.zct_queue_wait(self._handle, ms), timeout, timeout is None or timeout > 0, takes=False
        )
        if status == native.E_EMPTY:
            return False
        native.check(status)
        return True

    async def get_async(self) -> Any:
        """Remove and return an object, awaiting one without blocking the
        event loop (the loop watches the queue's readiness descriptor, once
        for all the coroutines that await this queue object on it). Raises
        HandleClosed once the queue is closed, also in a coroutine that was
        awaiting then."""
        import asyncio

        loop = asyncio.get_running_loop()
        while True:
            try:
                return self.get(False)
            except _queue.Empty:
                pass
            await self._readable(loop)

    def _readable(self, loop: Any) -> Any:
        """A future of loop that is done once the readiness descriptor is
        readable. One reader callback per loop serves every future waiting
        there (a second add_reader on the descriptor would replace the
        first); the callback wakes them all, and each looks again."""
        fd = self._readiness().read_fd
        waiting = self._async_waiting.get(loop)
        if waiting is None:
            waiting = self._async_waiting[loop] = set()
            loop.add_reader(fd, self._wake_async, loop, fd)
        future = loop.create_future()
        waiting.add(future)
        future.add_done_callback(lambda f: self._forget_async(loop, fd, f))
        return future

    def _wake_async(self, loop: Any, fd: int) -> None:
        waiting = self._async_waiting.pop(loop, set())
        loop.remove_reader(fd)
        for future in waiting:
            if not future.done():
                future.set_result(None)

    def _forget_async(self, loop: Any, fd: int, future: Any) -> None:
        """A future done (woken or cancelled) waits no more; the last one
        of a loop takes the loop's reader callback away."""
        waiting = self._async_waiting.get(loop)
        if waiting is not None:
            waiting.discard(future)
            if not waiting:
                del self._async_waiting[loop]
                loop.remove_reader(fd)

    def close(self) -> None:
        """This process will use the queue no more: put and get raise
        HandleClosed (a ValueError) from now on, here and in calls other
        threads are blocked in, and its hold on the queue goes. empty()
        then answers as multiprocessing's does (Note [closed and never
        used])."""
        if not self._closed:
            self._closed = True
            if self._ready is not None:
                self._ready.stop()
            self._finalizer()

    def join_thread(self) -> None:
        """Nothing to wait for: put() returns when the object is in the queue.
        Like multiprocessing's, only valid after close()."""
        if not self._closed:
            raise ValueError(f"join_thread() needs close() first: {self!r}")

    def cancel_join_thread(self) -> None:
        """Nothing to cancel: there is no feeder thread."""

    def _check_open(self) -> None:
        if self._closed:
            raise HandleClosed(f"Queue {self._name!r} is closed")

    def _check_usable(self) -> None:
        """Note [closed and never used]: as multiprocessing's, a closed queue
        this process never put into still answers empty() (closing it closed
        nothing); one it put into raises OSError, as a closed pipe does."""
        if self._sent:
            raise ZctipcOSError(errno.EBADF, f"Queue {self._name!r} is closed")


class JoinableQueue(Queue):
    """A Queue whose consumers mark each message done, so that producers
    can join() until all are."""

    def task_done(self) -> None:
        """Mark one message taken from the queue as done; ValueError when
        called more often than messages were put."""
        self._check_open()
        status = native.lib().zct_queue_task_done(self._handle)
        if status == native.E_INVALID:
            raise ValueError("task_done() called too many times")
        native.check(status)

    def join(self) -> None:
        """Wait until every message put was marked done."""
        self._check_open()
        lib = native.lib()
        native.check(
            self._wait_on(lib.ZCT_WAIT_JOIN, lambda ms: lib.zct_queue_join(self._handle, ms), native.E_FULL, True, None)
        )


class SimpleQueue(Queue):
    """multiprocessing.SimpleQueue's API (get, put, empty, close) over the
    same ring, without a bound on the number of messages. multiprocessing's
    Pool and concurrent.futures.ProcessPoolExecutor send through one when
    given zctipc's context (Pool its tasks and results, the executor its
    results)."""

    _in_band_once_empty = True

    def __init__(
        self, *, max_bytes: SupportsIndex | None = None, inline_bytes: SupportsIndex | None = None, ctx: object = None
    ) -> None:
        super().__init__(0, max_bytes=max_bytes, inline_bytes=inline_bytes, ctx=ctx)

    # multiprocessing.SimpleQueue's put and get take no block or timeout.
    def put(self, obj: object) -> None:  # type: ignore[override]
        """Put obj into the queue. It does not fail for want of shared
        memory that can come back: when the pool has no buffer for a NumPy
        array, put waits for one while the queue holds messages (their
        consumers make room, as a pipe's reader does), and once it holds
        none sends the array's bytes inside the message instead, warning
        the first time; a message that finds no room for the ring's pages
        waits the same way, and on an empty queue for five seconds (other
        queues may give pages back), then raises OutOfSharedMemory (Note
        [sending in band when shared memory is full] in
        zctipc._wire.exports). So, as with a pipe, a process that puts more
        than shared memory holds before it gets waits for ever. Torch
        tensors are shared, never copied: a full pool makes their put wait,
        or raise OutOfSharedMemory when waiting cannot help."""
        super().put(obj)

    def get(self) -> Any:  # type: ignore[override]
        return super().get()

    def _check_usable(self) -> None:
        # multiprocessing's SimpleQueue closes its pipe at once.
        raise ZctipcOSError(errno.EBADF, f"Queue {self._name!r} is closed")


# Note [queues handed to children]: a child attaches a queue by name, with a
# count of its own. Until it has, the parent's count must keep the queue, even
# if the parent closes its Queue at once: so pickling a queue for a child
# opens one more handle on it, which lives as long as the child's Popen object
# (the Process object that started it, until it is collected), or until this
# process exits when the spawner is no such object. Nothing is in flight: a
# child killed before it attached leaves nothing behind (a count carried to it
# would stay until this process exited).
_held_for_children: list[int] = []


# Note [a queue at exit]: weakref.finalize calls the finalizers of the
# objects still alive at exit from an atexit handler of its own, registered
# when the first one is made, which is mostly after zctipc registered
# multiprocessing's exit function again when it loaded its library; atexit
# runs the last registered first. A queue's handles were then closed before
# multiprocessing's exit function ran, which still had work to do with
# them: a Pool left open put to its queues from
# its finalizer and its threads got from them (HandleClosed, printed from
# each), and the hold of a queue handed to a child went before the exit
# function joined that child, so that a program that started a child and
# returned from its main left it a queue that no longer existed
# (SegmentNotFound when it attached). A daemon thread blocked in a get was
# woken to raise HandleClosed too. So a queue's handles are not closed at
# exit: zctipc's own exit function lets go of everything this process
# holds, from multiprocessing's last finalizer, once its pools are stopped
# and its children joined (zctipc._core.native._register_exit).


def _sent(status: int) -> bool | None:  # type: ignore[return]  # check() raises for the rest
    """What a put of a tensor record in one try said (zct_queue_put_array's
    status): True when it went, False when its memory is not zctipc's, None
    when it must take the long way (the queue is full, or the array is of
    another layout or dtype); else raise."""
    if status == 0:
        return True
    if status == native.E_NOT_FOUND:
        return False
    if status == native.E_FULL:
        return None
    native.check(status)


def _let_go_of_queue(handle: int, name: str) -> None:
    native.finalize("zct_queue_close", handle, "closing a queue")
    log.debug("let go of queue %s", name)


def _hold_for_child(name: str, popen: object) -> None:
    ffi, lib = native.ffi(), native.lib()
    handle = ffi.new("zct_handle *")
    native.check(lib.zct_queue_attach(name.encode(), 0, handle))
    try:
        held = weakref.finalize(popen, native.finalize, "zct_queue_close", handle[0], "closing a queue")
        held.atexit = False  # Note [a queue at exit]
    except TypeError:  # not an object a weak reference can follow: until exit
        _held_for_children.append(handle[0])


class _InBandOnceEmpty(exports.InBand):
    """How a SimpleQueue's put finds pool buffers for arrays (Note [sending
    in band when shared memory is full] in zctipc._wire.exports): at once,
    leaving room; else, while the queue holds messages, waiting for a get
    (_LOOK_EVERY slices at most, then it looks again); else none, and the
    array goes in band (Note [in band one at a time]). It holds its queue
    weakly: the queue holds it."""

    __slots__ = ("queue",)

    def __init__(self, q: Queue) -> None:
        self.queue = weakref.ref(q)

    def buffer(self, nbytes: int) -> tuple[int, Any] | None:
        leave = exports.leave(nbytes)
        got = pool.alloc_leaving(nbytes, leave)
        q = self.queue()
        # Note [in band one at a time]: E_NO_SPACE (no buffer of the class
        # in use, none comes back) waits too while the queue holds
        # messages, though no get brings a buffer: the array goes in band
        # only once the queue is empty, so that the queue's ring holds one
        # such message per putter, not as many as /dev/shm takes. Sent at
        # once, a Pool's task handler (which puts every pending task as
        # soon as it can) filled a 16 MiB /dev/shm with its ring's tasks of
        # 4 MiB arrays, and the workers' results, finding no room for
        # theirs, raised OutOfSharedMemory; a pipe's writer, too, waits for
        # its reader.
        if (got == native.E_FULL or got == native.E_NO_SPACE) and q is not None:
            taken: list[tuple[int, Any]] = []

            def look(ms: int) -> int:
                found = pool.alloc_leaving(nbytes, leave)
                if isinstance(found, tuple):
                    taken.append(found)
                    return 0
                return native.E_FULL if q._holds() else 0

            try:
                q._wait_on(native.lib().ZCT_WAIT_SPACE, look, native.E_FULL, True, None, look_every=_LOOK_EVERY)
            except BaseException:  # Ctrl-C: a buffer taken is ours to give back
                for ref, _ in taken:
                    native.finalize("zct_ref_release", ref, "releasing a buffer")
                raise
            got = taken[0] if taken else native.E_NO_SPACE
        if isinstance(got, tuple):
            if exports.in_band:
                exports.pooled()
            return got
        exports.warn_in_band(nbytes)
        return None


def _inline_bytes(value: SupportsIndex | None) -> int | None:
    """A queue's inline_bytes checked: None (the default) or a size."""
    return None if value is None else args.integer("inline_bytes", value, 0, 1 << 30)


def _rebuild_queue(cls: type[Queue], name: str, inline_bytes: int | None = None) -> Queue:
    return cls.attach(name, inline_bytes=inline_bytes)


def __getattr__(name: str) -> Any:
    # The rest of multiprocessing.queues, for code that imports it by this
    # name (``import zctipc as multiprocessing``).
    try:
        return getattr(_mpqueues, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
