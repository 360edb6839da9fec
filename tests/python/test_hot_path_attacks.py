"""Attacks on the Python hot paths: wait.retry's plain loops (the time it
hands each native wait, timeouts at their edges, signals and closes while
it polls, a policy switched under a waiter), the queue pickler's bound
reducers (an attribute of each channel: nested puts, reduces that raise,
threads), and received arrays built from their views' bytes (every dtype
and layout by descriptor and by copy, get and get_many, torch tensors,
lifetimes, a pickle's buffer indices that name no view of its message,
many buffers and mixed records in one get_many)."""

import gc
import math
import os
import pickle
import queue
import signal
import threading
import time
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
from _procs import closed_while_blocked
from conftest import SHM, slots_in_use

import zctipc
from zctipc._core import native, wait
from zctipc._wire import pickler, reductions

HANG = 30  # seconds that only a hang takes


@pytest.fixture
def q():
    q = zctipc.Queue(max_bytes=1 << 22)
    yield q
    q.close()


# -- wait.retry, against a clock of its own ---------------------------------------------------


class Clock:
    """time.monotonic for wait, which moves only as the fake calls wait."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(wait, "time", c)
    return c


AGAIN = native.E_EMPTY


def waiting(clock, statuses=None):
    """A native call that waits out each ms it is given (on the clock) and
    returns AGAIN, or the next of statuses; it records each ms."""
    asked = []
    it = iter(statuses or ())

    def call(ms):
        asked.append(ms)
        clock.now += ms / 1000
        return next(it, AGAIN)

    return call, asked


def test_retry_not_blocking_looks_once_without_waiting(clock):
    call, asked = waiting(clock)
    assert wait.retry(call, AGAIN, False, 5.0) == AGAIN
    assert asked == [0]
    call, asked = waiting(clock, [0])
    assert wait.retry(call, AGAIN, False, None) == 0
    assert asked == [0]
    # A look that a signal ended says nothing yet, as a blocking one's
    # last look would: the caller raises Empty or Full, not InterruptedError.
    call, asked = waiting(clock, [native.E_INTERRUPTED])
    assert wait.retry(call, AGAIN, False, None) == AGAIN
    assert asked == [0]


@pytest.mark.parametrize("timeout", [0, 0.0, 1e-9, 0.001, 0.0499, 0.05, 0.0501, 0.12, 0.3333])
def test_retry_slices_end_at_the_deadline_with_one_last_look(clock, timeout):
    """Every slice is at most WAIT_SLICE and none is 0 before the
    deadline (a wait of a nanosecond still waits a ms), the slices cover
    the timeout and no more than the one that reaches it, and a last look
    (0 ms) follows them."""
    call, asked = waiting(clock)
    start = clock.now
    assert wait.retry(call, AGAIN, True, timeout) == AGAIN
    assert asked[-1] == 0
    slices = asked[:-1]
    assert all(0 < ms <= wait.WAIT_SLICE * 1000 for ms in slices)
    assert clock.now - start >= timeout - 1e-9
    assert sum(slices[:-1]) < timeout * 1000 + 1e-6, "no slice after the one that reached the deadline"
    if timeout == 0:
        assert asked == [0]
    if 0 < timeout <= 0.001:
        assert asked == [1, 0]


@pytest.mark.parametrize("timeout", [None, math.inf, 1e9, 1e300])
def test_retry_without_an_end_waits_in_slices_until_the_status_changes(clock, timeout):
    call, asked = waiting(clock, [AGAIN] * 200 + [native.E_INTERRUPTED] * 5 + [AGAIN, 7])
    assert wait.retry(call, AGAIN, True, timeout) == 7
    assert asked == [int(wait.WAIT_SLICE * 1000)] * 207


def test_retry_goes_on_after_a_signal_and_returns_again_at_the_deadline(clock):
    """A signal ends a slice at once (E_INTERRUPTED, no time passed): the
    wait goes on to its deadline, and a signal at its last look is again."""
    statuses = [native.E_INTERRUPTED] * 1000

    def call(ms):
        asked.append(ms)
        clock.now += 0.001  # each signal comes 1 ms into its slice
        return statuses.pop()

    asked = []
    start = clock.now
    assert wait.retry(call, AGAIN, True, 0.01) == AGAIN
    assert asked[-1] == 0 and all(ms > 0 for ms in asked[:-1])
    assert 0.01 - 1e-9 <= clock.now - start <= 0.0125


def test_retry_returns_the_first_status_that_is_not_again(clock):
    for status in (0, native.E_CLOSED, native.E_FULL, 12345):
        call, asked = waiting(clock, [AGAIN, AGAIN, status])
        assert wait.retry(call, AGAIN, True, 10.0) == status
        assert asked == [50, 50, 50]


@pytest.mark.parametrize(
    ("timeout", "error"),
    [(-1, ValueError), (-1e-12, ValueError), (math.nan, ValueError), (-math.inf, ValueError), ("1", TypeError)],
)
def test_retry_refuses_a_timeout_that_is_no_number_of_seconds_before_any_call(clock, timeout, error):
    call, asked = waiting(clock)
    with pytest.raises(error):
        wait.retry(call, AGAIN, True, timeout)
    assert asked == []


def test_an_exception_raised_in_a_slice_leaves_nothing_behind(clock):
    """A signal handler that raises (Ctrl-C) between two slices: the
    exception goes out of retry as it was, and the next retry starts
    afresh (a generator would have kept its deadline)."""
    raised = []

    def call(ms):
        clock.now += ms / 1000
        if len(raised) < 3:
            raised.append(ms)
            raise KeyboardInterrupt
        return AGAIN

    for _ in range(3):
        with pytest.raises(KeyboardInterrupt):
            wait.retry(call, AGAIN, True, 0.2)
    call2, asked = waiting(clock)
    start = clock.now
    assert wait.retry(call2, AGAIN, True, 0.1) == AGAIN
    assert asked[:2] == [50, 50] and asked[-1] == 0 and sum(asked) <= 101
    assert clock.now - start >= 0.1 - 1e-9


# -- waits through queues that poll (wait.retry) ----------------------------------------------


@pytest.fixture
def pq():
    q = zctipc.Queue(1, wait="poll")
    yield q
    q.close()


@pytest.mark.parametrize("timeout", [0, 1e-9, 0.2])
def test_a_polling_get_and_put_give_up_no_earlier_than_their_timeout(pq, timeout):
    start = time.monotonic()
    with pytest.raises(queue.Empty):
        pq.get(timeout=timeout)
    assert time.monotonic() - start >= timeout
    pq.put(0)
    start = time.monotonic()
    with pytest.raises(queue.Full):
        pq.put(1, timeout=timeout)
    assert time.monotonic() - start >= timeout
    with pytest.raises(queue.Full):
        pq.put(1, block=False)
    assert pq.get(block=False) == 0
    with pytest.raises(queue.Empty):
        pq.get(block=False)


@pytest.mark.parametrize("timeout", [math.nan, -1, -1e-9])
def test_a_polling_queue_refuses_a_bad_timeout_as_queue_queue_does(pq, timeout):
    with pytest.raises(ValueError):
        pq.get(timeout=timeout)
    pq.put(0)
    with pytest.raises(ValueError):
        pq.put(1, timeout=timeout)
    assert pq.get(timeout=0) == 0, "nothing was taken or put by the refused calls"


@pytest.mark.parametrize("timeout", [None, math.inf, 1e9])
def test_a_polling_get_without_an_end_takes_a_late_put(pq, timeout):
    threading.Timer(0.15, pq.put, ("late",)).start()
    assert pq.get(timeout=timeout) == "late"
    pq.put("first")
    threading.Timer(0.15, pq.get).start()
    pq.put("second", timeout=timeout)
    assert pq.get(timeout=HANG) == "second"


@pytest.mark.parametrize("call", ["get", "put", "get_many"])
@pytest.mark.parametrize("policy", ["poll", "sleep"])
def test_a_close_wakes_many_polling_waiters_with_a_closed_error(call, policy):
    q = zctipc.Queue(1, wait=policy)
    if call == "put":
        q.put(0)
    run = {"get": q.get, "put": lambda: q.put(1), "get_many": lambda: q.get_many(4)}[call]
    outcome, alive = closed_while_blocked(run, q.close, 16, HANG, asleep=0.2)
    assert not alive
    assert outcome == ["closed"] * 16, outcome


@pytest.mark.parametrize("first", ["poll", "sleep"])
def test_a_policy_switched_under_waiting_threads_loses_no_message(first):
    """Threads wait in get while the policy goes back and forth between
    poll (wait.retry) and sleep (outside the library): each message put is
    taken once."""
    q = zctipc.Queue(wait=first)
    got, n = [], 8
    threads = [threading.Thread(target=lambda: got.append(q.get(timeout=HANG)), daemon=True) for _ in range(n)]
    try:
        for t in threads:
            t.start()
        for i in range(n):
            time.sleep(0.02)
            q.set_wait("sleep" if (i % 2) == (first == "poll") else "poll")
            q.put(i)
        for t in threads:
            t.join(HANG)
        assert sorted(got) == list(range(n))
    finally:
        q.close()


def test_a_signal_handler_that_raises_ends_a_polling_get_and_the_queue_goes_on(pq):
    """SIGALRM's handler raises while the main thread polls in get (no
    timeout): the exception comes out of get, nothing was taken, and the
    queue's next put and get work; so too for a blocked put."""

    class Alarm(Exception):
        pass

    def raise_alarm(signum, frame):
        raise Alarm

    old = signal.signal(signal.SIGALRM, raise_alarm)
    try:
        for _ in range(3):
            signal.setitimer(signal.ITIMER_REAL, 0.12)
            with pytest.raises(Alarm):
                pq.get()
        pq.put("a")
        signal.setitimer(signal.ITIMER_REAL, 0.12)
        with pytest.raises(Alarm):
            pq.put("b")
        assert pq.get(timeout=0) == "a"
        with pytest.raises(queue.Empty):
            pq.get(timeout=0.05)
        threading.Timer(0.1, pq.put, ("c",)).start()
        assert pq.get(timeout=HANG) == "c"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- the pickler's bound reducers -------------------------------------------------------------


