"""multiprocessing.managers, under zctipc's name (``import zctipc as
multiprocessing``): every name is multiprocessing's own.

Note [the standard library's managers]: a manager of multiprocessing's own
serializer ("pickle": multiprocessing.Manager(), a SyncManager made as it
is) talks through connections that pickle with ForkingPickler, whose
reducers, once zctipc registered them, sent its NumPy arrays by descriptor:
a client's write reached the stored value and what every other client
read, the sender's later writes did too, and a read-only array came back
read-only (zctipc's own managers copy: Note [managers hand out copies] in
zctipc._wire.values). Its server is not zctipc's to make: started with
spawn or forkserver, it imports zctipc only when it unpickles the first
descriptor, after its connections were made, and from then on sends what
it stores by descriptor itself; so copies made by the clients alone would
not do. Instead, in every process that imports zctipc (when it imports this
module, which zctipc does once multiprocessing.managers is imported),
connections of the "pickle" serializer send NumPy arrays as NumPy pickles
them, as without zctipc: a server holds only arrays of its own, never zctipc
memory, and sends each, by zctipc's reducers or not, as a copy the receiver
owns. Everything else pickles as ForkingPickler does (torch tensors are
shared, as torch.multiprocessing shares them). A connection made before
zctipc was imported pickles as ForkingPickler does: a manager made before,
or a proxy that a process unpickled before.
Threat model: as in Note [managers hand out copies]; what must never happen
is a client's write reaching a value another client reads.
"""

from __future__ import annotations

import io
import multiprocessing.managers as _mp
import sys
from multiprocessing import connection as _connection
from multiprocessing.managers import *  # noqa: F401,F403
from multiprocessing.reduction import ForkingPickler as _ForkingPickler

__all__ = list(getattr(_mp, "__all__", ()))

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any


class _PlainPickler(_ForkingPickler):
    """ForkingPickler, NumPy arrays pickled as NumPy pickles them (Note [the
    standard library's managers]). Its dump is ForkingPickler's, which gives
    back the counts of a failed dump once zctipc's reducers are registered."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        np = sys.modules.get("numpy")
        if np is not None:
            self.dispatch_table.pop(np.ndarray, None)


class _PlainConnection:
    """A multiprocessing Connection whose send pickles with _PlainPickler."""

    def __init__(self, conn: _connection.Connection) -> None:
        self._conn = conn

    def send(self, obj: object) -> None:
        buf = io.BytesIO()
        _PlainPickler(buf).dump(obj)
        self._conn.send_bytes(buf.getbuffer())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __enter__(self) -> _PlainConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()


class _PlainListener(_connection.Listener):
    def accept(self) -> Any:
        return _PlainConnection(super().accept())


def _plain_client(*args: Any, **kwargs: Any) -> Any:
    return _PlainConnection(_connection.Client(*args, **kwargs))


_mp.listener_client["pickle"] = (_PlainListener, _plain_client)  # type: ignore[attr-defined]  # not in typeshed


def __getattr__(name: str) -> Any:
    return getattr(_mp, name)
