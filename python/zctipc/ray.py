"""zctipc as Ray's same-node tensor transport (``pip install zctipc[ray]``).

Importing this module registers a one-sided Ray Direct Transport named
``"zctipc"`` for CPU torch tensors. An actor method decorated with
``@ray.method(tensor_transport="zctipc")`` (on an actor class made with
``@ray.remote(enable_tensor_transport=True)``) keeps the tensors it returns
in zctipc memory, moved there once if they are not already (by the rules of
:class:`zctipc.Queue`: a tensor's storage moves into the pool in place, so
the producer shares what it sent; under torch before 2.12, which cannot move
a storage, each return copies it instead), and Ray hands out only their
descriptors, as often as the method returns them (the same tensor every
call, as a parameter server's weights, included). An actor that receives
them must be made with ``@ray.remote(enable_tensor_transport=True)`` too,
which gives it the thread Ray receives on; a task of one made without it
that is given a zctipc object is refused at ``.remote()`` with
:class:`zctipc.errors.InvalidArgument` (a ``ValueError``), before anything
is submitted (Note [the receiver's transfer thread]). Where Ray delivers the object
decides the path:

- on the producer's node, the receiving actor (or ``ray.get``) attaches
  the descriptors: its tensors are views of the producer's memory, no byte
  copied, each holding a count of zctipc's own, so they stay valid if the
  producer dies or Ray frees the object;
- on another node, a Ray task pinned to the producer's node reads the
  tensors and returns them, and Ray's object store moves them, as it moves
  any task result.

Ray calls the transport's ``garbage_collect`` when the object is out of
scope everywhere; the producer then lets go of it. :func:`put` does the
same for any object holding torch tensors and NumPy arrays (a driver's or
a task's ``ray.put``), and :func:`get` fetches one from any process.

Nothing here speaks to the network: across nodes Ray moves the bytes.
"""

from __future__ import annotations

import collections
import functools
import io
import os
import pickle
import threading
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

try:
    import ray
    import torch
    from ray.experimental import (
        CommunicatorMetadata,
        TensorTransportManager,
        TensorTransportMetadata,
        register_tensor_transport,
    )
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(f"zctipc.ray needs Ray 2.60 or later and torch: pip install zctipc[ray] ({exc})") from exc

from . import errors
from ._core import lazy, native
from ._wire import exports, reductions

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any

    import numpy as np
else:
    np = lazy.numpy(__name__)

__all__ = [
    "NAME",
    "POOL_WAIT",
    "Shared",
    "ZctipcCommunicatorMetadata",
    "ZctipcTransport",
    "ZctipcTransportMetadata",
    "get",
    "put",
    "register",
    "share",
]

#: The transport's name, as ``tensor_transport=`` and ``_tensor_transport=`` take it.
NAME = "zctipc"

#: How long a producer waits for room in its pool for a tensor it returns
#: (one not yet in zctipc memory) before raising OutOfSharedMemory.
POOL_WAIT = 30.0


@dataclass
class ZctipcTransportMetadata(TensorTransportMetadata):
    """What a receiver needs: the node the tensors live on, and one
    descriptor per tensor (bytes that carry no count; whoever attaches them
    takes a count of its own)."""

    node_id: str = ""
    descriptors: list[bytes] = field(default_factory=list)


@dataclass
class ZctipcCommunicatorMetadata(CommunicatorMetadata):
    """Why the hand-off is refused, when it is (Note [the receiver's
    transfer thread]); else nothing: the receiver reads what the producer
    described."""

    refused: str = ""


