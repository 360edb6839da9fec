"""The native library's loading, its guards and its error reporting."""

import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

import zctipc
from zctipc._core import dtypes, memory
from zctipc._core import native as _native


def run_python(code, env=None, timeout=60):
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_import_loads_no_go_until_first_use():
    out = run_python("""
        def mapped():
            with open("/proc/self/maps") as f:
                return "libzctipc.so" in f.read()
        import zctipc
        print(mapped())
        zctipc.empty(1)
        print(mapped())
    """)
    assert out.split() == ["False", "True"]


def test_import_and_messages_without_arrays_load_no_numpy():
    # A worker that moves no arrays never imports NumPy; one that imports it
    # later sends its arrays zctipc's way, through zctipc's queues and
    # through multiprocessing's own pickler alike.
    out = run_python("""
        import sys
        import zctipc
        print("numpy" in sys.modules)
        q = zctipc.Queue()
        q.put({"a": (1, 2.0, "x")}); q.put(b"raw"); q.put_many([1, 2])
        print(q.get(), q.get(), q.get_many(), "numpy" in sys.modules)
        import numpy as np
        from multiprocessing.reduction import ForkingPickler
        q.put(np.arange(3)); q.put({"big": np.ones(1 << 18)})
        print(q.get().tolist(), zctipc.is_shared(q.get()["big"]))
        again = ForkingPickler.loads(ForkingPickler.dumps(np.ones(1 << 18)))
        print(zctipc.is_shared(again))
    """)
    assert out.split("\n")[:4] == ["False", "{'a': (1, 2.0, 'x')} b'raw' [1, 2] False", "[0, 1, 2] True", "True"]


def test_environment_names_another_library(tmp_path):
    packaged = os.path.join(os.path.dirname(zctipc.__file__), "libzctipc.so")
    copy = tmp_path / "libzctipc.so"
    shutil.copy(packaged, copy)
    out = run_python(
        """
        import zctipc
        zctipc.empty(1)
        with open("/proc/self/maps") as f:
            print(sorted({line.split()[-1] for line in f if "libzctipc" in line}))
    """,
        env=dict(os.environ, ZCTIPC_LIBRARY=str(copy)),
    )
    assert out.strip() == repr([str(copy)])


def test_a_library_of_another_abi_is_refused():
    out = run_python("""
        from zctipc._core import native as _native
        _native.ABI_VERSION = 999
        try:
            _native.lib()
        except ImportError as e:
            print(e)
    """)
    assert f"C ABI version {_native.ABI_VERSION}, this package needs 999" in out


def test_version_and_abi():
    lib, ffi = _native.lib(), _native.ffi()
    assert lib.zct_abi_version() == _native.ABI_VERSION
    assert ffi.string(lib.zct_version()).decode() == zctipc.__version__


def test_exceptions_inherit_builtins():
    assert issubclass(zctipc.SegmentNotFound, FileNotFoundError)
    assert issubclass(zctipc.SegmentExists, FileExistsError)
    assert issubclass(zctipc.PermissionDenied, PermissionError)
    assert issubclass(zctipc.OutOfSharedMemory, MemoryError)
    assert issubclass(zctipc.UnsupportedDtype, TypeError)
    for cls in (zctipc.NotAZctipcSegment, zctipc.CorruptHeader, zctipc.IncompatibleVersion, zctipc.InvalidArgument):
        assert issubclass(cls, ValueError)
    for name in zctipc.errors.__all__:
        assert issubclass(getattr(zctipc, name), zctipc.ZctipcError)


