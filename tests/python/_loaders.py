"""Datasets and collate functions that DataLoader tests send to worker
processes (importable under spawn and forkserver)."""

import functools
import os
import signal
import time

import numpy as np
import torch
from torch.utils.data import Dataset

import zctipc


class Samples(Dataset):
    """Item i: a (3, 8) float32 tensor of i, i, and what the worker's pool
    held when the item was made (slots in use, arenas), and the worker's pid
    and whether its collate stacks into the pool."""

    def __init__(self, n=64, fail=None):
        self.n = n
        self.fail = fail  # (index, what): "raise", "kill" or "sleep"

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.fail is not None and self.fail[0] == i:
            what = self.fail[1]
            if what == "raise":
                raise ValueError(f"item {i} is bad")
            if what == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if what == "sleep":
                time.sleep(60)
        stats = zctipc.pool_stats()
        pooled = "_new_shared" in vars(torch.UntypedStorage)  # replaced in this worker's class
        return torch.full((3, 8), float(i)), i, stats.slots_in_use, stats.arenas, os.getpid(), pooled


class Arrays(Dataset):
    """Item i: a NumPy array of i and a dict holding a tensor of i."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return np.full(5, i, dtype=np.int64), {"t": torch.full((2,), float(i))}


def stack_by_hand(items):
    """A custom collate: torch.stack without torch's shared-memory storage."""
    return torch.stack([t for t, *_ in items]), [i for _, i, *_ in items]


# For test_dataloader_attacks.py.


def limit_pool(nbytes, worker_id):
    """A worker_init_fn (with functools.partial): the worker's pool may hold
    nbytes of arenas."""
    zctipc.set_pool_limit(nbytes)


class Heavy(Dataset):
    """Item i: a 256 KiB tensor of i (a batch of 4 is 1 MiB), a 1 MiB
    NumPy array of i (a batch of 4 is larger than a small pool's limit), i,
    and the bytes of arenas the worker's pool held then."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((64, 1024), float(i)), np.full(1 << 18, i, np.float32), i, zctipc.pool_stats().reserved


class Paced(Dataset):
    """Item i: a 256 KiB tensor of i and i; items past the first eight take
    0.2 s, so that an epoch is still running when a test kills someone."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i >= 8:
            time.sleep(0.2)
        return torch.full((256, 256), float(i)), i


def _collate_in_a_child(i):
    """torch's default collate of two tensors in a child forked from this
    process: ("ok", the batch as lists) or ("error", what it raised)."""
    import pickle

    from torch.utils.data import default_collate

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            out = ("ok", default_collate([torch.full((2,), float(i)), torch.ones(2)]).tolist())
        except BaseException as e:
            out = ("error", repr(e))
        os.write(w, pickle.dumps(out))
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


class ForksAChild(Dataset):
    """Item i: a tensor of i, and what a child forked from the worker got
    from torch's default collate (_collate_in_a_child)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((2,), float(i)), _collate_in_a_child(i)


def _describe_storage(make):
    """What make() gave: its type, bytes, device, is_shared() and whether it
    is zctipc memory; or the type of what it raised."""
    try:
        s = make()
    except Exception as e:
        return ("raised", type(e).__name__)
    u = s.untyped() if isinstance(s, torch.TypedStorage) else s
    zct = u.device.type == "cpu" and u.nbytes() > 0 and zctipc.is_shared(torch.empty(0, dtype=torch.uint8).set_(u))
    return type(s).__name__, u.nbytes(), str(u.device), u.is_shared(), zct


#: Calls of torch.UntypedStorage._new_shared (and of what calls it) that a
#: worker makes, by name.
NEW_SHARED_CALLS = {
    "cpu": lambda cls: cls._new_shared(10, device="cpu"),
    "torch.device": lambda cls: cls._new_shared(10, device=torch.device("cpu")),
    "cpu:0": lambda cls: cls._new_shared(10, device="cpu:0"),
    "default device": lambda cls: cls._new_shared(10),
    "size 0": lambda cls: cls._new_shared(0),
    "meta": lambda cls: cls._new_shared(10, device="meta"),
    "a float size": lambda cls: cls._new_shared(10.0),
    "device None": lambda cls: cls._new_shared(10, device=None),
    "positional device": lambda cls: cls._new_shared(10, "cpu"),
    "64 MiB": lambda cls: cls._new_shared(64 << 20),
    # Not a negative size or one larger than /dev/shm: torch's own leaves a
    # file in /dev/shm for those.
}


class NewShared(Dataset):
    """One item: for each of NEW_SHARED_CALLS, what zctipc's _new_shared gave
    in this worker and what torch's own gives (_describe_storage), and what
    a typed and a legacy storage's _new_shared gave."""

    def __len__(self):
        return 1

    def __getitem__(self, i):
        from zctipc._wire import batches

        class Torchs:  # torch's own, as the worker had it before zctipc replaced it
            _new_shared = batches._torch_new_shared.__get__(None, torch.UntypedStorage)

        out = {}
        for name, call in NEW_SHARED_CALLS.items():
            out[name] = (
                _describe_storage(functools.partial(call, torch.UntypedStorage)),
                _describe_storage(functools.partial(call, Torchs)),
            )
        out["typed"] = _describe_storage(lambda: torch.ones(1)._typed_storage()._new_shared(10))
        out["legacy"] = _describe_storage(lambda: torch.FloatStorage._new_shared(10))
        return out


