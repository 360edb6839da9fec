"""CUDA tensors between processes. Without a GPU, the library still loads,
zctipc.cuda says why CUDA is unavailable, GPU calls raise CudaUnavailable,
and the GPU tests are skipped with that reason."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import _gpu
import pytest
import torch

import zctipc
from zctipc import cuda
from zctipc._wire import gpu as cuda_codec

HERE = os.path.dirname(os.path.abspath(__file__))
MOCK_SOURCE = os.path.join(HERE, "..", "cuda", "mockcuda.c")
REASON = cuda.unavailable_reason() or (None if torch.cuda.is_available() else "torch sees no CUDA device")
gpu = pytest.mark.skipif(REASON is not None, reason=f"no GPU: {REASON}")


def test_availability_is_reported_and_gpu_calls_fail_clearly():
    available = cuda.is_available()
    assert available == (cuda.unavailable_reason() is None)
    assert (cuda.device_count() > 0) == available
    assert cuda.ipc_opens() >= 0
    if available:
        t = cuda.empty((4, 4), "float32")
        assert t.shape == (4, 4) and t.nbytes == 64
        return
    with pytest.raises(zctipc.CudaUnavailable, match="CUDA is unavailable") as err:
        cuda.empty((4, 4), "float32")
    assert isinstance(err.value, RuntimeError)
    assert "libcuda" in str(err.value) or "device" in str(err.value)
    print(f"CUDA unavailable here: {err.value}")


def test_bad_input_is_refused_before_any_gpu_call():
    with pytest.raises(zctipc.InvalidArgument, match="device"):
        cuda.empty(4, device=-1)
    with pytest.raises(zctipc.UnsupportedDtype):
        cuda.empty(4, dtype=object)
    with pytest.raises(zctipc.InvalidArgument, match="CUDA descriptor of 3 bytes"):
        cuda_codec.rebuild_tensor(b"abc", b"", "float32", (1,), (1,), 0, 4)


def test_the_library_loads_and_cpu_work_goes_on_without_cuda():
    code = textwrap.dedent("""
        import numpy as np, zctipc
        q = zctipc.Queue()
        q.put(np.arange(5))
        print(q.get().sum(), zctipc.cuda.is_available() in (True, False))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["10", "True"]


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int64"])
def test_a_kernels_output_is_read_after_the_event_wait(dtype):
    ctx = zctipc.get_context("spawn")
    q, back = zctipc.Queue(), zctipc.Queue()
    last = f"cuda:{torch.cuda.device_count() - 1}"
    layouts = [(dtype, "cuda:0", how) for how in ("contiguous", "offset", "strided")] + [(dtype, last, "contiguous")]
    p = ctx.Process(target=_gpu.produce, args=(q, back, layouts))
    p.start()
    for _ in layouts:
        got_dtype, device, how, t = q.get(timeout=120)
        expected = q.get(timeout=120)
        assert t.device == torch.device(device) and str(t.dtype) == f"torch.{got_dtype}"
        assert t.shape == expected.shape and t.stride() == expected.stride(), how
        assert torch.equal(t.cpu(), expected), f"{dtype} {how} on {device}"
        print(f"{dtype} {how} on {device}: read correctly")
    back.put("done")
    p.join(120)
    assert p.exitcode == 0


@gpu
def test_ten_thousand_sends_of_one_tensor_open_it_once():
    ctx = zctipc.get_context("spawn")
    q, out = zctipc.Queue(), zctipc.Queue()
    p = ctx.Process(target=_gpu.receive_same_tensor, args=(q, 10000, out))
    p.start()
    t = torch.full((1 << 20,), 7.0, device="cuda:0")
    for _ in range(10000):
        q.put(t)
    got, opens = out.get(timeout=600)
    p.join(60)
    assert got == 10000
    assert opens == 1, f"the allocation was opened {opens} times"
    print(f"10,000 sends, {opens} cuIpcOpenMemHandle")


@gpu
def test_a_killed_consumer_leaves_the_producer_running_and_its_memory_freed():
    ctx = zctipc.get_context("spawn")
    q, out = zctipc.Queue(), zctipc.Queue()
    p = ctx.Process(target=_gpu.hold_and_wait, args=(q, out))
    p.start()
    t = torch.ones(1 << 20, device="cuda:0")
    q.put(t)
    assert out.get(timeout=120) == float(1 << 20)
    assert len(cuda_codec._sent) == 1, "the producer keeps what a consumer holds"
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    deadline = time.monotonic() + 15
    while cuda_codec._sent and time.monotonic() < deadline:
        cuda_codec._sweep()
        time.sleep(0.1)
    assert not cuda_codec._sent, "the producer let go once the dead consumer's count was given up"
    assert t.sum().item() == float(1 << 20), "and survived"


