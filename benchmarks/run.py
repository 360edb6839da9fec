"""Every zctipc benchmark in one run, with the physical floor: `zctipc bench`
and `make bench` run this.

Suites (each is also a script of its own in this directory):

  handoff   hand-off latency by size and attach latency      bench_handoff.py
  queue     put+get in one process, small-message rates 1/1   bench_queue.py
            and 4/4, latency asleep and polling, a 1 GiB
            tensor, copy-in against np.copyto, pool allocation,
            ProcessPoolExecutor with zctipc's context
  stream    stream throughput (1, 2, 4 readers) and latency  bench_stream.py
  arrow     Arrow tables, and Go producers                   bench_arrow.py
  gpu       GPU tensor hand-off, where a GPU exists          bench_gpu.py
  ray       actor to actor on one Ray node: zctipc's Ray      bench_ray.py
            transport, the object store, GLOO
  dataloader torch's DataLoader, two workers: large          bench_dataloader.py
            tensors, small items, real work per item;
            fork, forkserver and zctipc's context, each
            in a fresh process

The floor is measured first: the one-way wake latency of a process asleep on
a futex (two processes, the same kernel path zctipc's blocked calls take),
after each pause the latency suites leave between rounds (FLOOR_PAUSES), and
the bandwidth of one core copying memory. Each suite's results are shown as
ratios to its peers (in its own tables) and to the floor.

Peers that are not installed are skipped with the reason printed;
ZCTIPC_BENCH_WITHOUT=peer,peer leaves installed ones out the same way.

    python benchmarks/run.py [--quick | --tiny] [--only SUITE,...] [--json PATH] [--out DIR] [--readme README.md]

The report (Markdown, JSON and plots) goes to --out only; --readme puts a
handful of its numbers, with the machine and a link to the report, between
the README's <!-- BEGIN bench_numbers --> and <!-- END bench_numbers -->
markers (Note [the README's numbers]), written whole or not at all.
Arguments that could fail only after the run (a README without one such
block, or read-only; a report where none can go) are refused before it,
with exit status 2. SIGINT or SIGTERM stops every process the run started
and exits 130 or 143 (Note [an interrupted run] in _common.py).
"""

import argparse
import contextlib
import importlib
import io
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import (
    fmt_bytes,
    fmt_ratio,
    fmt_us,
    install_hint,
    interruptible,
    left_out,
    machine_line,
    markdown_table,
    new_report,
    readme_block,
    summarize,
    update_readme,
    write_file,
)

SUITES = ("handoff", "queue", "stream", "arrow", "gpu", "ray", "dataloader")
MODES = ("full", "quick", "tiny")
PEER_PACKAGES = (
    "zctipc",
    "numpy",
    "torch",
    "pyarrow",
    "pandas",
    "polars",
    "faster-fifo",
    "pythusa",
    "iceoryx2",
    "ray",
    "matplotlib",
)


def suite_argv(suite, mode, json_path):
    """The command line of a suite's script for a mode."""
    argv = {
        "handoff": {
            "full": [],
            "quick": ["--sizes", "1M,100M", "--rounds", "10"],
            "tiny": ["--sizes", "1M", "--rounds", "2"],
        },
        "queue": {"full": [], "quick": ["--quick"], "tiny": ["--tiny"]},
        "stream": {"full": [], "quick": ["--quick"], "tiny": ["--tiny"]},
        "arrow": {"full": [], "quick": ["--quick"], "tiny": ["--tiny"]},
        "gpu": {"full": [], "quick": ["--quick"], "tiny": ["--tiny"]},
        "ray": {"full": [], "quick": ["--quick"], "tiny": ["--tiny"]},
        "dataloader": {"full": [], "quick": ["--quick"], "tiny": ["--tiny"]},
    }[suite][mode]
    return [*argv, "--json", json_path]


