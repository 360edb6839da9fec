"""The documentation cannot drift from the code.

Every fenced code block of every Markdown file (README.md, CHANGELOG.md,
CONTRIBUTING.md and docs/) runs as written, each a program of its own in a
fresh process with a segment directory of its own, and leaves no segment
behind: Python blocks with this Python, shell blocks with bash -e, Go
blocks built against this source tree, C blocks compiled against the
package's libzctipc.so. JSON blocks parse; text blocks (diagrams, wire
messages) are not code; a block must say which it is. A comment after a
print (``# 42``, ``// 42``, ``/* 42 */``) is what it prints.

A block that cannot run says why in an HTML comment on the line before it,
``<!-- skip: reason -->``, and there are few of them; a block that needs a
GPU is marked ``<!-- gpu -->`` and is skipped, with the reason, where there
is none.

The references are whole: every environment variable the code reads is in
docs/reference/environment.md, every exception in docs/reference/errors.md,
every public name in the API reference, every subcommand in the command
line's page; and the README is a door, whose numbers are the benchmark
report's."""

import glob
import importlib.util
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from conftest import SWEEP_TIMEOUT

import zctipc

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
README = os.path.join(ROOT, "README.md")

#: Every Markdown file whose blocks run: the README, the changes and the
#: contributor's guide beside it, and the site's pages.
MARKDOWN = sorted(
    [README]
    + [p for p in (os.path.join(ROOT, "CHANGELOG.md"), os.path.join(ROOT, "CONTRIBUTING.md")) if os.path.exists(p)]
    + glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)
)

RUN = {"python", "sh", "go", "c"}  # run as programs
CHECKED = {"json"}  # parsed
TEXT = {"text"}  # not code: diagrams and wire messages

#: A fenced block, with the HTML comment on the line before it, if any.
FENCE = re.compile(
    r"(?:^<!--[ \t]*(?P<marker>[^\n]*?)[ \t]*-->\n)?"  # <!-- skip: why --> or <!-- gpu -->
    r"^```(?P<lang>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$",
    re.M | re.S,
)

#: What a block says it prints, by language: the comment after a print.
PRINTS = {
    "python": re.compile(r"^\s*print\(.*?\)\s*#\s*(.+)$", re.M),
    "go": re.compile(r"^\s*fmt\.Print(?:ln|f)?\(.*\)\s*//\s*(.+)$", re.M),
    "c": re.compile(r"^\s*printf\(.*\);\s*/\*\s*(.+?)\s*\*/\s*$", re.M),
}


def blocks(path):
    """(where, language, marker, code) of every fenced block of a file."""
    with open(path) as f:
        text = f.read()
    where = os.path.relpath(path, ROOT)
    return [
        (f"{where}:{text.count(chr(10), 0, m.start('lang')) + 1}", m["lang"].strip(), m["marker"] or "", m["code"])
        for m in FENCE.finditer(text)
    ]


BLOCKS = [b for path in MARKDOWN for b in blocks(path)]
RUNNABLE = [b for b in BLOCKS if b[1] in RUN]
SKIPPED = [b for b in RUNNABLE if b[2].startswith("skip:")]


def test_every_block_says_what_it_is():
    unknown = [f"{where} ({lang or 'no language'})" for where, lang, _, _ in BLOCKS if lang not in RUN | CHECKED | TEXT]
    assert not unknown, f"blocks of no known kind (say python, sh, go, c, json or text): {unknown}"
    markers = {marker.split(":")[0] for _, _, marker, _ in BLOCKS if marker}
    assert markers <= {"skip", "gpu"}, f"unknown markers before blocks: {markers}"


def test_the_pages_have_their_examples():
    by_file = {}
    for where, lang, marker, _ in RUNNABLE:
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


def test_few_blocks_are_skipped_and_each_says_why():
    assert len(SKIPPED) <= 4, f"blocks that do not run: {[where for where, *_ in SKIPPED]}"
    for where, _, marker, _ in SKIPPED:
        reason = marker.split(":", 1)[1].strip()
        assert len(reason) >= 20, f"{where}: the skip says too little of why: {reason!r}"


