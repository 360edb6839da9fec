"""The process's pool of shared-memory buffers.

Buffers come from arenas cut into size classes; freeing one (when its last
view anywhere is gone) puts it back for the next allocation, so a steady
stream of tensors makes no system call and touches no new page. Buffers
larger than the largest class (3.5 GiB) get a segment of their own.
"""

import time
from typing import NamedTuple

from . import _args, _dtypes, _native, _views
from .errors import OutOfSharedMemory

__all__ = ["empty", "pool_stats", "set_pool_limit", "PoolStats"]

# Longest single wait inside the library, so that Ctrl-C is seen in time.
WAIT_SLICE = 0.05


class PoolStats(NamedTuple):
    """The state of this process's pool."""

    arenas: int
    reserved: int  # bytes of arena segments
    limit: int  # most bytes of arenas
    slots_in_use: int  # buffers handed out and not yet freed, here or anywhere
    bytes_in_use: int


def pool_stats():
    """A snapshot of this process's pool (buffers in use are the leak report:
    after everyone is done with them, slots_in_use is 0)."""
    ffi, lib = _native.ffi(), _native.lib()
    st = ffi.new("zct_pool_stats *")
    _native.check(lib.zct_pool_stats_get(st))
    return PoolStats(st.arenas, st.reserved, st.limit, st.slots_in_use, st.bytes_in_use)


def set_pool_limit(nbytes):
    """Set the most bytes of arenas this process's pool may hold (default:
    half of /dev/shm, or $ZCTIPC_POOL_LIMIT). At the limit, allocations wait
    for buffers to be freed, or raise OutOfSharedMemory."""
    nbytes = _args.integer("a pool limit", nbytes, 0, (1 << 64) - 1)
    _native.check(_native.lib().zct_pool_set_limit(nbytes))


def wait_slices(block, timeout):
    """Yield how long each native wait may last (in ms) until the deadline:
    0 once when not blocking; slices of WAIT_SLICE otherwise, so that Python
    runs signal handlers in between. Raises ValueError for a negative
    timeout."""
    if not block:
        yield 0
        return
    timeout = _args.timeout(timeout)
    if timeout is None:
        while True:
            yield int(WAIT_SLICE * 1000)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        yield max(0, int(min(left, WAIT_SLICE) * 1000))
        if left <= WAIT_SLICE:
            if left > 0:
                yield 0  # one last try at the deadline
            return


def alloc(nbytes, block=True, timeout=None):
    """A buffer of at least nbytes: (ref, address). A pool slot, or a
    segment of its own above the largest class. Waits for a free slot when
    the pool is full, as block and timeout say, then raises
    OutOfSharedMemory; raises it at once when waiting cannot help (the
    buffer is larger than the pool's limit, or /dev/shm is full and nothing
    of this pool can come back)."""
    ffi, lib = _native.ffi(), _native.lib()
    ref = ffi.new("zct_handle *")
    data = ffi.new("void **")
    size = ffi.new("uint64_t *")
    status = _native.E_FULL
    for ms in wait_slices(block, timeout):
        status = lib.zct_pool_alloc(nbytes, ms, ref, data, size)
        if status != _native.E_FULL and status != _native.E_INTERRUPTED:
            break
    if status == _native.E_INVALID and nbytes > 0:  # above the largest class: a segment of its own
        return _segment_buffer(nbytes)
    if status == _native.E_FULL:  # full until the deadline: not queue.Full, but the pool's own error
        raise OutOfSharedMemory(_native.error(status).args[0])
    _native.check(status)
    return ref[0], data[0]


def _segment_buffer(nbytes):
    """A buffer of its own segment, as a ref (a count on the segment) and the
    address of its data."""
    ffi, lib = _native.ffi(), _native.lib()
    handle = ffi.new("zct_handle *")
    info = ffi.new("zct_info *")
    shape = ffi.new("int64_t[]", [nbytes])
    _native.check(lib.zct_segment_create(ffi.NULL, _dtypes.CODES["uint8"], 1, shape, handle, info))
    try:
        ref = ffi.new("zct_handle *")
        offset = ffi.new("uint64_t *")
        _native.check(lib.zct_ref_find(info.data, nbytes, ref, offset))
        return ref[0], info.data
    finally:
        _native.check(lib.zct_segment_close(handle[0]))  # the ref holds it now


def empty(shape, dtype="float32", *, block=True, timeout=None):
    """A new array in shared memory from the pool, uninitialized like
    np.empty: a NumPy array, or a torch tensor when dtype is a torch dtype.
    It holds its buffer; sending it through a zctipc queue or pickling hook
    sends a descriptor, not a copy.

    When the pool is at its limit it waits for a buffer to come back, as
    ``block`` and ``timeout`` say, then raises OutOfSharedMemory; an array
    larger than the limit raises it at once."""
    from .tensor import _shape_tuple

    code = _dtypes.code_of(dtype)
    dims = _shape_tuple(shape)
    itemsize = _dtypes.ITEMSIZE[code]
    nbytes = itemsize
    for d in dims:
        nbytes *= d
    ref, address = alloc(max(nbytes, 1), block, timeout)
    memory = _views.owner(address, "zct_ref_release", ref, "releasing a buffer")
    strides = _c_strides(dims, itemsize)
    if type(dtype).__module__ == "torch":
        return _views.tensor(_views.ndarray(memory, nbytes, _dtypes.storage_dtype(code), dims, strides), code)
    return _views.ndarray(memory, nbytes, _dtypes.numpy_dtype(code), dims, strides)


def _c_strides(shape, itemsize):
    strides = []
    step = itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))
