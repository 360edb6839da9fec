"""Attacks on DataLoader workers started with zctipc's context (Note
[batches in the pool] in zctipc._wire.batches), with real processes: a
main process that keeps every batch of a worker whose pool is small,
workers and main processes killed or stopped mid-epoch, processes forked
from a worker, torch's _new_shared called every way, custom collates,
batches compared element by element with torch's own forkserver loader,
and garbage collections that run zctipc's finalizers (Note [closing after a
collection] in zctipc._core.native)."""

import functools
import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import _loaders
import numpy as np
import pytest
import torch
from conftest import HERE, library_files, own_ledgers, wait_until_gone, with_pythonpath
from torch.utils.data import DataLoader

import zctipc

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _shut_down_workers():
    """A loader's iterator shuts its workers down when it is collected: a
    test's iterator, held by a traceback or a cycle, goes before the next."""
    yield
    gc.collect()


def nothing_left(before):
    """Assert that every zctipc file made since before is gone (the cleanup
    daemon sweeps killed processes)."""
    gc.collect()
    left = wait_until_gone(library_files() - before - own_ledgers())
    assert left == [], [(s.name, s.kind, s.creator_pid) for s in zctipc.list_segments() if s.name in left]


def run(text, *flags, env=None):
    return subprocess.run(
        [sys.executable, *flags, "-c", textwrap.dedent(text)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE,
        env=env or {**os.environ, "PYTHONPATH": with_pythonpath(HERE)},
    )


# -- a full pool ---------------------------------------------------------


def test_a_worker_whose_pool_is_full_gives_batches_segments_of_their_own():
    # The main process keeps every batch of three epochs: the worker's 4 MiB
    # pool holds three 1 MiB batches, and every batch's 4 MiB of arrays is
    # larger than the limit. The worker neither waits for buffers that never
    # come back (it did, in the queue's move of torch's fallback storage) nor
    # fails (it did, for a batch larger than the limit).
    before = library_files()
    limit = 4 << 20
    loader = DataLoader(
        _loaders.Heavy(12),
        batch_size=4,
        num_workers=1,
        persistent_workers=True,
        worker_init_fn=functools.partial(_loaders.limit_pool, limit),
        timeout=30,
        multiprocessing_context=zctipc.get_context(),
    )
    kept = [batch for _ in range(3) for batch in loader]
    assert len(kept) == 9
    for n, (data, arrays, index, reserved) in enumerate(kept):
        first = (n % 3) * 4
        assert index.tolist() == list(range(first, first + 4))
        assert torch.equal(data[:, 0, 0], index.float()) and torch.equal(data, data[:, :1, :1].expand_as(data))
        assert torch.equal(arrays, index.float().view(-1, 1).expand_as(arrays))
        assert zctipc.is_shared(data) and zctipc.is_shared(arrays) and zctipc.is_shared(index)
        assert all(r <= limit for r in reserved.tolist())
    del kept, loader, data, arrays, index, reserved
    nothing_left(before)


# -- killed and stopped processes ------------------------------------------


def readable(kept):
    return all(torch.equal(data, index.view(-1, 1, 1).float().expand_as(data)) for data, index in kept)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_worker_killed_or_stopped_mid_epoch_leaves_the_batches_received_and_nothing_else(how):
    before = library_files()
    ctx = zctipc.get_context()
    loader = DataLoader(_loaders.Paced(), batch_size=2, num_workers=2, timeout=60, multiprocessing_context=ctx)
    it = iter(loader)
    kept = [next(it) for _ in range(4)]  # the workers have started (which takes long on a busy machine)
    it._timeout = 2  # how soon a stopped worker is given up (a killed one too: its parent is not this process)
    pid = it._workers[0].pid
    os.kill(pid, getattr(signal, how))
    try:
        with pytest.raises(RuntimeError, match="exited unexpectedly" if how == "SIGKILL" else "timed out"):
            kept += list(it)
    finally:
        if how == "SIGSTOP":
            os.kill(pid, signal.SIGKILL)  # a stopped worker dies only of SIGKILL
    assert readable(kept)
    del it
    gc.collect()
    assert readable(kept)
    del kept
    nothing_left(before)


def test_the_workers_of_a_killed_main_process_leave_and_nothing_is_left(isolated, tmp_path):
    # A worker is the fork server's child, which outlives the main process:
    # the workers watch the main process itself (Note [a worker of a fork
    # server] in zctipc.context). They lived on for ever, holding their pools.
    script = """
        import os, signal, _loaders, zctipc
        from torch.utils.data import DataLoader

        if __name__ == "__main__":
            loader = DataLoader(_loaders.Paced(), batch_size=2, num_workers=2,
                                multiprocessing_context=zctipc.get_context("forkserver"))
            it = iter(loader)
            kept = [next(it) for _ in range(4)]  # the workers hold these buffers and make more
            print(*(w.pid for w in it._workers), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """
    # Files, not pipes: workers that live on would hold a pipe open.
    with open(tmp_path / "out", "w+") as out, open(tmp_path / "err", "w+") as err:
        main = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script)], stdout=out, stderr=err, cwd=HERE, env=isolated
        )
        assert main.wait(timeout=120) == -signal.SIGKILL, err.read()
    workers = [int(p) for p in (tmp_path / "out").read_text().split()]
    assert len(workers) == 2, (tmp_path / "err").read_text()
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [p for p in workers if _alive(p)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert alive == []
    shm = isolated["ZCTIPC_SHM_DIR"]
    deadline = time.monotonic() + 20
    while os.listdir(shm) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.listdir(shm) == []


def _alive(pid):
    """Whether pid is a process that has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- forked processes ------------------------------------------------------


def test_a_child_forked_from_a_worker_collates_with_torchs_storages():
    # It cannot call zctipc: _new_shared gives it torch's storage (it raised
    # ForkedProcessError).
    loader = DataLoader(
        _loaders.ForksAChild(), batch_size=2, num_workers=1, multiprocessing_context=zctipc.get_context()
    )
    got = [(data.tolist(), children) for data, children in loader]
    assert [data for data, _ in got] == [[[0.0, 0.0], [1.0, 1.0]], [[2.0, 2.0], [3.0, 3.0]]]
    children = [
        (status, batch) for _, (statuses, batches) in got for status, batch in zip(statuses, batches, strict=True)
    ]
    # default_collate of the pairs that the children returned, each a batch of two.
    assert [status for status, _ in children] == ["ok"] * 4, children


def test_a_fork_loader_of_a_program_that_loaded_zctipc_sends_arrays_tables_and_zctipc_memory():
    out = run(
        """
        import multiprocessing, numpy as np, pyarrow as pa, torch, zctipc
        from torch.utils.data import DataLoader

        class Items(torch.utils.data.Dataset):
            def __init__(self):
                self.tensors = zctipc.empty((8, 2), torch.float32).fill_(1.0)
                self.arrays = zctipc.empty((8, 300_000), "float32")
                self.arrays[:] = 2
            def __len__(self): return 8
            def __getitem__(self, i):
                big = np.full(300_000, i, np.float32)  # over 1 MiB
                return self.tensors[i], self.arrays[i], big, pa.table({"a": [i, i]})

        if __name__ == "__main__":
            fork = multiprocessing.get_context("fork")
            loader = DataLoader(Items(), batch_size=4, num_workers=2, multiprocessing_context=fork, collate_fn=list)
            for batch in loader:
                print([(t.sum().item(), float(a.sum()), float(b[0]), b.nbytes, tb.column("a").to_pylist())
                       for t, a, b, tb in batch])
        """
    )
    assert out.returncode == 0, out.stderr
    lines = [eval(line) for line in out.stdout.split("\n")[:2]]
    assert lines == [[(2.0, 600000.0, float(i), 1200000, [i, i]) for i in range(k, k + 4)] for k in (0, 4)]


# -- torch's _new_shared, called every way ----------------------------------


def test_new_shared_in_a_worker_gives_what_torchs_gives_in_the_pool():
    loader = DataLoader(
        _loaders.NewShared(), batch_size=None, num_workers=1, multiprocessing_context=zctipc.get_context()
    )
    (got,) = list(loader)
    got = {
        name: [tuple(v) for v in values] if name in _loaders.NEW_SHARED_CALLS else tuple(values)
        for name, values in got.items()
    }
    for name in _loaders.NEW_SHARED_CALLS:
        ours, torchs = got[name]
        if torchs[0] == "raised":
            assert ours == torchs, name  # a float size raised InvalidArgument, not TypeError
            continue
        assert ours[:-1] == torchs[:-1], (name, ours, torchs)
        in_pool = ours[2] == "cpu" and ours[1] > 0
        assert ours[-1] == in_pool and not torchs[-1], (name, ours)  # every CPU storage of a byte or more
    assert got["typed"] == ("TypedStorage", 40, "cpu", True, True)
    assert got["legacy"] == ("TypedStorage", 40, "cpu", True, True)


# -- custom collates -------------------------------------------------------


@pytest.mark.parametrize("collate", [_loaders.collate_with_new_shared, _loaders.collate_into_zctipc])
def test_a_custom_collate_into_shared_storage_sends_it_as_it_is(collate):
    loader = DataLoader(
        _loaders.Samples(12),
        batch_size=4,
        num_workers=1,
        collate_fn=collate,
        multiprocessing_context=zctipc.get_context(),
    )
    batches = list(loader)
    assert [indices for _, indices in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    for data, indices in batches:
        assert zctipc.is_shared(data)
        assert torch.equal(data, torch.tensor(indices).float().view(-1, 1, 1).expand(-1, 3, 8))


def test_a_collate_that_writes_a_batch_after_returning_it_is_seen_as_with_torch():
    # The batches are shared with the worker, as torch's are: its later
    # writes show in the main process. (torch's own loader shows them too,
    # unless its queue's feeder thread moves the batch into shared memory
    # while the worker writes: a write can be lost then.)
    loader = DataLoader(
        _loaders.Samples(16),
        batch_size=2,
        num_workers=2,
        collate_fn=_loaders.CollateThenMutate(),
        multiprocessing_context=zctipc.get_context(),
    )
    batches = list(loader)
    assert [indices for _, indices in batches] == [[i, i + 1] for i in range(0, 16, 2)]
    # Each worker wrote every batch it made but its last (the sixth and the seventh).
    written = [[i + 100.0, i + 101.0] for i in range(0, 12, 2)]
    assert [data[:, 0, 0].tolist() for data, _ in batches] == [*written, [12.0, 13.0], [14.0, 15.0]]


# -- every element as torch's own loader gives it --------------------------


def same(a, b, path="batch"):
    """Assert that a and b, batches of two loaders, are equal: types,
    dtypes, shapes, strides and values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert (a.dtype, a.shape, a.stride(), a.requires_grad) == (b.dtype, b.shape, b.stride(), b.requires_grad), path
        assert torch.equal(a, b), path
    elif isinstance(a, np.ndarray):
        assert type(b) is np.ndarray and (a.dtype, a.shape) == (b.dtype, b.shape) and (a == b).all(), path
    elif isinstance(a, dict):
        assert type(a) is type(b) and a.keys() == b.keys(), path
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{k}]")
    else:
        assert type(a) is type(b) and a == b, (path, a, b)


