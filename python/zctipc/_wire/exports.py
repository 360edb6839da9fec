"""Buffers on their way out and back: an Export is a count on zctipc memory
with the array laid over it, which a descriptor carries to another
process; a received view becomes the object it stands for.

Memory that is already zctipc memory goes as itself (zero copy, one more
count on it); any other NumPy buffer is copied once into a pool buffer, in
C order. A CPU torch tensor's storage is moved into a pool buffer instead,
in place, so that the sender keeps sharing it (zctipc._wire.storages).
Arrays of more dimensions than a descriptor holds, and element types
zctipc cannot share, do not go out of band: the caller pickles them in band.
"""

from __future__ import annotations

import os
import threading
import warnings

from .._core import dtypes, layout, lazy, log, memory, native, pool
from .._core.segments import SharedTensor
from ..errors import InvalidArgument, UnsupportedDtype, ZctipcError
from . import storages

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, TypeAlias

    import numpy as np
    import torch
    from numpy.typing import NDArray

    #: What fills a fresh pool buffer: fill(owner, nbytes, C strides).
    Fill: TypeAlias = Callable[[Any, int, tuple[int, ...]], None]
    #: (type code, shape, byte strides) of a tensor.
    Layout: TypeAlias = tuple[int, tuple[int, ...], tuple[int, ...]]
else:
    np = lazy.numpy(__name__)


class Export:
    """A buffer on its way out: a ref, and the array laid over it; flags
    are the descriptor's (the Python type to rebuild, read-only)."""

    __slots__ = ("ref", "offset", "code", "shape", "strides", "flags")

    def __init__(
        self, ref: int, offset: int, code: int, shape: tuple[int, ...], strides: tuple[int, ...], flags: int
    ) -> None:
        self.ref, self.offset, self.code = ref, offset, code
        self.shape, self.strides, self.flags = shape, strides, flags

    def fill(self, view: Any) -> None:
        """Write this export into a zct_view struct."""
        view.ref = self.ref
        view.offset = self.offset
        view.dtype = self.code
        view.ndim = len(self.shape)
        view.shape[0 : len(self.shape)] = self.shape
        view.strides[0 : len(self.strides)] = self.strides
        view.flags = self.flags

    def release(self) -> None:
        native.check(native.lib().zct_ref_release(self.ref))


def release_all(held: Iterable[Export]) -> None:
    """Release every export, and raise the first failure once all are
    released."""
    failed: BaseException | None = None
    for e in held:
        try:
            e.release()
        except BaseException as exc:  # raised once the rest are released
            failed = failed or exc
    if failed is not None:
        raise failed


# Note [sending in band when shared memory is full]: a NumPy array that
# is not zctipc memory travels as a copy whichever way it goes, so a sender
# that can put its bytes inside the message (pickled, or inline in a
# queue's record) loses nothing but speed by doing so when the pool has no
# buffer for it; waiting for one instead can wait for ever when the holder
# of the memory is the waiter (a process whose own unread messages fill
# the pool) or waits on the waiter (a parent that keeps every result until
# the last one comes). So:
# - multiprocessing's channels (Queue, Pipe, Pool and ProcessPoolExecutor
#   arguments) take a pool buffer only when one is there at once, and else
#   pickle the array in band, as they would without zctipc (InBand);
# - a zctipc SimpleQueue, whose put has no timeout and must not fail for
#   want of room (Pool and ProcessPoolExecutor send their results through
#   one), waits for a buffer while the queue holds messages, whose
#   consumers make room as a pipe's reader does, and sends the array
#   inline in its record once the queue is empty (an InBand of its own,
#   zctipc.queues.SimpleQueue); its record then takes the ring's pages,
#   and a put that finds no room for those waits the same way, and on an
#   empty queue for a few seconds (other queues' readers, a Pool's workers
#   taking tasks, give pages back), then raises OutOfSharedMemory;
# - Queue.put waits for a buffer as block and timeout say, or raises
#   OutOfSharedMemory, as it always did.
# Such a sender takes new pages only while room for the same bytes twice
# more (one message each way: a Pool's task and a result) and 8 MiB (the
# rings' warm windows, 2 MiB each) stays free (Note [leaving room] in
# go/internal/pool/pool.go): buffers kept by a receiver never fill the file system
# so far that the message carrying the next array in band finds none.
# The first array a process sends in band warns, once, naming the
# directory; the "zctipc" log says, at DEBUG, each time arrays start going
# in band and each time they go through the pool again (in_band, pooled).
# Torch tensors are shared, not copied: they never go in band,
# and a full pool makes their puts wait or raise as before.
# Threat model: only this process's own sends decide here; the file
# system's free space is read by the library, and a wrong answer (another
# process filling it meanwhile) makes a send go in band, or a page
# reservation fail as OutOfSharedMemory, never a fault.


