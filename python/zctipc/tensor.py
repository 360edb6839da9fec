"""Shared tensors: zctipc segments that each hold one n-dimensional array.

A :class:`SharedTensor` and every view made from it (a NumPy array, a torch
tensor, a DLPack capsule) hold the segment's mapping: it stays valid while any
of them lives, and goes when the last one goes. Across processes, each process
that holds a segment counts once in the refcount in its header, and the last
process to let go unlinks it from /dev/shm.
"""

import json
import operator
from typing import NamedTuple, Optional, Tuple

import numpy as np

from . import _dtypes, _native, _views
from .errors import HandleClosed, InvalidArgument

__all__ = [
    "SharedTensor",
    "SegmentInfo",
    "create_shared_tensor",
    "attach_shared_tensor",
    "share",
    "attach_ref",
    "list_segments",
    "cleanup_all_segments",
]

_KIND_TENSOR = 1


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

    def __init__(self, *args, **kwargs):
        raise TypeError("use zctipc.create_shared_tensor() or zctipc.attach_shared_tensor()")

    @classmethod
    def _wrap(cls, handle, info):
        ffi = _native.ffi()
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
        # SharedTensor and, through the buffers, by every view.
        self._memory = _views.owner(info.data, "zct_segment_close", handle, "closing a segment handle")
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
    def dtype(self):
        """A NumPy dtype; for bfloat16 without ml_dtypes, the string 'bfloat16'."""
        return _dtypes.public_dtype(self._code)

    @property
    def dtype_name(self) -> str:
        """The element type's name, as NumPy and torch spell it."""
        return _dtypes.NAMES[self._code]

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
        out = _native.ffi().new("int64_t *")
        _native.check(_native.lib().zct_segment_refcount(self._handle, out))
        return out[0]

    def __repr__(self):
        state = "closed" if self.closed else f"refcount={self.refcount}"
        ro = ", readonly" if self._readonly else ""
        return (
            f"SharedTensor(name={self._name!r}, shape={self._shape}, dtype={self.dtype_name}, "
            f"nbytes={self._nbytes}{ro}, {state})"
        )

    # -- views ------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """A NumPy array that is a view of the shared memory (no copy)."""
        return _views.ndarray(self._live(), self._nbytes, _dtypes.numpy_dtype(self._code), self._shape, self._strides, self._readonly)

    def torch(self):
        """A CPU torch tensor that is a view of the shared memory (no copy)."""
        arr = _views.ndarray(self._live(), self._nbytes, _dtypes.storage_dtype(self._code), self._shape, self._strides, self._readonly)
        return _views.tensor(arr, self._code, self._readonly)

    def ref(self) -> dict:
        """The tensor's TensorRef: a JSON-ready description (segment, dtype,
        shape, strides, offset, bytes, device) that a process in any language
        attaches the same memory with (Go: zctipc.AttachRef; Python:
        :func:`attach_ref`)."""
        self._live()
        return {"id": self._name.removeprefix("zctipc_"), "segment": self._name, "dtype": self.dtype_name,
                "shape": list(self._shape), "strides": list(self._strides), "offset": 0, "nbytes": self._nbytes,
                "device": "cpu"}

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError(f"a {np.dtype(dtype)} array of a {arr.dtype} SharedTensor needs a copy")
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __dlpack__(self, **kwargs):
        """Export as DLPack (CPU memory); the capsule holds the segment."""
        if self._code == _dtypes.BFLOAT16:
            return self.torch().__dlpack__(**kwargs)
        return self.numpy().__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0

    # -- lifetime ---------------------------------------------------------

    def close(self):
        """Let go of this object's hold on the segment. Views made from it
        stay valid; the segment is released when they are gone too. Closing
        twice does nothing."""
        self._memory = None

    def unlink(self):
        """Remove the segment's name now, so no one else can attach it.
        Holders keep their memory until they let go."""
        _native.check(_native.lib().zct_segment_unlink(self._name.encode()))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        self._live()
        return attach_shared_tensor, (self._name, self._readonly)

    def _live(self):
        memory = self._memory
        if memory is None:
            raise HandleClosed(f"SharedTensor {self._name!r} is closed")
        return memory


def _cname(name):
    if not isinstance(name, str):
        raise InvalidArgument(f"a segment name is a str, not {type(name).__name__}")
    if not name:
        raise InvalidArgument("segment name is empty; pass name=None for a random name")
    if "\0" in name:
        raise InvalidArgument(f"segment name {name!r} contains a NUL character")
    return name.encode()


def _shape_tuple(shape):
    try:
        dims = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise InvalidArgument(f"shape must be an int or a sequence of ints, not {shape!r}") from None
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"shape {dims} has a negative dimension")
    return dims


def _create(name, code, shape):
    ffi, lib = _native.ffi(), _native.lib()
    handle = ffi.new("zct_handle *")
    info = ffi.new("zct_info *")
    dims = ffi.new("int64_t[]", shape) if shape else ffi.NULL
    cname = ffi.NULL if name is None else _cname(name)
    _native.check(lib.zct_segment_create(cname, code, len(shape), dims, handle, info))
    return SharedTensor._wrap(handle[0], info)


def _is_torch_tensor(obj):
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "device")


