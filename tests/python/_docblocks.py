"""How the documentation tests read the project: its Markdown files, their
fenced blocks and the markers before them, the names the code reads from
the environment, and the programs the blocks run. test_docs.py checks the
project with these; test_docs_attacks.py feeds them pages and trees of its
own, which is why they take text and folders rather than reading the
project's own.

Note [what counts as a block]: a block is what a reader sees as code, so
the runner finds every fence that Python-Markdown with superfences (the
site) or GitHub (the README) renders: ``` and ~~~ fences of three or more,
indented ones (in a list item or an admonition), ones with attributes after
the language (```python title="x"), and a longer fence around shorter ones
(```` around an example of a fence, whose inside is the outer block's
text). A fence never closed, an indented code block (four spaces after a
paragraph, which has no language to say how to run it) and a marker before
no block are errors: each would hide code from the runner."""

import ast
import builtins
import os
import re
import signal
import subprocess
import time
import uuid
from typing import NamedTuple

RUN = {"python", "sh", "go", "c"}  # run as programs
CHECKED = {"json"}  # parsed
TEXT = {"text"}  # not code: diagrams and wire messages

#: What a block says it prints, by language: the comment after a print.
PRINTS = {
    "python": re.compile(r"^\s*print\(.*?\)\s*#\s*(.+)$", re.M),
    "go": re.compile(r"^\s*fmt\.Print(?:ln|f)?\(.*\)\s*//\s*(.+)$", re.M),
    "c": re.compile(r"^\s*printf\(.*\);\s*/\*\s*(.+?)\s*\*/\s*$", re.M),
}


def unprinted(lang, code, stdout):
    """What a block says it prints (a comment after a print) that its
    output does not hold as a line of its own, as many times as it says
    it: "# 45" is not "145", nor is "# True" twice one True."""
    lines = [line.strip() for line in stdout.splitlines()]
    missing = []
    for printed in PRINTS[lang].findall(code) if lang in PRINTS else []:
        if printed.strip() in lines:
            lines.remove(printed.strip())
        else:
            missing.append(printed.strip())
    return missing


class Block(NamedTuple):
    where: str  # path:line of the opening fence
    lang: str  # the first word of the info string
    marker: str  # the HTML comment on the line before the fence, if any
    code: str
    info: str = ""  # the whole info string: the language and its attributes


class Page(NamedTuple):
    blocks: list[Block]
    problems: list[str]  # what hides code from the runner (Note [what counts as a block])
    includes: list[str]  # the files its snippets (--8<-- "file") bring in


# Folders of no Markdown of the project's own, where git cannot say.
_NOT_OURS = {"build", "dist", "site", "node_modules", "__pycache__", "results"}


def markdown_files(root):
    """Every Markdown file of the project at root, wherever it is: what git
    tracks or would (its ignored outputs are not the project's), else, out
    of a checkout, every file outside hidden folders and build outputs."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.md", "*.markdown"],
            cwd=root,
            capture_output=True,
            timeout=60,
        )
    except OSError:
        listed = None
    if listed is not None and listed.returncode == 0 and _is_top(root):
        names = {n for n in listed.stdout.decode().split("\0") if n}
        return sorted(os.path.join(root, n) for n in names if os.path.isfile(os.path.join(root, n)))
    out = []
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = [
            d for d in dirnames if not d.startswith(".") and d not in _NOT_OURS and not d.endswith(".egg-info")
        ]
        out += [os.path.join(dirpath, f) for f in files if f.endswith((".md", ".markdown"))]
    return sorted(out)


def _is_top(root):
    """Whether root is the top of a git checkout (not a folder inside another's)."""
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True, timeout=60)
    return top.returncode == 0 and os.path.realpath(top.stdout.strip()) == os.path.realpath(root)