def expected_cells(suite, mode):
    """How many result lines a suite prints, for its progress bar."""
    return {
        # Per size, its futex floor's line and one per peer (Ray's among them).
        "handoff": {"full": 24, "quick": 16, "tiny": 8},
        "queue": {"full": 33, "quick": 33, "tiny": 33},
        "stream": {"full": 29, "quick": 29, "tiny": 29},
        "arrow": {"full": 12, "quick": 12, "tiny": 12},
        "gpu": {"full": 8, "quick": 8, "tiny": 8},
        "ray": {"full": 13, "quick": 9, "tiny": 5},
        "dataloader": {"full": 37, "quick": 13, "tiny": 13},
    }[suite][mode]


class Progress(io.TextIOBase):
    """Stands in for stdout while a suite runs: counts the lines it prints
    and redraws one progress line for the suite on a terminal (elsewhere it
    writes one line when the suite ends)."""

    def __init__(self, suite, total, out):
        self.suite, self.total, self.out = suite, max(total, 1), out
        self.tty = hasattr(out, "isatty") and out.isatty()
        self.done, self.last, self.partial, self.start = 0, "", "", time.monotonic()
        self.log = []
        self.draw()

    def write(self, text):
        self.partial += text
        while "\n" in self.partial:
            line, self.partial = self.partial.split("\n", 1)
            self.log.append(line)
            if line[:1].isspace() and line.strip() and not line.strip().startswith("|"):
                self.done += 1
                self.last = line.strip()
            self.draw()
        return len(text)

    def draw(self, final=False):
        if not self.tty:  # a file or a pipe gets each suite's last line only
            if final:
                self.out.write(
                    f"{self.suite:<8} {min(self.done, self.total)}/{self.total} cells in "
                    f"{time.monotonic() - self.start:.1f}s  {self.last[:70]}\n"
                )
                self.out.flush()
            return
        width = 24
        filled = min(width, round(width * self.done / self.total)) if not final else width
        bar = "#" * filled + "." * (width - filled)
        last = self.last[:70]
        self.out.write(
            f"\r{self.suite:<8} [{bar}] {min(self.done, self.total):>3}/{self.total:<3} "
            f"{time.monotonic() - self.start:6.1f}s  {last:<70}"
        )
        if final:
            self.out.write("\n")
        self.out.flush()

    def flush(self):
        pass


def run_suite(suite, mode, out_dir, progress_to):
    """Run a suite's script in this process; return its JSON report."""
    module = importlib.import_module(f"bench_{suite}")
    path = os.path.join(out_dir, f"{suite}.json")
    progress = Progress(suite, expected_cells(suite, mode), progress_to)
    with contextlib.redirect_stdout(progress):
        module.main(suite_argv(suite, mode, path))
    progress.draw(final=True)
    with open(path) as f:
        report = json.load(f)
    report["text"] = module.render(report)
    return report


#: The futex floors measured, by the pause between their rounds: a wake-up
#: after a longer sleep costs more, so each latency is set against the floor
#: of its own pause: one message or frame in flight 1 ms apart (bench_queue,
#: bench_stream), bench_arrow's Go tensor 2 ms apart. (A hand-off, 2 ms apart
#: too, has the floor its suite measured before its size's peers.)
FLOOR_PAUSES = {"futex_wake": 0.001, "futex_wake_2ms": 0.002}


def wake_floor_us(report, key="futex_wake"):
    """The median futex floor of a report, after the pause of key (reports
    made before floors were measured by pause have only futex_wake)."""
    floor = report["floor"]
    return floor.get(key, floor["futex_wake"])["median_us"]


