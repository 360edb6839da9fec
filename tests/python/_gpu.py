"""Producers and consumers of CUDA tensors for the GPU tests, each run in a
process of its own."""

import os
import sys
import time

import torch

import zctipc


def produce(q, back, layouts):
    """Make tensors with CUDA kernels and send them, with what they hold."""
    for dtype, device, how in layouts:
        base = torch.arange(4096, device=device, dtype=torch.float32).mul_(3).add_(1).to(getattr(torch, dtype))
        t = {"contiguous": base, "offset": base[17:], "strided": base.view(64, 64).t()}[how]
        q.put((dtype, device, how, t))
        q.put(t.cpu())
    back.get(timeout=120)  # the consumer has checked everything


def receive_same_tensor(q, n, out):
    got = 0
    for _ in range(n):
        t = q.get()
        got += int(t[0].item() == 7)
        del t
    out.put((got, zctipc.cuda.ipc_opens()))


def hold_and_wait(q, out):
    t = q.get()
    torch.cuda.synchronize()
    out.put(float(t.sum().item()))
    time.sleep(3600)


def send_and_exit(q, done):
    t = torch.full((1024,), 2.0, device="cuda:0")
    q.put(t)
    done.get(timeout=120)  # the receiver holds it
    sys.stderr.flush()


def add_to_vmm(q, out):
    ct = q.get()
    t = ct.torch()
    out.put(float(t.sum().item()))
    t.add_(1)
    torch.cuda.synchronize()
    out.put("written")
    os._exit(0)


# -- with the stand-in driver (tests/cuda/mockcuda.c), whose device memory is
# host memory: ctypes reads and writes it.


def vmm_child(q, back):
    import ctypes

    ct = q.get(timeout=60)
    arr = (ctypes.c_int32 * 1000).from_address(ct.data_ptr)
    back.put((sum(arr), ct.shape, str(ct.dtype), ct.device))
    arr[0] = -1
    del arr, ct


def ipc_child(q, back, n):
    import ctypes

    from zctipc._core import native as _native

    data = q.get(timeout=60)
    ffi, lib = _native.ffi(), _native.lib()
    ipc = ffi.new("zct_cuda_ipc *")
    ffi.memmove(ipc, data, len(data))
    ptr = ffi.new("uint64_t *")
    for _ in range(n):
        _native.check(lib.zct_cuda_ipc_open(ipc, 0, ptr))
        _native.check(lib.zct_cuda_ipc_close(ipc))
    back.put((zctipc.cuda.ipc_opens(), ctypes.c_int32.from_address(ptr[0]).value))


# torch has no CUDA with the stand-in driver: its current stream, the views
# over device memory and stream synchronization are stood in for, and
# FakeCudaTensor carries what zctipc reads of a torch CUDA tensor.


def stand_in_torch_cuda():
    import ctypes
    import types

    from zctipc._core import device

    torch.cuda.current_stream = lambda index=None: types.SimpleNamespace(cuda_stream=0)

    def view(memory, dtype, shape, strides=None, storage_offset=0):
        import numpy as np

        host = (ctypes.c_char * memory.nbytes).from_address(memory.ptr)
        host.memory = memory  # the storage holds the device memory, as torch's over CUDA memory does
        raw = torch.from_numpy(np.frombuffer(host, dtype=np.uint8))
        typed = raw.view(dtype)
        if strides is None:
            t = typed[: int(torch.Size(shape).numel())].view(shape)
        else:
            t = typed.as_strided(shape, strides, storage_offset)
        return t

    device.torch_view = view
    device.synchronize = lambda index: None


class FakeStorage:
    def __init__(self, ptr, nbytes):
        self.ptr, self.size, self._cdata = ptr, nbytes, ptr

    def data_ptr(self):
        return self.ptr

    def nbytes(self):
        return self.size


