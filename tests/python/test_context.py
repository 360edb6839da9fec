"""zctipc as a stand-in for multiprocessing: contexts, Process, Pool and
the other names, with forkserver as the start method."""

import subprocess
import sys
import textwrap

import _workers
import pytest

import zctipc


def test_every_documented_name_exists():
    for name in zctipc.context.MULTIPROCESSING_NAMES:
        assert hasattr(zctipc, name), name
        assert name in zctipc.__all__
    assert zctipc.Queue is zctipc.queues.Queue
    assert issubclass(zctipc.TimeoutError, Exception)


def test_contexts():
    assert zctipc.get_start_method() == "forkserver"
    assert zctipc.get_context().get_start_method() == "forkserver"
    spawn = zctipc.get_context("spawn")
    assert spawn.get_start_method() == "spawn"
    assert isinstance(spawn.Queue(), zctipc.Queue)
    assert isinstance(spawn.JoinableQueue(), zctipc.JoinableQueue)
    assert isinstance(spawn.SimpleQueue(), zctipc.SimpleQueue)
    assert spawn.get_context() is spawn and spawn.get_context("forkserver") is zctipc.get_context("forkserver")
    assert sorted(zctipc.get_all_start_methods()) == ["forkserver", "spawn"]
    with pytest.raises(ValueError, match="does not survive fork"):
        zctipc.set_start_method("fork", force=True)


def test_set_start_method():
    try:
        zctipc.set_start_method("spawn", force=True)
        assert zctipc.get_start_method() == "spawn"
        with pytest.raises(RuntimeError, match="already been set"):
            zctipc.set_start_method("forkserver")
        q = zctipc.Queue()
        p = zctipc.Process(target=_workers.produce, args=(q, 0, 2))
        p.start()
        p.join(60)
        assert p.exitcode == 0 and [q.get(), q.get()] == [(0, 0), (0, 1)]
    finally:
        zctipc.set_start_method(None, force=True)
    assert zctipc.get_start_method() == "forkserver"


def test_process_and_pool_at_module_level():
    q = zctipc.Queue()
    p = zctipc.Process(target=_workers.produce, args=(q, 1, 3))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert [q.get() for _ in range(3)] == [(1, 0), (1, 1), (1, 2)]
    with zctipc.Pool(2) as pool:
        assert pool.map(abs, [-3, -4, 5]) == [3, 4, 5]
    assert zctipc.cpu_count() >= 1
    e = zctipc.Event()
    e.set()
    assert e.is_set()
    with zctipc.Lock():
        pass


@pytest.mark.slow
def test_import_zctipc_as_multiprocessing(tmp_path):
    script = tmp_path / "swap.py"
    script.write_text(
        textwrap.dedent("""
        import zctipc as multiprocessing
        import numpy as np

        def work(q, results):
            item = q.get()
            results.put(float(item["x"].sum()))

        if __name__ == "__main__":
            q, results = multiprocessing.Queue(), multiprocessing.Queue()
            procs = [multiprocessing.Process(target=work, args=(q, results)) for _ in range(2)]
            for p in procs:
                p.start()
            for _ in procs:
                q.put({"x": np.ones(1000)})
            print(sorted(results.get() for _ in procs))
            for p in procs:
                p.join()
            with multiprocessing.Pool(2) as pool:
                print(pool.map(abs, [-1, -2]))
            print(multiprocessing.current_process().name)
    """)
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["[1000.0, 1000.0]", "[1, 2]", "MainProcess"]
