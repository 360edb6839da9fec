"""Reducers for multiprocessing's ForkingPickler (multiprocessing.Queue,
Pipe, Pool arguments and results, Process arguments under spawn and
forkserver), registered the way torch.multiprocessing registers its own:
zctipc memory goes as a descriptor inlined in the pickle, and so does a
NumPy array of COPY_BYTES or more, copied once into the pool when it has
room at once, else pickled in band as before, with a warning the first
time (Note [sending in band when shared memory is full] in
zctipc._wire.exports). A CPU torch tensor goes as its storage and where it
lies in it; the storage is moved into zctipc memory first, so the receiver
shares it, as torch.multiprocessing shares tensors (zctipc._wire.storages),
or, in torch's shared memory already, goes as torch sends it. Everything
else pickles as before."""

from __future__ import annotations

import pickle
import sys
import threading
from multiprocessing.reduction import ForkingPickler

from .._core import layout, lazy, native
from .._core.segments import SharedTensor
from ..errors import OutOfSharedMemory
from . import exports, gpu, storages, tables

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeAlias

    import numpy as np
    import torch
    from numpy.typing import NDArray

    #: A pickle reduction, as __reduce__ returns one: (rebuild, its arguments, ...), or a global's name.
    Reduction: TypeAlias = tuple[Any, ...] | str
else:
    np = lazy.numpy(__name__)

_torch_fallback: Callable[[torch.Tensor], Any] | None = None  # the torch tensor reducer registered before zctipc's
_torch_storage_fallback: Callable[[torch.UntypedStorage], Any] | None = None  # and the torch storage reducer


def torch_fallback() -> Callable[[torch.Tensor], Any] | None:
    """The reducer torch tensors had before zctipc's (torch.multiprocessing's,
    when imported), for what zctipc does not send itself; or None."""
    return _torch_fallback


#: A NumPy array of this many bytes or more that is not zctipc memory is
#: copied once into the pool and sent as a descriptor (cheaper than pickling
#: it through a pipe, which copies it four times); a smaller one pickles as
#: before.
COPY_BYTES = 1 << 20


# Note [counts of a failed dump]: a descriptor inlined in a ForkingPickler
# pickle carries a count, added when it is made (Note [counts in flight] in
# zctipc._wire.pickler). When the dump fails after it (a non-leaf tensor
# that requires grad further on, an object that cannot be pickled), the
# pickle is never sent, and nothing would ever take those counts: the pool
# buffers stayed in use for the life of the process. So every ForkingPickler
# dump keeps the descriptors whose counts its pickle carries, and gives them
# back if it raises. A dump that succeeded made its pickle, which holds its
# counts, even inside another dump that then fails: a reducer that pickles
# may have sent that pickle already (a manager proxy's call, a pipe's send),
# and a count given back under a receiver is a buffer freed under it, which
# it read as a stale slot, or as another message's bytes once reused. (A
# reducer that inlines a pickle of its own in the outer one leaks its counts
# when the outer fails, as a pickle made and never sent does.) The wrapper
# is dump(), which ForkingPickler takes when the reducers are registered,
# and the managers' pickler always, since it sends arrays of its own
# before then (zctipc._wire.values).
# Threat model: only this process's own pickling runs here; what must never
# happen is a count released twice (a pickle that was made keeps its
# counts) or one that nobody holds.

_dumping = threading.local()


def carry(e: exports.Export) -> bytes:
    """The descriptor bytes of e, which carry its count; the count goes
    back if the dump they are made for fails."""
    data = exports.encode(e)
    held: list[bytes] | None = getattr(_dumping, "held", None)
    if held is not None:
        held.append(data)
    return data


_plain_dump = ForkingPickler.dump


def dump(self: ForkingPickler, obj: object) -> None:
    """ForkingPickler.dump, which releases the counts of its descriptors
    when it raises (Note [counts of a failed dump])."""
    outer: list[bytes] | None = getattr(_dumping, "held", None)
    held: list[bytes] = []
    _dumping.held = held
    try:
        _plain_dump(self, obj)
    except BaseException:
        for data in held:
            exports.drop(data)
        raise
    finally:
        _dumping.held = outer


# Note [reducing in a forked child]: a child forked from a process that
# loaded zctipc inherits these reducers but cannot call zctipc (a Go runtime
# does not survive fork). A program may still fork children on purpose (a
# DataLoader given multiprocessing.get_context("fork")) and send arrays,
# tensors and tables from them through multiprocessing's channels: there
# they pickle as they would without zctipc (torch's tensors torch's way),
# and only zctipc's own objects (a SharedTensor) raise ForkedProcessError.


def _reduce_array(arr: NDArray[Any]) -> Reduction:
    if native.forked():  # Note [reducing in a forked child]
        return arr.__reduce__()
    # Copied into the pool only when a buffer is there at once, else pickled
    # in band (Note [sending in band when shared memory is full] in exports).
    e = exports.export_array(arr, copy=arr.nbytes >= COPY_BYTES, in_band=exports.IN_BAND)
    if e is None:
        return arr.__reduce__()
    try:
        return exports.decode, (carry(e),)
    except OutOfSharedMemory:  # no room for the descriptor's ticket either; e was given back
        exports.warn_in_band(arr.nbytes)
        return arr.__reduce__()


