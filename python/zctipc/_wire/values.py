"""Value semantics for multiprocessing's managers.

Note [managers hand out copies]: a manager (zctipc.Manager(), a
SyncManager) keeps values in its server process and pickles them to and
from its clients through ForkingPickler, where zctipc's reducers send a
NumPy array in zctipc memory as a descriptor of that same memory. Stored
in a manager's dict, an array then aliased what every client read: a
client's in-place write changed the stored value and what other clients
saw, where the standard library's manager hands out copies. So zctipc's
managers talk through connections whose pickler copies every large NumPy
array once into a fresh pool buffer (small ones go in band, as ever),
whatever memory it lies in: a value stored or read is the receiver's own,
writable even when the sender's was read-only, as a pickled array is.
Torch tensors keep torch.multiprocessing's meaning (they are shared, as a
manager under torch shares them), and a SharedTensor is a handle to a
segment, shared by design.
Threat model: the manager's peers are processes of this user that know
its authkey (multiprocessing checks it); what must never happen is a
client's write reaching a value another client reads.
"""

from __future__ import annotations

import io
import sys
from multiprocessing import connection, managers
from multiprocessing.reduction import ForkingPickler

from .._core import lazy
from . import reducers, reductions

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any

    import numpy as np
else:
    np = lazy.numpy(__name__)


class _Serializer(str):
    """The name managers know these connections by (a key of
    multiprocessing.managers.listener_client), which imports this module
    wherever it is unpickled, and so registers the connections there: in
    the manager's server process, and in any process a proxy is sent to."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _serializer, ()


def _serializer() -> str:
    return SERIALIZER


SERIALIZER = _Serializer("zctipc")


class _Values(reducers.Forking):
    """A manager's channel: multiprocessing's, an array of COPY_BYTES or
    more always copied once into a fresh pool buffer, whatever memory it
    lies in, and writable there (Note [managers hand out copies])."""

    copies = True


_VALUES = _Values()


class _ValuePickler(ForkingPickler):
    """ForkingPickler, NumPy arrays copied (Note [managers hand out copies]);
    a failed dump gives back its copies' counts, whether or not zctipc's
    reducers are registered yet (Note [counts of a failed dump])."""

    dump = reducers.dump

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        lazy.check()
        if "numpy" in sys.modules:
            self.dispatch_table[np.ndarray] = reductions.bound(_VALUES)[np.ndarray]


class _ValueConnection:
    """A multiprocessing Connection whose send pickles with _ValuePickler."""

    def __init__(self, conn: connection.Connection) -> None:
        self._conn = conn

    def send(self, obj: object) -> None:
        buf = io.BytesIO()
        _ValuePickler(buf).dump(obj)
        self._conn.send_bytes(buf.getbuffer())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __enter__(self) -> _ValueConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()


class _Listener(connection.Listener):
    def accept(self) -> Any:
        return _ValueConnection(super().accept())


def _client(*args: Any, **kwargs: Any) -> Any:
    return _ValueConnection(connection.Client(*args, **kwargs))


managers.listener_client[SERIALIZER] = (_Listener, _client)  # type: ignore[attr-defined]  # not in typeshed


class SyncManager(managers.SyncManager):
    """multiprocessing's SyncManager, whose values are copies as the
    standard library's are (Note [managers hand out copies])."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("serializer", SERIALIZER)
        super().__init__(*args, **kwargs)
