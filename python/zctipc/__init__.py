"""zctipc: zero-copy tensor IPC.

Hand NumPy arrays and torch tensors to other processes as ~100-byte
descriptors of shared memory instead of pickled copies::

    import numpy as np, zctipc

    t = zctipc.create_shared_tensor("frames", data=np.arange(6.0).reshape(2, 3))
    # in another process:
    a = zctipc.attach_shared_tensor("frames").numpy()   # a view, no copy

Importing zctipc loads no native code: the Go library is loaded on first use.
"""

from .context import get_context
from .errors import (
    CorruptHeader,
    ForkedProcessError,
    HandleClosed,
    IncompatibleVersion,
    InvalidArgument,
    LibraryPoisoned,
    NotAZctipcSegment,
    OutOfSharedMemory,
    PermissionDenied,
    SegmentExists,
    SegmentNotFound,
    UnsupportedDtype,
    ZctipcError,
    ZctipcOSError,
)
from .tensor import (
    SegmentInfo,
    SharedTensor,
    attach_shared_tensor,
    cleanup_all_segments,
    create_shared_tensor,
    empty,
    list_segments,
    share,
)

try:
    from importlib.metadata import PackageNotFoundError, version as _version

    __version__ = _version("zctipc")  # set from go/zctipc/version.go at build time
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

#: The name zero-copy-tensor-ipc used for list_segments.
list_active_segments = list_segments

__all__ = [
    "SharedTensor",
    "SegmentInfo",
    "create_shared_tensor",
    "attach_shared_tensor",
    "empty",
    "share",
    "list_segments",
    "list_active_segments",
    "cleanup_all_segments",
    "get_context",
    "ZctipcError",
    "InvalidArgument",
    "SegmentNotFound",
    "SegmentExists",
    "PermissionDenied",
    "NotAZctipcSegment",
    "IncompatibleVersion",
    "CorruptHeader",
    "OutOfSharedMemory",
    "UnsupportedDtype",
    "HandleClosed",
    "ForkedProcessError",
    "LibraryPoisoned",
    "ZctipcOSError",
]
