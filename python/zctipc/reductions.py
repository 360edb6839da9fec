"""How zctipc pickles arrays, tensors and SharedTensors.

Two picklers use the same machinery:

* zctipc's queues pickle a whole object (protocol 5) with a dispatch table
  that sends every NumPy array, CPU torch tensor and SharedTensor inside it
  out of band: memory that is already zctipc memory goes as a descriptor
  (zero copy, one more count on it); any other buffer is copied once into a
  pool slot. The descriptors travel in the record beside the pickle, which
  refers to them by index.

* multiprocessing's ForkingPickler (used by multiprocessing.Queue, Pipe,
  Pool arguments and results) gets reducers, registered the way
  torch.multiprocessing registers its own, that send zctipc memory as a
  descriptor inlined in the pickle; everything else pickles as before.

Note [counts in flight]: a descriptor carries one count on its memory,
added when it is made. Whoever unpickles it takes that count over; a
descriptor that is never unpickled keeps its memory until the cleanup of
its segment (the queue's last holder drains unread messages).
"""

import copyreg
import io
import pickle
import sys
import threading
from multiprocessing.reduction import ForkingPickler

import numpy as np

from . import _dtypes, _native, _views
from .errors import CudaUnavailable, UnsupportedDtype
from .pool import _c_strides, alloc
from .tensor import SharedTensor

__all__ = ["init_reductions", "init_torch_reductions", "is_shared"]


class Export:
    """A buffer on its way out: a ref, and the array laid over it; flags
    are the descriptor's (the Python type to rebuild, read-only)."""

    __slots__ = ("ref", "offset", "code", "shape", "strides", "flags")

    def __init__(self, ref, offset, code, shape, strides, flags):
        self.ref, self.offset, self.code = ref, offset, code
        self.shape, self.strides, self.flags = shape, strides, flags

    def fill(self, view):
        """Write this export into a zct_view struct."""
        view.ref = self.ref
        view.offset = self.offset
        view.dtype = self.code
        view.ndim = len(self.shape)
        view.shape[0 : len(self.shape)] = self.shape
        view.strides[0 : len(self.strides)] = self.strides
        view.flags = self.flags

    def release(self):
        _native.check(_native.lib().zct_ref_release(self.ref))


def _extent(shape, strides, itemsize):
    if 0 in shape:
        return 0
    return sum((d - 1) * s for d, s in zip(shape, strides)) + itemsize


class _FindOut(threading.local):
    def __init__(self):
        ffi = _native.ffi()
        self.ref = ffi.new("zct_handle *")
        self.offset = ffi.new("uint64_t *")


_find_out = None


def _find(address, nbytes):
    """A ref with one more count on the zctipc memory at address, or None."""
    global _find_out
    if not _native.loaded():
        return None  # nothing of zctipc lives in this process
    out = _find_out or (_find_out := _FindOut())
    status = _native.lib().zct_ref_find(_native.ffi().cast("void *", address), nbytes, out.ref, out.offset)
    if status == _native.E_NOT_FOUND:
        return None
    _native.check(status)
    return out.ref[0], out.offset[0]


def _slot_for(shape, code, block, timeout):
    """A fresh buffer for an array of shape and type code: (ref, memory,
    strides)."""
    itemsize = _dtypes.ITEMSIZE[code]
    nbytes = itemsize
    for d in shape:
        nbytes *= d
    ref, address = alloc(max(nbytes, 1), block, timeout)
    return ref, _native.ffi().cast("char *", address), nbytes, _c_strides(shape, itemsize)