# Note [the receiver's transfer thread]: Ray runs a hand-off's receive
# (its __ray_recv__, which calls recv_multiple_tensors) as a task on the
# receiving actor in the concurrency group "_ray_system", which only an
# actor made with @ray.remote(enable_tensor_transport=True) has. An actor
# made without it runs the receive in its own task order: when the
# producer had finished before the receiving task was submitted, the
# receive was submitted first and the hand-off worked; when it had not
# (a second hand-off, submitted at once), the receive goes after the task,
# which waits for it until Ray's transfer timeout (60 s) and fails; the
# late receive's tensors are then left in Ray's store of that actor, where
# nothing takes them. An async actor's event loop takes the two in either
# order, and was seen to wait out the timeout even when the producer had
# finished first. (A threaded one, max_concurrency > 1, would receive
# beside the waiting task while a thread is free, and hangs once none is.)
# Ray's own transports do the same (gloo was seen to), and a tensor sent
# twice plays no part in it.
#
# Such an actor is therefore refused at every hand-off, and the refusal
# must come before the task is queued: once it is, nothing reaches the
# waiting task. Ray's transport interface sees the receiving actor only in
# get_communicator_metadata, which Ray calls on the submitting thread only
# when the producer had already finished, and else later, from a native
# callback that drops what it raises. The one point that sees the handle
# and the task's arguments on the submitting thread, before anything is
# submitted, in every ordering, is where Ray's actor method call hands the
# arguments to RDTManager.queue_or_trigger_out_of_band_tensor_transfer:
# register() wraps that method (_refuse_receivers_without_transfer_thread)
# so that a zctipc object given to an actor made without the flag raises
# InvalidArgument from `.remote()`, naming the fix, and nothing is queued.
# Objects of other transports pass through untouched. The refusal in
# get_communicator_metadata stays as the second line, for a Ray without
# that method (and a process that had not imported zctipc.ray when it
# submitted): it warns, says why in the communicator metadata, and the
# receive raises it before attaching anything, which fails the task at
# once only where the receive runs first; where it runs last, the task
# waits out Ray's timeout.
#
# Threat model: the wrapper runs in the process that submits the task,
# with its own handles and refs; it reads only the handle's flag and Ray's
# record of which transport made each argument, and raises or calls Ray's
# method unchanged: it must never submit, take a count, or swallow Ray's
# own errors. Ray calls get_communicator_metadata in the owner of the
# ref, and any process of the cluster can submit __ray_recv__ with
# metadata of its choosing (Ray trusts its cluster). A forged `refused`
# only fails that receive; forged descriptors are checked by the library
# when attached (the segment's owner, size and header), as every
# received descriptor is. A refused receive must never attach, take a
# count, or wait.


def _no_transfer_thread(actor: Any) -> str:
    return (
        f"{actor} receives zctipc tensors but was made without @ray.remote(enable_tensor_transport=True): "
        "Ray would run the hand-off behind the task that waits for it, which then fails after Ray's transfer "
        "timeout whenever the producer had not finished first; make its class with "
        "@ray.remote(enable_tensor_transport=True)"
    )


