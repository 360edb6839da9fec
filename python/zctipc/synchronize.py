"""multiprocessing.synchronize, under zctipc's name (``import zctipc as
multiprocessing``): every name is multiprocessing's own."""

import multiprocessing.synchronize as _mp
from multiprocessing.synchronize import *  # noqa: F401,F403

__all__ = list(getattr(_mp, "__all__", ()))


def __getattr__(name):
    return getattr(_mp, name)
