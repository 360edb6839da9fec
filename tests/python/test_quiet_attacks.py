"""Attacks on zctipc's quiet, observable surface, each a real program: the
start method warning (Note [the start method warning] in zctipc.context)
under import orders, threads, warning filters and the modules between a
program and its processes; the fork default when a zctipc context starts
the first process (Note [the fork default]); Ray workers; the "zctipc" log
under ZCTIPC_LOG's values and a program's own logging (Note [a level that
is no level] and Note [each record once] in zctipc._core.log); doctor's
RemoveIPC over broken systemd trees (Note [RemoveIPC] in zctipc.cli); and
make check's markers."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import HERE
from test_quiet import SWITCHES, WARNING, _system_tree, doctor

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(HERE))


def run(env, tmp_path, program, *flags, extra_env=None, args=()):
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(program))
    return subprocess.run(
        [sys.executable, *flags, str(path), *args],
        env=dict(env, **(extra_env or {})),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )


def line_of(program, mark="# START", after=""):
    """The line of program (as run) that carries mark, the first after the
    line that carries after."""
    lines = textwrap.dedent(program).splitlines()
    first = next(n for n, line in enumerate(lines) if after in line)
    return next(n for n, line in enumerate(lines[first:], first + 1) if mark in line)


def warned_at(out, program):
    """Whether stderr holds exactly one start method warning, at the marked line."""
    return out.stderr.count(WARNING) == 1 and f"program.py:{line_of(program)}: RuntimeWarning: {WARNING}" in out.stderr


def raised_at(out, program):
    """Whether the program failed with the warning raised at the marked line."""
    return (
        out.returncode == 1
        and out.stderr.rstrip().splitlines()[-1].startswith(f"RuntimeWarning: {WARNING}")
        and f'program.py", line {line_of(program)}, in <module>' in out.stderr
    )


# -- import orders ------------------------------------------------------------------

ORDERS = {
    "torch and multiprocessing before zctipc": "import torch, multiprocessing, concurrent.futures\nimport zctipc",
    "concurrent.futures before zctipc": "import concurrent.futures, multiprocessing\nimport zctipc",
    "zctipc before multiprocessing and torch": "import zctipc\nimport multiprocessing, concurrent.futures, torch",
}

ORDERED = """
import numpy as np


def square(x):
    return x * x


if __name__ == "__main__":
    zctipc.empty(4)                             # loads the library: nothing said
    with concurrent.futures.ProcessPoolExecutor(1) as ex:
        print(ex.submit(square, 3).result())    # START
    p = multiprocessing.Process(target=square, args=(2,))
    p.start()
    p.join()
    print(p.exitcode, multiprocessing.get_start_method())
"""


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_the_import_order_changes_nothing(isolated, tmp_path, order):
    program = ORDERS[order] + ORDERED
    out = run(isolated, tmp_path, program)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["9", "0", "forkserver"]
    assert warned_at(out, program) if SWITCHES else WARNING not in out.stderr, out.stderr


def test_import_zctipc_as_multiprocessing_never_warns(isolated, tmp_path):
    out = run(
        isolated,
        tmp_path,
        """
        import zctipc as multiprocessing


        def square(x):
            return x * x


        if __name__ == "__main__":
            print(multiprocessing.get_start_method(allow_none=True))
            p = multiprocessing.Process(target=square, args=(2,))
            p.start()
            p.join()
            with multiprocessing.Pool(1) as pool:
                print(p.exitcode, pool.apply(square, (3,)))
            with multiprocessing.Manager() as m:
                print(m.list([4])[:])
            p = multiprocessing.get_context().Process(target=square, args=(2,))
            p.start()
            p.join()
            print(p.exitcode, multiprocessing.get_start_method())
        """,
        "-W",
        "error",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "0", "9", "[4]", "0", "forkserver"]
    assert "Warning" not in out.stderr, out.stderr


# -- the fork default, when a zctipc context starts the first process --------------

BEFORE_THE_LIBRARY = """
import multiprocessing, sys
import numpy as np
import zctipc


def grandchild(q):
    q.put(np.full(2, 9))


def child():
    q = zctipc.Queue()
    print("child", multiprocessing.get_start_method(), flush=True)
    p = multiprocessing.Process(target=grandchild, args=(q,))
    p.start()
    print("grandchild", q.get(timeout=60).tolist(), flush=True)
    p.join()


