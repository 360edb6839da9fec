"""Build zctipc: the Go core (libzctipc.so), then the cffi extension that binds it.

Building needs Go (https://go.dev) and a C compiler. The wheel carries
libzctipc.so, the cleanup daemon zctipcd, the cffi extension and zctipc.h
inside the ``zctipc`` package.
"""

import glob
import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB_DIR = os.path.join(ROOT, "build", "lib")
HEADER = os.path.join(ROOT, "go", "capi", "zctipc.h")
GO_LDFLAGS = "-s -w -extldflags=-Wl,-soname,libzctipc.so"


def version():
    with open(os.path.join(ROOT, "go", "internal", "version", "version.go")) as f:
        return re.search(r'const Version = "([^"]+)"', f.read()).group(1)


GO_MINIMUM = (1, 26)  # go.mod's go line


def check_toolchain():
    """Stop at once, naming what is missing, when Go or a C compiler is not
    there (a wheel needs neither: this is a build from source)."""
    go = shutil.which("go")
    problems = []
    if go is None:
        problems.append(
            f"Go {'.'.join(map(str, GO_MINIMUM))} or later (https://go.dev/dl/), "
            "which builds the core library: 'go' is not on PATH"
        )
    else:
        out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
        found = tuple(int(n) for n in re.findall(r"\d+", out)[:2])
        if found < GO_MINIMUM:
            problems.append(f"Go {'.'.join(map(str, GO_MINIMUM))} or later: {go} is {out or 'of an unknown version'}")
    cc = os.environ.get("CC", "").split()[:1] or ["cc"]
    if shutil.which(cc[0]) is None and shutil.which("gcc") is None and shutil.which("clang") is None:
        problems.append("a C compiler (gcc or clang; or CC set to one), which cgo and cffi need")
    if problems:
        raise SystemExit(
            "building zctipc from source needs "
            + "; and ".join(problems)
            + ". A wheel needs neither: pip install zctipc picks one where there is one for this machine."
        )


def build_go_library(out_dir):
    """go build -buildmode=c-shared the export layer into out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, "libzctipc.so")
    subprocess.check_call(
        ["go", "build", "-buildmode=c-shared", "-trimpath", f"-ldflags={GO_LDFLAGS}", "-o", target, "./go/capi"],
        cwd=ROOT,
    )
    # go also writes a generated libzctipc.h; the hand-written zctipc.h is the API.
    os.remove(os.path.join(out_dir, "libzctipc.h"))
    return target


def build_go_daemon(out_dir):
    """go build the cleanup daemon into out_dir."""
    target = os.path.join(out_dir, "zctipcd")
    subprocess.check_call(
        ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", target, "./go/cmd/zctipcd"],
        cwd=ROOT,
    )
    return target


class BuildGoThenExtensions(build_ext):
    """Build libzctipc.so and zctipcd first, link the cffi extension against
    the library, and put them all (and zctipc.h) in the package."""

    def build_extensions(self):
        # The extension finds libzctipc.so beside itself ($ORIGIN) and
        # nowhere else: drop the run paths of the Python that builds it
        # (pyenv's, for one), which would otherwise travel in the wheel.
        linker = self.compiler.linker_so
        self.compiler.linker_so = [a for a in linker if not a.startswith(("-Wl,-rpath", "-Wl,-R"))]
        super().build_extensions()

    def run(self):
        check_toolchain()
        library = build_go_library(LIB_DIR)
        daemon = build_go_daemon(LIB_DIR)
        package_dir = os.path.join("python", "zctipc") if self.inplace else os.path.join(self.build_lib, "zctipc")
        os.makedirs(package_dir, exist_ok=True)
        # build_ext writes the extension in place; unlinked first, a process
        # that has the old one loaded keeps it.
        for old in glob.glob(os.path.join(package_dir, "_zctipc_cffi*")):
            os.remove(old)
        super().run()
        for source, name in ((library, "libzctipc.so"), (daemon, "zctipcd"), (HEADER, "zctipc.h")):
            install_file(source, os.path.join(package_dir, name))


class BuildPyWithBenchmarks(build_py):
    """The package's modules, and the benchmark scripts in
    zctipc/benchmarks, so that zctipc bench runs from an installed wheel."""

    def run(self):
        super().run()
        if self.editable_mode:
            return  # an editable install runs the source tree's
        target = os.path.join(self.build_lib, "zctipc", "benchmarks")
        os.makedirs(target, exist_ok=True)
        for source in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))):
            self.copy_file(source, os.path.join(target, os.path.basename(source)))


def install_file(source, target):
    """Copy source to target by a rename: a daemon or a process running
    the old copy keeps it (writing over it in place would fail, or change
    the code under the process)."""
    tmp = target + ".new"
    shutil.copy2(source, tmp)
    os.replace(tmp, target)


setup(
    version=version(),
    cffi_modules=["python/build_ffi.py:ffibuilder"],
    cmdclass={"build_ext": BuildGoThenExtensions, "build_py": BuildPyWithBenchmarks},
    # The cffi extension uses only the limited API: one wheel for CPython
    # 3.10 and every later version.
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
