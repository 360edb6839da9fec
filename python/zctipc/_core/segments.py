"""Segments that hold one array (tensor segments, and tables' segments),
their SharedTensor handle, and the census of every segment of this user.

A :class:`SharedTensor` and every view made from it (a NumPy array, a torch
tensor, a DLPack capsule) hold the segment's mapping: it stays valid while any
of them lives, and goes when the last one goes. Across processes, each process
that holds a segment counts once in the refcount in its header, and the last
process to let go unlinks it from /dev/shm.
"""

from __future__ import annotations  # annotations name np.ndarray without importing NumPy

import json
from typing import NamedTuple, Optional, Tuple

from ..errors import HandleClosed, InvalidArgument
from . import device, dtypes, layout, lazy, log, memory, native

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    import numpy as np
    import torch
    from numpy.typing import DTypeLike, NDArray
    from typing_extensions import CapsuleType, Self
else:
    np = lazy.numpy(__name__)


class SharedTensor:
    """A tensor that lives in a zctipc shared-memory segment.

    Made by :func:`create_shared_tensor` (which holds the creator's
    reference) or :func:`attach_shared_tensor`. ``numpy()`` and ``torch()``
    return zero-copy views; ``close()`` lets go of this object's hold, while
    views made from it keep the memory valid until they are gone too.

    Pickling a SharedTensor sends its name; the receiver attaches it. The
    sender must keep holding the segment until the receiver has attached.
    """

    __slots__ = ("_memory", "_handle", "_name", "_shape", "_strides", "_code", "_nbytes", "_readonly", "__weakref__")

    _memory: Any  # the owner (a cffi pointer), None once closed
    _handle: int
    _name: str
    _shape: tuple[int, ...]
    _strides: tuple[int, ...]
    _code: int
    _nbytes: int
    _readonly: bool

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("use zctipc.create_shared_tensor() or zctipc.attach_shared_tensor()")

    @classmethod
    def _wrap(cls, handle: int, info: Any, made: bool = False) -> Self:
        ffi = native.ffi()
        self = object.__new__(cls)
        ndim = info.ndim
        self._handle = handle
        self._name = ffi.string(info.name).decode()
        self._shape = tuple(info.shape[0:ndim])
        self._strides = tuple(info.strides[0:ndim])
        self._code = info.dtype
        self._nbytes = info.nbytes
        self._readonly = bool(info.readonly)
        # The handle closes when this pointer is collected: it is held by the
        # SharedTensor and, through the buffers, by every view. The log
        # follows the segments this process made, from making to letting
        # go; those it attached (one a message, for a receiver of
        # SharedTensors) it leaves alone.
        self._memory = memory.owner(
            info.data, "zct_segment_close", handle, "closing a segment handle", self._name if made else None
        )
        if made and log.enabled():
            log.logger().debug(
                "made segment %s: %s%s, %d bytes", self._name, dtypes.NAMES[self._code], list(self._shape), self._nbytes
            )
        return self

    # -- description ------------------------------------------------------

    @property
    def name(self) -> str:
        """The segment's full name (with the ``zctipc_`` prefix)."""
        return self._name

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._shape

    @property
    def strides(self) -> Tuple[int, ...]:
        """Byte strides, as NumPy reports them."""
        return self._strides

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def dtype(self) -> np.dtype[Any] | str:
        """A NumPy dtype; for bfloat16 without ml_dtypes, the string 'bfloat16'."""
        return dtypes.public_dtype(self._code)

    @property
    def dtype_name(self) -> str:
        """The element type's name, as NumPy and torch spell it."""
        return dtypes.NAMES[self._code]

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def readonly(self) -> bool:
        """Whether this process mapped the data read-only."""
        return self._readonly

    @property
    def closed(self) -> bool:
        return self._memory is None

    @property
    def refcount(self) -> int:
        """How many holders the segment has now, across all processes."""
        memory = self._live()  # noqa: F841  (held: another thread may close meanwhile)
        out = native.ffi().new("int64_t *")
        native.check(native.lib().zct_segment_refcount(self._handle, out))
        return out[0]

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"refcount={self.refcount}"
        ro = ", readonly" if self._readonly else ""
        return (
            f"SharedTensor(name={self._name!r}, shape={self._shape}, dtype={self.dtype_name}, "
            f"nbytes={self._nbytes}{ro}, {state})"
        )

    # -- views ------------------------------------------------------------

    def numpy(self) -> NDArray[Any]:
        """A NumPy array that is a view of the shared memory (no copy)."""
        return memory.ndarray(
            self._live(), self._nbytes, dtypes.numpy_dtype(self._code), self._shape, self._strides, self._readonly
        )

    def torch(self) -> torch.Tensor:
        """A CPU torch tensor that is a view of the shared memory (no copy)."""
        arr = memory.ndarray(
            self._live(), self._nbytes, dtypes.storage_dtype(self._code), self._shape, self._strides, self._readonly
        )
        return memory.tensor(arr, self._code, self._readonly)

    def ref(self) -> dict[str, Any]:
        """The tensor's TensorRef: a JSON-ready description (segment, dtype,
        shape, strides, offset, bytes, device) that a process in any language
        attaches the same memory with (Go: zctipc.AttachRef; Python:
        :func:`attach_ref`)."""
        self._live()
        return {
            "id": self._name.removeprefix("zctipc_"),
            "segment": self._name,
            "dtype": self.dtype_name,
            "shape": list(self._shape),
            "strides": list(self._strides),
            "offset": 0,
            "nbytes": self._nbytes,
            "device": "cpu",
        }

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> NDArray[Any]:
        arr = self.numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError(f"a {np.dtype(dtype)} array of a {arr.dtype} SharedTensor needs a copy")
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType:
        """Export as DLPack (CPU memory); the capsule holds the segment. A
        consumer that asks for max_version (1, 0) or later gets a versioned
        capsule ("dltensor_versioned", read-only flagged for a read-only
        mapping); one that does not gets the legacy capsule, which cannot
        say read-only, so a read-only segment refuses it (BufferError). A
        read-only bfloat16 segment goes through torch, which cannot say
        read-only either: it refuses every export but a copy.
        stream must be None on the CPU."""
        if stream is not None:
            raise InvalidArgument(f"a CPU tensor takes no DLPack stream, not {stream!r}")
        kwargs = device.dlpack_keywords(max_version, dl_device, copy)
        bfloat16 = self._code == dtypes.BFLOAT16
        if bfloat16 and self._readonly and not copy:
            self._live()  # a closed handle says so first
            # torch has no read-only tensors: its capsules, legacy or
            # versioned, would say the PROT_READ mapping is writable.
            raise BufferError("a read-only bfloat16 segment is exported to DLPack only as a copy (copy=True)")
        arr: Any = self.torch() if bfloat16 else self.numpy()  # a tensor or an array, the same calls below
        try:
            return arr.__dlpack__(**kwargs)
        except TypeError:
            if not kwargs:
                raise
        # NumPy before 2.1 and older torch (2.2) take none of these keywords:
        # the legacy capsule, a version below any max_version asked for (the
        # standard allows it), over a copy when one was asked for.
        if dl_device not in (None, (1, 0)):
            raise BufferError(f"a CPU tensor cannot be exported to DLPack device {dl_device}")
        if copy:
            arr = arr.clone() if bfloat16 else arr.copy()
        return arr.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0

    # -- lifetime ---------------------------------------------------------

    def close(self) -> None:
        """Let go of this object's hold on the segment. Views made from it
        stay valid; the segment is released when they are gone too. Closing
        twice does nothing."""
        self._memory = None

    def unlink(self) -> None:
        """Remove the segment's name now, so no one else can attach it.
        Holders keep their memory until they let go. A receiver finds a
        segment by its name, so sending it afterwards (a queue, a pickle)
        raises SegmentNotFound."""
        unlink(self._name)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Callable[[str, bool], SharedTensor], tuple[str, bool]]:
        self._live()
        return attach_tensor, (self._name, self._readonly)

    def _live(self) -> Any:
        memory = self._memory
        if memory is None:
            raise HandleClosed(f"SharedTensor {self._name!r} is closed")
        return memory