class Nested:
    """Puts into a queue while it is pickled for another put."""

    def __init__(self, target, payload):
        self.target, self.payload = target, payload

    def __reduce__(self):
        self.target.put({"inner": self.payload})
        return dict, ([("outer", True)],)


class Boom:
    def __reduce__(self):
        raise RuntimeError("boom")


def test_a_put_from_inside_a_reduce_into_another_queue_and_the_same_one(q):
    other = zctipc.Queue(max_bytes=1 << 22)
    try:
        before = slots_in_use()
        big = np.arange(100_000, dtype=np.float64)
        z = zctipc.empty(100_000, np.float64)
        z[:] = 3
        q.put([big, Nested(other, big * 2), z])
        outer, inner = q.get(timeout=HANG), other.get(timeout=HANG)
        assert np.array_equal(outer[0], big) and outer[1] == {"outer": True}
        assert np.array_equal(outer[2], z) and np.array_equal(inner["inner"], big * 2)
        outer[2][0] = 9
        assert z[0] == 9, "the zctipc array went as itself"
        q.put([big, Nested(q, big * 3), z])
        first, second = q.get(timeout=HANG), q.get(timeout=HANG)
        # The nested put went in while the outer one was being pickled.
        assert np.array_equal(first["inner"], big * 3)
        assert np.array_equal(second[0], big) and second[1] == {"outer": True} and second[2] is not z
        assert np.array_equal(second[2], z)
        del outer, inner, first, second, z
        assert slots_in_use() == before, "every count went back"
    finally:
        other.close()


