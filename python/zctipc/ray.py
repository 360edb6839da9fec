"""zctipc as Ray's same-node tensor transport (``pip install zctipc[ray]``).

Importing this module registers a one-sided Ray Direct Transport named
``"zctipc"`` for CPU torch tensors. An actor method decorated with
``@ray.method(tensor_transport="zctipc")`` (on an actor class made with
``@ray.remote(enable_tensor_transport=True)``) keeps the tensors it returns
in zctipc memory, moved there once if they are not already (by the rules of
:class:`zctipc.Queue`: a tensor's storage moves into the pool in place, so
the producer shares what it sent), and Ray hands out only their
descriptors. Where Ray delivers the object decides the path:

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

import io
import pickle
import threading
import warnings
from dataclasses import dataclass, field

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
from ._wire import exports

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from typing import Any

    import numpy as np
else:
    np = lazy.numpy(__name__)

__all__ = ["NAME", "Shared", "ZctipcTransport", "ZctipcTransportMetadata", "get", "put", "register", "share"]

#: The transport's name, as ``tensor_transport=`` and ``_tensor_transport=`` take it.
NAME = "zctipc"


@dataclass
class ZctipcTransportMetadata(TensorTransportMetadata):
    """What a receiver needs: the node the tensors live on, and one
    descriptor per tensor (bytes that carry no count; whoever attaches them
    takes a count of its own)."""

    node_id: str = ""
    descriptors: list[bytes] = field(default_factory=list)


@dataclass
class ZctipcCommunicatorMetadata(CommunicatorMetadata):
    """Nothing: the receiver reads what the producer described."""


def _check(t: Any) -> None:
    """Raise a clear error for what the transport does not send."""
    if not isinstance(t, torch.Tensor):
        raise errors.InvalidArgument(f"the zctipc Ray transport sends torch tensors, not {type(t).__name__}")
    if t.device.type == "cuda":
        raise errors.InvalidArgument(
            f"the zctipc Ray transport sends CPU tensors; this one is on {t.device}: use Ray's own "
            'CUDA transport for it (tensor_transport="cuda_ipc" on one node, "nccl" or "nixl" across nodes)'
        )
    if t.device.type != "cpu":
        raise errors.InvalidArgument(f"the zctipc Ray transport sends CPU tensors; this one is on {t.device}")
    if exports.code_of(t.dtype) is None:
        raise errors.UnsupportedDtype(f"the zctipc Ray transport cannot share a tensor of dtype {t.dtype}")
    if not t.is_contiguous():
        raise errors.InvalidArgument(
            f"the zctipc Ray transport sends contiguous tensors; this one (shape {tuple(t.shape)}, strides "
            f"{t.stride()}) is not: send t.contiguous()"
        )
    exports.check_grad(t)


def _sendable(t: Any) -> bool:
    """Whether _check lets torch tensor t through, and it has no grad to lose."""
    return (
        t.device.type == "cpu"
        and not t.requires_grad
        and t.is_contiguous()
        and exports.code_of(t.dtype) is not None
        and t.dim() <= native.MAX_NDIM
    )


def _node() -> str:
    return str(ray.get_runtime_context().get_node_id())


class ZctipcTransport(TensorTransportManager):
    """The ``"zctipc"`` Ray Direct Transport: one-sided, CPU torch tensors,
    zero copy between the processes of one node. Ray makes one per process."""

    def __init__(self) -> None:
        self._held: dict[str, list[exports.Export]] = {}  # object id: the counts the producer keeps
        self._lock = threading.Lock()

    def tensor_transport_backend(self) -> str:
        return NAME.upper()

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        # A receive on the producer's node attaches and returns at once; one
        # on another node is a Ray task that Ray itself fails or cancels.
        return True

    def actor_has_tensor_transport(self, actor: Any) -> bool:
        return True  # every process that can import zctipc has it

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: list[Any]) -> ZctipcTransportMetadata:
        for t in rdt_object:
            _check(t)
        held, descriptors = [], []
        try:
            for t in rdt_object:
                e = exports.export_bare(t.detach()) or exports.export_tensor(t.detach())
                if e is None:  # more dimensions than a descriptor holds
                    raise errors.InvalidArgument(
                        f"the zctipc Ray transport cannot send a tensor of {t.dim()} dimensions"
                    )
                held.append(e)
                descriptors.append(exports.describe(e))
        except BaseException:
            for e in held:
                e.release()
            raise
        with self._lock:
            for e in self._held.pop(obj_id, ()):  # a retried task's first attempt
                e.release()
            self._held[obj_id] = held
        return ZctipcTransportMetadata(
            tensor_meta=[(t.shape, t.dtype) for t in rdt_object],
            tensor_device="cpu" if rdt_object else None,
            node_id=_node() if rdt_object else "",
            descriptors=descriptors,
        )

    def get_communicator_metadata(
        self, src_actor: Any, dst_actor: Any, backend: str | None = None
    ) -> ZctipcCommunicatorMetadata:
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
        if not meta.descriptors:
            return []
        if meta.node_id == _node():
            tensors = [exports.attach(d) for d in meta.descriptors]
        else:
            tensors = _fetch_from(meta.node_id, meta.descriptors)
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
        for e in held:
            e.release()

    def abort_transport(self, obj_id: str, communicator_metadata: Any) -> None:
        pass  # nothing in flight: a receive attaches, or waits on a Ray task


def _read(descriptors: list[bytes]) -> list[Any]:
    """The tensors the descriptors stand for, on their own node (a Ray task's
    body: Ray returns them through its object store)."""
    return [exports.attach(d) for d in descriptors]


_reader: Any = None


def _fetch_from(node_id: str, descriptors: list[bytes]) -> list[Any]:
    """Read tensors living on another node: a task pinned to that node
    attaches them there, and Ray moves its result."""
    global _reader
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if _reader is None:
        _reader = ray.remote(num_cpus=0, max_retries=0)(_read)
    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    result: list[Any] = ray.get(_reader.options(scheduling_strategy=strategy).remote(descriptors))
    return result


# -- ray.put, ray.get and task arguments of any object ---------------------------


def _pack(obj: Any) -> tuple[bytes, list[Any], list[int]]:
    """obj pickled with its CPU torch tensors and NumPy arrays left out: the
    pickle, the tensors (an array as a tensor over its memory), and which of
    them stand for arrays."""

    tensors: list[torch.Tensor] = []
    arrays: list[int] = []

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> int | None:
            if isinstance(obj, torch.Tensor):
                if not _sendable(obj):
                    return None  # pickled with the rest, as Ray would
                tensors.append(obj)
            elif type(obj) is np.ndarray and exports.code_of(obj.dtype) is not None:
                arrays.append(len(tensors))
                with warnings.catch_warnings():  # a read-only array: the transport only reads it
                    warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
                    tensors.append(torch.from_numpy(np.ascontiguousarray(obj)))
            else:
                return None
            return len(tensors) - 1

    out = io.BytesIO()
    Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue(), tensors, arrays


def _unpack(data: bytes, tensors: list[Any], arrays: list[int]) -> Any:
    """The object _pack took apart, over the tensors received for it."""

    items = list(tensors)
    for i in arrays:
        items[i] = items[i].numpy()

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            return items[pid]

    return Unpickler(io.BytesIO(data)).load()


class _Parcel:
    """What put() hands to Ray: an object whose tensors and arrays Ray's
    serializer meets as tensors, which the transport takes."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __reduce__(self) -> tuple[Any, ...]:
        return _unpack, _pack(self.obj)