def create(
    name: str | None,
    code: int,
    shape: tuple[int, ...],
    fill: Callable[[SharedTensor], object] | None = None,
    kind: int | None = None,
) -> SharedTensor:
    """A new tensor segment (or, with fill, a segment of kind, a zct_kind)
    of type code and shape, as a SharedTensor (name None: a random one):
    zeroed, or written by fill, which must write every byte. With fill the
    data is not zeroed first, and a large segment may be made from pages
    this process let go, faster than from fresh ones; the segment gets its
    name only once fill returns, so no process attaches it before its
    contents are complete (Note [a name appears with its contents] in
    go/internal/shm/create.go). When fill raises, the segment is removed."""
    ffi, lib = native.ffi(), native.lib()
    handle = ffi.new("zct_handle *")
    info = ffi.new("zct_info *")
    dims = ffi.new("int64_t[]", shape) if shape else ffi.NULL
    cname = ffi.NULL if name is None else layout.segment_name(name)
    if fill is None:
        native.check(lib.zct_segment_create(cname, code, len(shape), dims, handle, info))
        return SharedTensor._wrap(handle[0], info, made=True)
    kind = lib.ZCT_KIND_TENSOR if kind is None else kind
    native.check(lib.zct_segment_create_uninit(cname, kind, code, len(shape), dims, handle, info))
    tensor = SharedTensor._wrap(handle[0], info, made=True)
    try:
        fill(tensor)
        native.check(lib.zct_segment_publish(tensor._handle))
    except BaseException:
        tensor.close()  # unpublished: closing removes it
        raise
    return tensor


