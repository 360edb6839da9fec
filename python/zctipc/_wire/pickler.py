"""The queue pickler: whole objects pickled (protocol 5) for a zctipc
queue, with every NumPy array, CPU torch storage and SharedTensor inside
them out of band: each goes as an Export whose descriptor travels in the
record beside the pickle, which refers to it by index. A CPU torch tensor
goes as its storage and where it lies in it, so that the tensors of one
storage arrive over one storage, shared with the sender
(zctipc._wire.storages). Arrow tables and CUDA tensors go by their codecs.

Note [counts in flight]: a descriptor carries one count on its memory,
added when it is made. Whoever unpickles it first takes that count over;
unpickling the same bytes again raises DescriptorTaken and takes nothing
(Note [a count is taken once] in go/internal/pool/ticket.go); a descriptor that is
never unpickled keeps its memory until the cleanup of its segment (the
queue's last holder drains unread messages).
"""

from __future__ import annotations

import copyreg
import pickle
import sys
import threading

from .._core import memory
from ..errors import CorruptHeader
from . import exports, reductions

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any, TypeAlias

    import torch

    from .exports import Export

    #: A pickle reduction, as __reduce__ returns one: (rebuild, its arguments, ...), or a global's name.
    Reduction: TypeAlias = tuple[Any, ...] | str
    #: What dump_run says of the object that ended a run, if one did.
    Single: TypeAlias = tuple[object, bytes | None, list[Export]] | None