def put(obj: Any) -> ray.ObjectRef[Any]:
    """``ray.put(obj)`` whose CPU torch tensors and NumPy arrays go through
    the zctipc transport: ``ray.get`` on this node, and actor tasks given the
    ref, receive views of zctipc memory; on another node, Ray moves them.
    The rest of obj pickles as usual. The memory lives until Ray frees the
    object. (A plain task cannot be given the ref itself, which Ray's direct
    transport serves to actors only: give it :func:`share` (obj), or the ref
    in a list and let it call :func:`get`.)"""
    register()
    return ray.put(_Parcel(obj), _tensor_transport=NAME)


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

    __slots__ = ("_data", "_arrays", "_ref", "_node", "_descriptors")

    def __init__(self, obj: Any) -> None:
        register()
        self._data, tensors, self._arrays = _pack(obj)
        self._ref = ray.put(tensors, _tensor_transport=NAME)
        rdt = ray._private.worker.global_worker.rdt_manager.get_rdt_metadata(self._ref.hex())
        meta = rdt.tensor_transport_meta if rdt is not None else None
        if not isinstance(meta, ZctipcTransportMetadata):  # ray.put of one transport: not expected
            raise errors.ZctipcError(f"Ray kept no zctipc transport metadata for {self._ref!r}")
        self._node, self._descriptors = meta.node_id, meta.descriptors

    @property
    def ref(self) -> ray.ObjectRef[Any]:
        """The Ray object that holds the memory."""
        return self._ref

    def value(self) -> Any:
        """The object, as a receiver gets it."""
        return _unshare(self._data, self._arrays, self._ref, self._node, self._descriptors)

    def __reduce__(self) -> tuple[Any, ...]:
        return _unshare, (self._data, self._arrays, self._ref, self._node, self._descriptors)


def _unshare(data: bytes, arrays: list[int], ref: Any, node: str, descriptors: list[bytes]) -> Any:
    # ref rides along so that Ray keeps the memory while the argument is in
    # flight; once attached, the views hold counts of their own.
    if not descriptors:
        tensors: list[Any] = []
    elif node == _node():
        tensors = [exports.attach(d) for d in descriptors]
    else:
        tensors = _fetch_from(node, descriptors)
    return _unpack(data, tensors, arrays)


def share(obj: Any) -> Shared:
    """A :class:`Shared` of obj, to pass to tasks and actors by value."""
    return Shared(obj)


_registered = False
_register_lock = threading.Lock()


def register() -> None:
    """Register the transport in this process (done on import; Ray hands it
    on to the actors this process creates afterwards)."""
    global _registered
    from ray.experimental.rdt import util

    with _register_lock:
        if _registered or NAME.upper() in util.transport_manager_info:
            _registered = True
            return

        register_tensor_transport(NAME, ["cpu"], ZctipcTransport, torch.Tensor)
        _registered = True
    if getattr(ray._private.worker.global_worker, "mode", None) == ray.WORKER_MODE:
        # A Ray worker loads the library now, quietly: that zctipc makes
        # forkserver multiprocessing's default start method is news to the
        # program that started Ray, not to each of its workers.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "zctipc made 'forkserver'", RuntimeWarning)
            native.lib()


register()
