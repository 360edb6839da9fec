"""The process's pool of shared-memory buffers.

Buffers come from arenas cut into size classes; freeing one (when its last
view anywhere is gone) puts it back for the next allocation, so a steady
stream of tensors makes no system call and touches no new page. Buffers
larger than the largest class (3.5 GiB) get a segment of their own.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from ..errors import OutOfSharedMemory
from . import args, dtypes, layout, log, memory, native, wait

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any, SupportsIndex, overload

    import torch
    from numpy.typing import DTypeLike, NDArray

    from .dtypes import DTypeSpec
    from .layout import ShapeLike


class PoolStats(NamedTuple):
    """The state of this process's pool."""

    arenas: int
    reserved: int  # bytes of arena segments
    limit: int  # most bytes of arenas
    slots_in_use: int  # buffers handed out and not yet freed, here or anywhere
    bytes_in_use: int


def stats() -> PoolStats:
    """A snapshot of this process's pool."""
    ffi, lib = native.ffi(), native.lib()
    st = ffi.new("zct_pool_stats *")
    native.check(lib.zct_pool_stats_get(st))
    return PoolStats(st.arenas, st.reserved, st.limit, st.slots_in_use, st.bytes_in_use)


def set_limit(nbytes: SupportsIndex) -> None:
    """Set the most bytes of arenas the pool may hold."""
    nbytes = args.integer("a pool limit", nbytes, 0, (1 << 64) - 1)
    native.check(native.lib().zct_pool_set_limit(nbytes))


#: The bytes of the pool's largest slot (pool.MaxSize in Go): a larger buffer
#: gets a segment of its own. (Any other refusal, such as a pool limit from
#: the environment that is not a size, is raised.)
LARGEST_SLOT = 7 << 29


#: Whether a buffer the pool has no room for (it is at its limit, or the
#: buffer's arena is larger than the limit) gets a segment of its own at
#: once instead of waiting for a slot or raising: set in a DataLoader
#: worker, whose buffers the main process holds for as long as it likes
#: (Note [batches in the pool] in zctipc._wire.batches).
overflow = False


def alloc(nbytes: int, block: bool = True, timeout: float | None = None) -> tuple[int, Any]:
    """A buffer of at least nbytes: (ref, address). A pool slot, or a
    segment of its own above the largest class (or, with overflow, when
    the pool has no room). Waits for a free slot when the pool is full, as
    block and timeout say, then raises OutOfSharedMemory; raises it at once
    when waiting cannot help (the buffer is larger than the pool's limit,
    or /dev/shm is full and nothing of this pool can come back). The
    address is a cffi pointer."""
    global _out
    if block:
        timeout = args.timeout(timeout)  # checked before the try that does not wait
    out = _out or (_out := _AllocOut())
    lib = native.lib()
    ref, data, size = out.ref, out.data, out.size
    status = lib.zct_pool_alloc(nbytes, 0, ref, data, size)  # the common case: a free slot at once
    if status == native.E_FULL and block and not overflow:
        status = wait.retry(lambda ms: lib.zct_pool_alloc(nbytes, ms, ref, data, size), native.E_FULL, block, timeout)
    if status == native.E_INVALID and nbytes > LARGEST_SLOT:  # a segment of its own
        return _segment_buffer(nbytes)
    if overflow and status in (native.E_FULL, native.E_NO_SPACE):
        return _segment_buffer(nbytes)  # raises OutOfSharedMemory if /dev/shm cannot hold it either
    if status == native.E_FULL:  # full until the deadline: not queue.Full, but the pool's own error
        raise OutOfSharedMemory(native.error(status).args[0])
    native.check(status)
    if log.active is not None and log.active.isEnabledFor(log.DEBUG):  # Note [the pool's log]
        _log_arenas()
    return ref[0], data[0]


class _AllocOut(threading.local):
    """Out-parameters of zct_pool_alloc, per thread."""

    def __init__(self) -> None:
        ffi = native.ffi()
        self.ref = ffi.new("zct_handle *")
        self.data = ffi.new("void **")
        self.size = ffi.new("uint64_t *")


_out: _AllocOut | None = None


