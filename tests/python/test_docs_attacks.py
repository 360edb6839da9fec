"""The documentation tests against pages, trees and blocks made to get past
them: code that the runner would not see (Note [what counts as a block] in
_docblocks), markers that lie, blocks that fail and pass, and names the
references would miss (Note [the environment the code reads])."""

import argparse
import os
import subprocess
import sys
import textwrap
import time

import _docblocks
import pytest

import zctipc
import zctipc.cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: zctipc's prefix, spelt so that this file names no variable of its own
#: (the environment check reads every string of the tests).
P = "ZCTIPC" + "_"


def page(text):
    return _docblocks.parse(textwrap.dedent(text), "page.md")


def langs(text):
    return [(b.lang, b.code) for b in page(text).blocks]


# What the runner finds.


def test_a_tilde_fence_is_a_block():
    assert langs("~~~python\nprint(1)\n~~~\n") == [("python", "print(1)\n")]


def test_a_fence_with_attributes_is_a_block_of_its_language():
    assert langs('```python title="x.py" hl_lines="1"\nprint(1)\n```\n') == [("python", "print(1)\n")]
    assert langs("``` {.python .numberLines}\nprint(1)\n```\n") == [("python", "print(1)\n")]
    assert page('```python title="x.py"\nprint(1)\n```\n').blocks[0].info == 'python title="x.py"'


def test_an_indented_fence_in_a_list_or_an_admonition_is_a_block():
    listed = """\
    1. Run this:

        ```python
        import sys
        sys.exit(3)
        ```

    2. Then this.
    """
    assert langs(listed) == [("python", "import sys\nsys.exit(3)\n")]
    admonition = "!!! note\n    ```sh\n    exit 1\n    ```\n"
    assert langs(admonition) == [("sh", "exit 1\n")]


def test_a_longer_fence_holds_a_shorter_one_as_its_text():
    nested = "````text\n```python\nraise SystemExit(1)\n```\n````\n"
    assert langs(nested) == [("text", "```python\nraise SystemExit(1)\n```\n")]
    assert langs("````python\nprint(1)\n````\n") == [("python", "print(1)\n")]
    # ``` does not close ~~~, nor ~~~ ```.
    assert langs("~~~python\n```\nx = 1\n~~~\n") == [("python", "```\nx = 1\n")]


def test_a_block_in_details_is_a_block():
    details = "<details>\n<summary>More</summary>\n\n```python\nprint(1)\n```\n\n</details>\n"
    assert langs(details) == [("python", "print(1)\n")]


def test_a_fence_never_closed_is_an_error():
    p = page("text\n\n```python\nprint(1)\n")
    assert p.problems == ["page.md:3: a fence that is never closed: the rest of the page is its code"]


def test_an_indented_code_block_is_an_error():
    p = page("A paragraph.\n\n    import zctipc\n    print(zctipc)\n\nMore.\n")
    assert len(p.problems) == 1 and "page.md:3: an indented code block" in p.problems[0]
    assert _docblocks.parse("    import zctipc\n").problems, "at the start of a page"
    # A list item's continuation is no code, nor a line inside a paragraph.
    assert not page("- item\n\n    more of the item\n").problems
    assert not page("1. item\n   wrapped\n\n    more\n").problems
    assert not page("A paragraph\n    indented in it.\n").problems


def test_a_marker_not_just_before_a_block_is_an_error():
    p = page("<!-- skip: a reason long enough to pass -->\n\n```python\nprint(1)\n```\n")
    assert p.blocks[0].marker == "", "a blank line between: the block runs"
    assert p.problems == [
        "page.md:1: <!-- skip: a reason long enough to pass --> is not on the line just before a block, "
        "so it marks none"
    ]
    # Just before: it marks that block, and no other.
    p = page("<!-- gpu -->\n```python\nimport torch\ntorch.cuda.init()\n```\n\n```python\nprint(1)\n```\n")
    assert [b.marker for b in p.blocks] == ["gpu", ""] and not p.problems
    # A marker shown inside a block is text.
    assert not page("````text\n<!-- skip: shown, not meant -->\n````\n").problems