if __name__ == "__main__":
    # Nothing of zctipc's is loaded yet: the first start is with its context.
    p = zctipc.Process(target=child) if sys.argv[1] == "process" else zctipc.get_context("spawn").Process(target=child)
    p.start()
    p.join()
    print("parent", multiprocessing.get_start_method(allow_none=True), p.exitcode, flush=True)
    zctipc.empty(4)
    p = multiprocessing.Process(target=child)
    p.start()                                   # START
    p.join()
    print("default", p.exitcode)
"""


@pytest.mark.skipif(not SWITCHES, reason="Python 3.14 starts with forkserver: zctipc switches nothing")
@pytest.mark.parametrize("start", ["process", "spawn"])
def test_a_zctipc_context_that_starts_the_first_process_chooses_forkserver(isolated, tmp_path, start):
    # multiprocessing fixes the parent's start method as it starts a child,
    # and tells the child that method: were it fork, the parent would keep
    # fork once it loads zctipc, and a zctipc.Process's child would fork its
    # own children, which then cannot use zctipc (ForkedProcessError).
    out = run(isolated, tmp_path, BEFORE_THE_LIBRARY, args=(start,))
    assert out.returncode == 0, out.stderr
    child = "forkserver" if start == "process" else "spawn"
    assert out.stdout.splitlines() == [
        f"child {child}",
        "grandchild [9, 9]",
        "parent forkserver 0",
        "child forkserver",
        "grandchild [9, 9]",
        "default 0",
    ], out.stderr
    assert "ForkedProcessError" not in out.stderr
    assert warned_at(out, BEFORE_THE_LIBRARY), out.stderr


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_get_and_set_start_method_around_the_load(isolated, tmp_path, method):
    # The load fixes no method (allow_none still says None), and one set
    # afterwards, with force, is the program's choice: no warning.
    out = run(
        isolated,
        tmp_path,
        """
        import multiprocessing, sys

        if __name__ == "__main__":
            print(multiprocessing.get_start_method(allow_none=True))
        import zctipc


        def child(q):
            q.put(multiprocessing.get_start_method())


        if __name__ == "__main__":
            q = zctipc.Queue()
            print(multiprocessing.get_start_method(allow_none=True))
            multiprocessing.set_start_method(sys.argv[1], force=True)
            p = multiprocessing.Process(target=child, args=(q,))
            p.start()
            print(q.get(timeout=60))
            p.join()
        """,
        "-W",
        "error",
        args=(method,),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "None", method]
    assert "Warning" not in out.stderr, out.stderr


def test_zctipc_imported_only_in_a_child_or_after_a_first_start_never_warns(isolated, tmp_path):
    # The program starts a process before zctipc is imported (fixing
    # multiprocessing's method as the standard library does); its child
    # imports zctipc; neither is told anything.
    out = run(
        isolated,
        tmp_path,
        """
        import multiprocessing


        def grandchild(q):
            q.put(q.__class__.__module__)


        def child():
            import zctipc

            q = zctipc.Queue()
            p = zctipc.get_context().Process(target=grandchild, args=(q,))
            p.start()
            print("child", q.get(timeout=60), flush=True)
            p.join()


        if __name__ == "__main__":
            p = multiprocessing.Process(target=child)
            p.start()
            p.join()
            import zctipc

            zctipc.empty(4)
            child()
            print(p.exitcode)
        """,
        "-W",
        "error",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["child", "zctipc.queues", "child", "zctipc.queues", "0"]
    assert "Warning" not in out.stderr, out.stderr


# -- threads and warning filters ---------------------------------------------------

THREADS = """
import multiprocessing, threading
import zctipc


def child():
    pass


if __name__ == "__main__":
    zctipc.empty(4)
    raised, exits, gate = [], [], threading.Barrier(8)

    def start():
        gate.wait()
        p = multiprocessing.Process(target=child)
        try:
            p.start()
        except RuntimeWarning:
            raised.append(1)
            return
        p.join()
        exits.append(p.exitcode)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(len(raised), exits)