def floor_rows(report):
    """Each suite's headline results as ratios to the floor."""
    wake, wake_2ms = wake_floor_us(report), wake_floor_us(report, "futex_wake_2ms")
    copy = report["floor"]["memcpy_bytes_per_s"]
    rows = []
    suites = report["suites"]
    for r in suites.get("handoff", {}).get("results", []):
        rows.append(
            (
                "handoff",
                f"{r['peer']}, {fmt_bytes(r['bytes'])}",
                fmt_us(r["median_us"]),
                # The floor the suite measured right before the size's peers.
                fmt_ratio(r["median_us"] / r.get("floor_us", wake_2ms)),
            )
        )
    # A message's floor: a pickle, a load and two native calls (bench_queue's
    # message_floor), measured in the queue suite's in-process table.
    message = next((r["floor_us"] for r in suites.get("queue", {}).get("local", []) if r["floor_us"]), None)
    for r in suites.get("queue", {}).get("local", []):
        if r["peer"] == "zctipc.Queue" or r["floor_us"]:
            floor = f"{fmt_ratio(r['per_pair_us'] / r['floor_us'])} a message's" if r["floor_us"] else "-"
            rows.append(
                ("queue", f"{r['peer']} put+get in one process, {r['object']}", fmt_us(r["per_pair_us"]), floor)
            )
    for r in suites.get("queue", {}).get("rate", []):
        per = 1e6 / r["per_second"]
        rows.append(
            (
                "queue",
                f"{r['peer']} {r['producers']}/{r['consumers']}, per message",
                fmt_us(per),
                f"{fmt_ratio(per / message)} a message's" if message else "-",
            )
        )
    for r in suites.get("queue", {}).get("latency", []):
        rows.append(
            (
                "queue",
                f"{r['peer']}, one message in flight (consumer CPU {r['consumer_cpu']:.0%})",
                fmt_us(r["median_us"]),
                fmt_ratio(r["median_us"] / wake),
            )
        )
    for r in suites.get("queue", {}).get("pool", []):
        per = r["seconds"] / r["tasks"] * 1e6
        rows.append(
            (
                "queue",
                f"ProcessPoolExecutor, {r['peer']}, per {fmt_bytes(r['bytes'])} task",
                fmt_us(per),
                f"{fmt_ratio(per / (r['bytes'] / copy * 1e6))} a memcpy",
            )
        )
    for r in suites.get("stream", {}).get("latency", []):
        rows.append(
            (
                "stream",
                f"{r['peer']}, one frame in flight (reader CPU {r['reader_cpu']:.0%})",
                fmt_us(r["median_us"]),
                fmt_ratio(r["median_us"] / wake),
            )
        )
    for r in suites.get("stream", {}).get("throughput", []):
        if r["readers"] == 1:
            rows.append(
                (
                    "stream",
                    f"{r['peer']}, {r['size']} frames, one reader",
                    f"{r['gbit_per_s']:.1f} Gbit/s",
                    f"{100 * r['gbit_per_s'] * 1e9 / 8 / copy:.0f}% of memcpy",
                )
            )
    for r in suites.get("arrow", {}).get("arrow", []):
        memcpy_us = r["nbytes"] / copy * 1e6
        rows.append(
            (
                "arrow",
                f"{r['peer']}, {fmt_bytes(r['nbytes'])} table",
                fmt_us(r["median_us"]),
                f"{fmt_ratio(r['median_us'] / memcpy_us)} a memcpy",
            )
        )
    for r in suites.get("arrow", {}).get("go", []):
        rows.append(
            ("arrow", f"{r['peer']}, 1 MiB tensor", fmt_us(r["median_us"]), fmt_ratio(r["median_us"] / wake_2ms))
        )
    for r in suites.get("arrow", {}).get("rates", []):
        rows.append(
            (
                "arrow",
                f"{r['pair']} {r['producers']}/{r['consumers']}, per message",
                fmt_us(r["per_message_us"]),
                f"{fmt_ratio(r['per_message_us'] / message)} a message's" if message else "-",
            )
        )
    # A DataLoader's batches against one core copying them (each worker
    # copies the batches it stacks; the row without workers is in the
    # suite's own table).
    for r in suites.get("dataloader", {}).get("results", []):
        if r["peer"] != "no workers (num_workers=0)":
            rows.append(
                (
                    "dataloader",
                    f"{r['peer']}, {r['shape']} batches of {r['bytes_per_batch'] / 1e6:.3g} MB",
                    f"{r['bytes_per_s'] / 1e6:,.0f} MB/s ({r['batches_per_s']:,.1f} batches/s)",
                    f"{100 * r['bytes_per_s'] / copy:.0f}% of memcpy",
                )
            )
    # Ray's rows have no physical floor (two actor calls cost milliseconds):
    # they are set against Ray's default, the object store.
    for r in suites.get("ray", {}).get("results", []):
        if r["bytes"]:
            store = next(
                o["median_us"]
                for o in suites["ray"]["results"]
                if o["bytes"] == r["bytes"] and o["transport"] == "object store"
            )
            versus = "-" if r["transport"] == "object store" else f"{fmt_ratio(store / r['median_us'])} faster than it"
            rows.append(
                ("ray", f"{r['transport']}, actor to actor, {fmt_bytes(r['bytes'])}", fmt_us(r["median_us"]), versus)
            )
    return rows


