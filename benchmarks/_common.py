"""What every zctipc benchmark shares: the machine it ran on, the versions of
the peers, statistics, and Markdown tables."""

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import stat
import statistics
import tempfile
import time
import types


def machine():
    """CPU, cores, memory, kernel and /dev/shm size of this machine."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(line.split()[1] for line in f if line.startswith("MemTotal"))) * 1024
    except (OSError, StopIteration):
        pass
    shm = os.statvfs("/dev/shm")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem / 2**30, 1),
        "kernel": platform.release(),
        "dev_shm_gib": round(shm.f_blocks * shm.f_frsize / 2**30, 1),
        "python": platform.python_version(),
    }


def versions(*packages):
    out = {}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def new_report(name, packages, **fields):
    """A benchmark's report: its name, when and where it ran, the versions
    of packages, then fields (its result lists, in order)."""
    return {"benchmark": name, "date": now(), "machine": machine(), "versions": versions(*packages), **fields}


def latency_cells(stats, base_us):
    """A latency row's cells from summarize()'s stats: median, p99, rounds,
    and the median as a ratio to base_us."""
    return [
        fmt_us(stats["median_us"]),
        fmt_us(stats["p99_us"]),
        stats["rounds"],
        fmt_ratio(stats["median_us"] / base_us),
    ]


def summarize(samples_ns):
    """Median and 99th percentile of samples in nanoseconds, in microseconds."""
    ordered = sorted(samples_ns)
    p99 = ordered[min(len(ordered) - 1, max(0, int(round(0.99 * (len(ordered) - 1)))))]
    return {"median_us": statistics.median(ordered) / 1e3, "p99_us": p99 / 1e3, "rounds": len(ordered)}


def fmt_us(us):
    """A duration given in microseconds, in the unit that reads best."""
    if us is None:
        return "-"
    if us < 1000:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.1f} ms"
    return f"{us / 1e6:.2f} s"


def fmt_ratio(x):
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}x"
    return f"{x:.1f}x"


def fmt_bytes(n):
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def markdown_table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_line(m):
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB memory, Linux {m['kernel']}, "
        f"/dev/shm {m['dev_shm_gib']} GiB, Python {m['python']}"
    )


def readme_block(path, section):
    """(text, start, stop) of the file at path, whose one <!-- BEGIN section
    --> ... <!-- END section --> block is text[start:stop]; ValueError,
    saying what is wrong, for a file that cannot be read or written or has
    no such block, or more than one, or its END before its BEGIN."""
    begin, end = f"<!-- BEGIN {section} -->", f"<!-- END {section} -->"
    if not os.path.exists(path):
        raise ValueError(f"there is no file {path}")
    if not os.path.isfile(path):
        raise ValueError(f"{path} is not a file")
    if not os.access(path, os.W_OK) or not os.stat(path).st_mode & 0o222:  # root may write anything: ask its mode
        raise ValueError(f"{path} is read-only")
    folder = os.path.dirname(os.path.realpath(path))
    if not os.access(folder, os.W_OK | os.X_OK):  # the new text goes to a file beside it first
        raise ValueError(f"the folder of {path}, {folder}, is not writable")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} cannot be read: {exc}") from None
    counts = {marker: text.count(marker) for marker in (begin, end)}
    if not counts[begin] and not counts[end]:
        raise ValueError(f"{path} has no {begin} ... {end} block to write")
    for marker, n in counts.items():
        if n != 1:
            raise ValueError(f"{path} has {n} {marker} markers; it must have one {begin} and one {end}")
    if text.index(end) < text.index(begin):
        raise ValueError(f"{path} has its {end} before its {begin}")
    return text, text.index(begin) + len(begin), text.index(end)


def update_readme(path, section, text, by):
    """Put text, which the command by made, between the <!-- BEGIN section -->
    and <!-- END section --> markers of the file at path, and nothing else
    of it changes: the file is whole, with the old block or the new one,
    whatever happens (readme_block's ValueError, an OSError, an interrupt)."""
    readme, start, stop = readme_block(path, section)
    write_file(path, readme[:start] + f"\n<!-- generated by {by}; do not edit -->\n\n" + text + "\n\n" + readme[stop:])
    print(f"updated {path}")


def write_file(path, text):
    """Write text to the file at path (the file a link at path points to)
    whole or not at all: into a file beside it, renamed over it, with the
    old file's permissions."""
    path = os.path.realpath(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


# Note [an interrupted run]: Ctrl-C reaches every process of the terminal's
# group, but a SIGINT sent to zctipc bench alone (kill -INT, a supervisor)
# or a SIGTERM reaches only it: its children, blocked on a pipe or a queue
# whose other end it holds, would wait for ever, and so would it at exit,
# joining them (multiprocessing's atexit). So zctipc bench stops every
# process it started, however deep (forkserver's children, a DataLoader's
# workers, Go producers), before it exits: SIGTERM, then SIGKILL for those
# still there after a few seconds; their segments are swept by the cleanup
# daemon (which runs in a session of its own and is left alone), and its
# own go at its exit. multiprocessing's resource tracker ignores both
# signals and ends when this process does.


@contextlib.contextmanager
def interruptible(grace=5.0):
    """A block that SIGINT or SIGTERM interrupts: at once, every process
    this one started is stopped (Note [an interrupted run]; before the
    code interrupted runs its finally blocks, which may wait for them),
    then KeyboardInterrupt is raised, and stopped here. The value it gives
    says which signal came (.signal, None until one does) and how many
    processes were stopped (.processes)."""
    state = types.SimpleNamespace(signal=None, processes=0)
    signals = (signal.SIGINT, signal.SIGTERM)

    def interrupt(signum, frame):
        for s in signals:  # a second Ctrl-C does not cut the cleanup short
            signal.signal(s, signal.SIG_IGN)
        state.signal = signal.Signals(signum)
        state.processes = stop_descendants(grace)
        raise KeyboardInterrupt

    old = {s: signal.signal(s, interrupt) for s in signals}
    try:
        yield state
    except KeyboardInterrupt:
        if state.signal is None:  # raised by other means than these signals
            state.signal = signal.SIGINT
            state.processes = stop_descendants(grace)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def descendants():
    """The processes this one started, and theirs, in its session."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, IndexError):
            continue
        if b"multiprocessing.resource_tracker" not in command:
            children.setdefault(int(fields[1]), []).append((int(entry), int(fields[3])))
    found, parents, session = [], [os.getpid()], os.getsid(0)
    while parents:
        for pid, sid in children.get(parents.pop(), []):
            if sid == session:
                found.append(pid)
                parents.append(pid)
    return found


def stop_descendants(grace):
    """SIGTERM every descendant, then SIGKILL those left after grace
    seconds; how many there were."""
    pids = descendants()
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.05)  # an ended child stays a zombie until whoever started it waits for it
    for pid in pids:
        if _running(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return len(pids)


def _running(pid):
    """Whether a process exists and is no zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


#: The PyPI package that brings each module a benchmark imports, where
#: its name differs.
PACKAGES = {"faster_fifo": "faster-fifo", "faster_fifo_reduction": "faster-fifo"}


def install_hint(module):
    """How to get a module a benchmark lacks, in plain words."""
    package = PACKAGES.get(module, module)
    return f"pip install {package} brings it (pip install zctipc[bench] brings every peer; make bench in a source tree)"


def left_out(peer, module):
    """Why a peer cannot be measured (not installed, or named in
    ZCTIPC_BENCH_WITHOUT by the user), or None when it can."""
    if peer in os.environ.get("ZCTIPC_BENCH_WITHOUT", "").split(","):
        return "left out by ZCTIPC_BENCH_WITHOUT"
    try:
        __import__(module)
    except ImportError as exc:
        return f"not installed ({exc}); {install_hint(module.split('.')[0])}"
    return None


def finish(report, text, json_path):
    """Write the report as JSON and print its text."""
    os.makedirs(os.path.dirname(json_path) or ".", exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(report, f, indent=2)
    print()
    print(text)
    print(f"\nJSON: {json_path}")


def arguments(doc, name, suites=None):
    """The command line every suite script shares: --only (of suites),
    --quick, --tiny and --json (results/NAME.json by default)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if suites:
        parser.add_argument(
            "--only",
            type=names_of(list(suites)),
            default=",".join(suites),
            help=f"comma-separated of {', '.join(suites)}",
        )
    parser.add_argument("--quick", action="store_true", help="a short pass")
    parser.add_argument("--tiny", action="store_true", help="the smallest runs: checks that every suite runs")
    parser.add_argument(
        "--json", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"{name}.json")
    )
    return parser


def names_of(names):
    """An argparse type: a comma-separated list of some of names (a list,
    each once), refused when it names none or another."""

    def parse(text):
        chosen = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        if not chosen:
            raise argparse.ArgumentTypeError(f"{text!r} names none of {', '.join(names)}")
        for n in chosen:
            if n not in names:
                raise argparse.ArgumentTypeError(f"unknown {n!r}; the choices are {', '.join(names)}")
        return chosen

    return parse


def positive(kind):
    """An argparse type: a number of kind (int or float) above zero."""

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'a whole number' if kind is int else 'a number'}"
            ) from None
        if not value > 0:  # NaN too
            raise argparse.ArgumentTypeError(f"{text} is not above zero")
        return value

    return parse


class PlainPickling:
    """multiprocessing's own pickling of the given types, for a peer that
    stands for multiprocessing without zctipc: the reducers zctipc registers
    with ForkingPickler (which send big arrays and tensors through shared
    memory) are taken out until close(), or the end of a with block."""

    def __init__(self, *types):
        from multiprocessing.reduction import ForkingPickler

        self._reducers = ForkingPickler._extra_reducers
        self._saved = {t: self._reducers.pop(t) for t in types if t in self._reducers}

    def close(self):
        self._reducers.update(self._saved)
        self._saved = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
