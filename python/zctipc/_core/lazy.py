"""NumPy, imported when zctipc first needs it: ``import zctipc`` imports
no NumPy, so that a process that moves no arrays never pays for it.

A module that uses NumPy binds ``np = lazy.numpy(__name__)``: a stand-in
whose first attribute lookup imports NumPy, puts the real module in its
place in that module, and runs the hooks registered with
:func:`when_numpy_is_met` (registering zctipc's NumPy reducers, say).
zctipc also runs them when it finds NumPy imported by someone else
(:func:`check`), before it pickles anything.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_hooks: list[Callable[[], object]] = []
_met = False


def when_numpy_is_met(hook: Callable[[], object]) -> None:
    """Call hook() once NumPy is imported (at once if it is)."""
    _hooks.append(hook)
    if _met:
        hook()


def check() -> None:
    """Run the hooks if NumPy has been imported since; cheap otherwise."""
    if not _met and "numpy" in sys.modules:
        _meet()


def _meet() -> None:
    global _met
    _met = True
    for hook in _hooks:
        hook()


class _Numpy:
    """The stand-in for NumPy in one module (see the module docstring)."""

    __slots__ = ("_owner",)

    def __init__(self, owner: str) -> None:
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        import numpy

        sys.modules[self._owner].np = numpy  # type: ignore[attr-defined]  # the owner's global, unseen here
        if not _met:
            _meet()
        return getattr(numpy, name)


def numpy(owner: str) -> Any:
    """The NumPy of module owner (its __name__): the module itself when
    it is imported, else a stand-in that imports it when first used.
    (Any: a module that uses it names ``numpy`` itself to type checkers.)"""
    module = sys.modules.get("numpy")
    return module if module is not None else _Numpy(owner)
