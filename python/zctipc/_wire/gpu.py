"""The CUDA codec: torch CUDA tensors between processes.

Two routes, chosen per storage by the producer:

* **By file descriptor** (the VMM route), for storages made by zctipc's
  shareable allocator (``zctipc.cuda.use_shareable_allocator``): the
  producer names the VMM allocation that holds the storage and the storage's
  place in it; the consumer fetches the allocation's file descriptor from
  the producer (SCM_RIGHTS) and maps it, once per process. No legacy IPC
  handle and no ptrace permission is involved, and a consumer's mapping
  stays valid if the producer dies.
* **Legacy IPC** for every other storage: the producer exports the base of
  the storage's allocation (``cuIpcGetMemHandle``); the consumer opens it
  once per process (cached).

Either way the producer records an interprocess event on its current
stream, which the consumer's current stream waits on before anything reads
the memory, and keeps the storage alive until every consumer let go of it
(a cross-process count). It warns at exit about legacy tensors still in use
elsewhere.
"""

from __future__ import annotations

import os
import pickle
import threading
import warnings

from .._core import device as _device
from .._core import dtypes, memory, native, pool
from ..errors import CudaError, CudaUnavailable, InvalidArgument
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

# Re-entrant: the exit hook's sweep runs from zctipc's SIGTERM handler too,
# which may interrupt this thread while it holds the lock (a send, a sweep);
# it never returns there (the process dies of the signal), and a plain lock
# hung it instead.
_lock = threading.RLock()
_sent: dict[tuple[int, int, int], _Sent] = {}  # (storage key) -> _Sent
_SWEEP_EVERY = 64  # sends between sweeps

#: Whether a CUDA tensor that cannot go by CUDA IPC goes through host shared
#: memory instead (zctipc.cuda.set_host_fallback; the environment variable
#: ZCTIPC_CUDA_HOST_FALLBACK=1 sets it at import).
host_fallback = os.environ.get("ZCTIPC_CUDA_HOST_FALLBACK", "") == "1"


class _Sent:
    def __init__(
        self, storage: torch.UntypedStorage, export: int, desc: bytes, counter: int, address: Any, vmm: bool = False
    ) -> None:
        self.storage = storage  # keeps the memory alive
        self.export = export  # the export handle (its event), re-recorded for every send
        self.desc = desc  # the zct_cuda_ipc bytes, or with vmm the zct_cuda_vmm bytes
        self.counter = counter  # this process's ref on the count slot
        self.address = address  # of the count slot
        self.vmm = vmm  # by file descriptor: a consumer's mapping outlives this process


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
        legacy = sum(not s.vmm for s in _sent.values())
    if final and left:
        warnings.warn(
            f"zctipc: this process exits while {left} CUDA tensors it sent are still in use by other "
            f"processes: {legacy} by legacy CUDA IPC, whose memory goes with this process (those tensors "
            f"become invalid), and {left - legacy} by file descriptor, which consumers that mapped them keep, "
            "but which a message not yet received can no longer fetch. Keep the producer alive until "
            "consumers are done.",
            RuntimeWarning,
            stacklevel=2,
        )


def _at_exit() -> None:
    if native.loaded() and _sent:
        _sweep(final=True)


# Before this process lets go of its counts (those of the slots above among
# them), which would make every storage look unheld.
native.before_letting_go(_at_exit)


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
    export = ffi.new("zct_handle *")
    vmm = _vmm_export(storage.data_ptr(), stream, export)
    if vmm:
        ipc = bytes(ffi.buffer(vmm))
    else:
        desc = ffi.new("zct_cuda_ipc *")
        native.check(lib.zct_cuda_ipc_export(t.device.index, storage.data_ptr(), stream, desc, export))
        ipc = bytes(ffi.buffer(desc))
    try:
        ref, address = pool.alloc(8)
    except BaseException:
        lib.zct_cuda_ipc_release(export[0])
        raise
    s = _sent[key] = _Sent(storage, export[0], ipc, ref, address, vmm=bool(vmm))
    return s


def _vmm_export(ptr: int, stream: int, export: Any) -> Any:
    """The zct_cuda_vmm of a storage in shareable memory (its export handle
    in export): made by zctipc's allocator, by zctipc.cuda.empty or
    share_state_dict, or received by file descriptor. None for another
    storage, which goes by legacy IPC."""
    vmm = native.ffi().new("zct_cuda_vmm *")
    status = native.lib().zct_cuda_vmm_export(ptr, stream, vmm, export)
    if status == native.E_NOT_FOUND:
        return None
    native.check(status)
    return vmm


def _counter(s: _Sent) -> exports.Export:
    """An Export of s's count slot with one more count: a torch tensor of 8
    bytes when received, which holds the count while it lives."""
    ref, offset = memory.find(s.address, 8)  # type: ignore[misc]  # a pool slot, which find() places
    return exports.Export(ref, offset, dtypes.CODES["uint8"], (8,), (1,), memory.TORCH)