def _refuse_receivers_without_transfer_thread() -> None:
    """Make Ray refuse, at ``.remote()``, an actor task made without
    enable_tensor_transport=True that is given a zctipc object (Note [the
    receiver's transfer thread])."""
    from ray.experimental.rdt.rdt_manager import RDTManager

    submit = getattr(RDTManager, "queue_or_trigger_out_of_band_tensor_transfer", None)
    if submit is None or getattr(submit, "_zctipc_refuses", False):
        return  # another Ray: get_communicator_metadata refuses as it can

    @functools.wraps(submit)
    def checked(self: Any, dst_actor: Any, task_args: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(dst_actor, "_ray_enable_tensor_transport", True):
            for arg in task_args or ():
                if not isinstance(arg, ray.ObjectRef):
                    continue
                meta = self.get_rdt_metadata(arg.hex())
                if getattr(meta, "tensor_transport_backend", None) == NAME.upper():
                    raise errors.InvalidArgument(_no_transfer_thread(dst_actor))
        return submit(self, dst_actor, task_args, *args, **kwargs)

    checked._zctipc_refuses = True  # type: ignore[attr-defined]
    setattr(RDTManager, "queue_or_trigger_out_of_band_tensor_transfer", checked)  # noqa: B010  # a method, for mypy


def _check(t: Any) -> None:
    """Raise a clear error for what the transport does not send."""
    if not isinstance(t, torch.Tensor):
        raise errors.InvalidArgument(f"the zctipc Ray transport sends torch tensors, not {type(t).__name__}")
    if t.device.type == "cuda":
        raise errors.InvalidArgument(
            f"the zctipc Ray transport sends CPU tensors; this one is on {t.device}: use Ray's own "
            'CUDA transport for it (tensor_transport="cuda_ipc" on one node, "nccl" or "nixl" across nodes)'
        )
    found = exports.torch_layout(t)  # what zctipc sends of a tensor, the same rule for every channel
    if not isinstance(found, tuple):
        found.args = (f"the zctipc Ray transport: {found}",)
        raise found
    if t.dim() > native.MAX_NDIM:
        raise errors.InvalidArgument(
            f"the zctipc Ray transport sends tensors of up to {native.MAX_NDIM} dimensions, not {t.dim()}"
        )
    if not t.is_contiguous():
        raise errors.InvalidArgument(
            f"the zctipc Ray transport sends contiguous tensors; this one (shape {tuple(t.shape)}, strides "
            f"{t.stride()}) is not: send t.contiguous()"
        )
    exports.check_grad(t)


def _sendable(t: Any) -> bool:
    """Whether _check lets torch tensor t through, and it has no grad to
    lose: a tensor that requires grad, a non-leaf too (which _check refuses
    as torch.multiprocessing does), goes as Ray pickles it."""
    if t.requires_grad:
        return False
    try:
        _check(t)
    except (errors.InvalidArgument, errors.UnsupportedDtype):
        return False
    return True


def _node() -> str:
    return str(ray.get_runtime_context().get_node_id())


class ZctipcTransport(TensorTransportManager):
    """The ``"zctipc"`` Ray Direct Transport: one-sided, CPU torch tensors,
    zero copy between the processes of one node. Ray makes one per process."""

    def __init__(self) -> None:
        self._held: dict[str, list[exports.Export]] = {}  # object id: the counts the producer keeps
        self._fetching: dict[str, Any] = {}  # object id: the reading task of a receive from another node
        self._lock = threading.Lock()

    def tensor_transport_backend(self) -> str:
        return NAME.upper()

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        # A receive on the producer's node attaches and returns at once; one
        # from another node waits on a Ray task, which abort_transport cancels.
        return True

    def actor_has_tensor_transport(self, actor: Any) -> bool:
        return True  # every process that can import zctipc has it

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: list[Any]) -> ZctipcTransportMetadata:
        for t in rdt_object:
            _check(t)
        held, descriptors = [], []
        try:
            for t in rdt_object:
                e = exports.export_bare(t.detach(), timeout=POOL_WAIT)
                if e is None:  # not expected after _check: the same rule (exports.torch_layout)
                    raise errors.InvalidArgument(f"the zctipc Ray transport cannot send {t!r}")
                held.append(e)
                descriptors.append(exports.describe(e))
        except BaseException:
            exports.release_all(held)
            raise
        with self._lock:
            retried = self._held.pop(obj_id, ())  # a retried task's first attempt
            self._held[obj_id] = held
        exports.release_all(retried)
        return ZctipcTransportMetadata(
            tensor_meta=[(t.shape, t.dtype) for t in rdt_object],
            tensor_device="cpu" if rdt_object else None,
            node_id=_node() if rdt_object else "",
            descriptors=descriptors,
        )

    def get_communicator_metadata(
        self, src_actor: Any, dst_actor: Any, backend: str | None = None
    ) -> ZctipcCommunicatorMetadata:
        # dst_actor is None for a ray.get, which waits in its own thread. An
        # actor made without the flag was refused at `.remote()` already,
        # where Ray let zctipc see it; this is the second line, where nothing
        # can raise (Note [the receiver's transfer thread]).
        if dst_actor is not None and not getattr(dst_actor, "_ray_enable_tensor_transport", True):
            refused = _no_transfer_thread(dst_actor)
            warnings.warn(refused, RuntimeWarning, stacklevel=2)  # Note [the receiver's transfer thread]
            return ZctipcCommunicatorMetadata(refused=refused)
        return ZctipcCommunicatorMetadata()

    def recv_multiple_tensors(
        self,
        obj_id: str,
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
        target_buffers: list[Any] | None = None,
    ) -> list[Any]:
        meta = tensor_transport_metadata
        if not isinstance(meta, ZctipcTransportMetadata):
            raise errors.InvalidArgument(f"not zctipc transport metadata: {type(meta).__name__}")
        refused = getattr(communicator_metadata, "refused", "")
        if refused:  # Note [the receiver's transfer thread]
            raise errors.InvalidArgument(refused)
        if not meta.descriptors:
            return []
        if meta.node_id == _node():
            tensors = [exports.attach(d) for d in meta.descriptors]
        else:
            task = _read_on(meta.node_id, meta.descriptors)
            with self._lock:
                self._fetching[obj_id] = task
            try:
                tensors = ray.get(task)
            finally:
                with self._lock:
                    self._fetching.pop(obj_id, None)
        if target_buffers:
            for buf, t in zip(target_buffers, tensors, strict=True):
                buf.copy_(t)
            return target_buffers
        return tensors

    def send_multiple_tensors(
        self, tensors: list[Any], tensor_transport_metadata: Any, communicator_metadata: Any
    ) -> None:
        raise NotImplementedError("the zctipc transport is one-sided: receivers read, producers never send")

    def garbage_collect(self, obj_id: str, tensor_transport_meta: Any, tensors: list[Any]) -> None:
        with self._lock:
            held = self._held.pop(obj_id, ())
        exports.release_all(held)

    def abort_transport(self, obj_id: str, communicator_metadata: Any) -> None:
        with self._lock:
            task = self._fetching.get(obj_id)
        if task is not None:  # the receive waits on it, and raises TaskCancelledError
            ray.cancel(task, force=True)