@gpu
def test_a_producer_that_exits_early_warns_and_does_not_crash():
    q, done = zctipc.Queue(), zctipc.Queue()
    code = textwrap.dedent(f"""
        import sys, zctipc, torch
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import _gpu, pickle
        q, done = pickle.loads(bytes.fromhex(sys.argv[1])), pickle.loads(bytes.fromhex(sys.argv[2]))
        _gpu.send_and_exit(q, done)
    """)
    from _crash import queue_arg

    p = subprocess.Popen([sys.executable, "-c", code, queue_arg(q), queue_arg(done)], stderr=subprocess.PIPE, text=True)
    t = q.get(timeout=120)
    assert t.sum().item() == 2048.0
    done.put("holding")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0
    assert "still in use by other processes" in err
    del t


@gpu
def test_vmm_memory_is_shared_by_name():
    ctx = zctipc.get_context("spawn")
    ct = cuda.empty((1024,), "float32", device=0)
    ct.torch().fill_(3.0)
    torch.cuda.synchronize()
    q, out = zctipc.Queue(), zctipc.Queue()
    p = ctx.Process(target=_gpu.add_to_vmm, args=(q, out))
    p.start()
    q.put(ct)
    assert out.get(timeout=120) == 3072.0
    assert out.get(timeout=120) == "written"
    p.join(60)
    assert ct.torch().sum().item() == 4096.0, "the consumer wrote into the producer's memory"
    assert ct.__dlpack_device__() == (2, 0)
    assert torch.from_dlpack(ct).data_ptr() == ct.data_ptr


@gpu
def test_dlpack_consumers():
    ct = cuda.empty((8,), "float32")
    ct.torch().fill_(1.5)
    torch.cuda.synchronize()
    consumers = 0
    try:
        import cupy

        assert float(cupy.from_dlpack(ct).sum()) == 12.0
        consumers += 1
    except ImportError:
        pass
    try:
        import jax.dlpack

        assert float(jax.dlpack.from_dlpack(ct).sum()) == 12.0
        consumers += 1
    except ImportError:
        pass
    assert float(torch.from_dlpack(ct).sum()) == 12.0
    print(f"DLPack consumers besides torch: {consumers}")


# -- the stand-in driver ------------------------------------------------------
# tests/cuda/mockcuda.c answers the driver calls zctipc makes with host
# memory in memfds, so that the whole CUDA path (driver loading, VMM sharing
# by file descriptor, legacy handles opened once) runs where there is no GPU.


@pytest.fixture(scope="module")
def mock_env(tmp_path_factory):
    path = tmp_path_factory.mktemp("mockcuda") / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(path), MOCK_SOURCE], check=True)
    return dict(os.environ, ZCTIPC_CUDA_LIBRARY=str(path), PYTHONPATH=HERE)


def run_with(env, code):
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")


def test_vmm_memory_travels_by_name_with_the_stand_in_driver(mock_env):
    lines = run_with(
        mock_env,
        """
        import ctypes, zctipc, _gpu
        assert zctipc.cuda.is_available() and zctipc.cuda.device_count() == 1
        ct = zctipc.cuda.empty((1000,), "int32")
        assert ct.__dlpack_device__() == (2, 0)
        assert ct.__cuda_array_interface__["typestr"] == "<i4"
        arr = (ctypes.c_int32 * 1000).from_address(ct.data_ptr)
        for i in range(1000):
            arr[i] = i
        q, back = zctipc.Queue(), zctipc.Queue()
        p = zctipc.get_context("spawn").Process(target=_gpu.vmm_child, args=(q, back))
        p.start()
        q.put(ct)
        print(back.get(timeout=60))
        p.join(60)
        print(p.exitcode, arr[0])
    """,
    )
    assert lines[0] == "(499500, (1000,), 'int32', 0)", "the child mapped the same memory"
    assert lines[1] == "0 -1", "and wrote into it"