def leave(nbytes: int) -> int:
    """The bytes a sender that can send nbytes in band leaves free in the
    file system (Note [sending in band when shared memory is full])."""
    return 2 * nbytes + (8 << 20)


class InBand:
    """How a sender that can put an array's bytes in its message gets a
    pool buffer for them: at once, leaving room, or not at all (Note
    [sending in band when shared memory is full])."""

    __slots__ = ()

    def buffer(self, nbytes: int) -> tuple[int, Any] | None:
        """A pool buffer of nbytes, (ref, address), or None after warning
        (once per process): the bytes go in band. This one does not wait."""
        got = pool.alloc_leaving(nbytes, leave(nbytes))
        if isinstance(got, tuple):
            if in_band:
                pooled()
            return got
        warn_in_band(nbytes)
        return None


#: InBand's single instance, for multiprocessing's channels.
IN_BAND = InBand()

_warned = False
_warned_lock = threading.Lock()

#: Whether the last array this process found no pool buffer for went in
#: band, and none has found one since (for the log).
in_band = False


def pooled() -> None:
    """Log that an array found a pool buffer again after arrays went in band."""
    global in_band
    in_band = False
    log.debug("arrays go through the pool again: a buffer was found")


def warn_in_band(nbytes: int) -> None:
    """Say, the first time only, that arrays go in band for want of room
    (a queue's feeder thread and the caller's may both find none); log it
    each time arrays start going in band."""
    global _warned, in_band
    if not in_band:
        in_band = True
        if log.enabled():
            log.logger().debug(
                "arrays go in band (pickled inside their messages) from now on: no pool buffer for %d bytes "
                "leaves room in %s",
                nbytes,
                os.environ.get("ZCTIPC_SHM_DIR") or "/dev/shm",
            )
    with _warned_lock:
        if _warned:
            return
        _warned = True
    directory = os.environ.get("ZCTIPC_SHM_DIR") or "/dev/shm"
    try:
        st = os.statvfs(directory)
        size = f"{_mib(st.f_blocks * st.f_frsize)}, {_mib(st.f_bavail * st.f_frsize)} free"
    except OSError as exc:
        size = f"size unknown: {exc}"
    warnings.warn(
        f"zctipc: the shared memory in {directory} ({size}) has no room for a {_mib(nbytes)} array: "
        "NumPy arrays are sent pickled inside their messages (a copy through the channel) while it has "
        "none. Give it more to keep them zero-copy (docker run --shm-size=<size>, or mount -o "
        f"remount,size=<size> {directory}).",
        RuntimeWarning,
        stacklevel=2,
    )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _find(
    address: Any, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int, extent: int | None = None
) -> tuple[int, int] | None:
    """(ref, offset) of the array at address (an integer, or a cffi
    pointer) in zctipc memory, one more count on it, when a descriptor can
    name it there; else None, as for an array of more dimensions than a
    descriptor holds or of negative strides. extent, when the caller knows
    it (a contiguous array), is the bytes the array spans."""
    if len(shape) > native.MAX_NDIM:
        return None
    if extent is None:
        if min(strides, default=0) < 0:
            return None
        extent = layout.extent(shape, strides, itemsize)
    return memory.find(address, extent)


def _copy(
    code: int,
    shape: tuple[int, ...],
    flags: int,
    fill: Fill,
    block: bool,
    timeout: float | None,
    in_band: InBand | None = None,
) -> Export | None:
    """An Export of a fresh pool buffer that fill(owner, nbytes, c_strides)
    copies an array into, in C order: a buffer waited for as block and
    timeout say, or, with in_band, the one in_band finds (block and timeout
    are then not looked at). None for an array of more dimensions than a
    descriptor holds, and when in_band found no buffer (the array goes in
    band)."""
    if len(shape) > native.MAX_NDIM:
        return None
    itemsize = dtypes.ITEMSIZE[code]
    size = layout.nbytes(shape, itemsize)
    if in_band is None:
        ref, address = pool.alloc(max(size, 1), block, timeout)
    else:
        got = in_band.buffer(max(size, 1))
        if got is None:
            return None
        ref, address = got
    c_strides = layout.c_strides(shape, itemsize)
    try:
        fill(native.ffi().cast("char *", address), size, c_strides)
    except BaseException:
        native.check(native.lib().zct_ref_release(ref))
        raise
    return Export(ref, 0, code, shape, c_strides, flags)


