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
from conftest import with_pythonpath

import zctipc
from zctipc import cuda
from zctipc._wire import gpu as cuda_codec

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
MOCK_SOURCE = os.path.join(HERE, "..", "cuda", "mockcuda.c")
REASON = cuda.unavailable_reason() or (None if torch.cuda.is_available() else "torch sees no CUDA device")


def gpu(test):
    """A test that needs a GPU: marked gpu, and skipped with the reason
    where there is none."""
    return pytest.mark.gpu(pytest.mark.skipif(REASON is not None, reason=f"no GPU: {REASON}")(test))


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
        cuda_codec.rebuild_tensor("ipc", b"abc", b"", "float32", (1,), (1,), 0, 4)


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
    before = set(cuda_codec._sent)  # earlier tests' sends, kept until a sweep
    q.put(t)
    assert out.get(timeout=120) == float(1 << 20)
    mine = set(cuda_codec._sent) - before
    assert len(mine) == 1, "the producer keeps what a consumer holds"
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    deadline = time.monotonic() + 15
    while mine & set(cuda_codec._sent) and time.monotonic() < deadline:
        cuda_codec._sweep()
        time.sleep(0.1)
    assert not mine & set(cuda_codec._sent), "the producer let go once the dead consumer's count was given up"
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
    return dict(os.environ, ZCTIPC_CUDA_LIBRARY=str(path), PYTHONPATH=with_pythonpath(HERE))


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
        from zctipc._wire import exports, gpu
        ffi, lib = _native.ffi(), _native.lib()
        ct = zctipc.cuda.empty((16,), "int32")
        (ctypes.c_int32 * 16).from_address(ct.data_ptr)[3] = 77
        ipc, export = ffi.new("zct_cuda_ipc *"), ffi.new("zct_handle *")
        _native.check(lib.zct_cuda_ipc_export(0, ct.data_ptr, 0, ipc, export))
        ref, address = pool.alloc(8)
        sent = gpu._Sent(None, export[0], bytes(ffi.buffer(ipc)), ref, address)
        counter = exports.encode(gpu._counter(sent))
        torch.cuda.current_stream = lambda index: types.SimpleNamespace(cuda_stream=0)
        device.torch_view = lambda memory, *layout: (memory, layout)
        memory, layout = gpu.rebuild_tensor("ipc", sent.desc, counter, "int32", (16,), (1,), 0, 64)
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


def test_the_shareable_allocator_caches_blocks_and_torch_can_load_it_with_the_stand_in_driver(mock_env):
    lines = run_with(
        mock_env,
        """
        import torch, zctipc
        from zctipc._core import native as _native
        ffi, lib = _native.ffi(), _native.lib()
        a = lib.zct_torch_alloc(1000, 0, ffi.NULL)
        b = lib.zct_torch_alloc(5 << 20, 0, ffi.NULL)
        lib.zct_torch_free(a, 1000, 0, ffi.NULL)
        lib.zct_torch_free(b, 5 << 20, 0, ffi.NULL)
        for _ in range(1000):
            a2 = lib.zct_torch_alloc(1000, 0, ffi.NULL)
            b2 = lib.zct_torch_alloc(5 << 20, 0, ffi.NULL)
            lib.zct_torch_free(a2, 1000, 0, ffi.NULL)
            lib.zct_torch_free(b2, 5 << 20, 0, ffi.NULL)
        print(a2 == a, b2 == b, lib.zct_torch_alloc(0, 0, ffi.NULL) == ffi.NULL)
        stats = zctipc.cuda.allocator_stats()
        print(stats["creates"], stats["hits"], stats["blocks"], stats["in_use"])
        print(zctipc.cuda.empty_cache(), zctipc.cuda.allocator_stats()["segments"])
        import ctypes, os
        print("device syncs", ctypes.CDLL(os.environ["ZCTIPC_CUDA_LIBRARY"]).mock_syncs())
        try:
            _native.check(lib.zct_cuda_cache_alloc(0, 100 << 30, 0, ffi.new("uint64_t *")))
        except zctipc.CudaOutOfMemory as e:
            print("oom:", e)
        path = _native.library_path()
        allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "zct_torch_alloc", "zct_torch_free")
        print(type(allocator).__name__)
    """,
    )
    assert lines[0] == "True True True", "a freed block is handed out again; 0 bytes is NULL"
    assert lines[1] == "2 2000 0 0", "two driver allocations for 2002 requests"
    assert lines[2] == "2 0", "both given back"
    assert lines[3] == "device syncs 1", "after waiting once for the device's queued work"
    assert lines[4].startswith("oom: CUDA device 0 is out of memory: 107374182400 bytes asked")
    assert lines[5] == "CUDAPluggableAllocator", "torch finds the two functions in the loaded library"


