"""zctipc is quiet: the start method warning appears only where it is due
(Note [the start method warning] in zctipc.context), once, at the start of
a process through the default context of a program that chose no method;
never for the command line, a program that passes its contexts, a child,
or with ZCTIPC_NO_START_METHOD_WARNING=1. Each case is a real program,
run as a file (forkserver children import it), with and without
``python -W error``."""

import subprocess
import sys
import textwrap

import pytest

WARNING = "zctipc made 'forkserver' multiprocessing's default start method"

# Python 3.14 starts with forkserver: zctipc switches nothing there.
SWITCHES = sys.version_info < (3, 14)


def run(env, tmp_path, program, *flags, extra_env=None):
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(program))
    return subprocess.run(
        [sys.executable, *flags, str(path)],
        env=dict(env, **(extra_env or {})),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )


# -- programs that pass a context, or chose a method: never a warning -----------

_HEAD = """
import concurrent.futures, multiprocessing, multiprocessing.pool
import numpy as np
import zctipc


def child(q, i):
    q.put(np.full(4, i))


def square(x):
    return x * x

"""

EXPLICIT = {
    "zctipc.get_context().Process": """
        if __name__ == "__main__":
            ctx = zctipc.get_context()
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q, 2))
            p.start()
            print(q.get(timeout=60).tolist())
            p.join()
        """,
    "multiprocessing.get_context('spawn').Process": """
        if __name__ == "__main__":
            q = zctipc.Queue()
            p = multiprocessing.get_context("spawn").Process(target=child, args=(q, 2))
            p.start()
            print(q.get(timeout=60).tolist())
            p.join()
        """,
    "multiprocessing.get_context('forkserver').Process": """
        if __name__ == "__main__":
            q = zctipc.get_context().Queue()
            p = multiprocessing.get_context("forkserver").Process(target=child, args=(q, 2))
            p.start()
            print(q.get(timeout=60).tolist())
            p.join()
        """,
    "ProcessPoolExecutor(mp_context=zctipc.get_context())": """
        if __name__ == "__main__":
            with concurrent.futures.ProcessPoolExecutor(2, mp_context=zctipc.get_context()) as ex:
                print([int(a.sum()) for a in ex.map(square, [np.full(4, 1), np.full(4, 2)])])
        """,
    "ProcessPoolExecutor(mp_context=multiprocessing.get_context('spawn'))": """
        if __name__ == "__main__":
            ctx = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as ex:
                print([int(a.sum()) for a in ex.map(square, [np.full(4, 1), np.full(4, 2)])])
        """,
    "zctipc.get_context('spawn').Pool and Manager": """
        if __name__ == "__main__":
            ctx = zctipc.get_context("spawn")
            with ctx.Pool(2) as pool:
                print([int(a.sum()) for a in pool.map(square, [np.full(4, 1), np.full(4, 2)])])
            with ctx.Manager() as m:
                m.dict()
        """,
    "multiprocessing.pool.Pool(context=zctipc.get_context())": """
        if __name__ == "__main__":
            with multiprocessing.pool.Pool(2, context=zctipc.get_context()) as pool:
                print([int(a.sum()) for a in pool.map(square, [np.full(4, 1), np.full(4, 2)])])
        """,
    "zctipc.spawn": """
        def rank(i, q):
            q.put(np.full(4, i))

        if __name__ == "__main__":
            q = zctipc.Queue()
            zctipc.spawn(rank, args=(q,), nprocs=2)
            print(sorted(int(q.get(timeout=60)[0]) for _ in range(2)))
        """,
    "set_start_method, then multiprocessing.Process": """
        if __name__ == "__main__":
            multiprocessing.set_start_method("forkserver")
            q = zctipc.Queue()
            p = multiprocessing.Process(target=child, args=(q, 2))
            p.start()
            print(q.get(timeout=60).tolist())
            p.join()
        """,
    "queues, arrays and tensors, no process": """
        if __name__ == "__main__":
            q = zctipc.get_context().Queue()
            q.put({"a": np.arange(1 << 20), "t": zctipc.empty(8, "int64")})
            print(int(q.get()["a"].sum()))
            a = zctipc.Array("i", 4)
            print(len(a))
        """,
}

EXPECTED = {
    "ProcessPoolExecutor(mp_context=zctipc.get_context())": "[4, 16]",
    "ProcessPoolExecutor(mp_context=multiprocessing.get_context('spawn'))": "[4, 16]",
    "zctipc.get_context('spawn').Pool and Manager": "[4, 16]",
    "multiprocessing.pool.Pool(context=zctipc.get_context())": "[4, 16]",
    "zctipc.spawn": "[0, 1]",
    "queues, arrays and tensors, no process": f"{sum(range(1 << 20))}\n4",
}


@pytest.mark.parametrize("flags", [(), ("-W", "error")], ids=["default", "W-error"])
@pytest.mark.parametrize("case", sorted(EXPLICIT))
def test_a_program_that_passes_a_context_or_chose_a_method_gets_no_warning(isolated, tmp_path, case, flags):
    out = run(isolated, tmp_path, _HEAD + textwrap.dedent(EXPLICIT[case]), *flags)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == EXPECTED.get(case, "[2, 2, 2, 2]")
    assert "Warning" not in out.stderr, out.stderr


