"""Attacks on the memory surfaces from outside: descriptor tickets replayed
and forged across processes, segments published while their maker dies or
races another, and the collection of what a killed sender left. Every
attack is kept, whether it found something broken or not."""

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import slots_in_use

import zctipc
from zctipc._wire import exports

SWEEP_TIMEOUT = 15


def _files(env):
    return sorted(os.listdir(env["ZCTIPC_SHM_DIR"]))


def _wait_empty(env, timeout=SWEEP_TIMEOUT):
    deadline = time.monotonic() + timeout
    while _files(env) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _files(env)


def _run(env, code, *args, timeout=120):
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("what", ["pool_array", "shared_tensor"])
def test_a_descriptor_made_for_attaching_is_attached_but_never_taken(what):
    """Bytes that carry no count (zctipc.ray's, made by describe) attach any
    number of times; handed to a receiver that takes counts (decode, a
    pickle's rebuild), they are refused as taken, where the receiver became
    a second owner of the count the describer holds, and its release freed
    the memory under the describer."""
    before = slots_in_use()
    if what == "pool_array":
        obj = zctipc.empty(1000, "float64")
        obj[:] = 3.0
        e = exports.export_bare(obj)
    else:
        obj = zctipc.create_shared_tensor(data=np.full(1000, 3.0))
        e = exports.export_shared_tensor(obj)
    data = exports.describe(e)
    for _ in range(50):
        view = exports.attach(data)
        assert (np.asarray(view.numpy() if what == "shared_tensor" else view) == 3.0).all()
        if what == "shared_tensor":
            view.close()
        del view
    with pytest.raises(zctipc.DescriptorTaken):
        exports.decode(data)
    with pytest.raises(zctipc.DescriptorTaken):
        exports.drop(data)
    fresh = zctipc.empty(1000, "float64")  # would reuse a slot freed under the describer
    fresh[:] = 9.0
    assert (np.asarray(obj.numpy() if what == "shared_tensor" else obj) == 3.0).all()
    e.release()
    if what == "shared_tensor":
        obj.close()
    del obj, fresh, e
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before


_SENDER = """
import sys, time, numpy as np, zctipc
from multiprocessing.reduction import ForkingPickler
a = zctipc.empty(1000, "float64"); a[:] = 7.0
s = zctipc.create_shared_tensor(data=np.full(1000, 5.0))
print(bytes(ForkingPickler.dumps((a, s))).hex(), flush=True)
if sys.argv[1] == "killed":
    time.sleep(600)
"""

