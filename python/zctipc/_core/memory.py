"""NumPy arrays and torch tensors over native memory that keep it alive.

Every view is built over an *owner*: a cffi pointer whose destructor gives
the memory back (closes a segment handle, or releases a ref). The owner is
held by the buffer the array is made from, so the memory lasts as long as
any view of it, and goes when the last one does.

Note [marked storages]: the storage of every torch tensor that zctipc
makes over its own memory (tensor()) carries the attribute _zctipc_memory.
zctipc moves a plain torch storage into its pool when it sends it (as
torch.multiprocessing moves one into torch's shared memory), so it must
know its own memory for what it is, even where find() cannot place it (a
stream's slot): a marked storage is never moved. torch keeps a storage's
Python object, and so the mark, as long as the storage lives. Views made
for received descriptors (from_view) are not marked: find() always places
them, and the mark would cost every get.
"""

from __future__ import annotations

import struct
import threading
import warnings

from . import dtypes, lazy, log, native

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    import numpy as np
    import torch
    from numpy.typing import DTypeLike, NDArray
else:
    np = lazy.numpy(__name__)

# Descriptor flags (zct_view_flags of zctipc.h; a test checks them): the
# Python type a receiver rebuilds, in bits 0-1, and read-only.
NUMPY, TORCH, SHARED_TENSOR = 0, 1, 2
TYPE_MASK = 3
READONLY = 4


def owner(address: Any, close: str, handle: int, what: str, segment: str | None = None) -> Any:
    """A pointer to address whose collection calls the library's function
    close (a name) on handle, as native.finalize does, and logs that this
    process let go of segment when one is named. (Pointers and other cffi
    objects are Any: cffi has no Python types.)"""
    ffi = native.ffi()
    if segment is None:
        return ffi.gc(ffi.cast("char *", address), lambda _, h=handle, f=_finalize: f(close, h, what))
    return ffi.gc(ffi.cast("char *", address), lambda _, h=handle, f=_let_go: f(close, h, what, segment))


# Note [finalizers at shutdown]: a pointer that a module-level array or
# tensor of the program still holds is collected at interpreter shutdown,
# maybe after this module's globals were cleared (under torch before 2.3 they
# were): its callback reaches what it calls through its defaults, not
# through this module's globals.
_finalize = native.finalize


def _let_go(close: str, handle: int, what: str, segment: str, f: Any = _finalize, debug: Any = log.debug) -> None:
    f(close, handle, what)
    debug("let go of segment %s", segment)


def ndarray(
    memory: Any, nbytes: int, dtype: DTypeLike, shape: Sequence[int], strides: Sequence[int], readonly: bool = False
) -> NDArray[Any]:
    """A NumPy array over nbytes of memory (an owner or a view of one)."""
    buffer = native.ffi().buffer(memory, nbytes)
    if readonly:
        # np.ndarray(buffer=...) would keep the writable object beneath a
        # read-only memoryview as its base, and let writeable be set back to
        # True; a uint8 array over the memoryview keeps the refusal.
        buffer = np.frombuffer(memoryview(buffer).toreadonly(), dtype=np.uint8)
    return np.ndarray(shape, dtype=dtype, buffer=buffer, strides=strides)


class _FindOut(threading.local):
    def __init__(self) -> None:
        ffi = native.ffi()
        self.ref = ffi.new("zct_handle *")
        self.offset = ffi.new("uint64_t *")


_find_out: _FindOut | None = None


def find(address: Any, nbytes: int) -> tuple[int, int] | None:
    """(ref, offset): one more count on the zctipc memory that holds the
    nbytes at address (an integer, or a cffi pointer), or None when it is
    not zctipc memory."""
    global _find_out
    if not native.loaded():
        return None  # nothing of zctipc lives in this process
    out = _find_out or (_find_out := _FindOut())
    if type(address) is int:
        address = native.ffi().cast("void *", address)
    status = native.lib().zct_ref_find(address, nbytes, out.ref, out.offset)
    if status == native.E_NOT_FOUND:
        return None
    native.check(status)
    return out.ref[0], out.offset[0]


def zctipc_memory(address: Any, nbytes: int) -> bool:
    """Whether the nbytes at address (an integer, or a cffi pointer) are
    zctipc memory that find() finds; no count is taken."""
    if not native.loaded():
        return False  # nothing of zctipc lives in this process
    if type(address) is int:
        address = native.ffi().cast("void *", address)
    held = native.lib().zct_memory_holds(address, nbytes)
    if held < 0:
        native.check(held)
    return held == 1


_torch: Any = None  # the torch module, once met
_MARK = "_zctipc_memory"  # Note [marked storages]


def _torch_module() -> Any:
    global _torch
    import torch

    _torch = torch
    return torch


def tensor(arr: NDArray[Any], code: int, readonly: bool = False) -> torch.Tensor:
    """A torch tensor sharing the memory of arr, an array of the storage
    dtype of code (uint16 bits for bfloat16), over zctipc memory: its
    storage is marked so (Note [marked storages])."""
    t = _tensor(arr, code, readonly)
    setattr(t.untyped_storage(), _MARK, True)
    return t


def is_marked(storage: object) -> bool:
    """Whether storage is one that tensor() made over zctipc memory."""
    return getattr(storage, _MARK, False)


def storage(memory: Any, nbytes: int) -> torch.UntypedStorage:
    """An unmarked torch UntypedStorage over nbytes of memory (an owner,
    which it then holds, or a pointer to memory held elsewhere)."""
    return _tensor(ndarray(memory, nbytes, np.uint8, (nbytes,), (1,)), dtypes.CODES["uint8"]).untyped_storage()