def attach(name: str, kind: int, readonly: bool = False) -> SharedTensor:
    """The segment name of the given kind (a zct_kind), as a SharedTensor."""
    ffi, lib = native.ffi(), native.lib()
    handle = ffi.new("zct_handle *")
    info = ffi.new("zct_info *")
    native.check(lib.zct_segment_attach(layout.segment_name(name), kind, 1 if readonly else 0, handle, info))
    return SharedTensor._wrap(handle[0], info)


def attach_tensor(name: str, readonly: bool = False) -> SharedTensor:
    """The tensor segment name, as a SharedTensor."""
    return attach(name, native.lib().ZCT_KIND_TENSOR, readonly)


def unlink(name: str) -> None:
    """Remove the name of segment name now; holders keep their memory."""
    native.check(native.lib().zct_segment_unlink(name.encode()))


class SegmentInfo(NamedTuple):
    """One library segment as :func:`list_segments` sees it."""

    name: str
    kind: str
    dtype: Optional[str]
    shape: Optional[Tuple[int, ...]]
    nbytes: int
    file_size: int
    creator_pid: int
    refcount: int
    created: float  # Unix time, seconds
    error: Optional[str]  # why the header is not valid, or None
    creator_alive: bool = False
    holders: Tuple[int, ...] = ()  # pids of live processes whose ledgers hold it
    messages: int = 0  # descriptors waiting in live queues that name it
    tracked: bool = False  # its creator recorded its counts for the cleanup daemon


def list_segments() -> list[SegmentInfo]:
    """Every zctipc segment of this user, whoever holds it: the files in
    /dev/shm, and the memfd segments the cleanup daemon keeps.

    A file with the library's prefix whose header is not valid (or a segment
    being made) is listed with ``error`` saying why.
    """
    lib = native.lib()
    out = []
    for s in json.loads(native.read_text(lib.zct_census)):
        out.append(
            SegmentInfo(
                name=s["name"],
                kind=s["kind"] if "error" not in s else "unknown",
                dtype=dtypes.NAMES.get(s.get("dtype")),
                shape=tuple(s["shape"] or ()) if "error" not in s else None,
                nbytes=s.get("nbytes", 0),
                file_size=s["size"],
                creator_pid=s.get("creator_pid", 0),
                refcount=s["refcount"],
                created=s["created_ns"] / 1e9,
                error=s.get("error"),
                creator_alive=s["creator_alive"],
                holders=tuple(s["holders"]),
                messages=s["messages"],
                tracked=s["tracked"],
            )
        )
    return out


def cleanup_all_segments() -> int:
    """Let go of every segment this process holds, unlinking those that no
    other process holds, and return how many there were.

    Mappings stay in place, so arrays still in use stay valid; use this at
    the end of a process (zctipc also does it at exit).
    """
    return native.release_all()
