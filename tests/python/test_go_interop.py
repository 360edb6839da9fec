"""Go programs and Python processes hand each other tensors: the examples of
go/examples (built here with the Go toolchain) against the Python package,
through a segment (by TensorRef), a queue and a stream, both ways."""

import json
import os
import subprocess

import numpy as np
import pytest
from _procs import go_echo
from conftest import slots_in_use

import zctipc

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def go_bin(tmp_path_factory):
    out = tmp_path_factory.mktemp("goexamples")
    for name in ("producer", "consumer"):
        subprocess.run(
            ["go", "build", "-o", str(out / name), f"./go/examples/{name}"], cwd=ROOT, check=True, timeout=600
        )
    return lambda name: str(out / name)


def run(go_bin, *args):
    out = subprocess.run([go_bin(args[0]), *args[1:]], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.slow
def test_a_go_tensor_is_attached_in_python_by_its_ref(go_bin):
    p = subprocess.Popen(
        [go_bin("producer"), "tensor", "", "1000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    ref = p.stdout.readline()
    a = zctipc.attach_ref(ref)
    assert a.dtype == np.float32 and a.shape == (1000,)
    assert a.sum() == 249750 and a[3] == 1.5
    assert json.loads(ref)["device"] == "cpu"
    del a
    p.stdin.close()
    assert p.wait(60) == 0


@pytest.mark.slow
def test_a_python_tensor_is_attached_in_go_by_its_ref(go_bin):
    t = zctipc.create_shared_tensor(data=np.arange(1000, dtype=np.float32) / 2)
    assert run(go_bin, "consumer", "tensor", json.dumps(t.ref())) == "sum 249750"
    t.close()


def test_go_producer_python_consumer_through_a_queue(go_bin):
    q = zctipc.Queue()
    assert run(go_bin, "producer", "queue", q.name, "1000", "5") == ""
    got = [q.get(timeout=10) for _ in range(6)]
    for k, a in enumerate(got[:5]):
        assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (1000,)
        assert (a == k).all()
        assert zctipc.is_shared(a), "a view of the Go producer's memory"
    assert got[5] == b"done"


def test_python_producer_go_consumer_through_a_queue(go_bin):
    q = zctipc.Queue()
    slots = slots_in_use()
    consumer = subprocess.Popen([go_bin("consumer"), "queue", q.name], stdout=subprocess.PIPE, text=True)
    for k in range(3):
        a = zctipc.empty(1000, np.float32)  # zctipc memory: sent by descriptor
        a[:] = k
        q.put(a)
        del a
    q.put(np.full(1000, 3, np.float32))  # plain memory: one copy into the pool
    q.put(np.full((10, 100), 4, np.float32))
    q.put({"opaque to Go": np.ones(100)})  # a pickle: Go gives up its array's count
    q.put(b"done")
    out, _ = consumer.communicate(timeout=120)
    assert consumer.returncode == 0
    assert out.strip() == f"tensors 5 sum {sum(k * 1000 for k in range(5))}"
    assert zctipc.pool_stats().slots_in_use == slots, "the Go consumer gave every count back"


def test_go_writer_python_reader_through_a_stream(go_bin):
    s = zctipc.Stream.create(shape=256, dtype=np.float32, frames=8, readers=1)
    r = s.reader()
    writer = subprocess.Popen([go_bin("producer"), "stream", s.name, "20"])
    got = [(int(f[0]), bool((f == f[0]).all())) for f in r]
    assert writer.wait(60) == 0
    assert got == [(k, True) for k in range(20)]
    r.close()


def test_python_writer_go_reader_through_a_stream(go_bin):
    s = zctipc.Stream.create(shape=256, dtype=np.float32, frames=8, readers=1)
    reader = subprocess.Popen([go_bin("consumer"), "stream", s.name], stdout=subprocess.PIPE, text=True)
    assert reader.stdout.readline().strip() == "joined"
    w = s.writer()
    for k in range(20):
        w.write(np.full(256, k, np.float32))
    s.end()
    out, _ = reader.communicate(timeout=60)
    assert reader.returncode == 0
    assert out.strip() == f"frames 20 sum {256 * sum(range(20))} whole true"
    w.close()


def test_tensor_refs_are_checked(go_bin):
    # The library parses a ref and checks it against the segment's header:
    # nothing is read as another type, shape or part of it.
    t = zctipc.create_shared_tensor(data=np.arange(6, dtype=np.int32))
    ref = t.ref()
    assert zctipc.attach_ref(ref).tolist() == list(range(6))
    assert zctipc.attach_ref(json.dumps(ref), torch=True).tolist() == list(range(6))
    for wrong, says in [
        ({"shape": [7]}, "shape"),
        ({"dtype": "float32"}, "dtype float32"),
        ({"strides": [8]}, "strides"),
        ({"offset": 8}, "offset"),
        ({"nbytes": 8}, "bytes"),
        ({"id": "other"}, "id"),
        ({"device": "cuda:0"}, "device"),
        ({"offset": 8, "shape": [2], "strides": [4], "nbytes": 8}, "shape"),
    ]:
        with pytest.raises(zctipc.InvalidArgument, match=says):
            zctipc.attach_ref(dict(ref, **wrong))
    with pytest.raises(zctipc.InvalidArgument, match="needs segment, dtype, shape and strides"):
        zctipc.attach_ref({"segment": t.name})
    with pytest.raises(zctipc.InvalidArgument, match="a dict or its JSON text"):
        zctipc.attach_ref(42)
    t.close()


EMPTY_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
EMPTY_SHAPES = [(0,), (0, 5), (5, 0), (0, 0, 3)]


def test_empty_arrays_of_every_dtype_and_shape_cross_to_go_and_back(go_bin):
    # Python sends each (inline, no bytes); Go receives its type and shape
    # and sends it back (its own encoding of an empty tensor); Python gets
    # the same type and shape.
    sent = [np.empty(shape, dtype) for dtype in EMPTY_DTYPES for shape in EMPTY_SHAPES]
    got, out = go_echo(go_bin("consumer"), sent)
    assert out.split("\n")[: len(sent)] == [f"{a.dtype} {list(a.shape)}".replace(",", "") for a in sent]
    for a, b in zip(sent, got, strict=True):
        assert isinstance(b, np.ndarray), (a.dtype, a.shape)
        assert (b.dtype, b.shape, b.size) == (a.dtype, a.shape, 0)


def test_a_go_relay_passes_on_small_arrays_and_torch_tensors_as_they_came(go_bin):
    # Small arrays travel inside their message, and a Go program that passes
    # a message on sends them inline again; torch tensors (bfloat16, which
    # NumPy has no type for, among them) stay torch tensors, whether they
    # came inline, empty, or by descriptor.
    torch = pytest.importorskip("torch")
    sent = [np.arange(3, dtype=np.float32), np.full((2, 2), True), np.arange(6, dtype=np.complex64).reshape(3, 2)]
    for dt in (torch.bfloat16, torch.float16, torch.int64):
        sent += [torch.arange(3).to(dt), torch.empty((0, 5), dtype=dt), torch.arange(100_000).to(dt)]
    got, _ = go_echo(go_bin("consumer"), sent)
    for a, b in zip(sent, got, strict=True):
        assert type(b) is type(a), (type(a), a.dtype, a.shape)
        assert b.dtype == a.dtype and b.shape == a.shape
        assert (b == a).all()
