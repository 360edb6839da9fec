"""What every zctipc benchmark shares: the machine it ran on, the versions of
the peers, statistics, and Markdown tables."""

import datetime
import importlib.metadata
import os
import platform
import statistics


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
    return (f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB memory, Linux {m['kernel']}, "
            f"/dev/shm {m['dev_shm_gib']} GiB, Python {m['python']}")