class Oversized:
    """An object whose pickle alone fills a run: it is put by itself."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj


class Failed:
    """An object whose pickling raised: raised again once the objects
    before it are in the queue."""

    __slots__ = ("exc",)

    def __init__(self, exc: Exception) -> None:
        self.exc = exc


_receiving = threading.local()
_sending = threading.local()


# Note [a buffer index]: a pickle names each of its buffers by its index
# among its message's views, and the view of index i is read at byte
# at + i * VIEW_SIZE of the views' bytes, which hold the messages before
# it too (get_many) or views left from an earlier get. A negative index,
# which only a forged pickle holds, would read one of those: an array over
# memory whose count another message's array holds, released twice once
# both are collected (the memory then freed under the other). So it is
# refused, as an index past the message's last is.


def _rebuild(index: int, requires_grad: bool = False) -> Any:
    """Unpickle the buffer at index of the message being received."""
    ctx = _receiving.ctx
    try:
        if index < 0:  # the list would take it from its end (Note [a buffer index])
            raise IndexError
        obj = ctx.objects[index]
    except IndexError:
        raise CorruptHeader(f"malformed message: its pickle asks for buffer {index} of {len(ctx.objects)}") from None
    if obj is None:
        obj = ctx.objects[index] = exports.build(ctx.views, ctx.at + index * memory.VIEW_SIZE)
    if requires_grad:
        obj.requires_grad_()
    return obj


def _rebuild_storage(index: int) -> torch.UntypedStorage:
    """Unpickle the torch storage at index of the message being received
    (the pickle's memo gives every tensor of it the same one)."""
    return _rebuild(index).untyped_storage()


# Note [the memo]: a pickler's memo holds a reference to every object it
# has pickled, and clear_memo() drops them one by one before it empties the
# table. An object freed there may run code that lets the garbage collector
# in (a tensor's storage deleter, say), and the collector walks the
# pickler's half-cleared memo. So the memo is emptied right after each
# dump, while the caller still holds the object: nothing it holds dies
# there, and no message's objects outlive its put.


class QueuePickler(reductions.Channel):
    """Pickles objects for a queue, with their arrays, tensors and
    SharedTensors out of band, by the table of reducers (Note [one table of
    reducers] in zctipc._wire.reductions), as the channel whose buffers go
    beside the pickle; kept between messages, since making a pickler costs
    more than pickling a small object."""

    def __init__(self) -> None:
        # The pickler hands what it wrote to its file's write() at the end of
        # each dump (and at each 64 KiB frame of a large one): into a list.
        self.chunks: list[bytes] = []
        self.pickler = pickle.Pickler(_Sink(self.chunks.append), pickle.HIGHEST_PROTOCOL)
        table: dict[type[Any], Callable[[Any], Reduction]] = dict(copyreg.dispatch_table)
        table.update(reductions.bound(self))
        self.pickler.dispatch_table = table
        self.modules = reductions.modules()
        self.nmodules = len(sys.modules)
        self.busy = False
        self.exports: list[Export] = []
        self.block: bool = True
        self.timeout: float | None = None
        self.inline: int = -1
        self.in_band: exports.InBand | None = None

    def current(self) -> bool:
        """Whether this pickler still fits: no module it knows types of
        (torch, pyarrow, pandas, polars) imported since. Looked at only when
        the number of modules changed."""
        if self.nmodules != len(sys.modules):
            if self.modules != reductions.modules():
                return False
            self.nmodules = len(sys.modules)
        return True

    def dumps(
        self,
        obj: object,
        block: bool = True,
        timeout: float | None = None,
        inline: int = -1,
        in_band: exports.InBand | None = None,
    ) -> tuple[bytes, list[Export]]:
        """Pickle obj with this pickler, as the module's dumps says."""
        return dumps(obj, block, timeout, inline, in_band, self)

    def _begin(
        self, block: bool, timeout: float | None, inline: int, in_band: exports.InBand | None = None
    ) -> list[Export]:
        """Start pickling, with how exports wait for pool buffers and the
        arrays that go in band; returns the list the exports go to."""
        self.busy = True
        out: list[Export]
        self.exports = out = []
        self.block, self.timeout, self.inline, self.in_band = block, timeout, inline, in_band
        self.chunks.clear()
        return out

    def _take(self) -> bytes:
        """The pickle just dumped."""
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        return data

    def _dump(self, obj: object) -> None:
        """Pickle obj and empty the memo while obj is still held (see
        Note [the memo])."""
        try:
            self.pickler.dump(obj)
        finally:
            self.pickler.clear_memo()

    def dump_run(
        self,
        objs: Iterator[object],
        limit: int,
        block: bool,
        timeout: float | None,
        first: object = None,
        inline: int = -1,
    ) -> tuple[bytes, list[int], Single]:
        """Pickle objects from the iterator objs (after first, when given)
        one after another into one buffer, stopping at the first whose
        pickle has out-of-band buffers or would take the run past limit
        bytes. Returns (buffer, [end of each pickle], single): single is
        (obj, pickle, exports) for an object with buffers, (Oversized(obj),
        None, []) for one that did not fit, (Failed(exc), None, []) for one
        whose pickling raised exc after others were pickled, or None when
        objs ran out."""
        out = self._begin(block, timeout, inline)
        dump, take = self._dump, self._take
        pickles: list[bytes] = []
        ends: list[int] = []
        total = 0
        try:
            for obj in objs if first is None else _chain(first, objs):
                try:
                    dump(obj)
                except Exception as exc:
                    if not ends:
                        raise
                    # The objects before it go first, as puts one by one would.
                    exports.release_all(out)
                    out.clear()
                    return b"".join(pickles), ends, (Failed(exc), None, [])
                payload = take()
                if out:
                    single, self.exports = (obj, payload, out), []
                    return b"".join(pickles), ends, single
                if total + len(payload) > limit and ends:
                    return b"".join(pickles), ends, (Oversized(obj), None, [])
                pickles.append(payload)
                total += len(payload)
                ends.append(total)
            return b"".join(pickles), ends, None
        except BaseException:
            exports.release_all(out)
            raise
        finally:
            self.chunks.clear()
            self.busy = False

    def send(self, e: Export, obj: Any) -> Reduction:
        """e goes beside the pickle, which refers to it by its index; it is
        released with the others if the message is not sent."""
        self.exports.append(e)
        return _rebuild, (len(self.exports) - 1,)

    def send_storage(self, e: Export) -> Reduction:
        self.exports.append(e)
        return _rebuild_storage, (len(self.exports) - 1,)


def _chain(first: object, rest: Iterable[object]) -> Iterator[object]:
    yield first
    yield from rest


class _Sink:
    """A file for a pickler whose write() is given."""

    __slots__ = ("write",)

    def __init__(self, write: Callable[[bytes], object]) -> None:
        self.write = write


def pickler() -> QueuePickler:
    """A QueuePickler this thread may use now."""
    p = getattr(_sending, "pickler", None)
    if p is None or p.nmodules != len(sys.modules) and not p.current():
        p = _sending.pickler = QueuePickler()
    return QueuePickler() if p.busy else p


def dumps(
    obj: object,
    block: bool = True,
    timeout: float | None = None,
    inline: int = -1,
    in_band: exports.InBand | None = None,
    p: QueuePickler | None = None,
) -> tuple[bytes, list[Export]]:
    """Pickle obj for a queue with p, by default the pickler() this thread
    may use now: (pickle bytes, [Export, ...]). NumPy arrays of inline
    bytes or fewer (-1: none) that are not zctipc memory are pickled in
    band (Note [inline arrays] in zctipc._wire.exports), and so are larger
    ones that in_band, when given, finds no pool buffer for (Note [sending
    in band when shared memory is full] there). On failure every buffer
    already exported is released. Once per message (a put's): what it
    calls is written out, pickler() and _begin among them."""
    if p is None:
        try:
            p = _sending.pickler
        except AttributeError:
            p = None
        if p is None or p.busy or p.nmodules != len(sys.modules):
            p = pickler()  # a fresh one, or this one once it is found current
    # _begin (chunks is empty: every dump leaves it so).
    p.busy = True
    out: list[Export] = []
    p.exports = out
    p.block, p.timeout, p.inline, p.in_band = block, timeout, inline, in_band
    chunks = p.chunks
    try:
        p.pickler.dump(obj)
        return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), out
    except BaseException:
        exports.release_all(out)
        raise
    finally:
        p.pickler.clear_memo()  # Note [the memo]
        chunks.clear()
        p.busy = False


class _Receiving:
    __slots__ = ("views", "at", "objects")

    views: Any  # the bytes of zct_view structs
    at: int  # where the message's first is in them
    objects: list[Any]


def loads(data: bytes | memoryview, views: Any, at: int, nviews: int) -> Any:
    """Unpickle a queue message whose buffers are the nviews zct_views from
    byte at of views (their bytes: Note [reading a view at once] in
    zctipc._core.memory). A buffer the pickle does not use is released."""
    if nviews == 0:
        return pickle.loads(data)
    if not memory.VIEW_SIZE:
        memory.view_layout()
    ctx = _Receiving()
    ctx.views, ctx.at = views, at
    ctx.objects = [None] * nviews
    saved = getattr(_receiving, "ctx", None)
    _receiving.ctx = ctx
    try:
        return pickle.loads(data)
    finally:
        _receiving.ctx = saved
        for i in range(nviews):
            if ctx.objects[i] is None:
                memory.release_ref(memory.view_ref(views, at + i * memory.VIEW_SIZE))
