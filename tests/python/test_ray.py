"""zctipc as Ray's same-node tensor transport, on a local cluster of two
Ray nodes on this machine (node A, the driver's, and node B): same-node
hand-offs are zero copy, other-node ones go through Ray, a killed producer
leaves nothing behind, and bad input gets a clear error."""

import os
import signal
import threading
import time
from unittest import mock

import numpy as np
import pytest
import torch
from conftest import wait_until_gone

import zctipc

ray = pytest.importorskip("ray", reason="zctipc.ray needs Ray (pip install zctipc[ray]); make test installs it")
zr = pytest.importorskip("zctipc.ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

MIB = 1 << 20
N = 256 * MIB // 4  # a 256 MiB int32 tensor


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 4, "resources": {"node_a": 100}, "object_store_memory": 700 * MIB},
    )
    c.add_node(num_cpus=4, resources={"node_b": 100}, object_store_memory=700 * MIB)
    ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def on(node):
    """Options that place an actor or task on node A or B. An actor with a
    resource named holds a CPU unless it says otherwise: these hold none, so
    that actors a finished test has not yet seen torn down never fill a node."""
    return {"num_cpus": 0, "resources": {f"node_{node}": 1}}


@ray.remote(enable_tensor_transport=True)
class Producer:
    def __init__(self):
        self.t = None

    @ray.method(tensor_transport="zctipc")
    def make(self, n):
        self.t = torch.arange(n, dtype=torch.int32)
        return self.t

    @ray.method(tensor_transport="zctipc")
    def send(self, value):
        return value

    @ray.method(tensor_transport="zctipc")
    def send_float8(self):
        return torch.zeros(4, dtype=torch.float8_e4m3fn)

    def hold(self, n):
        """Keep a tensor of zctipc memory to hand out again and again, as a
        parameter server keeps its weights."""
        self.t = zctipc.empty((n,), torch.int32)
        self.t.copy_(torch.arange(n, dtype=torch.int32))

    @ray.method(tensor_transport="zctipc")
    def same(self):
        return self.t

    @ray.method(tensor_transport="zctipc")
    def same_after(self, seconds):
        """self.t, returned once the receiver's task is surely submitted."""
        time.sleep(seconds)
        return self.t

    def read(self, i):
        return int(self.t[i])

    def pid(self):
        return os.getpid()

    def slots_in_use(self):
        self.t = None
        return zctipc.pool_stats().slots_in_use


