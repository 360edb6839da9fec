"""The README cannot drift from the code: every Python block in it runs as
written, each as a program of its own, and leaves no segment behind; every
environment variable the code reads is in its table."""

import os
import re
import subprocess
import sys
import time

import pytest
from conftest import SWEEP_TIMEOUT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")


#: The guides beside the README, whose examples run too.
GUIDES = [os.path.join(ROOT, "docs", "pytorch.md")]


def python_blocks(path=README):
    with open(path) as f:
        text = f.read()
    where = os.path.relpath(path, ROOT)
    return [
        (f"{where}:{text.count(chr(10), 0, m.start()) + 2}", m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)
    ]


BLOCKS = python_blocks()
GUIDE_BLOCKS = [block for guide in GUIDES for block in python_blocks(guide)]


def test_the_readme_has_its_examples():
    assert len(BLOCKS) >= 4, "the first program, the quick start, streams, Arrow"
    assert len(GUIDE_BLOCKS) >= 4, "the PyTorch guide: DataLoader, Hogwild, spawn, state dicts"


@pytest.mark.parametrize("line,code", BLOCKS + GUIDE_BLOCKS, ids=[line for line, _ in BLOCKS + GUIDE_BLOCKS])
def test_every_python_block_runs_as_written(isolated, tmp_path, line, code):
    program = tmp_path / "example.py"  # a file: forkserver children import the main module
    program.write_text(code)
    env = dict(isolated, PYTHONWARNINGS="ignore::RuntimeWarning")
    out = subprocess.run(
        [sys.executable, str(program)], env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, f"{line}:\n{out.stderr[-3000:]}"
    for printed in re.findall(r"^\s*print\(.*?\)\s*#\s*(.+)$", code, re.M):
        assert printed.strip() in out.stdout, f"{line} says it prints {printed.strip()}: {out.stdout!r}"
    # Processes the example's own program started and ended (Ray's workers)
    # are let go of, or swept by the daemon, within the sweep window.
    deadline = time.monotonic() + SWEEP_TIMEOUT
    while (left := os.listdir(isolated["ZCTIPC_SHM_DIR"])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"{line} left {left} behind"


def test_every_environment_variable_is_documented():
    names = set()
    for top in ("go", "python", "benchmarks", "tests"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith((".go", ".py", ".c", ".h")):
                    with open(os.path.join(dirpath, name), errors="replace") as f:
                        names |= set(re.findall(r"\bZCTIPC_[A-Z0-9_]+\b", f.read()))
    names = {n for n in names if not n.endswith("_H")}  # C include guards
    with open(README) as f:
        table = f.read().split("Environment variables:", 1)[1].split("\n## ", 1)[0]
    missing = sorted(n for n in names if f"`{n}" not in table and f" `{n}" not in table and n not in table)
    assert not missing, f"read by the code, not in the README's table: {missing}"