def _numpy_flags(aflags: Any) -> int:
    """The descriptor flags of a NumPy array whose flags are aflags."""
    return memory.NUMPY if aflags.writeable else memory.NUMPY | memory.READONLY


def contiguous_address(arr: NDArray[Any]) -> Any:
    """A cffi pointer to the first byte of arr when it is C-contiguous and
    holds some bytes, else None (also for a dtype the buffer protocol cannot
    say): the address without building __array_interface__, which costs
    more than the lookup it is for."""
    if not arr.flags.c_contiguous or not arr.nbytes:
        return None
    try:
        return native.ffi().from_buffer(arr)  # read-only too: cffi's default, and a keyword costs 0.2 us
    except (TypeError, ValueError, BufferError):
        return None


def contiguous_view(arr: NDArray[Any]) -> tuple[int, int, Any] | None:
    """(type code, descriptor flags, address) of a C-contiguous NumPy array
    of some bytes that a descriptor can hold, else None. On a hand-off's
    path: code_of, contiguous_address and _numpy_flags written out, the
    array's flags read once."""
    code = _CODES.get(arr.dtype, -1)
    if code == -1:
        code = code_of(arr.dtype)
    aflags = arr.flags
    if code is None or not aflags.c_contiguous or arr.ndim > _MAX_NDIM or not arr.nbytes:
        return None
    try:
        address = native.ffi().from_buffer(arr)
    except (TypeError, ValueError, BufferError):  # a dtype the buffer protocol cannot say
        return None
    return code, _NUMPY if aflags.writeable else _NUMPY | _READONLY, address


def tensor_view(t: torch.Tensor) -> tuple[int, int, Any, int, tuple[int, ...], tuple[int, ...]] | None:
    """(type code, descriptor flags, address, extent, shape, byte strides)
    of a plain torch tensor without grad, of some elements, whose memory a
    descriptor can name as it is (torch_layout); else None. On a
    hand-off's path, as contiguous_view is for an array: whether the
    memory is zctipc's is the put's to find."""
    if t.requires_grad:
        return None
    found = torch_layout(t)
    if not isinstance(found, tuple):
        return None
    code, shape, strides = found
    if len(shape) > _MAX_NDIM or 0 in shape:
        return None
    extent = layout.extent(shape, strides, dtypes.ITEMSIZE[code])
    return code, _TORCH, native.ffi().cast("void *", t.data_ptr()), extent, shape, strides


def find_array(arr: NDArray[Any]) -> Export | None:
    """An Export of the NumPy array arr over its own memory, when that is
    zctipc memory (it goes as itself, zero copy); else None, and for an
    array that cannot go out of band (object, structured, non-native
    dtypes; more dimensions than a descriptor holds)."""
    code = code_of(arr.dtype) if arr.ndim <= _MAX_NDIM else None
    if code is None:
        return None
    address = contiguous_address(arr)
    if address is not None:  # the common case: its extent is its size
        found = memory.find(address, arr.nbytes)
    else:
        found = _find(arr.__array_interface__["data"][0], arr.shape, arr.strides, arr.itemsize)
    return None if found is None else Export(found[0], found[1], code, arr.shape, arr.strides, _numpy_flags(arr.flags))


def copy_array(arr: NDArray[Any], block: bool, timeout: float | None, in_band: InBand | None = None) -> Export | None:
    """An Export of a fresh pool buffer holding a copy of the NumPy array
    arr, in C order, whatever memory arr lies in: a buffer waited for as
    block and timeout say, or, with in_band, the one in_band finds. None
    when in_band found none (Note [sending in band when shared memory is
    full]), and for an array that cannot go out of band (as find_array
    says)."""
    code = code_of(arr.dtype)
    if code is None:
        return None

    def fill(owner: Any, size: int, c_strides: tuple[int, ...]) -> None:
        np.copyto(memory.ndarray(owner, size, arr.dtype, arr.shape, c_strides), arr)

    return _copy(code, arr.shape, _numpy_flags(arr.flags), fill, block, timeout, in_band)