_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_COMMENT = re.compile(r"^[ \t]*<!--[ \t]*(?P<text>.*?)[ \t]*-->[ \t]*$")
_MARKER = re.compile(r"(?i)^(skip|gpu)\b")
_SNIPPET = re.compile(r"""^[ \t]*;?-{1,}8<-{1,}[ \t]+(["'])(?P<file>[^"':]+)(?::[^"']*)?\1""")
_LIST_ITEM = re.compile(r"^[ \t]*(?:[-*+]|\d+[.)])[ \t]")


def parse(text, where="<page>"):
    """The blocks, problems and snippet includes of a Markdown text (Note
    [what counts as a block]); where names the page in messages."""
    lines = text.split("\n")
    blocks, problems, includes = [], [], []
    before_blank = None  # the last line with text before the blank lines just passed
    i = 0
    while i < len(lines):
        line = lines[i]
        if _opens(line):
            m = _OPEN.match(line)
            fence, indent = m["fence"], len(m["indent"].expandtabs(4))
            close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
            j = i + 1
            while j < len(lines) and not close.match(lines[j]):
                j += 1
            if j == len(lines):
                problems.append(f"{where}:{i + 1}: a fence that is never closed: the rest of the page is its code")
            code = "".join(_dedent(c, indent) + "\n" for c in lines[i + 1 : j])
            comment = _COMMENT.match(lines[i - 1]) if i else None
            info = m["info"].strip()
            blocks.append(Block(f"{where}:{i + 1}", _language(info), comment["text"] if comment else "", code, info))
            i, before_blank = j + 1, line
            continue
        comment = _COMMENT.match(line)
        if comment and _MARKER.match(comment["text"]) and not (i + 1 < len(lines) and _opens(lines[i + 1])):
            problems.append(
                f"{where}:{i + 1}: <!-- {comment['text']} --> is not on the line just before a block, so it marks none"
            )
        snippet = _SNIPPET.match(line)
        if snippet:
            includes.append(snippet["file"])
        if line.strip() and (i == 0 or not lines[i - 1].strip()) and _indented_code(line, before_blank):
            problems.append(
                f"{where}:{i + 1}: an indented code block, which says no language and never runs: fence it "
                "(```python, ```sh, ```text)"
            )
        if lines[i].strip():
            before_blank = line
        i += 1
    return Page(blocks, problems, includes)


def _opens(line):
    """Whether a line opens a fence (```a``` on a line is inline code)."""
    m = _OPEN.match(line)
    return bool(m) and not (m["fence"][0] == "`" and "`" in m["info"])


def _dedent(line, width):
    """A fenced line without the fence's own indentation (up to width columns)."""
    n = 0
    while n < len(line) and n < width and line[n] == " ":
        n += 1
    return line[n:]


def _language(info):
    """The language of an info string: its first word (```python title="x"),
    or the first class of an attribute list (```{.python .numberLines})."""
    if info.startswith("{"):
        m = re.search(r"\.([\w+-]+)", info)
        return m[1] if m else ""
    return info.split()[0] if info else ""


def _indented_code(line, before_blank):
    """Whether a line after a blank one starts an indented code block: four
    columns in, after a paragraph or heading of the page's top level (after
    a list item, or inside one, it continues the item)."""
    if len(line) - len(line.lstrip()) == 0 or not line.expandtabs(4).startswith("    "):
        return False
    if before_blank is None:
        return True
    top = not before_blank[:1].isspace()
    return top and not _LIST_ITEM.match(before_blank) and not before_blank.startswith(("!!!", "???", ":::", "<"))