@ray.remote(enable_tensor_transport=True)
class Consumer:
    def __init__(self):
        self.kept = None

    def take(self, t, write=None):
        from zctipc._wire import exports

        if write is not None:
            t[0] = write
        samples = [int(t[i]) for i in (1, len(t) // 2, len(t) - 1)]
        return exports.in_zctipc_memory(t.numpy()), samples, len(t)

    def look(self, t, write=None):
        """t[0] as received, then (with write) t[0] = write."""
        seen = int(t[0])
        if write is not None:
            t[0] = write
        return seen

    def keep(self, t):
        self.kept = t
        return os.getpid()

    def write_kept(self, i, value):
        self.kept[i] = value

    def read_kept(self):
        return [int(self.kept[i]) for i in (0, 1, len(self.kept) - 1)]

    def files(self):
        """The zctipc files this process or any other holds a count on, made
        by whom: {name: creator pid}."""
        return {s.name: s.creator_pid for s in zctipc.list_segments()}

    def kinds_made_by(self, pid):
        """The kinds of the zctipc files process pid made."""
        return sorted(s.kind for s in zctipc.list_segments() if s.creator_pid == pid)


@ray.remote
class PlainConsumer:
    """An actor made without enable_tensor_transport=True: Ray gives it no
    thread of its own for receiving (Note [the receiver's transfer thread]
    in zctipc.ray)."""

    def look(self, t):
        return int(t[0])

    def pid(self):
        return os.getpid()


def test_same_node_actor_gets_a_view_of_the_producers_memory(cluster):
    p = Producer.options(**on("a")).remote()
    c = Consumer.options(**on("a")).remote()
    shared, samples, n = ray.get(c.take.remote(p.make.remote(N), write=-1))
    assert shared, "the receiver's tensor lies in zctipc memory"
    assert n == N and samples == [1, N // 2, N - 1]
    assert ray.get(p.read.remote(0)) == -1, "a write by the receiver is seen by the producer"


def test_receivers_on_one_node_share_one_memory(cluster):
    p = Producer.options(**on("a")).remote()
    first, second = Consumer.options(**on("a")).remote(), Consumer.options(**on("a")).remote()
    ref = p.send.remote(torch.zeros(1000, dtype=torch.int32))
    assert ray.get(first.keep.remote(ref)) and ray.get(second.keep.remote(ref))
    ray.get(first.write_kept.remote(1, 7))
    assert ray.get(second.read_kept.remote()) == [0, 7, 0], "one receiver's write is the other's"


def test_the_same_tensor_goes_out_again_and_again(cluster):
    """A parameter server hands out the one tensor it keeps: each hand-off
    arrives, whether the earlier refs live on or are dropped, and a
    receiver's write is what the next one sees."""
    p = Producer.options(**on("a")).remote()
    c = Consumer.options(**on("a")).remote()
    ray.get(p.hold.remote(1000))
    refs = [p.same.remote() for _ in range(3)]  # three live refs to the one tensor
    assert ray.get([c.look.remote(r) for r in refs]) == [0, 0, 0]
    assert ray.get(c.look.remote(refs[1], write=-1)) == 0
    assert ray.get(c.look.remote(refs[0])) == -1 and ray.get(c.look.remote(refs[2])) == -1
    assert ray.get(p.read.remote(0)) == -1, "the receiver wrote the producer's memory"
    del refs[0]  # dropped between sends: the others' counts are their own
    for i in range(3):
        refs.append(p.same.remote())
        assert ray.get(c.look.remote(refs[-1], write=i)) == (-1 if i == 0 else i - 1)
        if i == 1:
            del refs[:2]
    assert ray.get(c.take.remote(p.same.remote()))[1] == [1, 500, 999]
    del refs
    deadline = time.monotonic() + 30
    while ray.get(p.slots_in_use.remote()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.get(p.slots_in_use.remote()) == 0, "every hand-off's count was given back"


def test_a_receiver_without_a_transfer_thread_is_refused(cluster):
    """An actor made without enable_tensor_transport=True would run the
    transfer behind the task that waits for it: the first hand-off worked
    when the producer had finished first, the next one timed out after a
    minute. Every hand-off to it is refused at `.remote()`, naming the fix."""
    p = Producer.options(**on("a")).remote()
    c = PlainConsumer.options(**on("a")).remote()
    ray.get(p.hold.remote(10))
    for _ in range(2):
        ref = p.same.remote()
        ray.wait([ref])  # the producer is done: the transfer would go before the task
        with pytest.raises(
            zctipc.errors.InvalidArgument, match=r"made without @ray.remote\(enable_tensor_transport=True\)"
        ):
            c.look.remote(ref)  # refused before anything is submitted
    # The producer and its other receivers are unharmed.
    assert ray.get(Consumer.options(**on("a")).remote().look.remote(p.same.remote())) == 0


@ray.remote
class PlainAsyncConsumer:
    """An async actor made without enable_tensor_transport=True."""

    async def look(self, t):
        return int(t[0])


def test_a_receiver_without_a_transfer_thread_is_refused_before_the_producer_finishes(cluster):
    """A hand-off to an actor made without enable_tensor_transport=True,
    submitted while the producer is still at work (so that the receiving
    task would be queued before the transfer), fails at once naming the
    fix, rather than after Ray's transfer timeout; for async actors too.
    Nothing is left held."""
    p = Producer.options(**on("a")).remote()
    ray.get(p.hold.remote(10))
    fix = r"make its class with @ray.remote\(enable_tensor_transport=True\)"
    for r in (PlainConsumer.options(**on("a")).remote(), PlainAsyncConsumer.options(**on("a")).remote()):
        for _ in range(2):
            ref = p.same_after.remote(3)
            with pytest.raises(Exception, match=fix):
                ray.get(r.look.remote(ref), timeout=20)
            del ref
    assert ray.get(Consumer.options(**on("a")).remote().look.remote(p.same.remote()), timeout=60) == 0
    deadline = time.monotonic() + 30
    while ray.get(p.slots_in_use.remote()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.get(p.slots_in_use.remote()) == 0, "every refused hand-off's count was given back"


@ray.remote(enable_tensor_transport=True)
class AsyncConsumer:
    async def look(self, t):
        return int(t[0])


@ray.remote(enable_tensor_transport=True)
class Relay:
    """Hands a producer's tensor to receivers itself, through actor handles
    it was given (its own copies of the driver's)."""

    def hand_off(self, producer, receivers):
        # A process that submits the transport's objects registers it, as any
        # program that uses zctipc.ray does (Ray says "Unsupported tensor
        # transport protocol" otherwise, in a worker that never imported it).
        import zctipc.ray  # noqa: F401

        out = []
        for r in receivers:
            try:
                out.append(ray.get(r.look.remote(producer.same.remote()), timeout=60))
            except Exception as e:
                out.append(str(e))
        return out


def test_every_receiver_made_with_the_flag_is_served(cluster):
    """Receivers made with enable_tensor_transport=True are served however
    they run (threaded, async, on either node) and however their handle was
    had (by name, or given to another actor that hands off): the refusal
    reads the flag from every handle, and never refuses one of them, also
    when the hand-off is submitted before the producer finished."""
    p = Producer.options(**on("a")).remote()
    ray.get(p.hold.remote(10))
    receivers = [
        Consumer.options(max_concurrency=4, **on("a")).remote(),
        AsyncConsumer.options(**on("a")).remote(),
        AsyncConsumer.options(**on("b")).remote(),
    ]
    named = Consumer.options(name="zctipc-named-receiver", **on("a")).remote()  # noqa: F841  # lives while held
    receivers.append(ray.get_actor("zctipc-named-receiver"))
    for r in receivers:
        ref = p.same.remote()
        ray.wait([ref])
        assert ray.get(r.look.remote(ref), timeout=60) == 0
        assert ray.get(r.look.remote(p.same.remote()), timeout=60) == 0  # not waited for
    relay = Relay.options(**on("a")).remote()
    bad = PlainConsumer.options(**on("a")).remote()
    got = ray.get(relay.hand_off.remote(p, [*receivers, bad]), timeout=120)
    assert got[:-1] == [0] * len(receivers)
    assert "made without @ray.remote(enable_tensor_transport=True)" in got[-1]


@ray.remote(enable_tensor_transport=True)
class RacingConsumer:
    """A receiver whose threads race to make Ray's RDT manager, as two threads
    of a loaded machine can (Note [one RDT manager per process] in
    zctipc.ray): from its creation on, whoever makes one waits until another
    thread makes one too (or 20 s), and the first maker then stores last, so
    that a receive and the task it feeds would each make one of their own,
    and the first one made be overwritten, unless the process had one
    already."""

    def __init__(self):
        from ray.experimental.rdt import rdt_manager

        init = rdt_manager.RDTManager.__init__
        made = []
        both = threading.Condition()

        def racing_init(manager):
            init(manager)
            with both:
                made.append(manager)
                both.notify_all()
                first = both.wait_for(lambda: len(made) > 1, timeout=20) and made[0] is manager
            if first:
                time.sleep(1)  # the second maker stores its manager first

        rdt_manager.RDTManager.__init__ = racing_init

    def look(self, t):
        return int(t[0])


def test_a_receiver_whose_threads_race_gets_every_hand_off(cluster):
    """The receive (on the actor's transfer thread) and the task it feeds
    (on another) reach Ray's RDT manager at once in a fresh receiver: both
    get the first one made (Note [one RDT manager per process] in
    zctipc.ray), and the hand-off arrives, whether or not the producer had
    finished first."""
    p = Producer.options(**on("a")).remote()
    ray.get(p.hold.remote(10))
    for r in (
        RacingConsumer.options(**on("a")).remote(),
        RacingConsumer.options(max_concurrency=4, **on("a")).remote(),
    ):
        ref = p.same.remote()
        ray.wait([ref])
        assert ray.get(r.look.remote(ref), timeout=45) == 0
        assert ray.get(r.look.remote(p.same.remote()), timeout=45) == 0


def test_only_rays_lazy_creation_keeps_the_first_rdt_manager():
    """The store that keeps the first RDT manager is the one Ray's
    rdt_manager property makes (Note [one RDT manager per process] in
    zctipc.ray): any other write, a mock's or Ray's own reset, stores what
    it is given."""
    worker = ray._private.worker.Worker()
    first = worker.rdt_manager
    assert worker.rdt_manager is first
    stand_in = object()
    with mock.patch.object(worker, "_rdt_manager", stand_in):
        assert worker._rdt_manager is stand_in
        assert worker.rdt_manager is stand_in
    assert worker.rdt_manager is first
    worker._rdt_manager = None
    assert worker.rdt_manager is not first  # made again


class OtherRay:
    """Ray's Worker as another Ray might write it: zctipc.ray must leave it be."""

    def __init__(self):
        self._rdt_manager = None
        self._manager = None

    @property
    def rdt_manager(self):
        if self._manager is None:
            self._manager = object()
        return self._manager


class OwnAttribute(OtherRay):
    _rdt_manager = None

    @property
    def rdt_manager(self):
        if self._rdt_manager is None:
            self._rdt_manager = object()
        return self._rdt_manager


@pytest.mark.parametrize("worker", [OtherRay, OwnAttribute])
def test_a_ray_whose_rdt_manager_is_not_the_one_zctipc_knows_is_left_untouched(worker):
    """zctipc.ray changes Ray's Worker only where rdt_manager is a property
    that keeps its manager in _rdt_manager, and _rdt_manager is no
    attribute of the class itself (Note [one RDT manager per process])."""
    before = dict(worker.__dict__)
    with mock.patch("ray._private.worker.Worker", worker):
        zr._keep_the_first_rdt_manager()
    assert dict(worker.__dict__) == before


def test_a_restarted_receiver_that_never_imported_zctipc_gets_every_hand_off(cluster, tmp_path):
    """A receiver whose class knows nothing of zctipc, restarted: the process
    that submits to it registered the transport on its first process only,
    so the restarted one imports zctipc.ray first in its receive (to
    unpickle the transport's metadata), while the task the receive feeds
    already makes Ray's RDT manager on another thread. Forced to race (the
    first maker waits for a second one and then stores last), both still
    find one manager (Note [one RDT manager per process] in zctipc.ray)."""
    started = str(tmp_path / "started")

    @ray.remote(enable_tensor_transport=True)
    class Restarted:  # made here: Ray pickles it by value, with no zctipc in it
        def __init__(self, started):
            if not os.path.exists(started):
                open(started, "w").close()
                return
            from ray.experimental.rdt import rdt_manager

            init = rdt_manager.RDTManager.__init__
            made = []
            both = threading.Condition()

            def racing_init(manager):
                init(manager)
                with both:
                    made.append(manager)
                    both.notify_all()
                    first = both.wait_for(lambda: len(made) > 1, timeout=20) and made[0] is manager
                if first:
                    time.sleep(1)  # the second maker stores its manager first

            rdt_manager.RDTManager.__init__ = racing_init

        def pid(self):
            return os.getpid()

        def die(self):
            os._exit(1)

        def look(self, t):
            return int(t[0])

    p = Producer.options(**on("a")).remote()
    ray.get(p.hold.remote(10))
    r = Restarted.options(max_restarts=1, **on("a")).remote(started)
    assert ray.get(r.look.remote(p.same.remote()), timeout=45) == 0
    first = ray.get(r.pid.remote())
    r.die.remote()
    deadline = time.monotonic() + 60
    while True:
        try:
            if ray.get(r.pid.remote(), timeout=10) != first:
                break
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        assert time.monotonic() < deadline, "the receiver was not restarted"
        time.sleep(0.2)
    ref = p.same.remote()
    ray.wait([ref])
    assert ray.get(r.look.remote(ref), timeout=45) == 0


def test_a_refused_receiver_leaves_nothing_held(cluster):
    """One producer feeds a receiver made with the flag and receivers made
    without it (single-threaded, threaded, on the other node) in
    turn, the same ref and fresh ones: each refusal names the fix, the good
    receiver gets every hand-off, nothing of zctipc is made in a refused
    receiver (refused before anything reaches it), and once the refs go the producer holds nothing. A producer
    killed after a refusal leaves no file behind."""
    p = Producer.options(**on("a")).remote()
    ray.get(p.hold.remote(10))
    good = Consumer.options(**on("a")).remote()
    bad = [
        PlainConsumer.options(**on("a")).remote(),
        PlainConsumer.options(max_concurrency=4, **on("a")).remote(),
        PlainConsumer.options(**on("b")).remote(),
    ]
    fix = r"make its class with @ray.remote\(enable_tensor_transport=True\)"
    refs = []
    for r in bad:
        refs.append(p.same.remote())
        ray.wait(refs[-1:])  # the producer is done: the transfer goes before the task
        for ref in (refs[-1], refs[0]):  # a fresh ref, and one handed out before
            assert ray.get(good.look.remote(ref), timeout=60) == 0
            with pytest.raises(zctipc.errors.InvalidArgument, match=fix):
                r.look.remote(ref)
    before = set(ray.get(good.files.remote()))
    theirs = ray.get(bad[0].pid.remote())
    assert ray.get(good.kinds_made_by.remote(theirs)) == [], "a refused receiver made nothing of zctipc"
    del refs, ref
    deadline = time.monotonic() + 30
    while ray.get(p.slots_in_use.remote()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.get(p.slots_in_use.remote()) == 0, "every hand-off's count was given back, refused ones too"
    # A producer killed after a refusal, its ref still held.
    ray.get(p.hold.remote(10))  # slots_in_use let go of the one it held
    ppid = ray.get(p.pid.remote())
    mine = {name for name, pid in ray.get(good.files.remote()).items() if pid == ppid}
    ref = p.same.remote()
    ray.wait([ref])
    with pytest.raises(zctipc.errors.InvalidArgument, match=fix):
        bad[0].look.remote(ref)
    ray.kill(p)
    del ref
    assert wait_until_gone(mine, timeout=30) == [], "the killed producer's files were collected"
    assert set(ray.get(good.files.remote())) <= before


def test_other_node_actor_gets_the_data_through_ray(cluster):
    p = Producer.options(**on("a")).remote()
    c = Consumer.options(**on("b")).remote()
    shared, samples, n = ray.get(c.take.remote(p.make.remote(N), write=-1))
    assert not shared, "across nodes the tensor is Ray's copy, not zctipc memory"
    assert n == N and samples == [1, N // 2, N - 1]
    assert ray.get(p.read.remote(0)) == 0, "the producer's memory was not written"


def test_driver_gets_views(cluster):
    p = Producer.options(**on("a")).remote()
    t = ray.get(p.make.remote(1000))
    from zctipc._wire import exports

    assert exports.in_zctipc_memory(t.numpy())
    assert t[999] == 999


def test_put_and_get_any_object(cluster):
    from zctipc._wire import exports

    obj = {"x": np.arange(100, dtype=np.int64), "t": torch.ones(3, 4), "name": "weights", "n": [1, 2]}
    ref = zr.put(obj)
    got = ray.get(ref)
    assert got["name"] == "weights" and got["n"] == [1, 2]
    assert isinstance(got["x"], np.ndarray) and got["x"].dtype == np.int64
    np.testing.assert_array_equal(got["x"], obj["x"])
    assert torch.equal(got["t"], obj["t"])
    assert exports.in_zctipc_memory(got["x"]) and exports.in_zctipc_memory(got["t"].numpy())
    # What the transport cannot send whole is pickled with the rest; a
    # read-only array goes through it (it is only read).
    ro = np.arange(6.0)
    ro.flags.writeable = False
    inner = ray.put("inner")
    odd = {
        "strided": torch.arange(12.0).reshape(3, 4).t(),
        "grad": torch.ones(2, requires_grad=True),
        "conj": torch.ones(2, dtype=torch.complex64).conj(),
        "ro": ro,
        "ref": inner,
    }
    got = ray.get(zr.put(odd))
    assert torch.equal(got["strided"], odd["strided"]) and torch.equal(got["grad"], odd["grad"].detach())
    assert got["grad"].requires_grad and torch.equal(got["conj"], odd["conj"])
    np.testing.assert_array_equal(got["ro"], ro)
    assert exports.in_zctipc_memory(got["ro"])
    del inner
    assert ray.get(got["ref"]) == "inner", "a ref inside is borrowed as Ray borrows refs"
    # Nothing for the transport: a plain ray.put, and a Shared with no ref.
    assert ray.get(zr.put({"id": 7})) == {"id": 7}
    s = zr.share({"id": 8})
    assert s.ref is None and s.value() == {"id": 8}
    assert ray.get(summarize_plain.remote(s)) == {"id": 8}
    # An actor given the ref gets views too; one on the other node, copies.
    for node, expect in (("a", True), ("b", False)):
        c = Consumer.options(**on(node)).remote()
        shared, samples, _ = ray.get(c.take.remote(zr.put(torch.arange(10))))
        assert shared is expect and samples == [1, 5, 9]


@ray.remote
def summarize(v):
    from zctipc._wire import exports

    return exports.in_zctipc_memory(v["x"]), float(v["x"].sum()), v["label"], ray.get_runtime_context().get_node_id()


@ray.remote
def summarize_plain(v):
    return v


@ray.remote
def fetch(refs):
    import zctipc.ray as zr

    v = zr.get(refs[0])
    return type(v).__name__, float(v.sum())


def test_tasks_get_views_on_the_same_node(cluster):
    x = np.arange(MIB, dtype=np.float32)
    s = zr.share({"x": x, "label": "frame"})
    total = float(x.sum())
    nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes()}
    for node, expect in (("a", True), ("b", False)):
        shared, got, label, where = ray.get(summarize.options(**on(node)).remote(s))
        assert f"node_{node}" in nodes[where]
        assert shared is expect and got == total and label == "frame"
    assert s.value()["label"] == "frame"
    # A task given the ref in a list fetches it itself.
    ref = zr.put(np.ones(50))
    assert ray.get(fetch.options(**on("a")).remote([ref])) == ("ndarray", 50.0)
    assert ray.get(fetch.options(**on("b")).remote([ref])) == ("ndarray", 50.0)


def test_the_producer_lets_go_when_ray_frees_the_object(cluster):
    p = Producer.options(**on("a")).remote()
    c = Consumer.options(**on("a")).remote()
    ref = p.send.remote(torch.arange(MIB))
    assert ray.get(c.take.remote(ref))[0]
    assert ray.get(p.slots_in_use.remote()) == 1, "the producer holds what Ray holds"
    del ref
    deadline = time.monotonic() + 30
    while ray.get(p.slots_in_use.remote()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.get(p.slots_in_use.remote()) == 0, "garbage_collect let go of it"


@ray.remote
def make_frames(n):
    import numpy as np

    import zctipc.ray as zr

    return zr.share({"frames": np.full((n, 64), 3, np.uint8)})


def test_a_task_returns_arrays_that_stay_in_zctipc_memory(cluster):
    from zctipc._wire import exports

    got = ray.get(make_frames.options(**on("a")).remote(10))
    assert exports.in_zctipc_memory(got["frames"]) and int(got["frames"].sum()) == 3 * 640
    far = ray.get(make_frames.options(**on("b")).remote(10))
    assert not exports.in_zctipc_memory(far["frames"]) and int(far["frames"].sum()) == 3 * 640


def test_killed_producer_leaves_nothing_and_the_consumer_keeps_its_view(cluster):
    p = Producer.options(**on("a")).remote()
    c = Consumer.options(**on("a")).remote()
    ppid = ray.get(p.pid.remote())
    cpid = ray.get(c.keep.remote(p.make.remote(N)))
    theirs = {name for name, pid in ray.get(c.files.remote()).items() if pid in (ppid, cpid)}
    assert theirs, "the producer's and the consumer's files are listed"
    ray.kill(p)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(ppid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    time.sleep(1)  # the daemon's sweep of the producer
    assert ray.get(c.read_kept.remote()) == [0, 1, N - 1], "the view outlives its producer"
    os.kill(cpid, signal.SIGKILL)
    assert wait_until_gone(theirs, timeout=30) == []


def test_bad_input_is_refused_with_a_clear_error(cluster):
    p = Producer.options(**on("a")).remote()
    with pytest.raises(Exception, match="contiguous tensors"):
        ray.get(p.send.remote(torch.arange(12.0).reshape(3, 4).t()))
    with pytest.raises(Exception, match="cannot share a tensor of dtype torch.float8_e4m3fn"):
        ray.get(p.send_float8.remote())
    t = zr.ZctipcTransport()
    with pytest.raises(zctipc.InvalidArgument, match=r"conjugate or negative view: send t.resolve_conj\(\)"):
        t.extract_tensor_transport_metadata("x", [torch.ones(2, dtype=torch.complex64).conj()])
    with pytest.raises(zctipc.InvalidArgument, match="dense tensors, not torch.sparse_coo"):
        t.extract_tensor_transport_metadata("x", [torch.eye(3).to_sparse()])
    cuda = mock.Mock(spec=torch.Tensor)
    cuda.device = torch.device("cuda", 0)
    with pytest.raises(zctipc.InvalidArgument, match='Ray\'s own CUDA transport.*"cuda_ipc"'):
        t.extract_tensor_transport_metadata("x", [cuda])
    with pytest.raises(zctipc.InvalidArgument, match="sends torch tensors, not str"):
        t.extract_tensor_transport_metadata("x", ["not a tensor"])
    with pytest.raises(zctipc.InvalidArgument, match="not zctipc transport metadata"):
        t.recv_multiple_tensors("x", object(), zr.ZctipcCommunicatorMetadata())
    refused = zr.ZctipcCommunicatorMetadata(refused="made without enable_tensor_transport")
    junk = zr.ZctipcTransportMetadata(tensor_meta=[], node_id="", descriptors=[b"not a descriptor"])
    with pytest.raises(zctipc.InvalidArgument, match="made without"):  # before attaching anything
        t.recv_multiple_tensors("x", junk, refused)
    with pytest.raises(NotImplementedError, match="one-sided"):
        t.send_multiple_tensors([], None, None)
