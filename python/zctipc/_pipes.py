"""How a queue shows itself to the standard library as a pipe: the ends
multiprocessing's queues have (Reader, Writer), and the descriptor readable
while the queue holds a message (Readiness). zctipc.queues gives each queue
its ends.

Note [waiting on a queue among other things]: a queue has no pipe, so the
attributes through which the standard library waits on queues
(``_reader.fileno()`` for multiprocessing.connection.wait, selectors and
asyncio; ``_reader.recv``, ``_reader.poll``, ``_writer.send``, ``_poll``)
are made over the ring: the first ``fileno()`` starts a thread (Readiness)
that keeps a pipe readable while the queue holds a message, and unreadable
once it is empty again, whoever took the message: it sleeps, costing
nothing, until a put or a get changes that. So the descriptor is readable
while this process may find a message, like a pipe's; like a pipe shared
by readers, another process may take that message first. Closing the
queue leaves the descriptor readable, and a get then raises HandleClosed.
"""

from __future__ import annotations

import os
import threading
import weakref

from ._core import native
from .errors import HandleClosed

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol

    class _Queue(Protocol):
        """What an end needs of its queue (a zctipc.queues.Queue)."""

        _closed: bool

        def put(self, obj: Any) -> None: ...

        def get(self) -> Any: ...

        def _poll_take(self, timeout: float | None) -> bool: ...

        def _readiness(self) -> Readiness: ...


#: How long the readiness thread sleeps before it looks whether its queue
#: object was closed, in case a close let the word it sleeps on go before
#: the sleep began (Note [a sleep across a close] in zctipc._core.wait); a
#: close wakes it at once otherwise.
_WATCH_SLICE_MS = 10_000


# Note [showing after arming]: the readiness thread shows the queue's state
# in its pipe only after it armed its wait and looked again, never before.
# A get through the queue object drains the pipe when it finds the queue
# empty (rearm). Had the thread shown "readable" before arming, a get could
# empty the queue and drain the pipe after that show, a put could then
# bring a message before the thread armed, and the thread, finding the
# message, would sleep on the space word with the pipe unreadable: no get
# comes to wake it, and a ProcessPoolExecutor waiting on the pipe waited
# for ever with its results in the queue. Shown after the look that follows
# arming, the pipe can be made wrong only by a put or a get after that
# look, and either moves the word the thread sleeps on.


class Readiness:
    """A pipe readable while a queue holds a message (Note [waiting on a
    queue among other things]), and the thread that keeps it so. The
    thread holds the queue's handle, not the queue: it ends when the handle
    is closed, and leaves the pipe readable, as a pipe whose writer closed
    is; the pipe's descriptors close when this object goes.

    The thread sleeps outside the library (Note [sleeping outside Go] in
    zctipc._core.wait), so that a waiting queue costs nothing: on the data
    word, which every put bumps, while the queue is empty, and on the space
    word, which every get bumps (in any process), while it holds messages;
    woken, it looks at the queue and makes the pipe say what it found. A
    get through this queue object that finds the queue empty drains the
    pipe at once (rearm).

    Threat model: only this process's threads use it; the queue's words
    are written by any process that holds the queue, and a word that moves
    for no reason only makes the thread look again."""

    def __init__(self, handle: int, name: str) -> None:
        self.handle = handle
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.lock = threading.Lock()  # over readable, the pipe's contents, and open
        self.readable = False
        self.stopped = False
        # The pipe closes with this object, or at exit while the thread may
        # still run (a daemon thread): under the lock, after which show and
        # rearm leave it alone, so that they never write to or drain a
        # descriptor number that another open file has taken meanwhile.
        self.open = [True]
        weakref.finalize(self, _close_pipe, self.lock, self.open, self.read_fd, self.write_fd)
        self.thread = threading.Thread(target=self._run, name=f"zctipc readiness of {name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        ffi, lib = native.ffi(), native.lib()
        handle = self.handle
        items = ffi.new("int64_t[2]")  # messages, and unfinished ones (not read)
        word, seen = ffi.new("uint32_t **"), ffi.new("uint32_t *")
        data, space = lib.ZCT_WAIT_DATA, lib.ZCT_WAIT_SPACE

        def look() -> bool:
            # False once the handle was closed; any other failure is a bug
            # that must not pass for a close: it is raised (and shown by
            # threading.excepthook) after the pipe was left readable.
            status = lib.zct_queue_len(handle, items, items + 1)
            if status == native.E_CLOSED:
                return False
            native.check(status)
            return True

        try:
            while not self.stopped:
                if not look():
                    return
                holds = items[0] > 0
                which = space if holds else data
                status = lib.zct_queue_arm(handle, which, word, seen)
                if status == native.E_CLOSED:
                    return
                native.check(status)
                woken = False
                try:
                    # Look again now that a change wakes this thread, and
                    # only then show what it found (Note [showing after
                    # arming]).
                    if not look():
                        return
                    if (items[0] > 0) != holds:
                        continue
                    self.show(holds)
                    slept = native.E_EMPTY
                    while slept == native.E_EMPTY and not self.stopped:
                        # In long slices, each ended by a look at stopped
                        # (Note [a sleep across a close] in zctipc._core.wait).
                        slept = lib.zct_sleep(word[0], seen[0], _WATCH_SLICE_MS)
                    woken = slept == native.OK
                finally:
                    # Woken on the data word, it takes nothing: a consumer
                    # is woken in its place when a message is there.
                    lib.zct_queue_disarm(handle, which, woken and which == data)
        finally:
            self.stopped = True
            self.show(True)  # as a pipe whose writer closed: readers look, and find the queue closed

    def show(self, readable: bool) -> None:
        """Make the pipe readable or not."""
        with self.lock:
            if not self.open[0]:
                return
            if readable and not self.readable:
                os.write(self.write_fd, b"\0")
                self.readable = True
            elif not readable and self.readable and not self.stopped:
                _drain(self.read_fd)
                self.readable = False

    def rearm(self, empty: Callable[[], bool]) -> None:
        """After a get through this queue object: when the queue is now
        empty (empty() says), make the pipe unreadable at once."""
        with self.lock:
            if self.open[0] and self.readable and not self.stopped and empty():
                _drain(self.read_fd)
                self.readable = False

    def stop(self) -> None:
        """Let the thread end (closing the queue's handle wakes it)."""
        self.stopped = True


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 64):
            pass
    except BlockingIOError:
        pass