def _export(address, code, shape, strides, flags, fill, block, timeout, copy):
    """An Export of the array at address: its own memory when that is zctipc
    memory, else (with copy) a fresh buffer that fill(memory, nbytes,
    c_strides) copies it into, in C order. None for an array of more
    dimensions than a descriptor holds: it is pickled in band."""
    if len(shape) > _native.MAX_NDIM:
        return None
    if address is not None and min(strides, default=0) >= 0:
        found = _find(address, _extent(shape, strides, _dtypes.ITEMSIZE[code]))
        if found is not None:
            return Export(found[0], found[1], code, shape, strides, flags)
    if not copy:
        return None
    ref, memory, nbytes, c_strides = _slot_for(shape, code, block, timeout)
    try:
        fill(memory, nbytes, c_strides)
    except BaseException:
        _native.check(_native.lib().zct_ref_release(ref))
        raise
    return Export(ref, 0, code, shape, c_strides, flags)


def export_array(arr, block=True, timeout=None, copy=True):
    """An Export for a NumPy array, or None when it cannot go out of band
    (object, structured, non-native dtypes) or, without copy, is not zctipc
    memory."""
    try:
        code = _dtypes.code_of_numpy(arr.dtype)
    except UnsupportedDtype:
        return None

    def fill(memory, nbytes, c_strides):
        np.copyto(_views.ndarray(memory, nbytes, arr.dtype, arr.shape, c_strides), arr)

    flags = _views.NUMPY if arr.flags.writeable else _views.NUMPY | _views.READONLY
    return _export(arr.__array_interface__["data"][0], code, arr.shape, arr.strides, flags, fill,
                   block, timeout, copy)


_TORCH_CODES = {}  # torch dtype -> code, filled as dtypes are met


def _torch_layout(t):
    """(type code, shape, byte strides) of a CPU strided tensor, or None."""
    import torch

    if not t.is_cpu or t.layout is not torch.strided or t.is_quantized:
        return None
    code = _TORCH_CODES.get(t.dtype)
    if code is None:
        try:
            code = _TORCH_CODES[t.dtype] = _dtypes.code_of(t.dtype)
        except UnsupportedDtype:
            return None
    size = _dtypes.ITEMSIZE[code]
    return code, tuple(t.shape), tuple(s * size for s in t.stride())


def _check_grad(t):
    if t.requires_grad and not t.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not "
            "support crossing process boundaries. If you just want to transfer the data, call detach() "
            "on the tensor before serializing (e.g., putting it on the queue)."
        )


def export_tensor(t, block=True, timeout=None, copy=True):
    """An Export for a torch tensor, as export_array does for arrays."""
    layout = _torch_layout(t)
    if layout is None:
        return None
    code, shape, strides = layout

    def fill(memory, nbytes, c_strides):
        storage = _views.ndarray(memory, nbytes, _dtypes.storage_dtype(code), shape, c_strides)
        _views.tensor(storage, code).copy_(t.detach())

    address = t.data_ptr() if 0 not in shape else None
    return _export(address, code, shape, strides, _views.TORCH, fill, block, timeout, copy)


#: Types a queue sends as a bare tensor record, which a Go or C consumer
#: reads as a tensor (torch.Tensor joins once zctipc has met torch).
BARE = {np.ndarray, SharedTensor}


def export_bare(obj, block=True, timeout=None):
    """An Export for obj when it is a plain NumPy array, a plain torch
    tensor without grad that can go out of band, or an open SharedTensor;
    else None (it is pickled instead)."""
    t = type(obj)
    if t is np.ndarray:
        return export_array(obj, block, timeout)
    if t is SharedTensor:
        return None if obj.closed else export_shared_tensor(obj)
    if t.__module__ == "torch" and t.__name__ == "Tensor" and not obj.requires_grad:
        return export_tensor(obj, block, timeout)
    return None


def export_shared_tensor(st):
    """An Export for a SharedTensor: its own segment, by descriptor."""
    memory = st._live()
    found = _find(int(_native.ffi().cast("uintptr_t", memory)), st.nbytes)
    if found is None:
        raise RuntimeError(f"{st!r} is not mapped in this process")
    return Export(found[0], found[1], st._code, st.shape, st.strides, _views.SHARED_TENSOR)


