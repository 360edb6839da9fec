"""Test what users install (make wheel-test).

For every Python given: a fresh venv, the release wheel from dist/ with pip
(and NumPy and pytest), and a set of test files that need no source tree
(PLAIN), run from outside it against the installed package. Where the
venv's Python is the version of the development venv, that venv's torch,
pyarrow, pandas and polars are made visible too (a .pth line; the
development venv's editable zctipc is not), and a set of test files that
need them (WITH_EXTRAS) runs as well. Then the
sdist, built from source by pip in one more venv. And the wheel's native
files must carry no run path but their own directory. Each run keeps its
segments and its cleanup daemon in directories of its own (own_dirs), so
that what it leaves is its own, whatever else runs on the machine.

    python .ci/wheel_test.py --venv-python .venv/bin/python PYTHON [PYTHON ...]
"""

import argparse
import contextlib
import fcntl
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests", "python")

# What the wheel is tested with: files that show the installed package
# whole (the library, the daemon, the header, the CLI, processes and the
# error surface), not the whole suite, which `make pytest` runs on the same
# code. Files that need neither torch, pyarrow nor the source tree:
#: The wheel's extras, each resolved on every Python.
EXTRAS = ["torch", "arrow", "pandas", "polars", "ray", "bench"]

PLAIN = [
    "test_c_example.py",
    "test_cli.py",
    "test_context.py",
    "test_golden.py",
    "test_limits.py",
    "test_native.py",
    "test_processes.py",
    "test_public_api.py",
]
# And those that need torch or pyarrow too (under the development venv's Python).
WITH_EXTRAS = [
    "test_arrow.py",
    "test_bad_input.py",
    "test_dropin.py",
    "test_pickling.py",
    "test_tensor.py",
]


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def python_of(venv):
    return os.path.join(venv, "bin", "python")


