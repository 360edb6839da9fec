"""zctipc bench against what breaks a run: arguments that could only fail
after it (a README without one numbers block, or a read-only one, a report
where none can go, no suite), numbers the suite scripts cannot use, a
write cut short, a module of its own mistaken for a peer, and an interrupt
that reaches it alone (Note [an interrupted run] in benchmarks/_common.py).
Each refusal is a sentence and exit status 2 before anything runs, never a
traceback or a README half written."""

import importlib.util
import os
import signal
import stat
import subprocess
import sys
import time

import _docblocks
import pytest
from conftest import SWEEP_TIMEOUT, with_pythonpath

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
NUMBERS = "# A project\n\n<!-- BEGIN bench_numbers -->\nold numbers\n<!-- END bench_numbers -->\n\nThe end.\n"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"attacked_{name}", os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # puts benchmarks/ on sys.path, as run.py does when it runs
    return module


@pytest.fixture(scope="module")
def run():
    return _load("run")


@pytest.fixture(scope="module")
def common(run):
    return sys.modules["_common"]


def _refused(capsys, main, argv):
    """main(argv)'s error line: it must exit 2 with one, and start nothing."""
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "floor" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "only,says",
    [
        ("", "--only '' names no suite; the suites are handoff, queue"),
        (",", "--only ',' names no suite"),
        ("queue,nonsense", "unknown suite 'nonsense'; the suites are handoff"),
    ],
)
def test_no_suite_or_an_unknown_one_is_refused(run, capsys, tmp_path, only, says):
    assert says in _refused(capsys, run.main, ["--only", only, "--out", str(tmp_path)])


@pytest.mark.parametrize(
    "text,says",
    [
        ("# no block\n", "has no <!-- BEGIN bench_numbers --> ... <!-- END bench_numbers --> block to write"),
        (NUMBERS + NUMBERS, "has 2 <!-- BEGIN bench_numbers --> markers; it must have one"),
        (NUMBERS.replace("<!-- END bench_numbers -->", ""), "has 0 <!-- END bench_numbers --> markers"),
        (NUMBERS + "<!-- END bench_numbers -->\n", "has 2 <!-- END bench_numbers --> markers"),
        (
            "<!-- END bench_numbers -->\nmiddle\n<!-- BEGIN bench_numbers -->\n",
            "has its <!-- END bench_numbers --> before its <!-- BEGIN bench_numbers -->",
        ),
        (b"\xff\xfe not text", "cannot be read"),
    ],
    ids=["none", "twice", "no-end", "two-ends", "out-of-order", "not-text"],
)
def test_a_readme_without_one_numbers_block_is_refused_before_the_run(run, capsys, tmp_path, text, says):
    readme = tmp_path / "README.md"
    readme.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = readme.read_bytes()
    line = _refused(capsys, run.main, ["--only", "queue", "--out", str(tmp_path / "out"), "--readme", str(readme)])
    assert line.startswith(f"zctipc bench: error: --readme: {readme} ") and says in line, line
    assert readme.read_bytes() == before