class FakeCudaTensor:
    """An int32 CUDA tensor of n values at ptr, as zctipc's codec sees one."""

    def __init__(self, ptr, n):
        import types

        self.storage = FakeStorage(ptr, 4 * n)
        self.device = types.SimpleNamespace(index=0, type="cuda")
        self.dtype, self.shape, self.requires_grad, self.is_cuda = torch.int32, (n,), False, True

    def untyped_storage(self):
        return self.storage

    def stride(self):
        return (1,)

    def storage_offset(self):
        return 0

    def detach(self):
        return self

    def cpu(self):
        import ctypes

        host = (ctypes.c_char * self.storage.size).from_address(self.storage.ptr)
        return torch.frombuffer(host, dtype=torch.int32).clone()


def send_fake_cuda_tensors():
    """Make the zctipc pickler of this thread send FakeCudaTensor as it sends
    torch CUDA tensors."""
    from zctipc._wire import gpu, pickler, reductions

    pk = pickler.pickler()
    pk.pickler.dispatch_table[FakeCudaTensor] = lambda t: gpu.reduce_cuda(t, None, lambda e: reductions.carry(pk, e))


def vmm_tensor_child(q, back, n):
    """Receive n tensors by file descriptor; report the imports and a value."""
    stand_in_torch_cuda()
    from zctipc._core import native as _native

    first = None
    for _ in range(n):
        t = q.get(timeout=60)
        first = int(t[5]) if first is None else first
        del t
    count = _native.ffi().new("int64_t *")
    _native.check(_native.lib().zct_cuda_vmm_imports(count))
    back.put((count[0], first))
    assert q.get(timeout=60) == "done"


def state_dict_child(q, back):
    """Attach a SharedStateDict, report its sums, then again after the
    producer's in-place update, and whether a second receipt maps anew."""
    stand_in_torch_cuda()
    tensors = zctipc.cuda.attach_state_dict(q.get(timeout=60))  # the SharedStateDict itself is dropped
    back.put({k: float(v.double().sum()) for k, v in tensors.items()})
    assert q.get(timeout=60) == "updated"
    back.put({k: float(v.double().sum()) for k, v in tensors.items()})
    again = zctipc.cuda.attach_state_dict(q.get(timeout=60))
    back.put(all(again[k].data_ptr() == tensors[k].data_ptr() for k in tensors))


# -- on a GPU, with zctipc's shareable allocator -----------------------------


def receive_vmm_tensors(q, back, n):
    """Receive n tensors the producer allocated with zctipc's allocator;
    report the mappings made, legacy opens, and a checksum of the last."""
    from zctipc._core import native as _native

    total = None
    for _ in range(n):
        t = q.get(timeout=120)
        total = float(t.double().sum().item())
        del t
    count = _native.ffi().new("int64_t *")
    _native.check(_native.lib().zct_cuda_vmm_imports(count))
    back.put((count[0], zctipc.cuda.ipc_opens(), total))


def attach_state_dict_and_report(q, back):
    """Attach a SharedStateDict on the GPU; report sums before and after the
    producer's update."""
    tensors = zctipc.cuda.attach_state_dict(q.get(timeout=120))
    torch.cuda.synchronize()
    back.put({k: float(v.double().sum().item()) for k, v in tensors.items()})
    assert q.get(timeout=120) == "updated"
    back.put({k: float(v.double().sum().item()) for k, v in tensors.items()})


def send_fake_and_wait(q, ready):
    """Allocate a block of the shareable allocator, send it, and wait to be
    killed."""
    import ctypes

    from zctipc._core import native as _native

    stand_in_torch_cuda()
    ffi, lib = _native.ffi(), _native.lib()
    ptr = ffi.new("uint64_t *")
    _native.check(lib.zct_cuda_cache_alloc(0, 4096, 0, ptr))
    (ctypes.c_int32 * 1024).from_address(ptr[0])[7] = 777
    send_fake_cuda_tensors()
    q.put(FakeCudaTensor(ptr[0], 1024))
    ready.put("sent")
    time.sleep(600)


def stopped_producer(q, ready):
    """Send memory shared by name, then wait to be stopped and killed."""
    ct = zctipc.cuda.empty((1000,), "int32")
    q.put(ct)
    ready.put(os.getpid())
    time.sleep(600)