def build(view):
    """The object a received zct_view stands for; it holds the view's ref."""
    if view.flags & 3 == _views.SHARED_TENSOR and view.kind == 1:
        ffi, lib = _native.ffi(), _native.lib()
        handle = ffi.new("zct_handle *")
        info = ffi.new("zct_info *")
        _native.check(lib.zct_ref_segment(view.ref, handle, info))
        return SharedTensor._wrap(handle[0], info)
    return _views.from_view(view)


# -- the queue pickler -------------------------------------------------------

_receiving = threading.local()
_sending = threading.local()


def _rebuild(index, requires_grad=False):
    """Unpickle the buffer at index of the message being received."""
    ctx = _receiving.ctx
    obj = ctx.objects[index]
    if obj is None:
        obj = ctx.objects[index] = build(ctx.views[index])
    if requires_grad:
        obj.requires_grad_()
    return obj


class QueuePickler:
    """Pickles objects for a queue, with their arrays, tensors and
    SharedTensors out of band; kept between messages, since making a pickler
    costs more than pickling a small object."""

    def __init__(self):
        self.file = io.BytesIO()
        self.pickler = pickle.Pickler(self.file, pickle.HIGHEST_PROTOCOL)
        table = dict(copyreg.dispatch_table)
        table[np.ndarray] = self._reduce_array
        table[SharedTensor] = self._reduce_shared
        torch = sys.modules.get("torch")
        if torch is not None:
            table[torch.Tensor] = self._reduce_tensor
        for t in table_types():
            table[t] = self._reduce_table
        self.pickler.dispatch_table = table
        self.modules = _modules()
        self.busy = False
        self.exports = []
        self.block, self.timeout = True, None

    def current(self):
        """Whether this pickler still fits: no module it knows types of
        (torch, pyarrow, pandas, polars) imported since."""
        return self.modules == _modules()

    def dumps(self, obj, block=True, timeout=None):
        """(pickle bytes, [Export, ...]). On failure every buffer already
        exported is released."""
        self.busy = True
        self.exports = exports = []
        self.block, self.timeout = block, timeout
        f = self.file
        try:
            f.seek(0)
            f.truncate()
            self.pickler.clear_memo()
            self.pickler.dump(obj)
            return f.getvalue(), exports
        except BaseException:
            for e in exports:
                e.release()
            raise
        finally:
            self.busy = False

    def dump_run(self, objs, limit, block, timeout, first=None):
        """Pickle objects from the iterator objs (after first, when given)
        one after another into one buffer, stopping at the first whose
        pickle has out-of-band buffers or would take the run past limit
        bytes. Returns (buffer, [end of each pickle], single): single is
        (obj, pickle, exports) for an object with buffers, (_Oversized(obj),
        None, []) for one that did not fit, (_Failed(exc), None, []) for one
        whose pickling raised exc after others were pickled, or None when
        objs ran out."""
        from .queues import _Failed, _Oversized

        self.busy = True
        self.exports = exports = []
        self.block, self.timeout = block, timeout
        f, dump, clear = self.file, self.pickler.dump, self.pickler.clear_memo
        f.seek(0)
        f.truncate()
        ends, tell = [], f.tell
        append = ends.append
        start = 0
        try:
            for obj in (objs if first is None else _chain(first, objs)):
                clear()
                try:
                    dump(obj)
                except Exception as exc:
                    if not ends:
                        raise
                    # The objects before it go first, as puts one by one would.
                    for e in exports:
                        e.release()
                    exports.clear()
                    f.truncate(start)
                    return f.getvalue(), ends, (_Failed(exc), None, [])
                end = tell()
                if exports:
                    payload = f.getvalue()[start:end]
                    f.truncate(start)
                    single, self.exports = (obj, payload, exports), []
                    return f.getvalue(), ends, single
                if end > limit and ends:
                    f.truncate(start)
                    return f.getvalue(), ends, (_Oversized(obj), None, [])
                append(end)
                start = end
            return f.getvalue(), ends, None
        except BaseException:
            for e in exports:
                e.release()
            raise
        finally:
            self.busy = False

    def _export(self, obj, export):
        e = export(obj, self.block, self.timeout)
        if e is None:
            return obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        self.exports.append(e)
        return _rebuild, (len(self.exports) - 1,)

    def _reduce_array(self, arr):
        return self._export(arr, export_array)

    def _reduce_tensor(self, t):
        _check_grad(t)
        if t.device.type == "cuda":
            return _reduce_cuda(t)
        if t.layout in _sparse_layouts():
            return _reduce_sparse(t)
        rv = self._export(t, export_tensor)
        if rv[0] is _rebuild and t.requires_grad:
            return _rebuild, (rv[1][0], True)
        return rv

    def _reduce_table(self, obj):
        from .arrow import reduce_table

        return reduce_table(obj)

    def _reduce_shared(self, st):
        return self._export(st, lambda st, block, timeout: export_shared_tensor(st))