_CODES: dict[object, int | None] = {}  # torch or NumPy dtype -> code (None: unsupported), filled as dtypes are met


def code_of(dtype: np.dtype[Any] | torch.dtype) -> int | None:
    """The type code of a torch or NumPy dtype, or None when zctipc cannot
    share it."""
    try:
        return _CODES[dtype]
    except KeyError:
        pass
    try:
        code = dtypes.code_of(dtype)
    except UnsupportedDtype:
        code = None
    _CODES[dtype] = code
    return code


_COMPLEX = {dtypes.CODES["complex64"], dtypes.CODES["complex128"]}


def torch_layout(t: torch.Tensor) -> Layout | ZctipcError:
    """(type code, shape, byte strides) of a torch tensor whose memory zctipc
    sends as it is: on the CPU, strided, of a dtype zctipc shares, its
    memory holding its elements as they read. Else the error that says why
    not (not raised: the pickled route sends such tensors as they are;
    zctipc.ray refuses them)."""
    if not storages.shareable(t) or t.is_neg():
        return _refusal(t)
    code = code_of(t.dtype)
    if code is None or code in _COMPLEX and t.is_conj():
        return _refusal(t)
    size = dtypes.ITEMSIZE[code]
    return code, tuple(t.shape), tuple(s * size for s in t.stride())


def _refusal(t: torch.Tensor) -> ZctipcError:
    """Why zctipc does not send tensor t's memory as it is."""
    if not t.is_cpu:
        return InvalidArgument(f"zctipc shares CPU tensors; this one is on {t.device}")
    if t.is_nested:
        return InvalidArgument("zctipc shares dense tensors, not nested ones")
    if t.layout is not _strided():
        return InvalidArgument(f"zctipc shares dense tensors, not {t.layout} ones")
    if t.is_quantized:
        return InvalidArgument("zctipc shares plain tensors, not quantized ones")
    if code_of(t.dtype) is None:
        return UnsupportedDtype(f"zctipc cannot share a tensor of dtype {t.dtype}")
    return InvalidArgument(
        "zctipc sends tensors as their memory holds them; this one is a lazy conjugate or negative view: "
        "send t.resolve_conj().resolve_neg()"
    )


def _strided() -> Any:
    import torch

    return torch.strided


def check_grad(t: torch.Tensor) -> None:
    """Refuse a tensor that autograd tracks from elsewhere, as torch does."""
    if t.requires_grad and not t.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not "
            "support crossing process boundaries. If you just want to transfer the data, call detach() "
            "on the tensor before serializing (e.g., putting it on the queue)."
        )


def _find_tensor(t: torch.Tensor, found: Layout) -> Export | None:
    """An Export of tensor t (of layout found) over its own memory, when
    that is zctipc memory that a descriptor can name; else None."""
    code, shape, strides = found
    at = None if 0 in shape else _find(t.data_ptr(), shape, strides, dtypes.ITEMSIZE[code])
    return None if at is None else Export(at[0], at[1], code, shape, strides, memory.TORCH)


def _copy_tensor(t: torch.Tensor, found: Layout, block: bool, timeout: float | None) -> Export | None:
    """An Export of a fresh pool buffer holding a copy of tensor t (of
    layout found), waited for as block and timeout say (as _copy says)."""
    code, shape, _ = found

    def fill(owner: Any, size: int, c_strides: tuple[int, ...]) -> None:
        storage = memory.ndarray(owner, size, dtypes.storage_dtype(code), shape, c_strides)
        memory.tensor(storage, code).copy_(t.detach())

    return _copy(code, shape, memory.TORCH, fill, block, timeout)


#: Types a queue sends as a bare tensor record, which a Go or C consumer
#: reads as a tensor (torch.Tensor joins once zctipc has met torch).
BARE: set[type[object]] = {SharedTensor}  # and np.ndarray once NumPy is met (_numpy_met), torch.Tensor once torch is


