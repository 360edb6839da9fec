"""Attacks on the rendering of benchmark reports: reports from before the
floors were measured by pause (no futex_wake_2ms, no hand-off floors or
floor_us), a run whose hand-off suite was skipped, and the hand-off
script's --render of either. No benchmark runs here; no timing is asserted."""

import copy
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BENCH = os.path.join(ROOT, "benchmarks")


@pytest.fixture(scope="module")
def run():
    sys.path.insert(0, BENCH)
    try:
        import run
    finally:
        sys.path.remove(BENCH)
    return run


def _report():
    with open(os.path.join(ROOT, "docs", "bench", "report.json")) as f:
        return json.load(f)


def _old(report):
    """report as a run made before floors by pause wrote it."""
    old = copy.deepcopy(report)
    del old["floor"]["futex_wake_2ms"]
    handoff = old["suites"]["handoff"]
    del handoff["floors"]
    for r in handoff["results"]:
        del r["floor_us"]
    return old


def test_a_report_of_today_renders_each_hand_off_against_its_own_floor(run, tmp_path):
    report = _report()
    rows = [row for row in run.floor_rows(report) if row[0] == "handoff"]
    results = report["suites"]["handoff"]["results"]
    assert len(rows) == len(results)
    for row, r in zip(rows, results, strict=True):
        assert row[3] == run.fmt_ratio(r["median_us"] / r["floor_us"])
    text = run.render(report, str(tmp_path))
    assert "2 ms apart" in text


def test_an_old_report_renders_against_the_one_floor_it_has(run, tmp_path):
    old = _old(_report())
    wake = old["floor"]["futex_wake"]["median_us"]
    rows = [row for row in run.floor_rows(old) if row[0] == "handoff"]
    assert rows
    for row, r in zip(rows, old["suites"]["handoff"]["results"], strict=True):
        assert row[3] == run.fmt_ratio(r["median_us"] / wake)
    text = run.render(old, str(tmp_path))
    assert "2 ms apart (a hand-off's pause)" not in text


@pytest.mark.parametrize("suite", ["handoff", "arrow"])
def test_a_report_whose_suite_was_skipped_renders(run, tmp_path, suite):
    for report in (_report(), _old(_report())):
        del report["suites"][suite]
        report["skipped"][f"the {suite} suite"] = "it needs something, which is not installed"
        assert not [row for row in run.floor_rows(report) if row[0] == suite]
        run.render(report, str(tmp_path))


@pytest.mark.parametrize("old", [False, True])
def test_the_hand_off_script_renders_a_saved_report(tmp_path, old):
    with open(os.path.join(ROOT, "docs", "bench", "handoff.json")) as f:
        report = json.load(f)
    if old:
        del report["floors"]
        for r in report["results"]:
            r.pop("floor_us", None)
    path = tmp_path / "handoff.json"
    path.write_text(json.dumps(report))
    out = subprocess.run(
        [sys.executable, os.path.join(BENCH, "bench_handoff.py"), "--render", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("Futex floor" in out.stdout) is not old


@pytest.mark.parametrize("mode", ["full", "quick", "tiny"])
def test_the_hand_off_progress_counts_each_size_s_floor_line_too(run, mode):
    """bench_handoff prints, for each size, its futex floor's line before
    one per peer (Ray's too): the progress bar expects them all, so that
    it is not full before the last peer ran."""
    sys.path.insert(0, BENCH)
    try:
        import bench_handoff
    finally:
        sys.path.remove(BENCH)
    argv = run.suite_argv("handoff", mode, "x.json")
    sizes = argv[argv.index("--sizes") + 1].split(",") if "--sizes" in argv else list(bench_handoff.SIZES)
    assert run.expected_cells("handoff", mode) == len(sizes) * (1 + len(bench_handoff.PEERS) + 1)
