"""CPython's own multiprocessing tests (test._test_multiprocessing), run
against zctipc's queues, events, pool and contexts under forkserver and
spawn by tests/python/conformance/cpython_mp.py, in a process of their own.

The counts are printed in pytest's summary (conftest.py's
pytest_terminal_summary: so `make test` shows them) and are in the failure
message."""

import os
import re
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HARNESS = os.path.join(HERE, "conformance", "cpython_mp.py")

# Tests each start method must run: CPython 3.11.7 has 84 in the selected
# classes; the floor leaves room for other 3.11 releases, and catches a
# selection that silently shrank.
MIN_RAN = 75
# Both start methods take about a minute on two cores; the harness gives up
# by itself after its RUN_TIMEOUT (540 s), with every thread's stack.
TIMEOUT = 600

SUMMARY = re.compile(
    r"^CONFORMANCE (?P<method>\w+) ran=(?P<ran>\d+) passed=(?P<passed>\d+) failed=(?P<failed>\d+) "
    r"errors=(?P<errors>\d+) skipped=(?P<skipped>\d+) seconds=(?P<seconds>[\d.]+)$",
    re.MULTILINE,
)


def run_harness():
    """Run the harness by path (no package lookup for `tests`), in a session
    of its own so that a timeout kills its children too."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH")])),
    )
    proc = subprocess.Popen(
        [sys.executable, HARNESS],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n[killed: the harness ran longer than {TIMEOUT} s]"
    return proc.returncode, out, err


def test_cpython_multiprocessing_tests_pass_with_zctipc(record_property):
    rc, out, err = run_harness()
    print(out)
    # The harness's CONFORMANCE lines, for the run's summary (conftest.py),
    # in the test's report: it reaches the run's summary from a worker too.
    record_property("conformance", [m.group(0) for m in SUMMARY.finditer(out)])
    counts = {}
    for m in SUMMARY.finditer(out):
        fields = m.groupdict()
        method = fields.pop("method")
        counts[method] = {k: float(v) if k == "seconds" else int(v) for k, v in fields.items()}
    # The counts first, then the harness's report and the end of unittest's.
    lines = "\n".join(m.group(0) for m in SUMMARY.finditer(out)) or "no counts: the harness did not finish"
    detail = f"{lines}\nexit status {rc}\n{out}\n--- stderr (end) ---\n{err[-6000:]}"
    assert rc != 2, detail  # the interpreter has no `test` package: the harness says so
    assert set(counts) == {"forkserver", "spawn"}, detail
    for method, c in counts.items():
        assert c["failed"] == 0 and c["errors"] == 0, f"{method}: failures or errors\n{detail}"
        assert c["ran"] >= MIN_RAN, f"{method} ran {c['ran']} tests, fewer than {MIN_RAN}\n{detail}"
    assert rc == 0, detail