def collate_with_new_shared(items):
    """A custom collate that stacks into a storage it asks of _new_shared."""
    data = [t for t, *_ in items]
    storage = torch.UntypedStorage._new_shared(sum(t.nbytes for t in data))
    out = torch.empty(0, dtype=data[0].dtype).set_(storage).view(len(data), *data[0].shape)
    return torch.stack(data, out=out), [i for _, i, *_ in items]


def collate_into_zctipc(items):
    """A custom collate that stacks into zctipc memory (zctipc.empty)."""
    data = [t for t, *_ in items]
    out = zctipc.empty((len(data), *data[0].shape), data[0].dtype)
    return torch.stack(data, out=out), [i for _, i, *_ in items]


class CollateThenMutate:
    """A custom collate that adds 100 to the batch it returned before, when
    it makes the next one (the batches are shared, not copied)."""

    def __init__(self):
        self.last = None

    def __call__(self, items):
        if self.last is not None:
            self.last.add_(100)
        self.last = torch.stack([t for t, *_ in items])
        return self.last, [i for _, i, *_ in items]


class Mixed(Dataset):
    """Item i: a dict of every kind of value a collate meets: tensors of many
    dtypes, non-contiguous, expanded, zero-size and 0-d ones, NumPy arrays
    (one over 1 MiB), NumPy scalars, strings, bytes, ints, floats, tuples
    and lists."""

    def __len__(self):
        return 23

    def __getitem__(self, i):
        base = torch.randn(4, 6, generator=torch.Generator().manual_seed(i))
        return {
            "float": base,
            "transposed": base.t(),
            "strided": base[:, ::2],
            "bfloat16": base.to(torch.bfloat16),
            "complex": torch.complex(base, -base),
            "half": base.half(),
            "bool": base > 0,
            "int8": (base * 10).to(torch.int8),
            "empty": torch.empty(0, 3),
            "empty2": torch.empty(2, 0),
            "0-d": torch.tensor(float(i)),
            "expanded": torch.tensor([1.0, float(i)]).expand(5, 2),
            "array": np.full((3, 2), i, dtype=np.float64),
            "large array": np.full((600, 600), i, dtype=np.float32),
            "empty array": np.zeros((0,), dtype=np.int64),
            "numpy scalar": np.float32(i),
            "str": f"s{i}",
            "bytes": bytes([i]),
            "int": i,
            "float value": i / 3,
            "tuple": (i, torch.arange(i % 3 + 1).sum()),
            "list": [torch.full((2,), i), np.int64(i)],
        }


class Shards(torch.utils.data.IterableDataset):
    """Items (a tensor of i, i) for i below n, each worker the ones of its
    id modulo the number of workers."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield torch.full((3,), float(i)), i


class UnevenBatches(torch.utils.data.Sampler):
    """A batch sampler of batches of several sizes, one of a single item."""

    def __len__(self):
        return 4

    def __iter__(self):
        yield from ([0, 1, 2], [9, 3], [4], [5, 6, 7, 8])


class Grad(Dataset):
    """Item i: a leaf tensor of i that requires grad."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.full((3,), float(i), requires_grad=True)
