"""What zctipc sends of an object: one table of reducers keyed by type, as
torch.multiprocessing's reductions are, which every channel's pickler
takes: a zctipc queue's (zctipc._wire.pickler), multiprocessing's
ForkingPickler (zctipc._wire.reducers), the managers' (zctipc._wire.values)
and Ray's (zctipc.ray).

Note [one table of reducers]: a reducer decides what an object goes as:
its memory by descriptor, a copy of it in a pool buffer, its bytes in band,
a tensor as its storage and where it lies in it, a sparse tensor as its
parts, a table as its IPC stream, or the pickle it has without zctipc. The
Channel it is given says what that channel's messages allow and how a
buffer travels in them:
- a zctipc queue: out of band, beside the pickle, by index; small arrays
  in band as their bytes; every other array copied into the pool;
- multiprocessing's channels: the descriptor inside the pickle, its count
  given back if the dump fails; arrays copied only from COPY_BYTES, and
  only into a buffer the pool has at once; what zctipc does not send
  itself, torch's way; nothing of zctipc's in a forked child;
- the managers': as multiprocessing's, an array always a copy of its own;
- Ray: the tensors and arrays its transport takes, whole, in a list
  beside the pickle; everything else as Ray pickles it.
The table is built from the modules imported so far (table()), since
zctipc imports none of NumPy, torch and the table libraries itself.
"""

from __future__ import annotations

import functools
import pickle
import sys

from .._core import lazy, memory, native
from .._core.segments import SharedTensor
from . import exports, gpu, storages, tables

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeAlias

    import numpy as np
    import torch
    from numpy.typing import NDArray

    from .exports import Export

    #: A pickle reduction, as __reduce__ returns one: (rebuild, its arguments, ...), or a global's name.
    Reduction: TypeAlias = tuple[Any, ...] | str
    #: A reducer of the table: reduce(channel, obj).
    Reducer: TypeAlias = Callable[["Channel", Any], Reduction]
else:
    np = lazy.numpy(__name__)


class Channel:
    """What one channel's messages allow, and how a buffer travels in them
    (Note [one table of reducers]). The class attributes are a zctipc
    queue's; a channel, or one of its instances, changes what differs."""

    #: Arrays of up to this many bytes that are not zctipc memory go in band,
    #: as their bytes (-1: none).
    inline = -1
    #: Arrays of fewer bytes that are not zctipc memory go as the channel's
    #: plain pickle, never copied into the pool.
    copy_bytes = 0
    #: An array's copy takes a pool buffer only when one is there (Note
    #: [sending in band when shared memory is full] in zctipc._wire.exports).
    in_band: exports.InBand | None = None
    #: Whether a copy waits for a pool buffer, and for how long.
    block = True
    timeout: float | None = None
    #: Whether what zctipc does not send itself (storages in torch's shared
    #: memory, tensors on other devices) goes through the reducers torch
    #: registered, and nothing of zctipc's does in a forked child (Note
    #: [reducing in a forked child] in zctipc._wire.reducers): a channel that
    #: torch and the standard library use too.
    shared_with_torch = False
    #: Whether an array is sent as a copy of its own, writable (a manager's
    #: value), never as the sender's memory.
    copies = False
    #: The protocol of the channel's plain pickles.
    protocol = pickle.HIGHEST_PROTOCOL
    #: bound()'s table for this channel, with the modules it was made for.
    #: An attribute as any other: reading the instance's __dict__ instead
    #: made Python keep it as a dict, and every attribute store on the
    #: channel (a queue pickler's, several per message) cost three times
    #: as much.
    _bound: tuple[tuple[bool, ...], dict[type[Any], Callable[[Any], Reduction]]] | None = None

    def send(self, e: Export, obj: Any) -> Reduction:
        """The reduction that carries e, the buffer of obj; the count e
        holds travels with it."""
        raise NotImplementedError

    def send_storage(self, e: Export) -> Reduction:
        """The reduction that carries e, a torch storage's buffer, and
        makes it a storage again."""
        raise NotImplementedError

    def whole(self, obj: Any) -> Reduction | None:
        """A channel that takes objects of the table's types whole (Ray's
        transport takes tensors) overrides this: their reduction, or None
        for the table's way."""
        return None

    def plain(self, obj: Any) -> Reduction:
        """obj's pickle without zctipc."""
        return obj.__reduce_ex__(self.protocol)

    def small(self, arr: NDArray[Any]) -> Reduction:
        """A NumPy array that is not zctipc memory and goes in band."""
        if (args := exports.in_band_args(arr)) is not None:
            return exports.rebuild_in_band, args
        return self.plain(arr)


