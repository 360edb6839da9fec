"""Looking inside a live zctipc system from the terminal: ``zctipc top``
and ``zctipc tail`` (the command line registers them with :func:`register`).

``zctipc top`` shows this user's queues, streams and pools, refreshed every
``--interval`` seconds: for each, its segment, how deep it is, its rates
since the last refresh, the memory it holds, and the processes that hold
it. ``zctipc tail NAME`` prints the messages of a queue, or the frames of a
stream, as they pass: arrays and tensors as their dtype, shape and a
summary of a sample of their elements, other objects as a short repr.

Note [observing takes nothing]: neither command takes anything from the
processes it watches. top reads the census (``zctipc ls``: segment headers,
the ledgers of live processes, /proc/PID/maps) and each queue's, stream's
and arena's words through zct_segment_observe, which maps the segment
without a count for the call and writes nothing. tail holds a count on the
queue or stream it watches, as any process that attaches one does (it
records it in a ledger, so the cleanup daemon gives it up if tail is
killed). It peeks (zct_queue_peek, zct_stream_peek): it copies a record or
frame and checks the copy afterwards, without a lock, a reader slot or a
wake-up of its own (Note [peeking at a queue] in go/queue/peek.go, Note
[peeking at a stream] in go/stream/peek.go). Consumers receive every
message and a stream's writer never waits for tail; in exchange tail shows
only what it could copy: a message that consumers took before tail read it
(from an unbounded queue, which gives the pages of taken messages back, or
one that a producer wrote over), or a frame the writer overwrote first, is
counted and said, never shown torn. The arrays of a message are attached
with counts of tail's own (never the count the message carries, which stays
its taker's), read for a moment and let go.

Note [unpickling what passes]: a queue message is a pickle whose arrays are
its descriptors. tail unpickles it with an allowlist: builtin containers
and values, the standard library's value types, NumPy's and torch's dtypes
and scalars, and zctipc's own rebuilds of arrays, tensors and tables, which
it points at its own attached copies. Every other global (a class of the
sender's program, a CUDA tensor, a zctipc queue or stream in the message)
becomes a stand-in that shows its name and the arguments and state it was
pickled with: nothing of the sender's code runs in tail, nothing is
imported, and no handle or CUDA memory is opened.
"""

from __future__ import annotations

import _compat_pickle
import argparse
import collections
import io
import itertools
import json
import os
import pickle
import shutil
import sys
import time

from . import errors, tensor
from ._core import dtypes, lazy, memory, native
from ._wire import exports

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, TextIO

    import numpy as np
    from numpy.typing import NDArray
else:
    np = lazy.numpy(__name__)

__all__ = ["register", "sample", "top", "tail", "summarize"]

#: How many elements of an array tail summarizes (the first ones, in C order).
SAMPLE = 4096

#: The longest line tail prints for one message or frame.
WIDTH = 240

#: The largest record tail copies to show; a larger one is named and skipped.
MAX_RECORD = 64 << 20

#: tail's sleeps while nothing new is there: from the first to the last,
#: doubling (seconds).
_POLL_FIRST, _POLL_LAST = 0.001, 0.02

#: How often tail, while it waits, looks whether anyone else still holds
#: what it watches (seconds).
_LIVENESS_EVERY = 1.0

_RING = 1 << 32  # queue positions and counts wrap here

TOP_HELP = """\
Every queue, stream and pool of this user, refreshed every --interval
seconds (a terminal is redrawn; a pipe or file gets one frame after
another). Queues: messages waiting (and the most allowed, - for none), the
ring bytes they fill, messages put and taken per second, ring bytes per
second (bounded queues only: an unbounded ring skips to its next lap when
it empties). Streams: frames the slowest reader has yet to read, of the
ring's; frames and bytes published per second; the writer and readers.
Pools, one per owning process: slots in use, of all its arenas'; slots
freed and their bytes per second. HELD is the memory the segments hold in
/dev/shm. HOLDERS are the live processes that created a segment, hold a
count on it or on a slot of it (their ledgers), or map it (/proc). top
takes nothing from anyone: it reads the census and the segments' words.
--once and --json print one frame, with rates over --interval."""

