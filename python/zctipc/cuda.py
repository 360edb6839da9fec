"""CUDA tensors between processes, without staging through host memory.

Two routes, both through the Go core, which loads the CUDA driver
(``libcuda.so.1``) on first use:

* **Legacy IPC** carries torch CUDA tensors through :class:`zctipc.Queue`
  and the pickling hooks: the producer exports the base of the tensor's
  allocation (``cuIpcGetMemHandle``) with the tensor's place in it and an
  interprocess event recorded on its current stream; the consumer opens the
  allocation once per process (cached) and makes its current stream wait for
  the event before anything reads the memory. The producer keeps the tensor
  alive until every consumer let go of it (a cross-process count), and warns
  at exit about tensors still in use elsewhere.
* **VMM**: :func:`empty` allocates shareable memory (``cuMemCreate`` with
  POSIX file-descriptor handles, at the device's granularity). A
  :class:`CudaTensor` pickles by name; the receiver gets the allocation's
  file descriptor over a Unix socket (SCM_RIGHTS) and maps it. The memory
  lives until every process freed it.

Without a driver or a device, :func:`is_available` is False and every GPU
call raises :class:`CudaUnavailable`; the rest of zctipc is unaffected.
"""

import atexit
import threading
import warnings
import weakref

import numpy as np

from . import _dtypes, _native
from .errors import CudaUnavailable, InvalidArgument
from .tensor import _shape_tuple

__all__ = ["is_available", "device_count", "unavailable_reason", "empty", "CudaTensor", "ipc_opens"]

KDL_CUDA = 2  # DLPack's device type for CUDA memory


def _devices():
    ffi = _native.ffi()
    count, version = ffi.new("int32_t *"), ffi.new("int32_t *")
    _native.check(_native.lib().zct_cuda_devices(count, version))
    return count[0], version[0]


def is_available():
    """Whether a CUDA driver and at least one device are usable here."""
    try:
        _devices()
    except CudaUnavailable:
        return False
    return True


def unavailable_reason():
    """Why CUDA cannot be used here, or None when it can."""
    try:
        _devices()
    except CudaUnavailable as exc:
        return str(exc)
    return None


def device_count():
    """The number of CUDA devices (0 without a driver)."""
    try:
        return _devices()[0]
    except CudaUnavailable:
        return 0


def ipc_opens():
    """How many device allocations this process opened with
    ``cuIpcOpenMemHandle`` (each is opened once, then cached)."""
    out = _native.ffi().new("int64_t *")
    _native.check(_native.lib().zct_cuda_ipc_opens(out))
    return out[0]


# -- memory a view keeps alive ------------------------------------------------


class _DeviceMemory:
    """nbytes of device memory at ptr, exposed with
    ``__cuda_array_interface__`` as bytes; release() runs when the last view
    of it is gone."""

    def __init__(self, ptr, nbytes, device, release):
        self.ptr, self.nbytes, self.device = ptr, nbytes, device
        self._finalizer = weakref.finalize(self, release)

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "strides": None,
                "version": 3, "stream": None}


def _torch_view(memory, dtype, shape, strides=None, storage_offset=0):
    """A torch tensor of dtype over memory (bytes), laid out as shape and
    strides (elements), which keeps memory alive."""
    import torch

    raw = torch.as_tensor(memory, device=f"cuda:{memory.device}")  # uint8, holds memory
    typed = raw.view(dtype) if raw.numel() else raw.to(dtype)
    if strides is None:
        return typed[: int(np.prod(shape, dtype=np.int64))].view(shape)
    return typed.as_strided(shape, strides, storage_offset)


# -- VMM tensors ---------------------------------------------------------------