def alloc_leaving(nbytes: int, leave: int, ms: int = 0) -> tuple[int, Any] | int:
    """A buffer of at least nbytes, (ref, address) as alloc gives one, that
    takes new pages of the shared-memory file system only while leave
    bytes stay free there besides them (Note [leaving room] in
    go/internal/pool/pool.go), waiting up to ms for one; without one, the status
    that says why: native.E_FULL when a buffer of its size class is in
    use (it comes back), native.E_NO_SPACE when waiting cannot help."""
    global _out
    out = _out or (_out := _AllocOut())
    ref, data, size = out.ref, out.data, out.size
    status = native.lib().zct_pool_alloc_leaving(nbytes, leave, ms, ref, data, size)
    if status == native.E_INVALID and nbytes > LARGEST_SLOT:  # a segment of its own
        try:
            return _segment_buffer(nbytes)
        except OutOfSharedMemory:
            return native.E_NO_SPACE
    if status == native.E_INTERRUPTED:  # a signal ended the wait: a buffer may come yet
        return native.E_FULL
    if status == native.E_FULL or status == native.E_NO_SPACE:
        return status
    native.check(status)
    if log.active is not None and log.active.isEnabledFor(log.DEBUG):  # Note [the pool's log]
        _log_arenas()
    return ref[0], data[0]


def trim() -> None:
    """Give back the pool's arenas with no buffer in use anywhere: their
    memory returns to the shared-memory file system."""
    native.check(native.lib().zct_pool_trim())
    if log.enabled():
        _log_arenas()


# Note [the pool's log]: the library adds an arena inside an allocation and
# says nothing of it, so an allocation asks, only while the log takes DEBUG
# records (Note [a log that costs nothing unasked]), how many arenas the
# pool holds, and logs when that changed since it last looked.
_arenas = 0
_arenas_lock = threading.Lock()


def _log_arenas() -> None:
    global _arenas
    st = stats()
    with _arenas_lock:
        before, _arenas = _arenas, st.arenas
    if st.arenas != before:
        log.logger().debug(
            "pool %s: arenas %d, reserved %d bytes (limit %d), in use %d bytes in %d buffers",
            "grew" if st.arenas > before else "shrank",
            st.arenas,
            st.reserved,
            st.limit,
            st.bytes_in_use,
            st.slots_in_use,
        )


def _segment_buffer(nbytes: int) -> tuple[int, Any]:
    """A buffer of its own segment, as a ref (a count on the segment) and the
    address of its data."""
    ffi, lib = native.ffi(), native.lib()
    handle = ffi.new("zct_handle *")
    info = ffi.new("zct_info *")
    shape = ffi.new("int64_t[]", [nbytes])
    native.check(lib.zct_segment_create(ffi.NULL, dtypes.CODES["uint8"], 1, shape, handle, info))
    if log.enabled():
        log.logger().debug(
            "made segment %s for a buffer of %d bytes outside the pool", ffi.string(info.name).decode(), nbytes
        )
    try:
        ref = ffi.new("zct_handle *")
        offset = ffi.new("uint64_t *")
        native.check(lib.zct_ref_find(info.data, nbytes, ref, offset))
        return ref[0], info.data
    finally:
        native.check(lib.zct_segment_close(handle[0]))  # the ref holds it now


if TYPE_CHECKING:

    @overload
    def empty(
        shape: ShapeLike, dtype: DTypeLike = ..., block: bool = ..., timeout: float | None = ...
    ) -> NDArray[Any]: ...
    @overload
    def empty(shape: ShapeLike, dtype: torch.dtype, block: bool = ..., timeout: float | None = ...) -> torch.Tensor: ...


def empty(
    shape: ShapeLike, dtype: DTypeSpec = "float32", block: bool = True, timeout: float | None = None
) -> NDArray[Any] | torch.Tensor:
    """A new array in a pool buffer, uninitialized: a NumPy array, or a
    torch tensor when dtype is a torch dtype. It holds its buffer."""
    code = dtypes.code_of(dtype)
    dims = layout.shape_tuple(shape)
    itemsize = dtypes.ITEMSIZE[code]
    size = layout.nbytes(dims, itemsize)
    ref, address = alloc(max(size, 1), block, timeout)
    owner = memory.owner(address, "zct_ref_release", ref, "releasing a buffer")
    strides = layout.c_strides(dims, itemsize)
    if type(dtype).__module__ == "torch":
        return memory.tensor(memory.ndarray(owner, size, dtypes.storage_dtype(code), dims, strides), code)
    return memory.ndarray(owner, size, dtypes.numpy_dtype(code), dims, strides)
