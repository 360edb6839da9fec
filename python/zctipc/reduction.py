"""multiprocessing.reduction, under zctipc's name (``import zctipc as
multiprocessing``): every name is multiprocessing's own."""

import multiprocessing.reduction as _mp
from multiprocessing.reduction import *  # noqa: F401,F403

__all__ = list(getattr(_mp, "__all__", ()))


def __getattr__(name):
    return getattr(_mp, name)