def reduce_array(ch: Channel, arr: NDArray[Any]) -> Reduction:
    """A NumPy array: zctipc memory by descriptor, else in band when small
    (or when no pool buffer is there for a channel that sends in band
    rather than wait), else a copy in a pool buffer."""
    nbytes = arr.nbytes
    if nbytes <= ch.inline and (args := exports.in_band_args(arr)) is not None:
        return exports.rebuild_in_band, args  # the common case of a queue's small arrays, first
    if ch.shared_with_torch and native.forked():
        return arr.__reduce__()
    if ch.copies:
        if nbytes < ch.copy_bytes:
            return ch.plain(arr)
        e = exports.copy_array(arr, ch.block, ch.timeout)  # whatever memory it lies in
        if e is not None:
            e.flags &= ~memory.READONLY  # the receiver's own, writable as a pickled array is
    else:
        e = exports.find_array(arr)
        if e is None and nbytes >= ch.copy_bytes:
            e = exports.copy_array(arr, ch.block, ch.timeout, ch.in_band)
    if e is None:
        return ch.small(arr)
    return ch.send(e, arr)


def reduce_shared(ch: Channel, st: SharedTensor) -> Reduction:
    """A SharedTensor: its segment, by descriptor (HandleClosed once closed)."""
    if st.closed:
        return st.__reduce__()  # raises HandleClosed
    return ch.send(exports.export_shared_tensor(st), st)


def reduce_tensor(ch: Channel, t: torch.Tensor) -> Reduction:
    """A torch tensor: a CPU strided one as its storage (which the storage
    reducer sends) and where it lies in it; a CUDA one by CUDA IPC; a sparse
    one as its parts; the rest as torch pickles it."""
    exports.check_grad(t)
    forked = ch.shared_with_torch and native.forked()
    if storages.shareable(t) and not forked:
        return storages.reduce_tensor(t)
    if t.is_cuda:
        return gpu.reduce_cuda(
            t, torch_reducers.get("tensor"), None if ch.shared_with_torch else lambda e: carry(ch, e)
        )
    if not forked and t.layout in _sparse_layouts():
        return _reduce_sparse(t)
    return _torch_way(ch, "tensor", t)


def reduce_storage(ch: Channel, s: torch.UntypedStorage) -> Reduction:
    """A CPU torch storage: shared, moved into zctipc memory first if need
    be (zctipc._wire.storages); in a channel torch uses too, one in torch's
    shared memory goes torch's way, and so does every one but zctipc
    memory under a torch that cannot move storages (Note [a torch that
    cannot move storages] there: torch's reducer would move zctipc memory
    into its own)."""
    if not storages.is_cpu(s) or (
        ch.shared_with_torch
        and (storages.is_torch_shared(s) or native.forked() or (not storages.can_move() and not storages.is_zctipc(s)))
    ):
        return _torch_way(ch, "storage", s)
    if s.nbytes() == 0:
        return storages.rebuild_empty, ()
    return ch.send_storage(exports.export_storage(s, ch.block, ch.timeout))


def reduce_table(ch: Channel, obj: Any) -> Reduction:
    """A pyarrow Table or RecordBatch, or a pandas or polars DataFrame: its
    IPC stream in a pool buffer."""
    if ch.shared_with_torch and native.forked():
        return obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    return tables.reduce_table(obj)


class _Carried:
    """Pickles as a reduction a channel made for a buffer sent from inside
    another object's reduction (a CUDA tensor's event counter)."""

    __slots__ = ("reduction",)

    def __init__(self, reduction: Reduction) -> None:
        self.reduction = reduction

    def __reduce__(self) -> Reduction:
        return self.reduction


def carry(ch: Channel, e: Export) -> _Carried:
    """e sent by channel ch from inside another object's reduction."""
    return _Carried(ch.send(e, None))


#: The reducers torch.multiprocessing registered for "tensor" and "storage"
#: before zctipc's own (zctipc._wire.reducers keeps them there): how torch's
#: channels send what zctipc does not send itself.
torch_reducers: dict[str, Callable[[Any], Reduction]] = {}


def _torch_way(ch: Channel, kind: str, obj: Any) -> Reduction:
    """obj (a tensor or storage, as kind says) as torch sends it: in a
    channel torch uses too, by torch.multiprocessing's reducer; else as
    torch pickles it."""
    if not ch.shared_with_torch:
        return ch.plain(obj)
    reducer = torch_reducers.get(kind)
    return obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL) if reducer is None else reducer(obj)


def modules() -> tuple[bool, ...]:
    """Which of the modules whose types the table holds are imported."""
    return tuple(m in sys.modules for m in _KNOWN_MODULES)