TAIL_HELP = """\
Print the messages of a queue, or the frames of a stream, as they pass:
arrays and tensors as dtype[shape] and the min, max and mean of their first
4096 elements; other objects as a short repr (classes of the sender's
program, which tail does not import, by name and pickled state). NAME is
the segment name zctipc ls shows, with or without the zctipc_ prefix.

tail takes nothing from the consumers or readers: it copies what passes
and checks the copy. A queue shows its waiting messages first, then new
ones; a message a consumer took before tail could copy it (at once, from
an unbounded queue; once written over, from a bounded one) is counted and
said instead. A stream shows its last frame, then each new one, without
taking a reader slot: the writer never waits for tail, and frames it
overwrites first are counted and said.

tail stops after -n messages or frames, when a stream ends (exit status
0), or when nobody else holds the queue or stream any more: its producer
and consumers exited or were killed (exit status 1, as for a name that is
no queue or stream). It keeps waiting while anyone else holds it, a
killed producer's consumers included. Ctrl-C stops it (130)."""


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``top`` and ``tail`` to the command line's subparsers (sub) and
    return the function of each command."""
    top_parser = sub.add_parser(
        "top",
        help="a live view of this user's queues, streams and pools",
        description=TOP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top_parser.add_argument("--interval", type=_seconds, default=1.0, help="seconds between refreshes (default 1)")
    top_parser.add_argument("--once", action="store_true", help="print one frame and exit")
    top_parser.add_argument("--json", action="store_true", help="print one frame as JSON and exit")
    tail_parser = sub.add_parser(
        "tail",
        help="print the messages of a queue or the frames of a stream as they pass, taking none",
        description=TAIL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tail_parser.add_argument("name", metavar="QUEUE|STREAM", help="the segment name, as zctipc ls shows it")
    tail_parser.add_argument("-n", type=_count, default=None, metavar="N", help="stop after N messages or frames")
    follow = tail_parser.add_mutually_exclusive_group()
    follow.add_argument(
        "--follow", "-f", dest="follow", action="store_true", default=True, help="wait for more (the default)"
    )
    follow.add_argument("--no-follow", dest="follow", action="store_false", help="stop when nothing more is there now")
    return {"top": _top_command, "tail": _tail_command}


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds above 0")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive count")
    return value


def _top_command(args: argparse.Namespace) -> int:
    return top(args.interval, once=args.once, as_json=args.json)


def _tail_command(args: argparse.Namespace) -> int:
    # Note [observing takes nothing]: tail holds counts, so it records them
    # for the cleanup daemon like any process (the command line turns that
    # off for the commands that only look).
    native.auto_cleanup = True
    return tail(args.name, args.n, follow=args.follow)


# -- top -----------------------------------------------------------------------


def sample(previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """One frame of ``zctipc top``: this user's queues, streams and pools
    now, with rates since ``previous`` (an earlier frame; rates are None
    without one). Taking it takes nothing from anyone (Note [observing
    takes nothing])."""
    now = time.monotonic()
    lib = native.lib()
    census = [s for s in tensor.list_segments() if s.error is None and s.kind in ("queue", "stream", "arena")]
    mapping = _mappers(census)
    counters: dict[str, Any] = {}
    queues: list[dict[str, Any]] = []
    streams: list[dict[str, Any]] = []
    pools: dict[int, dict[str, Any]] = {}
    unreadable: list[dict[str, str]] = []
    dt = None if previous is None else now - previous["_taken"]
    before = {} if previous is None else previous["_counters"]
    for s in census:
        try:
            state = json.loads(native.read_text(lib.zct_segment_observe, s.name.encode()))
        except errors.SegmentNotFound:
            continue  # gone since the census
        except errors.ZctipcError as exc:  # one broken segment must not hide the others
            unreadable.append({"name": s.name, "error": str(exc)})
            continue
        holders = set(s.holders) | mapping.get(s.name, set())
        if s.creator_alive:
            holders.add(s.creator_pid)
        resident = _resident(s.name)
        common = {"name": s.name, "creator_pid": s.creator_pid, "creator_alive": s.creator_alive, "held": resident}
        if "queue" in state:
            q = state["queue"]
            counters[s.name] = (q["puts"], q["gets"], q["tail"])
            rate_in = rate_out = byte_rate = None
            if dt and s.name in before:
                puts, gets, tail_pos = before[s.name]
                rate_in = ((q["puts"] - puts) % _RING) / dt
                rate_out = ((q["gets"] - gets) % _RING) / dt
                if not q["unbounded"]:
                    byte_rate = ((q["tail"] - tail_pos) % _RING) / dt
            queues.append(
                {
                    **common,
                    "messages": q["messages"],
                    "max_messages": q["max_items"] or None,
                    "ring_bytes_used": q["bytes"],
                    "ring_bytes": q["ring_bytes"],
                    "largest_message": q["capacity"],
                    "unbounded": q["unbounded"],
                    "puts_per_s": rate_in,
                    "gets_per_s": rate_out,
                    "bytes_per_s": byte_rate,
                    "producer_lock": q["producer"] or None,
                    "consumer_lock": q["consumer"] or None,
                    "holders": _live(holders),
                }
            )
        elif "stream" in state:
            st = state["stream"]
            counters[s.name] = (st["published"],)
            active = [r for r in st["readers"] if r["state"] == "active"]
            behind = st["published"] - min(r["position"] for r in active) if active else None
            frame_rate = None
            if dt and s.name in before:
                frame_rate = max(0, st["published"] - before[s.name][0]) / dt
            holders |= {p for p in (st["writer"], *(r["pid"] for r in st["readers"])) if p}
            streams.append(
                {
                    **common,
                    "frames_behind": behind,
                    "frames": st["frames"],
                    "frame": f"{dtypes.NAMES.get(st['dtype'], '?')}{st['shape']}",
                    "frame_bytes": st["frame_bytes"],
                    "policy": st["policy"],
                    "published": st["published"],
                    "dropped": st["dropped"],
                    "ended": st["ended"],
                    "frames_per_s": frame_rate,
                    "bytes_per_s": None if frame_rate is None else frame_rate * st["frame_bytes"],
                    "writer": st["writer"] or None,
                    "readers": st["readers"],
                    "holders": _live(holders),
                }
            )
        elif "arena" in state:
            a = state["arena"]
            counters[s.name] = (a["frees"],)
            pool = pools.setdefault(
                s.creator_pid,
                {
                    "owner": s.creator_pid,
                    "owner_alive": s.creator_alive,
                    "arenas": 0,
                    "slots": 0,
                    "slots_in_use": 0,
                    "bytes_in_use": 0,
                    "bytes": 0,
                    "tickets_in_flight": 0,
                    "held": 0,
                    "frees_per_s": None,
                    "bytes_per_s": None,
                    "holders": set(),
                },
            )
            pool["arenas"] += 1
            pool["held"] += resident or 0
            pool["holders"] |= holders
            if a["tickets"]:
                pool["tickets_in_flight"] += a["in_use"]
            else:
                pool["slots"] += a["slots"]
                pool["slots_in_use"] += a["in_use"]
                pool["bytes_in_use"] += a["in_use"] * a["slot_size"]
                pool["bytes"] += a["slots"] * a["slot_size"]
            if dt and s.name in before:
                freed = (a["frees"] - before[s.name][0]) % _RING
                pool["frees_per_s"] = (pool["frees_per_s"] or 0) + freed / dt
                if not a["tickets"]:
                    pool["bytes_per_s"] = (pool["bytes_per_s"] or 0) + freed * a["slot_size"] / dt
    for pool in pools.values():
        pool["holders"] = _live(pool["holders"])
    return {
        "time": time.time(),
        "interval": dt,
        "queues": queues,
        "streams": streams,
        "pools": sorted(pools.values(), key=lambda p: p["owner"]),
        "unreadable": unreadable,
        "_taken": now,
        "_counters": counters,
    }


def top(interval: float = 1.0, once: bool = False, as_json: bool = False, out: TextIO | None = None) -> int:
    """Run ``zctipc top``: redraw a frame every interval seconds on a
    terminal (plain ANSI: clear and redraw), or print one after another
    elsewhere, until Ctrl-C; with once or as_json, print one frame, with
    rates over interval, and return."""
    out = out or sys.stdout
    try:
        if once or as_json:
            first = sample()
            time.sleep(interval)
            one = sample(first)
            out.write(json.dumps(_public(one), indent=2) + "\n" if as_json else _render(one, None))
            out.flush()
            return 0
        tty = out.isatty()
        frame: dict[str, Any] | None = None
        while True:
            frame = sample(frame)
            width = shutil.get_terminal_size().columns if tty else None
            text = _render(frame, width)
            out.write("\x1b[H\x1b[2J" + text if tty else text + "\n")
            out.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        _quiet_stdout()
        return 0


def _public(frame: dict[str, Any]) -> dict[str, Any]:
    """A frame without its private counters."""
    return {k: v for k, v in frame.items() if not k.startswith("_")}


def _render(frame: dict[str, Any], width: int | None) -> str:
    """A frame as text; lines cut at width when it is given."""
    when = time.strftime("%H:%M:%S", time.localtime(frame["time"]))
    lines = [
        f"zctipc top {when}: {_plural(len(frame['queues']), 'queue')}, {_plural(len(frame['streams']), 'stream')}, "
        f"{_plural(len(frame['pools']), 'pool')}"
        + ("" if frame["interval"] is None else f" (rates over {frame['interval']:.1f} s)"),
        "",
    ]
    rows: list[tuple[str, ...]] = [("NAME", "KIND", "DEPTH", "RATE", "BYTES/S", "HELD", "HOLDERS")]
    for q in frame["queues"]:
        limit = "-" if q["max_messages"] is None else str(q["max_messages"])
        depth = f"{q['messages']}/{limit} msgs, {_size(q['ring_bytes_used'])}"
        if not q["unbounded"]:
            depth += f"/{_size(q['ring_bytes'])}"
        rate = "-" if q["puts_per_s"] is None else f"in {q['puts_per_s']:.0f}/s out {q['gets_per_s']:.0f}/s"
        rows.append(
            ("  " + q["name"], "queue", depth, rate, _rate(q["bytes_per_s"]), _size(q["held"]), _pids(q, "creator_pid"))
        )
    for s in frame["streams"]:
        behind = "-" if s["frames_behind"] is None else str(s["frames_behind"])
        depth = f"{behind}/{s['frames']} frames of {s['frame']}"
        rate = "-" if s["frames_per_s"] is None else f"{s['frames_per_s']:.0f} frames/s"
        if s["ended"]:
            rate += " (ended)"
        rows.append(
            (
                "  " + s["name"],
                "stream",
                depth,
                rate,
                _rate(s["bytes_per_s"]),
                _size(s["held"]),
                _pids(s, "creator_pid"),
            )
        )
    for p in frame["pools"]:
        depth = f"{p['slots_in_use']}/{p['slots']} slots, {_size(p['bytes_in_use'])}"
        rate = "-" if p["frees_per_s"] is None else f"{p['frees_per_s']:.0f} frees/s"
        name = f"  pool of pid {p['owner']}" + ("" if p["owner_alive"] else " (exited)")
        rows.append(
            (name, f"{p['arenas']} arenas", depth, rate, _rate(p["bytes_per_s"]), _size(p["held"]), _pids(p, "owner"))
        )
    if len(rows) == 1:
        lines.append("no queue, stream or pool")
    else:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += [f"{u['name']} cannot be read: {u['error']}" for u in frame["unreadable"]]
    if width:
        lines = [ln[:width] for ln in lines]
    return "\n".join(lines) + "\n"


def _live(pids: Iterable[int]) -> list[int]:
    """The pids of live processes among pids, but this one's, in order (a
    reader slot or a lock may name a process that died)."""
    return sorted(p for p in set(pids) if p != os.getpid() and os.path.exists(f"/proc/{p}"))


def _pids(row: dict[str, Any], creator: str) -> str:
    """The holders of a row, its creator (or owner) marked."""
    marked = [f"{p}*" if p == row[creator] else str(p) for p in row["holders"]]
    return ",".join(marked) or "-"


def _mappers(census: Iterable[tensor.SegmentInfo]) -> dict[str, set[int]]:
    """For each segment of census, the live processes of this user that map
    it (from /proc/PID/maps: a file by its inode, a memfd by its name)."""
    shm = os.environ.get("ZCTIPC_SHM_DIR") or "/dev/shm"
    by_inode: dict[int, str] = {}
    by_memfd: dict[str, str] = {}
    for s in census:
        if s.name.startswith("zctipc-fd-"):
            by_memfd["/memfd:" + s.name] = s.name
            continue
        try:
            by_inode[os.lstat(os.path.join(shm, s.name)).st_ino] = s.name
        except OSError:
            pass
    found: dict[str, set[int]] = {}
    uid = os.getuid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/maps") as f:
                text = f.read()
        except OSError:
            continue  # gone, or not ours to read
        if "zctipc" not in text:
            continue
        for line in text.splitlines():
            if "zctipc" not in line:
                continue
            fields = line.split(maxsplit=5)
            if len(fields) < 6:
                continue
            path = fields[5].removesuffix(" (deleted)")
            name = by_memfd.get(path) if path.startswith("/memfd:") else by_inode.get(int(fields[4]))
            if name is not None and os.path.basename(path).startswith(("zctipc", "memfd:zctipc")):
                found.setdefault(name, set()).add(int(entry))
    return found


def _resident(name: str) -> int | None:
    """The bytes of memory a segment file holds (as zctipc ls says)."""
    try:
        return os.lstat(os.path.join(os.environ.get("ZCTIPC_SHM_DIR") or "/dev/shm", name)).st_blocks * 512
    except OSError:
        return None


# -- tail ----------------------------------------------------------------------


def tail(name: str, n: int | None = None, follow: bool = True, out: TextIO | None = None) -> int:
    """Run ``zctipc tail NAME``: print the messages of queue name, or the
    frames of stream name, as they pass, taking none (Note [observing takes
    nothing]), until n were printed, the stream ends (0), nothing more is
    there now (without follow, 0), or nobody else holds it any more (1).
    A name that is no queue or stream: a message on stderr, and 1."""
    out = out or sys.stdout
    lib = native.lib()
    ffi = native.ffi()
    info = ffi.new("zct_info *")
    # A NUL would end the name early in C (tail another segment), and a name
    # that is not UTF-8 (argv's bytes) cannot be passed at all.
    if "\x00" in name:
        return _fail(f"no queue or stream named {name!r}: a name holds no NUL character")
    try:
        encoded = name.encode()
    except UnicodeEncodeError:
        return _fail(f"no queue or stream named {name!r}: a name is UTF-8 (zctipc ls lists them)")
    status = lib.zct_segment_stat(encoded, info)
    if status != 0:
        return _fail(f"no queue or stream named {name!r}: {native.error(status)} (zctipc ls lists them)")
    full = ffi.string(info.name).decode()
    watcher: _Watcher
    try:
        if info.kind == lib.ZCT_KIND_QUEUE:
            watcher = _QueueWatcher(full)
        elif info.kind == lib.ZCT_KIND_STREAM:
            watcher = _StreamWatcher(full)
        else:
            kind = {lib.ZCT_KIND_TENSOR: "tensor", lib.ZCT_KIND_TABLE: "table", lib.ZCT_KIND_ARENA: "pool arena"}
            what = kind.get(info.kind, "segment")
            return _fail(f"{full} is a {what}, not a queue or stream (zctipc ls lists them)")
    except errors.ZctipcError as exc:
        return _fail(f"cannot watch {full}: {exc}")
    try:
        return watcher.run(n, follow, out)
    except errors.ZctipcError as exc:
        return _fail(f"cannot go on watching {full}: {exc}")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    finally:
        watcher.close()


def _fail(message: str) -> int:
    print(f"zctipc tail: {message}", file=sys.stderr)
    return 1


def _quiet_stdout() -> None:
    """After a reader of stdout went (zctipc tail | head): let nothing more
    be written there, not even at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


