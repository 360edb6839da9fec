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
    from collections.abc import Callable, Sequence
    from typing import Any

# Below this, /dev/shm is too small for real tensors (Docker's default is 64 MB).
SMALL_SHM = 1 << 30


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    args = parser.parse_args(argv)
    # Looking must not start the daemon whose state it reports.
    _native.auto_cleanup = False
    return commands[args.command](args)


def _parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    """The command line, and the function of each command but bench (whose
    arguments benchmarks/run.py parses); docs/reference/cli.md has a row for
    every command (tests/python/test_docs.py reads them from here)."""
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
    return parser, {"ls": _ls, "gc": _gc, "doctor": _doctor, **watching}


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
    report = _diagnose()
    report["ok"] = not report["warnings"]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in _describe(report):
            print(f"{key + ':':<25}{value}")
        for w in report["warnings"]:
            print(f"WARNING: {w}")
    return 0 if report["ok"] else 1


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
    """What doctor reports, as typed values (numbers, booleans, None for
    what is unknown), and a list of warnings."""
    lib = _native.lib()
    ffi = _native.ffi()
    warnings: list[str] = []
    out: dict[str, Any] = {
        "zctipc": _native.package_version(),
        "libzctipc": {"version": ffi.string(lib.zct_version()).decode(), "abi": lib.zct_abi_version()},
        "python": sys.version.split()[0],
    }
    shm_dir = _shm_dir()
    shm: dict[str, Any] = {"dir": shm_dir, "total": None, "free": None, "error": None}
    try:
        st = os.statvfs(shm_dir)
        shm["total"], shm["free"] = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        if shm["total"] < SMALL_SHM:
            warnings.append(
                f"{shm_dir} holds only {_bytes(shm['total'])} (Docker's default is 64 MB): large tensors will not "
                "fit; give containers more with docker run --shm-size=8g, or remount it larger"
            )
    except OSError as exc:
        shm["error"] = str(exc)
        warnings.append(f"{shm_dir} cannot be used: {exc}")
    out["shared_memory"] = shm
    soft, hard = (None if n == resource.RLIM_INFINITY else n for n in resource.getrlimit(resource.RLIMIT_NOFILE))
    out["open_files"] = {"soft": soft, "hard": hard}  # None: unlimited
    if soft is not None and soft < 4096:
        warnings.append(
            f"the open-files limit is {soft}: the file_descriptor strategy needs one per segment "
            "a process receives at once; raise it with ulimit -n"
        )
    out["huge_pages"] = _huge_pages()
    mode = _mount_option(shm_dir, "huge") or "never"
    out["segment_huge_pages"] = {"enabled": mode in ("always", "within_size", "advise"), "mount_option": mode}
    status = strategy.daemon_status()
    daemon: dict[str, Any] = {"running": bool(status["running"]), "dir": status["dir"]}
    daemon.update(pid=None, clients=None, memfd_segments=None)  # while it does not run
    if status["running"]:
        s = status["status"]
        daemon.update(pid=s["pid"], clients=len(s["clients"] or []), memfd_segments=len(s["memfd_segments"] or []))
    out["cleanup_daemon"] = daemon
    out["sharing_strategy"] = status["strategy"]
    out["remove_ipc"] = remove_ipc = _remove_ipc(SYSTEM_ROOT)
    if remove_ipc["applies"]:
        warnings.append(
            f"systemd-logind removes the shared memory of this user (uid {remove_ipc['uid']}) when their last "
            "session ends (RemoveIPC=yes): a zctipc program of theirs that outlives the login, or a service that "
            "runs as them, loses its segments; enable lingering (loginctl enable-linger), run it as a system "
            "user, or set RemoveIPC=no in /etc/systemd/logind.conf.d/ and restart systemd-logind"
        )
    out["warnings"] = warnings
    return out


