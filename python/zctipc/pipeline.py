"""A small pipeline runner: streams between tasks, each task in a process
of its own.

::

    def source(out):
        for i in range(1000):
            out.write(np.full(8192, i, np.float32))

    def fft(inp, out):
        for frame in inp:
            out.write(np.abs(np.fft.rfft(frame))[:4096].astype(np.float32))

    p = zctipc.Pipeline()
    p.add_stream("raw", shape=8192, dtype="float32")
    p.add_stream("spectrum", shape=4096, dtype="float32")
    p.add_task(source, writes=["raw"])
    p.add_task(fft, reads=["raw"], writes=["spectrum"])
    p.add_task(sink, reads=["spectrum"])
    p.run()

A task gets a reader for each stream it reads and a writer for each it
writes, in that order, then its own ``args``. When a task returns, the
streams it writes end, so the tasks downstream finish in turn. Every task
joins its streams before any writes (no frame is lost to a late start). A
task that raises, or dies, stops the pipeline: the parent raises
:class:`PipelineError` with the task's traceback. The streams are the
parent's, and go with it.
"""

from __future__ import annotations

import time
import traceback

from . import context
from .errors import PipelineError, StreamEnded
from .events import Event
from .queues import SimpleQueue
from .streams import Stream

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from multiprocessing.context import BaseContext
    from multiprocessing.process import BaseProcess
    from typing import Any, SupportsIndex, TypeAlias

    from typing_extensions import Self

    from ._core.dtypes import DTypeSpec
    from ._core.layout import ShapeLike
    from .streams import StreamReader, StreamWriter

    #: A task's message to the parent: (task index, "ready", "done" or "failed", the traceback of a failure).
    Message: TypeAlias = tuple[int, str, str | None]

__all__ = ["Pipeline", "PipelineError"]

# How long stop() waits for tasks to finish before it terminates them.
STOP_TIMEOUT = 5.0
# How long tasks may take to start and join their streams.
START_TIMEOUT = 60.0


class _Task:
    def __init__(
        self,
        fn: Callable[..., object],
        reads: list[str],
        writes: list[str],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str,
    ) -> None:
        self.fn, self.reads, self.writes, self.args, self.kwargs, self.name = fn, reads, writes, args, kwargs, name
        self.process: BaseProcess | None = None
        self.done = False