def test_markers_must_be_honest():
    def problems(text):
        return _docblocks.check(page(text).blocks)

    assert "unknown marker <!-- skip -->" in problems("<!-- skip -->\n```python\nprint(1)\n```\n")[0]
    assert "too little of why: 'later'" in problems("<!-- skip: later -->\n```python\nprint(1)\n```\n")[0]
    assert "touches no GPU" in problems("<!-- gpu -->\n```python\nprint(1)\n```\n")[0]
    assert (
        "unknown marker <!-- gpu: two of them -->"
        in problems("<!-- gpu: two of them -->\n```python\nimport torch\ntorch.cuda.init()\n```\n")[0]
    )
    assert (
        "before a text block, which never runs"
        in problems("<!-- skip: not code at all, a diagram -->\n```text\nx\n```\n")[0]
    )
    assert "no known kind (py)" in problems("```py\nprint(1)\n```\n")[0]
    assert "no known kind (no language)" in problems("```\nprint(1)\n```\n")[0]
    assert not problems("<!-- skip: needs a cluster of eight machines -->\n```python\nprint(1)\n```\n")
    assert not problems("<!-- gpu -->\n```python\nimport torch\nx = torch.ones(1, device='cuda')\n```\n")


def test_a_program_called_text_is_refused():
    (problem,) = _docblocks.check(page("```text\nimport zctipc\nzctipc.Queue().put(1)\n```\n").blocks)
    assert "a text block that is a Python program" in problem
    assert not _docblocks.check(page("```text\nproducer --put--> [ring] --get--> consumer\n```\n").blocks)


def test_a_shell_block_may_not_chain_with_and():
    (problem,) = _docblocks.check(page("```sh\ncd /nonexistent && ls\necho done\n```\n").blocks)
    assert "chains commands with &&" in problem