def plots(report, out_dir):
    """PNG plots of the run: latency against size, and throughput bars.
    Returns the files written, or a reason for writing none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"matplotlib is not installed ({exc}); {install_hint('matplotlib')}"
    written = []
    handoff = report["suites"].get("handoff", {}).get("results", [])
    if handoff:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for peer in dict.fromkeys(r["peer"] for r in handoff):
            pts = sorted((r["bytes"], r["median_us"]) for r in handoff if r["peer"] == peer)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=peer)
        ax.axhline(wake_floor_us(report, "futex_wake_2ms"), color="grey", linestyle="--", label="futex wake (floor)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tensor size (bytes)")
        ax.set_ylabel("hand-off latency, median (us)")
        ax.set_title("Hand-off latency by size")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(_save(fig, out_dir, "handoff_latency.png"))
        plt.close(fig)
    bars = [
        (f"{r['peer']} {r['producers']}/{r['consumers']}", r["per_second"] / 1e3)
        for r in report["suites"].get("queue", {}).get("rate", [])
    ]
    stream = [
        (f"{r['peer']} {r['size']} x{r['readers']}", r["gbit_per_s"])
        for r in report["suites"].get("stream", {}).get("throughput", [])
    ]
    for name, data, unit in (
        ("queue_rates.png", bars, "thousand messages/s"),
        ("stream_throughput.png", stream, "Gbit/s"),
    ):
        if not data:
            continue
        fig, ax = plt.subplots(figsize=(8, max(3, 0.3 * len(data) + 1)))
        ax.barh(
            [d[0] for d in data],
            [d[1] for d in data],
            color=["tab:blue" if "zctipc" in d[0] else "tab:gray" for d in data],
        )
        ax.invert_yaxis()
        ax.set_xlabel(unit)
        ax.tick_params(axis="y", labelsize=7)
        fig.tight_layout()
        written.append(_save(fig, out_dir, name))
        plt.close(fig)
    return written


def _save(fig, out_dir, name):
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    return path


def render(report, out_dir):
    """The Markdown report of the whole run, a page of the documentation
    site when it is written to docs/bench (plots linked beside it)."""
    floor = report["floor"]
    lines = [
        "# Benchmark report",
        "",
        f"zctipc benchmarks ({report['mode']} run), {report['date']}, on {machine_line(report['machine'])}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v) + ".",
        "",
        f"Floor, measured in this run: a process asleep on a futex wakes {fmt_us(floor['futex_wake']['median_us'])} "
        f"(p99 {fmt_us(floor['futex_wake']['p99_us'])}) after another wakes it, 1 ms apart"
        + (
            f", {fmt_us(floor['futex_wake_2ms']['median_us'])} (p99 {fmt_us(floor['futex_wake_2ms']['p99_us'])}) "
            "2 ms apart (a hand-off's pause)"
            if "futex_wake_2ms" in floor
            else ""
        )
        + "; one core copies "
        f"{floor['memcpy_bytes_per_s'] / 1e9:.1f} GB/s. Each row below is set against the floor that bounds "
        "it: the futex wake for a hand-off (the one the hand-off suite measured 2 ms apart right before each "
        "size's peers, in the same minutes) or one message or frame in flight (a polling waiter can beat it), "
        "memcpy for copies, streams and DataLoader batches, and for a message's cost a pickle, a load and two "
        "native calls (measured in the queue suite's in-process table); Ray's rows are set against Ray's object "
        "store.",
    ]
    for peer, why in report["skipped"].items():
        lines += ["", f"Skipped {peer}: {why}."]
    rows = floor_rows(report)
    if rows:
        lines += ["", markdown_table(["suite", "result", "value", "vs floor"], rows)]
    if isinstance(report["plots"], str):
        lines += ["", f"No plots: {report['plots']}."]
    else:
        lines += [""] + [f"![{os.path.basename(p)}]({os.path.relpath(p, out_dir)})" for p in report["plots"]]
    for suite, r in report["suites"].items():
        lines += ["", f"## {suite}", "", r["text"]]
    return "\n".join(lines)


# Note [the README's numbers]: the README is a door, and the report is a
# page of the documentation site; the README carries only the few numbers
# below, each a row of the report set beside the usual way of doing the
# same, with the machine and a link to the whole report. They are made from
# the report (make bench writes both), and a test checks that the README's
# block is what this function makes of docs/bench/report.json, so the two
# cannot drift. A row whose suite did not run (a --quick run has no 1 GiB
# hand-off, a machine without Ray no Ray row) is left out.


def _find(rows, **match):
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def _faster(ratio):
    """How zctipc compares, given how many times the other's time is its own."""
    return f"{fmt_ratio(ratio)} faster" if ratio >= 1 else f"{fmt_ratio(1 / ratio)} slower"


