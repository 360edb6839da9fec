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

from .._core import layout, lazy
from .._core.segments import SharedTensor
from ..errors import OutOfSharedMemory
from . import exports, reductions, storages

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any, TypeAlias

    import numpy as np
    import torch
    from numpy.typing import NDArray

    #: A pickle reduction, as __reduce__ returns one: (rebuild, its arguments, ...), or a global's name.
    Reduction: TypeAlias = tuple[Any, ...] | str
else:
    np = lazy.numpy(__name__)

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


class Forking(reductions.Channel):
    """multiprocessing's channels (Note [one table of reducers] in
    zctipc._wire.reductions): a descriptor goes inside the pickle, its
    count given back if the dump fails; an array is copied into the pool
    from COPY_BYTES, into a buffer that is there at once, else pickled as
    NumPy pickles it; what zctipc does not send itself goes torch's way."""

    copy_bytes = COPY_BYTES
    in_band = exports.IN_BAND
    shared_with_torch = True
    protocol = pickle.DEFAULT_PROTOCOL

    def send(self, e: exports.Export, obj: Any) -> Reduction:
        try:
            return exports.decode, (carry(e),)
        except OutOfSharedMemory:  # no room for the descriptor's ticket; e was given back
            if not isinstance(obj, exports.ndarray):
                raise
            exports.warn_in_band(obj.nbytes)  # an array's bytes can go in band still
            return self.small(obj)

    def send_storage(self, e: exports.Export) -> Reduction:
        return _rebuild_storage, (carry(e),)

    def small(self, arr: NDArray[Any]) -> Reduction:
        return arr.__reduce__()  # a receiver need not import zctipc


def _rebuild_storage(data: bytes) -> torch.UntypedStorage:
    """The torch storage a descriptor (made by Forking.send_storage) stands for."""
    return exports.decode(data).untyped_storage()


#: The channel of ForkingPickler's registered reducers.
FORKING = Forking()


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
    init_torch_reductions()
    for t, reducer in reductions.bound(FORKING).items():
        if t.__module__.partition(".")[0] != "torch":  # init_torch_reductions registers torch's
            ForkingPickler.register(t, reducer)


def _init_numpy_reductions() -> None:
    ForkingPickler.register(np.ndarray, reductions.bound(FORKING)[np.ndarray])


lazy.when_numpy_is_met(_init_numpy_reductions)


def init_torch_reductions() -> None:
    """Register the torch tensor and storage reducers if torch is imported
    and the registered ones are not zctipc's, over torch.multiprocessing's
    (imported here first, so that importing it later keeps zctipc's), and
    make torch's is_shared() and share_memory_() know zctipc memory."""
    torch = sys.modules.get("torch")
    if torch is not None:
        import torch.multiprocessing  # noqa: F401  (registers torch's reducers, once)

        storages.patch_torch()
        exports.BARE.add(torch.Tensor)
        registered = ForkingPickler._extra_reducers  # type: ignore[attr-defined]  # private, not in typeshed
        ours = reductions.bound(FORKING)
        for kind, t in (("tensor", torch.Tensor), ("storage", torch.UntypedStorage)):
            current = registered.get(t)
            if not getattr(current, reductions.MARK, False):
                # Only the reducer found when zctipc's was first registered
                # (torch.multiprocessing's) is the fallback: one registered
                # since may hand on to zctipc's (a wrapper), which would
                # then call it back, for ever.
                if current is not None and kind not in reductions.torch_reducers:
                    reductions.torch_reducers[kind] = current
                ForkingPickler.register(t, ours[t])


def is_shared(obj: object) -> bool:
    """Whether obj (a NumPy array, a torch tensor or a SharedTensor) lies in
    zctipc shared memory: an array or SharedTensor that zctipc sends by
    descriptor, or a CPU tensor whose storage does (Tensor.is_shared() then
    says True too), as a tensor that zctipc has sent does."""
    if isinstance(obj, SharedTensor):
        return not obj.closed
    if isinstance(obj, np.ndarray):
        e = exports.find_array(obj)
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
