"""Arrow tables, record batches and pandas/polars DataFrames in shared
memory: share/attach by handle, through queues and standard channels, with
every column zero-copy."""

import multiprocessing

import _workers
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import zctipc


def awkward_table(n=1000):
    """Nested, dictionary, null-bearing and plain columns."""
    return pa.table(
        {
            "i": pa.array(np.arange(n, dtype=np.int64)),
            "f": pa.array(np.linspace(0, 1, n)),
            "nulls": pa.array([None if k % 3 == 0 else k for k in range(n)], pa.int32()),
            "dict": pa.array(["red", "green", None, "blue"] * (n // 4)).dictionary_encode(),
            "list": pa.array([[k, k + 1] if k % 5 else None for k in range(n)], pa.list_(pa.int16())),
            "struct": pa.array([{"x": k, "y": str(k)} for k in range(n)]),
            "s": pa.array([f"row {k}" for k in range(n)]),
        }
    )


def test_share_and_attach_round_trip_every_kind_of_column():
    t = awkward_table()
    h = zctipc.share_table(t)
    assert (h.num_rows, h.num_columns) == (1000, 7)
    assert h.name.startswith("zctipc_")
    before = pa.total_allocated_bytes()
    back = zctipc.attach_table(h)
    assert pa.total_allocated_bytes() == before, "attaching allocates nothing: the columns are views"
    assert back.equals(t)
    assert back.schema == t.schema
    kinds = {s.kind for s in zctipc.list_segments() if s.name == h.name}
    assert kinds == {"table"}
    del back
    h.unlink()
    h.close()


def test_attached_columns_are_views_of_the_segment():
    t = pa.table({"a": np.arange(1 << 20, dtype=np.float64)})
    h = zctipc.share_table(t)
    back = zctipc.attach_table(h)
    address = back.column("a").chunks[0].buffers()[1].address
    segment = open_segment(h.name)
    base = segment.numpy().ctypes.data
    assert base <= address < base + h.nbytes, "the column lies in the segment's mapping"
    segment.close()
    h.close()
    assert back.column("a")[5].as_py() == 5.0, "the table keeps the mapping after the handle is closed"


def open_segment(name, readonly=True):
    """The table segment name, as a SharedTensor of its bytes."""
    from zctipc._core import native as _native
    from zctipc.tensor import SharedTensor

    ffi, lib = _native.ffi(), _native.lib()
    handle, info = ffi.new("zct_handle *"), ffi.new("zct_info *")
    _native.check(lib.zct_segment_attach(name.encode(), 5, int(readonly), handle, info))
    return SharedTensor._wrap(handle[0], info)


def test_a_table_is_sized_exactly_and_written_once():
    t = awkward_table(4000)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    h = zctipc.share_table(t)
    assert h.nbytes == sink.getvalue().size
    info = next(s for s in zctipc.list_segments() if s.name == h.name)
    assert info.nbytes == h.nbytes
    h.close()


def test_record_batches_and_dataframes_are_shared_too():
    t = awkward_table(100)
    h = zctipc.share_table(t.to_batches()[0])
    assert zctipc.attach_table(h).equals(t)
    h.close()
    df = pd.DataFrame({"a": np.arange(10), "b": list("abcdefghij")})
    h = zctipc.share_table(df)
    assert zctipc.attach_table(h).to_pandas().equals(df)
    h.close()
    pdf = pl.DataFrame({"a": np.arange(10), "b": list("abcdefghij")})
    h = zctipc.share_table(pdf)
    assert pl.from_arrow(zctipc.attach_table(h)).equals(pdf)
    h.close()
    with pytest.raises(TypeError, match="not dict"):
        zctipc.share_table({"a": [1]})


@pytest.mark.slow
def test_through_a_queue_in_another_process(ctx):
    t = awkward_table(500)
    df = pd.DataFrame({"x": np.arange(5.0), "y": ["a", "b", None, "d", "e"]})
    pdf = pl.DataFrame({"x": [1, 2, 3]})
    inq, outq = zctipc.Queue(), zctipc.Queue()
    p = ctx.Process(target=_workers.echo, args=(inq, outq, 4))
    p.start()
    inq.put(t)
    inq.put(t.to_batches()[0])
    inq.put({"frame": df, "n": 1})
    inq.put(pdf)
    got = [outq.get(timeout=60) for _ in range(4)]
    p.join(60)
    assert isinstance(got[0], pa.Table) and got[0].equals(t)
    assert isinstance(got[1], pa.RecordBatch) and got[1].equals(t.to_batches()[0])
    assert got[2]["n"] == 1 and got[2]["frame"].equals(df)
    assert isinstance(got[3], pl.DataFrame) and got[3].equals(pdf)


def test_through_a_standard_multiprocessing_queue():
    zctipc.init_reductions()  # pyarrow was imported after zctipc
    t = pa.table({"a": np.arange(1000)})
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    q.put(t)
    back = q.get(timeout=60)
    assert back.equals(t)
    assert zctipc.is_shared(np.frombuffer(back.column("a").chunks[0].buffers()[1], np.int64)), "sent by descriptor"
    del back


def table_segment(content):
    """A table segment holding content, as a faulty writer could leave it."""
    from zctipc._core import native as _native
    from zctipc.tensor import SharedTensor

    ffi, lib = _native.ffi(), _native.lib()
    handle, info = ffi.new("zct_handle *"), ffi.new("zct_info *")
    _native.check(lib.zct_table_create(ffi.NULL, len(content), handle, info))
    segment = SharedTensor._wrap(handle[0], info)
    segment.numpy()[:] = np.frombuffer(content, np.uint8)
    return segment


def test_a_truncated_or_corrupt_payload_is_a_clear_error():
    t = awkward_table(200)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    stream = sink.getvalue().to_pybytes()
    for broken in (stream[: len(stream) // 2], b"\x00\x01garbage" * 100, stream[:7]):
        segment = table_segment(broken)
        with pytest.raises(zctipc.CorruptTable, match=f"segment {segment.name} does not hold a whole Arrow IPC stream"):
            zctipc.attach_table(segment.name)
        segment.unlink()
        segment.close()
    whole = table_segment(stream)
    assert zctipc.attach_table(whole.name).equals(t), "the same bytes whole read fine"
    whole.unlink()
    whole.close()
    with pytest.raises(zctipc.SegmentNotFound):
        zctipc.attach_table("no_such_table")