def test_a_reduce_that_raises_midway_leaves_no_stale_buffer_for_the_next_put(q):
    z = zctipc.empty(1000, np.float32)
    z[:] = 5
    before = slots_in_use()
    big = np.ones(50_000)
    for _ in range(5):
        with pytest.raises(RuntimeError, match="boom"):
            q.put([big, z, Boom()])
        with pytest.raises(RuntimeError, match="boom"):
            q.put_many([1, [big, z, Boom()]])
        assert q.get(timeout=HANG) == 1
    assert slots_in_use() == before, "the failed puts kept no count"
    q.put([np.arange(3.0)])
    got = q.get(timeout=HANG)
    assert len(got) == 1 and np.array_equal(got[0], np.arange(3.0))
    q.put(z)
    assert np.array_equal(q.get(timeout=HANG), z)
    with pytest.raises(queue.Empty):
        q.get(timeout=0)
    del got
    assert slots_in_use() == before


def test_threads_put_through_their_picklers_while_others_pickle_zctipc_arrays(q):
    """Threads put messages with arrays by descriptor and by copy into one
    queue while another pickles zctipc arrays with ForkingPickler and plain
    pickle: every message arrives whole and each array is its own."""
    n, per = 4, 40
    errors = []
    stop = threading.Event()
    z = zctipc.empty(4096, np.int64)
    z[:] = 11

    def producer(k):
        try:
            for i in range(per):
                a = zctipc.empty(256, np.int64)
                a[:] = k * 1000 + i
                q.put((k, i, a, np.full(20_000, k * 1000 + i, np.int64), z[k : k + 8]), timeout=HANG)
        except BaseException as e:
            errors.append(e)

    def other_pickles():
        try:
            while not stop.is_set():
                for data in (bytes(ForkingPickler.dumps(z[:100])), pickle.dumps(z[:100])):
                    assert np.array_equal(pickle.loads(data), z[:100])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(n)]
    side = threading.Thread(target=other_pickles)
    side.start()
    for t in threads:
        t.start()
    seen = set()
    try:
        while len(seen) < n * per:
            for k, i, a, b, c in q.get_many(7, timeout=HANG):
                assert (a == k * 1000 + i).all() and (b == k * 1000 + i).all() and (c == 11).all()
                seen.add((k, i))
    finally:
        stop.set()
        for t in threads:
            t.join(HANG)
        side.join(HANG)
    assert not errors, errors
    assert len(seen) == n * per