class CudaTensor:
    """Shareable device memory (the VMM route) seen as a C-contiguous array.

    Made by :func:`empty`. ``torch()`` returns a zero-copy torch tensor; it
    also exposes ``__cuda_array_interface__``, ``__dlpack__`` and
    ``__dlpack_device__``, so CuPy (``cupy.asarray``, ``cupy.from_dlpack``)
    and JAX (``jax.dlpack.from_dlpack``) take it without a copy. Pickled (a
    Queue, a Pipe, Process arguments) it travels by name, and the receiver
    maps the same memory.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("use zctipc.cuda.empty()")

    @classmethod
    def _wrap(cls, handle, ptr, size, device, shape, code):
        self = object.__new__(cls)
        self._handle = handle
        self._memory = _DeviceMemory(ptr, size, device,
                                     lambda h=handle: _native.finalize("zct_cuda_free", h, "freeing CUDA memory"))
        self._shape = shape
        self._code = code
        self._name = None
        return self

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return _dtypes.public_dtype(self._code)

    @property
    def device(self):
        return self._memory.device

    @property
    def data_ptr(self):
        return self._memory.ptr

    @property
    def nbytes(self):
        return int(np.prod(self._shape, dtype=np.int64)) * _dtypes.storage_dtype(self._code).itemsize

    def __repr__(self):
        return f"<zctipc.cuda.CudaTensor shape={self._shape} dtype={_dtypes.NAMES[self._code]} device=cuda:{self.device}>"

    @property
    def __cuda_array_interface__(self):
        return {"shape": self._shape, "typestr": _dtypes.storage_dtype(self._code).str,
                "data": (self._memory.ptr, False), "strides": None, "version": 3, "stream": None}

    def torch(self):
        """A torch tensor over the same device memory."""
        return _torch_view(self._memory, _dtypes.torch_dtype(self._code), self._shape)

    def __dlpack__(self, stream=None, **kwargs):
        try:
            return self.torch().__dlpack__(stream=stream, **kwargs)
        except ImportError:
            import cupy

            return cupy.asarray(self).__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self):
        return (KDL_CUDA, self.device)

    def __reduce__(self):
        if self._name is None:
            ffi = _native.ffi()
            buf = ffi.new("char[]", 256)
            _native.check(_native.lib().zct_cuda_share(self._handle, buf, 256))
            self._name = ffi.string(buf).decode()
        return _attach, (self._name, self._shape, self._code)


def _attach(name, shape, code, device=-1):
    ffi = _native.ffi()
    handle, ptr, size, resident = ffi.new("zct_handle *"), ffi.new("uint64_t *"), ffi.new("uint64_t *"), ffi.new("int32_t *")
    _native.check(_native.lib().zct_cuda_import(name.encode(), device, handle, ptr, size, resident))
    mapped_on = resident[0] if device < 0 else device
    return CudaTensor._wrap(handle[0], ptr[0], size[0], mapped_on, shape, code)


def empty(shape, dtype="float32", device=0):
    """Shareable device memory for an array of shape and dtype on CUDA
    device ``device`` (the allocation is rounded up to the device's
    granularity). Raises :class:`CudaUnavailable` without CUDA."""
    dims = _shape_tuple(shape)
    code = _dtypes.code_of(dtype)
    nbytes = int(np.prod(dims, dtype=np.int64)) * _dtypes.storage_dtype(code).itemsize
    if not isinstance(device, int) or device < 0:
        raise InvalidArgument(f"device must be a CUDA device index, not {device!r}")
    ffi = _native.ffi()
    handle, ptr, size = ffi.new("zct_handle *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
    _native.check(_native.lib().zct_cuda_alloc(device, max(nbytes, 1), handle, ptr, size))
    return CudaTensor._wrap(handle[0], ptr[0], size[0], device, dims, code)


# -- torch CUDA tensors by legacy IPC ---------------------------------------------

# Note [the producer keeps what it sent]: each storage this process sends is
# kept here with a pool slot whose cross-process count says how many holders
# it has: this process (one count) and every descriptor in flight or tensor
# received elsewhere (one each; a killed consumer's is given up by the cleanup
# daemon). A storage is let go once its count is back to one.

_lock = threading.Lock()
_sent = {}  # (storage key) -> _Sent
_SWEEP_EVERY = 64  # sends between sweeps


class _Sent:
    def __init__(self, storage, export, ipc, counter, address):
        self.storage = storage  # keeps the memory alive
        self.export = export  # the export handle (its event), re-recorded for every send
        self.ipc = ipc  # the zct_cuda_ipc bytes
        self.counter = counter  # this process's ref on the count slot
        self.address = address  # of the count slot


_sends = 0


def _holders(ref):
    out = _native.ffi().new("int64_t *")
    _native.check(_native.lib().zct_ref_holders(ref, out))
    return out[0]


def _sweep(final=False):
    """Let go of the storages no other process holds; at exit, warn about
    the ones that are still held."""
    lib = _native.lib()
    with _lock:
        done = [k for k, s in _sent.items() if _holders(s.counter) <= 1]
        for k in done:
            s = _sent.pop(k)
            lib.zct_cuda_ipc_release(s.export)
            lib.zct_ref_release(s.counter)
        left = len(_sent)
    if final and left:
        warnings.warn(f"zctipc: this process exits while {left} CUDA tensors it sent are still in use by other "
                      "processes; their memory goes with this process, and those tensors become invalid. Keep the "
                      "producer alive until consumers are done.", RuntimeWarning, stacklevel=2)


def _at_exit():
    if _native.loaded() and _sent:
        try:
            _sweep(final=True)
        except Exception:
            pass


atexit.register(_at_exit)


def _sent_record(t, storage, stream):
    """The _Sent record of the storage of CUDA tensor t, made on its first
    send; on a later send its event is recorded again on stream. The caller
    holds _lock."""
    from . import pool

    key = (storage.data_ptr(), storage.nbytes(), storage._cdata)
    s = _sent.get(key)
    ffi, lib = _native.ffi(), _native.lib()
    if s is not None:
        _native.check(lib.zct_cuda_ipc_record(s.export, stream))
        return s
    ipc, export = ffi.new("zct_cuda_ipc *"), ffi.new("zct_handle *")
    _native.check(lib.zct_cuda_ipc_export(t.device.index, storage.data_ptr(), stream, ipc, export))
    try:
        ref, address = pool.alloc(8)
    except BaseException:
        lib.zct_cuda_ipc_release(export[0])
        raise
    s = _sent[key] = _Sent(storage, export[0], bytes(ffi.buffer(ipc)), ref, address)
    return s


def _counter_descriptor(s):
    """Descriptor bytes carrying one more count on s's slot."""
    from . import reductions

    ref, offset = reductions._find(s.address, 8)
    return reductions._encode(reductions.Export(ref, offset, _dtypes.CODES["uint8"], (8,), (1,), 0))