class _Watcher:
    """What tail watches: a queue or a stream, attached with a count of
    tail's own."""

    name: str
    noun: str  # what it passes: "message" or "frame"

    def next(self) -> tuple[int, str | None, int]:
        """Look once, without waiting: (status, the line of what was read,
        how many passed before they could be read). A status of 0 without
        a line asks to look again at once."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def run(self, n: int | None, follow: bool, out: TextIO) -> int:
        """Print what passes until n were printed, the end, or nobody else
        holds it."""
        shown = 0
        pause = _POLL_FIRST
        looked = time.monotonic()
        while n is None or shown < n:
            status, line, missed = self.next()
            if missed:
                out.write(f"... {_plural(missed, self.noun)} passed before tail could read them\n")
            if line is not None:
                shown += 1
                out.write(line + "\n")
                out.flush()
                pause = _POLL_FIRST
                continue
            out.flush()
            if status == 0:
                continue
            if status == native.E_ENDED:
                out.write(f"the stream {self.name} ended\n")
                return 0
            if status != native.E_EMPTY:
                native.check(status)
            if not follow:
                return 0
            if time.monotonic() - looked >= _LIVENESS_EVERY:
                looked = time.monotonic()
                if not self._held_by_others():
                    return _fail(f"nobody else holds {self.name} any more: its producers and consumers are gone")
            time.sleep(pause)
            pause = min(pause * 2, _POLL_LAST)
        return 0

    def _held_by_others(self) -> bool:
        """Whether a count other than tail's holds the segment."""
        info = native.ffi().new("zct_info *")
        status = native.lib().zct_segment_stat(self.name.encode(), info)
        return status == 0 and info.refcount > 1


