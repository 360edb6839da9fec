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

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB_DIR = os.path.join(ROOT, "build", "lib")
HEADER = os.path.join(ROOT, "go", "capi", "zctipc.h")
GO_LDFLAGS = "-s -w -extldflags=-Wl,-soname,libzctipc.so"


def version():
    with open(os.path.join(ROOT, "go", "version", "version.go")) as f:
        return re.search(r'const Version = "([^"]+)"', f.read()).group(1)


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

    def run(self):
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
    cmdclass={"build_ext": BuildGoThenExtensions},
)
