"""Shared tensors: zctipc segments that each hold one n-dimensional array.

A :class:`SharedTensor` and every view made from it (a NumPy array, a torch
tensor, a DLPack capsule) hold the segment's mapping: it stays valid while any
of them lives, and goes when the last one goes. Across processes, each process
that holds a segment counts once in the refcount in its header, and the last
process to let go unlinks it from /dev/shm.
"""

from __future__ import annotations

import json

from ._core import dtypes, layout, lazy, native, segments
from ._core.segments import SegmentInfo, SharedTensor, cleanup_all_segments, list_segments
from .errors import InvalidArgument

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any, Literal, overload

    import numpy as np
    import torch
    from numpy.typing import ArrayLike, NDArray

    from ._core.dtypes import DTypeSpec
    from ._core.layout import ShapeLike
else:
    np = lazy.numpy(__name__)

__all__ = [
    "SharedTensor",
    "SegmentInfo",
    "create_shared_tensor",
    "attach_shared_tensor",
    "share",
    "attach_ref",
    "list_segments",
    "cleanup_all_segments",
]


def create_shared_tensor(
    name: str | None = None,
    data: ArrayLike | torch.Tensor | None = None,
    shape: ShapeLike | None = None,
    dtype: DTypeSpec | None = None,
) -> SharedTensor:
    """Create a segment and return the :class:`SharedTensor` that owns it.

    ``name`` gets the ``zctipc_`` prefix (a random 128-bit name when None);
    an existing segment of that name is never reused (:class:`SegmentExists`).
    With ``data`` (a NumPy array, a CPU torch tensor, or anything
    ``np.asarray`` takes) the segment gets its shape and type and one copy of
    its contents, in C order whatever its strides; ``dtype`` then casts.
    Without ``data``, ``shape`` is required and ``dtype`` defaults to float32;
    the memory starts zeroed.
    """
    if data is None:
        if shape is None:
            raise InvalidArgument("create_shared_tensor needs data, or a shape (and a dtype)")
        return segments.create(name, dtypes.code_of("float32" if dtype is None else dtype), layout.shape_tuple(shape))

    torch_data = layout.is_torch_tensor(data)
    if torch_data:  # data is a tensor, which mypy does not see through the variable: the ignores below
        if data.device.type != "cpu":  # type: ignore[union-attr]
            raise InvalidArgument(f"a tensor on {data.device} is not in host memory; move it with .cpu() first")  # type: ignore[union-attr]
        data = data.detach()  # type: ignore[union-attr]
        code = dtypes.code_of(data.dtype if dtype is None else dtype)
    else:
        if not isinstance(data, np.ndarray):
            data = np.asarray(data, dtype=None if dtype is None else dtypes.numpy_dtype(dtypes.code_of(dtype)))
        code = dtypes.code_of_numpy(data.dtype) if dtype is None else dtypes.code_of(dtype)
    dims = layout.shape_tuple(data.shape)
    if shape is not None and (asked := layout.shape_tuple(shape)) != dims:
        raise InvalidArgument(f"shape {asked} does not match the data's shape {dims}")

    def fill(tensor: SharedTensor) -> None:
        if torch_data or code == dtypes.BFLOAT16:
            import torch

            src = data if torch_data else torch.from_numpy(np.ascontiguousarray(data))
            tensor.torch().copy_(src)  # type: ignore[arg-type]  # a tensor, as torch_data says
        else:
            np.copyto(tensor.numpy(), data, casting="unsafe")

    # The name appears once the copy is complete, never before.
    return segments.create(name, code, dims, fill)


def attach_shared_tensor(name: str, readonly: bool = False) -> SharedTensor:
    """Attach the tensor segment ``name`` (with or without the prefix).

    With ``readonly`` the data is mapped read-only in this process. Raises
    :class:`SegmentNotFound`, :class:`PermissionDenied` (another owner, or a
    mode other than 0600), :class:`NotAZctipcSegment`, :class:`CorruptHeader`
    or :class:`IncompatibleVersion` when the segment cannot be trusted.
    """
    return segments.attach_tensor(name, readonly)


if TYPE_CHECKING:

    @overload
    def attach_ref(
        ref: dict[str, Any] | str | bytes, readonly: bool = ..., torch: Literal[False] = ...
    ) -> NDArray[Any]: ...
    @overload
    def attach_ref(
        ref: dict[str, Any] | str | bytes, readonly: bool = ..., *, torch: Literal[True]
    ) -> torch.Tensor: ...
    @overload
    def attach_ref(
        ref: dict[str, Any] | str | bytes, readonly: bool = ..., torch: bool = ...
    ) -> NDArray[Any] | torch.Tensor: ...


def attach_ref(
    ref: dict[str, Any] | str | bytes, readonly: bool = False, torch: bool = False
) -> NDArray[Any] | torch.Tensor:
    """Attach the tensor a TensorRef describes (a dict, or its JSON text, as
    :meth:`SharedTensor.ref` and Go's ``Tensor.Ref`` make it) and return a
    NumPy array (a torch tensor with ``torch=True``) over the same memory.
    The description is checked against the segment's header: a ref whose
    dtype, shape, strides, bytes or id differ raises InvalidArgument."""
    if isinstance(ref, dict):
        ref = json.dumps(ref)
    if isinstance(ref, str):
        ref = ref.encode()
    if not isinstance(ref, bytes):
        raise InvalidArgument(f"a TensorRef is a dict or its JSON text, not {type(ref).__name__}")
    # The library parses the ref and checks it against the segment's header.
    ffi, lib = native.ffi(), native.lib()
    handle = ffi.new("zct_handle *")
    info = ffi.new("zct_info *")
    native.check(lib.zct_tensor_ref_attach(ref, len(ref), int(bool(readonly)), handle, info))
    st = SharedTensor._wrap(handle[0], info)
    return st.torch() if torch else st.numpy()


if TYPE_CHECKING:

    @overload
    def share(array: torch.Tensor) -> torch.Tensor: ...
    @overload
    def share(array: ArrayLike) -> NDArray[Any]: ...


def share(array: ArrayLike | torch.Tensor) -> NDArray[Any] | torch.Tensor:
    """Copy ``array`` (NumPy or CPU torch) into shared memory once, in C
    order, and return the shared copy as the same kind of object."""
    tensor = create_shared_tensor(data=array)
    return tensor.torch() if layout.is_torch_tensor(array) else tensor.numpy()