def check(blocks):
    """What is wrong with blocks as the runner reads them: a kind it does
    not know, a marker it does not know or that says too little, a marker
    before a block that does not run, a GPU marker on a block that touches
    no GPU, a shell block that could fail and pass."""
    problems = []
    for b in blocks:
        if b.lang not in RUN | CHECKED | TEXT:
            problems.append(
                f"{b.where}: a block of no known kind ({b.lang or 'no language'}): say python, sh, go, c, json or text"
            )
        if not b.marker:
            pass
        elif b.lang not in RUN:
            problems.append(f"{b.where}: <!-- {b.marker} --> before a {b.lang or 'plain'} block, which never runs")
        elif b.marker == "gpu":
            if not re.search(r"(?i)cuda|gpu", b.code):
                problems.append(f"{b.where}: marked gpu, but it touches no GPU: it would be skipped for nothing")
        elif re.match(r"skip\s*:", b.marker):
            reason = b.marker.split(":", 1)[1].strip()
            if len(reason) < 20:
                problems.append(f"{b.where}: the skip says too little of why: {reason!r}")
        else:
            problems.append(
                f"{b.where}: unknown marker <!-- {b.marker} -->: a block is marked <!-- skip: why --> or <!-- gpu -->"
            )
        if b.lang in TEXT and re.search(r"^\s*(?:import|from) \w", b.code, re.M) and _compiles(b.code):
            problems.append(f"{b.where}: a text block that is a Python program: say python, or skip it saying why")
        if b.lang == "sh" and re.search(r"&&", b.code):
            problems.append(
                f"{b.where}: a shell block chains commands with &&, whose first failure bash -e lets pass: put each "
                "command on a line of its own"
            )
    return problems


