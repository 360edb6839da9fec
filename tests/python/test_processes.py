"""Segments across real processes, under the spawn and forkserver start methods."""

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap

import _workers
import numpy as np
import pytest
from conftest import segment_exists, with_pythonpath

import zctipc

GIB = 1 << 30


def run_in(ctx, fn, *args, timeout=120):
    """Run fn(*args) in a child of ctx and return its result, re-raising its
    error by name."""
    queue = ctx.SimpleQueue()
    p = ctx.Process(target=_workers.report, args=(queue, fn, *args))
    p.start()
    p.join(timeout)
    assert p.exitcode == 0, f"child exit code {p.exitcode}"
    result = queue.get()
    assert result[0] == "ok", result[3]
    return result[1]


@pytest.mark.slow
def test_one_gib_tensor_is_shared_not_copied(ctx, segname):
    n = GIB // 4
    stride = 4096
    with zctipc.create_shared_tensor(segname, shape=(n,), dtype=np.float32) as t:
        a = t.numpy()
        a[::stride] = np.arange(len(a[::stride]), dtype=np.float32)
        a[-1] = 42.0
        expected_sum = float(a.sum(dtype=np.float64))
        total = run_in(ctx, _workers.read_and_write_big, t.name)
        assert total == expected_sum, "the child read every byte the parent wrote"
        np.testing.assert_array_equal(a[1::stride], -np.arange(len(a[1::stride]), dtype=np.float32))
        assert t.refcount == 1, "the child let go when it finished"
        del a
    assert not segment_exists(segname)


@pytest.mark.slow
def test_hand_on_after_the_creator_exits(ctx, segname):
    """A creates and shares with B; A exits; B hands it to C, who reads A's data."""
    ready, release = ctx.Event(), ctx.Event()
    a = ctx.Process(target=_workers.create_hold_and_exit, args=(segname, ready, release))
    a.start()
    assert ready.wait(60)
    b = zctipc.attach_shared_tensor(segname)  # B is this process
    assert b.refcount == 2
    release.set()
    a.join(60)
    assert a.exitcode == 0
    assert segment_exists(segname), "B still holds it"
    assert b.refcount == 1
    expected = _workers.hashlib.sha256(np.arange(1 << 16, dtype=np.int32).tobytes()).hexdigest()
    assert run_in(ctx, _workers.digest_of, segname) == expected
    b.close()
    assert not segment_exists(segname)


def test_holder_in_another_process_keeps_the_segment(ctx, segname):
    attached, release = ctx.Event(), ctx.Event()
    t = zctipc.create_shared_tensor(segname, data=np.arange(3))
    holder = ctx.Process(target=_workers.hold_until, args=(segname, attached, release))
    holder.start()
    assert attached.wait(60)
    assert t.refcount == 2
    t.close()
    assert segment_exists(segname), "the other holder keeps it"
    release.set()
    holder.join(60)
    assert holder.exitcode == 0
    assert not segment_exists(segname), "the last holder unlinked it"


def test_a_process_that_exits_without_closing_lets_go():
    code = textwrap.dedent("""
        import numpy as np, zctipc
        t = zctipc.create_shared_tensor(shape=(3,))
        view = t.numpy()
        print(t.name, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert not segment_exists(out.stdout.strip()), "exit released what the process held"


def test_forked_child_gets_forked_process_error():
    zctipc.empty(1)  # the library is loaded in this process
    fork = multiprocessing.get_context("fork")
    queue = fork.SimpleQueue()
    p = fork.Process(target=_workers.report, args=(queue, _workers.call_zctipc))
    p.start()
    p.join(2)
    hung = p.is_alive()
    if hung:
        p.kill()
        p.join()
    assert not hung, "a forked child must fail at once, not hang"
    status, name, message, _ = queue.get()
    assert (status, name) == ("error", "ForkedProcessError")
    assert "zctipc.get_context()" in message and "fork" in message


def test_forked_child_drops_inherited_tensors_quietly():
    t = zctipc.create_shared_tensor(data=np.arange(3))
    fork = multiprocessing.get_context("fork")
    p = fork.Process(target=t.close)
    p.start()
    p.join(10)
    assert p.exitcode == 0
    assert t.numpy().tolist() == [0, 1, 2]
    t.close()


def test_get_context_refuses_fork():
    with pytest.raises(ValueError, match="does not survive fork"):
        zctipc.get_context("fork")
    assert zctipc.get_context().get_start_method() == "forkserver"
    assert zctipc.get_context("spawn").get_start_method() == "spawn"


def test_fork_server_never_loads_the_library(tmp_path):
    """A module that calls zctipc at import time, preloaded into the fork
    server, would load Go there, and the server's children are forked:
    zctipc refuses to load in the fork server, loudly, instead of letting
    the children hang."""
    (tmp_path / "calls_zctipc_at_import.py").write_text("import zctipc\nzctipc.empty(1)\n")
    script = tmp_path / "main.py"
    script.write_text(
        textwrap.dedent("""
        import zctipc

        def work():
            pass

        if __name__ == "__main__":
            ctx = zctipc.get_context("forkserver")
            ctx.set_forkserver_preload(["calls_zctipc_at_import"])
            p = ctx.Process(target=work)
            try:
                p.start()
                p.join(30)
            except Exception as exc:
                print("start failed:", type(exc).__name__)
    """)
    )
    env = dict(os.environ, PYTHONPATH=with_pythonpath(str(tmp_path)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert "while the multiprocessing fork server imported" in out.stderr, out.stderr


def test_a_consumer_reuses_its_mapping_of_a_segment_it_sees_again(ctx, segname):
    with zctipc.create_shared_tensor(segname, data=np.arange(4)) as t:
        same_address, refcount = run_in(ctx, _workers.attach_twice, t.name)
        assert same_address
        assert refcount == 2
        assert t.refcount == 1, "a cached mapping holds no count"
    assert not segment_exists(segname), "and does not keep the segment alive"


def test_sigterm_lets_go_before_dying():
    """Pool.terminate() and schedulers stop processes with SIGTERM: a
    process that uses zctipc lets go of what it holds, then dies of it."""
    code = textwrap.dedent("""
        import os, signal, time, zctipc, numpy as np
        q = zctipc.Queue()
        kept = zctipc.empty(1000)
        t = zctipc.create_shared_tensor(data=np.arange(3))
        q.put(np.ones(10))           # a pool slot in flight in the queue
        print(q._name, t.name, flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    names = child.stdout.readline().split()
    assert all(segment_exists(n) for n in names)
    child.send_signal(signal.SIGTERM)
    child.wait(30)
    assert child.returncode == -signal.SIGTERM, "it still dies of SIGTERM"
    assert not any(segment_exists(n) for n in names)
    assert not [s for s in zctipc.list_segments() if s.creator_pid == child.pid]
