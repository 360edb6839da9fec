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
* **Every torch allocation shareable**: after
  :func:`use_shareable_allocator`, torch allocates CUDA memory through
  zctipc's caching allocator of VMM memory, and any torch CUDA tensor then
  goes through :class:`zctipc.Queue` by file descriptor (no legacy IPC
  handle, no ptrace permission, valid after the producer dies).
* **Whole models**: :func:`share_state_dict` packs a state dict into one
  shareable allocation per device, sent as one small message and rebuilt by
  :func:`attach_state_dict` as views; :meth:`SharedStateDict.update` writes
  new weights in place.

Without a driver or a device, :func:`is_available` is False and every GPU
call raises :class:`CudaUnavailable`; the rest of zctipc is unaffected.
"""

from __future__ import annotations

import weakref

from ._core import device as _device
from ._core import dtypes as _dtypes
from ._core import layout as _layout
from ._core import lazy
from ._core import native as _native
from ._wire import gpu as _gpu
from .errors import CudaUnavailable, InvalidArgument

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    import numpy as np
    import torch
    from typing_extensions import CapsuleType, Self

    from ._core.dtypes import DTypeSpec
    from ._core.layout import ShapeLike
else:
    from collections.abc import Mapping

    np = lazy.numpy(__name__)

__all__ = [
    "is_available",
    "device_count",
    "unavailable_reason",
    "empty",
    "CudaTensor",
    "ipc_opens",
    "forget_idle",
    "use_shareable_allocator",
    "allocator_stats",
    "empty_cache",
    "set_host_fallback",
    "share_state_dict",
    "attach_state_dict",
    "SharedStateDict",
]


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
        # mypy cannot infer the type of a lambda whose default binds the handle.
        memory = _device.DeviceMemory(
            ptr,
            size,
            device,
            lambda h=handle: _native.finalize("zct_cuda_free", h, "freeing CUDA memory"),  # type: ignore[misc]
        )
        return cls._over(handle, memory, shape, code, None)

    @classmethod
    def _over(
        cls, handle: int, memory: _device.DeviceMemory, shape: tuple[int, ...], code: int, name: str | None
    ) -> Self:
        """A CudaTensor over memory, allocated here (handle) or imported by
        name."""
        self = object.__new__(cls)
        self._handle, self._memory, self._shape, self._code, self._name = handle, memory, shape, code, name
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
        return _layout.nbytes(self._shape, _dtypes.storage_dtype(self._code).itemsize)

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

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType:
        """Export as DLPack (CUDA memory), through torch or else CuPy: a
        versioned capsule ("dltensor_versioned") for a consumer that asks
        for max_version (1, 0) or later, the legacy capsule otherwise. The
        capsule holds the memory. stream is the consumer's, as the standard
        says (None: the legacy default stream)."""
        kwargs = {"stream": stream, **_device.dlpack_keywords(max_version, dl_device, copy)}
        try:
            return self.torch().__dlpack__(**kwargs)
        except ImportError:
            import cupy

            return cupy.asarray(self).__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_device.KDL_CUDA, self.device)

    def __reduce__(self) -> tuple[Callable[[str, tuple[int, ...], int], CudaTensor], tuple[str, tuple[int, ...], int]]:
        if self._name is None:
            ffi = _native.ffi()
            buf = ffi.new("char[]", 256)
            _native.check(_native.lib().zct_cuda_share(self._handle, buf, 256))
            self._name = ffi.string(buf).decode()
        return _attach, (self._name, self._shape, self._code)


#: The memory of the allocations this process imported by name, by (name,
#: device): received again while any view of it is alive, an allocation is
#: not mapped again.
_imported: weakref.WeakValueDictionary[tuple[str, int], _device.DeviceMemory] = weakref.WeakValueDictionary()


def _attach(name: str, shape: tuple[int, ...], code: int, device: int = -1) -> CudaTensor:
    memory = _imported.get((name, device))
    if memory is not None:
        return CudaTensor._over(0, memory, shape, code, name)
    ffi = _native.ffi()
    handle, ptr, size, resident = (
        ffi.new("zct_handle *"),
        ffi.new("uint64_t *"),
        ffi.new("uint64_t *"),
        ffi.new("int32_t *"),
    )
    _native.check(_native.lib().zct_cuda_import(name.encode(), device, handle, ptr, size, resident))
    mapped_on = resident[0] if device < 0 else device
    ct = CudaTensor._wrap(handle[0], ptr[0], size[0], mapped_on, shape, code)
    ct._name = name
    _imported[(name, device)] = ct._memory
    return ct


def empty(shape: ShapeLike, dtype: DTypeSpec = "float32", device: int = 0) -> CudaTensor:
    """Shareable device memory for an array of shape and dtype on CUDA
    device ``device`` (the allocation is rounded up to the device's
    granularity). Raises :class:`CudaUnavailable` without CUDA."""
    dims = _layout.shape_tuple(shape)
    code = _dtypes.code_of(dtype)
    nbytes = _layout.nbytes(dims, _dtypes.storage_dtype(code).itemsize)  # np.prod in int64 wrapped
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


# -- every torch allocation shareable --------------------------------------------

#: Whether use_shareable_allocator installed zctipc's allocator in torch.
_allocator_installed = False


def use_shareable_allocator() -> None:
    """Make torch allocate CUDA memory through zctipc's caching allocator of
    shareable (VMM) memory, so that every torch CUDA tensor goes to other
    processes by file descriptor: no legacy IPC handle, no ptrace permission
    (the failure torch's ``expandable_segments`` meets), and a consumer's
    tensor stays valid if the producer dies.

    Call it before the first CUDA allocation of the process, as torch
    requires (``torch.cuda.memory.change_current_allocator``); a second call
    does nothing. Blocks freed are cached per device and stream, so steady
    state allocation makes no driver call; :func:`empty_cache` gives unused
    ones back, as does the allocator itself when the driver runs out. Raises
    :class:`CudaUnavailable` without CUDA, and InvalidArgument once torch
    has allocated CUDA memory with another allocator."""
    import torch

    global _allocator_installed
    if _allocator_installed:
        return
    count, _ = _devices()  # CudaUnavailable, before torch is touched
    for device in range(count):  # a device that cannot share by file descriptor says so here, not in torch
        _native.check(_native.lib().zct_cuda_shareable(device))
    if torch.cuda.is_initialized():
        raise InvalidArgument(
            "torch has initialized CUDA with its own allocator already; call "
            "zctipc.cuda.use_shareable_allocator() before the first CUDA tensor of the process"
        )
    allocator = torch.cuda.memory.CUDAPluggableAllocator(_native.library_path(), "zct_torch_alloc", "zct_torch_free")
    torch.cuda.memory.change_current_allocator(allocator)
    _allocator_installed = True


def allocator_stats() -> dict[str, int]:
    """What zctipc's caching allocator holds: ``segments`` (allocations, in
    use or cached) and their ``reserved`` bytes, ``in_use`` bytes and
    ``blocks`` handed out, and since the start ``creates`` (driver
    allocations), ``hits`` (requests served from the cache), ``trimmed``
    (allocations given back) and ``requested``."""
    info = _native.ffi().new("zct_cuda_cache_info *")
    _native.check(_native.lib().zct_cuda_cache_stats(info))
    names = ("segments", "reserved", "in_use", "blocks", "creates", "hits", "trimmed", "requested")
    return {name: int(getattr(info, name)) for name in names}


def empty_cache(device: int = -1) -> int:
    """Give the allocations zctipc's caching allocator holds unused back to
    the driver (of device, or of every device); returns how many. Memory
    another process maps stays until it lets go."""
    released = _native.ffi().new("int64_t *")
    _native.check(_native.lib().zct_cuda_cache_trim(device, released))
    return int(released[0])


def set_host_fallback(enabled: bool) -> None:
    """Send a CUDA tensor that cannot go by CUDA IPC (no CUDA driver for
    zctipc here, or memory the driver cannot export) through host shared
    memory instead: copied to the host once, sent as a CPU tensor, and
    copied back to its device on receipt. Off by default, so that such a
    tensor raises (before anything of the message is sent) rather than
    copies in silence; the environment variable
    ``ZCTIPC_CUDA_HOST_FALLBACK=1`` turns it on at import."""
    _gpu.host_fallback = bool(enabled)


# -- whole models ------------------------------------------------------------------

#: Each tensor's place in a packed allocation is aligned to this many bytes.
PACK_ALIGN = 256


class SharedStateDict:
    """A state dict (name -> tensor) packed into shareable device memory,
    one allocation per device, made by :func:`share_state_dict`.

    Pickled (a Queue, a Pipe, Process arguments) it is a small message of
    names and places; :func:`attach_state_dict` in the receiver maps each
    allocation once and returns views. :meth:`update` writes new values in
    place, so receivers see them without another message of weights.
    ``tensors`` are the producer's own views of the packed memory: a model
    loaded from them with ``model.load_state_dict(shared.tensors,
    assign=True)`` trains in the shared memory itself, and then there is
    nothing to copy at all."""

    _buffers: list[CudaTensor]
    _entries: list[tuple[str, int, int, str, tuple[int, ...]]]  # name, buffer, offset, dtype, shape
    _views: dict[str, torch.Tensor] | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("use zctipc.cuda.share_state_dict()")

    @classmethod
    def _make(cls, buffers: list[CudaTensor], entries: list[tuple[str, int, int, str, tuple[int, ...]]]) -> Self:
        self = object.__new__(cls)
        self._buffers, self._entries, self._views = buffers, entries, None
        return self

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """name -> a torch view of its place in the shared memory."""
        if self._views is None:
            import torch

            raws = [_device.torch_view(b._memory, torch.uint8, (b._memory.nbytes,)) for b in self._buffers]
            views: dict[str, torch.Tensor] = {}
            for name, index, offset, dtype, shape in self._entries:
                dt = getattr(torch, dtype)
                n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                views[name] = raws[index][offset : offset + n].view(dt).view(shape)
            self._views = views
        return self._views

    @property
    def nbytes(self) -> int:
        """Bytes of shared device memory (allocations, granularity rounded)."""
        return sum(b._memory.nbytes for b in self._buffers)

    @property
    def allocations(self) -> int:
        """How many shareable allocations hold the tensors."""
        return len(self._buffers)

    def keys(self) -> list[str]:
        return [e[0] for e in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<zctipc.cuda.SharedStateDict {len(self)} tensors in {self.allocations} allocations>"

    def update(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Write new values for the tensors, in place: the same names, shapes
        and dtypes (any device; a subset updates only those), then wait for
        the copies, so a receiver told after this returns reads the new
        values. Raises InvalidArgument for a name, shape or dtype that does
        not match, before anything is written."""
        views = self.tensors
        for name, t in state_dict.items():
            if name not in views:
                raise InvalidArgument(f"{name!r} is not a tensor of this SharedStateDict")
            _check_member(name, t)
            if t.shape != views[name].shape or t.dtype != views[name].dtype:
                raise InvalidArgument(
                    f"{name!r} is {tuple(t.shape)} {t.dtype}, and the shared one "
                    f"{tuple(views[name].shape)} {views[name].dtype}"
                )
        for name, t in state_dict.items():
            views[name].copy_(t)
        for b in self._buffers:
            _device.synchronize(b.device)

    def __reduce__(self) -> tuple[Callable[..., SharedStateDict], tuple[Any, ...]]:
        return SharedStateDict._make, (self._buffers, self._entries)