def _compiles(code):
    try:
        compile(code, "<block>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


# The shell runs a block as a script that stops at its first failure: -e
# (inherited by command substitutions), -u (an unset variable is an
# error), pipefail (so does a failure early in a pipe).
SHELL = ["bash", "-euo", "pipefail", "-O", "inherit_errexit", "-c"]

#: What a Python block's stderr never holds: an exception it did not
#: handle, in a thread or a child (which leaves the block's own exit
#: status 0), one raised where nobody can catch it, shared memory it leaked.
UNHANDLED = re.compile(
    r"^(?:Traceback \(most recent call last\):|Exception ignored in|.*resource_tracker: There appear to be)", re.M
)


class Outcome(NamedTuple):
    returncode: int
    stdout: str
    stderr: str
    left: dict  # pid: command line of each process it left running (killed since)


def run(command, env, cwd, timeout=120, linger=15):
    """Run a block's program in cwd with env. Its output goes to files (a
    process it leaves behind cannot hold a pipe open); every process it
    started (marked by a variable of its environment, which children
    inherit, wherever they go) has linger seconds to end after it, and is
    killed then."""
    mark = f"DOCS_BLOCK_RUN={uuid.uuid4().hex}"
    env = dict(env, DOCS_BLOCK_RUN=mark.split("=", 1)[1])
    out_path, err_path = os.path.join(cwd, ".block.out"), os.path.join(cwd, ".block.err")
    try:
        with open(out_path, "w") as out, open(err_path, "w") as err:
            done = subprocess.run(command, env=env, cwd=cwd, stdout=out, stderr=err, timeout=timeout)
    finally:
        deadline = time.monotonic() + linger
        while (left := processes_with(mark) or _again(mark)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    with open(out_path) as out, open(err_path) as err:
        return Outcome(done.returncode, out.read(), err.read(), left)


def _again(mark):
    """processes_with(mark) once more, a moment later: a process in the
    middle of an exec (a block's `setsid cmd &`) can read as having no
    environment, and the one look that met it found none."""
    time.sleep(0.05)
    return processes_with(mark)


def processes_with(mark):
    """pid: command line of each process whose environment holds mark
    (NAME=value)."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark.encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found[int(pid)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
    return found


# Note [the environment the code reads]: a variable is read by its name,
# which is written whole somewhere as a string: zctipc's own (ZCTIPC_...)
# wherever a string of the code, the benchmarks or the tests holds one (a
# Python name such as ZCTIPC_LIKE_CONSTANT, a comment or a docstring reads
# nothing), and any other name where the library passes it to getenv or
# looks it up in os.environ, directly or through a constant. A name built
# at run time ("ZCTIPC_" + kind, f"ZCTIPC_{kind}", HelperEnv + "_ARGS") is
# resolved where its pieces are constants, and is an error where they are
# not: the reference could not be checked whole. And the other way: a
# variable the page has a row for is one that something reads.
# reference could not be checked whole.

_TOKEN = re.compile(r"(?<![.\w])ZCTIPC_[A-Z0-9_]*")  # not an attribute: code in a string (module.ZCTIPC_LIKE_CONSTANT)
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_GO_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"|`[^`]*`')
_GO_CONST = re.compile(r'\b([A-Za-z_]\w*)\s*(?::=|=)\s*"([^"\\\n]*)"')
_GO_GETENV = re.compile(r"\b(?:os\.Getenv|os\.LookupEnv|syscall\.Getenv|C\.getenv|getenv|secure_getenv)\(")


def environment_variables(root, tops=("go", "python", "benchmarks", "tests"), library=("go", "python")):
    """(names, problems): the environment variables the code under root
    reads (Note [the environment the code reads]): zctipc's own in tops,
    any other where the library (library) reads them."""
    names, problems, sources = set(), [], []
    for top in tops:
        for dirpath, dirnames, files in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".go", ".py", ".c", ".h")):
                    path = os.path.join(dirpath, name)
                    with open(path, errors="replace") as f:
                        sources.append((top, path, f.read()))
    go_consts = {}
    py_consts = {}
    for _, path, text in sources:
        if path.endswith(".go"):
            go_consts.update(_GO_CONST.findall(text))
        elif path.endswith(".py"):
            py_consts.update(_py_constants(text))
    for top, path, text in sources:
        where = os.path.relpath(path, root)
        if path.endswith(".py"):
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            docstrings = {
                id(n.body[0].value)
                for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body
                and isinstance(n.body[0], ast.Expr)
            }
            strings = [
                (n.lineno, n.value)
                for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
            ]
        else:
            strings = [(text.count("\n", 0, m.start()) + 1, m[0][1:-1]) for m in _GO_STRING.finditer(text)]
        for line, value in strings:
            for token in _TOKEN.finditer(value):
                if not token[0].endswith("_"):
                    names.add(token[0])
                elif token.end() == len(value):
                    problems.append(f"{where}:{line}: a variable's name built from {value!r} and more: name it whole")
        if top not in library:
            continue
        if path.endswith(".py"):
            found, bad = _py_reads(tree, py_consts)
        else:
            found, bad = _go_reads(text, go_consts)
        names |= found
        problems += [f"{where}:{line}: {what}" for line, what in bad]
    return names, problems


def _py_constants(text):
    """NAME = "string" at the top level of a Python module."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and isinstance(node.value.value, str):
                    out[t.id] = node.value.value
    return out


def _is_environ(node):
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _py_reads(tree, consts):
    """The names a Python module passes to getenv or looks up in os.environ,
    and (line, problem) for each it builds at run time."""
    names, bad = set(), []
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr == "getenv") or (isinstance(f, ast.Name) and f.id == "getenv"):
                arg = node.args[0]
            elif isinstance(f, ast.Attribute) and f.attr in ("get", "setdefault") and _is_environ(f.value):
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            arg = node.slice
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            if _is_environ(node.comparators[0]):
                arg = node.left
        if arg is None:
            continue
        value, built = _py_value(arg, consts)
        if value is not None and _ENV_NAME.match(value):
            names.add(value)
        elif built:
            bad.append(
                (node.lineno, f"reads a variable whose name is built at run time ({ast.unparse(arg)}): name it whole")
            )
    return names, bad


def _py_value(node, consts):
    """(the string an expression always has, or None; whether it is built of pieces)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, False
    if isinstance(node, ast.Name):
        return consts.get(node.id), False
    if isinstance(node, ast.Attribute):
        return consts.get(node.attr), False
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        (left, _), (right, _) = _py_value(node.left, consts), _py_value(node.right, consts)
        return (left + right if left is not None and right is not None else None), True
    if isinstance(node, ast.JoinedStr):
        parts = [_py_value(v.value if isinstance(v, ast.FormattedValue) else v, consts)[0] for v in node.values]
        return ("".join(parts) if None not in parts else None), True
    return None, isinstance(node, (ast.Call, ast.BinOp))


def _go_reads(text, consts):
    """The names Go or C code passes to getenv, and (line, problem) for each
    it builds at run time."""
    names, bad = set(), []
    for m in _GO_GETENV.finditer(text):
        depth, end = 1, m.end()
        while end < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        arg = text[m.end() : end - 1].strip()
        parts = [p.strip() for p in arg.split("+")]
        values = []
        for p in parts:
            if p.startswith(('"', "`")) and p.endswith(('"', "`")) and len(p) >= 2:
                values.append(p[1:-1])
            elif re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?", p):
                values.append(consts.get(p.split(".")[-1]))
            else:
                values.append(None)
        line = text.count("\n", 0, m.start()) + 1
        if None not in values and _ENV_NAME.match("".join(values)):
            names.add("".join(values))
        elif len(parts) > 1 or "(" in arg:
            bad.append((line, f"reads a variable whose name is built at run time ({arg}): name it whole"))
    return names, bad


def documented_variables(page):
    """The variables of the environment page's table (the rows after
    "Environment variables:")."""
    table = page.split("Environment variables:", 1)[1] if "Environment variables:" in page else ""
    return set(re.findall(r"^\| `([A-Z_][A-Z0-9_]*)` \|", table, re.M))


def exception_classes(package_dir):
    """{name: module} of every public exception class defined in the Python
    package at package_dir (a class whose bases are exceptions, builtin or
    its own, however it is named)."""
    known = {
        n
        for n in dir(builtins)
        if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), BaseException)
    }
    classes = []
    for dirpath, dirnames, files in os.walk(package_dir):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                module = os.path.relpath(path[:-3], os.path.dirname(package_dir)).replace(os.sep, ".")
                with open(path) as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef):
                        bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                        classes.append((node.name, module.removesuffix(".__init__"), bases))
    found = {}
    while True:
        more = {name: module for name, module, bases in classes if name not in found and bases & (known | set(found))}
        if not more:
            break
        found.update(more)
    return {name: module for name, module in found.items() if not name.startswith("_")}


def documented_commands(page):
    """The commands that the command line's page has a row for (| `zctipc
    NAME ...` |), each whole: a row for top is none for to."""
    return set(re.findall(r"^\| `zctipc (\w[\w-]*)(?=[ `])", page, re.M))


def commands(parser):
    """Every subcommand of an argparse parser, its aliases and hidden ones too."""
    import argparse

    return {name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}


def api_targets(page):
    """The dotted names of the ::: directives of the API page."""
    return re.findall(r"^::: ([\w.]+)[ \t]*$", page, re.M)


def resolve(dotted):
    """The object a dotted name names: the longest module that imports, then
    attributes."""
    import importlib

    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for p in parts[n:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(dotted)


def undocumented(names, page, aliases=None, whole=()):
    """Which of names ({name: object}) the API page does not document: a
    name is documented by a ::: directive of that very object (another of
    the same last name documents nothing), by a module the page documents
    whole whose __all__ has it (whole: the directives of modules), or, for
    an alias (aliases: {alias: name}), by its name's being documented and
    the alias's being mentioned."""
    targets = {}
    for dotted in api_targets(page):
        targets[dotted] = resolve(dotted)
    objects = [obj for obj in targets.values()]
    modules = [targets[d] for d in whole if d in targets]

    def documents(name, obj):
        if any(obj is o for o in objects):
            return True
        return any(name in getattr(m, "__all__", ()) and getattr(m, name, None) is obj for m in modules)

    missing = []
    for name, obj in sorted(names.items()):
        if documents(name, obj):
            continue
        original = (aliases or {}).get(name)
        if original and documents(original, names.get(original, obj)) and f"`{name}`" in page:
            continue
        missing.append(name)
    return missing
