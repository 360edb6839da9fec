"""Torch storages in zctipc memory: a CPU tensor sent to another process
is shared with it, as torch.multiprocessing shares one.

A tensor goes as its storage and where it lies in it (offset, shape,
strides), so that the tensors of one storage sent together arrive over one
storage, and the receiver's writes are seen by the sender. A storage that
is not zctipc memory is moved into a pool buffer first, in place (see
Note [moving storages]). One already in torch's own shared memory
(share_memory_(), or received through torch.multiprocessing) goes as torch
sends it, without a copy, through multiprocessing's channels; in a zctipc
message it is moved too (Note [torch's shared memory in a message]). Typed
storages (x.storage(), torch.FloatStorage) go as their untyped storage.

Note [torch's shared memory in a message]: torch sends a storage in its
shared memory as a file descriptor that the receiver fetches from the
sender's resource sharer, or as a file name that torch's manager removes
when the sender exits: neither is held by the message, so a receiver whose
sender has exited gets FileNotFoundError. A zctipc message holds what it
carries (a count on its pool buffer, Note [counts in flight] in
zctipc._wire.pickler), so a storage in torch's shared memory is moved into
the pool like any other. The sender and every receiver of the message then
share it; a process that received it through torch.multiprocessing before
keeps torch's memory, no longer written by the sender.
Threat model: what is reduced here is the sender's own objects; the
receiver gets a descriptor that the core checks like any other. What must
never happen is a message whose memory can go before it is taken.

Note [moving storages]: torch.UntypedStorage._swap_data_ptr_ swaps the
memory of two storages, so every tensor and view over a storage follows it
into the pool buffer whose bytes were copied from it, and the old memory
goes with the other storage. As with torch's share_memory_():
- it is not safe while another thread uses the tensor: a write made
  during the copy may be lost;
- a tensor made with torch.from_numpy no longer aliases its NumPy array,
  and an array made from the tensor before (.numpy()), or any raw pointer
  to its data, points to freed memory afterwards;
- every tensor of the storage (and the whole storage, however small the
  tensor sent) is moved.
A storage that zctipc made over its own memory is never moved (Note
[marked storages] in zctipc._core.memory): where find() cannot place it
(a stream's slot), it is copied, as before.

Note [a torch that cannot move storages]: torch before 2.12 has no
_swap_data_ptr_, and nothing else in its Python API changes the memory of a
storage in place (share_memory_() moves one into torch's own memory only).
Under such a torch (can_move() is False) a storage that is not zctipc
memory is copied into the pool buffer instead of moved: the receiver of a
zctipc message gets a copy of its own, as of a NumPy array, and later
writes on either side are not shared. In a channel torch uses too
(multiprocessing's queues and pipes, a child's arguments) it goes torch's
way, shared as torch.multiprocessing shares it. A tensor made in zctipc
memory (zctipc.empty with a torch dtype, or one received) is shared under
every torch.

Note [a put moves its storages before it returns]: torch.multiprocessing's
put returns at once and its feeder thread calls share_memory_() later;
zctipc's put moves every storage of the message into the pool on the
caller's thread. Measured on a state dict of 98 tensors (33.6 MB, in the
process's memory; benchmarks/bench_queue.py --only state-dict, a 2-core VM
whose memory speed varies several times over a minute, so medians of 50
puts): a put blocked 83 ms (25th percentile 14 ms), torch's 0.1 ms, and
the consumer had the dict after 84 ms against torch's 174 ms. Of a quiet
put (10 ms), the copy itself is 4.5 ms and the rest about 20 us a storage
(two lookups, a pool buffer, a storage over it, the swap). What could go
was taken away: the fresh pages of new arenas (a first put reserved 102 MB
for the dict's 38 MB of buffers, 38 ms of its 54; now only what it uses,
Note [slots reserved when first used] in go/internal/pool/pool.go), and a lookup
per storage. The move itself stays on the caller's thread:
- put promises that the message is in the queue when it returns, in
  order with the caller's other puts, and that an object that cannot be
  sent raises in the caller (zctipc.queues). A move in another thread
  would either put the record before its bytes are in the buffer, which
  a consumer could then read half-copied (every consumer, Go and C ones
  too, would have to wait on a mark of its own in each buffer), or put it
  after, as a feeder thread does, and lose all three promises;
- a move that runs after put returned races with the caller's next
  writes to the tensors, as torch's feeder thread does (a step of training
  after put may or may not be in what the consumer gets); on the caller's
  thread only other threads' writes during the put can race.
"""