def version_of(python):
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def site_packages(python):
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def check_run_paths(wheel):
    """Every ELF file of the wheel finds its libraries in the system's
    places or beside itself, never in a path of the build machine."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
        for name in z.namelist():
            if not (name.endswith(".so") or name.endswith("zctipcd")):
                continue
            path = z.extract(name, tmp)
            with open(path, "rb") as f:
                for section in ELFFile(f).iter_sections():
                    if not isinstance(section, DynamicSection):
                        continue
                    for tag in section.iter_tags():
                        if tag.entry.d_tag in ("DT_RPATH", "DT_RUNPATH"):
                            paths = tag.runpath if tag.entry.d_tag == "DT_RUNPATH" else tag.rpath
                            if any(p != "$ORIGIN" for p in paths.split(":")):
                                sys.exit(f"{wheel}: {name} has {tag.entry.d_tag} {paths!r}: a build-machine path")
    print(f"run paths: every native file of {os.path.basename(wheel)} looks only beside itself", flush=True)


@contextlib.contextmanager
def own_dirs(tmp):
    """The environment of a test run with a segment directory on /dev/shm's
    tmpfs and a runtime directory (so a cleanup daemon) of its own, apart
    from any other suite's (whose leak checks look at /dev/shm). Afterwards
    the daemon is stopped, and the directory must be empty."""
    shm_dir = tempfile.mkdtemp(prefix="wheel-test-", dir="/dev/shm")
    run_dir = os.path.join(tmp, "run")
    os.mkdir(run_dir, 0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZCTIPC_LIBRARY") and k != "PYTHONPATH"}
    env.update(ZCTIPC_SHM_DIR=shm_dir, ZCTIPC_RUNTIME_DIR=run_dir)
    try:
        yield env
        left = os.listdir(shm_dir)
        if left:
            sys.exit(f"the installed package left {len(left)} files in {shm_dir}: {sorted(left)[:10]}")
    finally:
        try:
            with open(os.path.join(run_dir, "daemon.lock")) as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # the daemon holds it while it runs: the pid is its own
                    os.kill(int(f.read().strip()), signal.SIGKILL)
        except (OSError, ValueError):
            pass  # no daemon ran, or it is gone (its pid may be another process's now)
        shutil.rmtree(shm_dir, ignore_errors=True)


def test_wheel(python, wheel, dev_python, dev_version):
    with tempfile.TemporaryDirectory(prefix="zctipc-wheel-test-") as tmp, own_dirs(tmp) as env:
        venv = os.path.join(tmp, "venv")
        run([python, "-m", "venv", venv])
        vpy = python_of(venv)
        version = version_of(vpy)
        run(
            [
                vpy,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                wheel,
                "numpy",
                "pytest",
                "pytest-timeout",
            ]
        )
        files = list(PLAIN)
        if version == dev_version:
            with open(os.path.join(site_packages(vpy), "zctipc-wheel-test-extras.pth"), "w") as f:
                f.write(site_packages(dev_python) + "\n")
            files += WITH_EXTRAS
        where = subprocess.run(
            [vpy, "-c", "import zctipc._core.native as n; print(n.__file__)"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not where.startswith(venv):
            sys.exit(f"Python {version}: zctipc was imported from {where}, not from the installed wheel")
        print(f"Python {version}: zctipc from {where}; {len(files)} test files", flush=True)
        run(
            [
                vpy,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--timeout=300",
                "-rs",
                *[os.path.join(TESTS, f) for f in files],
            ],
            cwd=tmp,
            env=env,
        )
        # zctipc bench from the wheel's own copy of the benchmarks (the source
        # tree's test_bench.py also builds the Go examples, which a wheel lacks).
        bench = [os.path.join(venv, "bin", "zctipc"), "bench", "--tiny", "--only", "stream"]
        run(bench, cwd=tmp, env=env, stdout=subprocess.DEVNULL)
        if not os.path.isfile(os.path.join(tmp, "zctipc-bench", "report.md")):
            sys.exit(f"Python {version}: zctipc bench from the wheel wrote no report")
        # Every extra resolves on this Python (a peer that needs a newer one
        # has a marker): pip resolves them from PyPI without installing.
        extras = ",".join(EXTRAS)
        run([vpy, "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check", f"{wheel}[{extras}]"])
        print(f"Python {version}: zctipc[{extras}] resolves", flush=True)


def test_sdist(python, sdist):
    with tempfile.TemporaryDirectory(prefix="zctipc-sdist-test-") as tmp, own_dirs(tmp) as env:
        venv = os.path.join(tmp, "venv")
        run([python, "-m", "venv", venv])
        vpy = python_of(venv)
        run([vpy, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", sdist])
        code = (
            "import numpy as np, zctipc; q = zctipc.Queue(); q.put({'a': np.arange(4)}); "
            "t = zctipc.create_shared_tensor(data=np.ones(3)); "
            "print(q.get()['a'].sum(), t.numpy().sum(), zctipc.__version__); t.close(); q.close()"
        )
        out = subprocess.run([vpy, "-c", code], cwd=tmp, env=env, capture_output=True, text=True, check=True).stdout
        version = os.path.basename(sdist).removeprefix("zctipc-").removesuffix(".tar.gz")
        if out.split() != ["6", "3.0", version]:
            sys.exit(f"the package built from the sdist printed {out!r}")
        print(f"sdist: built from source and ran under Python {version_of(vpy)}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv-python", required=True, help="the development venv's Python (it has torch)")
    parser.add_argument("pythons", nargs="+", help="the Pythons to install the wheel into")
    args = parser.parse_args()
    wheels = glob.glob(os.path.join(ROOT, "dist", "zctipc-*manylinux*.whl"))
    sdists = glob.glob(os.path.join(ROOT, "dist", "zctipc-*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        sys.exit(f"dist/ should hold one manylinux wheel and one sdist (make wheel): {wheels + sdists}")
    check_run_paths(wheels[0])
    dev_version = version_of(args.venv_python)
    versions = []
    for python in args.pythons:
        test_wheel(python, wheels[0], args.venv_python, dev_version)
        versions.append(version_of(python))
    test_sdist(args.pythons[-1], sdists[0])
    print(
        f"wheel-test: {os.path.basename(wheels[0])} passed under Python {', '.join(versions)}; the sdist built",
        flush=True,
    )


if __name__ == "__main__":
    main()