def export_bare(obj: Any, block: bool = True, timeout: float | None = None) -> Export | None:
    """An Export for obj when it is a plain NumPy array, a plain torch
    tensor without grad that can go out of band, or an open SharedTensor:
    its own memory when that is zctipc memory, else a pool buffer waited
    for as block and timeout say (an array's copy, a tensor's storage moved
    there: _share_tensor); else None (it is pickled instead)."""
    t = type(obj)
    if t is np.ndarray:
        e = find_array(obj)
        return copy_array(obj, block, timeout) if e is None else e
    if t is SharedTensor:
        return None if obj.closed else export_shared_tensor(obj)
    if not obj.requires_grad:  # a plain torch.Tensor: BARE holds no other type
        found = torch_layout(obj)
        if not isinstance(found, tuple):
            return None
        e = _find_tensor(obj, found)
        return _share_tensor(obj, found, block, timeout) if e is None else e
    return None


def _share_tensor(t: torch.Tensor, found: Layout, block: bool, timeout: float | None) -> Export | None:
    """An Export of a bare tensor that is not zctipc memory: its storage
    moved into the pool (Note [moving storages] in zctipc._wire.storages),
    then the tensor's elements there; a storage in torch's shared memory
    too, so that the message holds what it carries (Note [torch's shared
    memory in a message] there). None for a tensor of more dimensions than
    a descriptor holds. A copy for an empty tensor, or one zctipc made
    over memory find() cannot place."""
    if len(found[1]) > native.MAX_NDIM:
        return None  # pickled: its storage goes as one dimension
    if 0 not in found[1]:
        s = t.untyped_storage()
        if not memory.is_marked(s):
            code, shape, strides = found
            ref, offset = storages.move_into_pool(s, block, timeout)
            # storage_offset() is a SymInt only while torch.compile traces, which never sends a tensor.
            return Export(ref, offset + t.storage_offset() * dtypes.ITEMSIZE[code], code, shape, strides, memory.TORCH)  # type: ignore[arg-type]
    return _copy_tensor(t, found, block, timeout)


_UINT8 = dtypes.CODES["uint8"]


def export_storage(storage: torch.UntypedStorage, block: bool = True, timeout: float | None = None) -> Export:
    """An Export of a whole CPU torch storage of at least one byte, as
    uint8: its own memory when it is zctipc memory, else the pool buffer it
    is moved into (Note [moving storages] in zctipc._wire.storages; one in
    torch's shared memory too), or a copy of one that zctipc made over
    memory find() cannot place (a stream's slot)."""
    nbytes = storage.nbytes()
    address = storage.data_ptr()
    found = memory.find(address, nbytes)
    if found is None:
        if memory.is_marked(storage):

            def fill(owner: Any, size: int, c_strides: tuple[int, ...]) -> None:
                memory.storage(owner, size).copy_(storage)

            e = _copy(_UINT8, (nbytes,), memory.TORCH, fill, block, timeout)
            assert e is not None  # one dimension: a descriptor always holds it
            return e
        found = storages.move_into_pool(storage, block, timeout, address)
    return Export(found[0], found[1], _UINT8, (nbytes,), (1,), memory.TORCH)


def export_shared_tensor(st: SharedTensor) -> Export:
    """An Export for a SharedTensor: its own segment, by descriptor."""
    owner = st._live()
    found = memory.find(int(native.ffi().cast("uintptr_t", owner)), st.nbytes)
    if found is None:
        raise RuntimeError(f"{st!r} is not mapped in this process")
    return Export(found[0], found[1], st._code, st.shape, st.strides, memory.SHARED_TENSOR)


# Note [inline arrays]: a NumPy array of a queue's inline_bytes or fewer
# that is not zctipc memory travels inside its record (ZCT_RECORD_INLINE),
# copied into the ring and out of it, instead of into a pool buffer whose
# count and mapping the receiver takes over: below some tens of KiB the
# copies cost less than the pool's bookkeeping. The library writes the
# record, header, shape and elements, straight from the array's memory
# (zct_queue_put_inline), and a get gives the array back as a view of its
# elements in the get's buffer (ZCT_REF_INLINE): the record's framing
# (format.md) is the library's alone. The receiver gets a copy of its own,
# as a pickled array would be. Inside a pickle, such an array goes in band
# as its dtype code, shape and bytes (rebuild_in_band). zctipc memory
# always goes by descriptor.


class _NoArray:
    """Stands for np.ndarray until NumPy is imported: nothing is one."""


ndarray: type[Any] = _NoArray


