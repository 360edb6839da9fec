"""Reducers for multiprocessing's ForkingPickler (multiprocessing.Queue,
Pipe, Pool arguments and results), registered the way torch.multiprocessing
registers its own: zctipc memory goes as a descriptor inlined in the
pickle; everything else pickles as before."""

import pickle
import sys
from multiprocessing.reduction import ForkingPickler

import numpy as np

from .._core import layout
from .._core.segments import SharedTensor
from . import exports, gpu, tables

_torch_fallback = None  # the torch tensor reducer registered before zctipc's


def torch_fallback():
    """The reducer torch tensors had before zctipc's (torch.multiprocessing's,
    when imported), for what zctipc does not send itself; or None."""
    return _torch_fallback


def _reduce_array(arr):
    e = exports.export_array(arr, copy=False)
    if e is None:
        return arr.__reduce__()
    return exports.decode, (exports.encode(e),)


def _reduce_shared(st):
    if st.closed:
        return st.__reduce__()  # raises HandleClosed
    return exports.decode, (exports.encode(exports.export_shared_tensor(st)),)


def _reduce_tensor(t):
    exports.check_grad(t)
    if t.device.type == "cuda":
        return gpu.reduce_cuda(t, _torch_fallback)
    e = exports.export_tensor(t, copy=False)
    if e is None:
        if _torch_fallback is not None:
            return _torch_fallback(t)
        return t.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    return exports.decode, (exports.encode(e), t.requires_grad)


def init_reductions():
    """Register zctipc's reducers with multiprocessing's ForkingPickler: for
    NumPy arrays and SharedTensors now, for torch tensors once torch is
    imported, and for pyarrow Tables and RecordBatches and pandas and polars
    DataFrames when their modules are imported (call it again after
    importing one of them to send its tables through standard channels).
    Tensors that are not zctipc memory keep the reducer that was registered
    before (torch.multiprocessing's, if imported). zctipc calls this at
    import and whenever it meets torch; calling it again is cheap."""
    ForkingPickler.register(np.ndarray, _reduce_array)
    ForkingPickler.register(SharedTensor, _reduce_shared)
    init_torch_reductions()
    for t in tables.table_types():
        ForkingPickler.register(t, tables.reduce_table)


def init_torch_reductions():
    """Register the torch tensor reducer if torch is imported and the
    registered one is not zctipc's (torch.multiprocessing, imported later,
    puts its own in place)."""
    global _torch_fallback
    torch = sys.modules.get("torch")
    if torch is not None:
        exports.BARE.add(torch.Tensor)
        current = ForkingPickler._extra_reducers.get(torch.Tensor)
        if current is not _reduce_tensor:
            _torch_fallback = current
            ForkingPickler.register(torch.Tensor, _reduce_tensor)


def is_shared(obj):
    """Whether obj (a NumPy array, a torch tensor or a SharedTensor) lies in
    zctipc shared memory, so that zctipc sends it by descriptor."""
    if isinstance(obj, SharedTensor):
        return not obj.closed
    if isinstance(obj, np.ndarray):
        e = exports.export_array(obj, copy=False)
    elif layout.is_torch_tensor(obj):
        e = exports.export_tensor(obj, copy=False)
    else:
        raise TypeError(f"is_shared() takes an array, a tensor or a SharedTensor, not {type(obj).__name__}")
    if e is None:
        return False
    e.release()
    return True