def _read(descriptors: list[bytes]) -> list[Any]:
    """The tensors the descriptors stand for, on their own node (a Ray task's
    body: Ray returns them through its object store)."""
    return [exports.attach(d) for d in descriptors]


_reader: Any = None


def _read_on(node_id: str, descriptors: list[bytes]) -> ray.ObjectRef[list[Any]]:
    """Read tensors living on another node: a task pinned to that node
    attaches them there, and Ray moves its result (a task that cannot be
    placed there, the node being gone, fails)."""
    global _reader
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if _reader is None:
        _reader = ray.remote(num_cpus=0, max_retries=0)(_read)
    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    ref: ray.ObjectRef[list[Any]] = _reader.options(scheduling_strategy=strategy).remote(descriptors)
    return ref


# -- ray.put, ray.get and task arguments of any object ---------------------------


class _Packed(NamedTuple):
    """An object taken apart for Ray: its pickle (by Ray's cloudpickle),
    the CPU torch tensors the transport takes (a NumPy array as a tensor
    over its memory), which of them stand for arrays, and the ObjectRefs it
    holds, which Ray serializes itself (so that it knows they are borrowed)."""

    data: bytes
    tensors: list[Any]
    arrays: list[int]
    refs: list[Any]


def _as_tensor(arr: Any) -> Any:
    """A torch tensor over the NumPy array's memory (a contiguous copy when
    it is not contiguous), or None for a dtype torch does not take."""
    with warnings.catch_warnings():  # a read-only array: the transport only reads it
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        try:
            return torch.from_numpy(np.ascontiguousarray(arr))
        except TypeError:  # ml_dtypes' bfloat16, say
            return None


