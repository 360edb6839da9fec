"""torch.utils.data.DataLoader with zctipc's context: batches are stacked in
the workers' pools and handed over as descriptors (Note [batches in the
pool] in zctipc._wire.batches), and everything DataLoader promises holds:
each sample once per epoch, errors re-raised, a killed worker reported,
timeouts, and the buffers come back."""

import gc
import multiprocessing
import subprocess
import sys
import textwrap

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


def epoch(loader):
    """The batches of one epoch as plain values, each batch dropped once read."""
    seen = []
    for data, index, slots, arenas, pid, pooled in loader:
        assert zctipc.is_shared(data)  # a view of the worker's pool buffer
        assert torch.equal(data, index.view(-1, 1, 1).float().expand(-1, 3, 8))
        seen.append((index.tolist(), slots.tolist(), arenas.tolist(), pid.tolist(), pooled.tolist()))
    return seen


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_batches_are_stacked_in_the_pool_and_come_back_epoch_after_epoch(method):
    before = library_files()
    loader = DataLoader(
        _loaders.Samples(64),
        batch_size=4,
        num_workers=2,
        shuffle=True,
        persistent_workers=True,
        multiprocessing_context=zctipc.get_context(method),
    )
    epochs = [epoch(loader) for _ in range(4)]
    for seen in epochs:
        assert sorted(i for indices, *_ in seen for i in indices) == list(range(64))  # each sample once
        assert all(all(pooled) for *_, pooled in seen)  # every worker stacks into its pool
        assert len({p for *_, pids, _ in seen for p in pids}) == 2
    # Every batch of an epoch went back to its worker's pool before the next
    # began: the first item each worker makes sees no buffer in use.
    for seen in epochs[1:]:
        first = {}
        for _, slots, _, pids, _ in seen:
            for s, p in zip(slots, pids, strict=True):
                first.setdefault(p, s)
        assert first and set(first.values()) == {0}, first
    # ... and the pool reuses its arenas rather than growing.
    arenas = [max(a for _, _, arena, _, _ in seen for a in arena) for seen in epochs]
    assert arenas[-1] == arenas[1], arenas
    assert "_new_shared" not in vars(torch.UntypedStorage)  # the main process keeps torch's
    del loader
    gc.collect()  # the loader's iterator, which shuts its workers down, is in a reference cycle
    left = wait_until_gone(library_files() - before - own_ledgers())
    assert left == [], [(s.name, s.kind, s.creator_pid) for s in zctipc.list_segments() if s.name in left]


def test_workers_started_for_each_epoch_take_every_sample_once():
    loader = DataLoader(_loaders.Samples(24), batch_size=5, num_workers=2, multiprocessing_context=zctipc.get_context())
    for _ in range(2):
        seen = epoch(loader)
        assert sorted(i for indices, *_ in seen for i in indices) == list(range(24))
        assert [len(indices) for indices, *_ in seen] == [5, 5, 5, 5, 4]


def test_arrays_and_nested_values_are_collated_into_the_pool():
    loader = DataLoader(_loaders.Arrays(), batch_size=4, num_workers=2, multiprocessing_context=zctipc.get_context())
    got = []
    for arrays, nested in loader:
        assert zctipc.is_shared(arrays) and zctipc.is_shared(nested["t"])
        assert torch.equal(arrays, arrays[:, :1].expand(-1, 5))
        assert torch.equal(nested["t"][:, 0].long(), arrays[:, 0])
        got += arrays[:, 0].tolist()
    assert got == list(range(16))


def test_a_custom_collate_function_keeps_working():
    loader = DataLoader(
        _loaders.Samples(12),
        batch_size=3,
        num_workers=2,
        collate_fn=_loaders.stack_by_hand,
        multiprocessing_context=zctipc.get_context(),
    )
    batches = list(loader)
    assert [indices for _, indices in batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    for data, indices in batches:
        assert torch.equal(data[:, 0, 0], torch.tensor(indices, dtype=torch.float32))
        assert zctipc.is_shared(data)  # moved into the pool when it was sent


# The iterator, held by the exception's traceback, is collected as a cycle,
# and its __del__ tells the workers to stop through zctipc's Event and queues
# (Note [closing after a collection] in zctipc._core.native).
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_an_error_in_a_worker_is_raised_in_the_main_process_with_its_traceback():
    ctx = zctipc.get_context()
    data = _loaders.Samples(16, fail=(6, "raise"))
    loader = DataLoader(data, batch_size=2, num_workers=2, multiprocessing_context=ctx)
    with pytest.raises(ValueError, match="item 6 is bad") as info:
        list(loader)
    assert "Caught ValueError in DataLoader worker process" in str(info.value)


def test_a_killed_worker_is_reported():
    ctx = zctipc.get_context()
    data = _loaders.Samples(16, fail=(5, "kill"))
    loader = DataLoader(data, batch_size=2, num_workers=2, multiprocessing_context=ctx)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"):
        list(loader)


def test_a_stuck_worker_times_out():
    loader = DataLoader(
        _loaders.Samples(8, fail=(0, "sleep")),
        batch_size=2,
        num_workers=1,
        timeout=2,
        multiprocessing_context=zctipc.get_context(),
    )
    with pytest.raises(RuntimeError, match="DataLoader timed out after 2 seconds"):
        list(loader)


def run(text):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(text)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE,
        env={**__import__("os").environ, "PYTHONPATH": with_pythonpath(HERE)},
    )