def _reduce_shared(st: SharedTensor) -> Reduction:
    if st.closed:
        return st.__reduce__()  # raises HandleClosed
    return exports.decode, (carry(exports.export_shared_tensor(st)),)


def _reduce_tensor(t: torch.Tensor) -> Reduction:
    exports.check_grad(t)
    if storages.shareable(t) and not native.forked():  # Note [reducing in a forked child]
        return storages.reduce_tensor(t)  # its storage comes to _reduce_storage
    if t.is_cuda:
        return gpu.reduce_cuda(t, _torch_fallback)
    if _torch_fallback is not None:
        return _torch_fallback(t)
    return t.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


def _reduce_storage(s: torch.UntypedStorage) -> Reduction:
    if storages.is_cpu(s) and not storages.is_torch_shared(s) and not native.forked():
        if s.nbytes() == 0:
            return storages.rebuild_empty, ()
        return _rebuild_storage, (carry(exports.export_storage(s)),)
    # In torch's shared memory, or on a device: torch's way, in torch's channels.
    if _torch_storage_fallback is not None:
        return _torch_storage_fallback(s)
    return s.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


def _reduce_table(obj: Any) -> Reduction:
    if native.forked():  # Note [reducing in a forked child]
        return obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    return tables.reduce_table(obj)


def _rebuild_storage(data: bytes) -> torch.UntypedStorage:
    """The torch storage a descriptor (made by _reduce_storage) stands for."""
    return exports.decode(data).untyped_storage()


def init_reductions() -> None:
    """Register zctipc's reducers with multiprocessing's ForkingPickler: for
    NumPy arrays and SharedTensors now, for torch tensors once torch is
    imported, and for pyarrow Tables and RecordBatches and pandas and polars
    DataFrames when their modules are imported (call it again after
    importing one of them to send its tables through standard channels).
    A CPU tensor is shared, its storage moved into zctipc memory if need
    be; storages in torch's shared memory, and tensors zctipc does not send
    itself (quantized, on other devices), keep the reducers registered
    before (torch.multiprocessing's). zctipc calls this at import when
    NumPy, torch, pyarrow, pandas or polars is imported already, else when
    it loads its library (before which it has made nothing to send), and
    its torch reducers when torch is imported after zctipc (Note [meeting
    a module on import] in zctipc._core.lazy); calling it again is cheap. NumPy arrays are
    registered once NumPy is imported, when zctipc finds it so (its own
    first use of NumPy, a queue's pickler, a child process started with a
    zctipc context, or this call)."""
    lazy.check()  # registers NumPy's (_init_numpy_reductions) if it is imported
    ForkingPickler.dump = dump  # type: ignore[method-assign,assignment]  # Note [counts of a failed dump]
    ForkingPickler.register(SharedTensor, _reduce_shared)
    init_torch_reductions()
    for t in tables.table_types():
        ForkingPickler.register(t, _reduce_table)


def _init_numpy_reductions() -> None:
    ForkingPickler.register(np.ndarray, _reduce_array)


lazy.when_numpy_is_met(_init_numpy_reductions)


def init_torch_reductions() -> None:
    """Register the torch tensor and storage reducers if torch is imported
    and the registered ones are not zctipc's, over torch.multiprocessing's
    (imported here first, so that importing it later keeps zctipc's), and
    make torch's is_shared() and share_memory_() know zctipc memory."""
    global _torch_fallback, _torch_storage_fallback
    torch = sys.modules.get("torch")
    if torch is not None:
        import torch.multiprocessing  # noqa: F401  (registers torch's reducers, once)

        storages.patch_torch()
        exports.BARE.add(torch.Tensor)
        reducers = ForkingPickler._extra_reducers  # type: ignore[attr-defined]  # private, not in typeshed
        current = reducers.get(torch.Tensor)
        if current is not _reduce_tensor:
            _torch_fallback = current
            ForkingPickler.register(torch.Tensor, _reduce_tensor)
        current = reducers.get(torch.UntypedStorage)
        if current is not _reduce_storage:
            _torch_storage_fallback = current
            ForkingPickler.register(torch.UntypedStorage, _reduce_storage)


def is_shared(obj: object) -> bool:
    """Whether obj (a NumPy array, a torch tensor or a SharedTensor) lies in
    zctipc shared memory: an array or SharedTensor that zctipc sends by
    descriptor, or a CPU tensor whose storage does (Tensor.is_shared() then
    says True too), as a tensor that zctipc has sent does."""
    if isinstance(obj, SharedTensor):
        return not obj.closed
    if isinstance(obj, np.ndarray):
        e = exports.export_array(obj, copy=False)
    elif layout.is_torch_tensor(obj):
        if not storages.shareable(obj):
            return False
        return storages.is_zctipc(obj.untyped_storage())
    else:
        raise TypeError(f"is_shared() takes an array, a tensor or a SharedTensor, not {type(obj).__name__}")
    if e is None:
        return False
    e.release()
    return True
