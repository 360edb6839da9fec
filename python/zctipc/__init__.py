"""zctipc: zero-copy tensor IPC.

Hand NumPy arrays and torch tensors to other processes as ~100-byte
descriptors of shared memory instead of pickled copies::

    import numpy as np, zctipc

    t = zctipc.create_shared_tensor("frames", data=np.arange(6.0).reshape(2, 3))
    # in another process:
    a = zctipc.attach_shared_tensor("frames").numpy()   # a view, no copy

Importing zctipc loads no native code: the Go library is loaded on first use.
"""

from . import errors, tensor
from .context import get_context
from .errors import *  # noqa: F401,F403  (each name is in errors.__all__)
from .tensor import *  # noqa: F401,F403  (each name is in tensor.__all__)
from .tensor import list_segments

try:
    from importlib.metadata import PackageNotFoundError, version as _version

    __version__ = _version("zctipc")  # set from go/zctipc/version.go at build time
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

#: The name zero-copy-tensor-ipc used for list_segments.
list_active_segments = list_segments

__all__ = tensor.__all__ + ["list_active_segments", "get_context"] + errors.__all__