class Whole(reductions.Channel):
    """A channel that takes float32 arrays whole (as Ray's transport takes tensors)."""

    def whole(self, obj):
        if isinstance(obj, np.ndarray) and obj.dtype == np.float32:
            return str, ("whole",)
        return None


def test_each_channel_keeps_its_own_bound_reducers():
    """bound() keeps a channel's table on the channel itself: never on the
    class, never another channel's, made again when asked for a channel of
    another subclass, and the same table for the same channel."""
    a, b, w = pickler.QueuePickler(), pickler.QueuePickler(), Whole()
    ta, tb, tw = reductions.bound(a), reductions.bound(b), reductions.bound(w)
    assert reductions.Channel._bound is None and pickler.QueuePickler._bound is None and Whole._bound is None
    assert ta is reductions.bound(a) and ta is not tb and tw is not ta
    assert ta[np.ndarray].args[0] is a and tb[np.ndarray].args[0] is b
    assert tw[np.ndarray](np.zeros(2, np.float32)) == (str, ("whole",))
    assert all(getattr(r, reductions.MARK) for r in tw.values())
    w._bound = None  # a table dropped is made again
    assert reductions.bound(w) is not tw


# -- arrays built from their views' bytes ------------------------------------------------------

DTYPES = [
    "bool",
    "i1",
    "i2",
    "i4",
    "i8",
    "u1",
    "u2",
    "u4",
    "u8",
    "f2",
    "f4",
    "f8",
    "c8",
    "c16",
    ">f4",
    ">i8",
    ">c16",
    "M8[ns]",
    "m8[s]",
    "V4",
    "S3",
    "U2",
    [("a", "<i4"), ("b", "<f8")],
]


