"""CUDA device memory that views keep alive: what VMM tensors (zctipc.cuda)
and tensors received by legacy IPC (the wire's CUDA codec) are made of."""

from __future__ import annotations

import weakref

from . import lazy

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    import numpy as np
    import torch
else:
    np = lazy.numpy(__name__)


KDL_CUDA = 2  # DLPack's device type for CUDA memory


def dlpack_keywords(
    max_version: tuple[int, int] | None, dl_device: tuple[int, int] | None, copy: bool | None
) -> dict[str, Any]:
    """The keywords of a ``__dlpack__`` call the consumer gave, to pass on
    to the exporter (NumPy, torch, CuPy) that makes the capsule."""
    given = {"max_version": max_version, "dl_device": dl_device, "copy": copy}
    return {k: v for k, v in given.items() if v is not None}


class DeviceMemory:
    """nbytes of device memory at ptr, exposed with
    ``__cuda_array_interface__`` as bytes; release() runs when the last view
    of it is gone."""

    def __init__(self, ptr: int, nbytes: int, device: int, release: Callable[[], object]) -> None:
        self.ptr, self.nbytes, self.device = ptr, nbytes, device
        self._finalizer = weakref.finalize(self, release)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": (self.nbytes,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
            "stream": None,
        }


def torch_view(
    memory: DeviceMemory,
    dtype: torch.dtype,
    shape: Sequence[int],
    strides: Sequence[int] | None = None,
    storage_offset: int = 0,
) -> torch.Tensor:
    """A torch tensor of dtype over memory (DeviceMemory), laid out as shape
    and strides (elements), which keeps memory alive."""
    import torch

    raw = torch.as_tensor(memory, device=f"cuda:{memory.device}")  # uint8, holds memory
    typed = raw.view(dtype) if raw.numel() else raw.to(dtype)
    if strides is None:
        return typed[: int(np.prod(shape, dtype=np.int64))].view(shape)
    return typed.as_strided(shape, strides, storage_offset)


def synchronize(device: int) -> None:
    """Wait until the work queued on device's current torch stream is done."""
    import torch

    torch.cuda.current_stream(device).synchronize()
