"""The package is typed (PEP 561): mypy --strict, with the settings in
pyproject.toml, passes on it and on a typed program that uses it
(tests/typed/example.py), and reports each misuse planted in
tests/typed/misuse.py, where it is planted and nowhere else."""

import ast
import os
import re
import subprocess
import sys

import pytest

import zctipc

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join("python", "zctipc")
EXAMPLE = os.path.join("tests", "typed", "example.py")
MISUSE = os.path.join("tests", "typed", "misuse.py")
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")
EXPECT = re.compile(r"#\s*expect:\s*(?P<code>[a-z-]+)\s*$")


@pytest.fixture(scope="module")
def mypy_cache():
    """The project's cache, which make lint's mypy run (before the tests in
    make test) leaves warm: the runs here read the package's, NumPy's and
    torch's types from it instead of analysing them again."""
    return os.path.join(ROOT, ".mypy_cache")


def mypy(cache, *paths):
    """Run mypy of this Python with the project's settings; (exit status,
    output)."""
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "--cache-dir", str(cache), *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return out.returncode, out.stdout + out.stderr


def errors(output):
    """(path, line, code) of each error mypy reported."""
    found = []
    for line in output.splitlines():
        m = ERROR.match(line)
        if m:
            found.append((os.path.normpath(m["path"]), int(m["line"]), m["code"]))
    return found


def test_mypy_strict_passes_on_the_package_and_a_typed_program(mypy_cache):
    status, output = mypy(mypy_cache, PACKAGE, EXAMPLE)
    assert status == 0, output
    assert "Success" in output, output


def test_mypy_reports_each_planted_misuse_and_nothing_else(mypy_cache):
    with open(os.path.join(ROOT, MISUSE)) as f:
        expected = sorted((MISUSE, number, m["code"]) for number, line in enumerate(f, 1) if (m := EXPECT.search(line)))
    assert len(expected) >= 10, "the misuse file plants at least ten errors"
    status, output = mypy(mypy_cache, MISUSE)
    assert status == 1, output
    assert sorted(errors(output)) == expected, output


def declared_for_type_checkers():
    """The names zctipc/__init__.py binds in its ``if TYPE_CHECKING:`` block."""
    with open(zctipc.__file__) as f:
        tree = ast.parse(f.read())
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    ]
    names = set()
    for node in block.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if not name.startswith("_") or name == "__version__"}


def test_type_checkers_see_every_public_name():
    # Note [a lazy package]: zctipc finds its names on first use, so type
    # checkers see them in a block of their own, which must keep up with
    # the names __getattr__ offers.
    declared = declared_for_type_checkers()
    offered = set(zctipc.__all__) - set(zctipc.errors.__all__) | zctipc._MODULES | zctipc._SUBMODULES
    offered |= {"reducer", "__version__"}
    assert declared == offered, f"missing: {sorted(offered - declared)}; extra: {sorted(declared - offered)}"


def test_the_package_carries_its_marker():
    assert os.path.isfile(os.path.join(os.path.dirname(zctipc.__file__), "py.typed"))