def test_a_plain_loader_of_a_program_that_loaded_zctipc_says_why_it_cannot_pickle_a_local_dataset():
    out = run(
        """
        import torch, zctipc
        from torch.utils.data import DataLoader

        def main():
            zctipc.empty(1)  # loads the library: forkserver becomes the default
            class Local(torch.utils.data.Dataset):
                def __len__(self): return 2
                def __getitem__(self, i): return torch.zeros(1)
            list(DataLoader(Local(), num_workers=1))

        if __name__ == "__main__":
            main()
        """
    )
    assert out.returncode != 0
    assert "Can't pickle local object" in out.stderr, out.stderr
    assert "zctipc made 'forkserver' this program's default start method" in out.stderr, out.stderr
    assert "multiprocessing_context=multiprocessing.get_context('fork')" in out.stderr


def test_a_loader_given_fork_in_a_program_that_loaded_zctipc_works_as_without_zctipc():
    # The forked workers cannot call zctipc: their tensors, arrays and labels
    # go torch's way (Note [reducing in a forked child]).
    out = run(
        """
        import multiprocessing, numpy as np, torch, zctipc
        from torch.utils.data import DataLoader

        class Items(torch.utils.data.Dataset):
            def __init__(self): self.shared = zctipc.empty((8, 2), torch.float32).fill_(1.0)
            def __len__(self): return 8
            def __getitem__(self, i): return torch.full((3,), float(i)), i, np.ones(2), self.shared[i]

        if __name__ == "__main__":
            fork = multiprocessing.get_context("fork")
            for t, i, a, s in DataLoader(Items(), batch_size=4, num_workers=2, multiprocessing_context=fork):
                print(t[:, 0].tolist(), i.tolist(), a.sum().item(), s.sum().item())
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == [
        "[0.0, 1.0, 2.0, 3.0] [0, 1, 2, 3] 8.0 8.0",
        "[4.0, 5.0, 6.0, 7.0] [4, 5, 6, 7] 8.0 8.0",
    ]


def test_a_plain_forkserver_loader_keeps_torch_storages():
    # Workers of multiprocessing's own contexts are not zctipc's: torch's collate is untouched.
    ctx = multiprocessing.get_context("forkserver")
    loader = DataLoader(_loaders.Samples(8), batch_size=4, num_workers=1, multiprocessing_context=ctx)
    for *_, pooled in loader:
        assert not any(pooled.tolist())


class _Cycle:
    def __init__(self):
        self.me, self.event, self.queue = self, zctipc.Event(), zctipc.Queue()
        self.done = []

    def __del__(self):
        self.event.set()
        self.queue.put(np.arange(3))
        self.done.append((self.event.is_set(), self.queue.get(timeout=10).tolist()))


def test_a_del_method_of_a_cycle_can_use_the_zctipc_objects_of_its_cycle(recwarn):
    c = _Cycle()
    done = c.done
    del c
    gc.collect()
    assert done == [(True, [0, 1, 2])]
    assert not [w for w in recwarn if issubclass(w.category, pytest.PytestUnraisableExceptionWarning)]


def test_pin_memory_keeps_working():
    # Without an accelerator torch leaves pinning out, with a warning; on a
    # GPU, test_cuda.py checks the batches are pinned.
    ctx = zctipc.get_context()
    with pytest.warns(UserWarning, match="pin_memory"):
        loader = DataLoader(
            _loaders.Samples(16), batch_size=4, num_workers=2, pin_memory=True, multiprocessing_context=ctx
        )
        seen = [i for _, index, *_ in loader for i in index.tolist()]
    assert seen == list(range(16))
