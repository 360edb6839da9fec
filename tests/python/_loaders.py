"""Datasets and collate functions that DataLoader tests send to worker
processes (importable under spawn and forkserver)."""

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
