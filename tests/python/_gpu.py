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