def create_shared_tensor(name=None, data=None, shape=None, dtype=None) -> SharedTensor:
    """Create a segment and return the :class:`SharedTensor` that owns it.

    ``name`` gets the ``zctipc_`` prefix (a random 128-bit name when None);
    an existing segment of that name is never reused (:class:`SegmentExists`).
    With ``data`` (a NumPy array, a CPU torch tensor, or anything
    ``np.asarray`` takes) the segment gets its shape and type and one copy of
    its contents, in C order whatever its strides; ``dtype`` then casts.
    Without ``data``, ``shape`` is required and ``dtype`` defaults to float32;
    the memory starts zeroed.
    """
    if data is None:
        if shape is None:
            raise InvalidArgument("create_shared_tensor needs data, or a shape (and a dtype)")
        return _create(name, _dtypes.code_of(np.float32 if dtype is None else dtype), _shape_tuple(shape))

    if _is_torch_tensor(data):
        if data.device.type != "cpu":
            raise InvalidArgument(f"a tensor on {data.device} is not in host memory; move it with .cpu() first")
        data = data.detach()
        code = _dtypes.code_of(data.dtype if dtype is None else dtype)
    else:
        if not isinstance(data, np.ndarray):
            data = np.asarray(data, dtype=None if dtype is None else _dtypes.numpy_dtype(_dtypes.code_of(dtype)))
        code = _dtypes.code_of_numpy(data.dtype) if dtype is None else _dtypes.code_of(dtype)
    dims = tuple(data.shape)
    if shape is not None and _shape_tuple(shape) != dims:
        raise InvalidArgument(f"shape {tuple(shape)} does not match the data's shape {dims}")

    tensor = _create(name, code, dims)
    try:
        _copy_into(tensor, data, code)
    except BaseException:
        tensor.unlink()
        tensor.close()
        raise
    return tensor


def _copy_into(tensor, data, code):
    if _is_torch_tensor(data) or code == _dtypes.BFLOAT16:
        import torch

        src = data if _is_torch_tensor(data) else torch.from_numpy(np.ascontiguousarray(data))
        tensor.torch().copy_(src)
    else:
        np.copyto(tensor.numpy(), data, casting="unsafe")


def attach_shared_tensor(name, readonly=False) -> SharedTensor:
    """Attach the tensor segment ``name`` (with or without the prefix).

    With ``readonly`` the data is mapped read-only in this process. Raises
    :class:`SegmentNotFound`, :class:`PermissionDenied` (another owner, or a
    mode other than 0600), :class:`NotAZctipcSegment`, :class:`CorruptHeader`
    or :class:`IncompatibleVersion` when the segment cannot be trusted.
    """
    ffi, lib = _native.ffi(), _native.lib()
    handle = ffi.new("zct_handle *")
    info = ffi.new("zct_info *")
    _native.check(lib.zct_segment_attach(_cname(name), _KIND_TENSOR, 1 if readonly else 0, handle, info))
    return SharedTensor._wrap(handle[0], info)


def attach_ref(ref, readonly=False, torch=False):
    """Attach the tensor a TensorRef describes (a dict, or its JSON text, as
    :meth:`SharedTensor.ref` and Go's ``Tensor.Ref`` make it) and return a
    NumPy array (a torch tensor with ``torch=True``) over the same memory.
    The description is checked against the segment's header: a ref whose
    dtype, shape, strides, bytes or id differ raises InvalidArgument."""
    if isinstance(ref, dict):
        ref = json.dumps(ref)
    if isinstance(ref, str):
        ref = ref.encode()
    if not isinstance(ref, bytes):
        raise InvalidArgument(f"a TensorRef is a dict or its JSON text, not {type(ref).__name__}")
    # The library parses the ref and checks it against the segment's header.
    ffi, lib = _native.ffi(), _native.lib()
    handle = ffi.new("zct_handle *")
    info = ffi.new("zct_info *")
    _native.check(lib.zct_tensor_ref_attach(ref, len(ref), int(bool(readonly)), handle, info))
    st = SharedTensor._wrap(handle[0], info)
    return st.torch() if torch else st.numpy()


def share(array):
    """Copy ``array`` (NumPy or CPU torch) into shared memory once, in C
    order, and return the shared copy as the same kind of object."""
    tensor = create_shared_tensor(data=array)
    return tensor.torch() if _is_torch_tensor(array) else tensor.numpy()


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


def list_segments():
    """Every zctipc segment of this user, whoever holds it: the files in
    /dev/shm, and the memfd segments the cleanup daemon keeps.

    A file with the library's prefix whose header is not valid (or a segment
    being made) is listed with ``error`` saying why.
    """
    import json

    lib = _native.lib()
    out = []
    for s in json.loads(_native.read_text(lib.zct_census)):
        out.append(SegmentInfo(
            name=s["name"],
            kind=s["kind"] if "error" not in s else "unknown",
            dtype=_dtypes.NAMES.get(s.get("dtype")),
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
        ))
    return out


def cleanup_all_segments():
    """Let go of every segment this process holds, unlinking those that no
    other process holds, and return how many there were.

    Mappings stay in place, so arrays still in use stay valid; use this at
    the end of a process (zctipc also does it at exit).
    """
    return _native.release_all()

