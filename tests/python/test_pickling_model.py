"""A model of descriptors through pickling: every kind of torch tensor that
zctipc's picklers take (dense, a typed storage, sparse COO and CSR, views,
a tensor in torch's share_memory_(), zctipc memory, and a NumPy array the
pool copies) goes through a zctipc.Queue and through multiprocessing's
Pipe (ForkingPickler) in sequences of sends, receives and drops that
hypothesis draws. Each channel is a FIFO, so the model knows what every
receive must equal; and once everything is dropped, the pool's buffers in
use are what they were before: no count is lost, none is kept."""

import gc
import multiprocessing
import warnings
from collections import deque

import numpy as np
import pytest
import torch
from conftest import slots_in_use

import zctipc

hypothesis = pytest.importorskip("hypothesis", reason="make test installs hypothesis (constraints.txt)")
from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule  # noqa: E402


def _typed_storage():
    with warnings.catch_warnings():  # TypedStorage is deprecated, and still sent
        warnings.simplefilter("ignore", UserWarning)
        return torch.arange(6, dtype=torch.float64).storage()


def _shared():
    return torch.arange(12, dtype=torch.int16).reshape(3, 4).share_memory_()


def _zctipc():
    t = zctipc.empty((5,), torch.float32)
    t.copy_(torch.linspace(-1, 1, 5))
    return t


#: How to make one of each kind (a fresh object each call).
KINDS = {
    "dense": lambda: torch.arange(10, dtype=torch.float32) * 1.5,
    "empty": lambda: torch.empty(0, 3),
    "typed storage": _typed_storage,
    "sparse coo": lambda: torch.tensor([[0.0, 2.0, 0.0], [3.0, 0.0, 4.0]]).to_sparse(),
    "sparse csr": lambda: torch.tensor([[0.0, 2.0, 0.0], [3.0, 0.0, 4.0]]).to_sparse_csr(),
    "slice": lambda: torch.arange(20, dtype=torch.int64)[3:11],
    "transposed": lambda: torch.arange(12.0).reshape(3, 4).t(),
    "share_memory_": _shared,
    "zctipc memory": _zctipc,
    "numpy 1 MiB": lambda: np.arange(1 << 18, dtype=np.float32),  # copied once into the pool
}


def snapshot(obj):
    """What obj holds, as a value of its own (no memory shared with obj)."""
    if isinstance(obj, np.ndarray):
        return ("ndarray", obj.dtype, obj.copy())
    if isinstance(obj, torch.storage.TypedStorage):
        return ("typed", obj.dtype, torch.tensor(obj.tolist(), dtype=obj.dtype))
    if obj.layout != torch.strided:
        return (str(obj.layout), obj.dtype, obj.to_dense().clone())
    return ("tensor", obj.dtype, obj.clone())


def same(got, expected):
    kind, dtype, value = snapshot(got)
    return (
        kind == expected[0]
        and dtype == expected[1]
        and value.shape == expected[2].shape
        and bool((value == expected[2]).all())
    )


class Descriptors(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.queue = zctipc.Queue()
        self.here, self.there = multiprocessing.Pipe()
        self.channels = {"queue": deque(), "pipe": deque()}  # what each holds, oldest first (the model)
        self.originals = []  # (object, its snapshot)
        self.received = []
        self.start = None

    @initialize()
    def record_the_pool(self):
        gc.collect()
        self.start = slots_in_use()

    @rule(kind=st.sampled_from(sorted(KINDS)))
    def make(self, kind):
        obj = KINDS[kind]()
        self.originals.append((obj, snapshot(obj)))

    @precondition(lambda self: self.originals)
    @rule(i=st.integers(min_value=0), channel=st.sampled_from(["queue", "pipe"]))
    def send(self, i, channel):
        obj, expected = self.originals[i % len(self.originals)]
        if channel == "queue":
            self.queue.put(obj)
        else:
            self.here.send(obj)
        self.channels[channel].append(expected)

    @precondition(lambda self: self.channels["queue"] or self.channels["pipe"])
    @rule(channel=st.sampled_from(["queue", "pipe"]))
    def receive(self, channel):
        if not self.channels[channel]:
            channel = "pipe" if channel == "queue" else "queue"
        expected = self.channels[channel].popleft()
        got = self.queue.get(timeout=30) if channel == "queue" else self.there.recv()
        assert same(got, expected), f"{channel} delivered {got!r}, not what was sent ({expected[2]!r})"
        self.received.append(got)

    @precondition(lambda self: self.originals)
    @rule(i=st.integers(min_value=0))
    def drop_original(self, i):
        del self.originals[i % len(self.originals)]

    @precondition(lambda self: self.received)
    @rule(i=st.integers(min_value=0))
    def drop_received(self, i):
        del self.received[i % len(self.received)]

    @invariant()
    def originals_keep_their_values(self):
        for obj, expected in self.originals:
            assert same(obj, expected), "sending changed what was sent"

    def teardown(self):
        try:
            for channel in ("queue", "pipe"):
                while self.channels[channel]:
                    self.receive(channel)
            self.originals.clear()
            self.received.clear()
            gc.collect()
            if self.start is not None:
                assert zctipc.pool_stats().slots_in_use == self.start, "a count was lost or kept"
        finally:
            self.queue.close()
            self.here.close()
            self.there.close()


Descriptors.TestCase.settings = settings(max_examples=30, stateful_step_count=25, deadline=None, database=None)
TestDescriptors = pytest.mark.slow(Descriptors.TestCase)
