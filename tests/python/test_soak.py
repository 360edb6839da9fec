"""A soak run: 8 producer and 8 consumer processes share one queue with
messages from tuples to 64 MiB arrays, each with a unique id and a checksum,
for ZCTIPC_SOAK_SECONDS (60 by default; make test runs it shorter). Every
message arrives exactly once and whole, and nothing is left after."""

import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
SECONDS = float(os.environ.get("ZCTIPC_SOAK_SECONDS", "60"))


def test_soak_delivers_exactly_once_and_leaves_nothing(isolated):
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "_soak.py"), str(SECONDS), "8", "8"],
        env=isolated,
        capture_output=True,
        text=True,
        timeout=SECONDS + 600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["sent"] > 1000, report
    assert report["received"] == report["sent"], report
    assert report["missing"] == report["unexpected"] == report["duplicates"] == 0, report
    assert report["corrupt"] == 0, report
    assert report["exit_codes"] == [0] and report["left_in_queue"] == 0, report
    shm_dir = isolated["ZCTIPC_SHM_DIR"]
    deadline = time.monotonic() + 15
    while os.listdir(shm_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.listdir(shm_dir) == [], "every process let go of everything"