_RECEIVER = """
import json, os, pickle, signal, subprocess, sys, time, zctipc
how = sys.argv[1]
p = subprocess.Popen([sys.executable, "-c", sys.argv[2], how], stdout=subprocess.PIPE, text=True)
data = bytes.fromhex(p.stdout.readline())
if how != "exited":
    p.send_signal(signal.SIGKILL)
p.wait()
if how == "killed-and-collected":
    zctipc.collect_garbage()
loads = []
for _ in range(2):
    try:
        a, s = pickle.loads(data)
        loads.append(["loaded", float(a[0]), float(s.numpy()[0])])
        s.close()
        del a, s
    except zctipc.ZctipcError as e:
        loads.append([type(e).__name__, str(e)])
print(json.dumps(loads))
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exited", "killed", "killed-and-collected"])
def test_a_pickle_loaded_after_its_sender_is_gone(isolated, how):
    """A pickle outlives its sender: loaded once after the sender exited or
    was SIGKILLed it gives the values sent, and a replay is DescriptorTaken.
    Once zctipc gc collected what a killed sender left (its memory and its
    ticket arena), the load says the memory is gone (SegmentNotFound),
    never that someone took it. Nothing is left behind."""
    loads = _run(isolated, _RECEIVER, how, _SENDER)
    if how == "killed-and-collected":
        assert [x[0] for x in loads] == ["SegmentNotFound"] * 2, loads
        assert "gone" in loads[0][1]
    else:
        assert loads[0] == ["loaded", 7.0, 5.0]
        assert loads[1][0] == "DescriptorTaken", loads
    assert _wait_empty(isolated) == []


def test_thousands_of_sends_leave_no_ticket_behind():
    """Sends through a queue, some in flight at once: the pool's buffers and
    the segment files (ticket arenas included) are back where they were."""
    q = zctipc.Queue()
    a = zctipc.empty(128, np.uint8)
    q.put(a)
    q.get()
    files_before = len(os.listdir(os.environ.get("ZCTIPC_SHM_DIR") or "/dev/shm"))
    before = slots_in_use()
    for _round in range(5):
        for _i in range(400):
            q.put(a)
        for _i in range(400):
            got = q.get()
            assert got.shape == (128,)
            del got
        for _i in range(400):
            q.put(a)
            assert q.get().shape == (128,)
    gc.collect()
    assert zctipc.pool_stats().slots_in_use == before
    assert len(os.listdir(os.environ.get("ZCTIPC_SHM_DIR") or "/dev/shm")) == files_before
    q.close()


_MAKER = """
import os, sys, numpy as np, zctipc
real = np.copyto
def slow(dst, src, **kw):
    real(dst[: dst.size // 2], src[: src.size // 2], **kw)  # half the data in,
    print("half", flush=True)
    import time; time.sleep(600)                           # and killed here
np.copyto = slow
zctipc.create_shared_tensor(sys.argv[1], data=np.full(1 << 20, 9, np.uint8))
"""


def test_a_maker_killed_mid_copy_leaves_no_name_and_no_file(isolated):
    """A segment made with data= whose maker is SIGKILLed half-way through
    the copy: no process finds it by name, the name is free for another
    maker, and the daemon removes its temporary file."""
    name = "killed_mid_copy"
    p = subprocess.Popen([sys.executable, "-c", _MAKER, name], env=isolated, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "half"
    made = _files(isolated)
    assert any(f.startswith("zctipc-tmp-") for f in made), made
    assert "zctipc_" + name not in made, "the name appeared before its contents"
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()
    out = _run(
        isolated,
        """
        import json, sys, numpy as np, zctipc
        try:
            zctipc.attach_shared_tensor(sys.argv[1]); seen = "attached"
        except zctipc.SegmentNotFound:
            seen = "not found"
        t = zctipc.create_shared_tensor(sys.argv[1], data=np.full(1 << 20, 4, np.uint8))
        ok = bool((t.numpy() == 4).all()); t.close()
        print(json.dumps([seen, ok]))
        """,
        name,
    )
    assert out == ["not found", True]
    assert _wait_empty(isolated) == []


_RACER = """
import json, os, sys, time, numpy as np, zctipc
name, value, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
data = np.full(8 << 20, value, np.uint8)
while time.time() < start:
    pass
try:
    t = zctipc.create_shared_tensor(name, data=data)
except FileExistsError:
    print("exists", flush=True)
else:
    print("made", flush=True)
    sys.stdin.readline()  # kept until the attacher is done
    t.close()
"""

_WATCHER = """
import json, sys, time, numpy as np, zctipc
name, until = sys.argv[1], float(sys.argv[2])
seen = set()
while time.time() < until:
    try:
        t = zctipc.attach_shared_tensor(name)
    except zctipc.SegmentNotFound:
        continue
    v = t.numpy()
    seen.add("uniform" if v.min() == v.max() and v[0] in (1, 2) and v.size == 8 << 20 else "partial")
    t.close()
    break
print(json.dumps(sorted(seen)))
"""


@pytest.mark.slow
def test_two_makers_of_one_name_race(isolated):
    """Two processes make a segment of one name with data at the same
    moment while a third attaches it as soon as it appears: exactly one
    maker wins, the other gets FileExistsError, and the attacher sees the
    winner's data whole."""
    name = "raced_name"
    start = time.time() + 3
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, name, str(v), str(start)],
            env=isolated,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for v in (1, 2)
    ]
    watcher = subprocess.Popen(
        [sys.executable, "-c", _WATCHER, name, str(start + 30)], env=isolated, stdout=subprocess.PIPE, text=True
    )
    results = [r.stdout.readline().strip() for r in racers]
    seen = json.loads(watcher.communicate(timeout=60)[0])
    for r in racers:
        r.communicate("\n", timeout=60)
        assert r.returncode == 0
    assert sorted(results) == ["exists", "made"], results
    assert seen == ["uniform"]
    assert _wait_empty(isolated) == []


