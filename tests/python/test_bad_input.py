"""Bad input gets a clear, specific exception, and nothing is lost or left behind."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import SHM, segment_exists

import zctipc

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "golden")
EXCEPTIONS = {
    "not_zctipc": zctipc.NotAZctipcSegment,
    "version": zctipc.IncompatibleVersion,
    "corrupt": zctipc.CorruptHeader,
    "dtype": zctipc.UnsupportedDtype,
}
with open(os.path.join(GOLDEN, "header_v1.json")) as f:
    BAD = [v for v in json.load(f)["vectors"] if "error" in v]


def golden_bytes(name):
    with open(os.path.join(GOLDEN, name + ".bin"), "rb") as f:
        return f.read()


def test_missing_segment():
    with pytest.raises(zctipc.SegmentNotFound, match="does not exist") as err:
        zctipc.attach_shared_tensor("no_such_segment_anywhere")
    assert isinstance(err.value, FileNotFoundError) and err.value.errno == 2


@pytest.mark.parametrize("vector", BAD, ids=[v["name"] for v in BAD])
def test_broken_segment_files_are_refused(shm_file, vector):
    name = shm_file(golden_bytes(vector["name"]))
    with pytest.raises(EXCEPTIONS[vector["error"]]):
        zctipc.attach_shared_tensor(name)
    assert segment_exists(name), "a refused file is left alone"


@pytest.mark.parametrize(
    "case,exc,match",
    [
        ("not_zctipc", zctipc.NotAZctipcSegment, "not a zctipc segment"),
        ("truncated_data", zctipc.CorruptHeader, "truncated"),
        ("flipped_checksum_byte", zctipc.CorruptHeader, "checksum mismatch"),
        ("ndim_33", zctipc.CorruptHeader, "ndim 33 exceeds the limit of 32"),
        ("shape_overflows_int64", zctipc.CorruptHeader, "overflows int64"),
        ("data_past_file_end", zctipc.CorruptHeader, "the file has"),
    ],
)
def test_refusals_say_what_is_wrong(shm_file, case, exc, match):
    name = shm_file(golden_bytes(case))
    with pytest.raises(exc, match=match):
        zctipc.attach_shared_tensor(name)


def test_broken_segments_are_also_value_errors(shm_file):
    name = shm_file(golden_bytes("flipped_checksum_byte"))
    with pytest.raises(ValueError):
        zctipc.attach_shared_tensor(name)


def test_loose_mode_is_refused(shm_file):
    name = shm_file(golden_bytes("float32_2x3"), mode=0o666)
    with pytest.raises(zctipc.PermissionDenied, match="mode 0666") as err:
        zctipc.attach_shared_tensor(name)
    assert isinstance(err.value, PermissionError)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_another_owner_is_refused(shm_file):
    name = shm_file(golden_bytes("float32_2x3"))
    os.chown(os.path.join(SHM, name), 65534, 65534)
    with pytest.raises(zctipc.PermissionDenied, match="uid 65534"):
        zctipc.attach_shared_tensor(name)


def test_symlink_is_never_followed(shm_file, segname):
    target = shm_file(golden_bytes("float32_2x3"))
    link = os.path.join(SHM, "zctipc_" + segname)
    os.symlink(os.path.join(SHM, target), link)
    try:
        with pytest.raises(zctipc.PermissionDenied, match="symbolic link"):
            zctipc.attach_shared_tensor(segname)
        with pytest.raises(zctipc.SegmentExists):
            zctipc.create_shared_tensor(segname, shape=1)
    finally:
        os.unlink(link)


def test_existing_name_is_never_adopted(segname):
    with zctipc.create_shared_tensor(segname, data=np.arange(5)) as first:
        with pytest.raises(zctipc.SegmentExists, match="already exists") as err:
            zctipc.create_shared_tensor(segname, data=np.zeros(100))
        assert isinstance(err.value, FileExistsError)
        assert first.numpy().tolist() == [0, 1, 2, 3, 4]
        with zctipc.attach_shared_tensor(segname) as again:
            assert again.shape == (5,)


def test_existing_foreign_file_is_not_adopted(shm_file):
    name = shm_file(b"someone else's bytes")
    with pytest.raises(zctipc.SegmentExists):
        zctipc.create_shared_tensor(name, shape=1)
    with open(os.path.join(SHM, name), "rb") as f:
        assert f.read() == b"someone else's bytes"


def test_out_of_shared_memory(segname):
    before = set(os.listdir(SHM))
    with pytest.raises(zctipc.OutOfSharedMemory) as err:
        zctipc.create_shared_tensor(segname, shape=(1 << 45,), dtype=np.float64)
    message = str(err.value)
    assert "--shm-size" in message and str((8 << 45) + 192) in message and "free" in message
    assert isinstance(err.value, MemoryError)
    assert not segment_exists(segname), "nothing half-created is left"
    assert {n for n in os.listdir(SHM) if n.startswith("zctipc_")} <= before


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_small_dev_shm_gives_out_of_shared_memory_not_sigbus(tmp_path):
    """A Docker-sized /dev/shm, mounted for the test: creation fails cleanly,
    and a segment that fits can be written to its last byte (pages reserved,
    so no SIGBUS)."""
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        code = textwrap.dedent("""
            import numpy as np, os, zctipc
            fits = zctipc.create_shared_tensor(shape=(5 << 20,), dtype=np.uint8)
            a = fits.numpy(); a[:] = 1; a[-1] = 2
            try:
                zctipc.create_shared_tensor(shape=(4 << 20,), dtype=np.uint8)
            except zctipc.OutOfSharedMemory as e:
                print("OOM", "--shm-size" in str(e), len(os.listdir(os.environ["ZCTIPC_SHM_DIR"])))
            print("held", len(os.listdir(os.environ["ZCTIPC_SHM_DIR"])))
            fits.close()
            del a
            print("left", len(os.listdir(os.environ["ZCTIPC_SHM_DIR"])))
        """)
        # No ledger or daemon for this mount: the test counts its files and
        # unmounts it.
        env = dict(os.environ, ZCTIPC_SHM_DIR=str(mount), ZCTIPC_CLEANUP="0")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["OOM", "True", "1", "held", "1", "left", "0"]
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize(
    "dtype", [object, np.dtype([("a", "i4"), ("b", "f8")]), ">f4", "U3", "S2", "datetime64[s]", np.longdouble]
)
def test_unsupported_dtypes(dtype):
    with pytest.raises(zctipc.UnsupportedDtype) as err:
        zctipc.create_shared_tensor(shape=(2,), dtype=dtype)
    assert isinstance(err.value, TypeError)


def test_object_array_data_is_refused():
    with pytest.raises(zctipc.UnsupportedDtype, match="object"):
        zctipc.share(np.array([{}, []], dtype=object))
    with pytest.raises(zctipc.UnsupportedDtype, match="native byte order"):
        zctipc.share(np.arange(3, dtype=">i4"))


@pytest.mark.parametrize("name", ["a/b", "..", "x/../y", "a" * 201, "sp ace", "nul\0byte", "", "zctipc_"])
def test_bad_names(name):
    with pytest.raises(zctipc.InvalidArgument) as err:
        zctipc.create_shared_tensor(name, shape=1)
    assert isinstance(err.value, ValueError)
    with pytest.raises(zctipc.InvalidArgument):
        zctipc.attach_shared_tensor(name)


def test_name_must_be_a_string():
    with pytest.raises(zctipc.InvalidArgument, match="str"):
        zctipc.attach_shared_tensor(b"bytes")


def test_longest_name_is_accepted():
    name = "n" * 200
    with zctipc.create_shared_tensor(name, shape=1) as t:
        assert t.name == "zctipc_" + name


def test_tensor_outside_host_memory_is_refused_clearly():
    import torch

    meta = torch.empty(2, device="meta")
    with pytest.raises(zctipc.InvalidArgument, match="not in host memory"):
        zctipc.share(meta)


def test_more_dimensions_than_a_descriptor_holds_go_pickled_in_band():
    import torch

    q = zctipc.Queue(inline_bytes=0)  # small arrays by descriptor too
    deep = np.arange(4.0).reshape((1,) * 31 + (2, 2))  # 33 dimensions
    deep_tensor = torch.arange(4).reshape((1,) * 31 + (2, 2))
    q.put(deep)
    q.put({"deep": deep, "flat": np.arange(3)})
    q.put(deep_tensor)
    got = q.get()
    assert got.shape == deep.shape and (got == deep).all()
    both = q.get()
    assert (both["deep"] == deep).all() and zctipc.is_shared(both["flat"]), "only the deep one is in band"
    assert torch.equal(q.get(), deep_tensor)
    q.close()


@pytest.mark.parametrize(
    "make",
    [
        lambda shape: zctipc.empty(shape),
        lambda shape: zctipc.empty(shape, np.uint8),
        lambda shape: zctipc.create_shared_tensor(shape=shape),
        lambda shape: zctipc.create_shared_tensor(data=np.zeros(shape)),
        lambda shape: zctipc.Stream.create(shape=shape, dtype="float32", frames=2),
    ],
    ids=["empty", "empty-uint8", "segment", "segment-of-data", "stream"],
)
def test_every_array_zctipc_makes_has_at_most_32_dimensions(make):
    """One rule, said the same way by each maker: 32 dimensions are fine,
    33 are refused (zctipc.empty made 33)."""
    ok = make((1,) * 32)
    assert tuple(ok.shape) == (1,) * 32
    if hasattr(ok, "unlink"):
        ok.unlink()
    if hasattr(ok, "close"):
        ok.close()
    del ok
    with pytest.raises(zctipc.InvalidArgument, match="33 dimensions; a zctipc array has at most 32"):
        make((1,) * 33)


def test_a_read_only_array_arrives_read_only():
    from multiprocessing.reduction import ForkingPickler

    q = zctipc.Queue()
    frozen = np.arange(10.0)
    frozen.setflags(write=False)
    q.put(frozen)
    q.put({"a": frozen})
    for got in (q.get(), q.get()["a"]):
        assert not got.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            got[0] = 1
        with pytest.raises(ValueError):
            got.setflags(write=True)
    # zctipc memory made read-only stays so by descriptor, through the
    # standard channels too.
    shared = zctipc.empty(8, "float64")
    shared[:] = 1
    view = shared[2:]
    view.setflags(write=False)
    again = ForkingPickler.loads(bytes(ForkingPickler.dumps(view)))
    assert not again.flags.writeable and again.sum() == 6
    writable = ForkingPickler.loads(bytes(ForkingPickler.dumps(shared)))
    writable[0] = 5
    assert shared[0] == 5, "a writable one stays writable and shared"
    q.close()


@pytest.mark.parametrize(
    "call, exc",
    [
        (lambda: zctipc.Queue(max_bytes="4096"), TypeError),
        (lambda: zctipc.Queue(max_bytes=4096.0), TypeError),
        (lambda: zctipc.Queue(max_bytes=0), ValueError),
        (lambda: zctipc.Queue(max_bytes=4095), ValueError),
        (lambda: zctipc.Queue(max_bytes=(1 << 30) + 1), ValueError),
        (lambda: zctipc.Queue(max_bytes=1 << 64), ValueError),
        (lambda: zctipc.Queue(maxsize="4"), TypeError),
        (lambda: zctipc.Queue(maxsize=4.5), TypeError),
        (lambda: zctipc.Queue(maxsize=1 << 40), ValueError),
        (lambda: zctipc.set_pool_limit("1G"), TypeError),
        (lambda: zctipc.set_pool_limit(-1), ValueError),
        (lambda: zctipc.set_pool_limit(1 << 64), ValueError),
        (lambda: zctipc.empty(4, timeout="1"), TypeError),
        (lambda: zctipc.empty(4, timeout=-1), ValueError),
        (lambda: zctipc.Stream.create(shape=4, frames="8"), TypeError),
        (lambda: zctipc.Stream.create(shape=4, frames=1 << 21), ValueError),
        (lambda: zctipc.Stream.create(shape=4, readers=2.0), TypeError),
        (lambda: zctipc.Stream.create(shape=4, reader_timeout="1"), TypeError),
        (lambda: zctipc.Stream.create(shape=4, reader_timeout=float("nan")), ValueError),
        (lambda: zctipc.Stream.create(shape=4, reader_timeout=1e12), ValueError),
    ],
)
def test_numeric_arguments_are_checked_as_python_checks_them(call, exc):
    with pytest.raises(exc):
        call()


def test_queue_call_arguments_are_checked():
    q = zctipc.Queue()
    q.put(1)
    for bad, exc in [("1", TypeError), (-1, ValueError), (float("nan"), ValueError), ([], TypeError)]:
        with pytest.raises(exc):
            q.put(2, timeout=bad)
        with pytest.raises(exc):
            q.get(timeout=bad)
        with pytest.raises(exc):
            q.put_many([2], timeout=bad)
    with pytest.raises(TypeError):
        q.get_many("3")
    with pytest.raises(ValueError):
        q.get_many(0)
    assert q.get(timeout=np.float64(0.5)) == 1, "a NumPy number is a number of seconds"
    assert q.qsize() == 0, "nothing bad went in"
    s = zctipc.Stream.create(shape=4, frames=2, readers=2)
    with pytest.raises(TypeError):
        s.reader("0")
    with pytest.raises(ValueError):
        s.reader(2)
    r = s.reader()
    with pytest.raises(TypeError):
        r.read(timeout="1")
    e = zctipc.Event()
    assert e.wait(-1) is False, "as threading.Event.wait"
    with pytest.raises(TypeError):
        e.wait("1")
    r.close()
    s.close()
    q.close()


_HUGE = [(1 << 40, 1 << 40), (1 << 32, 1 << 31), (1 << 63,), (1 << 64,), (0, 1 << 63), (3, (1 << 63) // 2)]


@pytest.mark.parametrize("shape", _HUGE)
@pytest.mark.parametrize("maker", ["empty", "empty_torch", "create_shared_tensor", "cuda_empty"])
def test_a_shape_whose_bytes_overflow_int64_is_refused_by_every_maker(maker, shape):
    """A dimension past an int64's, or a shape whose bytes overflow one, is
    InvalidArgument naming the shape in every maker: zctipc.empty raised
    OverflowError from cffi ("int too big to convert"), and zctipc.cuda.empty
    wrapped the product (np.prod in int64) and asked for a byte for an array
    of 2^63: a tensor over memory it did not have."""
    import torch

    make = {
        "empty": lambda: zctipc.empty(shape, "uint8"),
        "empty_torch": lambda: zctipc.empty(shape, torch.uint8),
        "create_shared_tensor": lambda: zctipc.create_shared_tensor(shape=shape, dtype="uint8"),
        "cuda_empty": lambda: zctipc.cuda.empty(shape, "uint8"),
    }[maker]
    with pytest.raises(zctipc.InvalidArgument, match=r"overflow|past 2\*\*63"):
        make()


@pytest.mark.parametrize("maker", ["empty", "create_shared_tensor"])
def test_shapes_at_the_edges_are_made(maker):
    """No dimensions, 32, and a zero beside a large one (no bytes) are made."""
    for shape in [(), (1,) * 32, (0, 1 << 40)]:
        made = zctipc.empty(shape, "uint8") if maker == "empty" else zctipc.create_shared_tensor(shape=shape)
        assert tuple(made.shape) == shape
        if maker == "create_shared_tensor":
            made.close()
