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
multiprocessing``), with forkserver as its start method, and for
torch.multiprocessing (``import zctipc as mp``: ``mp.spawn``, the sharing
strategies; docs/pytorch-names.md).

Importing zctipc loads no native code and no NumPy, and imports its own
modules as their names are first used (Note [a lazy package]): the Go
library is loaded on first use, and NumPy when an array is first met
(``zctipc._core.lazy``), so a process that moves no arrays never imports it.

The package is three layers, each importing only those below it (checked
by import-linter, ``make lint``): the core (``zctipc._core``: the native
library, dtypes, layout, waiting, memory and views, the pool, segments),
the wire (``zctipc._wire``: exports, the queue pickler, the ForkingPickler
reducers, the Arrow and CUDA codecs), and the user API in the modules below.
"""

import os as _os
import sys as _sys

from . import errors
from ._core import lazy as _lazy
from ._core import native as _native
from .errors import *  # noqa: F401,F403  (each name is in errors.__all__)

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    # Type checkers see every public name here, imported from where it lives,
    # which __getattr__ (below) imports on first use (Note [a lazy package]);
    # the multiprocessing names are the default context's, as namespace()
    # gives them. tests/python/test_types.py checks that this block names
    # everything __getattr__ offers.
    from multiprocessing import AuthenticationError as AuthenticationError
    from multiprocessing import BufferTooShort as BufferTooShort
    from multiprocessing import ProcessError as ProcessError
    from multiprocessing import TimeoutError as TimeoutError

    from . import arrow as arrow
    from . import buffers as buffers
    from . import cli as cli
    from . import connection as connection
    from . import context as context
    from . import cuda as cuda
    from . import events as events
    from . import managers as managers
    from . import pipeline as pipeline
    from . import pool as pool
    from . import queues as queues
    from . import reduction as reduction
    from . import shared_memory as shared_memory
    from . import spawning as spawning
    from . import strategy as strategy
    from . import streams as streams
    from . import synchronize as synchronize
    from . import tensor as tensor
    from . import util as util
    from ._wire.reducers import init_reductions as init_reductions
    from ._wire.reducers import init_torch_reductions as init_torch_reductions
    from ._wire.reducers import is_shared as is_shared
    from .arrow import TableHandle as TableHandle
    from .arrow import attach_table as attach_table
    from .arrow import share_table as share_table
    from .buffers import PoolStats as PoolStats
    from .buffers import empty as empty
    from .buffers import pool_stats as pool_stats
    from .buffers import set_pool_limit as set_pool_limit
    from .context import Process as Process
    from .context import _default
    from .events import Event as Event
    from .pipeline import Pipeline as Pipeline
    from .queues import DEFAULT_MAX_BYTES as DEFAULT_MAX_BYTES
    from .queues import JoinableQueue as JoinableQueue
    from .queues import Queue as Queue
    from .queues import SimpleQueue as SimpleQueue
    from .spawning import ProcessContext as ProcessContext
    from .spawning import SpawnContext as SpawnContext
    from .spawning import spawn as spawn
    from .spawning import start_processes as start_processes
    from .strategy import collect_garbage as collect_garbage
    from .strategy import daemon_status as daemon_status
    from .strategy import get_all_sharing_strategies as get_all_sharing_strategies
    from .strategy import get_sharing_strategy as get_sharing_strategy
    from .strategy import set_sharing_strategy as set_sharing_strategy
    from .streams import Stream as Stream
    from .streams import StreamReader as StreamReader
    from .streams import StreamWriter as StreamWriter
    from .tensor import SegmentInfo as SegmentInfo
    from .tensor import SharedTensor as SharedTensor
    from .tensor import attach_ref as attach_ref
    from .tensor import attach_shared_tensor as attach_shared_tensor
    from .tensor import cleanup_all_segments as cleanup_all_segments
    from .tensor import create_shared_tensor as create_shared_tensor
    from .tensor import list_segments as list_segments
    from .tensor import share as share

    __version__: str
    list_active_segments = list_segments
    Pool = _default.Pool
    Pipe = _default.Pipe
    Manager = _default.Manager
    Lock = _default.Lock
    RLock = _default.RLock
    Semaphore = _default.Semaphore
    BoundedSemaphore = _default.BoundedSemaphore
    Condition = _default.Condition
    Barrier = _default.Barrier
    Value = _default.Value
    Array = _default.Array
    RawValue = _default.RawValue
    RawArray = _default.RawArray
    cpu_count = _default.cpu_count
    current_process = _default.current_process
    parent_process = _default.parent_process
    active_children = _default.active_children
    freeze_support = _default.freeze_support
    get_context = _default.get_context
    get_start_method = _default.get_start_method
    set_start_method = _default.set_start_method
    get_all_start_methods = _default.get_all_start_methods
    get_logger = _default.get_logger
    log_to_stderr = _default.log_to_stderr
    set_forkserver_preload = _default.set_forkserver_preload
    set_executable = _default.set_executable
    allow_connection_pickling = _default.allow_connection_pickling
    reducer = _default.reducer

# Note [a lazy package]: ``import zctipc`` imports only the errors and the
# module that will load the library; every other public name is looked up
# in the module that defines it on first use (PEP 562), so a process that
# only imports zctipc, or uses one part of it, pays for no more. _EXPORTS
# says where each name lives (tests/python/test_public_api.py checks it
# against each module's __all__).
_EXPORTS = {
    "tensor": "SharedTensor SegmentInfo create_shared_tensor attach_shared_tensor share attach_ref list_segments "
    "cleanup_all_segments",
    "buffers": "empty pool_stats set_pool_limit PoolStats",
    "strategy": "set_sharing_strategy get_sharing_strategy get_all_sharing_strategies collect_garbage daemon_status",
    "streams": "Stream StreamWriter StreamReader",
    "pipeline": "Pipeline",
    "arrow": "share_table attach_table TableHandle",
    "queues": "DEFAULT_MAX_BYTES",
    # torch.multiprocessing's process face (docs/pytorch-names.md), in a
    # module not named spawn: importing zctipc.spawn would bind the module
    # over the function in the package.
    "spawning": "spawn start_processes ProcessContext SpawnContext",
    "_wire.reducers": "init_reductions init_torch_reductions is_shared",
    # The multiprocessing names, for ``import zctipc as multiprocessing``
    # (context.MULTIPROCESSING_NAMES), and Event, which streams share.
    "context": "Process Queue SimpleQueue JoinableQueue Pool Pipe Manager Lock RLock Semaphore BoundedSemaphore "
    "Condition Event Barrier Value Array RawValue RawArray cpu_count current_process parent_process "
    "active_children freeze_support get_context get_start_method set_start_method "
    "get_all_start_methods get_logger log_to_stderr set_forkserver_preload set_executable "
    "allow_connection_pickling ProcessError BufferTooShort TimeoutError AuthenticationError reducer",
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names.split()}
_WHERE["list_active_segments"] = "tensor"  # the name zero-copy-tensor-ipc used for list_segments
_RENAMED = {"list_active_segments": "list_segments"}

#: zctipc's own modules, and multiprocessing's submodules under zctipc's
#: name, imported on first use.
_MODULES = {
    "arrow",
    "buffers",
    "cli",
    "context",
    "cuda",
    "events",
    "pipeline",
    "queues",
    "spawning",
    "strategy",
    "streams",
    "tensor",
}
_SUBMODULES = {"connection", "managers", "pool", "reduction", "shared_memory", "synchronize", "util"}


if not TYPE_CHECKING:  # type checkers see the names themselves (above): a misspelt one is an error

    def __getattr__(name: str) -> object:
        import importlib

        if name == "__version__":  # read from the installed metadata when asked: importlib.metadata is slow to import
            global __version__
            __version__ = _native.package_version()
            return __version__
        if name in _MODULES or name in _SUBMODULES:
            return importlib.import_module(f".{name}", __name__)
        module = _WHERE.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        mod = importlib.import_module(f".{module}", __name__)
        value = mod.namespace()[name] if module == "context" else getattr(mod, _RENAMED.get(name, name))
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _MODULES)


_installed = False


def _install_reductions() -> None:
    """zctipc's ForkingPickler reducers, torch's among them once torch is
    imported; again, cheaply, for torch when it is imported later."""
    global _installed
    from ._wire import reducers

    if _installed:
        reducers.init_torch_reductions()
        return
    _installed = True
    reducers.init_reductions()


def _choose_start_method() -> None:
    from . import context

    context.choose_start_method()  # Note [the fork default] in zctipc.context


# The reducers go into ForkingPickler when zctipc loads its library (before
# that it has made nothing to send), or now when a module whose plain values
# they send through zctipc (arrays, tensors, Arrow tables, DataFrames) is
# already imported.
if any(m in _sys.modules for m in ("numpy", "torch", "pyarrow", "pandas", "polars")):
    _install_reductions()
else:
    _native.when_loaded(_install_reductions)
# torch imported later (or never): its reducers go in when it is, whatever
# came first (Note [meeting a module on import] in zctipc._core.lazy).
if "torch" not in _sys.modules:
    _lazy.when_imported("torch", _install_reductions)


def _keep_managers_plain() -> None:
    """The standard library's managers send NumPy arrays as without zctipc
    (Note [the standard library's managers] in zctipc.managers)."""
    from . import managers  # noqa: F401  (registers their connections)


_lazy.when_imported("multiprocessing.managers", _keep_managers_plain)
_native.when_loaded(_choose_start_method)

# ZCTIPC_LOG=debug: the log on stderr from now on (zctipc._core.log); only
# then is logging imported here (Note [a log that costs nothing unasked]).
if _os.environ.get("ZCTIPC_LOG"):
    from ._core import log as _log

    _log.configure_from_environment()

# Every name of multiprocessing.__all__ is here too (reducer among them), for
# ``import zctipc as multiprocessing``.
__all__ = sorted(set(_WHERE) | set(errors.__all__))