CXX_CALLER = r"""
#include <dlfcn.h>
#include <cstdio>
#include <exception>
// Calls zct_torch_alloc as torch's pluggable allocator does, from C++.
int main(int argc, char **argv) {
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) { std::printf("dlopen: %s\n", dlerror()); return 1; }
    auto alloc = (void *(*)(size_t, int, void *))dlsym(lib, "zct_torch_alloc");
    auto release = (void (*)(void *, size_t, int, void *))dlsym(lib, "zct_torch_free");
    void *p = alloc(1000, 0, nullptr);
    std::printf("allocated %d\n", p != nullptr);
    release(p, 1000, 0, nullptr);
    try {
        alloc(size_t(100) << 30, 0, nullptr);
        std::printf("no exception\n");
    } catch (const std::exception &e) {
        std::printf("caught: %s\n", e.what());
    }
    return 0;
}
"""


def test_torchs_allocate_function_fails_with_a_cpp_exception_with_the_stand_in_driver(mock_env, tmp_path):
    # torch ignores what its allocate function returns, so a failure is
    # thrown as std::runtime_error, which torch turns into a RuntimeError.
    source, program = tmp_path / "caller.cc", tmp_path / "caller"
    source.write_text(CXX_CALLER)
    subprocess.run(["g++", "-O1", "-o", str(program), str(source), "-ldl"], check=True)
    from zctipc._core import native

    out = subprocess.run(
        [str(program), native.library_path()], env=mock_env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == "allocated 1"
    assert lines[1].startswith("caught: CUDA device 0 is out of memory: 107374182400 bytes asked"), lines[1]


def test_tensors_of_the_shareable_allocator_go_by_file_descriptor_and_map_once_with_the_stand_in_driver(mock_env):
    lines = run_with(
        mock_env,
        """
        import ctypes, time, zctipc, _gpu
        from zctipc._core import native as _native
        from zctipc._wire import gpu
        _gpu.stand_in_torch_cuda()
        ffi, lib = _native.ffi(), _native.lib()
        ptr = ffi.new("uint64_t *")
        _native.check(lib.zct_cuda_cache_alloc(0, 4096, 0, ptr))
        _native.check(lib.zct_cuda_cache_alloc(0, 4096, 0, ptr))  # the second block of its slab
        values = (ctypes.c_int32 * 1024).from_address(ptr[0])
        values[5] = 4321
        t = _gpu.FakeCudaTensor(ptr[0], 1024)
        q, back = zctipc.Queue(), zctipc.Queue()
        p = zctipc.get_context("spawn").Process(target=_gpu.vmm_tensor_child, args=(q, back, 1000))
        p.start()
        _gpu.send_fake_cuda_tensors()
        for _ in range(1000):
            q.put(t)
        print(back.get(timeout=120))
        (record,) = gpu._sent.values()
        print(record.vmm, zctipc.cuda.ipc_opens())
        deadline = time.monotonic() + 30
        while gpu._holders(record.counter) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        print(gpu._holders(record.counter))
        q.put("done")
        p.join(60)
        print(p.exitcode)
    """,
    )
    assert lines[0] == "(1, 4321)", "1000 receipts, one mapping, the producer's bytes at the block's place"
    assert lines[1] == "True 0", "by file descriptor, no legacy handle"
    assert lines[2] == "1", "the receiver's counts went back as its tensors were dropped"
    assert lines[3] == "0"


def test_a_put_whose_cuda_tensor_cannot_be_exported_sends_nothing_with_the_stand_in_driver(mock_env):
    lines = run_with(
        mock_env,
        """
        import ctypes, queue, numpy as np, zctipc, _gpu
        from zctipc._core import native as _native
        from zctipc._wire import gpu
        _gpu.stand_in_torch_cuda()
        ffi, lib = _native.ffi(), _native.lib()
        ptr = ffi.new("uint64_t *")
        _native.check(lib.zct_cuda_cache_alloc(0, 4096, 0, ptr))
        good = _gpu.FakeCudaTensor(ptr[0], 1024)
        host = (ctypes.c_int32 * 1024)()
        host[0] = 99
        bad = _gpu.FakeCudaTensor(ctypes.addressof(host), 1024)  # not device memory: the driver refuses it
        big = np.arange(1 << 20)
        q = zctipc.Queue()
        _gpu.send_fake_cuda_tensors()
        try:
            q.put((big, good, bad))
        except zctipc.CudaError as e:
            print("refused:", type(e).__name__, "not device memory" in str(e))
        (record,) = gpu._sent.values()
        print(gpu._holders(record.counter), q.qsize(), zctipc.buffers.pool_stats().slots_in_use)
        try:
            q.get_nowait()
        except queue.Empty:
            print("nothing was sent")
        zctipc.cuda.set_host_fallback(True)
        rebuild, args = gpu.reduce_cuda(bad, None)
        print(rebuild.__name__, args[0][0].item(), args[1])
    """,
    )
    assert lines[0] == "refused: CudaError True"
    # The good tensor's count and the array's copy were given back; the slot
    # left is the producer's record.
    assert lines[1] == "1 0 1"
    assert lines[2] == "nothing was sent"
    assert lines[3] == "_rebuild_from_host 99 0", "with the host fallback it goes as a CPU tensor, back to cuda:0"


def test_a_state_dict_is_packed_sent_once_and_updated_in_place_with_the_stand_in_driver(mock_env):
    lines = run_with(
        mock_env,
        """
        import torch, zctipc, _gpu
        _gpu.stand_in_torch_cuda()
        dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool, torch.float64]
        sd = {}
        for i in range(300):
            dt = dtypes[i % len(dtypes)]
            shape = (i % 7 + 1, i % 5 + 3)
            sd[f"layer{i}.weight"] = (torch.arange(shape[0] * shape[1]).reshape(shape) % 5 + i % 3).to(dt)
        sd["strided"] = torch.arange(64.0).reshape(8, 8).t()
        shared = zctipc.cuda.share_state_dict(sd, device=0)
        print(len(shared), shared.allocations)
        views = shared.tensors
        print(all(torch.equal(views[k], v) for k, v in sd.items()), all(v.is_contiguous() for v in views.values()))
        print(all(v.data_ptr() % 256 == 0 for v in views.values()))
        q, back = zctipc.Queue(), zctipc.Queue()
        p = zctipc.get_context("spawn").Process(target=_gpu.state_dict_child, args=(q, back))
        p.start()
        q.put(shared)
        sums = back.get(timeout=120)
        print(sums == {k: float(v.double().sum()) for k, v in sd.items()})
        new = {k: v + 1 if v.dtype != torch.bool else ~v for k, v in sd.items()}
        shared.update(new)
        q.put("updated")
        print(back.get(timeout=120) == {k: float(v.double().sum()) for k, v in new.items()})
        q.put(shared)
        print(back.get(timeout=120))
        p.join(60)
        for bad in ({"layer0.weight": torch.zeros(3)}, {"nope": torch.zeros(1)}):
            try:
                shared.update(bad)
            except zctipc.InvalidArgument as e:
                print("refused:", e)
        for bad in ({"a": 1}, {"a": torch.zeros(2).to_sparse()}, [1]):
            try:
                zctipc.cuda.share_state_dict(bad, device=0)
            except zctipc.InvalidArgument as e:
                print("refused:", e)
        print(p.exitcode)
    """,
    )
    assert lines[0] == "301 1", "301 tensors of 7 dtypes in one allocation"
    assert lines[1] == "True True", "packed values equal, every view contiguous"
    assert lines[2] == "True", "every tensor 256-byte aligned"
    assert lines[3] == "True", "the receiver's views hold the producer's values"
    assert lines[4] == "True", "and see the update in place"
    assert lines[5] == "True", "a second receipt maps nothing new"
    assert lines[6].startswith("refused: 'layer0.weight' is (3,) torch.float32, and the shared one (1, 3)")
    assert lines[7] == "refused: 'nope' is not a tensor of this SharedStateDict"
    assert lines[8] == "refused: 'a' is a int, not a tensor"
    assert lines[9].startswith("refused: 'a' is a torch.sparse_coo tensor")
    assert lines[10] == "refused: share_state_dict takes a mapping of names to tensors, not list"
    assert lines[11] == "0"


def test_installing_the_shareable_allocator_with_the_stand_in_driver(mock_env):
    code = """
        import torch, zctipc
        try:
            zctipc.cuda.use_shareable_allocator()
        except zctipc.CudaError as e:
            print("refused:", e)
        zctipc.cuda.use_shareable_allocator()  # again: nothing more happens, or it fails the same way
        print(zctipc.cuda._allocator_installed, zctipc.cuda.allocator_stats()["creates"])
        try:
            zctipc.cuda.empty(4)
            print("allocated")
        except zctipc.CudaError as e:
            print("refused:", e)
    """
    lines = run_with(mock_env, code)
    assert lines[0] == "True 0", "installed, after asking each device's attributes (no allocation, no context)"
    with pytest.raises(AssertionError, match="cannot make memory shareable by file descriptor"):
        run_with(dict(mock_env, ZCTIPC_MOCK_CUDA_NO_FD_HANDLES="1"), code)
    once = code.replace("zctipc.cuda.use_shareable_allocator()  # again", "pass  #")
    lines = run_with(dict(mock_env, ZCTIPC_MOCK_CUDA_NO_FD_HANDLES="1"), once)
    assert lines[0].startswith("refused: CUDA device 0 cannot make memory shareable by file descriptor: it has no")
    assert lines[1] == "False 0", "a device that cannot share leaves torch's allocator as it was"
    assert lines[2].startswith("refused: CUDA device 0 cannot make memory shareable by file descriptor")
    assert "cuMemCreate: CUDA error 801" in lines[2], "the driver's own refusal, said plainly"


# -- on a GPU: the shareable allocator, whole models, DLPack 1.x --------------


def run_gpu_script(code):
    """Run code in a fresh process (the allocator goes in before CUDA is
    initialized); returns its output lines."""
    env = dict(os.environ, PYTHONPATH=with_pythonpath(HERE))
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")


@gpu
def test_torch_tensors_from_the_shareable_allocator_go_by_file_descriptor():
    lines = run_gpu_script(
        """
        import torch, zctipc, _gpu
        zctipc.cuda.use_shareable_allocator()
        t = torch.arange(1 << 20, device="cuda:0", dtype=torch.float32).mul_(2)  # a kernel's output
        q, back = zctipc.Queue(), zctipc.Queue()
        p = zctipc.get_context("spawn").Process(target=_gpu.receive_vmm_tensors, args=(q, back, 1000))
        p.start()
        for _ in range(1000):
            q.put(t)
        print(back.get(timeout=300))
        p.join(60)
        before = zctipc.cuda.allocator_stats()["creates"]
        for _ in range(100):
            x = torch.empty(3 << 20, device="cuda:0")
            y = torch.empty(1000, device="cuda:0")
            del x, y
        print(zctipc.cuda.allocator_stats()["creates"] - before)
        try:
            zctipc.cuda.use_shareable_allocator()
            print("again: nothing happens")
        except zctipc.InvalidArgument as e:
            print(e)
    """
    )
    expected = float(sum(range(1 << 20)) * 2)
    assert lines[0] == f"(1, 0, {expected})", "one mapping for 1000 receipts, no legacy handle, the kernel's values"
    assert int(lines[1]) <= 2, "steady-state allocation is served from the cache"
    assert lines[2] == "again: nothing happens"


@gpu
def test_a_vmm_tensor_outlives_its_killed_producer():
    q, ready = zctipc.Queue(), zctipc.Queue()
    code = textwrap.dedent("""
        import pickle, sys, time, torch, zctipc
        zctipc.cuda.use_shareable_allocator()
        q, ready = pickle.loads(bytes.fromhex(sys.argv[1])), pickle.loads(bytes.fromhex(sys.argv[2]))
        t = torch.full((1 << 20,), 3.0, device="cuda:0")
        q.put(t)
        ready.put("sent")
        time.sleep(600)
    """)
    from _crash import queue_arg

    p = subprocess.Popen([sys.executable, "-c", code, queue_arg(q), queue_arg(ready)])
    try:
        assert ready.get(timeout=120) == "sent"
        t = q.get(timeout=120)
        p.kill()
        p.wait(60)
        torch.cuda.synchronize()
        assert t.sum().item() == 3.0 * (1 << 20), "the mapping stays valid after the producer died"
        t.add_(1)
        assert t.sum().item() == 4.0 * (1 << 20)
    finally:
        p.kill()


@gpu
def test_a_state_dict_on_the_gpu_is_packed_sent_and_updated_in_place():
    sd = {}
    for i in range(300):
        dt = (torch.bfloat16, torch.float32, torch.float16, torch.int64)[i % 4]
        sd[f"layer{i}.weight"] = torch.full((i % 9 + 1, 17), float(i % 5), device="cuda:0").to(dt)
    shared = cuda.share_state_dict(sd)
    assert shared.allocations == 1
    ctx = zctipc.get_context("spawn")
    q, back = zctipc.Queue(), zctipc.Queue()
    p = ctx.Process(target=_gpu.attach_state_dict_and_report, args=(q, back))
    p.start()
    q.put(shared)
    assert back.get(timeout=120) == {k: float(v.double().sum().item()) for k, v in sd.items()}
    new = {k: v + 1 for k, v in sd.items()}
    shared.update(new)
    q.put("updated")
    assert back.get(timeout=120) == {k: float(v.double().sum().item()) for k, v in new.items()}
    p.join(60)
    assert p.exitcode == 0


@gpu
def test_cuda_memory_gives_versioned_dlpack_capsules():
    import ctypes

    ct = cuda.empty((8,), "float32")
    ct.torch().fill_(2.0)
    torch.cuda.synchronize()
    is_capsule = ctypes.pythonapi.PyCapsule_IsValid
    is_capsule.restype, is_capsule.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    assert is_capsule(ct.__dlpack__(max_version=(1, 0)), b"dltensor_versioned")
    assert is_capsule(ct.__dlpack__(), b"dltensor")
    assert float(torch.from_dlpack(ct).sum()) == 16.0


def test_a_tensor_sent_by_file_descriptor_outlives_its_killed_producer_with_the_stand_in_driver(mock_env):
    lines = run_with(
        mock_env,
        """
        import zctipc, _gpu
        _gpu.stand_in_torch_cuda()
        q, ready = zctipc.Queue(), zctipc.Queue()
        p = zctipc.get_context("spawn").Process(target=_gpu.send_fake_and_wait, args=(q, ready))
        p.start()
        assert ready.get(timeout=60) == "sent"
        t = q.get(timeout=60)
        p.kill()
        p.join(60)
        print(p.exitcode, int(t[7]))
        t[7] = 1
        print(int(t.sum()))
        del t
    """,
    )
    assert lines[0] == "-9 777", "the consumer's mapping holds the memory of a producer killed by SIGKILL"
    assert lines[1] == "1", "and it can still write it"


def test_memory_of_empty_goes_by_file_descriptor_without_the_allocator_with_the_stand_in_driver(mock_env):
    lines = run_with(
        mock_env,
        """
        import ctypes, zctipc, _gpu
        from zctipc._wire import gpu
        _gpu.stand_in_torch_cuda()
        ct = zctipc.cuda.empty((1024,), "int32")
        ctypes.c_int32.from_address(ct.data_ptr + 4 * 9).value = 99
        q = zctipc.Queue()
        _gpu.send_fake_cuda_tensors()
        q.put(_gpu.FakeCudaTensor(ct.data_ptr, 1024))
        t = q.get(timeout=60)
        (record,) = gpu._sent.values()
        installed, opens = zctipc.cuda._allocator_installed, zctipc.cuda.ipc_opens()
        print(installed, record.vmm, int(t[9]), t.data_ptr() == ct.data_ptr, opens)
    """,
    )
    assert lines[0] == "False True 99 True 0", "by name, without the allocator; this process's own memory as it is"


def test_a_producer_that_exits_with_a_tensor_in_flight_warns_with_the_stand_in_driver(mock_env):
    """The exit warning of a producer whose CUDA tensor a message still
    holds: the codec looks before this process lets go of its counts (it
    looked after, and saw nothing held)."""
    code = textwrap.dedent("""
        import zctipc, _gpu
        _gpu.stand_in_torch_cuda()
        ct = zctipc.cuda.empty((16,), "int32")
        _gpu.send_fake_cuda_tensors()
        q = zctipc.Queue()
        q.put(_gpu.FakeCudaTensor(ct.data_ptr, 16))
        print("sent")
    """)
    out = subprocess.run([sys.executable, "-c", code], env=mock_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["sent"], out.stderr
    assert "exits while 1 CUDA tensors it sent are still in use by other processes" in out.stderr, out.stderr
    assert "at exit" not in out.stderr.replace("exits while", ""), out.stderr


def test_a_consumer_of_a_stopped_producer_gets_an_error_naming_it_with_the_stand_in_driver(mock_env):
    lines = run_with(
        mock_env,
        """
        import errno, os, signal, time, zctipc, _gpu
        q, ready = zctipc.Queue(), zctipc.Queue()
        p = zctipc.get_context("spawn").Process(target=_gpu.stopped_producer, args=(q, ready))
        p.start()
        ready.get(timeout=60)
        os.kill(p.pid, signal.SIGSTOP)
        while open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
            time.sleep(0.01)
        try:
            q.get(timeout=60)
            print("received")
        except OSError as e:
            print(e.errno == errno.ETIMEDOUT, f"the process {p.pid} that shares it did not answer" in str(e))
        os.kill(p.pid, signal.SIGKILL)
        os.kill(p.pid, signal.SIGCONT)
        p.join(60)
    """,
    )
    assert lines[0] == "True True", "the fetch has a deadline, and its error names the producer"


def test_a_consumer_of_a_producer_at_its_limit_gets_cuda_share_busy_with_the_stand_in_driver(mock_env, isolated):
    env = dict(isolated, ZCTIPC_CUDA_LIBRARY=mock_env["ZCTIPC_CUDA_LIBRARY"])
    lines = run_with(
        env,
        """
        import errno, os, signal, socket, zctipc, _gpu
        q, ready = zctipc.Queue(), zctipc.Queue()
        p = zctipc.get_context("spawn").Process(target=_gpu.stopped_producer, args=(q, ready))
        p.start()
        pid = ready.get(timeout=60)
        path = os.path.join(os.environ["ZCTIPC_RUNTIME_DIR"], f"cuda-{pid}.sock")
        flood = []
        for _ in range(100):  # more than the 64 connections it serves at once, each silent
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(path)
            flood.append(s)
        try:
            q.get(timeout=60)
            print("received")
        except zctipc.CudaShareBusy as e:
            print(isinstance(e, BlockingIOError), e.errno == errno.EAGAIN, f"pid {pid} is at its limit" in str(e))
        except Exception as e:
            print(type(e).__name__, e)
        finally:
            os.kill(p.pid, signal.SIGKILL)
            p.join(60)
    """,
    )
    assert lines[0] == "True True True", "refused with the reason, as a specific exception"


@gpu
def test_a_dataloader_with_pin_memory_hands_over_pinned_batches():
    # The pin thread copies each pooled batch into page-locked memory, as it
    # does for torch's storages (Note [batches in the pool] in zctipc._wire.batches).
    import _loaders
    from torch.utils.data import DataLoader

    loader = DataLoader(
        _loaders.Samples(32), batch_size=4, num_workers=2, pin_memory=True, multiprocessing_context=zctipc.get_context()
    )
    seen = []
    for data, index, *_ in loader:
        assert data.is_pinned()
        assert torch.equal(data.cuda(non_blocking=True).cpu(), index.view(-1, 1, 1).float().expand(-1, 3, 8))
        seen += index.tolist()
    assert sorted(seen) == list(range(32))