def test_each_thread_keeps_its_own_last_error():
    """Many threads fail at once with different messages; each reads its own."""
    errors = {}
    barrier = threading.Barrier(8)

    def fail(i):
        barrier.wait()
        for _ in range(200):
            try:
                zctipc.attach_shared_tensor(f"missing_{i}")
            except zctipc.SegmentNotFound as e:
                if f"missing_{i}" not in str(e):
                    errors[i] = str(e)
                    return

    threads = [threading.Thread(target=fail, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == {}


def test_a_closed_handle_is_refused():
    with pytest.raises(zctipc.HandleClosed, match="invalid or closed handle"):
        _native.check(_native.lib().zct_segment_close(2**63))


@pytest.mark.slow
def test_environment_set_in_python_before_first_use_is_honoured(tmp_path):
    """Go copies the environment at process start; zctipc re-reads its own
    variables when the library loads, so os.environ works before first use."""
    out = run_python(f"""
        import os
        os.environ["ZCTIPC_SHM_DIR"] = {str(tmp_path)!r}
        import zctipc
        t = zctipc.empty(3)
        print(sorted(s.kind for s in zctipc.list_segments()), len(os.listdir({str(tmp_path)!r})))
    """)
    # The pool's arena, and the process's ledger, both in the directory.
    assert out.strip() == "['arena', 'ledger'] 2"
    assert os.listdir(tmp_path) == [], "released at exit"


def test_constants_match_the_library():
    # _native keeps the status codes it branches on, and the descriptor's
    # most dimensions, as plain numbers; they are the library's.
    lib = _native.lib()
    names = {"OK": "ZCT_OK", "MAX_NDIM": "ZCT_MAX_NDIM"}
    for name in dir(_native):
        if name.startswith("E_"):
            names[name] = "ZCT_" + name
    assert len(names) > 10
    for ours, theirs in names.items():
        assert getattr(_native, ours) == getattr(lib, theirs), ours


def test_queue_framing_is_the_librarys():
    """Note [framing from the library] in zctipc._wire.records: what Python knows
    of a record's framing is zctipc.h's, read from the library, and it
    unpacks what zct_queue_take packs."""
    import numpy as np

    from zctipc import queues
    from zctipc._wire import records

    zctipc.Queue().close()  # the first queue reads the framing
    lib = _native.lib()
    read = {
        "PICKLE": "ZCT_RECORD_PICKLE",
        "TENSOR": "ZCT_RECORD_TENSOR",
        "BYTES": "ZCT_RECORD_BYTES",
        "INLINE": "ZCT_RECORD_INLINE",
        "HEADER": "ZCT_RECORD_HEADER",
        "FIELD_MASK": "ZCT_TAKE_FIELD_MASK",
        "OFFSET_SHIFT": "ZCT_TAKE_OFFSET_SHIFT",
        "TYPE_SHIFT": "ZCT_TAKE_TYPE_SHIFT",
    }
    for ours, theirs in read.items():
        assert getattr(records, ours) == getattr(lib, theirs), ours
        assert getattr(queues, "_" + ours) == getattr(lib, theirs), f"zctipc.queues' copy of {ours}"
    ffi = _native.ffi()
    types = {name for name in ffi.typeof("zct_record_type").elements.values()}
    assert types == {n for n in read.values() if n.startswith("ZCT_RECORD_") and n != "ZCT_RECORD_HEADER"}
    # A record of each type, taken with zct_queue_take, unpacks to its type,
    # payload and views.
    from zctipc._core import lazy

    lazy.check()  # zctipc meets NumPy, imported above: a bare array goes inline
    q = zctipc.Queue()
    q.put(b"abc")
    q.put(np.arange(3, dtype=np.int16))
    s = records.Scratch()
    for typ, length, nviews in ((lib.ZCT_RECORD_BYTES, 3, 0), (lib.ZCT_RECORD_INLINE, 8 + 8 + 6, 1)):
        r = lib.zct_queue_take(q._handle, s.buf, s.cap, 0, s.views, s.vcap, s.nviews)
        assert r >= 0
        assert (r >> records.TYPE_SHIFT, r & records.FIELD_MASK, s.nviews[0]) == (typ, length, nviews)
        assert (r >> records.OFFSET_SHIFT) & records.FIELD_MASK == records.HEADER
    view = s.views[0]
    assert (view.ref, view.kind, view.nbytes) == (0, lib.ZCT_REF_INLINE, 6)
    assert bytes(s.mem[view.offset : view.offset + 6]) == np.arange(3, dtype=np.int16).tobytes()
    q.close()


def test_view_flags_and_dtype_codes_are_the_librarys():
    ffi = _native.ffi()
    flags = {name[len("ZCT_VIEW_") :]: value for value, name in ffi.typeof("zct_view_flags").elements.items()}
    assert {name: getattr(memory, name) for name in flags} == flags
    codes = {name[len("ZCT_") :].lower(): value for value, name in ffi.typeof("zct_dtype").elements.items()}
    assert dtypes.CODES == codes


def test_every_status_becomes_a_specific_exception():
    ffi = _native.ffi()
    _native.lib()
    for status, name in ffi.typeof("zct_status").elements.items():
        if status == _native.OK:
            continue
        exc = _native.error(status)
        if name == "ZCT_E_INTERRUPTED":
            assert type(exc) is InterruptedError
        else:
            assert type(exc) is not zctipc.ZctipcError, f"{name} has no exception of its own"


def test_import_imports_no_more_than_it_needs():
    # Note [a lazy package]: import zctipc imports its errors, the module
    # that loads the library and the one that watches for torch's import (its
    # reducers go in whenever torch comes); the rest comes with the first
    # name used.
    out = run_python("""
        import sys
        import zctipc
        print(sorted(m for m in sys.modules if m.startswith("zctipc")))
        print("multiprocessing" in sys.modules)
        zctipc.Stream
        print("zctipc.streams" in sys.modules, "zctipc.queues" in sys.modules)
    """)
    lines = out.split("\n")
    assert lines[0] == repr(["zctipc", "zctipc._core", "zctipc._core.lazy", "zctipc._core.native", "zctipc.errors"])
    assert lines[1:3] == ["False", "True False"]


def test_queue_put_array_sends_zctipc_memory_and_refuses_the_rest():
    """zct_queue_put_array: ZCT_E_NOT_FOUND, with nothing put, for memory
    that is not zctipc's; a record whose view is the array otherwise; and on
    a full queue no count left taken."""
    import numpy as np

    ffi, lib = _native.ffi(), _native.lib()
    q = zctipc.Queue(maxsize=1)
    plain = np.arange(8, dtype=np.int64)
    code = dtypes.code_of_numpy(plain.dtype)
    ptr = ffi.from_buffer(plain)
    assert lib.zct_queue_put_array(q._handle, 2, ptr, 64, code, 1, [8], [8], 0, 0) == _native.E_NOT_FOUND
    assert q.qsize() == 0
    a = zctipc.empty(8, "int64")
    a[:] = np.arange(8)
    ptr = ffi.from_buffer(a)
    holders = lambda: zctipc.pool_stats().slots_in_use  # noqa: E731
    before = holders()
    assert lib.zct_queue_put_array(q._handle, 2, ptr + 8, 48, code, 2, [3, 2], [16, 8], 0, 0) == 0
    assert lib.zct_queue_put_array(q._handle, 2, ptr, 64, code, 1, [8], [8], 0, 0) == _native.E_FULL
    got = q.get()
    assert got.shape == (3, 2) and got.tolist() == [[1, 2], [3, 4], [5, 6]]
    got[0, 0] = 42
    assert a[1] == 42
    for bad in ([9], [-1]):  # past the buffer, negative
        assert lib.zct_queue_put_array(q._handle, 2, ptr, 64, code, 1, bad, [8], 0, 0) == _native.E_INVALID
    assert lib.zct_queue_put_array(q._handle, 2, ptr, 64, code, 33, [8], [8], 0, 0) == _native.E_INVALID
    assert q.qsize() == 0
    del got, a, ptr
    import gc

    gc.collect()
    assert holders() == before - 1, "no count was left on the buffer"
    q.close()
