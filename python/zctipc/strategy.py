"""Sharing strategies and crash cleanup.

Two strategies say where new segments live, as in torch.multiprocessing:

``file_system`` (the default)
    Named files in /dev/shm. Every process records the counts it holds in a
    ledger, and the per-user cleanup daemon ``zctipcd`` gives up the counts
    of a process that dies without doing so (SIGKILL, the OOM killer): the
    segments nobody else holds are removed and pool slots are freed.

``file_descriptor``
    memfd segments, which have no name in any file system: other processes
    receive their file descriptors from ``zctipcd`` over a Unix socket
    (SCM_RIGHTS), and the kernel frees them once the last descriptor and
    mapping are gone. Nothing can be left in /dev/shm, whatever dies.

The strategy applies to the segments made afterwards, in this process and
in the processes it starts afterwards (it is passed on in the environment
variable ``ZCTIPC_SHARING_STRATEGY``). Receivers need no setting: a
descriptor says what kind of segment it names.

The names and the three functions are torch.multiprocessing's (``import
zctipc as mp``; ``mp.set_sharing_strategy("file_descriptor")``), and mean
the same of zctipc's segments: the pool buffers that tensors and arrays
move into, and named tensors. They do not set torch's own strategy, which
still governs tensors already in torch's shared memory sent through
multiprocessing's channels. Two differences: the default is
``file_system``, where torch's on Linux is ``file_descriptor`` (zctipc's
file_system leaves nothing behind a killed process, torch's does); an
unknown name raises InvalidArgument (a ValueError), where torch raises
AssertionError.
"""

from __future__ import annotations

import json
import os

from ._core import native as _native
from .errors import InvalidArgument

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "set_sharing_strategy",
    "get_sharing_strategy",
    "get_all_sharing_strategies",
    "collect_garbage",
    "daemon_status",
]

STRATEGY_ENV = "ZCTIPC_SHARING_STRATEGY"
_STRATEGIES = ("file_system", "file_descriptor")


def get_all_sharing_strategies() -> set[str]:
    """The names of the sharing strategies: ``{"file_system", "file_descriptor"}``
    (torch.multiprocessing's, both on Linux)."""
    return set(_STRATEGIES)


def get_sharing_strategy() -> str:
    """The strategy new segments are made with (``"file_system"`` unless
    set; torch.multiprocessing's default on Linux is ``"file_descriptor"``)."""
    if _native.loaded():
        lib = _native.lib()
        out = _native.ffi().new("int32_t *")
        _native.check(lib.zct_get_strategy(out))
        return _STRATEGIES[out[0]]
    name = os.environ.get(STRATEGY_ENV) or "file_system"
    return name if name in _STRATEGIES else "file_system"


def set_sharing_strategy(new_strategy: str) -> None:
    """Make new segments under ``new_strategy`` (a name from
    :func:`get_all_sharing_strategies`), here and in the processes started
    from now on. Segments that exist keep theirs."""
    if new_strategy not in _STRATEGIES:
        raise InvalidArgument(f"unknown sharing strategy {new_strategy!r}; the strategies are {', '.join(_STRATEGIES)}")
    os.environ[STRATEGY_ENV] = new_strategy
    if _native.loaded():
        _native.check(_native.lib().zct_set_strategy(_STRATEGIES.index(new_strategy)))


def collect_garbage(dry_run: bool = False) -> dict[str, Any]:
    """Sweep the ledgers of processes that died, and remove the segments no
    live process holds; with ``dry_run``, only say what would go.

    The cleanup daemon does this when it runs (it knows every process's
    ledger); otherwise this process does. Returns a dict: ``ledgers`` (the
    ledgers of dead processes), ``swept`` (the counts given up for them),
    ``removed`` (one dict per file: ``name``, ``kind``, ``size``,
    ``reason``) and ``kept``.
    """
    report = json.loads(_native.read_text(_native.lib().zct_gc, 1 if dry_run else 0))
    report["ledgers"] = report["ledgers"] or []
    report["removed"] = report["removed"] or []
    return report


def daemon_status() -> dict[str, Any]:
    """Whether the user's cleanup daemon runs, and what it watches: a dict
    with ``running``, ``dir`` (its runtime directory), ``strategy`` (this
    process's) and, when it runs, ``status`` (its pid, version, clients,
    memfd segments, and what it has cleaned)."""
    return json.loads(_native.read_text(_native.lib().zct_daemon_status))
