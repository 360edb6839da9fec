"""Element types: the header's dtype codes and their NumPy and torch faces.

The codes are those of ``go/internal/dtype`` and ``docs/format.md``. NumPy has no
bfloat16: such segments have torch views, and NumPy views only when the
``ml_dtypes`` package is installed.
"""

from __future__ import annotations

from ..errors import UnsupportedDtype
from . import lazy

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any, TypeAlias

    import numpy as np
    import torch
    from numpy.typing import DTypeLike

    #: An element type as zctipc takes one: a name ("float32"), a NumPy
    #: dtype or scalar type, or a torch dtype.
    DTypeSpec: TypeAlias = DTypeLike | torch.dtype
else:
    np = lazy.numpy(__name__)

# code -> name; the names are NumPy's and torch's spelling alike.
NAMES = {
    1: "bool",
    2: "int8",
    3: "int16",
    4: "int32",
    5: "int64",
    6: "uint8",
    7: "uint16",
    8: "uint32",
    9: "uint64",
    10: "float16",
    11: "float32",
    12: "float64",
    13: "bfloat16",
    14: "complex64",
    15: "complex128",
}
CODES = {name: code for code, name in NAMES.items()}
BFLOAT16 = CODES["bfloat16"]
ITEMSIZE = {code: size for code, size in zip(NAMES, (1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 2, 8, 16), strict=True)}
# NumPy dtypes by code, and the storage dtype of each (uint16 for
# bfloat16), made when first asked for (see zctipc._core.lazy).
_NUMPY: dict[int, np.dtype[Any]] = {}
_STORAGE: dict[int, np.dtype[Any]] = {}


def _numpy_tables() -> tuple[dict[int, np.dtype[Any]], dict[int, np.dtype[Any]]]:
    if not _STORAGE:
        _NUMPY.update({code: np.dtype(name) for code, name in NAMES.items() if code != BFLOAT16})
        _STORAGE.update({**_NUMPY, BFLOAT16: np.dtype(np.uint16)})
    return _NUMPY, _STORAGE


def _ml_bfloat16() -> np.dtype[Any] | None:
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def code_of(dtype: Any) -> int:
    """Return the header code of ``dtype``: a name, a NumPy dtype or scalar
    type, or a torch dtype. Raise :class:`UnsupportedDtype` for a type that
    cannot be shared. (It checks what it is given: Any; callers take a
    DTypeSpec.)"""
    if type(dtype).__module__ == "torch":  # a torch.dtype, without importing torch
        name = str(dtype).removeprefix("torch.")
        if name in CODES:
            return CODES[name]
        raise UnsupportedDtype(f"torch dtype {dtype} cannot be shared; supported: {', '.join(CODES)}")
    if isinstance(dtype, str) and dtype in CODES:
        return CODES[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise UnsupportedDtype(f"{dtype!r} is not a dtype: {exc}") from None
    return code_of_numpy(dt)


# The codes of the NumPy dtypes met so far (each one that can be shared):
# asking NumPy a dtype's name costs more than the rest of a small put.
_code_of: dict[np.dtype[Any], int] = {}


def code_of_numpy(dt: np.dtype[Any]) -> int:
    """Return the header code of the NumPy dtype ``dt``."""
    code = _code_of.get(dt)
    if code is not None:
        return code
    if dt.hasobject:
        raise UnsupportedDtype(
            f"dtype {dt} holds Python object pointers, which mean nothing in another process; "
            "convert to a numeric dtype first"
        )
    if dt.fields is not None or dt.subdtype is not None:
        raise UnsupportedDtype(f"structured dtype {dt} cannot be shared; share each field as its own array")
    if dt.byteorder == ">" or (dt.byteorder == "<" and not dt.isnative):
        raise UnsupportedDtype(
            f"dtype {dt.str} is not in native byte order; convert with .astype({dt.newbyteorder('=').name!r})"
        )
    code = CODES.get(dt.name)
    if code is None:
        raise UnsupportedDtype(f"dtype {dt} cannot be shared; supported: {', '.join(CODES)}")
    _code_of[dt] = code
    return code


def numpy_dtype(code: int) -> np.dtype[Any]:
    """Return the NumPy dtype of ``code``; bfloat16 needs ml_dtypes."""
    dt = _numpy_tables()[0].get(code)
    if dt is not None:
        return dt
    if code == BFLOAT16:
        dt = _ml_bfloat16()
        if dt is None:
            raise UnsupportedDtype("NumPy has no bfloat16: use .torch(), or install ml_dtypes for NumPy bfloat16 views")
        return dt
    raise UnsupportedDtype(f"unknown dtype code {code}")


def storage_dtype(code: int) -> np.dtype[Any]:
    """Return a NumPy dtype of the same size that can hold ``code``'s bits
    (uint16 for bfloat16), for building views that torch reinterprets."""
    try:
        return _numpy_tables()[1][code]
    except KeyError:
        raise UnsupportedDtype(f"unknown dtype code {code}") from None


def torch_dtype(code: int) -> torch.dtype:
    """Return the torch dtype of ``code``."""
    import torch

    return getattr(torch, _name(code))


def public_dtype(code: int) -> np.dtype[Any] | str:
    """The ``dtype`` attribute of a SharedTensor: a NumPy dtype when NumPy can
    say it, else the name (``'bfloat16'`` without ml_dtypes)."""
    if code == BFLOAT16 and _ml_bfloat16() is None:
        return NAMES[code]
    return numpy_dtype(code)


def _name(code: int) -> str:
    try:
        return NAMES[code]
    except KeyError:
        raise UnsupportedDtype(f"unknown dtype code {code}") from None
