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

from ._core import dtypes, native, segments
from ._wire import tables
from .errors import CorruptTable

__all__ = ["share_table", "attach_table", "TableHandle", "CorruptTable"]


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
        segments.unlink(self.name)


def _remote_handle(name, nbytes, num_rows, num_columns):
    return TableHandle._wrap(None, name, nbytes, num_rows, num_columns)


def share_table(table, name=None):
    """Write ``table`` (a pyarrow Table or RecordBatch, or a pandas or polars
    DataFrame) as an Arrow IPC stream into a new segment, sized exactly, in
    one pass; return its :class:`TableHandle`."""
    table, _ = tables.as_table(table)
    nbytes = tables.stream_size(table)
    lib = native.lib()
    segment = segments.create(name, dtypes.CODES["uint8"], (nbytes,), uninitialized=True, kind=lib.ZCT_KIND_TABLE)
    try:
        tables.write_stream(table, segment.numpy())
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
    segment = segments.attach(name, native.lib().ZCT_KIND_TABLE, readonly=True)
    try:
        return tables.read_stream(segment.numpy(), f"segment {segment.name}")
    finally:
        segment.close()  # the table's buffers hold the mapping