class _QueueWatcher(_Watcher):
    noun = "message"

    def __init__(self, name: str) -> None:
        # Here, not at import: records brings the pickler, which no other
        # command of the CLI needs (some 7 ms of every one's start).
        from ._wire import records

        ffi, lib = native.ffi(), native.lib()
        handle = ffi.new("zct_handle *")
        native.check(lib.zct_queue_attach(name.encode(), 0, handle))
        self.handle = handle[0]
        self.name = name
        self.cursor = ffi.new("uint64_t *", lib.ZCT_PEEK_OLDEST)
        self.missed = ffi.new("uint64_t *")
        self.count = 0
        # A peek fills what a get fills; the record types come with it.
        self.scratch = records.Scratch()
        self.kinds = {
            records.PICKLE: "pickle",
            records.TENSOR: "tensor",
            records.BYTES: "bytes",
            records.INLINE: "inline",
        }

    def next(self) -> tuple[int, str | None, int]:
        ffi, lib = native.ffi(), native.lib()
        s = self.scratch
        cursor = self.cursor[0]
        status = lib.zct_queue_peek(self.handle, self.cursor, s.buf, s.cap, *s.get_args(), self.missed)
        missed = self.missed[0]
        if status == native.E_RANGE:
            need, nviews = s.plen[0], s.nviews[0]
            if need <= MAX_RECORD:
                s.resize(max(s.cap, need), max(s.vcap, nviews))
                return 0, None, missed
            # Too large to show: passed over without a copy.
            native.check(lib.zct_queue_peek(self.handle, self.cursor, ffi.NULL, 0, *s.get_args(), self.missed))
            self.count += 1
            missed += self.missed[0]
            return (
                0,
                f"#{self.count} a record of {_size(need)} with {_plural(nviews, 'array')}: too large to show",
                missed,
            )
        if status != 0:
            if status != native.E_EMPTY and self.cursor[0] != cursor:
                # A record that does not decode: said, and passed.
                self.count += 1
                return 0, f"#{self.count} cannot be read: {native.error(status)}", missed
            return status, None, missed
        self.count += 1
        typ, off, plen, nviews = s.typ[0], s.off[0], s.plen[0], s.nviews[0]
        kind = self.kinds.get(typ, f"type {typ}")
        try:
            if kind == "inline":  # its array, as the library decoded it: no ref to build
                obj = exports.build_inline(s.mem, s.vbuf, 0)
            else:
                obj = _decode(s.mem, kind, off, plen, _build_all(s.views, nviews))
            text = summarize(obj)
        except Exception as exc:  # whatever the bytes hold, tail goes on
            text = f"(cannot be shown: {type(exc).__name__}: {exc})"
        return status, _cut(f"#{self.count} {kind}: {text}"), missed

    def close(self) -> None:
        native.finalize("zct_queue_close", self.handle, "closing a queue tail watched")


