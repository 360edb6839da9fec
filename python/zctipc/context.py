"""Process start methods that are safe with a Go runtime in the process.

A Go runtime does not survive ``fork()``, so zctipc's contexts use
``forkserver`` (the default, Python 3.14's own default) or ``spawn``. The
fork server is started without the library loaded and forks its children
before any of them loads it.
"""

import multiprocessing

__all__ = ["get_context"]

_METHODS = ("forkserver", "spawn")


def get_context(method="forkserver"):
    """Return the ``multiprocessing`` context for ``method``: "forkserver"
    (default) or "spawn". "fork" is refused: a child forked from a process
    that loaded zctipc cannot use it."""
    if method is None:
        method = "forkserver"
    if method not in _METHODS:
        raise ValueError(
            f"zctipc does not support the {method!r} start method: a Go runtime does not survive fork(); "
            f"use one of {', '.join(_METHODS)}"
        )
    return multiprocessing.get_context(method)