def _describe(report: dict[str, Any]) -> list[tuple[str, str]]:
    """doctor's lines: each check of a report of _diagnose, in words."""
    lib, shm, files = report["libzctipc"], report["shared_memory"], report["open_files"]
    if shm["error"] is None:
        memory = f"{shm['dir']}: {_bytes(shm['total'])}, {_bytes(shm['free'])} free"
    else:
        memory = f"{shm['dir']}: {shm['error']}"
    pages = report["huge_pages"]
    huge = "unknown"
    if pages["reserved"] is not None:
        size = "?" if pages["size"] is None else f"{pages['size'] // 1024} kB"
        huge = f"{pages['reserved']} reserved, {pages['free']} free, {size} each"
        if pages["transparent_shmem"] is not None:
            huge += f"; transparent huge pages for shmem: {pages['transparent_shmem']}"
    segments, shm_dir = report["segment_huge_pages"], shm["dir"]
    if segments["enabled"]:
        segment_pages = (
            f"yes: {shm_dir} is mounted huge={segments['mount_option']}, and zctipc asks for them on segments "
            "of 2 MiB and more"
        )
    else:
        segment_pages = (
            f"no: {shm_dir} is mounted huge={segments['mount_option']}; new large segments fault 4 KiB pages, "
            f"several times slower (mount -o remount,huge=advise {shm_dir} gives them 2 MiB pages)"
        )
    daemon = report["cleanup_daemon"]
    if daemon["running"]:
        cleanup = (
            f"running, pid {daemon['pid']}, {daemon['clients']} processes watched, "
            f"{daemon['memfd_segments']} memfd segments kept ({daemon['dir']})"
        )
    else:
        cleanup = f"not running ({daemon['dir']}); processes start it when they need it"
    return [
        ("zctipc", report["zctipc"]),
        ("libzctipc", f"{lib['version']} (C ABI {lib['abi']})"),
        ("python", report["python"]),
        ("shared memory", memory),
        ("open files limit", f"soft {_limit(files['soft'])}, hard {_limit(files['hard'])} (RLIMIT_NOFILE)"),
        ("huge pages", huge),
        ("huge pages for segments", segment_pages),
        ("cleanup daemon", cleanup),
        ("sharing strategy", report["sharing_strategy"]),
        ("RemoveIPC", _describe_remove_ipc(report["remove_ipc"])),
    ]


def _limit(n: int | None) -> str:
    return "unlimited" if n is None else str(n)


def _shm_dir() -> str:
    """Where segments live: /dev/shm, or ZCTIPC_SHM_DIR where it is set."""
    return os.environ.get("ZCTIPC_SHM_DIR") or "/dev/shm"


def _huge_pages() -> dict[str, Any]:
    """The huge pages reserved and free (None: unknown), their size in
    bytes, and the transparent huge pages mode for shmem."""
    info: dict[str, str] = {}
    pages: dict[str, Any] = {"reserved": None, "free": None, "size": None, "transparent_shmem": None}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info[key] = value.strip()
    except OSError:
        return pages
    pages["reserved"] = _number(info.get("HugePages_Total", "0"))
    pages["free"] = _number(info.get("HugePages_Free", "0"))
    size = info.get("Hugepagesize", "").split()
    if size and size[0].isdigit():
        pages["size"] = int(size[0]) * (1024 if size[1:] == ["kB"] else 1)
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            modes = f.read().split()
        # The chosen mode is in brackets: "always within_size advise [never] deny force".
        pages["transparent_shmem"] = next((m[1:-1] for m in modes if m.startswith("[")), " ".join(modes))
    except OSError:
        pass
    return pages


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() else None


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


# Note [RemoveIPC]: systemd-logind, with RemoveIPC=yes (systemd's default,
# which most distributions keep), removes every POSIX shared memory file,
# message queue and System V object of a user when the user's last session
# ends (their last login, ssh or desktop session), unless the user is a
# system user (a uid up to SYS_UID_MAX, root among them) or lingers
# (loginctl enable-linger). For zctipc that unlinks every segment of the
# user in /dev/shm: a program that outlives the login (started under nohup
# or tmux, or over ssh), or a service that runs as the user, keeps the
# memory it has mapped, but nothing can attach a segment, a queue or a pool
# arena by name any more, so new children and receivers fail with
# SegmentNotFound, and the cleanup daemon's ledgers are gone. memfd
# segments (the file_descriptor strategy) have no names and are left
# alone. doctor reads the setting as logind does: the first of the main
# files, then the drop-ins (*.conf) of every logind.conf.d, in the order of
# their names, a file in /etc hiding one of the same name in /run,
# /usr/local/lib or /usr/lib; the last assignment of [Login] RemoveIPC
# wins. doctor warns only where it applies: systemd runs, the user is not a
# system user and does not linger.