def headline(report):
    """The README's numbers: (what, zctipc, the usual way, zctipc is) rows."""
    suites = report["suites"]
    out = []
    handoff = suites.get("handoff", {}).get("results", [])
    ours, theirs = (_find(handoff, peer=p, bytes=1 << 30) for p in ("zctipc.Queue", "multiprocessing.Queue"))
    if ours and theirs:
        out.append(
            (
                "a 1 GiB array handed to another process, put to usable array",
                fmt_us(ours["median_us"]),
                f"{fmt_us(theirs['median_us'])} (multiprocessing.Queue)",
                _faster(theirs["median_us"] / ours["median_us"]),
            )
        )
    rate = suites.get("queue", {}).get("rate", [])
    ours, theirs = (_find(rate, peer=p, producers=1) for p in ("zctipc.Queue put/get", "multiprocessing.Queue put/get"))
    if ours and theirs:
        out.append(
            (
                "small messages (5-tuples), one producer and one consumer",
                f"{ours['per_second'] / 1e3:,.0f} K/s",
                f"{theirs['per_second'] / 1e3:,.0f} K/s (multiprocessing.Queue)",
                _faster(ours["per_second"] / theirs["per_second"]),
            )
        )
    pool = suites.get("queue", {}).get("pool", [])
    ours, theirs = (_find(pool, peer=p) for p in ("zctipc.get_context()", "stdlib fork"))
    if ours and theirs:
        out.append(
            (
                f"ProcessPoolExecutor.map over {ours['tasks']:,} arrays of {fmt_bytes(ours['bytes'])}, two workers",
                fmt_us(ours["seconds"] * 1e6),
                f"{fmt_us(theirs['seconds'] * 1e6)} (the standard library's fork)",
                _faster(theirs["seconds"] / ours["seconds"]),
            )
        )
    loaders = suites.get("dataloader", {}).get("results", [])
    ours = _find(loaders, shape="large", peer="zctipc.get_context()")
    theirs = _find(loaders, shape="large", peer="fork (torch's default)")
    if ours and theirs:
        out.append(
            (
                f"torch DataLoader, two workers, batches of {ours['bytes_per_batch'] / 1e6:.1f} MB",
                f"{ours['batches_per_s']:,.1f} batches/s",
                f"{theirs['batches_per_s']:,.1f} batches/s (torch's default, fork)",
                _faster(ours["batches_per_s"] / theirs["batches_per_s"]),
            )
        )
    ray = suites.get("ray", {}).get("results", [])
    ours, theirs = (_find(ray, transport=p, bytes=1 << 30) for p in ("zctipc", "object store"))
    if ours and theirs:
        out.append(
            (
                "a 1 GiB torch tensor from one Ray actor to another",
                fmt_us(ours["median_us"]),
                f"{fmt_us(theirs['median_us'])} (Ray's object store)",
                _faster(theirs["median_us"] / ours["median_us"]),
            )
        )
    return out


