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

from __future__ import annotations

from ._core import device as _device
from ._core import dtypes as _dtypes
from ._core import layout as _layout
from ._core import lazy
from ._core import native as _native
from .errors import CudaUnavailable, InvalidArgument

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    import numpy as np
    import torch
    from typing_extensions import CapsuleType, Self

    from ._core.dtypes import DTypeSpec
    from ._core.layout import ShapeLike
else:
    np = lazy.numpy(__name__)

__all__ = ["is_available", "device_count", "unavailable_reason", "empty", "CudaTensor", "ipc_opens", "forget_idle"]


def _devices() -> tuple[int, int]:
    ffi = _native.ffi()
    count, version = ffi.new("int32_t *"), ffi.new("int32_t *")
    _native.check(_native.lib().zct_cuda_devices(count, version))
    return count[0], version[0]


def is_available() -> bool:
    """Whether a CUDA driver and at least one device are usable here."""
    try:
        _devices()
    except CudaUnavailable:
        return False
    return True


def unavailable_reason() -> str | None:
    """Why CUDA cannot be used here, or None when it can."""
    try:
        _devices()
    except CudaUnavailable as exc:
        return str(exc)
    return None


def device_count() -> int:
    """The number of CUDA devices (0 without a driver)."""
    try:
        return _devices()[0]
    except CudaUnavailable:
        return 0


def ipc_opens() -> int:
    """How many device allocations this process opened with
    ``cuIpcOpenMemHandle`` (each is opened once, then cached)."""
    out = _native.ffi().new("int64_t *")
    _native.check(_native.lib().zct_cuda_ipc_opens(out))
    return out[0]


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

    _handle: int
    _memory: _device.DeviceMemory
    _shape: tuple[int, ...]
    _code: int
    _name: str | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("use zctipc.cuda.empty()")

    @classmethod
    def _wrap(cls, handle: int, ptr: int, size: int, device: int, shape: tuple[int, ...], code: int) -> Self:
        self = object.__new__(cls)
        self._handle = handle
        # mypy cannot infer the type of a lambda whose default binds the handle.
        self._memory = _device.DeviceMemory(
            ptr,
            size,
            device,
            lambda h=handle: _native.finalize("zct_cuda_free", h, "freeing CUDA memory"),  # type: ignore[misc]
        )
        self._shape = shape
        self._code = code
        self._name = None
        return self

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any] | str:
        return _dtypes.public_dtype(self._code)

    @property
    def device(self) -> int:
        return self._memory.device

    @property
    def data_ptr(self) -> int:
        return self._memory.ptr

    @property
    def nbytes(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64)) * _dtypes.storage_dtype(self._code).itemsize

    def __repr__(self) -> str:
        return (
            f"<zctipc.cuda.CudaTensor shape={self._shape} dtype={_dtypes.NAMES[self._code]} device=cuda:{self.device}>"
        )

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": self._shape,
            "typestr": _dtypes.storage_dtype(self._code).str,
            "data": (self._memory.ptr, False),
            "strides": None,
            "version": 3,
            "stream": None,
        }

    def torch(self) -> torch.Tensor:
        """A torch tensor over the same device memory."""
        return _device.torch_view(self._memory, _dtypes.torch_dtype(self._code), self._shape)

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> CapsuleType:
        try:
            return self.torch().__dlpack__(stream=stream, **kwargs)
        except ImportError:
            import cupy

            return cupy.asarray(self).__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_device.KDL_CUDA, self.device)

    def __reduce__(self) -> tuple[Callable[[str, tuple[int, ...], int], CudaTensor], tuple[str, tuple[int, ...], int]]:
        if self._name is None:
            ffi = _native.ffi()
            buf = ffi.new("char[]", 256)
            _native.check(_native.lib().zct_cuda_share(self._handle, buf, 256))
            self._name = ffi.string(buf).decode()
        return _attach, (self._name, self._shape, self._code)


def _attach(name: str, shape: tuple[int, ...], code: int, device: int = -1) -> CudaTensor:
    ffi = _native.ffi()
    handle, ptr, size, resident = (
        ffi.new("zct_handle *"),
        ffi.new("uint64_t *"),
        ffi.new("uint64_t *"),
        ffi.new("int32_t *"),
    )
    _native.check(_native.lib().zct_cuda_import(name.encode(), device, handle, ptr, size, resident))
    mapped_on = resident[0] if device < 0 else device
    return CudaTensor._wrap(handle[0], ptr[0], size[0], mapped_on, shape, code)


def empty(shape: ShapeLike, dtype: DTypeSpec = "float32", device: int = 0) -> CudaTensor:
    """Shareable device memory for an array of shape and dtype on CUDA
    device ``device`` (the allocation is rounded up to the device's
    granularity). Raises :class:`CudaUnavailable` without CUDA."""
    dims = _layout.shape_tuple(shape)
    code = _dtypes.code_of(dtype)
    nbytes = int(np.prod(dims, dtype=np.int64)) * _dtypes.storage_dtype(code).itemsize
    if not isinstance(device, int) or device < 0:
        raise InvalidArgument(f"device must be a CUDA device index, not {device!r}")
    ffi = _native.ffi()
    handle, ptr, size = ffi.new("zct_handle *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
    _native.check(_native.lib().zct_cuda_alloc(device, max(nbytes, 1), handle, ptr, size))
    return CudaTensor._wrap(handle[0], ptr[0], size[0], device, dims, code)


def forget_idle(keep: int = 0) -> None:
    """Close the device allocations this process opened that no tensor uses
    any more, keeping at most ``keep`` open for the next receipt."""
    _native.check(_native.lib().zct_cuda_ipc_trim(keep))
