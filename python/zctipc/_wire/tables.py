"""The Arrow codec: a table (a pyarrow Table or RecordBatch, or a pandas or
polars DataFrame) as one Arrow IPC stream in shared memory, sized exactly
(its size is measured first without copying data), read back zero-copy
over the mapping."""

import sys

from .._core import lazy, pool
from ..errors import CorruptTable, ZctipcError

np = lazy.numpy(__name__)


def _pa():
    import pyarrow

    return pyarrow


def as_table(obj):
    """(pyarrow.Table, kind) of a table, a record batch, or a pandas or
    polars DataFrame; kind says what to give back."""
    pa = _pa()
    if isinstance(obj, pa.Table):
        return obj, "table"
    if isinstance(obj, pa.RecordBatch):
        return pa.Table.from_batches([obj]), "batch"
    module = type(obj).__module__.split(".")[0]
    if module == "pandas" and type(obj).__name__ == "DataFrame":
        return pa.Table.from_pandas(obj), "pandas"
    if module == "polars" and type(obj).__name__ == "DataFrame":
        return obj.to_arrow(), "polars"
    raise TypeError(
        f"share_table() takes a pyarrow Table or RecordBatch or a pandas or polars DataFrame, not {type(obj).__name__}"
    )


def stream_size(table):
    """The exact size of table's IPC stream, computed without copying data."""
    pa = _pa()
    sink = pa.MockOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.size()


def write_stream(table, array):
    """Write table's IPC stream into the uint8 array (exactly its size)."""
    pa = _pa()
    sink = pa.FixedSizeBufferWriter(pa.py_buffer(array))
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    if sink.tell() != len(array):
        raise ZctipcError(f"the Arrow IPC stream took {sink.tell()} bytes, not the {len(array)} measured")


def read_stream(array, what):
    """The table of the IPC stream in array (zero-copy over it)."""
    pa = _pa()
    try:
        return pa.ipc.open_stream(pa.py_buffer(array)).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, pa.ArrowNotImplementedError) as exc:
        raise CorruptTable(f"{what} does not hold a whole Arrow IPC stream ({len(array)} bytes): {exc}") from None


def give_back(table, kind):
    """table as the kind of object it was sent as."""
    if kind == "batch":
        batches = table.combine_chunks().to_batches()
        return batches[0] if batches else _pa().RecordBatch.from_pylist([], schema=table.schema)
    if kind == "pandas":
        return table.to_pandas()
    if kind == "polars":
        import polars

        return polars.from_arrow(table)
    return table


def reduce_table(obj):
    """The pickle reduction of a table or DataFrame: its IPC stream written
    once into a pool buffer, which goes out of band by descriptor."""
    table, kind = as_table(obj)
    buf = pool.empty(stream_size(table), np.uint8)
    write_stream(table, buf)
    return rebuild_table, (buf, kind)


def rebuild_table(buf, kind):
    return give_back(read_stream(buf, "a received table"), kind)


def table_types():
    """The table types of the modules imported so far."""
    types = []
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        types += [pa.Table, pa.RecordBatch]
    pd = sys.modules.get("pandas")
    if pd is not None:
        types.append(pd.DataFrame)
    pl = sys.modules.get("polars")
    if pl is not None:
        types.append(pl.DataFrame)
    return types