def numbers(report, report_path):
    """The README's block of numbers (Note [the README's numbers]); report_path
    is the report's Markdown, relative to the README."""
    return "\n".join(
        [
            markdown_table(["", "zctipc", "the usual way", "zctipc is"], headline(report)),
            "",
            f"Measured by `zctipc bench` ({report['mode']} run, {report['date']}) on "
            f"{machine_line(report['machine'])}. The whole run, with every peer, the rounds and the physical "
            f"floor, is [the benchmark report]({report_path}).",
        ]
    )


def skipped_peers():
    """Peers left out: not installed, or named in ZCTIPC_BENCH_WITHOUT. The
    suites find the same themselves (left_out), each saying why in its own
    report."""
    out = {}
    for peer in os.environ.get("ZCTIPC_BENCH_WITHOUT", "").split(","):
        if peer.strip():
            out[peer.strip()] = "left out by ZCTIPC_BENCH_WITHOUT"
    for peer, module in (
        ("torch", "torch"),
        ("faster-fifo", "faster_fifo"),
        ("pythusa", "pythusa"),
        ("iceoryx2", "iceoryx2"),
        ("ray", "ray"),
    ):
        why = left_out(peer, module)
        if why and peer not in out:
            out[peer] = why
    return out


#: The modules a suite may import that zctipc bench runs without (each
#: brought by a package of PEER_PACKAGES): a suite that misses one is
#: skipped, naming the package; any other module it misses (its own
#: helpers, zctipc's) is a fault, raised.
OPTIONAL_MODULES = {
    "torch",
    "pyarrow",
    "pandas",
    "polars",
    "faster_fifo",
    "faster_fifo_reduction",
    "pythusa",
    "iceoryx2",
    "ray",
    "matplotlib",
    "psutil",
}

#: The suites the README's numbers come from (headline).
README_SUITES = ("handoff", "queue", "dataloader", "ray")


def missing_package(exc):
    """The top module a ModuleNotFoundError says is not installed, where a
    suite may run without it (OPTIONAL_MODULES), else None."""
    module = (exc.name or "").split(".")[0]
    return module if module in OPTIONAL_MODULES else None


