"""The documentation cannot drift from the code.

Every fenced code block of every Markdown file of the project (README.md,
CHANGELOG.md, CONTRIBUTING.md, docs/, and any other, wherever it is; every
fence that renders as code: Note [what counts as a block] in _docblocks)
runs as written, each a program of its own in a fresh process with a
segment directory of its own, and leaves no segment and no process behind:
Python blocks with this Python (an exception in a thread or a child fails
one too), shell blocks with bash -euo pipefail, Go blocks built against
this source tree, C blocks compiled against the package's libzctipc.so.
JSON blocks parse; text blocks (diagrams, wire messages) are not code; a
block must say which it is. A comment after a print (``# 42``, ``// 42``,
``/* 42 */``) is what it prints.

A block that cannot run says why in an HTML comment on the line just before
it, ``<!-- skip: reason -->``, and there are few of them; a block that needs
a GPU (and uses one) is marked ``<!-- gpu -->`` and is skipped, with the
reason, where there is none.

The references are whole, both ways: every environment variable the code
reads is in docs/reference/environment.md (Note [the environment the code
reads] in _docblocks), every exception in docs/reference/errors.md, every
public name in the API reference by a directive of its own, every
subcommand in the command line's page; and the README is a door, whose
numbers are the benchmark report's. test_docs_attacks.py tries each of
these rules against pages and trees made to get past it."""

import importlib.util
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import time

import _docblocks
import pytest
from _docblocks import RUN
from conftest import SWEEP_TIMEOUT

import zctipc

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
README = os.path.join(ROOT, "README.md")

#: Every Markdown file whose blocks run: the README, the changes and the
#: contributor's guide beside it, the site's pages, and any other the
#: project has or gains, wherever it is (_docblocks.markdown_files).
MARKDOWN = _docblocks.markdown_files(ROOT)
PAGES = {path: _docblocks.parse(open(path).read(), os.path.relpath(path, ROOT)) for path in MARKDOWN}
BLOCKS = [b for page in PAGES.values() for b in page.blocks]
RUNNABLE = [b for b in BLOCKS if b.lang in RUN]
SKIPPED = [b for b in RUNNABLE if b.marker.startswith("skip:")]


def test_every_block_says_what_it_is():
    # Note [what counts as a block] in _docblocks: no fence, marker or
    # indented block hides code from the runner, and each block says what
    # it is in words the runner knows.
    problems = [p for page in PAGES.values() for p in page.problems] + _docblocks.check(BLOCKS)
    assert not problems, "\n".join(problems)


def test_every_snippet_brings_in_a_page_whose_blocks_run():
    # The site includes files (--8<-- "README.md:install"): a file that
    # is not one of MARKDOWN would bring in blocks that never run here.
    ours = {os.path.relpath(p, ROOT) for p in MARKDOWN}
    for path, page in PAGES.items():
        for name in page.includes:
            assert os.path.normpath(name) in ours, (
                f"{os.path.relpath(path, ROOT)} includes {name}, whose blocks do not run"
            )


def test_the_pages_have_their_examples():
    assert {"README.md", "CHANGELOG.md", "CONTRIBUTING.md", "docs/index.md"} <= {
        os.path.relpath(p, ROOT) for p in MARKDOWN
    }
    by_file = {}
    for where, lang, marker, *_ in RUNNABLE:
        if not marker.startswith("skip:"):
            by_file.setdefault(where.split(":")[0], set()).add(lang)
    assert by_file["README.md"] == {"python"}, "the first program"
    assert len([b for b in RUNNABLE if b[0].startswith("docs/pytorch.md")]) >= 4, (
        "DataLoader, Hogwild, spawn, state dicts"
    )
    for page, lang in [
        ("docs/queues.md", "python"),
        ("docs/streams.md", "python"),
        ("docs/arrow.md", "python"),
        ("docs/ray.md", "python"),
        ("docs/go.md", "go"),
        ("docs/c-abi.md", "c"),
        ("docs/reference/cli.md", "sh"),
    ]:
        assert lang in by_file.get(page, set()), f"{page} has no {lang} example that runs"


