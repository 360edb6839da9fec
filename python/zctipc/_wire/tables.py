"""The Arrow codec: a table (a pyarrow Table or RecordBatch, or a pandas or
polars DataFrame) as one Arrow IPC stream in shared memory, sized exactly
(its size is measured first without copying data), read back zero-copy
over the mapping."""

from __future__ import annotations

import sys

from .._core import lazy, pool
from ..errors import CorruptTable, ZctipcError

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    import numpy as np

    # pyarrow has no types of its own: its objects are Any without stubs.
    import pyarrow as pa
    from numpy.typing import NDArray
else:
    np = lazy.numpy(__name__)


def _pa() -> Any:
    import pyarrow

    return pyarrow


def as_table(obj: Any) -> tuple[pa.Table, str]:
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


def stream_size(table: pa.Table) -> int:
    """The exact size of table's IPC stream, computed without copying data."""
    pa = _pa()
    sink = pa.MockOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.size()


def write_stream(table: pa.Table, array: NDArray[Any]) -> None:
    """Write table's IPC stream into the uint8 array (exactly its size)."""
    pa = _pa()
    sink = pa.FixedSizeBufferWriter(pa.py_buffer(array))
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    if sink.tell() != len(array):
        raise ZctipcError(f"the Arrow IPC stream took {sink.tell()} bytes, not the {len(array)} measured")


def read_stream(array: NDArray[Any], what: str) -> pa.Table:
    """The table of the IPC stream in array (zero-copy over it)."""
    pa = _pa()
    try:
        return pa.ipc.open_stream(pa.py_buffer(array)).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, pa.ArrowNotImplementedError) as exc:
        raise CorruptTable(f"{what} does not hold a whole Arrow IPC stream ({len(array)} bytes): {exc}") from None


def give_back(table: pa.Table, kind: str) -> Any:
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


def reduce_table(obj: Any) -> tuple[Callable[[NDArray[Any], str], Any], tuple[NDArray[Any], str]]:
    """The pickle reduction of a table or DataFrame: its IPC stream written
    once into a pool buffer, which goes out of band by descriptor."""
    table, kind = as_table(obj)
    buf = pool.empty(stream_size(table), np.uint8)
    write_stream(table, buf)
    return rebuild_table, (buf, kind)


def rebuild_table(buf: NDArray[Any], kind: str) -> Any:
    return give_back(read_stream(buf, "a received table"), kind)


def table_types() -> list[type[Any]]:
    """The table types of the modules imported so far."""
    types: list[type[Any]] = []
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