def _check_arguments(parser, args):
    """Refuse, before anything runs, what would fail or do harm after it
    ran: no suite, --readme's README without one numbers block it may
    write, a report where none can be written. Returns the suites."""
    suites = list(dict.fromkeys(s.strip() for s in args.only.split(",") if s.strip()))
    if not suites:
        parser.error(f"--only {args.only!r} names no suite; the suites are {', '.join(SUITES)}")
    for s in suites:
        if s not in SUITES:
            parser.error(f"unknown suite {s!r}; the suites are {', '.join(SUITES)}")
    if args.readme:
        if not set(suites) & set(README_SUITES):
            parser.error(
                f"--readme writes numbers of the {', '.join(README_SUITES[:-1])} and {README_SUITES[-1]} suites, "
                f"and --only {args.only} runs none of them"
            )
        try:
            readme_block(args.readme, "bench_numbers")
        except ValueError as exc:
            parser.error(f"--readme: {exc}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out {args.out} is not a folder")
    if args.json:
        folder = os.path.dirname(os.path.abspath(args.json))
        if os.path.isdir(args.json):
            parser.error(f"--json {args.json} is a folder; give the path of a file")
        if not os.path.isdir(folder):
            parser.error(f"--json {args.json}: there is no folder {folder}")
        if not os.access(folder, os.W_OK | os.X_OK):
            parser.error(f"--json {args.json}: the folder {folder} is not writable")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        parser.error(f"--out {args.out}: {exc.strerror}")
    if not os.access(args.out, os.W_OK | os.X_OK):
        parser.error(f"--out {args.out} is not writable")
    return suites


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="zctipc bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="a short pass (about a minute or two)")
    group.add_argument("--tiny", action="store_true", help="the smallest sizes: checks that every suite runs")
    parser.add_argument("--only", default=",".join(SUITES), help=f"comma-separated suites of {', '.join(SUITES)}")
    parser.add_argument("--json", help="write the whole report as JSON here")
    # In a source tree, benchmarks/results; from an installed package, the
    # current directory's zctipc-bench.
    in_tree = os.path.isfile(os.path.join(HERE, "..", "go.mod"))
    parser.add_argument(
        "--out",
        default=os.path.join(HERE, "results") if in_tree else "zctipc-bench",
        help="folder for the report, JSON and plots",
    )
    parser.add_argument(
        "--readme", help="put a few of the numbers, with a link to the report, in this README's numbers block"
    )
    args = parser.parse_args(argv)
    suites = _check_arguments(parser, args)
    with interruptible() as stopped:  # Note [an interrupted run] in _common
        return _run(args, suites)
    print(
        f"\nzctipc bench: interrupted ({stopped.signal.name}) before the run ended; stopped "
        f"{_count(stopped.processes, 'process', 'es')} it had started; the README is as it was",
        file=sys.stderr,
    )
    return 128 + stopped.signal.value


def _run(args, suites):
    """Run the suites: the report, and the README's numbers when asked."""
    mode = "quick" if args.quick else "tiny" if args.tiny else "full"
    skipped = skipped_peers()
    for peer, why in skipped.items():
        print(f"skipping {peer}: {why}", file=sys.stderr)
    import _floor

    print("floor    measuring a futex wake and a memcpy ...", file=sys.stderr, flush=True)
    rounds = {"full": 2000, "quick": 500, "tiny": 50}[mode]
    report = new_report(
        "all",
        PEER_PACKAGES,
        mode=mode,
        skipped=skipped,
        floor={
            **{key: summarize(_floor.futex_wake_ns(rounds, pause)) for key, pause in FLOOR_PAUSES.items()},
            "memcpy_bytes_per_s": _floor.memcpy_bytes_per_s(),
        },
        suites={},
    )
    for suite in suites:
        try:
            report["suites"][suite] = run_suite(suite, mode, args.out, sys.stderr)
        except ModuleNotFoundError as exc:  # a module the suite imports (torch, pyarrow) is not installed
            module = missing_package(exc)
            if module is None:
                raise
            why = f"it needs {module}, which is not installed; {install_hint(module)}"
            report["skipped"][f"the {suite} suite"] = why
            print(f"\nskipping the {suite} suite: {why}", file=sys.stderr)
    report["plots"] = plots(report, args.out)
    text = render(report, args.out)
    write_file(os.path.join(args.out, "report.md"), text + "\n")
    json_path = args.json or os.path.join(args.out, "report.json")
    write_file(json_path, json.dumps(report, indent=2))
    print(text)
    print(f"\nreport: {os.path.join(args.out, 'report.md')}\nJSON: {json_path}")
    if args.readme:
        if not headline(report):
            print(
                f"zctipc bench: this run made none of the README's numbers (the suites they come from, "
                f"{', '.join(README_SUITES)}, were skipped or made no such rows); {args.readme} is as it was",
                file=sys.stderr,
            )
            return 1
        where = os.path.relpath(os.path.join(args.out, "report.md"), os.path.dirname(os.path.abspath(args.readme)))
        try:
            update_readme(args.readme, "bench_numbers", numbers(report, where), by="zctipc bench --readme")
        except (ValueError, OSError) as exc:
            print(f"zctipc bench: --readme: {exc}; {args.readme} is as it was", file=sys.stderr)
            return 1
    return 0


def _count(n, noun, plural="s"):
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{plural}"


if __name__ == "__main__":
    sys.exit(main())
