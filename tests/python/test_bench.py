"""The benchmark command runs every suite on tiny sizes, writes its report,
JSON and (with matplotlib) plots, and skips missing peers with the reason.
No timing is asserted."""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import with_pythonpath

pytestmark = pytest.mark.slow

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SUITES = ("handoff", "queue", "stream", "arrow", "gpu", "ray", "dataloader")


def test_the_ray_suite_measures_every_transport(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "bench_ray.py"),
            "--tiny",
            "--json",
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads((tmp_path / "r.json").read_text())["results"]
    assert [(r["transport"], r["bytes"]) for r in rows] == [
        ("no tensor", 0),
        ("zctipc", 1 << 20),
        ("object store", 1 << 20),
        ("gloo", 1 << 20),
        ("zctipc, fresh", 1 << 20),
    ]
    assert all(r["median_us"] > 0 and r["rounds"] == 3 for r in rows)
    assert "| 1 MiB | zctipc | descriptors (zctipc.ray), the tensor sent before |" in out.stdout


def test_every_suite_runs_and_the_report_has_its_shape(tmp_path):
    # The same peers are measured wherever the test runs: none of the optional ones.
    env = dict(os.environ, ZCTIPC_BENCH_WITHOUT="pythusa,faster-fifo,iceoryx2,ray")
    # --readme fills the README's numbers block, and touches nothing else of it.
    readme = tmp_path / "README.md"
    before, after = (
        "# A project\n\n<!-- BEGIN bench_numbers -->\n",
        "old numbers\n<!-- END bench_numbers -->\n\nThe end.\n",
    )
    readme.write_text(before + after)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "zctipc",
            "bench",
            "--tiny",
            "--out",
            str(tmp_path),
            "--json",
            str(tmp_path / "all.json"),
            "--readme",
            str(readme),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "skipping pythusa: left out by ZCTIPC_BENCH_WITHOUT" in out.stderr
    assert "floor    measuring a futex wake and a memcpy" in out.stderr
    for suite in SUITES:
        # Not a terminal: one line per suite, no redrawn progress bar.
        assert re.search(rf"^{suite} +\d+/\d+ cells in ", out.stderr, re.M), f"a line for {suite}"
    assert "\r" not in out.stderr
    report = json.loads((tmp_path / "all.json").read_text())
    assert report["mode"] == "tiny"
    assert set(report["machine"]) >= {"cpu", "cores", "memory_gib", "kernel", "dev_shm_gib", "python"}
    assert report["versions"]["zctipc"] and report["versions"]["numpy"]
    floor = report["floor"]
    for key in ("futex_wake", "futex_wake_2ms"):  # 1 ms and 2 ms apart, the latency suites' pauses
        assert floor[key]["median_us"] > 0 and floor[key]["rounds"] == 50, key
    assert floor["memcpy_bytes_per_s"] > 0
    assert list(report["suites"]) == list(SUITES)
    suites = report["suites"]
    assert {r["peer"] for r in suites["handoff"]["results"]} >= {"zctipc", "multiprocessing.Queue"}
    assert all(r["median_us"] > 0 for r in suites["handoff"]["results"])
    # A floor 2 ms apart before each size's peers, which each of its rows carries.
    floors = {f["bytes"]: f["median_us"] for f in suites["handoff"]["floors"]}
    assert floors and all(us > 0 for us in floors.values())
    assert all(r["floor_us"] == floors[r["bytes"]] for r in suites["handoff"]["results"])
    assert {s["peer"] for s in suites["queue"]["skipped"]} == {"faster-fifo"}
    assert all(r["per_second"] > 0 for r in suites["queue"]["rate"])
    local = suites["queue"]["local"]
    assert {(r["object"], r["peer"]) for r in local} == {
        (o, p)
        for o in ("5-tuple of ints", "32 bytes", "10 float32", "64 KiB float32")
        for p in ("zctipc.Queue", "multiprocessing.Queue")
    }
    assert all(r["per_pair_us"] > 0 for r in local)
    assert all((r["floor_us"] is None) == ("float32" in r["object"]) for r in local), "arrays have no message floor"
    assert [r["peer"] for r in suites["queue"]["latency"]] == [
        "zctipc.Queue (sleep)",
        "zctipc.Queue (poll)",
        "multiprocessing.Queue",
    ]
    assert all(0 <= r["consumer_cpu"] <= 2 and r["median_us"] > 0 for r in suites["queue"]["latency"])
    assert [r["peer"] for r in suites["stream"]["latency"]] == ["zctipc", "zctipc polling"]
    assert [r["peer"] for r in suites["queue"]["pool"]] == ["zctipc.get_context()", "stdlib fork", "stdlib forkserver"]
    assert all(r["seconds"] > 0 and r["tasks"] == 10 for r in suites["queue"]["pool"])
    assert suites["stream"]["skipped_peers"]["pythusa"] == "left out by ZCTIPC_BENCH_WITHOUT"
    assert suites["stream"]["skipped_peers"]["iceoryx2"] == "left out by ZCTIPC_BENCH_WITHOUT"
    assert {s["peer"] for s in suites["handoff"]["skipped"]} == {"ray"}
    assert {r["peer"] for r in suites["stream"]["throughput"]} == {"zctipc"}
    assert {r["peer"] for r in suites["arrow"]["arrow"]} >= {"zctipc share/attach", "pa.ipc through a pipe"}
    assert {(r["pair"], r["producers"]) for r in suites["arrow"]["rates"]} == {
        (pair, n) for pair in ("Python to Python", "Go to Go", "Go to Python") for n in (1, 4)
    }
    assert all(r["per_second"] > 0 for r in suites["arrow"]["rates"])
    assert suites["gpu"]["skipped"] or suites["gpu"]["rows"]
    assert suites["ray"]["skipped"] == {"ray": "left out by ZCTIPC_BENCH_WITHOUT"}
    # Every peer's loader over every shape, each in a process of its own
    # (where only zctipc's loaded zctipc: the suite checks), and the row
    # without workers for reference.
    loaders = suites["dataloader"]
    shapes = ("large", "small", "compute")
    peers = ("fork (torch's default)", "forkserver", "zctipc.get_context()", "no workers (num_workers=0)")
    assert [(r["shape"], r["peer"]) for r in loaders["results"]] == [(s, p) for s in shapes for p in peers]
    image, labels = 64 * 3 * 224 * 224 * 4, 64 * 8
    payload = {"large": image, "small": 64 * 512 * 4 + labels, "compute": image + labels}
    for r in loaders["results"]:
        assert r["bytes_per_batch"] == payload[r["shape"]]
        assert r["batches"] == [4] and len(r["rounds"]) == 1 and r["batches_per_s"] > 0
        assert r["bytes_per_s"] == r["batches_per_s"] * r["bytes_per_batch"]
    assert [r["shape"] for r in loaders["ratios"]] == list(shapes)
    assert all(r["best_peer"] in peers[:2] and r["vs_best_peer"] > 0 for r in loaders["ratios"])
    assert loaders["settings"] == {
        "num_workers": 2,
        "batch_size": 64,
        "prefetch_factor": 2,
        "persistent_workers": True,
        "rounds": 1,
        "seconds": 0.0,
        "min_batches": 4,
        "warm_seconds": 0.0,
        "warm_batches": 4,
    }
    text = (tmp_path / "report.md").read_text()
    assert "Skipped pythusa: left out by ZCTIPC_BENCH_WITHOUT." in text
    assert "| suite | result | value | vs floor |" in text
    for suite in SUITES:
        assert f"\n## {suite}\n" in text
    assert text.startswith("# Benchmark report\n")
    for image in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (tmp_path / image).is_file(), f"report.md links {image}, which is not beside it"
    # The README has five of the numbers at most (a tiny run has no 1 GiB
    # hand-off, and Ray was left out), the machine and a link to the report,
    # and no more of the report.
    numbers = readme.read_text()
    assert numbers.startswith(before) and numbers.endswith("<!-- END bench_numbers -->\n\nThe end.\n")
    assert "old numbers" not in numbers and "## handoff" not in numbers
    assert "| ProcessPoolExecutor.map over 10 arrays of 64 KiB, two workers |" in numbers
    assert "| torch DataLoader, two workers, batches of 38.5 MB |" in numbers
    assert "Ray actor" not in numbers and "1 GiB array" not in numbers
    assert "(tiny run, " in numbers and "[the benchmark report](report.md)" in numbers
    assert "| dataloader | zctipc.get_context(), large batches of 38.5 MB |" in text
    assert "| large: 3x224x224 float32, 38.5 MB a batch | fork (torch's default) |" in text
    if isinstance(report["plots"], list):
        assert all(os.path.getsize(p) > 1000 for p in report["plots"])
    else:
        assert "matplotlib" in report["plots"]