def test_a_readme_that_is_read_only_missing_or_a_folder_is_refused(run, capsys, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(NUMBERS)
    readme.chmod(0o444)  # refused by its mode, also where root could write it
    argv = ["--only", "queue", "--out", str(tmp_path / "out"), "--readme"]
    assert _refused(capsys, run.main, [*argv, str(readme)]).endswith(f"--readme: {readme} is read-only")
    missing = tmp_path / "nothing.md"
    assert _refused(capsys, run.main, [*argv, str(missing)]).endswith(f"--readme: there is no file {missing}")
    assert _refused(capsys, run.main, [*argv, str(tmp_path)]).endswith(f"--readme: {tmp_path} is not a file")
    line = _refused(capsys, run.main, ["--only", "gpu,arrow", "--readme", str(tmp_path / "x.md")])
    assert line.endswith(
        "--readme writes numbers of the handoff, queue, dataloader and ray suites, and --only gpu,arrow runs "
        "none of them"
    )


def test_a_report_that_cannot_be_written_is_refused_before_the_run(run, capsys, tmp_path):
    (tmp_path / "a-file").write_text("")
    missing = tmp_path / "missing" / "deeper"
    line = _refused(capsys, run.main, ["--only", "gpu", "--out", str(tmp_path), "--json", str(missing / "r.json")])
    assert line.endswith(f"--json {missing / 'r.json'}: there is no folder {missing}")
    line = _refused(capsys, run.main, ["--only", "gpu", "--out", str(tmp_path), "--json", str(tmp_path)])
    assert line.endswith(f"--json {tmp_path} is a folder; give the path of a file")
    line = _refused(capsys, run.main, ["--only", "gpu", "--out", str(tmp_path / "a-file")])
    assert line.endswith(f"--out {tmp_path / 'a-file'} is not a folder")
    line = _refused(capsys, run.main, ["--only", "gpu", "--out", str(tmp_path / "a-file" / "under")])
    assert line.endswith(f"--out {tmp_path / 'a-file' / 'under'}: Not a directory")


def test_the_command_line_says_it_in_a_line_too(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "zctipc", "bench", "--only", ",", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "zctipc bench: error: --only ',' names no suite; the suites are handoff, queue, stream, arrow, gpu, ray, "
        "dataloader"
    )
    assert os.listdir(tmp_path) == [], "nothing ran"


@pytest.mark.parametrize(
    "script,argv,says",
    [
        ("bench_handoff", ["--rounds", "0"], "argument --rounds: 0 is not above zero"),
        ("bench_handoff", ["--rounds", "-3"], "argument --rounds: -3 is not above zero"),
        ("bench_handoff", ["--rounds", "2.5"], "argument --rounds: '2.5' is not a whole number"),
        ("bench_handoff", ["--sizes", "0"], "argument --sizes: unknown '0'; the choices are 1M, 100M, 1G"),
        ("bench_handoff", ["--sizes=-1M"], "argument --sizes: unknown '-1M'"),
        ("bench_handoff", ["--sizes", ""], "argument --sizes: '' names none of 1M, 100M, 1G"),
        ("bench_stream", ["--seconds", "0"], "argument --seconds: 0 is not above zero"),
        ("bench_stream", ["--seconds", "-1"], "argument --seconds: -1 is not above zero"),
        ("bench_stream", ["--seconds", "nan"], "argument --seconds: nan is not above zero"),
        ("bench_stream", ["--rounds", "0"], "argument --rounds: 0 is not above zero"),
        ("bench_stream", ["--only", "nonsense"], "argument --only: unknown 'nonsense'; the choices are throughput"),
        ("bench_queue", ["--only", ""], "argument --only: '' names none of"),
        ("bench_arrow", ["--only", "tables,x"], "argument --only: unknown 'tables'"),
        ("bench_dataloader", ["--only", "huge"], "argument --only: unknown 'huge'; the choices are large, small"),
    ],
)
def test_the_suite_scripts_refuse_numbers_they_cannot_use(capsys, script, argv, says):
    assert says in _refused(capsys, _load(script).main, [*argv, "--json", os.devnull])


def test_a_readme_write_cut_short_leaves_the_readme_whole(common, tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(NUMBERS)
    readme.chmod(0o640)
    link = tmp_path / "LINK.md"
    link.symlink_to(readme)

    def cut(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(common.os, "replace", cut)
    with pytest.raises(KeyboardInterrupt):
        common.update_readme(str(readme), "bench_numbers", "new numbers", by="a test")
    assert readme.read_text() == NUMBERS, "the old block, whole"
    assert sorted(os.listdir(tmp_path)) == ["LINK.md", "README.md"], "no file left beside it"
    monkeypatch.undo()
    common.update_readme(str(link), "bench_numbers", "new numbers", by="a test")
    assert link.is_symlink(), "the file it points to is written, not the link replaced"
    text = readme.read_text()
    assert text.startswith("# A project\n\n<!-- BEGIN bench_numbers -->\n<!-- generated by a test; do not edit -->")
    assert (
        "new numbers" in text
        and "old numbers" not in text
        and text.endswith("<!-- END bench_numbers -->\n\nThe end.\n")
    )
    assert stat.S_IMODE(readme.stat().st_mode) == 0o640, "its permissions kept"
    # Markers lost while the run ran: refused, and the file left as it is.
    readme.write_text("# gone\n")
    with pytest.raises(ValueError, match="has no <!-- BEGIN bench_numbers -->"):
        common.update_readme(str(readme), "bench_numbers", "new numbers", by="a test")
    assert readme.read_text() == "# gone\n"


def test_a_missing_module_of_its_own_is_a_fault_not_a_peer(run, common):
    assert run.missing_package(ModuleNotFoundError("No module named 'torch.utils'", name="torch.utils")) == "torch"
    assert run.missing_package(ModuleNotFoundError("No module named 'pyarrow'", name="pyarrow")) == "pyarrow"
    for own in ("_pool", "_state_dict", "zctipc._wire", "bench_queue", None):
        assert run.missing_package(ModuleNotFoundError("gone", name=own)) is None, own
    assert common.install_hint("faster_fifo_reduction").startswith("pip install faster-fifo brings it")


def test_a_suite_report_may_go_to_a_bare_file_name(common, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    common.finish({"benchmark": "x"}, "text", "r.json")
    assert (tmp_path / "r.json").is_file()


@pytest.mark.slow
def test_a_run_that_makes_no_readme_numbers_leaves_the_readme_and_says_why(tmp_path):
    # Without torch (a stand-in that fails to import, ahead of the real
    # one) the dataloader suite is skipped, naming the package that brings
    # it, and makes none of the README's numbers: the README is left as it
    # was, and the run says so and fails.
    (tmp_path / "torch.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    readme = tmp_path / "README.md"
    readme.write_text(NUMBERS)
    env = dict(os.environ, PYTHONPATH=with_pythonpath(str(tmp_path)))
    out = subprocess.run(
        [sys.executable, "-m", "zctipc", "bench", "--tiny", "--only", "dataloader", "--out", str(tmp_path / "out")]
        + ["--readme", str(readme)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    why = "it needs torch, which is not installed; pip install torch brings it"
    assert f"skipping the dataloader suite: {why}" in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "zctipc bench: this run made none of the README's numbers (the suites they come from, handoff, queue, "
        f"dataloader, ray, were skipped or made no such rows); {readme} is as it was"
    )
    assert readme.read_text() == NUMBERS
    assert (tmp_path / "out" / "report.json").is_file(), "the report is written all the same"


def _interrupt(isolated, tmp_path, suite, signum, group):
    """Run a suite, send signum once it has children and segments (to the
    whole group, as Ctrl-C does, or to zctipc bench alone), and check that
    it ends, leaving no process, no segment and the README as it was."""
    readme = tmp_path / "README.md"
    readme.write_text(NUMBERS)
    mark = f"BENCH_ATTACK_RUN={os.urandom(8).hex()}"
    env = dict(isolated, BENCH_ATTACK_RUN=mark.split("=")[1], ZCTIPC_BENCH_WITHOUT="ray,pythusa,faster-fifo,iceoryx2")
    command = [sys.executable, "-m", "zctipc", "bench", "--tiny", "--only", suite, "--out", str(tmp_path / "out")]
    bench = subprocess.Popen(
        [*command, "--readme", str(readme)] if suite != "arrow" else command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "stderr", "w"),
        start_new_session=True,  # its own group, as a terminal's job
    )
    shm = isolated["ZCTIPC_SHM_DIR"]
    try:
        deadline = time.monotonic() + 120
        while not (os.listdir(shm) and len(_docblocks.processes_with(mark)) >= 3):  # it, and children of its own
            assert bench.poll() is None and time.monotonic() < deadline, "the suite started no children in time"
            time.sleep(0.05)
        if group:
            os.killpg(bench.pid, signum)
        else:
            bench.send_signal(signum)
        rc = bench.wait(timeout=60)
    finally:
        for pid in _docblocks.processes_with(mark):  # the test's own cleanup, whatever happened
            os.kill(pid, signal.SIGKILL)
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    err = (tmp_path / "stderr").read_text()
    deadline = time.monotonic() + SWEEP_TIMEOUT
    while (left := _docblocks.processes_with(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left running: {left}"
    while (files := os.listdir(shm)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not files, f"left in {shm}: {files}"
    assert readme.read_text() == NUMBERS
    return rc, err


@pytest.mark.slow
def test_sigint_to_bench_alone_stops_what_it_started(isolated, tmp_path):
    # The arrow suite's child waits on a pipe that zctipc bench holds open,
    # and zctipc bench, at its exit, for the child: without Note [an
    # interrupted run], neither ever ended.
    rc, err = _interrupt(isolated, tmp_path, "arrow", signal.SIGINT, group=False)
    assert rc == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("zctipc bench: interrupted (SIGINT) before the run ended; stopped ")


@pytest.mark.slow
def test_ctrl_c_to_the_group_leaves_nothing(isolated, tmp_path):
    rc, err = _interrupt(isolated, tmp_path, "handoff", signal.SIGINT, group=True)
    assert rc == 130, err[-3000:]
    assert "zctipc bench: interrupted (SIGINT) before the run ended" in err


@pytest.mark.slow
def test_sigterm_stops_what_it_started(isolated, tmp_path):
    rc, err = _interrupt(isolated, tmp_path, "queue", signal.SIGTERM, group=False)
    assert rc == 128 + signal.SIGTERM, err[-3000:]
    assert "zctipc bench: interrupted (SIGTERM) before the run ended" in err