def test_few_blocks_are_skipped():
    # Each says why (test_every_block_says_what_it_is).
    assert len(SKIPPED) <= 4, f"blocks that do not run: {[b.where for b in SKIPPED]}"


@pytest.mark.parametrize("where,code", [(b.where, b.code) for b in BLOCKS if b.lang == "json"])
def test_every_json_block_parses(where, code):
    json.loads(code)


def _gpu_reason():
    """Why GPU blocks cannot run here, or None when they can."""
    from zctipc import cuda

    reason = cuda.unavailable_reason()
    if reason is None:
        import torch

        if not torch.cuda.is_available():
            reason = "torch sees no CUDA device"
    return reason


def _program(lang, code, tmp_path):
    """The command that runs a block: built first, for Go and C."""
    if lang == "python":
        program = tmp_path / "example.py"  # a file: forkserver children import the main module
        program.write_text(code)
        return [sys.executable, str(program)]
    if lang == "sh":
        return [*_docblocks.SHELL, code]
    if lang == "go":
        go = shutil.which("go")
        if go is None:
            pytest.skip("go is not on PATH: Go blocks are built with it")
        # Built as a package of this module (an overlay adds the file to the
        # tree for this build only), so that it imports go/zctipc from here.
        source, program = tmp_path / "main.go", tmp_path / "example"
        source.write_text(code)
        overlay = tmp_path / "overlay.json"
        overlay.write_text(json.dumps({"Replace": {os.path.join(ROOT, "_docblock", "main.go"): str(source)}}))
        built = subprocess.run(
            [go, "build", "-overlay", str(overlay), "-o", str(program), "./_docblock"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert built.returncode == 0, f"go build:\n{built.stderr[-3000:]}"
        return [str(program)]
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler: C blocks are compiled with one")
    package = os.path.dirname(os.path.abspath(zctipc.__file__))  # zctipc.h and libzctipc.so, as installed
    source, program = tmp_path / "example.c", tmp_path / "example"
    source.write_text(code)
    built = subprocess.run(
        [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", package, str(source), "-L", package, "-lzctipc"]
        + [f"-Wl,-rpath,{package}", "-o", str(program)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, f"cc:\n{built.stderr[-3000:]}"
    return [str(program)]


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b not in SKIPPED], ids=lambda b: b.where)
def test_every_block_runs_as_written(isolated, tmp_path, block):
    where, lang, marker, code = block[:4]
    if marker == "gpu" and (reason := _gpu_reason()):
        pytest.skip(f"{where} needs a GPU: {reason}")
    command = _program(lang, code, tmp_path)
    # The shell finds this Python's zctipc and python first; ray.init()
    # starts a cluster of the block's own, whatever other runs on the machine.
    path = os.pathsep.join([os.path.dirname(sys.executable), isolated.get("PATH", "")])
    env = dict(isolated, PYTHONWARNINGS="ignore::RuntimeWarning", PATH=path, RAY_ADDRESS="local")
    out = _docblocks.run(command, env, str(tmp_path), timeout=120, linger=SWEEP_TIMEOUT)
    assert out.returncode == 0, f"{where}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    if lang == "python":  # an exception in a thread or a child leaves the exit status 0
        assert not _docblocks.UNHANDLED.search(out.stderr), (
            f"{where} raised where it did not fail:\n{out.stderr[-3000:]}"
        )
    missing = _docblocks.unprinted(lang, code, out.stdout)
    assert not missing, f"{where} says it prints {missing}, each a line of its own: {out.stdout!r}"
    # Every process it started has ended with it (Ray's, forkserver's
    # within the window _docblocks.run gives them; the cleanup daemon, which
    # is none of its own, goes with the isolated fixture).
    assert not out.left, f"{where} left processes running: {out.left}"
    # What the example's own program made and let go of is let go of, or
    # swept by the daemon, within the sweep window.
    deadline = time.monotonic() + SWEEP_TIMEOUT
    while (left := os.listdir(isolated["ZCTIPC_SHM_DIR"])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"{where} left {left} behind"


def _reference(name):
    with open(os.path.join(DOCS, "reference", name)) as f:
        return f.read()


def test_every_environment_variable_is_documented():
    # Note [the environment the code reads] in _docblocks.
    names, problems = _docblocks.environment_variables(ROOT)
    assert not problems, "\n".join(problems)
    documented = _docblocks.documented_variables(_reference("environment.md"))
    missing = sorted(names - documented)
    assert not missing, f"read by the code, not in docs/reference/environment.md: {missing}"
    stale = sorted(documented - names)
    assert not stale, f"in docs/reference/environment.md, read by no code: {stale}"


def test_every_exception_is_in_the_errors_page():
    page = _reference("errors.md")
    classes = _docblocks.exception_classes(os.path.dirname(zctipc.__file__))
    elsewhere = sorted(f"{module}.{name}" for name, module in classes.items() if module != "zctipc.errors")
    assert not elsewhere, f"exceptions outside zctipc.errors, which the errors page is about: {elsewhere}"
    assert set(classes) == set(zctipc.errors.__all__), "zctipc.errors.__all__ names its exceptions"
    rows = set(re.findall(r"^\| `(\w+)` \|", page, re.M))
    missing = sorted(set(classes) - rows)
    assert not missing, f"zctipc.errors has {missing}, which docs/reference/errors.md lacks"
    stale = sorted(rows - set(classes))
    assert not stale, f"docs/reference/errors.md has {stale}, which zctipc.errors lacks"


def test_every_public_name_is_in_the_api_reference():
    page = _reference("api.md")
    whole = ("zctipc.errors", "zctipc.cuda", "zctipc.ray")
    for module in whole:
        assert module in _docblocks.api_targets(page), f"{module} is documented whole"
    own = set(zctipc.__all__) - set(multiprocessing.__all__) - set(zctipc.errors.__all__)
    names = {name: getattr(zctipc, name) for name in own}
    missing = _docblocks.undocumented(names, page, aliases=zctipc._RENAMED, whole=whole)
    assert not missing, f"public names not in docs/reference/api.md: {missing}"


def test_every_command_is_in_the_cli_page():
    commands = _docblocks.commands(zctipc.cli._parser()[0])
    assert {"ls", "gc", "doctor", "bench"} <= commands
    documented = _docblocks.documented_commands(_reference("cli.md"))
    assert not commands - documented, f"zctipc commands not in docs/reference/cli.md: {sorted(commands - documented)}"
    assert not documented - commands, (
        f"docs/reference/cli.md has commands zctipc lacks: {sorted(documented - commands)}"
    )


def _bench_run():
    spec = importlib.util.spec_from_file_location("bench_run", os.path.join(ROOT, "benchmarks", "run.py"))
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    return run


def test_the_readme_is_a_door_whose_numbers_are_the_reports():
    with open(README) as f:
        readme = f.read()
    assert readme.count("\n") <= 250, "the README is a door: guides and references are pages of docs/"
    assert readme.startswith("# zctipc") and "make demo" in readme.split("\n## ")[0] and "make test" in readme
    # The report is linked, never copied: the README holds the numbers block
    # that zctipc bench --readme writes from the report, and nothing more of it.
    with open(os.path.join(DOCS, "bench", "report.json")) as f:
        report = json.load(f)
    block = readme.split("<!-- BEGIN bench_numbers -->", 1)[1].split("<!-- END bench_numbers -->", 1)[0]
    assert _bench_run().numbers(report, "docs/bench/report.md") in block
    assert len(re.findall(r"^\| ", block, re.M)) == 2 + 5, "five numbers"
    assert "## handoff" not in readme and "BEGIN bench_report" not in readme