def test_the_command_line_never_warns(isolated, tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import zctipc, sys; q = zctipc.Queue(); print('ready', flush=True); sys.stdin.read()"],
        env=isolated,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        for command in (["ls"], ["ls", "--json"], ["gc", "--dry-run"], ["gc"], ["doctor"], ["doctor", "--json"]):
            out = subprocess.run(
                [sys.executable, "-W", "error", "-m", "zctipc", *command],
                env=isolated,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode in ((0, 1) if command[0] == "doctor" else (0,)), out.stderr
            assert out.stderr == "", f"zctipc {' '.join(command)}: {out.stderr}"
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


# -- a program that chose nothing: one warning, at its first start ---------------

CHOOSES_NOTHING = """
import concurrent.futures, multiprocessing, sys
import numpy as np
import zctipc


def child(q, i):
    q.put(np.full(4, i))


if __name__ == "__main__":
    q = zctipc.Queue()                    # loads the library: nothing said
    q.put(np.arange(1 << 20)); q.get()
    print("loaded", flush=True)
    for i in range(2):
        p = multiprocessing.Process(target=child, args=(q, i))
        p.start()                         # START
        print(q.get(timeout=60).tolist(), flush=True)
        p.join()
    with multiprocessing.Pool(1) as pool:
        print(pool.apply(int, ("7",)))
    with concurrent.futures.ProcessPoolExecutor(1) as ex:
        print(ex.submit(int, "8").result())
    print(multiprocessing.get_start_method())
"""


def _start_line():
    return next(n for n, line in enumerate(CHOOSES_NOTHING.splitlines(), 1) if "# START" in line)


def test_a_program_that_chose_nothing_is_warned_once_at_its_first_start(isolated, tmp_path):
    out = run(isolated, tmp_path, CHOOSES_NOTHING)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["loaded", "[0,", "0,", "0,", "0]", "[1,", "1,", "1,", "1]", "7", "8", "forkserver"]
    if not SWITCHES:
        assert WARNING not in out.stderr
        return
    assert out.stderr.count(WARNING) == 1, out.stderr
    assert out.stderr.count("RuntimeWarning") == 1, out.stderr
    # It points at the program's own line, not at multiprocessing's.
    assert f"program.py:{_start_line()}: RuntimeWarning: {WARNING}" in out.stderr, out.stderr
    assert "set_start_method" in out.stderr and "ZCTIPC_NO_START_METHOD_WARNING=1" in out.stderr


@pytest.mark.skipif(not SWITCHES, reason="Python 3.14 starts with forkserver: zctipc switches nothing")
def test_under_W_error_the_warning_is_raised_by_the_first_start_and_nothing_earlier(isolated, tmp_path):
    out = run(isolated, tmp_path, CHOOSES_NOTHING, "-W", "error")
    assert out.returncode == 1
    assert out.stdout.split() == ["loaded"], "the queue, the array and the library load said nothing"
    assert out.stderr.rstrip().splitlines()[-1].startswith(f"RuntimeWarning: {WARNING}"), out.stderr
    assert f"line {_start_line()}, in <module>" in out.stderr


@pytest.mark.parametrize("flags", [(), ("-W", "error")], ids=["default", "W-error"])
def test_the_environment_variable_silences_it(isolated, tmp_path, flags):
    out = run(isolated, tmp_path, CHOOSES_NOTHING, *flags, extra_env={"ZCTIPC_NO_START_METHOD_WARNING": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "forkserver"
    assert "Warning" not in out.stderr, out.stderr


@pytest.mark.skipif(not SWITCHES, reason="Python 3.14 starts with forkserver: zctipc switches nothing")
@pytest.mark.parametrize("start", ["zctipc.Process", "zctipc.Pool"])
def test_zctipcs_own_module_level_names_warn_as_multiprocessings_do(isolated, tmp_path, start):
    # import zctipc as multiprocessing: its Process and Pool stand in for
    # multiprocessing's, whose start method zctipc changed.
    program = _HEAD + textwrap.dedent(
        """
        if __name__ == "__main__":
            if START == "zctipc.Process":
                q = zctipc.Queue()
                p = zctipc.Process(target=child, args=(q, 3))
                p.start()
                print(q.get(timeout=60).tolist())
                p.join()
            else:
                with zctipc.Pool(1) as pool:
                    print(pool.apply(int, ("3",)))
        """
    ).replace("START", repr(start))
    out = run(isolated, tmp_path, program)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count(WARNING) == 1, out.stderr
    out = run(isolated, tmp_path, program, "-W", "error")
    assert out.returncode == 1 and f"RuntimeWarning: {WARNING}" in out.stderr


# -- children ---------------------------------------------------------------------

CHILDREN = """
import multiprocessing
import numpy as np
import zctipc


def grandchild(q):
    q.put(np.full(2, 9))


def child(q):
    # A child whose parent passed a context: its own default-context
    # starts, Process and Pool, say nothing.
    zctipc.empty(16)
    p = multiprocessing.Process(target=grandchild, args=(q,))
    p.start()
    p.join()
    with multiprocessing.Pool(1) as pool:
        q.put(np.full(2, pool.apply(int, ("5",))))


if __name__ == "__main__":
    for method in ("forkserver", "spawn"):
        ctx = zctipc.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        print(method, q.get(timeout=60).tolist(), q.get(timeout=60).tolist())
        p.join()
        print(p.exitcode)
"""


@pytest.mark.parametrize("flags", [(), ("-W", "error")], ids=["default", "W-error"])
def test_no_warning_inside_a_child(isolated, tmp_path, flags):
    out = run(isolated, tmp_path, CHILDREN, *flags)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["forkserver [9, 9] [5, 5]", "0", "spawn [9, 9] [5, 5]", "0"], out.stderr
    assert "Warning" not in out.stderr, out.stderr