CASES = {
    "shuffle, drop_last": dict(dataset=_loaders.Mixed(), batch_size=4, shuffle=True, drop_last=True),
    "batch_size=None": dict(dataset=_loaders.Mixed(), batch_size=None, shuffle=True),
    "a batch sampler": dict(dataset=_loaders.Mixed(), batch_sampler=_loaders.UnevenBatches()),
    "an iterable dataset in shards": dict(dataset=_loaders.Shards(11), batch_size=3),
    "tensors that require grad": dict(dataset=_loaders.Grad(), batch_size=None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_batch_element_is_what_torchs_forkserver_loader_gives(case):
    def epoch(ctx):
        options = dict(CASES[case])
        if options.get("shuffle"):
            options["generator"] = torch.Generator().manual_seed(7)
        return list(DataLoader(num_workers=2, multiprocessing_context=ctx, **options))

    ours, torchs = epoch(zctipc.get_context()), epoch(multiprocessing.get_context("forkserver"))
    same(ours, torchs)
    assert ours


def test_stacking_tensors_that_require_grad_fails_as_with_torch():
    # torch's collate stacks into the storage _new_shared gives (out=), which
    # autograd refuses, wherever that storage lies.
    items = [torch.ones(3, requires_grad=True) for _ in range(2)]
    with pytest.raises(RuntimeError) as expected:
        torch.stack(items, 0, out=torch.empty(2, 3))
    loader = DataLoader(_loaders.Grad(), batch_size=2, num_workers=1, multiprocessing_context=zctipc.get_context())
    with pytest.raises(RuntimeError, match="Caught RuntimeError in DataLoader worker process 0") as info:
        list(loader)
    assert str(info.value).splitlines()[-1] == f"RuntimeError: {expected.value}"


# -- many epochs -----------------------------------------------------------


def test_persistent_pinned_workers_reuse_their_buffers_for_many_epochs():
    # Without an accelerator torch leaves pinning out, with a warning.
    ctx = zctipc.get_context()
    with pytest.warns(UserWarning, match="pin_memory"):
        loader = DataLoader(
            _loaders.Samples(16),
            batch_size=4,
            num_workers=2,
            persistent_workers=True,
            pin_memory=True,
            multiprocessing_context=ctx,
        )
        epochs = []
        for _ in range(10):
            seen = []
            for data, index, slots, arenas, pid, pooled in loader:
                assert zctipc.is_shared(data) and all(pooled.tolist())
                seen.append((index.tolist(), slots.tolist(), arenas.tolist(), pid.tolist()))
            epochs.append(seen)
            del data, index, slots, arenas, pid, pooled  # the last batch goes back too
    for seen in epochs:
        assert sorted(i for indices, *_ in seen for i in indices) == list(range(16))
    for seen in epochs[1:]:  # the buffers of each epoch came back before the next
        first = {}
        for _, slots, _, pids in seen:
            for s, p in zip(slots, pids, strict=True):
                first.setdefault(p, s)
        assert set(first.values()) == {0}, first
    arenas = [max(a for _, _, arena, _ in seen for a in arena) for seen in epochs]
    assert arenas[1:] == [arenas[1]] * 9, arenas


def test_warnings_are_errors_in_the_main_process_and_the_workers():
    out = run(
        """
        import multiprocessing, zctipc, _loaders
        from torch.utils.data import DataLoader

        if __name__ == "__main__":
            multiprocessing.set_start_method("forkserver")
            loader = DataLoader(_loaders.Arrays(), batch_size=4, num_workers=2, persistent_workers=True,
                                multiprocessing_context=zctipc.get_context())
            for _ in range(2):
                print(sum(arrays[:, 0].sum().item() for arrays, _ in loader))
        """,
        "-W",
        "error",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["120", "120"] and out.stderr == ""


# -- garbage collections ---------------------------------------------------


class _Cycle:
    """A reference cycle whose __del__ uses its zctipc queue, event and
    pool array."""

    def __init__(self, queue, event, array):
        self.me, self.queue, self.event, self.array = self, queue, event, array

    def __del__(self):
        self.event.set()
        self.array[0] = 7
        self.queue.put((np.arange(3), torch.ones(2), self.array))


def test_a_cycle_collected_by_another_thread_can_use_its_zctipc_objects(recwarn):
    got = []
    for _ in range(5):
        queue, event = zctipc.Queue(), zctipc.Event()
        array = zctipc.empty(4, "int64")
        array[:] = 0  # a pool buffer is uninitialized, maybe a used one
        _Cycle(queue, event, array)
        del array
        thread = threading.Thread(target=gc.collect)
        thread.start()
        thread.join()
        arange, ones, array = queue.get(timeout=10)
        got.append((event.is_set(), arange.tolist(), ones.tolist(), array.tolist()))
    assert got == [(True, [0, 1, 2], [1.0, 1.0], [7, 0, 0, 0])] * 5
    assert not [w for w in recwarn if issubclass(w.category, pytest.PytestUnraisableExceptionWarning)]


def test_a_collection_from_a_signal_handler_during_a_blocked_get_of_the_same_queue():
    queue = zctipc.Queue()
    _Cycle(queue, zctipc.Event(), zctipc.empty(4, "int64"))
    previous = signal.signal(signal.SIGALRM, lambda *_: gc.collect())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        arange, ones, array = queue.get(timeout=20)  # the cycle's __del__ puts it, from the handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert (arange.tolist(), ones.tolist(), array.tolist()) == ([0, 1, 2], [1.0, 1.0], [7, 0, 0, 0])


def test_a_collection_started_by_a_finalizer_closes_what_it_collects():
    import weakref

    class Box:
        pass

    for _ in range(5):
        box = Box()
        box.queue, box.event = zctipc.Queue(), zctipc.Event()
        queue = zctipc.Queue()
        _Cycle(queue, zctipc.Event(), zctipc.empty(4, "int64"))
        weakref.finalize(box, gc.collect)
        del box  # its finalizer collects the cycle
        assert queue.get(timeout=10)[2].tolist() == [7, 0, 0, 0]


def test_other_threads_free_their_buffers_while_a_collection_waits_for_them():
    # The cycle's __del__ waits for a thread that allocates and frees pool
    # buffers; the pool holds three. Closed only when the collection ended,
    # the thread's buffers never came back to it.
    out = run(
        """
        import gc, threading, zctipc

        class Waits:
            def __init__(self): self.me = self
            def __del__(self):
                queue, got = zctipc.Queue(), []
                def work():
                    try:
                        for _ in range(20):
                            x = zctipc.empty((1 << 20,), "uint8", timeout=5)
                            del x  # its slot goes back for the next
                        queue.put("done")
                    except Exception as e:
                        queue.put(repr(e))
                threading.Thread(target=work).start()
                print(queue.get(timeout=30))

        if __name__ == "__main__":
            import multiprocessing; multiprocessing.set_start_method("spawn")
            zctipc.set_pool_limit(4 << 20)
            Waits()
            gc.collect()
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done", out.stdout