def test_every_markdown_file_of_the_tree_is_read_wherever_it_is(tmp_path):
    # A page in a new folder, a README beside the Go code, a page that no
    # nav lists: all are read; hidden folders and build outputs are not.
    for name in ("README.md", "docs/index.md", "docs/new/deeper/page.md", "go/README.md", "docs/orphan.markdown"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("```python\nprint(1)\n```\n")
    (tmp_path / "mkdocs.yml").write_text("nav:\n  - Home: index.md\n")
    for name in (".venv/lib/x.md", "build/x.md", "site/index.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("```python\nraise SystemExit(1)\n```\n")
    found = {os.path.relpath(p, tmp_path) for p in _docblocks.markdown_files(str(tmp_path))}
    assert found == {"README.md", "docs/index.md", "docs/new/deeper/page.md", "go/README.md", "docs/orphan.markdown"}
    # In a checkout, git says: what it ignores is not the project's, what it
    # does not know of yet is.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=60)
    (tmp_path / ".gitignore").write_text("/ignored/\n")
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "x.md").write_text("```python\nraise SystemExit(1)\n```\n")
    found = {os.path.relpath(p, tmp_path) for p in _docblocks.markdown_files(str(tmp_path))}
    assert "ignored/x.md" not in found and "docs/new/deeper/page.md" in found and "build/x.md" in found


def test_snippets_are_listed():
    p = page('--8<-- "README.md:install"\n\n;--8<-- "notes/more.md"\n```text\n--8<-- "x.md"\n```\n')
    assert p.includes == ["README.md", "notes/more.md"]


# What the runner does with a block.


def _run(tmp_path, lang, code, **kw):
    command = [*_docblocks.SHELL, code] if lang == "sh" else [sys.executable, "-c", code]
    return _docblocks.run(command, dict(os.environ), str(tmp_path), timeout=60, **kw)


@pytest.mark.parametrize(
    "code",
    [
        "false\ntrue\n",  # an early command fails, the last succeeds
        "false | true\n",  # early in a pipe
        'echo "$NOT_SET_ANYWHERE"\n',  # a variable never set
        'x=$(false; echo hi)\necho "$x"\n',  # inside a command substitution
    ],
    ids=["early", "pipe", "unset", "substitution"],
)
def test_a_shell_block_that_fails_anywhere_fails(tmp_path, code):
    assert _run(tmp_path, "sh", code).returncode != 0


@pytest.mark.slow
def test_a_python_block_that_raises_in_a_thread_or_a_child_is_caught(tmp_path):
    thread = "import threading\nt = threading.Thread(target=lambda: 1 / 0)\nt.start()\nt.join()\n"
    out = _run(tmp_path, "python", thread)
    assert out.returncode == 0 and _docblocks.UNHANDLED.search(out.stderr), out.stderr
    (tmp_path / "child.py").write_text(
        "import multiprocessing as mp\n"
        "def boom():\n    raise ValueError('in the child')\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('spawn').Process(target=boom)\n    p.start()\n    p.join()\n"
    )
    out = _docblocks.run([sys.executable, str(tmp_path / "child.py")], dict(os.environ), str(tmp_path), timeout=60)
    assert out.returncode == 0 and _docblocks.UNHANDLED.search(out.stderr), out.stderr
    leak = "from multiprocessing import shared_memory\nshared_memory.SharedMemory(create=True, size=4096)\n"
    out = _run(tmp_path, "python", leak)
    assert _docblocks.UNHANDLED.search(out.stderr), out.stderr
    assert not _docblocks.UNHANDLED.search(
        _run(tmp_path, "python", "import sys\nprint('fine', file=sys.stderr)").stderr
    )


@pytest.mark.slow
@pytest.mark.parametrize("how", ["&", "setsid"])
def test_a_block_that_leaves_a_process_behind_is_caught_and_the_process_killed(tmp_path, how):
    code = "sleep 600 &\n" if how == "&" else "setsid sleep 600 < /dev/null > /dev/null 2>&1 &\n"
    start = time.monotonic()
    out = _run(tmp_path, "sh", code, linger=0.5)
    assert time.monotonic() - start < 30, "its output is no pipe that the process holds open"
    assert out.returncode == 0
    ((pid, command),) = out.left.items()
    assert command == "sleep 600"
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # killed, waiting for its parent
                break
        time.sleep(0.05)
    else:
        assert not os.path.exists(f"/proc/{pid}"), "killed"


def test_a_block_whose_processes_end_in_time_leaves_none(tmp_path):
    assert _run(tmp_path, "sh", "(sleep 0.3 &)\n", linger=10).left == {}


def test_a_print_comment_is_a_whole_line_of_the_output():
    assert _docblocks.unprinted("python", "print(145)  # 45\n", "145\n") == ["45"]
    code = "print(True)  # True\nprint(x)  # True\n"
    assert _docblocks.unprinted("python", code, "True\nFalse\n") == ["True"]
    assert _docblocks.unprinted("python", code, "True\n True \n") == []
    assert _docblocks.unprinted("c", 'printf("%d\\n", 5); /* 5 */\n', "5\n") == []
    assert _docblocks.unprinted("go", "fmt.Println(x) // 42 true\n", "42 true false\n") == ["42 true"]
    # A comment that explains rather than shows fails where the block runs.
    assert _docblocks.unprinted("python", "print(a == b)  # True: the same pages\n", "True\n") == [
        "True: the same pages"
    ]


# The references.


def _tree(tmp_path, files):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).replace("@", P))
    return _docblocks.environment_variables(str(tmp_path))


def test_every_way_of_reading_a_variable_is_seen(tmp_path):
    names, problems = _tree(
        tmp_path,
        {
            "python/zctipc/a.py": """\
                import os
                from os import environ, getenv
                KNOB_ENV = "@KNOB"
                a = os.environ.get('@SINGLE')
                b = getenv("HOME_DIR_OF_IT")
                c = os.environ.setdefault("SET_DEFAULT", "1")
                d = "IN_ENVIRON" in os.environ
                e = environ["SUBSCRIPT"]
                f = os.environ.get(KNOB_ENV)
                g = os.getenv(other.OTHER_ENV)
            """,
            "python/zctipc/b.py": 'OTHER_ENV = "FROM_ANOTHER_MODULE"\n',
            "go/x/x.go": """\
                package x
                const HelperEnv = "@HELPER"
                var a = os.Getenv(`RAW_STRING`)
                var b = os.Getenv(HelperEnv + "_ARGS")
                var c, _ = os.LookupEnv("LOOKED_UP")
            """,
            "tests/cuda/mock.c": 'const char *n = getenv("@MOCK");\n',
        },
    )
    assert not problems
    expected = {"KNOB", "SINGLE", "HELPER", "HELPER_ARGS", "MOCK"}
    assert {P + n for n in expected} <= names
    assert {"HOME_DIR_OF_IT", "SET_DEFAULT", "IN_ENVIRON", "SUBSCRIPT", "FROM_ANOTHER_MODULE", "RAW_STRING"} <= names
    assert {"LOOKED_UP"} <= names