def _adopt_counter(data: bytes) -> int:
    """The ref of the count a counter descriptor carried."""
    view = native.ffi().new("zct_view *")
    native.check(native.lib().zct_ref_decode(data, len(data), view))
    return view.ref


def reduce_tensor(t: torch.Tensor, carry: Callable[[exports.Export], object] | None = None) -> Reduction:
    """The pickle reduction of a torch CUDA tensor: (rebuild, args) that
    opens the same device memory in the receiver. The count the receiver's
    tensor holds goes in the pickle as descriptor bytes, or, given carry, as
    what carry makes of its Export (a pickler's out-of-band buffer, released
    with the others if the message is not sent). Raises CudaUnavailable when
    zctipc cannot reach CUDA, and CudaError when the driver cannot export
    the memory; then nothing of this tensor was taken."""
    global _sends
    import torch

    storage = t.untyped_storage()
    if storage.nbytes() == 0:
        return _rebuild_empty, (str(t.dtype).removeprefix("torch."), tuple(t.shape), t.device.index)
    stream = torch.cuda.current_stream(t.device).cuda_stream
    with _lock:
        s = _sent_record(t, storage, stream)
        counter = _counter(s)
    held = carry(counter) if carry is not None else exports.encode(counter)
    _sends += 1
    if _sends % _SWEEP_EVERY == 0:
        _sweep()
    return rebuild_tensor, (
        "vmm" if s.vmm else "ipc",
        s.desc,
        held,
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
    route: str,
    data: bytes,
    counter: bytes | torch.Tensor,
    dtype: str,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    storage_offset: int,
    nbytes: int,
    requires_grad: bool = False,
) -> torch.Tensor:
    """A torch tensor over device memory another process sent, by route:
    "ipc", a zct_cuda_ipc (legacy IPC; the allocation opened once per
    process), or "vmm", a zct_cuda_vmm (by file descriptor; the allocation
    mapped once per process). The current stream waits for the sender's
    work first. counter holds the tensor's count on the sender's record:
    descriptor bytes, or a received tensor over the count slot."""
    import torch

    if route not in ("ipc", "vmm"):
        raise InvalidArgument(f"a CUDA route {route!r}, not 'ipc' or 'vmm'")
    ffi, lib = native.ffi(), native.lib()
    struct = f"zct_cuda_{route}"
    desc = ffi.new(struct + " *")
    if len(data) != ffi.sizeof(struct):
        raise InvalidArgument(f"a CUDA descriptor of {len(data)} bytes, not {ffi.sizeof(struct)}")
    ffi.memmove(desc, data, len(data))
    if isinstance(counter, bytes):
        ref = _adopt_counter(counter)  # this tensor's count on the sender's record
        holder: object = None
    else:
        ref, holder = 0, counter  # the count lives while the holder does
    index = desc.device
    stream = torch.cuda.current_stream(index).cuda_stream
    ptr = ffi.new("uint64_t *")
    try:
        native.check(getattr(lib, f"zct_cuda_{route}_open")(desc, stream, ptr))
    except BaseException:
        if ref:
            lib.zct_ref_release(ref)
        raise

    def release(desc: Any = desc, ref: int = ref, holder: object = holder, index: int = index) -> None:
        # The work this process queued on the memory is done before the
        # mapping may go and the producer may reuse the memory.
        try:
            _device.synchronize(index)
        except Exception:
            pass  # at exit, torch may be gone: the process's work went with it
        native.finalize(f"zct_cuda_{route}_close", desc, "closing CUDA memory")
        if ref:
            native.finalize("zct_ref_release", ref, "releasing a buffer")

    memory = _device.DeviceMemory(ptr[0], nbytes, index, release)
    t = _device.torch_view(memory, getattr(torch, dtype), shape, strides, storage_offset)
    if requires_grad:
        t.requires_grad_()
    return t


def reduce_cuda(
    t: torch.Tensor,
    fallback: Callable[[torch.Tensor], Any] | None = None,
    carry: Callable[[exports.Export], object] | None = None,
) -> Any:
    """A CUDA tensor by CUDA IPC (carry: as reduce_tensor). Where zctipc
    cannot reach CUDA: by fallback (the reducer torch.multiprocessing
    registered), or as torch pickles it. With host_fallback set, a tensor
    that cannot go by CUDA IPC (no CUDA here, or memory the driver cannot
    export) goes through host shared memory instead, and is copied back to
    its device on receipt."""
    try:
        return reduce_tensor(t, carry)
    except (CudaUnavailable, CudaError) as exc:
        if host_fallback:
            return _rebuild_from_host, (t.detach().cpu(), t.device.index, t.requires_grad)
        if not isinstance(exc, CudaUnavailable):
            raise
        if fallback is not None:
            return fallback(t)
        return t.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


def _rebuild_from_host(t: torch.Tensor, device: int, requires_grad: bool = False) -> torch.Tensor:
    """A tensor sent through host memory (host_fallback), back on its
    device."""
    out = t.to(f"cuda:{device}")
    return out.requires_grad_() if requires_grad else out
