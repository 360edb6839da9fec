"""The CUDA codec: torch CUDA tensors by legacy CUDA IPC.

The producer exports the base of the tensor's allocation
(``cuIpcGetMemHandle``) with the tensor's place in it and an interprocess
event recorded on its current stream; the consumer opens the allocation once
per process (cached) and makes its current stream wait for the event before
anything reads the memory. The producer keeps the tensor alive until every
consumer let go of it (a cross-process count), and warns at exit about
tensors still in use elsewhere.
"""

from __future__ import annotations

import atexit
import pickle
import threading
import warnings

from .._core import device as _device
from .._core import dtypes, memory, native, pool
from ..errors import CudaUnavailable, InvalidArgument
from . import exports

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeAlias

    import torch

    #: A pickle reduction: (rebuild, its arguments).
    Reduction: TypeAlias = tuple[Callable[..., object], tuple[Any, ...]]

# -- torch CUDA tensors by legacy IPC ---------------------------------------------

# Note [the producer keeps what it sent]: each storage this process sends is
# kept here with a pool slot whose cross-process count says how many holders
# it has: this process (one count) and every descriptor in flight or tensor
# received elsewhere (one each; a killed consumer's is given up by the cleanup
# daemon). A storage is let go once its count is back to one.

_lock = threading.Lock()
_sent: dict[tuple[int, int, int], _Sent] = {}  # (storage key) -> _Sent
_SWEEP_EVERY = 64  # sends between sweeps


class _Sent:
    def __init__(self, storage: torch.UntypedStorage, export: int, ipc: bytes, counter: int, address: Any) -> None:
        self.storage = storage  # keeps the memory alive
        self.export = export  # the export handle (its event), re-recorded for every send
        self.ipc = ipc  # the zct_cuda_ipc bytes
        self.counter = counter  # this process's ref on the count slot
        self.address = address  # of the count slot


_sends = 0


def _holders(ref: int) -> int:
    out = native.ffi().new("int64_t *")
    native.check(native.lib().zct_ref_holders(ref, out))
    return out[0]


def _sweep(final: bool = False) -> None:
    """Let go of the storages no other process holds; at exit, warn about
    the ones that are still held."""
    lib = native.lib()
    with _lock:
        done = [k for k, s in _sent.items() if _holders(s.counter) <= 1]
        for k in done:
            s = _sent.pop(k)
            lib.zct_cuda_ipc_release(s.export)
            lib.zct_ref_release(s.counter)
        left = len(_sent)
    if final and left:
        warnings.warn(
            f"zctipc: this process exits while {left} CUDA tensors it sent are still in use by other "
            "processes; their memory goes with this process, and those tensors become invalid. Keep the "
            "producer alive until consumers are done.",
            RuntimeWarning,
            stacklevel=2,
        )


def _at_exit() -> None:
    if native.loaded() and _sent:
        try:
            _sweep(final=True)
        except Exception:
            pass


atexit.register(_at_exit)


def _sent_record(t: torch.Tensor, storage: torch.UntypedStorage, stream: int) -> _Sent:
    """The _Sent record of the storage of CUDA tensor t, made on its first
    send; on a later send its event is recorded again on stream. The caller
    holds _lock."""
    key = (storage.data_ptr(), storage.nbytes(), storage._cdata)
    s = _sent.get(key)
    ffi, lib = native.ffi(), native.lib()
    if s is not None:
        native.check(lib.zct_cuda_ipc_record(s.export, stream))
        return s
    ipc, export = ffi.new("zct_cuda_ipc *"), ffi.new("zct_handle *")
    native.check(lib.zct_cuda_ipc_export(t.device.index, storage.data_ptr(), stream, ipc, export))
    try:
        ref, address = pool.alloc(8)
    except BaseException:
        lib.zct_cuda_ipc_release(export[0])
        raise
    s = _sent[key] = _Sent(storage, export[0], bytes(ffi.buffer(ipc)), ref, address)
    return s