def _close_pipe(lock: threading.Lock, opened: list[bool], read_fd: int, write_fd: int) -> None:
    with lock:
        opened[0] = False
        os.close(read_fd)
        os.close(write_fd)


# Note [polling a reader]: the standard library polls a pipe end and then
# reads it (Pool's shutdown drains its task queue so: while poll(): recv()),
# relying on a lock that its readers hold across process boundaries while
# they read. A queue's consumers take no such lock, so a message that poll()
# saw could be taken by another process before recv(), which would then
# block for ever. So Reader.poll takes the message it sees into the queue
# object (its stash), and the next get, recv or get_many returns it first;
# qsize() and empty() count it.


# Note [an end holds its queue weakly]: a queue holds its ends, which the
# standard library reads as its attributes _reader and _writer, so an end
# holds its queue by a weak reference. Held strongly, each queue would be a
# reference cycle, let go only when the cycle collector ran (perhaps only at
# exit): its handle, its segment in /dev/shm and its readiness thread would
# outlive the last reference to it. The standard library holds a queue
# wherever it holds one of its ends (a Pool, a ProcessPoolExecutor's
# manager thread); an end used after its queue was collected raises
# HandleClosed, as a closed connection raises, and says it is closed.
# The reader's descriptor, once fileno() gave it out, lives as long as the
# reader, readable after its queue went, as a pipe whose writer closed is:
# closed with the queue, it left whoever registered it watching a
# descriptor that epoll forgets once closed (a selector woken by the
# queue's going could miss it and wait for ever) and whose number the next
# file opened takes.


class _End:
    """What a queue's two ends share: their queue, held weakly."""

    __slots__ = ("_queue", "_name")

    def __init__(self, q: _Queue, name: str) -> None:
        self._queue = weakref.ref(q)
        self._name = name

    def _live(self) -> _Queue:
        """The queue; HandleClosed once it was collected (Note [an end holds
        its queue weakly])."""
        q = self._queue()
        if q is None:
            raise HandleClosed(f"Queue {self._name!r} of this end was collected: hold the queue, not only its end")
        return q

    @property
    def closed(self) -> bool:
        q = self._queue()
        return q is None or q._closed


class Reader(_End):
    """The receiving end of a queue as multiprocessing's Connection shows it
    to the standard library's pools and to multiprocessing.connection.wait."""

    __slots__ = ("_pipe",)

    def __init__(self, q: _Queue, name: str) -> None:
        super().__init__(q, name)
        self._pipe: Readiness | None = None  # once fileno() gave its descriptor out

    def fileno(self) -> int:
        """A descriptor readable while the queue holds a message, open as
        long as this end (Note [an end holds its queue weakly])."""
        self._pipe = ready = self._live()._readiness()
        return ready.read_fd

    def recv(self) -> Any:
        return self._live().get()

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether recv() would return at once, waiting up to timeout
        seconds (None: for ever): a message there is taken into this
        process (Note [polling a reader]), so that another consumer cannot
        take it between poll() and recv()."""
        return self._live()._poll_take(timeout)

    def close(self) -> None:
        """Nothing to close: the queue stays open (multiprocessing's pool
        workers close the ends they do not use)."""


class Writer(_End):
    """The sending end of a queue as multiprocessing's Connection shows it."""

    __slots__ = ()

    def send(self, obj: object) -> None:
        self._live().put(obj)

    def close(self) -> None:
        """Nothing to close: the queue stays open."""
