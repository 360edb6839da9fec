"""The process's pool of shared-memory buffers.

Buffers come from arenas cut into size classes; freeing one (when its last
view anywhere is gone) puts it back for the next allocation, so a steady
stream of tensors makes no system call and touches no new page. Buffers
larger than the largest class (3.5 GiB) get a segment of their own.
"""

from __future__ import annotations

from ._core import pool
from ._core.pool import PoolStats

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any, SupportsIndex, overload

    import torch
    from numpy.typing import DTypeLike, NDArray

    from ._core.dtypes import DTypeSpec
    from ._core.layout import ShapeLike

__all__ = ["empty", "pool_stats", "set_pool_limit", "PoolStats"]


def pool_stats() -> PoolStats:
    """A snapshot of this process's pool (buffers in use are the leak report:
    after everyone is done with them, slots_in_use is 0)."""
    return pool.stats()


def set_pool_limit(nbytes: SupportsIndex) -> None:
    """Set the most bytes of arenas this process's pool may hold (default:
    half of /dev/shm, or $ZCTIPC_POOL_LIMIT: bytes, or a size such as 512M
    or 2GiB). At the limit, allocations wait for buffers to be freed, or
    raise OutOfSharedMemory; a buffer that the shared-memory file system
    could not hold whatever the limit raises it at once, naming its free
    space."""
    pool.set_limit(nbytes)


if TYPE_CHECKING:

    @overload
    def empty(
        shape: ShapeLike, dtype: DTypeLike = ..., *, block: bool = ..., timeout: float | None = ...
    ) -> NDArray[Any]: ...
    @overload
    def empty(
        shape: ShapeLike, dtype: torch.dtype, *, block: bool = ..., timeout: float | None = ...
    ) -> torch.Tensor: ...


def empty(
    shape: ShapeLike, dtype: DTypeSpec = "float32", *, block: bool = True, timeout: float | None = None
) -> NDArray[Any] | torch.Tensor:
    """A new array in shared memory from the pool, uninitialized like
    np.empty: a NumPy array, or a torch tensor when dtype is a torch dtype.
    It holds its buffer; sending it through a zctipc queue or pickling hook
    sends a descriptor, not a copy.

    When the pool is at its limit it waits for a buffer to come back, as
    ``block`` and ``timeout`` say, then raises OutOfSharedMemory; an array
    larger than the limit raises it at once."""
    return pool.empty(shape, dtype, block, timeout)