def _counter_descriptor(s: _Sent) -> bytes:
    """Descriptor bytes carrying one more count on s's slot."""
    ref, offset = memory.find(s.address, 8)  # type: ignore[misc]  # a pool slot, which find() places
    return exports.encode(exports.Export(ref, offset, dtypes.CODES["uint8"], (8,), (1,), memory.NUMPY))


def _adopt_counter(data: bytes) -> int:
    """The ref of the count a counter descriptor carried."""
    view = native.ffi().new("zct_view *")
    native.check(native.lib().zct_ref_decode(data, len(data), view))
    return view.ref


def reduce_tensor(t: torch.Tensor) -> Reduction:
    """The pickle reduction of a torch CUDA tensor: (rebuild, args) that
    opens the same device memory in the receiver. Raises CudaUnavailable
    when zctipc cannot reach CUDA."""
    global _sends
    import torch

    storage = t.untyped_storage()
    if storage.nbytes() == 0:
        return _rebuild_empty, (str(t.dtype).removeprefix("torch."), tuple(t.shape), t.device.index)
    stream = torch.cuda.current_stream(t.device).cuda_stream
    with _lock:
        s = _sent_record(t, storage, stream)
        counter = _counter_descriptor(s)
    _sends += 1
    if _sends % _SWEEP_EVERY == 0:
        _sweep()
    return rebuild_tensor, (
        s.ipc,
        counter,
        str(t.dtype).removeprefix("torch."),
        tuple(t.shape),
        tuple(t.stride()),
        t.storage_offset(),
        storage.nbytes(),
        t.requires_grad,
    )


def _rebuild_empty(dtype: str, shape: tuple[int, ...], device: int) -> torch.Tensor:
    import torch

    return torch.empty(shape, dtype=getattr(torch, dtype), device=f"cuda:{device}")


def rebuild_tensor(
    ipc_bytes: bytes,
    counter: bytes,
    dtype: str,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    storage_offset: int,
    nbytes: int,
    requires_grad: bool = False,
) -> torch.Tensor:
    """Open device memory another process sent (legacy IPC) as a torch
    tensor; the current stream waits for the sender's work first."""
    import torch

    ffi, lib = native.ffi(), native.lib()
    ipc = ffi.new("zct_cuda_ipc *")
    if len(ipc_bytes) != ffi.sizeof("zct_cuda_ipc"):
        raise InvalidArgument(f"a CUDA descriptor of {len(ipc_bytes)} bytes, not {ffi.sizeof('zct_cuda_ipc')}")
    ffi.memmove(ipc, ipc_bytes, len(ipc_bytes))
    ref = _adopt_counter(counter)  # this tensor's count on the sender's record
    index = ipc.device
    stream = torch.cuda.current_stream(index).cuda_stream
    ptr = ffi.new("uint64_t *")
    try:
        native.check(lib.zct_cuda_ipc_open(ipc, stream, ptr))
    except BaseException:
        lib.zct_ref_release(ref)
        raise

    def release(ipc: Any = ipc, ref: int = ref) -> None:
        native.finalize("zct_cuda_ipc_close", ipc, "closing CUDA memory")
        native.finalize("zct_ref_release", ref, "releasing a buffer")

    memory = _device.DeviceMemory(ptr[0], nbytes, index, release)
    t = _device.torch_view(memory, getattr(torch, dtype), shape, strides, storage_offset)
    if requires_grad:
        t.requires_grad_()
    return t


def reduce_cuda(t: torch.Tensor, fallback: Callable[[torch.Tensor], Any] | None = None) -> Any:
    """A CUDA tensor by CUDA IPC; where zctipc cannot reach CUDA, by
    fallback (the reducer torch.multiprocessing registered), or as torch
    pickles it."""
    try:
        return reduce_tensor(t)
    except CudaUnavailable:
        if fallback is not None:
            return fallback(t)
        return t.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
