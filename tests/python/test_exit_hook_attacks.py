"""The CUDA codec's exit warning (tensors it sent that other processes still
hold) and the hooks that run before a process lets go of its counts
(native.before_letting_go), with the stand-in driver: every way out of a
producer, and what is left afterwards."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import left_in, with_pythonpath

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
MOCK_SOURCE = os.path.join(HERE, "..", "cuda", "mockcuda.c")
WARNING = "exits while {} CUDA tensors it sent are still in use by other processes"

# A producer with the stand-in driver: send(n) puts n tensors of device
# memory in a queue of its own, which holds them (a message not yet taken).
PRODUCER = textwrap.dedent("""
    import os, signal, sys, threading, time
    import zctipc, _gpu
    from zctipc._core import native
    from zctipc._wire import gpu as codec
    _gpu.stand_in_torch_cuda()
    _gpu.send_fake_cuda_tensors()
    q = zctipc.Queue()
    cts = []

    def send(n):
        for _ in range(n):
            ct = zctipc.cuda.empty((16,), "int32")
            cts.append(ct)
            q.put(_gpu.FakeCudaTensor(ct.data_ptr, 16))

    _release_all = native.release_all

    def release_all():
        sys.stderr.write("released\\n")
        return _release_all()

    native.release_all = release_all  # says that the counts were let go
""")


@pytest.fixture(scope="module")
def mock_lib(tmp_path_factory):
    path = tmp_path_factory.mktemp("mockcuda") / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(path), MOCK_SOURCE], check=True)
    return str(path)


@pytest.fixture
def env(isolated, mock_lib):
    """The stand-in driver, in a segment directory of its own."""
    return dict(isolated, ZCTIPC_CUDA_LIBRARY=mock_lib, PYTHONPATH=with_pythonpath(HERE))


def run(env, code, timeout=60):
    return subprocess.run(
        [sys.executable, "-c", PRODUCER + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def warned(stderr, n):
    return stderr.count(WARNING.format(n))


def test_two_tensors_in_flight_are_counted_and_all_is_let_go(env):
    out = run(env, "send(2)\n")
    assert out.returncode == 0, out.stderr
    assert warned(out.stderr, 2) == 1, out.stderr
    assert out.stderr.index("exits while") < out.stderr.index("released"), "the codec looks before the counts go"
    assert "at exit" not in out.stderr.replace("exits while", ""), out.stderr
    assert left_in(env) == []


def test_a_tensor_received_and_dropped_before_exit_is_not_warned_about(env):
    out = run(
        env,
        """
        send(1)
        got = q.get(timeout=30)
        del got
        import gc; gc.collect()
        codec._sweep()
        assert not codec._sent, codec._sent
        print("dropped")
        """,
    )
    assert out.returncode == 0 and out.stdout.split() == ["dropped"], out.stderr
    assert "exits while" not in out.stderr, out.stderr
    assert "released" in out.stderr
    assert left_in(env) == []


def died_of_sigterm_warning_first(out, env):
    """The process died of SIGTERM, warned before its counts went, and
    left nothing."""
    assert out.returncode == -signal.SIGTERM, (out.returncode, out.stderr)
    assert "survived" not in out.stdout
    assert warned(out.stderr, 1) == 1, out.stderr
    assert out.stderr.index("exits while") < out.stderr.index("released"), out.stderr
    assert left_in(env) == []


def test_sigterm_warns_then_lets_go_and_dies_of_it(env):
    out = run(env, "send(1)\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(30)\nprint('survived')\n")
    died_of_sigterm_warning_first(out, env)


def test_sigterm_while_the_codec_is_busy_still_ends_the_process(env):
    """SIGTERM that comes while the main thread is inside the codec (its
    lock held, as during a send or a sweep): the handler must not wait for
    a lock its own thread holds."""
    code = """
        send(1)
        with codec._lock:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        print('survived')
        """
    try:
        out = run(env, code, timeout=30)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"a SIGTERM handler waited on the codec's lock: the process hung ({exc.stderr!r})")
    died_of_sigterm_warning_first(out, env)


def test_sys_exit_in_a_thread_ends_only_the_thread_and_the_process_warns_at_its_exit(env):
    out = run(
        env,
        """
        def leave():
            _gpu.send_fake_cuda_tensors()  # this thread's pickler
            send(1)
            sys.exit(3)
        t = threading.Thread(target=leave)
        t.start(); t.join()
        print("main goes on")
        """,
    )
    assert out.returncode == 0 and out.stdout.strip() == "main goes on", out.stderr
    assert warned(out.stderr, 1) == 1, out.stderr
    assert left_in(env) == []


def test_os_exit_runs_no_hook_and_the_cleanup_daemon_takes_what_is_left(env):
    out = run(env, "send(1)\nsys.stderr.flush()\nos._exit(0)\n")
    assert out.returncode == 0, out.stderr
    assert "exits while" not in out.stderr and "released" not in out.stderr, out.stderr
    assert left_in(env) == []


def test_a_hook_that_raises_is_reported_and_the_counts_are_let_go(env):
    out = run(
        env,
        """
        send(1)
        def broken():
            raise ValueError("a broken hook")
        native.before_letting_go(broken)
        """,
    )
    assert out.returncode == 0, out.stderr
    assert "zctipc: at exit: a broken hook" in out.stderr, out.stderr
    assert warned(out.stderr, 1) == 1, "the hooks before it ran"
    assert out.stderr.index("a broken hook") < out.stderr.index("released"), out.stderr
    assert left_in(env) == []


def test_a_warning_made_an_error_is_reported_and_the_counts_are_let_go(env):
    out = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", PRODUCER + "send(1)\n"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "zctipc: at exit: zctipc: this process " + WARNING.format(1) in out.stderr, out.stderr
    assert out.stderr.index("at exit") < out.stderr.index("released"), out.stderr
    assert left_in(env) == []


def test_a_forked_child_runs_no_hook_against_the_parents_runtime(env):
    """A child forked after the library loaded exits normally (atexit runs
    there, with the parent's finalizers): it neither warns about its
    parent's tensors nor fails on a Go runtime it does not have."""
    out = run(
        env,
        """
        send(1)
        sys.stdout.flush(); sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            sys.stderr.write("child\\n")
            sys.exit(0)  # atexit runs: multiprocessing's exit function, zctipc's finalizer
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        """,
    )
    assert out.returncode == 0 and out.stdout.split() == ["child", "0"], out.stderr
    child = out.stderr[: out.stderr.index("child\n")]
    after_child = out.stderr[out.stderr.index("child\n") :]
    assert "Traceback" not in out.stderr and "at exit" not in out.stderr.replace("exits while", ""), out.stderr
    assert not child.strip(), out.stderr
    # The child's stderr comes before the parent's own exit: one warning, the parent's.
    assert warned(after_child, 1) == 1 and out.stderr.count("released") == 1, out.stderr
    assert left_in(env) == []


def test_a_multiprocessing_fork_child_runs_no_hook_against_the_parents_runtime(env):
    out = run(
        env,
        """
        import multiprocessing
        send(1)
        sys.stdout.flush(); sys.stderr.flush()
        p = multiprocessing.get_context("fork").Process(target=sys.stderr.write, args=("child\\n",))
        p.start(); p.join()
        print("child", p.exitcode)
        """,
    )
    assert out.returncode == 0 and out.stdout.split() == ["child", "0"], out.stderr
    assert "Traceback" not in out.stderr and "at exit" not in out.stderr.replace("exits while", ""), out.stderr
    # The child's finalizer runs (multiprocessing registers it again there),
    # but finds no library loaded: it warns about nothing and lets go of nothing.
    assert warned(out.stderr, 1) == 1, out.stderr
    assert left_in(env) == []


def spawned_producer(q, n):
    """A spawned child that sends n tensors of the stand-in driver's memory
    into q, which its parent holds, and exits."""
    import _gpu

    import zctipc

    _gpu.stand_in_torch_cuda()
    _gpu.send_fake_cuda_tensors()
    keep = []
    for _ in range(n):
        ct = zctipc.cuda.empty((16,), "int32")
        keep.append(ct)
        q.put(_gpu.FakeCudaTensor(ct.data_ptr, 16))
    sys.stderr.write("child sent\n")


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_child_producer_warns_at_its_own_exit(env, method):
    """multiprocessing clears a child's finalizers when it starts; the hook
    still runs at the child's exit, while the parent's queue holds what the
    child sent."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
                import sys, zctipc, test_exit_hook_attacks as t
                ctx = zctipc.get_context({method!r})
                q = ctx.Queue()
                p = ctx.Process(target=t.spawned_producer, args=(q, 2))
                p.start(); p.join()
                print("child", p.exitcode, q.qsize())
            """),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.split() == ["child", "0", "2"], out.stderr
    assert warned(out.stderr, 2) == 1, out.stderr
    assert "at exit" not in out.stderr.replace("exits while", ""), out.stderr
    assert left_in(env) == []