# Note [sparse tensors]: torch pickles a sparse tensor as its parts (indices
# and values), and its rebuild function appends every tensor it makes to a
# list that only torch.load drains, to validate them later. Unpickled by a
# queue, they would stay in that list, and the pool buffers under their
# parts with them, for the life of the process. zctipc pickles the parts
# itself (out of band, as any tensor) and rebuilds the sparse tensor from
# them without that list: dropping it frees its buffers.

_SPARSE = {}  # torch layout -> its name, once torch is met


def _sparse_layouts():
    if not _SPARSE:
        import torch

        for name in ("coo", "csr", "csc", "bsr", "bsc"):
            _SPARSE[getattr(torch, "sparse_" + name)] = name
    return _SPARSE


def _reduce_sparse(t):
    """A sparse tensor as its parts (see Note [sparse tensors])."""
    layout = _SPARSE[t.layout]
    if layout == "coo":
        parts = (t._indices(), t._values(), tuple(t.shape), t.is_coalesced())
    elif layout in ("csr", "bsr"):
        parts = (t.crow_indices(), t.col_indices(), t.values(), tuple(t.shape))
    else:
        parts = (t.ccol_indices(), t.row_indices(), t.values(), tuple(t.shape))
    return _rebuild_sparse, (layout, parts, t.requires_grad)


def _rebuild_sparse(layout, parts, requires_grad=False):
    import torch

    if layout == "coo":
        indices, values, size, coalesced = parts
        t = torch.sparse_coo_tensor(indices, values, size, is_coalesced=coalesced, check_invariants=False)
    else:
        compressed, plain, values, size = parts
        t = torch.sparse_compressed_tensor(compressed, plain, values, size, layout=getattr(torch, "sparse_" + layout),
                                           check_invariants=False)
    return t.requires_grad_() if requires_grad else t


_KNOWN_MODULES = ("torch", "pyarrow", "pandas", "polars")


def _modules():
    """Which of the modules whose types zctipc sends its own way are
    imported."""
    return tuple(m in sys.modules for m in _KNOWN_MODULES)


def table_types():
    from .arrow import table_types

    return table_types()


def _chain(first, rest):
    yield first
    yield from rest


def pickler():
    """A QueuePickler this thread may use now."""
    p = getattr(_sending, "pickler", None)
    if p is None or not p.current():
        p = _sending.pickler = QueuePickler()
    return QueuePickler() if p.busy else p


def dumps(obj, block=True, timeout=None):
    """Pickle obj for a queue: (pickle bytes, [Export, ...])."""
    return pickler().dumps(obj, block, timeout)


class _Receiving:
    __slots__ = ("views", "objects")


def loads(data, views, nviews):
    """Unpickle a queue message whose buffers are views[0:nviews]. A buffer
    the pickle does not use is released."""
    if nviews == 0:
        return pickle.loads(data)
    ctx = _Receiving()
    ctx.views = views
    ctx.objects = [None] * nviews
    saved = getattr(_receiving, "ctx", None)
    _receiving.ctx = ctx
    try:
        return pickle.loads(data)
    finally:
        _receiving.ctx = saved
        for i in range(nviews):
            if ctx.objects[i] is None:
                _views.release_ref(views[i].ref)