def _values(dt, n):
    raw = (np.arange(n * dt.itemsize) % 251).astype(np.uint8)
    arr = raw.view(dt) if dt.kind != "b" else (np.arange(n) % 3 == 0)
    return arr


@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("how", ["get", "get_many", "in a tuple"])
@pytest.mark.parametrize("where", ["zctipc", "small copy", "large copy"])
def test_arrays_of_every_dtype_come_back_as_they_went(q, dt, how, where):
    dt = np.dtype(dt)
    n = {"zctipc": 64, "small copy": 5, "large copy": 50_000}[where]
    sent = _values(dt, n)
    if where == "zctipc":
        try:
            z = zctipc.empty(n, dt)
        except zctipc.UnsupportedDtype:
            z = zctipc.empty(n * dt.itemsize, np.uint8).view(dt) if dt.kind != "b" else zctipc.empty(n, np.bool_)
        z[...] = sent
        sent = z
    q.put((sent,) if how == "in a tuple" else sent)
    got = q.get_many(3)[0] if how == "get_many" else q.get(timeout=HANG)
    if how == "in a tuple":
        got = got[0]
    assert type(got) is np.ndarray and got.dtype == sent.dtype and got.shape == sent.shape
    assert got.tobytes() == sent.tobytes()
    assert got.flags.writeable
    if where == "zctipc" and dt.kind in "biufc" and dt.isnative:
        # zctipc memory of a dtype a descriptor holds goes as itself
        got.view(np.uint8)[0] ^= 1
        assert sent.view(np.uint8)[0] == got.view(np.uint8)[0]


LAYOUTS = {
    "reversed": lambda a: a[::-1],
    "reversed 2-D": lambda a: a.reshape(8, 8)[::-1, ::2],
    "0-d": lambda a: a[3:4].reshape(()),
    "empty with strides": lambda a: a.reshape(8, 8)[:, :0],
    "empty at the end": lambda a: a[64:],
    "broadcast": lambda a: np.broadcast_to(a[:1], (10,)),
    "one element, long stride": lambda a: a[::40][:1],
    "stride 2": lambda a: a[::2],
    "stride 2, 1 element": lambda a: a[5:7:2],
    "3-D": lambda a: a.reshape(2, 4, 8),
    "the last element": lambda a: a[63:],
    "32 dimensions": lambda a: a[:1].reshape((1,) * 32),
    "unaligned bytes": lambda a: a.view(np.uint8)[1:9],
    "unaligned float": lambda a: a.view(np.uint8)[1:33].view(np.float32),
}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("readonly", [False, True])
@pytest.mark.parametrize("how", ["get", "get_many"])
def test_zctipc_arrays_of_every_layout_come_back_as_they_went(q, layout, readonly, how):
    before = slots_in_use()
    base = zctipc.empty(64, np.float32)
    base[:] = np.arange(64)
    sent = layout(base)
    if readonly:
        sent.flags.writeable = False
    q.put(sent)
    got = q.get_many(2)[0] if how == "get_many" else q.get(timeout=HANG)
    assert (got.shape, got.dtype) == (sent.shape, sent.dtype)
    assert np.array_equal(got, sent)
    assert got.flags.writeable == sent.flags.writeable
    del got, sent, base
    assert slots_in_use() == before


def test_a_received_array_keeps_its_memory_after_the_queue_and_the_sender_went():
    """A received array (1-D: np.frombuffer; 2-D: np.ndarray) holds its
    segment while it lives, and lets it go when it dies."""
    st = zctipc.create_shared_tensor(shape=(1000,), dtype="float32")
    name = st.name
    a = st.numpy()
    a[:] = np.arange(1000)
    q = zctipc.Queue(max_bytes=1 << 20)
    q.put(a[10:20])
    q.put(a.reshape(10, 100)[:, 3:5])
    q.put(a)
    one, two = q.get(timeout=HANG), q.get(timeout=HANG)
    (whole,) = q.get_many(3)
    del a, st
    q.close()
    del q
    gc.collect()
    assert os.path.exists(os.path.join(SHM, name))
    assert np.array_equal(one, np.arange(10, 20)) and np.array_equal(whole, np.arange(1000))
    assert np.array_equal(two, np.arange(1000).reshape(10, 100)[:, 3:5])
    whole[0] = -1
    del whole, one
    gc.collect()
    assert os.path.exists(os.path.join(SHM, name)), "two still holds it"
    assert two[0, 0] == 3
    del two
    gc.collect()
    assert not os.path.exists(os.path.join(SHM, name))