@pytest.mark.parametrize("where,code", [(w, c) for w, lang, _, c in BLOCKS if lang == "json"])
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
        return ["bash", "-e", "-o", "pipefail", "-c", code]
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


@pytest.mark.parametrize(
    "where,lang,marker,code",
    [b for b in RUNNABLE if b not in SKIPPED],
    ids=[b[0] for b in RUNNABLE if b not in SKIPPED],
)
def test_every_block_runs_as_written(isolated, tmp_path, where, lang, marker, code):
    if marker == "gpu" and (reason := _gpu_reason()):
        pytest.skip(f"{where} needs a GPU: {reason}")
    command = _program(lang, code, tmp_path)
    # The shell finds this Python's zctipc and python first; ray.init()
    # starts a cluster of the block's own, whatever other runs on the machine.
    path = os.pathsep.join([os.path.dirname(sys.executable), isolated.get("PATH", "")])
    env = dict(isolated, PYTHONWARNINGS="ignore::RuntimeWarning", PATH=path, RAY_ADDRESS="local")
    out = subprocess.run(command, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{where}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    for printed in PRINTS.get(lang, re.compile("$^")).findall(code):
        assert printed.strip() in out.stdout, f"{where} says it prints {printed.strip()}: {out.stdout!r}"
    # Processes the example's own program started and ended (Ray's workers)
    # are let go of, or swept by the daemon, within the sweep window.
    deadline = time.monotonic() + SWEEP_TIMEOUT
    while (left := os.listdir(isolated["ZCTIPC_SHM_DIR"])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"{where} left {left} behind"


def _reference(name):
    with open(os.path.join(DOCS, "reference", name)) as f:
        return f.read()


def test_every_environment_variable_is_documented():
    names = set()
    for top in ("go", "python", "benchmarks", "tests"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith((".go", ".py", ".c", ".h")):
                    with open(os.path.join(dirpath, name), errors="replace") as f:
                        text = f.read()
                    names |= set(re.findall(r"\bZCTIPC_[A-Z0-9_]+\b", text))
                    if top in ("go", "python"):  # any other variable the library reads by name
                        names |= set(
                            re.findall(
                                r"(?:Getenv|LookupEnv|getenv|environ\.get|environ\[)\(?\s*\"([A-Z][A-Z0-9_]*)\"", text
                            )
                        )
    names = {n for n in names if not n.endswith("_H")}  # C include guards
    table = _reference("environment.md").split("Environment variables:", 1)[1]
    missing = sorted(n for n in names if f"| `{n}` |" not in table)
    assert not missing, f"read by the code, not in docs/reference/environment.md: {missing}"


def test_every_exception_is_in_the_errors_page():
    page = _reference("errors.md")
    missing = [name for name in zctipc.errors.__all__ if f"| `{name}` |" not in page]
    assert not missing, f"zctipc.errors has {missing}, which docs/reference/errors.md lacks"


def test_every_public_name_is_in_the_api_reference():
    page = _reference("api.md")
    documented = {line.split(".")[-1] for line in re.findall(r"^::: (zctipc[\w.]*)$", page, re.M)}
    assert "errors" in documented, "the exceptions, from zctipc.errors"
    own = set(zctipc.__all__) - set(multiprocessing.__all__) - set(zctipc.errors.__all__)
    missing = sorted(name for name in own if name not in documented and f"`{name}`" not in page)
    assert not missing, f"public names not in docs/reference/api.md: {missing}"
    for module in ("cuda", "ray"):
        assert module in documented, f"zctipc.{module} is documented whole"


def test_every_command_is_in_the_cli_page():
    out = subprocess.run([sys.executable, "-m", "zctipc", "--help"], capture_output=True, text=True, timeout=60)
    commands = re.search(r"\{([\w,-]+)\}", out.stdout).group(1).split(",")
    assert {"ls", "gc", "doctor", "bench"} <= set(commands)
    page = _reference("cli.md")
    missing = [c for c in commands if f"| `zctipc {c}" not in page]
    assert not missing, f"zctipc commands not in docs/reference/cli.md: {missing}"


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