def test_bad_arguments_are_refused():
    out = subprocess.run(
        [sys.executable, "-m", "zctipc", "bench", "--only", "nonsense"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "unknown suite 'nonsense'; the suites are handoff, queue, stream, arrow, gpu" in out.stderr


def test_without_torch_and_pyarrow_the_suites_that_need_them_are_skipped_and_say_what_brings_them(tmp_path):
    # Without torch and pyarrow (stand-ins that fail to import, ahead of the
    # real ones): the queue and hand-off suites run without their torch rows,
    # the suites that need torch or pyarrow whole are skipped, and every skip
    # names the package that brings what is missing; none blames a variable
    # the user never set.
    for module in ("torch", "pyarrow"):
        (tmp_path / f"{module}.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n"
        )
    env = dict(
        os.environ, PYTHONPATH=with_pythonpath(str(tmp_path)), ZCTIPC_BENCH_WITHOUT="faster-fifo,pythusa,iceoryx2,ray"
    )
    only = "handoff,queue,arrow,dataloader"
    out = subprocess.run(
        [sys.executable, "-m", "zctipc", "bench", "--tiny", "--only", only, "--out", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert set(report["suites"]) == {"handoff", "queue"}
    for suite, module in (("arrow", "pyarrow"), ("dataloader", "torch")):
        why = f"it needs {module}, which is not installed; pip install {module} brings it"
        assert f"skipping the {suite} suite: {why}" in out.stderr
        assert f"Skipped the {suite} suite: {why}" in out.stdout
    assert "skipping torch: not installed" in out.stderr
    handoff = report["suites"]["handoff"]
    assert handoff["results"] and not any(r["peer"].startswith("torch") for r in handoff["results"])
    assert {"peer": "torch.mp", "reason": handoff["skipped"][-1]["reason"]} in handoff["skipped"]
    queue = report["suites"]["queue"]
    assert [r["peer"] for r in queue["big"]] == ["zctipc.Queue", "multiprocessing.Queue (pickling)"]
    assert any(s["peer"] == "the state-dict rows" for s in queue["skipped"])
    for s in handoff["skipped"] + queue["skipped"]:
        if s["peer"].startswith(("torch", "the state-dict")):
            assert "ZCTIPC_BENCH_WITHOUT" not in s["reason"] and "pip install torch brings it" in s["reason"]


def test_the_stream_suite_removes_what_iceoryx2_keeps_and_only_that(tmp_path, monkeypatch):
    """iceoryx2 keeps a management segment in /dev/shm and a root directory
    after its last node ends: the stream suite removes what appeared during
    its runs, and leaves what was there before (another user's)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import bench_stream
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    prefix = f"zctipc-test-iox2-{os.getpid()}-"
    monkeypatch.setattr(bench_stream, "ICEORYX2_SHM_PREFIX", prefix)
    monkeypatch.setattr(bench_stream, "ICEORYX2_ROOT", str(tmp_path / "root"))
    theirs = f"/dev/shm/{prefix}theirs"
    open(theirs, "w").close()
    try:
        with bench_stream._iceoryx2_leaves_nothing():
            for name in ("node.global_mgmt", "service"):
                open(f"/dev/shm/{prefix}{name}", "w").close()
            os.makedirs(tmp_path / "root" / "nodes")
        left = sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
        assert left == [f"{prefix}theirs"], left
        assert not (tmp_path / "root").exists()
        # A root that was there before stays.
        os.makedirs(tmp_path / "root")
        with bench_stream._iceoryx2_leaves_nothing():
            pass
        assert (tmp_path / "root").exists()
    finally:
        for n in os.listdir("/dev/shm"):
            if n.startswith(prefix):
                os.unlink(f"/dev/shm/{n}")


def test_each_latency_is_set_against_the_floor_of_its_own_pause():
    """A hand-off (2 ms apart) is divided by the floor measured 2 ms apart
    (its suite's, of the same minutes, when there is one), one message in
    flight (1 ms apart) by the one measured 1 ms apart; a report from before
    floors by pause has one floor for both."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import run
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    floor = {"futex_wake": {"median_us": 10.0}, "futex_wake_2ms": {"median_us": 20.0}, "memcpy_bytes_per_s": 1e10}
    suites = {
        "handoff": {"results": [{"peer": "zctipc.Queue", "bytes": 1 << 20, "median_us": 30.0}]},
        "queue": {"latency": [{"peer": "zctipc.Queue", "consumer_cpu": 0.0, "median_us": 30.0}]},
    }
    ratios = {row[0]: row[3] for row in run.floor_rows({"floor": floor, "suites": suites})}
    assert ratios == {"handoff": "1.5x", "queue": "3.0x"}
    # The floor the hand-off suite measured before the size's peers, when it did.
    suites["handoff"]["results"][0]["floor_us"] = 15.0
    ratios = {row[0]: row[3] for row in run.floor_rows({"floor": floor, "suites": suites})}
    assert ratios == {"handoff": "2.0x", "queue": "3.0x"}
    del floor["futex_wake_2ms"], suites["handoff"]["results"][0]["floor_us"]
    ratios = {row[0]: row[3] for row in run.floor_rows({"floor": floor, "suites": suites})}
    assert ratios == {"handoff": "3.0x", "queue": "3.0x"}