TORCH_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]

TENSOR_LAYOUTS = {
    "whole": lambda t: t,
    "small": lambda t: t[:5].clone(),
    "non-contiguous": lambda t: t.reshape(10, 100)[:, ::3],
    "transposed": lambda t: t.reshape(10, 100).t(),
    "a view into a larger storage": lambda t: t[100:200],
    "0-d": lambda t: t[7],
    "empty": lambda t: t[:0],
    "empty, offset": lambda t: t[500:500],
}


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("layout", TENSOR_LAYOUTS.values(), ids=TENSOR_LAYOUTS.keys())
@pytest.mark.parametrize("how", ["get", "get_many"])
def test_torch_tensors_of_every_dtype_and_layout_come_back_as_they_went(q, dtype, layout, how):
    t = layout((torch.arange(1000) % 7).to(dtype))
    q.put(t)
    got = q.get_many(3)[0] if how == "get_many" else q.get(timeout=HANG)
    assert type(got) is torch.Tensor and got.dtype == t.dtype and got.shape == t.shape
    assert torch.equal(got, t)


def test_tensors_that_share_a_storage_and_require_grad(q):
    w = torch.ones(1000, requires_grad=True)
    s = torch.arange(100.0)
    for how in ("get", "get_many"):
        q.put((w, s[10:20], s[50:], s))
        got = q.get_many(2)[0] if how == "get_many" else q.get(timeout=HANG)
        gw, a, b, whole = got
        assert gw.requires_grad and torch.equal(gw.detach(), w.detach())
        assert torch.equal(a, s[10:20]) and torch.equal(b, s[50:])
        a[0] = -1
        assert whole[10] == -1, "views of one storage arrive over one storage"


# -- a pickle's buffer indices ------------------------------------------------------------------


class Index:
    """Pickles as the receiver's buffer of the given index."""

    def __init__(self, index):
        self.index = index

    def __reduce__(self):
        return pickler._rebuild, (self.index,)


@pytest.mark.parametrize("index", [-1, -2, 2, 1 << 40])
@pytest.mark.parametrize("how", ["get", "get_many"])
def test_a_pickle_that_names_a_buffer_out_of_its_message_is_refused(q, index, how):
    """A buffer index is read as the view at at + index * VIEW_SIZE of
    the views' bytes, which also hold the messages before it (get_many)
    or a get's earlier views: an index below 0 or past the message's
    views would build an array over another message's memory, which its
    own array already holds, and release that count a second time. It is
    refused (CorruptHeader); the other messages and every count are
    untouched."""
    z = zctipc.empty(1000, np.float64)
    z[:] = 1
    b = zctipc.empty(1000, np.float64)
    b[:] = 2
    many = [zctipc.empty(8, np.int8) for _ in range(20)]  # a get's views past the first
    q.put(many)
    del many
    assert len(q.get(timeout=HANG)) == 20
    before = slots_in_use()
    q.put(z)
    q.put([Index(index), b])
    q.put("after")
    del z, b
    if how == "get":
        first = q.get(timeout=HANG)
        with pytest.raises(zctipc.CorruptHeader, match="buffer"):
            q.get(timeout=HANG)
        assert q.get(timeout=HANG) == "after"
    else:
        first, *rest = q.get_many(3)
        assert rest == []
        with pytest.raises(zctipc.CorruptHeader, match="buffer"):
            q.get_many(3)
        assert q.get_many(3) == ["after"]
    assert (first == 1).all()
    assert slots_in_use() == before - 1, "the refused message's count went back, first's stays"
    again = zctipc.empty(1000, np.float64)  # would take first's memory, were its count gone
    again[:] = 9
    assert (first == 1).all()
    del first, again
    assert slots_in_use() == before - 2