"""


@pytest.mark.skipif(not SWITCHES, reason="Python 3.14 starts with forkserver: zctipc switches nothing")
@pytest.mark.parametrize("flags", [(), ("-W", "error")], ids=["default", "W-error"])
def test_threads_starting_at_once_are_warned_once(isolated, tmp_path, flags):
    out = run(isolated, tmp_path, THREADS, *flags)
    assert out.returncode == 0, out.stderr
    if flags:  # exactly one thread's start raises, the others' processes run
        assert out.stdout.strip() == "1 [0, 0, 0, 0, 0, 0, 0]", out.stderr
        assert WARNING not in out.stderr
    else:
        assert out.stdout.strip() == "0 [0, 0, 0, 0, 0, 0, 0, 0]"
        assert out.stderr.count(WARNING) == 1, out.stderr


FILTERED = """
import multiprocessing, os, sys, warnings
import zctipc


def child():
    pass


def start():
    p = multiprocessing.Process(target=child)
    p.start()                                   # IN start()
    p.join()


if __name__ == "__main__":
    zctipc.empty(4)
    if sys.argv[1] == "set-after-import":
        os.environ["ZCTIPC_NO_START_METHOD_WARNING"] = "1"
    if sys.argv[1] == "catch_warnings":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start()
        print([(w.category.__name__, w.lineno) for w in caught])
    p = multiprocessing.Process(target=child)
    p.start()                                   # START
    p.join()
    start()
    print("done", p.exitcode)
"""

# (flags, environment, mode): what the program's first start does.
FILTERS = {
    "-W error::RuntimeWarning": (("-W", "error::RuntimeWarning"), {}, "-", "raises"),
    "PYTHONWARNINGS=error": ((), {"PYTHONWARNINGS": "error"}, "-", "raises"),
    "-W ignore": (("-W", "ignore"), {}, "-", "silent"),
    "-W error::DeprecationWarning": (("-W", "error::DeprecationWarning"), {}, "-", "warns"),
    "the variable set by the program after import, -W error": (("-W", "error"), {}, "set-after-import", "silent"),
    "the variable empty": ((), {"ZCTIPC_NO_START_METHOD_WARNING": ""}, "-", "warns"),
    "the variable 0": ((), {"ZCTIPC_NO_START_METHOD_WARNING": "0"}, "-", "warns"),
    "catch_warnings in the program, -W error": (("-W", "error"), {}, "catch_warnings", "caught"),
}


@pytest.mark.skipif(not SWITCHES, reason="Python 3.14 starts with forkserver: zctipc switches nothing")
@pytest.mark.parametrize("case", sorted(FILTERS))
def test_warning_filters_and_the_variable(isolated, tmp_path, case):
    flags, env, mode, expect = FILTERS[case]
    out = run(isolated, tmp_path, FILTERED, *flags, extra_env=env, args=(mode,))
    if expect == "raises":
        assert raised_at(out, FILTERED), out.stderr
        assert out.stdout == ""
        return
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "done 0"
    if expect == "warns":
        assert warned_at(out, FILTERED), out.stderr
    elif expect == "silent":
        assert "Warning" not in out.stderr, out.stderr
    else:  # the program's own filter took it, at its line; the later starts say nothing
        assert out.stdout.splitlines()[0] == f"[('RuntimeWarning', {line_of(FILTERED, '# IN start()')})]", out.stdout
        assert "Warning" not in out.stderr, out.stderr


# -- the line the warning names, through the modules that start processes ----------

PLUMBING = """
import concurrent.futures, multiprocessing, sys
import torch, zctipc
from torch.utils.data import DataLoader, TensorDataset


def square(x):
    return x * x


if __name__ == "__main__":
    zctipc.empty(4)
    how = sys.argv[1]
    if how == "DataLoader":
        for (batch,) in DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, num_workers=2):  # START
            print(batch.tolist())
    elif how == "ProcessPoolExecutor.map":
        with concurrent.futures.ProcessPoolExecutor(2) as ex:
            print(list(ex.map(square, [1, 2])))  # START
    elif how == "Pool":
        with multiprocessing.Pool(2) as pool:  # START
            print(pool.map(square, [1, 2]))
    elif how == "Manager":
        with multiprocessing.Manager() as m:  # START
            print(m.list([1, 4])[:])
    elif how == "get_context()":
        p = multiprocessing.get_context().Process(target=square, args=(1,))
        p.start()  # START
        p.join()
        print([1, 4] if p.exitcode == 0 else p.exitcode)
