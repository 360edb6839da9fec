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
import threading

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


# Note [meeting a module on import]: zctipc sends some types of other
# modules its own way (a torch tensor goes as a tensor record a Go consumer
# reads), which needs its reducers registered for them. Registering them
# only when zctipc itself happens to meet the module (its first torch view,
# say) made a tensor's route depend on the order of imports: after ``import
# numpy, zctipc, torch`` the first tensor put went as an opaque pickle. So
# when the module is not imported yet, a finder on sys.meta_path watches
# for it: it finds the module with the finders behind it (and answers None
# to a finder that asks it back while it asks), and runs the
# hooks right after the module's own code has run, however it was imported
# (an import statement, importlib, another package). The finder watches
# only the names given, leaves every other import alone, and leaves
# sys.meta_path once every name it watched was imported. A hook that fails
# warns: it never makes the user's import fail.
# Threat model: only code of this process imports; nothing crosses a
# process here. The finder hands on the very spec the finders behind it
# found, its loader wrapped, so it can never put another module in the
# watched one's place, nor find one they would not; what must never happen
# is that zctipc makes an import fail or run twice.


class _Announcer:
    """A module's own loader, which runs the hooks of its name once the
    module has run."""

    __slots__ = ("loader", "name")

    def __init__(self, loader: Any, name: str) -> None:
        self.loader, self.name = loader, name

    def create_module(self, spec: Any) -> Any:
        create = getattr(self.loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: Any) -> None:
        # The module sees its own loader (torch reads __spec__.loader).
        module.__spec__.loader = module.__loader__ = self.loader
        self.loader.exec_module(module)
        _watch.imported(self.name)


class _Watch:
    """The finder of Note [meeting a module on import]."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Callable[[], object]]] = {}
        self.finding = threading.local()  # the names this thread is finding

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        # Only the finders behind this one are asked, once: a finder that
        # asks every other one (an import hook in front, or behind) asked
        # this one back, which asked it again, without end.
        finding: set[str] | None = getattr(self.finding, "names", None)
        if name not in self.hooks or (finding is not None and name in finding):
            return None
        meta_path = list(sys.meta_path)
        behind = meta_path[meta_path.index(self) + 1 :] if self in meta_path else meta_path
        if finding is None:
            finding = self.finding.names = set()
        finding.add(name)
        try:
            for finder in behind:
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Announcer(spec.loader, name)
                    return spec
            return None
        finally:
            finding.discard(name)

    def imported(self, name: str) -> None:
        import warnings

        hooks = self.hooks.pop(name, [])
        if not self.hooks and self in sys.meta_path:
            sys.meta_path.remove(self)
        for hook in hooks:
            try:
                hook()
            except Exception as exc:  # the import itself went well: it must not fail for zctipc
                warnings.warn(f"zctipc could not prepare for {name}: {exc!r}", RuntimeWarning, stacklevel=2)


_watch = _Watch()


def when_imported(name: str, hook: Callable[[], object]) -> None:
    """Call hook() once the module name (a submodule too, by its full
    name) is imported (at once if it is), however it is imported (Note
    [meeting a module on import])."""
    if name in sys.modules:
        hook()
        return
    _watch.hooks.setdefault(name, []).append(hook)
    if _watch not in sys.meta_path:
        sys.meta_path.insert(0, _watch)