def _numpy_met() -> None:
    global ndarray
    ndarray = np.ndarray
    BARE.add(np.ndarray)


lazy.when_numpy_is_met(_numpy_met)


_NUMPY, _TORCH, _SHARED_TENSOR = memory.NUMPY, memory.TORCH, memory.SHARED_TENSOR
_TYPE_MASK, _READONLY = memory.TYPE_MASK, memory.READONLY
_MAX_NDIM = native.MAX_NDIM


def inline_array(arr: NDArray[Any]) -> tuple[int, int, NDArray[Any]] | None:
    """(dtype code, descriptor flags, the array in C order) of the NumPy
    array arr, whose bytes are to be copied into a message (Note [inline
    arrays]); or None when it must go otherwise: it is zctipc memory (by
    descriptor), or of a dtype or rank a descriptor cannot hold (pickled)."""
    code = _CODES.get(arr.dtype, -1)
    if code == -1:
        code = code_of(arr.dtype)
    aflags = arr.flags
    # A buffer NumPy allocated itself (owndata) is not zctipc memory: only
    # an array over someone else's memory needs the library to say.
    if code is None or arr.ndim > _MAX_NDIM or not aflags.owndata and in_zctipc_memory(arr):
        return None
    flags = _NUMPY if aflags.writeable else _NUMPY | _READONLY  # as _numpy_flags says, written out
    return code, flags, arr if aflags.c_contiguous else np.ascontiguousarray(arr)


def elements(arr: NDArray[Any]) -> Any:
    """A cffi pointer to the elements of arr, a C-contiguous array (NULL
    when it has none), valid while arr lives."""
    ffi = native.ffi()
    if not arr.nbytes:
        return ffi.NULL
    try:
        return ffi.from_buffer(arr)  # read-only too (cffi's default)
    except (TypeError, ValueError, BufferError):  # a dtype the buffer protocol cannot say
        return ffi.cast("void *", arr.__array_interface__["data"][0])


def in_zctipc_memory(arr: NDArray[Any]) -> bool:
    """Whether the NumPy array arr lies in zctipc memory that its
    descriptor can name (an array with negative strides is copied)."""
    address = contiguous_address(arr)
    if address is not None:
        return memory.zctipc_memory(address, arr.nbytes)
    if not arr.nbytes or min(arr.strides, default=0) < 0:
        return False
    extent = layout.extent(arr.shape, arr.strides, arr.itemsize)
    return memory.zctipc_memory(arr.__array_interface__["data"][0], extent)