def test_a_name_built_at_run_time_is_an_error(tmp_path):
    _, problems = _tree(
        tmp_path,
        {
            "python/zctipc/a.py": """\
                import os
                def knob(kind):
                    return os.environ.get(f"@{kind}")
                def other(kind):
                    return os.getenv("PREFIX_" + kind)
            """,
            "go/x/x.go": 'package x\nvar a = os.Getenv(fmt.Sprintf("@%s", kind))\n',
        },
    )
    assert len(problems) == 4, problems  # the f-string's piece, its read, the other read, the Go read
    assert any("python/zctipc/a.py:3: reads a variable whose name is built at run time" in p for p in problems)
    assert any("python/zctipc/a.py:5: reads a variable whose name is built at run time" in p for p in problems)
    assert any(p.startswith("go/x/x.go:2: reads a variable whose name is built at run time") for p in problems)


def test_a_python_name_a_comment_or_a_docstring_is_no_variable(tmp_path):
    names, problems = _tree(
        tmp_path,
        {
            "python/zctipc/a.py": '''\
                """Module docs mention @NOT_A_VARIABLE."""
                @REDUCER = "_zctipc_reducer"  # @IN_A_COMMENT
                code = "reductions.@ATTRIBUTE in a program string"
            ''',
        },
    )
    assert names == set() and problems == []


def test_an_exception_outside_the_errors_module_or_its_all_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "errors.py").write_text(
        "__all__ = ['PkgError']\n"
        "class PkgError(Exception): pass\n"
        "class Forgotten(PkgError): pass\n"
        "class _Private(PkgError): pass\n"
    )
    (package / "other.py").write_text(
        "from . import errors\n"
        "class Oops(ValueError): pass\n"
        "class Deeper(errors.Forgotten): pass\n"
        "class NotAnError(dict): pass\n"
    )
    found = _docblocks.exception_classes(str(package))
    assert found == {"PkgError": "pkg.errors", "Forgotten": "pkg.errors", "Oops": "pkg.other", "Deeper": "pkg.other"}


def test_a_public_name_is_documented_only_by_its_own_directive():
    page = "::: zctipc.queues.Queue\n\n::: zctipc.tensor.list_segments\n\nAlso `list_active_segments`, and `share`.\n"
    names = {
        "Queue": zctipc.queues.Queue,
        "list_segments": zctipc.tensor.list_segments,
        "list_active_segments": zctipc.tensor.list_segments,
        "share": zctipc.tensor.share,  # mentioned in passing only
        "SimpleQueue": zctipc.queues.SimpleQueue,
    }
    missing = _docblocks.undocumented(names, page, aliases={"list_active_segments": "list_segments"})
    assert missing == ["SimpleQueue", "share"]
    # A directive of another object with the same last name documents nothing.
    assert _docblocks.undocumented({"Event": zctipc.events.Event}, "::: multiprocessing.synchronize.Event\n") == [
        "Event"
    ]
    assert not _docblocks.undocumented(
        {"ZctipcError": zctipc.errors.ZctipcError}, "::: zctipc.errors\n", whole=["zctipc.errors"]
    )


def test_every_command_is_documented_whole():
    page = "| `zctipc top [--once]` | a view |\n| `zctipc --version` | the version |\n"
    assert _docblocks.documented_commands(page) == {"top"}, "a row for top is none for to, --version is no command"
    parser, _ = zctipc.cli._parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub.add_parser("stats", aliases=["st"], help=argparse.SUPPRESS)
    commands = _docblocks.commands(parser)
    assert {"ls", "gc", "doctor", "bench", "top", "tail", "stats", "st"} <= commands
    with open(os.path.join(ROOT, "docs", "reference", "cli.md")) as f:
        assert commands - _docblocks.documented_commands(f.read()) == {"stats", "st"}