class _Taking(reductions.Channel):
    """Ray's channel (Note [one table of reducers] in
    zctipc._wire.reductions): the table's tensors and arrays that the
    transport takes go whole to a list beside the pickle; everything else
    pickles as Ray pickles it."""

    def __init__(self, packed: _Packed) -> None:
        self.packed = packed

    def whole(self, obj: Any) -> reductions.Reduction:
        packed = self.packed
        if isinstance(obj, torch.Tensor):
            if not _sendable(obj):
                return self._ray_way(obj)
            t = obj
        elif type(obj) is np.ndarray and exports.code_of(obj.dtype) is not None:
            t = _as_tensor(obj)
            if t is None:
                return self._ray_way(obj)
            packed.arrays.append(len(packed.tensors))
        else:
            return self._ray_way(obj)
        packed.tensors.append(t)
        return _taken, (len(packed.tensors) - 1,)

    @staticmethod
    def _ray_way(obj: Any) -> reductions.Reduction:
        from ray import cloudpickle

        reducer = cloudpickle.CloudPickler.dispatch_table.get(type(obj))
        reduced: reductions.Reduction = obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL) if reducer is None else reducer(obj)
        return reduced


_unpacking = threading.local()


def _taken(index: int) -> Any:
    """The tensor or array at index of the object being unpacked."""
    return _unpacking.items[index]


def _pack(obj: Any) -> _Packed:
    """obj taken apart: what the transport sends whole goes to the tensors,
    everything else into the pickle, as Ray would pickle it."""
    from ray import cloudpickle

    packed = _Packed(b"", [], [], [])

    class Pickler(cloudpickle.CloudPickler):
        # A class attribute: the C pickler reads its table when it is made.
        dispatch_table = collections.ChainMap(
            reductions.bound(_Taking(packed)), cloudpickle.CloudPickler.dispatch_table
        )

        def persistent_id(self, obj: Any) -> tuple[str, int] | None:
            if isinstance(obj, ray.ObjectRef):
                packed.refs.append(obj)
                return "ref", len(packed.refs) - 1
            return None

    out = io.BytesIO()
    Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)  # type: ignore[no-untyped-call]  # cloudpickle
    return packed._replace(data=out.getvalue())


def _unpack(data: bytes, tensors: list[Any], arrays: list[int], refs: list[Any]) -> Any:
    """The object _pack took apart, over the tensors received for it."""
    items = list(tensors)
    for i in arrays:
        items[i] = items[i].numpy()

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            return refs[pid[1]]

    saved = getattr(_unpacking, "items", None)
    _unpacking.items = items
    try:
        return Unpickler(io.BytesIO(data)).load()
    finally:
        _unpacking.items = saved


class _Parcel:
    """What put() hands to Ray: an object whose tensors and arrays Ray's
    serializer meets as tensors, which the transport takes."""

    __slots__ = ("packed",)

    def __init__(self, packed: _Packed) -> None:
        self.packed = packed

    def __reduce__(self) -> tuple[Any, ...]:
        return _unpack, tuple(self.packed)


def put(obj: Any) -> ray.ObjectRef[Any]:
    """``ray.put(obj)`` whose CPU torch tensors and NumPy arrays go through
    the zctipc transport: ``ray.get`` on this node, and actor tasks given the
    ref, receive views of zctipc memory; on another node, Ray moves them.
    The rest of obj pickles as Ray pickles it (and an object with nothing
    the transport takes is a plain ``ray.put``). The memory lives until Ray
    frees the object. (A plain task cannot be given the ref itself, which
    Ray's direct transport serves to actors only: give it :func:`share`
    (obj), or the ref in a list and let it call :func:`get`.)"""
    register()
    packed = _pack(obj)
    if not packed.tensors:
        return ray.put(obj)
    return ray.put(_Parcel(packed), _tensor_transport=NAME)


