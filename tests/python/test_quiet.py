"""zctipc is quiet: the start method warning appears only where it is due
(Note [the start method warning] in zctipc.context), once, at the start of
a process through the default context of a program that chose no method;
never for the command line, a program that passes its contexts, a child,
or with ZCTIPC_NO_START_METHOD_WARNING=1. Each case is a real program,
run as a file (forkserver children import it), with and without
``python -W error``. And ``zctipc doctor``: its JSON is typed, and it says
what systemd's RemoveIPC does to this user's shared memory (Note
[RemoveIPC] in zctipc.cli), read from a file system tree of the test's."""

import json
import pwd
import re
import subprocess
import sys
import textwrap

import pytest

from zctipc import cli

pytestmark = pytest.mark.slow

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


@pytest.mark.parametrize("start", ["zctipc.Process", "zctipc.Pool"])
def test_zctipcs_own_process_and_pool_say_nothing(isolated, tmp_path, start):
    # zctipc.Process and zctipc.Pool start with zctipc's method, forkserver,
    # as their documentation says: the program chose it by calling them
    # (the README's first program does), under -W error too.
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
    for flags in ((), ("-W", "error")):
        out = run(isolated, tmp_path, program, *flags)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().endswith("[3, 3, 3, 3]" if start == "zctipc.Process" else "3"), out.stdout
        assert "Warning" not in out.stderr, out.stderr


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


# -- doctor: typed JSON, and systemd's RemoveIPC ---------------------------------------