def test_an_unlinked_segment_under_the_file_descriptor_strategy_is_sent(isolated):
    """The file_descriptor strategy passes descriptors, not names: a tensor
    whose name cannot be removed (a memfd has none) or was, travels."""
    env = dict(isolated, ZCTIPC_SHARING_STRATEGY="file_descriptor")
    out = _run(
        env,
        """
        import json, numpy as np, zctipc
        t = zctipc.create_shared_tensor(data=np.arange(6.0))
        try:
            t.unlink(); unlinked = "unlinked"
        except zctipc.ZctipcError as e:
            unlinked = type(e).__name__
        q = zctipc.Queue()
        q.put(t.numpy())
        got = q.get(timeout=10)
        print(json.dumps([unlinked, got.tolist()]))
        del got
        t.close(); q.close()
        """,
    )
    assert out[1] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], out
    assert _wait_empty(isolated) == []


def test_a_name_removed_after_the_put_fails_the_get_clearly(isolated):
    """The documented race: the name is removed after the put checked it.
    The get raises SegmentNotFound naming the segment, the queue goes on,
    the sender's tensor is intact, and nothing is left behind."""
    out = _run(
        isolated,
        """
        import json, numpy as np, zctipc
        t = zctipc.create_shared_tensor(data=np.arange(6.0))
        q = zctipc.Queue()
        q.put(t.numpy())
        t.unlink()
        try:
            q.get(timeout=10); got = "got"
        except zctipc.SegmentNotFound as e:
            got = ["SegmentNotFound", t.name in str(e)]
        q.put("after")
        print(json.dumps([got, q.get(timeout=10), t.numpy().tolist()]))
        t.close(); q.close()
        """,
    )
    assert out == [["SegmentNotFound", True], "after", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]]
    assert _wait_empty(isolated) == []


_QUEUE_HOLDER = """
import numpy as np, time, zctipc
q = zctipc.Queue()
keep = [zctipc.empty(1000, np.float64) for _ in range(3)]
for a in keep:
    q.put(a)
q.put(np.ones(300_000))                     # a pool copy, in flight only
q.put(zctipc.create_shared_tensor(data=np.ones(1000)))
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_gc_dry_run_names_what_the_real_run_removes(isolated):
    """A killed process's queue holds messages (and their tickets) on its
    own arenas and tensors, beside a foreign file with the library's prefix
    and another without: zctipc gc --dry-run names exactly what the real
    run then removes (the queue and everything its messages held), and
    neither touches the foreign files."""
    env = dict(isolated, ZCTIPC_CLEANUP="0")
    p = subprocess.Popen([sys.executable, "-c", _QUEUE_HOLDER], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()
    shm = isolated["ZCTIPC_SHM_DIR"]
    for foreign in ("zctipc_foreign_file", "not_ours"):
        with open(os.path.join(shm, foreign), "wb") as f:
            f.write(b"x" * 4096)
        os.chmod(os.path.join(shm, foreign), 0o600)
    made = set(_files(isolated)) - {"zctipc_foreign_file", "not_ours"}
    out = _run(
        env,
        """
        import json, zctipc
        dry = zctipc.collect_garbage(dry_run=True)
        real = zctipc.collect_garbage()
        print(json.dumps([sorted(r["name"] for r in dry["removed"]), sorted(r["name"] for r in real["removed"])]))
        """,
    )
    dry, real = out
    assert dry == real
    assert set(real) >= made - {n for n in made if n.startswith("zctipc-tmp-")}, (made, real)
    left = set(_files(isolated))
    assert {"zctipc_foreign_file", "not_ours"} <= left
    assert left - {"zctipc_foreign_file", "not_ours"} == set(), left
    for foreign in ("zctipc_foreign_file", "not_ours"):
        os.remove(os.path.join(shm, foreign))