def copy_tensor(arr: NDArray[Any], code: int, readonly: bool = False) -> torch.Tensor:
    """A torch tensor over arr, an array of the storage dtype of code in
    this process's own memory (a copy that came inside a message): not
    marked, since it is not zctipc memory."""
    return _tensor(arr, code, readonly)


def _tensor(arr: NDArray[Any], code: int, readonly: bool = False) -> torch.Tensor:
    torch = _torch or _torch_module()
    if code == dtypes.BFLOAT16:
        # The bits as int16, which every torch takes from NumPy (torch before
        # 2.3 has no uint16, the storage dtype's type).
        arr = arr.view(np.int16)
    if readonly:
        # torch has no read-only tensors and warns; the mapping itself is
        # PROT_READ, so a write through the tensor faults.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(arr)
    else:
        t = torch.from_numpy(arr)
    if code == dtypes.BFLOAT16:
        t = t.view(torch.bfloat16)
    return t


def release_ref(ref: int) -> None:
    """Release a ref: never raises, a no-op after fork."""
    native.finalize("zct_ref_release", ref, "releasing a buffer")


# Note [reading a view at once]: the library gives a received array as a
# zct_view it filled, and reading its fields one by one through cffi costs
# more than the copy of a small array's elements (an inline array), and a
# microsecond of a hand-off's. So the views a get fills are read as bytes
# (ffi.buffer over the array of them), each with one struct unpack of its
# fields and one of its shape and strides, at the offsets cffi gives for
# zctipc.h's zct_view (view_layout, once the library is loaded): no layout
# is Python's own.
VIEW = struct.Struct("=0x")  # ref, data, offset, nbytes, dtype, ndim, kind, flags of a zct_view (view_layout)
VIEW_SIZE = VIEW_SHAPE = VIEW_STRIDES = 0  # sizeof(zct_view), where its shape and its strides start
VIEW_DIMS: list[struct.Struct] = []  # ndim int64s (a shape, or strides), by ndim


def view_layout() -> None:
    """Read where zct_view's fields lie from the library's bindings (Note
    [reading a view at once])."""
    global VIEW, VIEW_SIZE, VIEW_SHAPE, VIEW_STRIDES, VIEW_DIMS
    ffi = native.ffi()
    word = "Q" if ffi.sizeof("void *") == 8 else "I"
    fmt, at = "=", 0
    for name, code in (
        ("ref", "Q"),
        ("data", word),
        ("offset", "Q"),
        ("nbytes", "Q"),
        ("dtype", "i"),
        ("ndim", "i"),
        ("kind", "i"),
        ("flags", "i"),
    ):
        field = ffi.offsetof("zct_view", name)
        if field < at:
            raise ImportError(f"zct_view.{name} is out of the order zctipc expects")
        fmt += f"{field - at}x{code}"
        at = field + struct.calcsize("=" + code)
    VIEW_DIMS = [struct.Struct(f"={n}q") for n in range(native.MAX_NDIM + 1)]
    VIEW_SHAPE, VIEW_STRIDES = ffi.offsetof("zct_view", "shape"), ffi.offsetof("zct_view", "strides")
    VIEW_SIZE = ffi.sizeof("zct_view")
    VIEW = struct.Struct(fmt)


def view_ref(views: Any, at: int) -> int:
    """The ref of the zct_view at byte at of views (its bytes)."""
    if not VIEW_SIZE:
        view_layout()
    ref: int = VIEW.unpack_from(views, at)[0]
    return ref


#: code -> NumPy dtype, as met (a get's array is made with it: a lookup of
#: dtypes.numpy_dtype costs more than the dict's)
NUMPY_DTYPES: dict[int, np.dtype[Any]] = {}


def from_view(views: Any, at: int, fields: tuple[Any, ...]) -> NDArray[Any] | torch.Tensor:
    """The NumPy array (or torch tensor) that the received zct_view at
    byte at of views (their bytes) describes, whose fields VIEW read;
    it holds the view's ref until it is collected."""
    ref, data, _, nbytes, code, ndim, _, flags = fields
    dims = VIEW_DIMS[ndim]
    shape, strides = dims.unpack_from(views, at + VIEW_SHAPE), dims.unpack_from(views, at + VIEW_STRIDES)
    # owner() and ndarray() written out: a hand-off's get pays for every
    # call made here.
    ffi = native.ffi()
    memory = ffi.gc(ffi.cast("char *", data), lambda _, f=_finalize, w=_RELEASING: f("zct_ref_release", ref, w))
    if flags & TYPE_MASK == TORCH:
        return _tensor(ndarray(memory, nbytes, dtypes.storage_dtype(code), shape, strides), code)
    dt = NUMPY_DTYPES.get(code)
    if dt is None:
        dt = NUMPY_DTYPES[code] = dtypes.numpy_dtype(code)
    if flags & READONLY:
        return ndarray(memory, nbytes, dt, shape, strides, True)
    if ndim == 1 and strides[0] == dt.itemsize:
        # np.frombuffer takes a third of np.ndarray's time, which parses
        # its keywords, shape and strides.
        return np.frombuffer(ffi.buffer(memory, nbytes), dt, shape[0])
    return np.ndarray(shape, dtype=dt, buffer=ffi.buffer(memory, nbytes), strides=strides)


_RELEASING = "releasing a buffer"
