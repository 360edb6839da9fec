"""Drop-in replacements for multiprocessing's Queue, SimpleQueue and
JoinableQueue, over a ring in shared memory.

Objects are pickled (protocol 5) with NumPy arrays, CPU torch tensors and
SharedTensors out of band (see zctipc.reductions): what is already zctipc
memory crosses as a descriptor; other buffers are copied once into this
process's pool. The receiver gets views of shared memory.

Differences from multiprocessing.Queue, all in the caller's favour: there is
no feeder thread, so put() has finished when it returns (join_thread and
cancel_join_thread have nothing to wait for), and the bytes of a message
are bounded by max_bytes, the size of the ring.
"""

import io
import pickle
import threading
import time
import weakref
from multiprocessing import context as _mpcontext

from . import _args, _native, reductions
from .errors import HandleClosed
from .pool import wait_slices

__all__ = ["Queue", "SimpleQueue", "JoinableQueue", "DEFAULT_MAX_BYTES"]

#: Default size of a queue's ring, the largest message it takes (pickled,
#: without its out-of-band buffers).
DEFAULT_MAX_BYTES = 16 << 20

_HEADER = 16  # bytes of a record header; a descriptor is at most 32 + 16*32 + 256

#: The most messages get_many takes in one call into the library.
RECORDS_PER_CALL = 256