from __future__ import annotations

import functools
import sys
import threading

from .._core import memory, native, pool

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    import torch

_lock = threading.Lock()  # one move at a time: re-checked under it


def is_zctipc(storage: torch.UntypedStorage) -> bool:
    """Whether a CPU storage lies in zctipc memory: marked as made by
    zctipc, or placed by find()."""
    if memory.is_marked(storage):
        return True
    found = memory.find(storage.data_ptr(), storage.nbytes())
    if found is None:
        return False
    memory.release_ref(found[0])
    return True


def is_torch_shared(storage: torch.UntypedStorage) -> bool:
    """Whether storage is in torch's own shared memory (what is_shared()
    said before zctipc patched it)."""
    return (_original_is_shared or type(storage).is_shared)(storage)


def move_into_pool(
    storage: torch.UntypedStorage, block: bool = True, timeout: float | None = None, unplaced: int | None = None
) -> tuple[int, int]:
    """(ref, offset): a count on the pool buffer that holds the whole CPU
    storage (of at least one byte) after moving its bytes there in place
    (Note [moving storages]), for a storage that find() did not place (one
    another thread moved meanwhile is not moved again). unplaced, when
    given, is the storage's data_ptr() when find() did not place it: the
    storage is moved unless its memory changed since. Waits for room in
    the pool as block and timeout say, then raises OutOfSharedMemory (the
    storage is then left where it was). Under a torch that cannot move a
    storage (can_move), the buffer gets a copy of its bytes and the storage
    stays where it was (Note [a torch that cannot move storages]). Not for
    a marked storage, whose memory is zctipc's already."""
    nbytes = storage.nbytes()
    ref, address = pool.alloc(nbytes, block, timeout)
    new = memory.storage(memory.owner(address, "zct_ref_release", ref, "releasing a buffer"), nbytes)
    with _lock:
        # Another thread may have moved it while the buffer was made: a move
        # changes its data_ptr(), which spares asking find() again.
        found = None if storage.data_ptr() == unplaced else memory.find(storage.data_ptr(), nbytes)
        if found is None:
            new.copy_(storage)
            if can_move():
                storage._swap_data_ptr_(new)  # type: ignore[attr-defined]  # private, not in torch's types
            else:
                storage = new  # the copy goes, with a count of its own
            found = memory.find(storage.data_ptr(), nbytes)
    # new holds the old memory now (or the unused buffer, or the copy, which
    # found's count keeps), freed with it.
    return found  # type: ignore[return-value]  # in zctipc memory now, which find() places


def can_move() -> bool:
    """Whether this torch can move a storage's memory in place
    (UntypedStorage._swap_data_ptr_, torch 2.12 and later; Note [a torch
    that cannot move storages])."""
    torch = _torch or _met_torch()
    return getattr(torch.UntypedStorage, "_swap_data_ptr_", None) is not None


# torch's, once torch is met
_torch: Any = None
_cpu: torch.device | None = None
_strided: torch.layout | None = None
_dtype_names: dict[torch.dtype, str] = {}  # torch dtype -> its name, which pickles faster


def _met_torch() -> Any:
    global _torch, _cpu, _strided
    import torch

    _torch, _cpu, _strided = torch, torch.device("cpu"), torch.strided
    return torch


def shareable(t: torch.Tensor) -> bool:
    """Whether torch tensor t is one that goes as its storage: a CPU
    strided tensor, not quantized or nested."""
    if _strided is None:
        _met_torch()
    return t.is_cpu and t.layout is _strided and not t.is_quantized and not t.is_nested


