"""go/capi/example/attach.c, the C linking example: built with the system
compiler against the installed zctipc.h and libzctipc.so, it reads a
Python-made tensor by name and by TensorRef, and lets go of it at exit."""

import json
import os
import shutil
import subprocess
import time

import numpy as np
import pytest
from conftest import SWEEP_TIMEOUT

import zctipc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def attach(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build the example"
    package = os.path.dirname(zctipc.__file__)
    binary = str(tmp_path_factory.mktemp("c") / "attach")
    subprocess.run(
        [
            cc,
            "-std=c11",
            "-Wall",
            "-Werror",
            "-I",
            package,
            os.path.join(ROOT, "go/capi/example/attach.c"),
            "-L",
            package,
            "-lzctipc",
            f"-Wl,-rpath,{package}",
            "-o",
            binary,
        ],
        check=True,
    )
    return binary


def test_a_c_program_reads_a_python_tensor(attach):
    t = zctipc.create_shared_tensor(data=np.arange(1000, dtype=np.float32))
    out = subprocess.run([attach, t.name, json.dumps(t.ref())], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"zctipc {zctipc.__version__}", "zct_version() is right on the first call"
    assert lines[1] == f"by name {t.name}: sum {float(sum(range(1000))):.1f}"
    assert lines[2] == f"by ref {t.name}: sum {float(sum(range(1000))):.1f}"
    assert t.refcount == 1, "the C program let go of its count"
    bad = dict(t.ref(), dtype="int32")
    out = subprocess.run([attach, t.name, json.dumps(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "dtype int32 where the segment holds float32" in out.stderr
    # It left without letting go: the cleanup daemon gives its count up.
    deadline = time.monotonic() + SWEEP_TIMEOUT
    while t.refcount != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert t.refcount == 1
    t.close()