"""


@pytest.mark.skipif(not SWITCHES, reason="Python 3.14 starts with forkserver: zctipc switches nothing")
@pytest.mark.parametrize("how", ["DataLoader", "ProcessPoolExecutor.map", "Pool", "Manager", "get_context()"])
def test_the_warning_names_the_programs_line_and_W_error_stops_there(isolated, tmp_path, how):
    start = line_of(PLUMBING, after=f'how == "{how}"')
    out = run(isolated, tmp_path, PLUMBING, args=(how,))
    assert out.returncode == 0, out.stderr
    expected = ["[0.0, 1.0, 2.0, 3.0]", "[4.0, 5.0, 6.0, 7.0]"] if how == "DataLoader" else ["[1, 4]"]
    assert out.stdout.splitlines() == expected
    assert out.stderr.count(WARNING) == 1, out.stderr
    assert f"program.py:{start}: RuntimeWarning: {WARNING}" in out.stderr, out.stderr
    out = run(isolated, tmp_path, PLUMBING, "-W", "error", args=(how,))
    assert out.returncode == 1 and out.stdout == "", out.stderr
    assert out.stderr.rstrip().splitlines()[-1].startswith(f"RuntimeWarning: {WARNING}"), out.stderr
    assert f'program.py", line {start}, in <module>' in out.stderr, out.stderr


# -- Ray -----------------------------------------------------------------------------

RAY_WORKER = """
import multiprocessing, os, sys
import ray


def child():
    pass


if __name__ == "__main__":
    os.environ["ZCTIPC_NO_START_METHOD_WARNING"] = sys.argv[1]  # what Ray's environment gave the worker
    ray._private.worker.global_worker.mode = ray.WORKER_MODE    # as a Ray worker is
    import zctipc.ray

    ray._private.worker.global_worker.mode = None
    p = multiprocessing.Process(target=child)
    p.start()
    p.join()
    print(p.exitcode, multiprocessing.get_start_method())
"""


@pytest.mark.parametrize("value", ["0", ""])
def test_a_ray_worker_is_never_warned_whatever_its_environment_says(isolated, tmp_path, value):
    out = run(isolated, tmp_path, RAY_WORKER, "-W", "error", args=(value,))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "forkserver"]
    assert WARNING not in out.stderr, out.stderr


def test_zctipc_ray_without_ray_says_what_to_install_and_zctipc_still_works(isolated, tmp_path):
    out = run(
        isolated,
        tmp_path,
        """
        import sys

        sys.modules["ray"] = None  # as where Ray is not installed
        import zctipc

        try:
            import zctipc.ray
        except ImportError as e:
            print(e)
        q = zctipc.Queue()
        q.put(7)
        print(q.get())
        """,
        "-W",
        "error",
    )
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first.startswith("zctipc.ray needs Ray 2.60 or later and torch: pip install zctipc[ray]"), first
    assert second == "7" and out.stderr == ""


# -- ZCTIPC_LOG ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,level",
    [
        ("", None),
        ("DEBUG", "DEBUG"),
        ("  info ", "INFO"),
        ("10", "DEBUG"),
        ("-5", "bad"),
        ("1e3", "bad"),
        ("verbose", "bad"),
        ("\u00b2", "bad"),  # a digit to str.isdigit, not to int()
    ],
    ids=["empty", "DEBUG", "spaced-info", "10", "-5", "1e3", "verbose", "superscript-2"],
)
def test_no_value_of_zctipc_log_fails_the_import_even_under_W_error(isolated, tmp_path, value, level):
    out = run(
        isolated,
        tmp_path,
        """
        import zctipc

        zctipc.create_shared_tensor(None, shape=(5,), dtype="int8")
        print("ok")
        """,
        "-W",
        "error",
        extra_env={"ZCTIPC_LOG": value},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "ok\n"
    made = [ln for ln in out.stderr.splitlines() if "made segment" in ln]
    if level == "bad":  # one line that says so, and nothing logged
        assert out.stderr.splitlines() == [
            f"zctipc: ZCTIPC_LOG={value.strip()!r} names no level (debug, info, warning, error, critical, or a "
            "number): zctipc logs nothing to stderr"
        ], out.stderr
    elif level == "DEBUG":
        assert len(made) == 1 and re.match(r"zctipc\[\d+\] DEBUG: made segment", made[0]), out.stderr
    else:
        assert out.stderr == ""


LOGGED = """
import logging, sys
import zctipc

how = sys.argv[1]