def is_cpu(storage: torch.UntypedStorage) -> bool:
    """Whether a torch storage is in CPU memory."""
    if _cpu is None:
        _met_torch()
    return storage.device == _cpu


# Tensors whose storage holds their elements other than as they read:
# rebuilt with torch's view that reads them so.
_PLAIN, _CONJ, _NEG = 0, 1, 2


def reduce_tensor(t: torch.Tensor) -> tuple[Callable[..., torch.Tensor], tuple[Any, ...]]:
    """The pickle reduction of a shareable tensor: its storage, which the
    pickler sends its own way, and where the tensor lies in it."""
    dtype = t.dtype
    name = _dtype_names.get(dtype) or _dtype_names.setdefault(dtype, str(dtype).removeprefix("torch."))
    bits = (_CONJ if t.is_conj() else _PLAIN) | (_NEG if t.is_neg() else _PLAIN)
    args = (t.untyped_storage(), name, t.storage_offset(), tuple(t.shape), t.stride(), t.requires_grad)
    return rebuild_tensor, (args + (bits,) if bits else args)


def rebuild_tensor(
    storage: torch.UntypedStorage,
    dtype: str,
    offset: int,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool = False,
    bits: int = _PLAIN,
) -> torch.Tensor:
    """A tensor over storage, as reduce_tensor described it (dtype is the
    name of a torch dtype)."""
    torch = _torch or _met_torch()
    t = torch.empty(0, dtype=getattr(torch, dtype)).set_(storage, offset, shape, stride)
    if bits & _NEG:
        t = torch._neg_view(t)
    if bits & _CONJ:
        t = t.conj()
    if requires_grad:
        t.requires_grad_()
    return t


def rebuild_empty() -> torch.UntypedStorage:
    """A storage of no bytes (one is sent in band)."""
    return (_torch or _met_torch()).UntypedStorage(0)


def typed_reducers() -> dict[type[Any], Callable[[Any], Any]]:
    """The reducers of torch's typed storages (TypedStorage, and the
    legacy FloatStorage and its kin), torch.multiprocessing's: each goes
    as its untyped storage, which a pickler with zctipc's storage reducer
    shares (not a copy of its bytes, as TypedStorage's own __reduce__
    makes), and its dtype or class."""
    from torch.multiprocessing import reductions

    torch = _torch or _met_torch()
    table: dict[type[Any], Callable[[Any], Any]] = {torch.storage.TypedStorage: reductions.reduce_typed_storage}
    for cls in torch._storage_classes:
        if cls is not torch.UntypedStorage and cls is not torch.storage.TypedStorage:
            table[cls] = reductions.reduce_typed_storage_child
    return table


_original_is_shared: Callable[[torch.UntypedStorage], bool] | None = None
_original_share_memory_: Callable[..., torch.UntypedStorage] | None = None


def patch_torch() -> None:
    """Make torch.UntypedStorage (and so Tensor) say is_shared() for
    storages in zctipc memory, and share_memory_() leave them where they
    are (torch would move them into its own shared memory). Idempotent."""
    with _patching:  # two threads that both found it unpatched would wrap each other's: a loop
        _patch_torch()


_patching = threading.Lock()


def _patch_torch() -> None:
    global _original_is_shared, _original_share_memory_
    cls = sys.modules["torch"].UntypedStorage
    if _original_is_shared is not None:
        return
    _original_is_shared, _original_share_memory_ = cls.is_shared, cls.share_memory_

    @functools.wraps(_original_is_shared)
    def is_shared(self: torch.UntypedStorage) -> bool:
        return _original_is_shared(self) or (is_cpu(self) and not native.forked() and is_zctipc(self))

    @functools.wraps(_original_share_memory_)
    def share_memory_(self: torch.UntypedStorage, *args: Any, **kwargs: Any) -> torch.UntypedStorage:
        if is_cpu(self) and not native.forked() and is_zctipc(self):
            return self
        return _original_share_memory_(self, *args, **kwargs)

    cls.is_shared, cls.share_memory_ = is_shared, share_memory_