class Pipeline:
    """Streams and the tasks that read and write them, each task in its own
    process (started with ``ctx``, zctipc's forkserver context by default).
    """

    def __init__(self, *, ctx: BaseContext | None = None) -> None:
        # A concrete context: typeshed puts no Process on BaseContext.
        self._ctx: Any = ctx or context.get_context()
        self._specs: dict[str, dict[str, Any]] = {}
        self._tasks: list[_Task] = []
        self._streams: dict[str, Stream] = {}
        self._results: SimpleQueue | None = None
        self._go: Event | None = None
        self._started = False
        self._finished = False

    def add_stream(
        self,
        name: str,
        shape: ShapeLike,
        dtype: DTypeSpec = "float32",
        frames: SupportsIndex = 32,
        policy: str = "block",
        reader_timeout: float | None = None,
    ) -> Self:
        """Declare a stream of ``frames`` frames of ``shape`` and ``dtype``;
        it gets a reader slot for each task that reads it."""
        self._check_not_started()
        if name in self._specs:
            raise ValueError(f"the pipeline has a stream {name!r} already")
        self._specs[name] = dict(shape=shape, dtype=dtype, frames=frames, policy=policy, reader_timeout=reader_timeout)
        return self

    def add_task(
        self,
        fn: Callable[..., object],
        reads: Iterable[str] = (),
        writes: Iterable[str] = (),
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> Self:
        """Run ``fn(*readers, *writers, *args, **kwargs)`` in a process of its
        own, with a reader of each stream in ``reads`` and the writer of each
        in ``writes``. ``fn`` must be picklable (a module-level function)."""
        self._check_not_started()
        reads, writes = list(reads), list(writes)
        for s in reads + writes:
            if s not in self._specs:
                raise ValueError(f"task {name or fn.__name__!r} uses stream {s!r}, which add_stream() never declared")
        for s in writes:
            if any(s in t.writes for t in self._tasks):
                raise ValueError(f"stream {s!r} has a writer already: a stream has one writer")
        self._tasks.append(
            # mypy keeps None in the type of `name or getattr(...)`, a str
            _Task(fn, reads, writes, tuple(args), dict(kwargs or {}), name or getattr(fn, "__name__", "task"))  # type: ignore[arg-type]
        )
        return self

    def _check_not_started(self) -> None:
        if self._started:
            raise RuntimeError("the pipeline has started: declare streams and tasks before start()")

    def start(self) -> Self:
        """Make the streams and start every task; return once every task has
        joined its streams and been told to go."""
        self._check_not_started()
        if not self._tasks:
            raise ValueError("the pipeline has no task")
        self._started = True
        try:
            for name, spec in self._specs.items():
                readers = max(1, sum(name in t.reads for t in self._tasks))
                self._streams[name] = Stream.create(readers=readers, **spec)
            self._results = SimpleQueue(ctx=self._ctx)
            self._go = Event()
            for i, t in enumerate(self._tasks):
                t.process = self._ctx.Process(
                    target=_run_task,
                    name=f"zctipc-pipeline-{t.name}",
                    args=(
                        i,
                        t.fn,
                        [self._streams[s] for s in t.reads],
                        [self._streams[s] for s in t.writes],
                        t.args,
                        t.kwargs,
                        self._results,
                        self._go,
                    ),
                )
                t.process.start()
            ready: set[int] = set()
            deadline = time.monotonic() + START_TIMEOUT
            while len(ready) < len(self._tasks):
                msg = self._next_message(deadline)
                if msg is None:
                    raise PipelineError(f"the tasks did not start within {START_TIMEOUT} s")
                if msg[1] == "ready":
                    ready.add(msg[0])
                else:
                    self._record(msg)
                    self._raise_failure()
            self._go.set()
        except BaseException:
            self._shutdown()
            raise
        return self

    def _next_message(self, deadline: float) -> Message | None:
        """The next task message, or None at the deadline; a task that died
        without a word becomes a failure message. (Called once start() has
        made _results and each task's process: the ignores below.)"""
        while time.monotonic() < deadline:
            if not self._results.empty():  # type: ignore[union-attr]
                return self._results.get()  # type: ignore[union-attr]
            for i, t in enumerate(self._tasks):
                if not t.done and t.process.exitcode is not None and self._results.empty():  # type: ignore[union-attr]
                    code = t.process.exitcode  # type: ignore[union-attr]
                    return (i, "failed", f"task {t.name!r} died with exit code {code} without a word")
            time.sleep(0.01)
        return None

    def _record(self, msg: Message) -> None:
        i, what, detail = msg
        t = self._tasks[i]
        t.done = True
        if what == "failed" and self._failure is None:
            self._failure = (t.name, detail)

    _failure: tuple[str, str | None] | None = None

    def _raise_failure(self) -> None:
        name, detail = self._failure  # type: ignore[misc]  # called once a task failed
        raise PipelineError(f"pipeline task {name!r} failed:\n{detail}", task=name, traceback=detail)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every task to finish. A task that raised or died stops
        the others (its streams and theirs end), and join raises
        :class:`PipelineError`. Returns False when ``timeout`` passed first."""
        if not self._started:
            raise RuntimeError("the pipeline was not started")
        if self._finished:
            return True
        deadline = float("inf") if timeout is None else time.monotonic() + timeout
        while not all(t.done for t in self._tasks):
            msg = self._next_message(min(deadline, time.monotonic() + 0.5))
            if msg is not None:
                self._record(msg)
                if self._failure is not None:
                    self._shutdown()
                    self._raise_failure()
            elif time.monotonic() >= deadline:
                return False
        self._shutdown()
        if self._failure is not None:
            self._raise_failure()
        return True

    def run(self) -> bool:
        """Start the pipeline and wait for it to finish."""
        self.start()
        return self.join()

    def stop(self, timeout: float | None = STOP_TIMEOUT) -> None:
        """End every stream, so that the tasks finish, and wait for them (up
        to ``timeout`` seconds, then terminate them)."""
        if not self._started or self._finished:
            return
        for s in self._streams.values():
            s.end()
        if not self.join(timeout):
            self._shutdown()

    def _shutdown(self) -> None:
        """End the streams, wait briefly for the tasks, terminate the rest,
        and let go of every segment."""
        if self._finished:
            return
        self._finished = True
        for s in self._streams.values():
            s.end()
        if self._go is not None:
            self._go.set()  # tasks still waiting to start see the streams ended
        deadline = time.monotonic() + STOP_TIMEOUT
        for t in self._tasks:
            if t.process is None:
                continue
            t.process.join(max(0.0, deadline - time.monotonic()))
            if t.process.exitcode is None:
                t.process.terminate()
                t.process.join(STOP_TIMEOUT)
        for s in self._streams.values():
            s.close()
        if self._results is not None:
            self._results.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def streams(self) -> dict[str, Stream]:
        """The pipeline's streams by name, once started."""
        return dict(self._streams)


def _run_task(
    index: int,
    fn: Callable[..., object],
    reads: list[Stream],
    writes: list[Stream],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    results: SimpleQueue,
    go: Event,
) -> None:
    readers: list[StreamReader]
    writers: list[StreamWriter]
    readers, writers = [], []
    try:
        readers = [s.reader() for s in reads]
        writers = [s.writer() for s in writes]
        results.put((index, "ready", None))
        go.wait()
        fn(*readers, *writers, *args, **kwargs)
    except StreamEnded:
        results.put((index, "done", None))  # stopped: a stream it used ended
    except BaseException:
        results.put((index, "failed", traceback.format_exc()))
    else:
        results.put((index, "done", None))
    finally:
        for w in writers:
            w.stream.end()
            w.close()
        for r in readers:
            r.close()