# -- ForkingPickler reducers (standard multiprocessing channels) -------------


def _encode(export):
    """Descriptor bytes for an Export; its count travels in them."""
    ffi, lib = _native.ffi(), _native.lib()
    view = ffi.new("zct_view *")
    export.fill(view)
    buf = ffi.new("char[]", 1024)
    size = ffi.new("uint64_t *")
    try:
        _native.check(lib.zct_ref_encode(view, buf, 1024, size))
    except BaseException:
        export.release()
        raise
    return ffi.buffer(buf, size[0])[:]


def rebuild_descriptor(data, requires_grad=False):
    """Unpickle a buffer sent through a standard multiprocessing channel."""
    ffi, lib = _native.ffi(), _native.lib()
    view = ffi.new("zct_view *")
    _native.check(lib.zct_ref_decode(data, len(data), view))
    obj = build(view)
    if requires_grad:
        obj.requires_grad_()
    return obj


def _fp_reduce_array(arr):
    e = export_array(arr, copy=False)
    if e is None:
        return arr.__reduce__()
    return rebuild_descriptor, (_encode(e),)


def _fp_reduce_shared(st):
    if st.closed:
        return st.__reduce__()  # raises HandleClosed
    return rebuild_descriptor, (_encode(export_shared_tensor(st)),)


_torch_fallback = None


def _reduce_cuda(t):
    """A CUDA tensor goes by CUDA IPC (zctipc.cuda); where zctipc cannot
    reach CUDA, as torch would send it."""
    from . import cuda

    try:
        return cuda.reduce_tensor(t)
    except CudaUnavailable:
        if _torch_fallback is not None:
            return _torch_fallback(t)
        return t.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


def _fp_reduce_tensor(t):
    _check_grad(t)
    if t.device.type == "cuda":
        return _reduce_cuda(t)
    e = export_tensor(t, copy=False)
    if e is None:
        if _torch_fallback is not None:
            return _torch_fallback(t)
        return t.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    return rebuild_descriptor, (_encode(e), t.requires_grad)


def init_reductions():
    """Register zctipc's reducers with multiprocessing's ForkingPickler: for
    NumPy arrays and SharedTensors now, for torch tensors once torch is
    imported, and for pyarrow Tables and RecordBatches and pandas and polars
    DataFrames when their modules are imported (call it again after importing
    one of them to send its tables through standard channels). Tensors that are not zctipc memory keep the reducer that was
    registered before (torch.multiprocessing's, if imported). zctipc calls
    this at import and whenever it meets torch; calling it again is cheap."""
    ForkingPickler.register(np.ndarray, _fp_reduce_array)
    ForkingPickler.register(SharedTensor, _fp_reduce_shared)
    init_torch_reductions()
    for t in table_types():
        ForkingPickler.register(t, _fp_reduce_table)


def _fp_reduce_table(obj):
    from .arrow import reduce_table

    return reduce_table(obj)


def init_torch_reductions():
    """Register the torch tensor reducer if torch is imported and the
    registered one is not zctipc's (torch.multiprocessing, imported later,
    puts its own in place)."""
    global _torch_fallback
    torch = sys.modules.get("torch")
    if torch is not None:
        BARE.add(torch.Tensor)
        current = ForkingPickler._extra_reducers.get(torch.Tensor)
        if current is not _fp_reduce_tensor:
            _torch_fallback = current
            ForkingPickler.register(torch.Tensor, _fp_reduce_tensor)


def is_shared(obj):
    """Whether obj (a NumPy array, a torch tensor or a SharedTensor) lies in
    zctipc shared memory, so that zctipc sends it by descriptor."""
    if isinstance(obj, SharedTensor):
        return not obj.closed
    if isinstance(obj, np.ndarray):
        e = export_array(obj, copy=False)
    elif type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        e = export_tensor(obj, copy=False)
    else:
        raise TypeError(f"is_shared() takes an array, a tensor or a SharedTensor, not {type(obj).__name__}")
    if e is None:
        return False
    e.release()
    return True