_KNOWN_MODULES = ("numpy", "torch", "pyarrow", "pandas", "polars")


_table: tuple[tuple[bool, ...], dict[type[Any], Reducer]] | None = None


def table() -> dict[type[Any], Reducer]:
    """The reducers of the types of the modules imported so far."""
    global _table
    key = modules()
    if _table is not None and _table[0] == key:
        return _table[1]
    found: dict[type[Any], Reducer] = {SharedTensor: reduce_shared}
    if "numpy" in sys.modules:
        lazy.check()
        found[np.ndarray] = reduce_array
    torch = sys.modules.get("torch")
    if torch is not None:
        found[torch.Tensor] = reduce_tensor
        found[torch.UntypedStorage] = reduce_storage
        for t, typed in storages.typed_reducers().items():  # as their untyped storage
            found[t] = _typed(typed)
    for t in tables.table_types():
        found[t] = reduce_table
    _table = key, found
    return found


def _typed(typed: Callable[[Any], Reduction]) -> Reducer:
    """A typed storage's reducer (torch's), which makes it its untyped one."""

    def reduce(ch: Channel, obj: Any) -> Reduction:
        return typed(obj)

    return reduce


def bound(ch: Channel) -> dict[type[Any], Callable[[Any], Reduction]]:
    """A pickler's dispatch table for channel ch: table()'s reducers, each
    given ch (and ch.whole first, where ch has one). Each reducer is marked
    (MARK), so that a registry of reducers can tell zctipc's from
    those registered before."""
    key = modules()
    cached = ch._bound
    if cached is not None and cached[0] == key:
        return cached[1]
    whole = ch.whole if type(ch).whole is not Channel.whole else None
    reducers = {t: _bind(reduce, ch, whole) for t, reduce in table().items()}
    ch._bound = (key, reducers)
    return reducers


#: The attribute that marks the reducers bound() makes.
MARK = "_zctipc_reducer"


def _bind(reduce: Reducer, ch: Channel, whole: Callable[[Any], Reduction | None] | None) -> Callable[[Any], Reduction]:
    reducer: Callable[[Any], Reduction]
    if whole is None:
        reducer = functools.partial(reduce, ch)  # no frame of its own: it is called for every object
    else:

        def reducer(obj: Any) -> Reduction:
            taken = whole(obj)
            return reduce(ch, obj) if taken is None else taken

    setattr(reducer, MARK, True)
    return reducer


# Note [sparse tensors]: torch pickles a sparse tensor as its parts (indices
# and values), and its rebuild function appends every tensor it makes to a
# list that only torch.load drains, to validate them later. Unpickled by a
# queue, they would stay in that list, and the pool buffers under their
# parts with them, for the life of the process. zctipc pickles the parts
# itself (out of band, as any tensor) and rebuilds the sparse tensor from
# them without that list: dropping it frees its buffers.

_SPARSE: dict[torch.layout, str] = {}  # torch layout -> its name, once torch is met


def _sparse_layouts() -> dict[torch.layout, str]:
    if not _SPARSE:
        import torch

        for name in ("coo", "csr", "csc", "bsr", "bsc"):
            _SPARSE[getattr(torch, "sparse_" + name)] = name
    return _SPARSE


def _reduce_sparse(t: torch.Tensor) -> Reduction:
    """A sparse tensor as its parts (see Note [sparse tensors])."""
    layout = _SPARSE[t.layout]
    requires_grad, t = t.requires_grad, t.detach()  # a part of a leaf that requires grad is not a leaf
    parts: tuple[Any, ...]
    if layout == "coo":
        parts = (t._indices(), t._values(), tuple(t.shape), t.is_coalesced())
    elif layout in ("csr", "bsr"):
        parts = (t.crow_indices(), t.col_indices(), t.values(), tuple(t.shape))
    else:
        parts = (t.ccol_indices(), t.row_indices(), t.values(), tuple(t.shape))
    return rebuild_sparse, (layout, parts, requires_grad)


def rebuild_sparse(layout: str, parts: tuple[Any, ...], requires_grad: bool = False) -> torch.Tensor:
    import torch

    if layout == "coo":
        indices, values, size, coalesced = parts
        t = torch.sparse_coo_tensor(indices, values, size, is_coalesced=coalesced, check_invariants=False)
    else:
        compressed, plain, values, size = parts
        t = torch.sparse_compressed_tensor(
            compressed, plain, values, size, layout=getattr(torch, "sparse_" + layout), check_invariants=False
        )
    return t.requires_grad_() if requires_grad else t