class _StreamWatcher(_Watcher):
    noun = "frame"

    def __init__(self, name: str) -> None:
        ffi, lib = native.ffi(), native.lib()
        handle = ffi.new("zct_handle *")
        info = ffi.new("zct_stream_info *")
        native.check(lib.zct_stream_attach(name.encode(), handle, info))
        self.handle = handle[0]
        self.name = name
        self.code = info.dtype
        shape = tuple(info.shape[0 : info.ndim])
        self.frame = np.empty(shape, dtypes.storage_dtype(self.code))
        self.buf = ffi.from_buffer(self.frame)
        self.position = ffi.new("uint64_t *", lib.ZCT_PEEK_LATEST)

    def next(self) -> tuple[int, str | None, int]:
        lib = native.lib()
        wanted = self.position[0]
        status = lib.zct_stream_peek(self.handle, self.position, self.buf, self.frame.nbytes)
        if status != 0:
            return status, None, 0
        got = self.position[0]
        missed = 0 if wanted == lib.ZCT_PEEK_LATEST else got - wanted
        self.position[0] = got + 1
        return status, _cut(f"frame {got}: {_array_summary(self.frame, self.code)}"), missed

    def close(self) -> None:
        native.finalize("zct_stream_close", self.handle, "closing a stream tail watched")