#: Where doctor looks for systemd's files: the root of the file system
#: (tests point it at a tree of their own).
SYSTEM_ROOT = "/"

_SYSTEMD_DIRS = ("etc/systemd", "run/systemd", "usr/local/lib/systemd", "usr/lib/systemd")
_TRUE, _FALSE = {"1", "yes", "y", "true", "t", "on"}, {"0", "no", "n", "false", "f", "off"}


def _remove_ipc(root: str = "/", uid: int | None = None) -> dict[str, Any]:
    """Note [RemoveIPC]: logind's RemoveIPC under root, and whether it
    removes the shared memory of uid (this process's user) when their last
    session ends: ``value`` (a bool), ``source`` (the file that set it last,
    None for systemd's default), ``systemd`` (whether systemd runs here),
    ``uid``, ``system_user``, ``lingering``, and ``applies``."""
    uid = os.getuid() if uid is None else uid
    value, source = True, None
    mains = [os.path.join(root, d, "logind.conf") for d in _SYSTEMD_DIRS]
    dropins: dict[str, str] = {}
    for d in reversed(_SYSTEMD_DIRS):  # /etc last: it hides the others' files of the same name
        directory = os.path.join(root, d, "logind.conf.d")
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        dropins.update({name: os.path.join(directory, name) for name in names if name.endswith(".conf")})
    files = [next((m for m in mains if os.path.isfile(m)), None)] + [dropins[n] for n in sorted(dropins)]
    # Only regular files are read, as logind reads them: a drop-in linked to
    # /dev/null masks its name and sets nothing, and opening a FIFO would
    # wait for a writer for ever.
    for path in filter(os.path.isfile, filter(None, files)):
        found = _read_remove_ipc(path)
        if found is not None:
            value, source = found, path.removeprefix(root.rstrip("/")) if root != "/" else path
    system_user = uid <= _sys_uid_max(root)
    try:
        import pwd

        user: str | None = pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        user = None
    lingering = user is not None and os.path.exists(os.path.join(root, "var/lib/systemd/linger", user))
    systemd = os.path.isdir(os.path.join(root, "run/systemd/system"))
    return {
        "value": value,
        "source": source,
        "systemd": systemd,
        "uid": uid,
        "system_user": system_user,
        "lingering": lingering,
        "applies": systemd and value and not system_user and not lingering,
    }


def _read_remove_ipc(path: str) -> bool | None:
    """The last valid RemoveIPC= of the [Login] section of a logind.conf, or
    None."""
    value, section = None, ""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("[") and line.endswith("]"):
                    section = line[1:-1].strip()
                    continue
                key, equals, setting = line.partition("=")
                if section == "Login" and equals and key.strip() == "RemoveIPC":
                    setting = setting.strip().lower()
                    if setting in _TRUE or setting in _FALSE:  # logind ignores anything else
                        value = setting in _TRUE
    except OSError:
        return None
    return value


def _sys_uid_max(root: str) -> int:
    """The highest uid of a system user: the last SYS_UID_MAX of
    login.defs that is a number, as systemd and shadow read it, else
    systemd's usual 999."""
    uid_max, path = 999, os.path.join(root, "etc/login.defs")
    if not os.path.isfile(path):  # a FIFO would wait for a writer for ever
        return uid_max
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 2 and fields[0] == "SYS_UID_MAX" and fields[1].isascii() and fields[1].isdigit():
                    uid_max = int(fields[1])
    except OSError:
        pass
    return uid_max


def _describe_remove_ipc(r: dict[str, Any]) -> str:
    where = f"set in {r['source']}" if r["source"] else "systemd's default"
    if not r["value"]:
        return f"no ({where}): logind leaves a user's shared memory alone when their sessions end"
    text = f"yes ({where}): logind removes a user's shared memory when their last session ends"
    if not r["systemd"]:
        return f"{text}; systemd does not run here, so nothing does"
    if r["system_user"]:
        return f"{text}, but not a system user's, and uid {r['uid']} is one"
    if r["lingering"]:
        return f"{text}, but this user lingers (loginctl enable-linger), so theirs is kept"
    return (
        f"{text}, and this user's (uid {r['uid']}) is: a zctipc program of theirs that outlives the login "
        "(nohup, tmux, a job started over ssh), or a service that runs as them, then loses its segments, queues "
        "and pool arenas in /dev/shm, and nothing can attach them any more"
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