def configure():
    if how.startswith("basicConfig"):
        logging.basicConfig(level=logging.INFO, format="PROGRAM %(name)s %(message)s")
    elif how.startswith("handler"):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("PROGRAM %(name)s %(message)s"))
        logging.getLogger("zctipc").addHandler(handler)
    elif how == "a file":
        logging.basicConfig(filename="program.log", level=logging.DEBUG, format="PROGRAM %(name)s %(message)s")


if how.endswith("before"):
    configure()
import zctipc

if not how.endswith("before"):
    configure()
zctipc.create_shared_tensor(None, shape=(5,), dtype="int8")
"""


@pytest.mark.parametrize(
    "how", ["basicConfig before", "basicConfig after", "handler before", "handler after", "a file", "nothing"]
)
def test_zctipc_log_and_the_programs_own_logging_give_each_record_once(isolated, tmp_path, how):
    out = run(isolated, tmp_path, LOGGED, extra_env={"ZCTIPC_LOG": "debug"}, args=(how,))
    assert out.returncode == 0, out.stderr
    made = [ln for ln in out.stderr.splitlines() if "made segment" in ln and "int8[5]" in ln]
    if how == "a file":  # where the program's logging goes, zctipc's records go, once
        assert made == [], out.stderr
        logged = (tmp_path / "program.log").read_text().splitlines()
        assert len([ln for ln in logged if "made segment" in ln and "int8[5]" in ln]) == 1, logged
    elif how == "nothing":
        assert len(made) == 1 and made[0].startswith("zctipc["), out.stderr
    else:
        assert len(made) == 1 and made[0].startswith("PROGRAM zctipc made segment"), out.stderr


def test_a_forkserver_child_logs_each_record_once(isolated, tmp_path):
    out = run(
        isolated,
        tmp_path,
        """
        import logging
        import numpy as np
        import zctipc

        logging.basicConfig(level=logging.INFO, format="PROGRAM[%(process)d] %(message)s")  # children too


        def child(q, out):
            out.put(q.get() + 1)


        if __name__ == "__main__":
            q, out = zctipc.Queue(), zctipc.Queue()
            p = zctipc.get_context("forkserver").Process(target=child, args=(q, out))
            p.start()
            q.put(np.zeros(4))
            print(p.pid, out.get(timeout=60).tolist(), flush=True)
            p.join()
        """,
        extra_env={"ZCTIPC_LOG": "debug"},
    )
    assert out.returncode == 0, out.stderr
    child = out.stdout.split()[0]
    attached = [ln for ln in out.stderr.splitlines() if "attached queue" in ln]
    assert len(attached) == 2 and all(ln.startswith(f"PROGRAM[{child}] ") for ln in attached), out.stderr


def test_a_child_killed_while_logging_leaves_the_log_whole(isolated, tmp_path):
    out = run(
        isolated,
        tmp_path,
        """
        import os, signal
        import numpy as np
        import zctipc


        def child(q):
            while True:  # two records per segment
                t = zctipc.create_shared_tensor(None, shape=(4,), dtype="int8")
                del t
                q.put(np.zeros(2))


        if __name__ == "__main__":
            q = zctipc.Queue(maxsize=2)
            p = zctipc.get_context().Process(target=child, args=(q,))
            p.start()
            for _ in range(50):
                q.get(timeout=60)
            os.kill(p.pid, signal.SIGKILL)
            p.join()
            zctipc.create_shared_tensor(None, shape=(3,), dtype="int8")
            print(os.getpid(), p.exitcode)
        """,
        extra_env={"ZCTIPC_LOG": "debug"},
    )
    assert out.returncode == 0, out.stderr
    parent, exitcode = out.stdout.split()
    assert exitcode == "-9"
    lines = out.stderr.splitlines()
    assert all(re.match(r"zctipc\[\d+\] DEBUG: ", ln) for ln in lines), out.stderr
    assert any(ln.startswith(f"zctipc[{parent}] DEBUG: made segment") and "int8[3]" in ln for ln in lines)


# -- doctor over broken systemd trees --------------------------------------------------


def test_doctor_reads_only_what_logind_would_from_a_broken_tree(isolated, tmp_path):
    root = tmp_path / "root"
    _system_tree(root, dropins=[("usr/lib", "50-masked.conf", "[Login]\nRemoveIPC=yes\n")])
    (root / "etc/systemd").mkdir(parents=True)
    (root / "etc/systemd/logind.conf").mkdir()  # not a file: the next main file is read
    (root / "usr/lib/systemd/logind.conf").write_text("[Login]\nRemoveIPC=no\n")
    (root / "etc/systemd/logind.conf.d").write_text("not a directory\n")
    dropins = root / "usr/lib/systemd/logind.conf.d"
    (dropins / "10-garbage.conf").write_bytes(
        b"\xff\xfe\x00[Login\n\xe2\x98\x83 = \xe2\x98\x83\n[Login]\nRemoveIPC=maybe\nRemoveIPC\n=yes\nRemoveIPC=\n"
    )
    (dropins / "20-directory.conf").mkdir()
    (dropins / "30-dangling.conf").symlink_to(root / "nowhere")
    os.mkfifo(dropins / "40-fifo.conf")  # opened, it would wait for a writer for ever
    (root / "run/systemd/logind.conf.d").mkdir(parents=True)
    (root / "run/systemd/logind.conf.d/50-masked.conf").symlink_to("/dev/null")  # masks /usr/lib's
    # The last SYS_UID_MAX that is a number counts, as systemd and shadow read it.
    (root / "etc/login.defs").write_text("SYS_UID_MAX 5000000\nSYS_UID_MAX \u00b2\nSYS_UID_MAX 50000\n")
    out = doctor(isolated, str(root), 4123456, "--json")  # a uid that has no name
    report = json.loads(out.stdout)
    assert report["remove_ipc"] == {
        "value": False,
        "source": "/usr/lib/systemd/logind.conf",
        "systemd": True,
        "uid": 4123456,
        "system_user": False,
        "lingering": False,
        "applies": False,
    }
    assert not any("RemoveIPC" in w for w in report["warnings"])
    os.mkfifo(root / "etc/login.defs.fifo")
    (root / "etc/login.defs").unlink()
    (root / "etc/login.defs").symlink_to(root / "etc/login.defs.fifo")
    out = doctor(isolated, str(root), 60000, "--json")
    assert json.loads(out.stdout)["remove_ipc"]["system_user"] is False


def test_doctor_json_without_the_shared_memory_directory_and_with_the_log_on(isolated):
    env = dict(isolated, ZCTIPC_SHM_DIR=os.path.join(isolated["ZCTIPC_SHM_DIR"], "missing"), ZCTIPC_LOG="debug")
    out = subprocess.run(
        [sys.executable, "-W", "error", "-m", "zctipc", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(out.stdout)  # one object on stdout; the log is on stderr
    assert out.returncode == 1 and report["ok"] is False
    assert report["shared_memory"]["total"] is None and report["shared_memory"]["free"] is None
    assert "No such file or directory" in report["shared_memory"]["error"]
    assert any(w.startswith(f"{env['ZCTIPC_SHM_DIR']} cannot be used") for w in report["warnings"])
    assert all(re.match(r"zctipc\[\d+\] DEBUG: ", ln) for ln in out.stderr.splitlines()), out.stderr


def test_doctor_json_reports_the_highest_open_files_limit_as_a_number(isolated):
    program = (
        "import resource, sys\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))\n"
        "from zctipc import cli\n"
        "sys.exit(cli.main(['doctor', '--json']))\n"
    )
    out = subprocess.run([sys.executable, "-c", program], env=isolated, capture_output=True, text=True, timeout=60)
    files = json.loads(out.stdout)["open_files"]
    assert files["soft"] == files["hard"]
    assert files["soft"] is None or (type(files["soft"]) is int and files["soft"] >= 4096)


# -- make check and the markers ----------------------------------------------------------


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_check_leaves_out_the_slow_tests_and_a_misspelt_marker_is_refused(tmp_path):
    recipe = subprocess.run(
        ["make", "-n", "--no-print-directory", "pyfast"], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout.splitlines()[-1]
    assert '-m "not slow"' in recipe and "pytest" in recipe, recipe
    quiet = [os.path.join(HERE, f) for f in ("test_quiet.py", "test_logging.py", "test_quiet_attacks.py")]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow", "-p", "no:cacheprovider", *quiet],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 5 and "no tests collected" in out.stdout, out.stdout  # 5: none selected
    (tmp_path / "test_misspelt.py").write_text("import pytest\n\n\n@pytest.mark.slwo\ndef test_x():\n    pass\n")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.path.join(ROOT, "pyproject.toml")]
        + ["--rootdir", ROOT, str(tmp_path / "test_misspelt.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "'slwo' not found in `markers`" in out.stdout + out.stderr, out.stdout