# -- what a message holds ----------------------------------------------------


def _decode(mem: memoryview, kind: str, off: int, plen: int, built: list[Any]) -> Any:
    """The object of a peeked record of kind ("bytes", "tensor", "pickle")
    whose payload is mem[off:off+plen], with its arrays built (_build_all)
    (the caller builds an inline array)."""
    if kind == "bytes":
        return bytes(mem[off : off + plen])
    if kind == "tensor":
        return built[0]
    return _Unpickler(io.BytesIO(mem[off : off + plen]), built).load()


class _Gone:
    """An array whose memory every holder let go before tail attached it."""

    def __init__(self, view: Any) -> None:
        self.what = f"{dtypes.NAMES.get(view.dtype, '?')}{list(view.shape[0 : view.ndim])}"

    def __repr__(self) -> str:
        return f"{self.what} (let go before tail could read it)"


def _build_all(views: Any, n: int) -> list[Any]:
    """The arrays, tensors or SharedTensors of the first n views, each
    holding its view's ref (a _Gone for a view without one). When one
    cannot be built, the refs of those not built yet are released."""
    built: list[Any] = []
    ffi = native.ffi()
    vbuf, size = ffi.buffer(views), ffi.sizeof("zct_view")
    try:
        for i in range(n):
            built.append(exports.build(vbuf, i * size) if views[i].ref else _Gone(views[i]))
    except BaseException:
        for i in range(len(built) + 1, n):
            if views[i].ref:
                memory.release_ref(views[i].ref)
        raise
    return built


class _Unpickler(pickle.Unpickler):
    """Unpickles a queue message with an allowlist (Note [unpickling what
    passes]), its arrays from the views tail attached."""

    def __init__(self, file: io.BytesIO, built: list[Any]) -> None:
        super().__init__(file)
        self.built = built
        self.budget = _BUDGET

    def _rebuild(self, index: int, requires_grad: bool = False) -> Any:
        return self.built[index]

    def _rebuild_storage(self, index: int) -> Any:
        obj = self.built[index]
        return obj if isinstance(obj, _Gone) else obj.untyped_storage()

    def _bounded(self, make: Callable[..., Any]) -> Callable[..., Any]:
        """make, charging the length of each argument (an int for bytes and
        bytearray) to the message's budget (Note [a pickle's budget])."""

        def bounded(*args: Any) -> Any:
            for a in args:
                n = a if isinstance(a, int) and make in (bytes, bytearray) else len(a) if hasattr(a, "__len__") else 0
                self.budget -= max(n, 0)
            if self.budget < 0:
                raise pickle.UnpicklingError("a message that builds more than tail shows")
            return make(*args)

        return bounded

    def find_class(self, module: str, name: str) -> Any:
        # Note [pickles of protocols 0 to 2]: they name Python 2's modules
        # (__builtin__.set, copy_reg._reconstructor), which pickle's own
        # find_class maps to Python 3's before it imports. So does tail,
        # before its allowlist: a protocol 3 or later pickle never names a
        # module that the mapping renames (none of them exists in Python 3).
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if (module, name) in _BOUNDED:
            return self._bounded(super().find_class(module, name))
        if (module, name) == ("fractions", "Fraction"):
            return _fraction
        if (module, name) == ("_codecs", "encode"):  # bytes in protocols 0 to 2
            return self._bounded(_latin1)
        if module == "zctipc._wire.pickler" and name == "_rebuild":
            return self._rebuild
        if module == "zctipc._wire.pickler" and name == "_rebuild_storage":
            return self._rebuild_storage
        if name in _ALLOWED.get(module, ()) or (module == "numpy.dtypes" and name.endswith("DType")):
            try:
                return super().find_class(module, name)
            except (ImportError, AttributeError):
                pass
        if module == "torch" and "torch" in sys.modules:
            value = getattr(sys.modules["torch"], name, None)
            torch = sys.modules["torch"]
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        return _stand_in(module, name)


