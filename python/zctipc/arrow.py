"""Arrow tables in shared memory: the Arrow tier.

:func:`share_table` writes a table (or a record batch, a pandas or polars
DataFrame) as an Arrow IPC stream straight into a segment of its own, sized
exactly (its size is computed first without writing a byte of data), and
returns a :class:`TableHandle`. :func:`attach_table` opens it with pyarrow's
IPC reader over the mapped memory: every column is a zero-copy view
(``pa.total_allocated_bytes()`` does not grow), and the table keeps the
mapping alive.

:class:`zctipc.Queue` and the pickling hooks carry ``pyarrow.Table``,
``RecordBatch`` and pandas/polars DataFrames the same way: one IPC stream
written into a shared buffer, which travels by descriptor; the receiver
gets the same type back (pandas and polars through Arrow).
"""

import sys

import numpy as np

from . import _native
from .errors import ZctipcError
from .tensor import SharedTensor, _cname

__all__ = ["share_table", "attach_table", "TableHandle", "CorruptTable"]

_KIND_TABLE = 5


class CorruptTable(ZctipcError, ValueError):
    """A shared buffer does not hold a whole, valid Arrow IPC stream."""


def _pa():
    import pyarrow

    return pyarrow


def _as_table(obj):
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
    raise TypeError(f"share_table() takes a pyarrow Table or RecordBatch or a pandas or polars DataFrame, "
                    f"not {type(obj).__name__}")


def _stream_size(table):
    """The exact size of table's IPC stream, computed without copying data."""
    pa = _pa()
    sink = pa.MockOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.size()


def _write_stream(table, array):
    """Write table's IPC stream into the uint8 array (exactly its size)."""
    pa = _pa()
    sink = pa.FixedSizeBufferWriter(pa.py_buffer(array))
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    if sink.tell() != len(array):
        raise ZctipcError(f"the Arrow IPC stream took {sink.tell()} bytes, not the {len(array)} measured")


def _read_stream(array, what):
    """The table of the IPC stream in array (zero-copy over it)."""
    pa = _pa()
    try:
        return pa.ipc.open_stream(pa.py_buffer(array)).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, pa.ArrowNotImplementedError) as exc:
        raise CorruptTable(f"{what} does not hold a whole Arrow IPC stream ({len(array)} bytes): {exc}") from None


def _give_back(table, kind):
    if kind == "batch":
        batches = table.combine_chunks().to_batches()
        return batches[0] if batches else _pa().RecordBatch.from_pylist([], schema=table.schema)
    if kind == "pandas":
        return table.to_pandas()
    if kind == "polars":
        import polars

        return polars.from_arrow(table)
    return table


class TableHandle:
    """A table shared in a segment of its own. It holds the creator's count
    until it is closed or collected; pickled, it travels by name (keep it
    until the receiver attached)."""

    def __init__(self, *args, **kwargs):
        raise TypeError("use zctipc.share_table()")

    @classmethod
    def _wrap(cls, segment, name, nbytes, num_rows, num_columns):
        self = object.__new__(cls)
        self._segment = segment
        self.name, self.nbytes, self.num_rows, self.num_columns = name, nbytes, num_rows, num_columns
        return self

    def __repr__(self):
        return f"<TableHandle {self.name!r} rows={self.num_rows} columns={self.num_columns} nbytes={self.nbytes}>"

    def __reduce__(self):
        return _remote_handle, (self.name, self.nbytes, self.num_rows, self.num_columns)

    def close(self):
        """Let go of this handle's hold (tables attached from it keep the
        memory)."""
        if self._segment is not None:
            self._segment.close()
            self._segment = None

    def unlink(self):
        """Remove the segment's name now."""
        _native.check(_native.lib().zct_segment_unlink(self.name.encode()))


def _remote_handle(name, nbytes, num_rows, num_columns):
    return TableHandle._wrap(None, name, nbytes, num_rows, num_columns)


def share_table(table, name=None):
    """Write ``table`` (a pyarrow Table or RecordBatch, or a pandas or polars
    DataFrame) as an Arrow IPC stream into a new segment, sized exactly, in
    one pass; return its :class:`TableHandle`."""
    table, _ = _as_table(table)
    nbytes = _stream_size(table)
    ffi, lib = _native.ffi(), _native.lib()
    handle, info = ffi.new("zct_handle *"), ffi.new("zct_info *")
    _native.check(lib.zct_table_create(ffi.NULL if name is None else _cname(name), nbytes, handle, info))
    segment = SharedTensor._wrap(handle[0], info)
    try:
        _write_stream(table, segment.numpy())
    except BaseException:
        segment.unlink()
        segment.close()
        raise
    return TableHandle._wrap(segment, segment.name, nbytes, table.num_rows, table.num_columns)


def attach_table(handle):
    """Open a shared table (a :class:`TableHandle` or a segment name) as a
    pyarrow Table whose columns are views of the shared memory. Raises
    :class:`CorruptTable` when the segment does not hold a valid IPC
    stream."""
    name = handle.name if isinstance(handle, TableHandle) else handle
    ffi, lib = _native.ffi(), _native.lib()
    h, info = ffi.new("zct_handle *"), ffi.new("zct_info *")
    _native.check(lib.zct_segment_attach(_cname(name), _KIND_TABLE, 1, h, info))
    segment = SharedTensor._wrap(h[0], info)
    try:
        return _read_stream(segment.numpy(), f"segment {segment.name}")
    finally:
        segment.close()  # the table's buffers hold the mapping


# -- queues and pickling ---------------------------------------------------------


def reduce_table(obj):
    """The pickle reduction of a table or DataFrame: its IPC stream written
    once into a shared buffer, which goes out of band by descriptor."""
    from .pool import empty

    table, kind = _as_table(obj)
    buf = empty(_stream_size(table), np.uint8)
    _write_stream(table, buf)
    return _rebuild_table, (buf, kind)


def _rebuild_table(buf, kind):
    return _give_back(_read_stream(buf, "a received table"), kind)


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