def test_a_sigterm_during_a_later_exit_handler_runs_no_hook_again(env):
    """An atexit handler registered before zctipc runs after zctipc let go;
    a SIGTERM then runs zctipc's exit handler again, whose hooks must not
    look at counts already let go (it said "invalid or closed handle")."""
    code = """
        send(1)
        print("sent")
        """
    late = "import atexit, os, signal, sys, time\n" + (
        "atexit.register(lambda: (sys.stderr.write('late\\n'), os.kill(os.getpid(), signal.SIGTERM), time.sleep(5)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", late + PRODUCER + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == -signal.SIGTERM and out.stdout.split() == ["sent"], (out.returncode, out.stderr)
    assert warned(out.stderr, 1) == 1, out.stderr
    assert out.stderr.index("exits while") < out.stderr.index("late"), out.stderr
    assert "at exit" not in out.stderr.replace("exits while", ""), out.stderr
    assert left_in(env) == []


def producer_until_received(q, back):
    """A spawned child that sends one tensor of the stand-in driver's memory
    (value 7 at index 3), waits until its parent holds it, and exits."""
    import ctypes

    import _gpu

    import zctipc

    _gpu.stand_in_torch_cuda()
    _gpu.send_fake_cuda_tensors()
    ct = zctipc.cuda.empty((16,), "int32")
    (ctypes.c_int32 * 16).from_address(ct.data_ptr)[3] = 7
    q.put(_gpu.FakeCudaTensor(ct.data_ptr, 16))
    assert back.get(timeout=60) == "held"


def test_a_consumer_holding_a_tensor_of_an_exited_producer_then_lets_go_of_everything(env):
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
                import gc, zctipc, _gpu, test_exit_hook_attacks as t
                _gpu.stand_in_torch_cuda()
                ctx = zctipc.get_context("spawn")
                q, back = ctx.Queue(), ctx.Queue()
                p = ctx.Process(target=t.producer_until_received, args=(q, back))
                p.start()
                got = q.get(timeout=60)
                back.put("held")
                p.join()
                print("child", p.exitcode, int(got[3]))
                del got
                gc.collect()
            """),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.split() == ["child", "0", "7"], out.stderr
    assert warned(out.stderr, 1) == 1, "the producer exited while its consumer held the tensor"
    assert "at exit" not in out.stderr.replace("exits while", ""), out.stderr
    assert left_in(env) == []
