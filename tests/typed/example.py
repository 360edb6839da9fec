"""A small zctipc program, typed: mypy --strict checks it with the package
(make lint, tests/python/test_types.py), so that the package's annotations
serve a user's program as they are meant to. It also runs:
``python tests/typed/example.py``.

A producer process writes frames into a stream; the parent reads them,
sums each, and the producer sends its count through a queue. Beside that:
a shared tensor attached by name, a pool array, an Arrow table shared and
attached, an event, and the errors a program catches.
"""

from __future__ import annotations

import queue
import sys

import numpy as np
import numpy.typing as npt

import zctipc

FRAMES = 16


def produce(stream: zctipc.Stream, results: zctipc.Queue, go: zctipc.Event) -> None:
    """Write FRAMES frames, each filled with its index, then end the stream
    and say how many went."""
    with stream.writer() as writer:
        if not go.wait(timeout=30.0):
            raise TimeoutError("the reader never joined")
        for i in range(FRAMES):
            frame = writer.look(timeout=10.0)
            if frame is None:
                raise TimeoutError("no room in the stream")
            frame[:] = i
            writer.increment()
    stream.end()
    results.put({"sent": FRAMES, "name": stream.name})


def read_stream(reader: zctipc.StreamReader) -> list[float]:
    """The sum of every frame, read in place until the stream ends."""
    return [float(frame.sum()) for frame in reader]


def share_a_tensor() -> int:
    """Make a shared tensor, attach it by name as another process would,
    and give back its size in bytes."""
    data: npt.NDArray[np.float64] = np.arange(6.0).reshape(2, 3)
    with zctipc.create_shared_tensor(data=data) as t:
        with zctipc.attach_shared_tensor(t.name, readonly=True) as seen:
            view = seen.numpy()  # a view of the same memory
            assert view.shape == (2, 3) and float(view[1, 2]) == 5.0
        nbytes: int = t.nbytes
        t.unlink()
    try:
        zctipc.attach_shared_tensor(t.name)
    except zctipc.SegmentNotFound:
        pass  # unlinked: no one attaches it any more
    return nbytes


def pool_array() -> float:
    """An array from the pool, as np.empty would make it."""
    a = zctipc.empty((4, 4), "float32")
    a.fill(1.5)
    return float(a.sum())


def share_a_table() -> int:
    """An Arrow table written into shared memory once and attached."""
    try:
        import pyarrow as pa
    except ImportError:
        return 0
    handle = zctipc.share_table(pa.table({"x": [1, 2, 3], "y": ["a", "b", "c"]}))
    try:
        table = zctipc.attach_table(handle.name)  # columns are views of the segment
        rows: int = table.num_rows
    finally:
        handle.unlink()
        handle.close()
    return rows


def main() -> int:
    ctx = zctipc.get_context()
    results = zctipc.Queue(maxsize=4)
    go = zctipc.Event()
    with zctipc.Stream.create(shape=(256,), dtype="float32", frames=8, readers=1) as stream:
        reader = stream.reader()
        producer = ctx.Process(target=produce, args=(stream, results, go))
        producer.start()
        go.set()
        sums = read_stream(reader)
        reader.close()
        try:
            report = results.get(timeout=30.0)
        except queue.Empty:
            print("the producer sent no report", file=sys.stderr)
            return 1
        finally:
            producer.join(30.0)
    results.close()
    assert report["sent"] == len(sums) == FRAMES, (report, sums)
    assert sums == [256.0 * i for i in range(FRAMES)]
    print(f"{len(sums)} frames, {share_a_tensor()} bytes shared, pool sum {pool_array()}, {share_a_table()} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
