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

from __future__ import annotations

from ._core import dtypes, native, segments
from ._wire import tables
from .errors import CorruptTable

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeAlias

    # pyarrow and pandas have no types of their own: to a type checker
    # without stubs for them, their objects are Any.
    import pandas as pd
    import polars as pl
    import pyarrow as pa
    from typing_extensions import Self

    from ._core.segments import SharedTensor

    #: What share_table takes.
    TableLike: TypeAlias = pa.Table | pa.RecordBatch | pd.DataFrame | pl.DataFrame

__all__ = ["share_table", "attach_table", "TableHandle", "CorruptTable"]


class TableHandle:
    """A table shared in a segment of its own. It holds the creator's count
    until it is closed or collected; pickled, it travels by name (keep it
    until the receiver attached)."""

    name: str
    nbytes: int
    num_rows: int
    num_columns: int
    _segment: SharedTensor | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("use zctipc.share_table()")

    @classmethod
    def _wrap(cls, segment: SharedTensor | None, name: str, nbytes: int, num_rows: int, num_columns: int) -> Self:
        self = object.__new__(cls)
        self._segment = segment
        self.name, self.nbytes, self.num_rows, self.num_columns = name, nbytes, num_rows, num_columns
        return self

    def __repr__(self) -> str:
        return f"<TableHandle {self.name!r} rows={self.num_rows} columns={self.num_columns} nbytes={self.nbytes}>"

    def __reduce__(self) -> tuple[Callable[[str, int, int, int], TableHandle], tuple[str, int, int, int]]:
        return _remote_handle, (self.name, self.nbytes, self.num_rows, self.num_columns)

    def close(self) -> None:
        """Let go of this handle's hold (tables attached from it keep the
        memory)."""
        if self._segment is not None:
            self._segment.close()
            self._segment = None

    def unlink(self) -> None:
        """Remove the segment's name now."""
        segments.unlink(self.name)


def _remote_handle(name: str, nbytes: int, num_rows: int, num_columns: int) -> TableHandle:
    return TableHandle._wrap(None, name, nbytes, num_rows, num_columns)


def share_table(table: TableLike, name: str | None = None) -> TableHandle:
    """Write ``table`` (a pyarrow Table or RecordBatch, or a pandas or polars
    DataFrame) as an Arrow IPC stream into a new segment, sized exactly, in
    one pass; return its :class:`TableHandle`."""
    table, _ = tables.as_table(table)
    nbytes = tables.stream_size(table)
    lib = native.lib()
    segment = segments.create(
        name, dtypes.CODES["uint8"], (nbytes,), lambda s: tables.write_stream(table, s.numpy()), lib.ZCT_KIND_TABLE
    )
    return TableHandle._wrap(segment, segment.name, nbytes, table.num_rows, table.num_columns)


def attach_table(handle: TableHandle | str) -> pa.Table:
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