def _check_member(name: object, t: object) -> None:
    import torch

    if not isinstance(name, str):
        raise InvalidArgument(f"state dict keys are strings, not {name!r}")
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(f"{name!r} is a {type(t).__name__}, not a tensor")
    if t.layout != torch.strided:
        raise InvalidArgument(f"{name!r} is a {t.layout} tensor; send t.to_dense()")
    _dtypes.code_of(t.dtype)  # UnsupportedDtype


def share_state_dict(state_dict: Mapping[str, torch.Tensor], device: int | None = None) -> SharedStateDict:
    """Pack the tensors of a state dict into shareable device memory: one
    allocation per device, each tensor C-contiguous at a 256-byte aligned
    place, copied in once. CUDA tensors stay on their device; CPU tensors go
    to ``device`` (0 unless given). The result pickles as one small message;
    :func:`attach_state_dict` rebuilds it in the receiver with one mapping
    per allocation. Raises InvalidArgument for a member that is not a dense
    tensor, UnsupportedDtype for a dtype zctipc does not share, and
    CudaOutOfMemory when the device has not the room."""
    if not isinstance(state_dict, Mapping):
        raise InvalidArgument(f"share_state_dict takes a mapping of names to tensors, not {type(state_dict).__name__}")
    if device is not None and (not isinstance(device, int) or device < 0):
        raise InvalidArgument(f"device must be a CUDA device index, not {device!r}")
    places: dict[int, int] = {}  # device -> bytes so far
    entries: list[tuple[str, int, int, str, tuple[int, ...]]] = []
    for name, t in state_dict.items():
        _check_member(name, t)
        dev = t.device.index if t.is_cuda else (device or 0)
        offset = -(-places.get(dev, 0) // PACK_ALIGN) * PACK_ALIGN
        places[dev] = offset + t.numel() * t.element_size()
        entries.append((name, dev, offset, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
    order = sorted(places)
    buffers = [empty(max(places[d], 1), "uint8", device=d) for d in order]
    index = {d: i for i, d in enumerate(order)}
    shared = SharedStateDict._make(buffers, [(n, index[d], o, dt, s) for n, d, o, dt, s in entries])
    shared.update(state_dict)
    return shared


def attach_state_dict(shared: SharedStateDict) -> dict[str, torch.Tensor]:
    """The tensors of a SharedStateDict received from another process, as
    views of the producer's memory (one mapping per allocation, cached: the
    same SharedStateDict received again maps nothing new). They see the
    producer's later :meth:`SharedStateDict.update`."""
    if not isinstance(shared, SharedStateDict):
        raise InvalidArgument(f"attach_state_dict takes a SharedStateDict, not {type(shared).__name__}")
    return dict(shared.tensors)