def get(ref: Any, timeout: float | None = None) -> Any:
    """``ray.get`` that works in any process, a task's too (registering the
    transport first, which a task's worker has not)."""
    register()
    return ray.get(ref, timeout=timeout)


class Shared:
    """An object whose CPU torch tensors and NumPy arrays are in zctipc
    memory, to pass by value to tasks and actors: ``f.remote(share(obj))``.
    Where Ray runs the task, the argument becomes obj again: on this node
    over views of the same memory, elsewhere over copies Ray moved. A Ray
    object holds the memory (so Ray's own reference counting says when it
    goes), and each receiver takes a count of its own."""

    __slots__ = ("_packed", "_ref", "_node", "_descriptors")

    def __init__(self, obj: Any) -> None:
        register()
        self._packed = _pack(obj)
        self._ref: ray.ObjectRef[Any] | None = None
        self._node, self._descriptors = "", []
        if self._packed.tensors:
            self._ref = ray.put(self._packed.tensors, _tensor_transport=NAME)
            rdt = ray._private.worker.global_worker.rdt_manager.get_rdt_metadata(self._ref.hex())
            meta = rdt.tensor_transport_meta if rdt is not None else None
            if not isinstance(meta, ZctipcTransportMetadata):  # Ray's bookkeeping changed under us
                raise errors.ZctipcError(f"Ray kept no zctipc transport metadata for {self._ref!r}")
            self._node, self._descriptors = meta.node_id, meta.descriptors

    @property
    def ref(self) -> ray.ObjectRef[Any] | None:
        """The Ray object that holds the memory (None when obj had nothing
        the transport takes)."""
        return self._ref

    def value(self) -> Any:
        """The object, as a receiver gets it."""
        return _unshare(*self.__reduce__()[1])

    def __reduce__(self) -> tuple[Any, ...]:
        p = self._packed
        return _unshare, (p.data, p.arrays, p.refs, self._ref, self._node, self._descriptors)


def _unshare(data: bytes, arrays: list[int], refs: list[Any], ref: Any, node: str, descriptors: list[bytes]) -> Any:
    # ref rides along so that Ray keeps the memory while the argument is in
    # flight; once attached, the views hold counts of their own.
    if not descriptors:
        tensors: list[Any] = []
    elif node == _node():
        tensors = [exports.attach(d) for d in descriptors]
    else:
        tensors = ray.get(_read_on(node, descriptors))
    return _unpack(data, tensors, arrays, refs)


def share(obj: Any) -> Shared:
    """A :class:`Shared` of obj, to pass to tasks and actors by value."""
    return Shared(obj)


_registered = False
_register_lock = threading.Lock()

