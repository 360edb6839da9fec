"""Buffers on their way out and back: an Export is a count on zctipc memory
with the array laid over it, which a descriptor carries to another
process; a received view becomes the object it stands for.

Memory that is already zctipc memory goes as itself (zero copy, one more
count on it); any other buffer is copied once into a pool buffer, in C
order. Arrays of more dimensions than a descriptor holds, and element types
zctipc cannot share, do not go out of band: the caller pickles them in band.
"""

import threading

import numpy as np

from ..errors import UnsupportedDtype
from .._core import dtypes, layout, memory, native, pool
from .._core.segments import SharedTensor


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
        native.check(native.lib().zct_ref_release(self.ref))


class _FindOut(threading.local):
    def __init__(self):
        ffi = native.ffi()
        self.ref = ffi.new("zct_handle *")
        self.offset = ffi.new("uint64_t *")


_find_out = None


def find(address, nbytes):
    """(ref, offset): one more count on the zctipc memory that holds the
    nbytes at address, or None when it is not zctipc memory."""
    global _find_out
    if not native.loaded():
        return None  # nothing of zctipc lives in this process
    out = _find_out or (_find_out := _FindOut())
    status = native.lib().zct_ref_find(native.ffi().cast("void *", address), nbytes, out.ref, out.offset)
    if status == native.E_NOT_FOUND:
        return None
    native.check(status)
    return out.ref[0], out.offset[0]


def _export(address, code, shape, strides, flags, fill, block, timeout, copy):
    """An Export of the array at address: its own memory when that is zctipc
    memory, else (with copy) a fresh pool buffer that fill(owner, nbytes,
    c_strides) copies it into, in C order. None for an array of more
    dimensions than a descriptor holds."""
    if len(shape) > native.MAX_NDIM:
        return None
    itemsize = dtypes.ITEMSIZE[code]
    if address is not None and min(strides, default=0) >= 0:
        found = find(address, layout.extent(shape, strides, itemsize))
        if found is not None:
            return Export(found[0], found[1], code, shape, strides, flags)
    if not copy:
        return None
    size = layout.nbytes(shape, itemsize)
    ref, address = pool.alloc(max(size, 1), block, timeout)
    c_strides = layout.c_strides(shape, itemsize)
    try:
        fill(native.ffi().cast("char *", address), size, c_strides)
    except BaseException:
        native.check(native.lib().zct_ref_release(ref))
        raise
    return Export(ref, 0, code, shape, c_strides, flags)


def export_array(arr, block=True, timeout=None, copy=True):
    """An Export for a NumPy array, or None when it cannot go out of band
    (object, structured, non-native dtypes) or, without copy, is not zctipc
    memory."""
    try:
        code = dtypes.code_of_numpy(arr.dtype)
    except UnsupportedDtype:
        return None

    def fill(owner, size, c_strides):
        np.copyto(memory.ndarray(owner, size, arr.dtype, arr.shape, c_strides), arr)

    flags = memory.NUMPY if arr.flags.writeable else memory.NUMPY | memory.READONLY
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
            code = _TORCH_CODES[t.dtype] = dtypes.code_of(t.dtype)
        except UnsupportedDtype:
            return None
    size = dtypes.ITEMSIZE[code]
    return code, tuple(t.shape), tuple(s * size for s in t.stride())


def check_grad(t):
    """Refuse a tensor that autograd tracks from elsewhere, as torch does."""
    if t.requires_grad and not t.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not "
            "support crossing process boundaries. If you just want to transfer the data, call detach() "
            "on the tensor before serializing (e.g., putting it on the queue)."
        )


def export_tensor(t, block=True, timeout=None, copy=True):
    """An Export for a torch tensor, as export_array does for arrays."""
    found = _torch_layout(t)
    if found is None:
        return None
    code, shape, strides = found

    def fill(owner, size, c_strides):
        storage = memory.ndarray(owner, size, dtypes.storage_dtype(code), shape, c_strides)
        memory.tensor(storage, code).copy_(t.detach())

    address = t.data_ptr() if 0 not in shape else None
    return _export(address, code, shape, strides, memory.TORCH, fill, block, timeout, copy)


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
    if not obj.requires_grad:  # a plain torch.Tensor: BARE holds no other type
        return export_tensor(obj, block, timeout)
    return None


def export_shared_tensor(st):
    """An Export for a SharedTensor: its own segment, by descriptor."""
    owner = st._live()
    found = find(int(native.ffi().cast("uintptr_t", owner)), st.nbytes)
    if found is None:
        raise RuntimeError(f"{st!r} is not mapped in this process")
    return Export(found[0], found[1], st._code, st.shape, st.strides, memory.SHARED_TENSOR)


def build(view):
    """The object a received zct_view stands for; it holds the view's ref."""
    lib = native.lib()
    if view.flags & memory.TYPE_MASK == memory.SHARED_TENSOR and view.kind == lib.ZCT_REF_SEGMENT:
        ffi = native.ffi()
        handle = ffi.new("zct_handle *")
        info = ffi.new("zct_info *")
        native.check(lib.zct_ref_segment(view.ref, handle, info))
        return SharedTensor._wrap(handle[0], info)
    return memory.from_view(view)


def encode(export):
    """Descriptor bytes for an Export; its count travels in them (it is
    released when they cannot be made)."""
    ffi, lib = native.ffi(), native.lib()
    view = ffi.new("zct_view *")
    export.fill(view)
    buf = ffi.new("char[]", 1024)
    size = ffi.new("uint64_t *")
    try:
        native.check(lib.zct_ref_encode(view, buf, 1024, size))
    except BaseException:
        export.release()
        raise
    return ffi.buffer(buf, size[0])[:]


def decode(data, requires_grad=False):
    """The object descriptor bytes (made by encode) stand for, taking over
    the count they carried."""
    ffi, lib = native.ffi(), native.lib()
    view = ffi.new("zct_view *")
    native.check(lib.zct_ref_decode(data, len(data), view))
    obj = build(view)
    if requires_grad:
        obj.requires_grad_()
    return obj