class _Oversized:
    """An object whose pickle alone fills a run: it is put by itself."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj


class _Failed:
    """An object whose pickling raised: raised again once the objects
    before it are in the queue."""

    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc


class _Scratch(threading.local):
    """Per-thread buffers for taking messages; args holds them in the order
    zct_queue_get takes them after the timeout."""

    def __init__(self):
        ffi = _native.ffi()
        self.typ = ffi.new("int32_t *")
        self.off = ffi.new("uint64_t *")
        self.plen = ffi.new("uint64_t *")
        self.nviews = ffi.new("int32_t *")
        self.put_view = ffi.new("zct_view *")
        self.records = ffi.new("int32_t *")
        self.filled = ffi.new("uint64_t *")
        self.recs = ffi.new("zct_record[]", RECORDS_PER_CALL)
        self.resize(64 << 10, 16)

    def resize(self, cap, vcap):
        ffi = _native.ffi()
        self.cap, self.vcap = cap, vcap
        # The record lands in a bytearray, which Python reads without cffi.
        self.raw = bytearray(cap)
        self.mem = memoryview(self.raw)
        self.buf = ffi.from_buffer(self.raw)
        self.views = ffi.new("zct_view[]", vcap)
        self.args = (self.typ, self.off, self.plen, self.views, vcap, self.nviews)


class Queue:
    """A process-shared FIFO queue with multiprocessing.Queue's API.

    ``maxsize`` bounds the messages in the queue (0: no bound but
    ``max_bytes``); ``max_bytes`` is the size of its ring, and so of the
    largest message (a larger one raises ValueError at put).
    """

    def __init__(self, maxsize=0, *, max_bytes=DEFAULT_MAX_BYTES, ctx=None):
        maxsize = _args.integer("maxsize", maxsize, high=1 << 30)  # 0 or less: no bound, as multiprocessing's
        max_bytes = _args.integer("max_bytes", max_bytes, 4096, 1 << 30)
        ffi, lib = _native.ffi(), _native.lib()
        handle = ffi.new("zct_handle *")
        _native.check(lib.zct_queue_create(ffi.NULL, max_bytes, max(maxsize, 0), handle))
        self._setup(handle[0])

    def _setup(self, handle):
        ffi, lib = _native.ffi(), _native.lib()
        name = ffi.new("char[]", 256)
        capacity = ffi.new("uint64_t *")
        maxsize = ffi.new("uint64_t *")
        _native.check(lib.zct_queue_describe(handle, name, 256, capacity, maxsize))
        self._handle = handle
        self._name = ffi.string(name).decode()
        self._capacity = capacity[0]
        self._maxsize = maxsize[0]
        self._closed = False
        self._scratch = _Scratch()
        self._finalizer = weakref.finalize(self, _native.finalize, "zct_queue_close", handle, "closing a queue")

    @classmethod
    def attach(cls, name, _adopt=False):
        """Open the queue ``name`` that another process made (a Go program,
        say: zctipc.NewQueue), by its full segment name. (A child process
        that unpickles a queue takes over the count its parent added.)"""
        ffi, lib = _native.ffi(), _native.lib()
        handle = ffi.new("zct_handle *")
        _native.check(lib.zct_queue_attach(name.encode(), int(_adopt), handle))
        q = cls.__new__(cls)
        q._setup(handle[0])
        return q

    @property
    def name(self):
        """The queue's full segment name, by which other processes (in any
        language) attach it."""
        return self._name

    def __repr__(self):
        state = "closed" if self._closed else f"qsize={self._qsize()}"
        return f"<{type(self).__name__} {self._name!r} maxsize={self._maxsize} max_bytes={self._capacity} {state}>"

    # -- pickling: only to child processes, like multiprocessing's queues ---

    def __reduce__(self):
        _mpcontext.assert_spawning(self)
        self._check_open()
        # The child takes over this count when it attaches (Note [counts in
        # flight] in zctipc.reductions).
        _native.check(_native.lib().zct_queue_addref(self._handle))
        return _rebuild_queue, (type(self), self._name)

    # -- putting --------------------------------------------------------------

    def put(self, obj, block=True, timeout=None):
        """Put obj into the queue, waiting for room as block and timeout say,
        else raise queue.Full."""
        if self._closed:
            self._check_open()
        if timeout is not None:
            timeout = _args.timeout(timeout)
        lib = _native.lib()
        t = type(obj)
        if t is bytes:
            payload, exports, typ = obj, [], lib.ZCT_RECORD_BYTES
        elif t in reductions.BARE and (e := reductions.export_bare(obj, block, timeout)) is not None:
            # A bare array, tensor or SharedTensor: a tensor record, no pickle.
            payload, exports, typ = b"", [e], lib.ZCT_RECORD_TENSOR
        else:
            payload, exports = self._dumps(obj, block, timeout)
            typ = lib.ZCT_RECORD_PICKLE
        if not exports and len(payload) + _HEADER <= self._capacity:
            # Fast path: one try without waiting; the loop below waits.
            if lib.zct_queue_put(self._handle, typ, payload, len(payload), lib.NULL_VIEWS, 0, 0) == 0:
                return
        self._put(typ, payload, exports, block, timeout)

    def put_nowait(self, obj):
        return self.put(obj, False)

    def put_many(self, objs, block=True, timeout=None):
        """Put the objects in order, as put would one by one, but crossing
        into the library once per run of messages that fit in the queue
        together. block and timeout apply to the whole call; on queue.Full,
        the objects before the one that did not fit are in the queue."""
        if self._closed:
            self._check_open()
        timeout = _args.timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        p = reductions.pickler()
        # Pickle a run of objects into one buffer, one after another, until
        # one has out-of-band buffers (it goes on its own) or the run would
        # not fit in the queue.
        objs = iter(objs)
        pending = None
        while True:
            payloads, ends, single = p.dump_run(objs, self._capacity - _HEADER, block, timeout, pending)
            pending = None
            if ends:
                self._put_batch(payloads, ends, block, deadline)
            if single is None:
                return
            obj, payload, exports = single
            if type(obj) is _Oversized:
                pending = obj.obj  # alone, in the next run
                continue
            if type(obj) is _Failed:
                raise obj.exc
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._put(_native.lib().ZCT_RECORD_PICKLE, payload, exports, block, left)

    def _put_batch(self, data, ends, block, deadline):
        """Put pickled payloads with no buffers (data, split at ends), in as
        few calls as they fit."""
        ffi, lib = _native.ffi(), _native.lib()
        buf = ffi.from_buffer(data)
        written = ffi.new("int32_t *")
        done, count, base = 0, len(ends), 0
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        while done < count:
            rest = ends if done == 0 else [e - base for e in ends[done:]]
            status = _native.E_FULL
            for ms in wait_slices(block, timeout):
                status = lib.zct_queue_put_many(self._handle, lib.ZCT_RECORD_PICKLE, buf + base, rest, count - done, ms,
                                                written)
                if status not in (_native.E_FULL, _native.E_INTERRUPTED):
                    break
            _native.check(status)
            done += written[0]
            base = ends[done - 1]
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())

    @staticmethod
    def _dumps(obj, block, timeout):
        return reductions.pickler().dumps(obj, block, timeout)

    def _put(self, typ, payload, exports, block, timeout):
        ffi, lib = _native.ffi(), _native.lib()
        n = len(exports)
        if n == 1 and len(payload) + _HEADER + 1024 <= self._capacity:
            # Fast path for one buffer (a bare array): one try without waiting.
            view = self._scratch.put_view
            exports[0].fill(view)
            if lib.zct_queue_put(self._handle, typ, payload, len(payload), view, 1, 0) == 0:
                return
        if len(payload) + _HEADER > self._capacity:
            self._release(exports)
            raise ValueError(
                f"the object pickles to {len(payload)} bytes, more than this queue takes "
                f"(max_bytes={self._capacity}); make the queue with a larger max_bytes"
            )
        views = ffi.NULL
        if n:
            views = ffi.new("zct_view[]", n)
            for i, e in enumerate(exports):
                e.fill(views[i])
        status = _native.E_FULL
        try:
            for ms in wait_slices(block, timeout):
                status = lib.zct_queue_put(self._handle, typ, payload, len(payload), views, n, ms)
                if status not in (_native.E_FULL, _native.E_INTERRUPTED):
                    break
        except BaseException:  # Ctrl-C between slices: the refs are still ours
            self._release(exports)
            raise
        if status != 0:
            self._release(exports)
            _native.check(status)

    @staticmethod
    def _release(exports):
        for e in exports:
            e.release()

    # -- getting --------------------------------------------------------------

    def get(self, block=True, timeout=None):
        """Remove and return an object, waiting for one as block and timeout
        say, else raise queue.Empty."""
        if self._closed:
            self._check_open()
        if timeout is not None:
            timeout = _args.timeout(timeout)
        get = _native.lib().zct_queue_get
        s = self._scratch
        # Fast path: one try without waiting; the loop below waits.
        status = get(self._handle, s.buf, s.cap, 0, *s.args)
        if status != 0:
            for ms in wait_slices(block, timeout):
                if status == _native.E_RANGE:
                    s.resize(max(s.cap, s.plen[0]), max(s.vcap, s.nviews[0]))
                elif status not in (_native.E_EMPTY, _native.E_INTERRUPTED):
                    break
                status = get(self._handle, s.buf, s.cap, ms, *s.args)
                if status == 0:
                    break
            _native.check(status)
        return self._decode(s)

    def get_nowait(self):
        return self.get(False)

    def get_many(self, max_items=1 << 30, block=True, timeout=None):
        """Return a list of up to max_items objects (and at most
        RECORDS_PER_CALL), taken in one call into the library: the first
        waited for as get does, then those already behind it."""
        if self._closed:
            self._check_open()
        max_items = _args.integer("max_items", max_items, 1)
        lib = _native.lib()
        s = self._scratch
        records, filled, recs = s.records, s.filled, s.recs
        status = _native.E_EMPTY
        for ms in wait_slices(block, timeout):
            status = lib.zct_queue_get_many(self._handle, s.buf, s.cap, min(max_items, RECORDS_PER_CALL), ms,
                                            records, recs, filled, s.views, s.vcap, s.nviews)
            if status == _native.E_RANGE:
                s.resize(max(s.cap, filled[0]), max(s.vcap, s.nviews[0]))
            elif status not in (_native.E_EMPTY, _native.E_INTERRUPTED):
                break
        _native.check(status)
        out = []
        append, mem, views = out.append, s.mem, s.views
        pickle_type, tensor_type = lib.ZCT_RECORD_PICKLE, lib.ZCT_RECORD_TENSOR
        # One unpickler reads every pickle in place: each stops at its STOP
        # opcode, and memo entries of one are never read by the next.
        stream = io.BytesIO(mem[: filled[0]])
        seek, load = stream.seek, pickle.Unpickler(stream).load
        v = 0
        for i in range(records[0]):
            r = recs[i]
            typ, nviews, off = r.type, r.nviews, r.payload_offset
            if nviews == 0:
                if typ == pickle_type:
                    seek(off)
                    append(load())
                else:
                    append(bytes(mem[off : off + r.payload_len]))
            elif typ == tensor_type:
                append(reductions.build(views[v]))
            else:
                append(reductions.loads(mem[off : off + r.payload_len], [views[v + k] for k in range(nviews)], nviews))
            v += nviews
        return out

    @staticmethod
    def _decode(s):
        # What zct_queue_get said of the record it took.
        typ, nviews, off, plen = s.typ[0], s.nviews[0], s.off[0], s.plen[0]
        lib = _native.lib()
        if typ == lib.ZCT_RECORD_TENSOR:
            return reductions.build(s.views[0])
        data = s.mem[off : off + plen]
        if nviews == 0:
            return bytes(data) if typ == lib.ZCT_RECORD_BYTES else pickle.loads(data)
        return reductions.loads(data, s.views, nviews)

    # -- state ------------------------------------------------------------------

    def _counts(self):
        ffi = _native.ffi()
        items = ffi.new("int64_t[2]")
        _native.check(_native.lib().zct_queue_len(self._handle, items, items + 1))
        return items[0], items[1]

    def _qsize(self):
        return self._counts()[0]

    def qsize(self):
        """The number of messages in the queue now (others may change it)."""
        self._check_open()
        return self._qsize()

    def empty(self):
        self._check_open()
        return self._qsize() == 0

    def full(self):
        self._check_open()
        return self._maxsize > 0 and self._qsize() >= self._maxsize

    def close(self):
        """This process will use the queue no more: put and get raise
        HandleClosed (a ValueError) from now on, here and in calls other
        threads are blocked in, and its hold on the queue goes."""
        if not self._closed:
            self._closed = True
            self._finalizer()

    def join_thread(self):
        """Nothing to wait for: put() returns when the object is in the queue.
        Like multiprocessing's, only valid after close()."""
        if not self._closed:
            raise ValueError(f"join_thread() needs close() first: {self!r}")

    def cancel_join_thread(self):
        """Nothing to cancel: there is no feeder thread."""

    def _check_open(self):
        if self._closed:
            raise HandleClosed(f"Queue {self._name!r} is closed")


class JoinableQueue(Queue):
    """A Queue whose consumers mark each message done, so that producers
    can join() until all are."""

    def task_done(self):
        """Mark one message taken from the queue as done; ValueError when
        called more often than messages were put."""
        self._check_open()
        status = _native.lib().zct_queue_task_done(self._handle)
        if status == _native.E_INVALID:
            raise ValueError("task_done() called too many times")
        _native.check(status)

    def join(self):
        """Wait until every message put was marked done."""
        self._check_open()
        lib = _native.lib()
        for ms in wait_slices(True, None):
            status = lib.zct_queue_join(self._handle, ms)
            if status not in (_native.E_FULL, _native.E_INTERRUPTED):
                _native.check(status)
                return


class SimpleQueue(Queue):
    """multiprocessing.SimpleQueue's API (get, put, empty, close) over the
    same ring, without a bound on the number of messages."""

    def __init__(self, *, max_bytes=DEFAULT_MAX_BYTES, ctx=None):
        super().__init__(0, max_bytes=max_bytes, ctx=ctx)

    def put(self, obj):
        super().put(obj)

    def get(self):
        return super().get()


def _rebuild_queue(cls, name):
    return cls.attach(name, _adopt=True)