# Note [a pickle's budget]: unpickling takes time and memory in proportion
# to the pickle's bytes, but for the allowed callables that build from an
# argument: list(range(10**12)), bytearray(1 << 40), or a million calls of
# set(L) on one large list L (each a few bytes of pickle). Each such call
# charges the length of its arguments to a budget of the message's, and
# past it the message is not shown. Fraction takes only its own pickled
# form, "n/d" (Fraction("1e999999999") computes 10**999999999).

#: The elements the allowed callables of one message may build from their
#: arguments.
_BUDGET = 1 << 22

_BOUNDED = {("builtins", name) for name in ("set", "frozenset", "bytearray", "bytes", "list", "dict", "tuple")} | {
    ("collections", name) for name in ("OrderedDict", "deque", "defaultdict", "Counter")
}


def _fraction(*args: Any) -> Any:
    """fractions.Fraction for its pickled form only (Note [a pickle's budget])."""
    import fractions
    import re

    if not all(isinstance(a, int) or isinstance(a, str) and re.fullmatch(r"-?[0-9]+(/[0-9]+)?", a) for a in args):
        raise pickle.UnpicklingError("a Fraction that is not pickled so")
    return fractions.Fraction(*args)


def _latin1(text: str, encoding: str) -> bytes:
    """_codecs.encode as protocols 0 to 2 pickle bytes with it, and no
    other codec (Note [pickles of protocols 0 to 2])."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("a _codecs.encode that is not pickled bytes")
    return text.encode("latin-1")


# The globals tail's unpickler finds as themselves: value types whose
# rebuilding runs no code of the sender's and opens nothing.
_ALLOWED: dict[str, tuple[str, ...]] = {
    "builtins": (
        "set",
        "frozenset",
        "bytearray",
        "complex",
        "slice",
        "range",
        "list",
        "dict",
        "tuple",
        "int",
        "float",
        "str",
        "bytes",
        "bool",
        "object",
    ),
    "copyreg": ("_reconstructor",),
    "collections": ("OrderedDict", "deque", "defaultdict", "Counter"),
    "datetime": ("date", "time", "datetime", "timedelta", "timezone"),
    "decimal": ("Decimal",),
    "fractions": ("Fraction",),
    "uuid": ("UUID", "SafeUUID"),
    "pathlib": ("PurePath", "PurePosixPath", "PosixPath", "Path"),
    "pathlib._local": ("PurePath", "PurePosixPath", "PosixPath", "Path"),
    "numpy": ("dtype", "ndarray"),
    "numpy.core.multiarray": ("_reconstruct", "scalar"),
    "numpy._core.multiarray": ("_reconstruct", "scalar"),
    "numpy.core.numeric": ("_frombuffer",),
    "numpy._core.numeric": ("_frombuffer",),
    "torch": ("Size", "device"),
    "zctipc._wire.exports": ("rebuild_in_band",),
    "zctipc._wire.storages": ("rebuild_tensor", "rebuild_empty"),
    "zctipc._wire.reductions": ("rebuild_sparse",),
    "zctipc._wire.tables": ("rebuild_table",),
}


_STAND_INS: dict[tuple[str, str], type[_StandIn]] = {}


class _StandIn:
    """What tail's unpickler makes of a global it does not allow: the name,
    and what it was called or set up with (Note [unpickling what passes])."""

    _global = "?"
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    state: Any
    items: list[Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> _StandIn:
        self = object.__new__(cls)
        self.args, self.kwargs, self.state, self.items = args, kwargs, None, []
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items.append((key, value))

    def append(self, item: Any) -> None:
        self.items.append(item)

    def extend(self, items: Iterable[Any]) -> None:
        self.items.extend(items)


def _stand_in(module: str, name: str) -> type[_StandIn]:
    key = (module, name)
    cls = _STAND_INS.get(key)
    if cls is None:
        cls = _STAND_INS[key] = type(name, (_StandIn,), {"_global": f"{module}.{name}"})
    return cls


def summarize(obj: Any, width: int = WIDTH) -> str:
    """A line about obj for tail: arrays and tensors as dtype[shape] and a
    summary of a sample of their elements, containers item by item, other
    objects as a short repr; at most width characters."""
    return _cut(_describe(obj, 0), width)


def _describe(obj: Any, depth: int) -> str:
    """obj as summarize says, for a container at depth."""
    if isinstance(obj, str | int | float | bool | type(None)):
        return _cut(repr(obj), 80)
    if isinstance(obj, bytes | bytearray):
        return f"{type(obj).__name__}[{len(obj)}] {_cut(repr(bytes(obj[:48])), 60)}"
    if depth >= 3:
        return "..."
    if isinstance(obj, dict):
        items = [f"{_describe(k, depth + 1)}: {_describe(v, depth + 1)}" for k, v in list(obj.items())[:8]]
        return "{" + ", ".join(items) + (", ..." if len(obj) > 8 else "") + "}"
    if isinstance(obj, slice):  # its parts may be anything (slice(L, L, L))
        ends = [_describe(end, depth + 1) for end in (obj.start, obj.stop, obj.step)]
        return f"slice({', '.join(ends)})"
    if isinstance(obj, collections.deque):  # its repr has no bound (a deque of a memo bomb)
        return f"deque({_describe(list(itertools.islice(obj, 9)), depth)})"
    if isinstance(obj, list | tuple | set | frozenset):
        items = [_describe(v, depth + 1) for v in list(obj)[:8]]
        more = ", ..." if len(obj) > 8 else ""
        if isinstance(obj, list):
            return "[" + ", ".join(items) + more + "]"
        if isinstance(obj, tuple):
            return "(" + ", ".join(items) + more + ("," if len(obj) == 1 else "") + ")"
        return f"{type(obj).__name__}({{" + ", ".join(items) + more + "})"
    if isinstance(obj, _StandIn):
        parts = [_describe(a, depth + 1) for a in obj.args[:6]]
        parts += [f"{k}={_describe(v, depth + 1)}" for k, v in list(obj.kwargs.items())[:6]]
        text = f"<{obj._global}" + (f"({', '.join(parts)})" if parts else "")
        if obj.state is not None:
            text += " " + _describe(obj.state, depth + 1)
        if obj.items:
            text += " " + _describe(obj.items, depth + 1)
        return text + ">"
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.ndarray):
        return _array_summary(obj)
    if torch is not None and isinstance(obj, torch.Tensor):
        return _tensor_summary(obj)
    if isinstance(obj, tensor.SharedTensor):
        return f"SharedTensor {obj.name} {_array_summary(obj.numpy())}"
    if hasattr(obj, "num_rows") and hasattr(obj, "num_columns"):  # an Arrow table or batch
        return f"{type(obj).__module__}.{type(obj).__name__} of {obj.num_rows} rows, {obj.num_columns} columns"
    try:
        return _cut(repr(obj), 120)
    except Exception as exc:  # a repr that fails says so
        return f"<{type(obj).__name__}: repr failed: {exc}>"


def _tensor_summary(t: Any) -> str:
    """A torch tensor as dtype[shape] and a summary of its first elements."""
    import torch

    t = t.detach()
    what = f"torch.{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
    if t.device.type != "cpu":
        return f"{what} on {t.device}"
    if t.dtype == torch.bfloat16:
        return f"{what} {_stats(t.view(torch.int16).numpy(), dtypes.BFLOAT16)}"
    try:
        arr = t.numpy()
    except (TypeError, RuntimeError):
        return what
    return f"{what} {_stats(arr, None)}"


def _array_summary(arr: NDArray[Any], code: int | None = None) -> str:
    """A NumPy array as dtype[shape] and a summary of its first elements
    (code: its zctipc dtype, for bfloat16 held as its bits)."""
    name = dtypes.NAMES[code] if code is not None else str(arr.dtype)
    return f"{name}{list(arr.shape)} {_stats(arr, code)}".rstrip()


def _stats(arr: NDArray[Any], code: int | None) -> str:
    """min, max and mean of the first SAMPLE elements of arr (bfloat16 when
    code says so, held as its bits), and how many were NaN."""
    head = np.asarray(arr.flat[:SAMPLE])
    if head.size == 0:
        return "(empty)"
    if code == dtypes.BFLOAT16:
        head = (head.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)
    kind = head.dtype.kind
    if kind == "c":
        return f"mean={complex(head.mean()):.4g}" + _of(arr, head)
    if kind not in "biuf":
        return ""
    values = head.astype(np.float64)
    nan = int(np.isnan(values).sum()) if kind == "f" else 0
    if nan == values.size:
        return f"all {nan} NaN" + _of(arr, head)
    if nan:
        values = values[~np.isnan(values)]
    if kind == "f":
        text = f"min={values.min():.4g} max={values.max():.4g} mean={values.mean():.4g}"
    else:  # integers exactly
        text = f"min={head.min():d} max={head.max():d} mean={values.mean():.4g}"
    if nan:
        text += f" nan={nan}"
    return text + _of(arr, head)


def _of(arr: NDArray[Any], head: NDArray[Any]) -> str:
    """Says when the summary is of a sample rather than every element."""
    return f" (of the first {head.size})" if head.size < arr.size else ""


# -- formatting ------------------------------------------------------------------


def _cut(text: str, width: int = WIDTH) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _rate(n: float | None) -> str:
    return "-" if n is None else _size(n) + "/s"
