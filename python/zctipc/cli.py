"""The command line: ``zctipc ls``, ``zctipc gc``, ``zctipc doctor``, and
``zctipc top`` and ``zctipc tail`` (zctipc.observe) (also ``python -m
zctipc ...``)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

from . import observe, strategy, tensor
from ._core import native as _native

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

# Below this, /dev/shm is too small for real tensors (Docker's default is 64 MB).
SMALL_SHM = 1 << 30


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zctipc", description="Inspect and clean zctipc's shared memory.")
    parser.add_argument("--version", action="version", version=f"zctipc {_native.package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("ls", help="list every zctipc segment of this user, with who holds it")
    ls.add_argument("--json", action="store_true", help="print JSON")
    gc = sub.add_parser("gc", help="remove the segments that no live process holds")
    gc.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    gc.add_argument("--json", action="store_true", help="print JSON")
    doctor = sub.add_parser("doctor", help="check this machine's setup for zctipc (exit status 1 when it warns)")
    doctor.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("bench", help="run every benchmark against its peers (zctipc bench --help)", add_help=False)
    watching = observe.register(sub)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    args = parser.parse_args(argv)
    # Looking must not start the daemon whose state it reports.
    _native.auto_cleanup = False
    return {"ls": _ls, "gc": _gc, "doctor": _doctor, **watching}[args.command](args)


def _resident(name: str) -> int | None:
    """The bytes of memory a segment file holds (its blocks): a sparse
    segment (a queue's ring, a ledger, an arena) is far smaller than its
    apparent size. None when it is gone. The entry itself, never what a
    link in the shm dir points at (anywhere, anyone's): that holds no
    memory there."""
    try:
        return os.lstat(os.path.join(_shm_dir(), name)).st_blocks * 512
    except OSError:
        return None


def _ls(args: argparse.Namespace) -> int:
    segments = tensor.list_segments()
    resident = {s.name: _resident(s.name) for s in segments}
    if args.json:
        print(json.dumps([{**s._asdict(), "resident": resident[s.name]} for s in segments], indent=2))
        return 0
    if not segments:
        print(f"no zctipc segments in {_shm_dir()}")
        return 0
    now = time.time()
    rows = [("NAME", "KIND", "RESIDENT", "SIZE", "DTYPE/SHAPE", "CREATOR", "REFS", "AGE", "HOLDERS")]
    for s in segments:
        held = resident[s.name]
        mem = "-" if held is None else _bytes(held)
        if s.error:
            rows.append((s.name, "?", mem, _bytes(s.file_size), s.error[:60], "-", "-", _age(now - s.created), "-"))
            continue
        # A segment without an error has a shape.
        what = f"{s.dtype}{list(s.shape)}" if s.kind == "tensor" else "-"  # type: ignore[arg-type]
        creator = f"{s.creator_pid} ({'alive' if s.creator_alive else 'exited'})"
        holders = ",".join(map(str, s.holders)) or "-"
        if s.messages:
            holders += f" +{s.messages} in queues"
        rows.append(
            (s.name, s.kind, mem, _bytes(s.file_size), what, creator, str(s.refcount), _age(now - s.created), holders)
        )
    _table(rows)
    total = sum(r for r in resident.values() if r is not None)
    apparent = sum(s.file_size for s in segments)
    print(f"{_count(len(segments), 'segment')}, {_bytes(total)} in memory ({_bytes(apparent)} apparent)")
    return 0


def _gc(args: argparse.Namespace) -> int:
    report = strategy.collect_garbage(dry_run=args.dry_run)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for name in report["ledgers"]:
        print(f"{'would sweep' if args.dry_run else 'swept'} the ledger of a dead process: {name}")
    for r in report["removed"]:
        print(f"{verb} {r['name']} ({r['kind']}, {_bytes(r['size'])}): {r['reason']}")
    swept = report["swept"]
    print(
        f"{verb} {_count(len(report['removed']), 'segment')} ({_bytes(sum(r['size'] for r in report['removed']))}); "
        f"gave up {swept['segments']} segment and {swept['slots']} slot counts of dead processes"
    )
    return 0


def _doctor(args: argparse.Namespace) -> int:
    """Print the machine's setup; exit 1 when something is worth a warning
    (the JSON says so too: "ok")."""
    checks = _diagnose()
    checks["ok"] = not checks["warnings"]
    if args.json:
        print(json.dumps(checks, indent=2))
    else:
        for key, value in checks.items():
            if key not in ("warnings", "ok"):
                print(f"{key + ':':<25}{value}")
        for w in checks["warnings"]:
            print(f"WARNING: {w}")
    return 0 if checks["ok"] else 1


def _bench(argv: list[str]) -> int:
    """Run the benchmarks: $ZCTIPC_BENCHMARKS, else those of the source tree
    this package was installed from, else the copy the wheel carries
    (zctipc/benchmarks). Peers that are not installed (pip install
    zctipc[bench]) and suites whose modules are missing are skipped, with
    the reason."""
    import runpy

    here = os.path.dirname(os.path.abspath(__file__))
    for root in (
        os.environ.get("ZCTIPC_BENCHMARKS"),
        os.path.join(here, "..", "..", "benchmarks"),
        os.path.join(here, "benchmarks"),
    ):
        if root and os.path.isfile(os.path.join(root, "run.py")):
            break
    else:
        print(
            "zctipc bench: no benchmarks found: this installation carries none; set ZCTIPC_BENCHMARKS to "
            "the benchmarks folder of a zctipc source tree",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, os.path.abspath(root))
    run = runpy.run_path(os.path.join(root, "run.py"), run_name="zctipc_bench")
    return run["main"](argv)


def _diagnose() -> dict[str, Any]:
    """What doctor reports, as a dict of readable strings (and a list of
    warnings)."""
    lib = _native.lib()
    ffi = _native.ffi()
    warnings: list[str] = []
    out: dict[str, Any] = {
        "zctipc": _native.package_version(),
        "libzctipc": f"{ffi.string(lib.zct_version()).decode()} (C ABI {lib.zct_abi_version()})",
        "python": sys.version.split()[0],
    }
    shm_dir = _shm_dir()
    try:
        st = os.statvfs(shm_dir)
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        out["shared memory"] = f"{shm_dir}: {_bytes(total)}, {_bytes(free)} free"
        if total < SMALL_SHM:
            warnings.append(
                f"{shm_dir} holds only {_bytes(total)} (Docker's default is 64 MB): large tensors will not fit; "
                "give containers more with docker run --shm-size=8g, or remount it larger"
            )
    except OSError as exc:
        out["shared memory"] = f"{shm_dir}: {exc}"
        warnings.append(f"{shm_dir} cannot be used: {exc}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out["open files limit"] = f"soft {soft}, hard {hard} (RLIMIT_NOFILE)"
    if soft < 4096:
        warnings.append(
            f"the open-files limit is {soft}: the file_descriptor strategy needs one per segment "
            "a process receives at once; raise it with ulimit -n"
        )
    out["huge pages"] = _huge_pages()
    out["huge pages for segments"] = _segment_huge_pages(shm_dir)
    status = strategy.daemon_status()
    if status["running"]:
        s = status["status"]
        out["cleanup daemon"] = (
            f"running, pid {s['pid']}, {len(s['clients'] or [])} processes watched, "
            f"{len(s['memfd_segments'] or [])} memfd segments kept ({status['dir']})"
        )
    else:
        out["cleanup daemon"] = f"not running ({status['dir']}); processes start it when they need it"
    out["sharing strategy"] = status["strategy"]
    out["warnings"] = warnings
    return out


def _shm_dir() -> str:
    """Where segments live: /dev/shm, or ZCTIPC_SHM_DIR where it is set."""
    return os.environ.get("ZCTIPC_SHM_DIR") or "/dev/shm"


def _huge_pages() -> str:
    info: dict[str, str] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info[key] = value.strip()
    except OSError:
        return "unknown"
    text = (
        f"{info.get('HugePages_Total', '0')} reserved, {info.get('HugePages_Free', '0')} free, "
        f"{info.get('Hugepagesize', '?')} each"
    )
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            text += f"; transparent huge pages for shmem: {f.read().strip()}"
    except OSError:
        pass
    return text


def _mount_option(path: str, option: str) -> str | None:
    """The value of a mount option of the file system that holds path (the
    longest mount point above it), or None."""
    value: str | None
    path, best, value = os.path.realpath(path), "", None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 4:
                    continue
                point = fields[1].replace("\\040", " ")
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                    best = point
                    value = dict((o.split("=", 1) + [""])[:2] for o in fields[3].split(",")).get(option)
    except OSError:
        return None
    return value


def _segment_huge_pages(shm_dir: str) -> str:
    """Whether new segments of 2 MiB and more get 2 MiB pages: tmpfs gives
    them with huge=always or within_size, and with huge=advise to zctipc,
    which asks for them (MADV_HUGEPAGE)."""
    mode = _mount_option(shm_dir, "huge") or "never"
    if mode in ("always", "within_size", "advise"):
        return f"yes: {shm_dir} is mounted huge={mode}, and zctipc asks for them on segments of 2 MiB and more"
    return (
        f"no: {shm_dir} is mounted huge={mode}; new large segments fault 4 KiB pages, several times slower "
        f"(mount -o remount,huge=advise {shm_dir} gives them 2 MiB pages)"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _bytes(n: float) -> str:  # type: ignore[return]  # the last unit returns
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _age(seconds: float) -> str:
    seconds = max(0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


if __name__ == "__main__":
    sys.exit(main())
