"""Array layout and names: shapes, strides, sizes, and segment names, in
one place."""

import operator
import sys

from ..errors import InvalidArgument


def shape_tuple(shape):
    """shape (an int or a sequence of ints) as a tuple of non-negative
    ints."""
    try:
        dims = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise InvalidArgument(f"shape must be an int or a sequence of ints, not {shape!r}") from None
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"shape {dims} has a negative dimension")
    return dims


def nbytes(shape, itemsize):
    """The bytes of a C-contiguous array of shape."""
    n = itemsize
    for d in shape:
        n *= d
    return n


def c_strides(shape, itemsize):
    """The byte strides of a C-contiguous array of shape."""
    strides = []
    step = itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def extent(shape, strides, itemsize):
    """The bytes an array of shape and (non-negative) byte strides can
    touch from its first element: 0 when it has none."""
    if 0 in shape:
        return 0
    return sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + itemsize


def segment_name(name):
    """A segment name as the library takes it (bytes), checked for what
    Python can tell before asking."""
    if not isinstance(name, str):
        raise InvalidArgument(f"a segment name is a str, not {type(name).__name__}")
    if not name:
        raise InvalidArgument("segment name is empty; pass name=None for a random name")
    if "\0" in name:
        raise InvalidArgument(f"segment name {name!r} contains a NUL character")
    return name.encode()


def is_torch_tensor(obj):
    """Whether obj is a torch tensor (of any subclass), without importing
    torch: a program that never imported it has none."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)
