"""Checks of numeric arguments, with the exceptions Python's own functions
raise: TypeError for a value of the wrong type, ValueError (here
InvalidArgument, a ValueError) for one out of range."""

from __future__ import annotations

import math
import numbers
import operator

from ..errors import InvalidArgument

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import SupportsIndex, overload


def integer(name: str, value: SupportsIndex, low: int | None = None, high: int | None = None) -> int:
    """value as an int (anything with __index__: bool, NumPy integers),
    within [low, high] where they are given."""
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}") from None
    if (low is not None and n < low) or (high is not None and n > high):
        if high is None:
            raise InvalidArgument(f"{name} must be at least {low}, not {n}")
        if low is None:
            raise InvalidArgument(f"{name} must be at most {high}, not {n}")
        raise InvalidArgument(f"{name} must be from {low} to {high}, not {n}")
    return n


if TYPE_CHECKING:

    @overload
    def timeout(value: float, name: str = ...) -> float: ...
    @overload
    def timeout(value: float | None, name: str = ...) -> float | None: ...


def timeout(value: float | None, name: str = "timeout") -> float | None:
    """A timeout in seconds: None (no limit), or a real number not below 0
    (a float, an int, a NumPy number), as float."""
    if value is None:
        return None
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds or None, not {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"'{name}' must be a non-negative number")
    return seconds
