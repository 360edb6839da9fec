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

Importing zctipc loads no native code and no NumPy: the Go library is
loaded on first use, and NumPy when an array is first met
(``zctipc._core.lazy``), so a process that moves no arrays never imports it.

The package is three layers, each importing only those below it (checked
by import-linter, ``make lint``): the core (``zctipc._core``: the native
library, dtypes, layout, waiting, memory and views, the pool, segments),
the wire (``zctipc._wire``: exports, the queue pickler, the ForkingPickler
reducers, the Arrow and CUDA codecs), and the user API in the modules below.
"""

from . import arrow, buffers, context, cuda, errors, events, pipeline, queues, strategy, streams, tensor
from ._core import memory as _memory
from ._core import native as _native
from ._wire import reducers as _reducers
from ._wire.reducers import init_reductions, init_torch_reductions, is_shared
from .arrow import *  # noqa: F401,F403
from .buffers import *  # noqa: F401,F403
from .errors import *  # noqa: F401,F403  (each name is in errors.__all__)
from .pipeline import *  # noqa: F401,F403
from .queues import DEFAULT_MAX_BYTES
from .strategy import *  # noqa: F401,F403
from .streams import *  # noqa: F401,F403
from .tensor import *  # noqa: F401,F403  (each name is in tensor.__all__)

# The multiprocessing names, for ``import zctipc as multiprocessing``:
# Process, Queue, SimpleQueue, JoinableQueue, Pool, Pipe, Lock, Event, ...
# (context.MULTIPROCESSING_NAMES lists them all).
globals().update(context.namespace())

# zctipc's reducers go into ForkingPickler now, and its torch reducer once
# zctipc first makes a torch view.
init_reductions()
_memory.when_torch_is_met(_reducers.init_torch_reductions)
# Note [the fork default] in zctipc.context.
_native.when_loaded(context.choose_start_method)

#: multiprocessing's submodules, under zctipc's name, imported on first use.
_SUBMODULES = {"connection", "managers", "pool", "reduction", "shared_memory", "synchronize", "util"}


def __getattr__(name):
    if name == "__version__":  # read from the installed metadata when asked: importlib.metadata is slow to import
        global __version__
        __version__ = _native.package_version()
        return __version__
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: The name zero-copy-tensor-ipc used for list_segments.
list_active_segments = list_segments  # noqa: F405

__all__ = sorted(set(
    tensor.__all__ + buffers.__all__ + strategy.__all__ + streams.__all__ + pipeline.__all__ + arrow.__all__
    + ["init_reductions", "init_torch_reductions", "is_shared", "list_active_segments", "DEFAULT_MAX_BYTES"]
    + context.MULTIPROCESSING_NAMES + errors.__all__
))
