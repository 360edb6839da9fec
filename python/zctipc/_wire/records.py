"""A queue's records as Python reads them: the framing facts of zctipc.h
(read from the library once it is loaded), the buffers a get takes records
into (Scratch), and the object a record decodes to (decode). zctipc.queues
writes records and takes them through these; zctipc tail (zctipc.observe)
peeks at them into a Scratch, and decodes them itself (Note [unpickling what
passes] there).
"""

from __future__ import annotations

from .._core import native, wait
from . import exports, pickler

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any

# Note [framing from the library]: what Python needs of a record's framing
# is zctipc.h's, read from the library once it is loaded (read_framing,
# before the first queue is set up) into these globals, which the hot paths
# read as plain ints (zctipc.queues binds copies as its own globals, which
# its put and get read faster): the record types (ZCT_RECORD_*), the bytes
# of a record's header (a descriptor adds at most 32 + 16*32 + 2*256 more,
# and a payload right after it means no descriptor), and how zct_queue_take
# packs what it took (ZCT_TAKE_*). What a record holds comes decoded
# through the library: the number of its views, an inline record's array
# as a view (Note [inline arrays] in zctipc._wire.exports).
PICKLE = TENSOR = BYTES = INLINE = -1
HEADER = 0
FIELD_MASK = OFFSET_SHIFT = TYPE_SHIFT = 0


def read_framing() -> None:
    """Read the framing facts of zctipc.h from the library (Note [framing
    from the library])."""
    global PICKLE, TENSOR, BYTES, INLINE, HEADER, FIELD_MASK, OFFSET_SHIFT, TYPE_SHIFT
    lib = native.lib()
    PICKLE, TENSOR = lib.ZCT_RECORD_PICKLE, lib.ZCT_RECORD_TENSOR
    BYTES, INLINE = lib.ZCT_RECORD_BYTES, lib.ZCT_RECORD_INLINE
    HEADER = lib.ZCT_RECORD_HEADER
    FIELD_MASK, OFFSET_SHIFT = lib.ZCT_TAKE_FIELD_MASK, lib.ZCT_TAKE_OFFSET_SHIFT
    TYPE_SHIFT = lib.ZCT_TAKE_TYPE_SHIFT


#: The most messages get_many takes in one call into the library.
RECORDS_PER_CALL = 256


class Scratch:
    """Buffers for taking messages: a get takes one from its queue's free
    list and gives it back, so that threads never share one. (zctipc tail
    peeks into one of its own: zct_queue_peek fills what a get fills.)
    A queue's scratch holds the arguments of its first zct_queue_take
    ready-made, as the take of a get that waits briefly (take_brief) or
    not at all (take_now): a get passes one tuple as it is."""

    __slots__ = (
        "handle",
        "take_now",
        "take_brief",
        "cap",
        "vcap",
        "raw",
        "mem",
        "buf",
        "views",
        "typ",
        "off",
        "plen",
        "nviews",
        "records",
        "filled",
        "recs",
        "put_view",
        "vbuf",
        "payload",
    )

    def __init__(self, handle: int = 0) -> None:
        self.handle = handle  # the queue's (0: one that takes nothing)
        if HEADER == 0:
            read_framing()
        ffi = native.ffi()
        self.typ = ffi.new("int32_t *")
        self.off = ffi.new("uint64_t *")
        self.plen = ffi.new("uint64_t *")
        self.nviews = ffi.new("int32_t *")
        self.put_view = ffi.new("zct_view *")
        self.records = ffi.new("int32_t *")
        self.filled = ffi.new("uint64_t *")
        self.recs = ffi.new("zct_record[]", RECORDS_PER_CALL)
        self.resize(64 << 10, 16)

    def resize(self, cap: int, vcap: int) -> None:
        ffi = native.ffi()
        self.cap, self.vcap = cap, vcap
        # The record lands in a bytearray, which Python reads without cffi.
        self.raw = bytearray(cap)
        self.mem = memoryview(self.raw)
        self.payload = self.mem[HEADER:]  # where a record with no descriptor has its payload
        self.buf = ffi.from_buffer(self.raw)
        self.views = ffi.new("zct_view[]", vcap)
        self.vbuf = ffi.buffer(self.views)  # the views as bytes (Note [reading a view at once] in exports)
        takes = self.handle, self.buf, cap, self.views, vcap, self.nviews
        self.take_now = (*takes[:3], 0, *takes[3:])
        self.take_brief = (*takes[:3], wait.BRIEF_MS, *takes[3:])

    def get_args(self) -> tuple[Any, ...]:
        """zct_queue_get's arguments after the timeout."""
        return self.typ, self.off, self.plen, self.views, self.vcap, self.nviews


def decode(mem: memoryview, typ: int, off: int, plen: int, views: Any, at: int, nviews: int) -> Any:
    """The object of a record taken into mem whose payload is at off, plen
    bytes, with the nviews views from byte at of views (their bytes: Note
    [reading a view at once] in zctipc._core.memory); gets read a plain
    pickle and an inline array themselves."""
    if typ == BYTES:
        return bytes(mem[off : off + plen])
    if typ == TENSOR:
        return exports.build(views, at)
    return pickler.loads(mem[off : off + plen], views, at, nviews)