# Note [one RDT manager per process]: Ray keeps a process's RDT objects in
# the store of its RDT manager, which ray._private.worker.Worker makes on
# first use, in a property that checks and assigns without a lock. In a
# receiver, the first use is often the first hand-off itself: the receive
# (__ray_recv__, on the actor's transfer thread) adds the tensors to the
# store of the manager it finds, while the task they are for (on another
# thread) waits for them, in its argument's deserialization, in the store
# of the manager it finds. Both are submitted together, so both can find
# none and make one each; the receive's tensors then go to a store nobody
# reads, and the task fails after Ray's transfer timeout (60 s) with
# "not found in RDT object store". A thread switch inside that window is
# rare on an idle machine and common on a loaded one (CI saw it, in two
# pytest workers on two cores).
#
# Making the manager when zctipc.ray is imported would not be enough: a
# receiver may import zctipc.ray first in the receive itself (unpickling
# the transport's metadata), while the task it feeds is already inside
# Ray's property (an actor's restarted process, which Ray's transport
# registration task never reaches; an actor whose class knows nothing of
# zctipc). So register() makes the property's store keep the first
# manager (_keep_the_first_rdt_manager): Ray's property stores what it made
# in Worker._rdt_manager and returns what that then holds, so every thread,
# even one inside the property before the import, gets the first. (A Ray
# fix would make the property take a lock; this stays harmless then.)
#
# Only that store keeps the first: the setter knows it by the caller's
# code being the property's getter. Every other write (Ray's own None in
# Worker.__init__, a test's mock.patch.object) stores what it is given, as
# a plain attribute would. And Ray is changed only where it is the Ray
# this was written for: rdt_manager a property whose getter names
# _rdt_manager, and _rdt_manager no attribute of the class itself;
# anything else is left as it is.
#
# What this cannot cover: a process where two threads both store a manager
# before zctipc.ray is imported. The receive imports it first only where
# nothing did before: a restarted receiver with max_concurrency > 1 given
# two hand-offs at once can have both task threads make and store one
# through Ray's plain store, and one hand-off is lost. Ray's registration
# task (the only zctipc code Ray runs in a receiver unasked) reaches an
# actor's first process only, and nothing zctipc can reach runs in a
# restarted one before its task threads: a worker process setup hook is
# the job's (fixed at ray.init, and the user's own), and the sender cannot
# see that an actor has a new process. That race is Ray's own (two task
# threads of any transport); the fix is a lock in Ray's property.


def _keep_the_first_rdt_manager() -> None:
    """Make the store that Ray's ``Worker.rdt_manager`` makes in
    ``Worker._rdt_manager`` keep the first RDT manager, so that the property
    returns one manager to every thread (Note [one RDT manager per
    process]). Any other write (Ray's own None, a test's mock) stores what
    it is given."""
    import sys

    from ray._private.worker import Worker

    if getattr(getattr(Worker.__dict__.get("_rdt_manager"), "fget", None), "_zctipc_keeps_the_first", False):
        return
    lazy = Worker.__dict__.get("rdt_manager")
    making = getattr(getattr(lazy, "fget", None), "__code__", None)
    if (
        "_rdt_manager" in Worker.__dict__  # Ray's Worker has an _rdt_manager of its own
        or not isinstance(lazy, property)
        or making is None
        or "_rdt_manager" not in making.co_names  # the property does not keep its manager there
    ):
        return  # another Ray: leave it as it is
    lock = threading.Lock()

    def made(worker: Any) -> Any:
        return worker.__dict__.get("_rdt_manager")

    def keep(worker: Any, manager: Any) -> None:
        with lock:
            # Only the lazy creation keeps the first: that store is the one
            # two threads race to; every other write means what it says.
            if sys._getframe(1).f_code is not making or worker.__dict__.get("_rdt_manager") is None:
                worker.__dict__["_rdt_manager"] = manager

    made._zctipc_keeps_the_first = True  # type: ignore[attr-defined]
    setattr(Worker, "_rdt_manager", property(made, keep))  # noqa: B010


def register() -> None:
    """Register the transport in this process (done on import; Ray hands it
    on to the actors this process creates afterwards)."""
    global _registered
    from ray.experimental.rdt import util

    with _register_lock:
        if _registered:
            return
        if NAME.upper() not in util.transport_manager_info:
            register_tensor_transport(NAME, ["cpu"], ZctipcTransport, torch.Tensor)
        _refuse_receivers_without_transfer_thread()
        _keep_the_first_rdt_manager()  # Note [one RDT manager per process]
        if getattr(ray._private.worker.global_worker, "mode", None) == ray.WORKER_MODE:
            # A Ray worker loads the library now, and never warns that
            # zctipc chose its start method (Note [the start method
            # warning] in zctipc.context): that is news to the program that
            # started Ray, not to each of its workers, nor to their children,
            # whatever the environment Ray gave the worker says (0, say).
            os.environ["ZCTIPC_NO_START_METHOD_WARNING"] = "1"
            native.lib()
        _registered = True


register()
