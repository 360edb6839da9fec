"""Array layout and names: shapes, strides, sizes, and segment names, in
one place."""

from __future__ import annotations

import operator
import sys

from ..errors import InvalidArgument
from .native import MAX_NDIM

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, SupportsIndex, TypeAlias

    import torch
    from typing_extensions import TypeIs

    #: A shape as zctipc takes one: an int, or a sequence of ints (anything
    #: with __index__: NumPy integers too).
    ShapeLike: TypeAlias = SupportsIndex | Sequence[SupportsIndex]


def shape_tuple(shape: Any) -> tuple[int, ...]:
    """shape (an int or a sequence of ints) as a tuple of non-negative
    ints, at most MAX_NDIM of them: the one rule for the shape of every
    array zctipc makes (pool buffers, segments, streams, CUDA tensors).
    (It checks what it is given: Any; callers take a ShapeLike.)"""
    dims: tuple[int, ...]
    try:
        dims = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise InvalidArgument(f"shape must be an int or a sequence of ints, not {shape!r}") from None
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"shape {dims} has a negative dimension")
    if any(d > INT64_MAX for d in dims):  # a descriptor's dimensions are int64s
        raise InvalidArgument(f"shape {dims} has a dimension past 2**63-1 (an int64's largest)")
    if len(dims) > MAX_NDIM:
        raise InvalidArgument(f"shape has {len(dims)} dimensions; a zctipc array has at most {MAX_NDIM}")
    return dims


#: The largest int64: a dimension, and the bytes of an array, are at most this.
#: Note: a shape comes from this process's caller, any int; what must never
#: happen is an array made over fewer bytes than its shape spans (a product
#: wrapped in int64), or an error that does not name the shape.
INT64_MAX = (1 << 63) - 1


def nbytes(shape: Sequence[int], itemsize: int) -> int:
    """The bytes of a C-contiguous array of shape; InvalidArgument when the
    bytes its non-zero dimensions span overflow an int64 (NumPy and torch
    refuse such a shape too, a zero among the dimensions or not)."""
    span = itemsize
    for d in shape:
        span *= d or 1
    if span > INT64_MAX:
        raise InvalidArgument(f"shape {tuple(shape)} of {itemsize}-byte items overflows int64 bytes")
    return span if all(shape) else 0


def c_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    """The byte strides of a C-contiguous array of shape."""
    strides: list[int] = []
    step = itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def extent(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> int:
    """The bytes an array of shape and (non-negative) byte strides can
    touch from its first element: 0 when it has none."""
    if 0 in shape:
        return 0
    return sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + itemsize


def segment_name(name: str) -> bytes:
    """A segment name as the library takes it (bytes), checked for what
    Python can tell before asking."""
    if not isinstance(name, str):
        raise InvalidArgument(f"a segment name is a str, not {type(name).__name__}")
    if not name:
        raise InvalidArgument("segment name is empty; pass name=None for a random name")
    if "\0" in name:
        raise InvalidArgument(f"segment name {name!r} contains a NUL character")
    return name.encode()


def is_torch_tensor(obj: object) -> TypeIs[torch.Tensor]:
    """Whether obj is a torch tensor (of any subclass), without importing
    torch: a program that never imported it has none."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)
