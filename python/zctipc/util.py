"""multiprocessing.util, under zctipc's name (``import zctipc as
multiprocessing``): every name is multiprocessing's own."""

from __future__ import annotations

import multiprocessing.util as _mp
from multiprocessing.util import *  # noqa: F401,F403

__all__ = list(getattr(_mp, "__all__", ()))

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any


def __getattr__(name: str) -> Any:
    return getattr(_mp, name)
