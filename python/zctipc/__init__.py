"""zctipc: zero-copy tensor IPC.

Hand NumPy arrays and torch tensors to other processes as ~100-byte
descriptors of shared memory instead of pickled copies::

    import numpy as np, zctipc

    t = zctipc.create_shared_tensor("frames", data=np.arange(6.0).reshape(2, 3))
    # in another process:
    a = zctipc.attach_shared_tensor("frames").numpy()   # a view, no copy

Queues move whole objects, with the arrays and tensors inside them as
descriptors::

    q = zctipc.Queue()                       # multiprocessing.Queue's API
    q.put({"frame": np.zeros((1080, 1920, 3), np.uint8), "id": 7})

Streams carry fixed-size frames from one writer to many readers, in place
(``zctipc.Stream``, ``zctipc.Pipeline``).

zctipc also stands in for multiprocessing (``import zctipc as
multiprocessing``), with forkserver as its start method.

Importing zctipc loads no native code: the Go library is loaded on first use.
"""

from . import arrow, cleanup, context, cuda, errors, pipeline, pool, queues, reductions, streams, tensor
from .arrow import *  # noqa: F401,F403
from .cleanup import *  # noqa: F401,F403
from .errors import *  # noqa: F401,F403  (each name is in errors.__all__)
from .pipeline import *  # noqa: F401,F403
from .pool import *  # noqa: F401,F403
from .queues import DEFAULT_MAX_BYTES
from .reductions import *  # noqa: F401,F403
from .streams import *  # noqa: F401,F403
from .tensor import *  # noqa: F401,F403  (each name is in tensor.__all__)
from .tensor import list_segments

# The multiprocessing names, for ``import zctipc as multiprocessing``:
# Process, Queue, SimpleQueue, JoinableQueue, Pool, Pipe, Lock, Event, ...
# (context.MULTIPROCESSING_NAMES lists them all).
globals().update(context.namespace())

reductions.init_reductions()

try:
    from importlib.metadata import PackageNotFoundError, version as _version

    __version__ = _version("zctipc")  # set from go/version/version.go at build time
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

#: The name zero-copy-tensor-ipc used for list_segments.
list_active_segments = list_segments

__all__ = (tensor.__all__ + pool.__all__ + reductions.__all__ + cleanup.__all__ + streams.__all__ + pipeline.__all__
           + arrow.__all__
           + ["list_active_segments", "DEFAULT_MAX_BYTES"]
           + context.MULTIPROCESSING_NAMES + errors.__all__)