# -- many buffers, mixed records --------------------------------------------------------------


def test_a_pickle_of_many_buffers_and_mixed_records_in_one_get_many(q):
    """Messages with 0 to 300 buffers (past a get's views room), inline
    arrays, plain pickles, bare arrays, tensors and SharedTensors, taken by
    get_many in runs: each comes back in order and whole, and every count
    goes back."""
    before = slots_in_use()
    st = zctipc.create_shared_tensor(shape=(16,), dtype="int32")
    st.numpy()[:] = 4
    msgs = []
    for i in range(30):
        k = i % 6
        if k == 0:
            msgs.append([zctipc.empty(4, np.int16) for _ in range(i * 10)])
            for j, a in enumerate(msgs[-1]):
                a[:] = j
        elif k == 1:
            msgs.append(np.arange(i, dtype=np.int8))  # inline
        elif k == 2:
            msgs.append(("plain", i))
        elif k == 3:
            z = zctipc.empty(i + 1, np.float32)
            z[:] = i
            msgs.append(z)  # a tensor record
        elif k == 4:
            msgs.append({"t": torch.full((i,), float(i)), "s": st, "n": np.full(30_000, i)})
        else:
            msgs.append(b"raw bytes %d" % i)
    for m in msgs:
        q.put(m)
    got = []
    while len(got) < len(msgs):
        got += q.get_many(4, timeout=HANG)
    for i, (m, g) in enumerate(zip(msgs, got, strict=True)):
        k = i % 6
        if k == 0:
            assert len(g) == len(m) and all((x == j).all() for j, x in enumerate(g))
        elif k in (1, 3):
            assert np.array_equal(g, m) and g.dtype == m.dtype
        elif k == 4:
            assert torch.equal(g["t"], m["t"]) and np.array_equal(g["n"], m["n"])
            assert (g["s"].numpy() == 4).all()
            g["s"].close()
        else:
            assert g == m
    st.close()
    del msgs, got, m, g, z, a
    assert slots_in_use() == before


# -- a view that cannot be built ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["bare, get", "bare, get_many", "in a tuple, get", "in a tuple, get_many"])
def test_a_view_numpy_cannot_type_raises_once_and_costs_its_count_once(q, how):
    """A sender with ml_dtypes sends a NumPy bfloat16 array (a NumPy view
    of code bfloat16) to a receiver without it: building the view raises
    UnsupportedDtype after the view's memory took its ref (a bare array's
    TENSOR shortcut, or a pickle's buffer, whose loads releases what was
    not built too). The count goes back, no other array loses its memory,
    and the queue goes on. (The sender's side is made by telling zctipc
    that V2 is bfloat16, as ml_dtypes' dtype is.)"""
    from zctipc._core import dtypes
    from zctipc._wire import exports

    v2 = np.dtype("V2")
    keep = zctipc.empty(1000, np.uint16)
    keep[:] = 1
    before = slots_in_use()
    dtypes._code_of[v2] = dtypes.BFLOAT16
    exports._CODES.pop(v2, None)
    try:
        z = zctipc.empty(1000, np.uint16).view(v2)
        q.put(z if how.startswith("bare") else (z,))
    finally:
        dtypes._code_of.pop(v2)
        exports._CODES.pop(v2, None)
    del z
    if dtypes._ml_bfloat16() is None:
        with pytest.raises(zctipc.UnsupportedDtype, match="bfloat16"):
            q.get(timeout=HANG) if how.endswith(", get") else q.get_many(2, timeout=HANG)
    else:
        q.get(timeout=HANG) if how.endswith(", get") else q.get_many(2, timeout=HANG)
    assert slots_in_use() == before
    other = zctipc.empty(1000, np.uint16)
    other[:] = 7
    assert (keep == 1).all()
    q.put("next")
    assert q.get(timeout=HANG) == "next"