def _adopt_counter(data):
    """The ref of the count a counter descriptor carried."""
    view = _native.ffi().new("zct_view *")
    _native.check(_native.lib().zct_ref_decode(data, len(data), view))
    return view.ref


def reduce_tensor(t):
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
    return rebuild_tensor, (s.ipc, counter, str(t.dtype).removeprefix("torch."), tuple(t.shape), tuple(t.stride()),
                            t.storage_offset(), storage.nbytes(), t.requires_grad)


def _rebuild_empty(dtype, shape, device):
    import torch

    return torch.empty(shape, dtype=getattr(torch, dtype), device=f"cuda:{device}")


def rebuild_tensor(ipc_bytes, counter, dtype, shape, strides, storage_offset, nbytes, requires_grad=False):
    """Open device memory another process sent (legacy IPC) as a torch
    tensor; the current stream waits for the sender's work first."""
    import torch

    ffi, lib = _native.ffi(), _native.lib()
    ipc = ffi.new("zct_cuda_ipc *")
    if len(ipc_bytes) != ffi.sizeof("zct_cuda_ipc"):
        raise InvalidArgument(f"a CUDA descriptor of {len(ipc_bytes)} bytes, not {ffi.sizeof('zct_cuda_ipc')}")
    ffi.memmove(ipc, ipc_bytes, len(ipc_bytes))
    ref = _adopt_counter(counter)  # this tensor's count on the sender's record
    device = ipc.device
    stream = torch.cuda.current_stream(device).cuda_stream
    ptr = ffi.new("uint64_t *")
    try:
        _native.check(lib.zct_cuda_ipc_open(ipc, stream, ptr))
    except BaseException:
        lib.zct_ref_release(ref)
        raise

    def release(ipc=ipc, ref=ref):
        _native.finalize("zct_cuda_ipc_close", ipc, "closing CUDA memory")
        _native.finalize("zct_ref_release", ref, "releasing a buffer")

    memory = _DeviceMemory(ptr[0], nbytes, device, release)
    t = _torch_view(memory, getattr(torch, dtype), shape, strides, storage_offset)
    if requires_grad:
        t.requires_grad_()
    return t


def forget_idle(keep=0):
    """Close the device allocations this process opened that no tensor uses
    any more, keeping at most ``keep`` open for the next receipt."""
    _native.check(_native.lib().zct_cuda_ipc_trim(keep))