def build_inline(mem: memoryview, views: Any, at: int) -> NDArray[Any] | torch.Tensor:
    """A new NumPy array of an inline record's array, which a get took into
    mem and gave as the zct_view at byte at of views, the bytes of its
    views (ZCT_REF_INLINE: the view's offset is in mem); or the torch tensor
    its flags ask for (a Go program passing on a torch tensor that came to
    it, one of bfloat16 among them, which NumPy has no type for)."""
    if not memory.VIEW_SIZE:
        memory.view_layout()
    _, _, start, nbytes, code, ndim, _, flags = memory.VIEW.unpack_from(views, at)
    dt: np.dtype[Any] | None
    if flags & _TYPE_MASK == _TORCH:
        dt = dtypes.storage_dtype(code)
    else:
        dt = memory.NUMPY_DTYPES.get(code)
        if dt is None:
            dt = memory.NUMPY_DTYPES[code] = dtypes.numpy_dtype(code)
        if not flags:  # writable NumPy, the common case
            arr = np.frombuffer(mem, dt, nbytes // dt.itemsize, start).copy() if nbytes else np.empty(0, dt)
            return arr if ndim == 1 else arr.reshape(memory.VIEW_DIMS[ndim].unpack_from(views, at + memory.VIEW_SHAPE))
    if flags & _READONLY:
        # The sender's was read-only: a copy over bytes, which stays so.
        arr = np.frombuffer(bytes(mem[start : start + nbytes]), dt, nbytes // dt.itemsize)
    else:
        arr = np.frombuffer(mem, dt, nbytes // dt.itemsize, start).copy() if nbytes else np.empty(0, dt)
    if ndim != 1:
        arr = arr.reshape(memory.VIEW_DIMS[ndim].unpack_from(views, at + memory.VIEW_SHAPE))
    return memory.copy_tensor(arr, code, bool(flags & _READONLY)) if flags & _TYPE_MASK == _TORCH else arr


def in_band_args(arr: NDArray[Any]) -> tuple[int, tuple[int, ...], bytes | bytearray] | None:
    """rebuild_in_band's arguments for the NumPy array arr, to pickle it in
    band (Note [inline arrays]), or None when it must go otherwise (as
    inline_array says): its bytes are a bytearray, which unpickles as one
    and makes a writable array without a copy, or bytes for an array that
    was read-only."""
    found = inline_array(arr)
    if found is None:
        return None
    code, flags, arr = found
    raw = arr.reshape(-1).view(np.uint8)  # C-contiguous: no copy
    return code, arr.shape, raw.tobytes() if flags & _READONLY else bytearray(raw)


def rebuild_in_band(code: int, shape: tuple[int, ...], data: bytes | bytearray) -> NDArray[Any]:
    """Unpickle a small array that a pickle carried in band (in_band_args)."""
    arr = np.frombuffer(data, dtypes.numpy_dtype(code))
    return arr if len(shape) == 1 else arr.reshape(shape)


def build(views: Any, at: int) -> NDArray[Any] | torch.Tensor | SharedTensor:
    """The object that the received zct_view at byte at of views (their
    bytes: Note [reading a view at once] in zctipc._core.memory) stands
    for; it holds the view's ref."""
    if not memory.VIEW_SIZE:
        memory.view_layout()
    fields = memory.VIEW.unpack_from(views, at)  # read once, for from_view too
    if fields[7] & _TYPE_MASK == _SHARED_TENSOR:
        lib = native.lib()
        if fields[6] == lib.ZCT_REF_SEGMENT:
            ffi = native.ffi()
            handle = ffi.new("zct_handle *")
            info = ffi.new("zct_info *")
            native.check(lib.zct_ref_segment(fields[0], handle, info))
            return SharedTensor._wrap(handle[0], info)
    return memory.from_view(views, at, fields)


def encode(export: Export) -> bytes:
    """Descriptor bytes for an Export; its count travels in them (it is
    released when they cannot be made)."""
    try:
        return _descriptor(export, native.lib().zct_ref_encode)
    except BaseException:
        export.release()
        raise


def drop(data: bytes) -> None:
    """Give back the count that descriptor bytes made by encode carry, for
    bytes that will never be decoded (a pickle that was not made)."""
    view = native.ffi().new("zct_view *")
    native.check(native.lib().zct_ref_decode(data, len(data), view))
    memory.release_ref(view.ref)


def describe(export: Export) -> bytes:
    """Descriptor bytes for an Export that carry no count: the Export keeps
    its count, and the memory lives while it does, for whoever attaches the
    bytes (attach) in the meantime, any number of times."""
    return _descriptor(export, native.lib().zct_ref_describe)


def _descriptor(export: Export, write: Callable[..., int]) -> bytes:
    """The descriptor of export, as write (zct_ref_encode or
    zct_ref_describe) makes it."""
    ffi = native.ffi()
    view = ffi.new("zct_view *")
    export.fill(view)
    buf = ffi.new("char[]", 2048)  # the largest descriptor, its ticket with it, is under 1.1 KiB
    size = ffi.new("uint64_t *")
    native.check(write(view, buf, 2048, size))
    return ffi.buffer(buf, size[0])[:]


def attach(data: bytes) -> Any:
    """The object descriptor bytes made by describe stand for, with a count
    of this process's own (SegmentNotFound once every holder let go). (Any,
    as decode says.)"""
    return _received(data, native.lib().zct_ref_attach)


def decode(data: bytes, requires_grad: bool = False) -> Any:
    """The object descriptor bytes (made by encode) stand for, taking over
    the count they carried. (Any: the descriptor says which of an array, a
    tensor or a SharedTensor; a caller that sent a tensor gets one.)"""
    obj = _received(data, native.lib().zct_ref_decode)
    if requires_grad:
        obj.requires_grad_()
    return obj


def _received(data: bytes, read: Callable[..., int]) -> Any:
    """The object data stands for, its view given by read (zct_ref_decode
    or zct_ref_attach)."""
    ffi = native.ffi()
    view = ffi.new("zct_view *")
    native.check(read(data, len(data), view))
    return build(ffi.buffer(view), 0)