def _leaves(value, path=""):
    if isinstance(value, dict):
        for key, v in value.items():
            yield from _leaves(v, f"{path}.{key}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, value


def test_doctor_json_is_one_object_of_typed_values(isolated):
    out = subprocess.run(
        [sys.executable, "-m", "zctipc", "doctor", "--json"], env=isolated, capture_output=True, text=True, timeout=60
    )
    report = json.loads(out.stdout)  # one object, and nothing else on stdout
    assert out.returncode == (0 if report["ok"] else 1)
    numbers = {
        ".libzctipc.abi",
        ".shared_memory.total",
        ".shared_memory.free",
        ".huge_pages.reserved",
        ".huge_pages.free",
        ".huge_pages.size",
        ".remove_ipc.uid",
    }
    booleans = {
        ".ok",
        ".segment_huge_pages.enabled",
        ".cleanup_daemon.running",
        ".remove_ipc.value",
        ".remove_ipc.systemd",
        ".remove_ipc.system_user",
        ".remove_ipc.lingering",
        ".remove_ipc.applies",
    }
    leaves = dict(_leaves(report))
    for path in numbers:
        assert type(leaves[path]) is int, (path, leaves[path])
    for path in booleans:
        assert type(leaves[path]) is bool, (path, leaves[path])
    for limit in (".open_files.soft", ".open_files.hard"):
        assert leaves[limit] is None or type(leaves[limit]) is int  # None: unlimited
    assert report["libzctipc"]["abi"] == cli._native.ABI_VERSION
    assert report["shared_memory"]["dir"] == isolated["ZCTIPC_SHM_DIR"]
    assert report["cleanup_daemon"] == {
        "running": False,
        "dir": isolated["ZCTIPC_RUNTIME_DIR"],
        "pid": None,
        "clients": None,
        "memfd_segments": None,
    }
    for path, value in leaves.items():
        assert not (isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d+)?|true|false|yes|no", value)), (path, value)


def _system_tree(root, main=None, dropins=(), running=True, linger=None, sys_uid_max=None):
    """A file system root holding systemd's files: main is the text of
    etc/systemd/logind.conf, dropins (directory, name, text)."""
    if running:
        (root / "run/systemd/system").mkdir(parents=True)
    if main is not None:
        (root / "etc/systemd").mkdir(parents=True, exist_ok=True)
        (root / "etc/systemd/logind.conf").write_text(main)
    for directory, name, text in dropins:
        (root / directory / "systemd/logind.conf.d").mkdir(parents=True, exist_ok=True)
        (root / directory / "systemd/logind.conf.d" / name).write_text(text)
    if linger:
        (root / "var/lib/systemd/linger").mkdir(parents=True)
        (root / "var/lib/systemd/linger" / linger).write_text("")
    if sys_uid_max is not None:
        (root / "etc").mkdir(exist_ok=True)
        (root / "etc/login.defs").write_text(f"# a comment\nSYS_UID_MAX\t\t{sys_uid_max}\n")
    return str(root)


_DOCTOR = """
import functools, json, sys
from zctipc import cli

cli.SYSTEM_ROOT = sys.argv[1]
if sys.argv[2] != "-":  # the report of another user
    cli._remove_ipc = functools.partial(cli._remove_ipc, uid=int(sys.argv[2]))
sys.exit(cli.main(sys.argv[3:]))
"""


def doctor(env, root, uid, *args):
    return subprocess.run(
        [sys.executable, "-c", _DOCTOR, root, str(uid), "doctor", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_doctor_reports_removeipc_as_logind_reads_it(isolated, tmp_path):
    # The last assignment wins: the main file, then the drop-ins by name,
    # /etc's 20-b.conf hiding /usr/lib's; a value logind cannot read, and
    # another section's, change nothing.
    root = _system_tree(
        tmp_path / "root",
        main="[Login]\n#RemoveIPC=no\nRemoveIPC=no\n",
        dropins=[
            ("usr/lib", "10-a.conf", "[Login]\nRemoveIPC=yes\n"),
            ("usr/lib", "20-b.conf", "[Login]\nRemoveIPC=no\n"),
            ("etc", "20-b.conf", "[Login]\nRemoveIPC = on\nRemoveIPC=maybe\n[Other]\nRemoveIPC=no\n"),
            ("etc", "README", "RemoveIPC=no\n"),
        ],
    )
    out = doctor(isolated, root, 60000, "--json")
    report = json.loads(out.stdout)
    assert report["remove_ipc"] == {
        "value": True,
        "source": "/etc/systemd/logind.conf.d/20-b.conf",
        "systemd": True,
        "uid": 60000,
        "system_user": False,
        "lingering": False,
        "applies": True,
    }
    assert out.returncode == 1 and not report["ok"]
    assert any("RemoveIPC=yes" in w and "uid 60000" in w and "enable-linger" in w for w in report["warnings"])
    text = doctor(isolated, root, 60000).stdout
    line = next(ln for ln in text.splitlines() if ln.startswith("RemoveIPC:"))
    assert "yes (set in /etc/systemd/logind.conf.d/20-b.conf)" in line and "uid 60000" in line
    assert "WARNING: systemd-logind removes the shared memory of this user (uid 60000)" in text


@pytest.mark.parametrize(
    "tree,uid,expect,says",
    [
        (dict(main="[Login]\nRemoveIPC=no\n"), 60000, dict(value=False, applies=False), "no (set in "),
        (dict(main="[Login]\n#RemoveIPC=yes\n"), 60000, dict(value=True, source=None, applies=True), "default"),
        (dict(), 0, dict(value=True, system_user=True, applies=False), "uid 0 is one"),
        (dict(sys_uid_max=70000), 60000, dict(system_user=True, applies=False), "uid 60000 is one"),
        (dict(running=False), 60000, dict(systemd=False, applies=False), "systemd does not run here"),
    ],
    ids=["no", "default", "root", "system-user", "no-systemd"],
)
def test_doctor_says_whether_removeipc_takes_this_users_shared_memory(isolated, tmp_path, tree, uid, expect, says):
    root = _system_tree(tmp_path / "root", **tree)
    report = json.loads(doctor(isolated, root, uid, "--json").stdout)
    assert {k: report["remove_ipc"][k] for k in expect} == expect
    assert any("RemoveIPC" in w for w in report["warnings"]) == expect["applies"]
    line = next(ln for ln in doctor(isolated, root, uid).stdout.splitlines() if ln.startswith("RemoveIPC:"))
    assert says in line, line


def test_doctor_says_a_lingering_user_keeps_their_shared_memory(isolated, tmp_path):
    user = next((u for u in pwd.getpwall() if u.pw_uid > 999), None)
    assert user is not None, "this machine has a user above the system range (nobody, 65534)"
    root = _system_tree(tmp_path / "root", linger=user.pw_name)
    report = json.loads(doctor(isolated, root, user.pw_uid, "--json").stdout)
    assert report["remove_ipc"]["lingering"] is True and report["remove_ipc"]["applies"] is False
    line = next(ln for ln in doctor(isolated, root, user.pw_uid).stdout.splitlines() if ln.startswith("RemoveIPC:"))
    assert "lingers" in line