def test_an_allocation_sent_ten_thousand_times_is_opened_once_with_the_stand_in_driver(mock_env):
    lines = run_with(
        mock_env,
        """
        import ctypes, zctipc, _gpu
        from zctipc._core import native as _native
        ffi, lib = _native.ffi(), _native.lib()
        ct = zctipc.cuda.empty((1000,), "int32")
        (ctypes.c_int32 * 1000).from_address(ct.data_ptr)[16] = 1234
        ipc, export = ffi.new("zct_cuda_ipc *"), ffi.new("zct_handle *")
        _native.check(lib.zct_cuda_ipc_export(0, ct.data_ptr + 64, 0, ipc, export))
        assert ipc.offset == 64 and ipc.size == 64 << 10
        q, back = zctipc.Queue(), zctipc.Queue()
        p = zctipc.get_context("spawn").Process(target=_gpu.ipc_child, args=(q, back, 10000))
        p.start()
        q.put(bytes(ffi.buffer(ipc)))
        print(back.get(timeout=120))
        p.join(60)
        _native.check(lib.zct_cuda_ipc_release(export[0]))
        print(zctipc.cuda.ipc_opens())
    """,
    )
    assert lines[0] == "(1, 1234)", "opened once in 10,000 receipts, at the right offset"
    assert lines[1] == "0", "the producer never opens its own allocation"


def test_a_received_legacy_handle_becomes_a_view_of_the_senders_memory_with_the_stand_in_driver(mock_env):
    # torch has no CUDA here: its current stream and the final tensor view
    # are stood in for; the rest of rebuild_tensor (the counter, the
    # handle opened, the memory object the view holds) runs as on a GPU.
    lines = run_with(
        mock_env,
        """
        import ctypes, types, torch, zctipc
        from zctipc._core import device, native as _native, pool
        from zctipc._wire import gpu
        ffi, lib = _native.ffi(), _native.lib()
        ct = zctipc.cuda.empty((16,), "int32")
        (ctypes.c_int32 * 16).from_address(ct.data_ptr)[3] = 77
        ipc, export = ffi.new("zct_cuda_ipc *"), ffi.new("zct_handle *")
        _native.check(lib.zct_cuda_ipc_export(0, ct.data_ptr, 0, ipc, export))
        ref, address = pool.alloc(8)
        sent = gpu._Sent(None, export[0], bytes(ffi.buffer(ipc)), ref, address)
        counter = gpu._counter_descriptor(sent)
        torch.cuda.current_stream = lambda index: types.SimpleNamespace(cuda_stream=0)
        device.torch_view = lambda memory, *layout: (memory, layout)
        memory, layout = gpu.rebuild_tensor(sent.ipc, counter, "int32", (16,), (1,), 0, 64)
        print(memory.device, memory.nbytes, ctypes.c_int32.from_address(memory.ptr + 12).value, layout)
        del memory
        _native.check(lib.zct_ref_release(ref))
        _native.check(lib.zct_cuda_ipc_release(export[0]))
    """,
    )
    assert lines[0] == "0 64 77 (torch.int32, (16,), (1,), 0)"


def test_out_of_gpu_memory_is_an_error_naming_what_is_free_with_the_stand_in_driver(mock_env):
    lines = run_with(
        dict(mock_env, ZCTIPC_MOCK_CUDA_MEMORY=str(1 << 20)),
        """
        import zctipc
        def attempt(nbytes):
            try:
                return zctipc.cuda.empty(nbytes, "uint8")
            except zctipc.CudaOutOfMemory as e:
                print(isinstance(e, MemoryError), isinstance(e, zctipc.CudaError), e)
        attempt(2 << 20)
        half = attempt(512 << 10)
        attempt(1 << 20)
        del half
        print(attempt(1 << 20).shape)
    """,
    )
    assert lines[0].startswith("True True CUDA device 0 is out of memory: 2097152 bytes asked, 1048576 of 1048576 free")
    assert "cuMemCreate: CUDA error 2" in lines[0]
    assert lines[1].startswith("True True CUDA device 0 is out of memory: 1048576 bytes asked, 524288 of 1048576 free")
    assert lines[2] == "(1048576,)", "freed memory is there again"


def test_cuda_errors_from_the_driver_are_clear_with_the_stand_in_driver(mock_env):
    lines = run_with(
        mock_env,
        """
        import zctipc
        from zctipc._core import native as _native
        ffi, lib = _native.ffi(), _native.lib()
        try:
            zctipc.cuda.empty(4, device=3)
        except zctipc.CudaUnavailable as e:
            print("device:", e)
        ipc, export = ffi.new("zct_cuda_ipc *"), ffi.new("zct_handle *")
        try:
            _native.check(lib.zct_cuda_ipc_export(0, 0x1000, 0, ipc, export))
        except zctipc.CudaError as e:
            print("pointer:", e)
    """,
    )
    assert lines[0] == "device: CUDA device 3: there are 1: CUDA is unavailable"
    assert lines[1].startswith("pointer: 0x1000 is not device memory of device 0: cuMemGetAddressRange: CUDA error 1")
