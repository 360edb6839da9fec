"""Sending CPU tensors under a torch that cannot move storages (before 2.12,
no UntypedStorage._swap_data_ptr_; Note [a torch that cannot move storages]
in zctipc._wire.storages): each test runs in a child interpreter whose torch
has it hidden (as the GPU machine's torch 2.11 has none), and again with
this torch as it is, where a put moves storages instead; each checks that
no pool slot stays in use and nothing is left in the segment directory."""

import os
import pickle
import subprocess
import sys
import textwrap

import pytest
from conftest import left_in, with_pythonpath

pytestmark = pytest.mark.slow

HIDE = """
import torch
torch.UntypedStorage._swap_data_ptr_ = None  # as torch before 2.12 has none
"""

PRELUDE = textwrap.dedent("""
    import gc, os, pickle, sys, threading
    import torch
    import zctipc
    from multiprocessing.reduction import ForkingPickler
    from zctipc._wire import storages

    def slots():
        gc.collect()
        return zctipc.pool_stats().slots_in_use

    MOVES = storages.can_move()
    got = {"moves": MOVES}
    q = zctipc.Queue()
    zctipc.empty(1)  # the pool exists
    base = slots()

    def roundtrip(obj, queue=q):
        queue.put(obj)
        return queue.get(timeout=30)

    def same(a, b):
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
""")

EPILOGUE = textwrap.dedent("""
    q.close()
    for name, value in list(globals().items()):  # drop what the test kept
        if not name.startswith("__") and name not in ("got", "base") and isinstance(
            value, (torch.Tensor, torch.UntypedStorage, torch.storage.TypedStorage, dict, list, tuple)
        ):
            del globals()[name]
    del name, value
    got["slots_left"] = slots() - base
    print(pickle.dumps(got).hex())
""")


@pytest.fixture(params=["old", "new"])
def env(request, isolated, tmp_path):
    """A child environment whose torch cannot move storages ("old": hidden
    by sitecustomize in every process started, spawned children too), or
    this torch as it is ("new")."""
    site = tmp_path / "site"
    site.mkdir()
    if request.param == "old":
        (site / "sitecustomize.py").write_text(HIDE)
    e = dict(isolated, PYTHONPATH=with_pythonpath(str(site), os.path.dirname(os.path.abspath(__file__))))
    e["EXPECT_MOVES"] = "0" if request.param == "old" else ""
    return e


def run(env, code, timeout=180, script=None):
    body = PRELUDE + textwrap.dedent(code) + EPILOGUE
    if script is not None:  # a file, for children that spawn with functions of __main__
        script.write_text(body)
        argv = [sys.executable, str(script)]
    else:
        argv = [sys.executable, "-c", body]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    got = pickle.loads(bytes.fromhex(out.stdout.split()[-1]))
    if env["EXPECT_MOVES"] == "0":
        assert not got["moves"], "the simulation hides _swap_data_ptr_"
    assert got.pop("slots_left") == 0, "every pool slot came back once all was dropped"
    left = left_in(env)
    assert left == [], f"left in the segment directory: {left}"
    return got


def test_bare_tensors_of_every_layout(env):
    got = run(
        env,
        """
        cases = {  # each over a storage of its own
            "contiguous": torch.arange(64.0),
            "offset": torch.arange(64.0)[5:20],
            "strided": torch.arange(64.0)[3::4],
            "transposed": torch.arange(64.0).view(8, 8).t(),
            "expanded": torch.arange(3.0).expand(4, 3),
            "empty": torch.empty(0),
            "empty_view": torch.arange(8.0)[7:7],
            "int16": torch.arange(10, dtype=torch.int16)[2:],
            "bool": torch.tensor([True, False, True]),
            "scalar": torch.tensor(3.5),
        }
        for name, t in cases.items():
            where = t.untyped_storage().data_ptr()
            before = t.clone()
            r = roundtrip(t)
            ok = r.dtype == t.dtype and r.shape == t.shape and torch.equal(r, before)
            if t.numel():
                first = (0,) * t.dim()
                r[first] = 99 if t.dtype != torch.bool else False
                shared = t[first].item() == r[first].item()
                # expanded: every element is the storage's first: written once
                got[name] = (ok, shared, t.untyped_storage().data_ptr() == where)
            else:
                got[name] = (ok, None, None)
            del r
        # the one-call path: zctipc memory goes in one call, the rest the long way
        z = zctipc.empty((4,), dtype=torch.float32)
        z.fill_(2.0)
        plain = torch.ones(4)
        got["put_tensor"] = (q._put_tensor(z), q._put_tensor(plain))
        r = q.get(timeout=30)
        r[0] = 5.0
        got["put_tensor_shared"] = z[0].item()
        del r, z
        # a tensor that requires grad, bare: pickled, and it keeps requires_grad
        w = torch.ones(3, requires_grad=True)
        r = roundtrip(w)
        got["grad"] = (r.requires_grad, r.is_leaf, r.tolist())
        del r
        try:
            q.put(w * 2)
            got["non_leaf"] = "sent"
        except RuntimeError as exc:
            got["non_leaf"] = "Cowardly" in str(exc)
        """,
    )
    moves = got["moves"]
    for name in ("contiguous", "offset", "strided", "transposed", "expanded", "int16", "bool", "scalar"):
        ok, shared, stayed = got[name]
        assert ok, f"{name}: received as sent"
        assert shared == moves, f"{name}: shared when the storage moves, a copy when it cannot"
        assert stayed == (not moves), f"{name}: the storage stays where it was when it cannot move"
    assert got["empty"][0] and got["empty_view"][0]
    assert got["put_tensor"] == (True, False), "zctipc memory in one call; a plain tensor is not zctipc memory"
    assert got["put_tensor_shared"] == 5.0, "zctipc memory is shared under every torch"
    assert got["grad"] == (True, True, [1.0, 1.0, 1.0])
    assert got["non_leaf"] is True


def test_pickled_messages_views_and_storages(env):
    got = run(
        env,
        """
        import warnings
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        t = torch.arange(16.0)
        where = t.untyped_storage().data_ptr()
        r = roundtrip({"a": t[:4], "b": t[2:10:2], "all": t, "list": [t[1:], t.view(4, 4).t()]})
        r["a"][2] = 50.0
        got["one_storage"] = (
            r["all"][2].item(),
            r["b"][0].item(),
            same(r["a"], r["all"]) and same(r["list"][0], r["all"]) and same(r["list"][1], r["all"]),
        )
        got["views_as_sent"] = (r["b"].tolist(), r["list"][1].stride(), r["list"][0].storage_offset())
        got["dict_sender"] = (t[2].item(), t.untyped_storage().data_ptr() == where)
        del r
        u = torch.arange(4.0)
        for name, obj in [
            ("typed", u.storage()),
            ("legacy", torch.FloatStorage([1.0, 2.0, 3.0])),
            ("untyped", u.untyped_storage()),
            ("empty_untyped", torch.UntypedStorage(0)),
        ]:
            r = roundtrip(obj)
            got[name] = (type(r).__name__, r.nbytes())
            if r.nbytes():
                i = 4 if name == "untyped" else 0  # a byte that is 0 in u
                r[i] = 7
                got[name] += (obj[i] == r[i],)
            del r
        w = torch.ones(3, requires_grad=True)
        r = roundtrip({"w": w, "w2": w})
        got["grad"] = (r["w"].requires_grad, r["w"] is r["w2"])
        del r
        """,
    )
    moves = got["moves"]
    assert got["one_storage"] == (50.0, 50.0, True), "views of one storage arrive over one storage"
    assert got["views_as_sent"] == ([50.0, 4.0, 6.0, 8.0], (1, 4), 1)
    assert got["dict_sender"] == ((50.0, False) if moves else (2.0, True)), "shared, or a copy"
    assert got["typed"][:2] == ("TypedStorage", 16) and got["typed"][2] == moves
    assert got["legacy"][:2] == ("TypedStorage", 12) and got["legacy"][2] == moves
    assert got["untyped"][:2] == ("UntypedStorage", 16) and got["untyped"][2] == moves
    assert got["empty_untyped"] == ("UntypedStorage", 0)
    assert got["grad"] == (True, True)


def test_torch_shared_memory_and_zctipc_memory(env):
    got = run(
        env,
        """
        sm = torch.arange(5.0).share_memory_()
        r = roundtrip(sm)
        r[0] = 42.0
        got["torch_shared_bare"] = (sm[0].item(), storages.is_torch_shared(sm.untyped_storage()))
        r = roundtrip({"sm": sm})
        r["sm"][1] = 43.0
        got["torch_shared_pickled"] = sm[1].item()
        # through a channel torch uses too: torch's way, shared
        r = ForkingPickler.loads(bytes(ForkingPickler.dumps({"sm": sm, "v": sm[2:]})))
        r["v"][0] = 44.0
        got["torch_shared_channel"] = sm[2].item()
        del r
        # zctipc memory: shared under every torch, in both kinds of channel,
        # and it stays zctipc memory (torch's reducer would move it into its own)
        z = zctipc.empty((4,), dtype=torch.float32)
        z.zero_()
        where = z.data_ptr()
        r = ForkingPickler.loads(bytes(ForkingPickler.dumps({"z": z, "s": z.untyped_storage(), "t": z.storage()})))
        r["z"][0] = 1.0
        got["zctipc_channel"] = (z[0].item(), z.data_ptr() == where, storages.is_torch_shared(z.untyped_storage()))
        del r
        r = roundtrip({"z": z})
        r["z"][1] = 2.0
        got["zctipc_queue_after"] = (z[1].item(), z.data_ptr() == where)
        del r
        # a received tensor, sent on through a channel torch uses
        g = roundtrip(torch.arange(3.0))
        gw = g.data_ptr()
        r = ForkingPickler.loads(bytes(ForkingPickler.dumps(g)))
        r[0] = 9.0
        got["received_channel"] = (g[0].item(), g.data_ptr() == gw)
        del r, g, z
        # a plain tensor through a channel torch uses: moved into the pool, or
        # shared torch's way when it cannot be
        p = torch.zeros(3)
        r = ForkingPickler.loads(bytes(ForkingPickler.dumps({"p": p, "v": p[1:]})))
        r["v"][0] = 3.0
        ps = p.untyped_storage()
        got["plain_channel"] = (p[1].item(), storages.is_torch_shared(ps), storages.is_zctipc(ps))
        del ps
        del r, p
        """,
    )
    moves = got["moves"]
    assert got["torch_shared_bare"] == ((42.0, False) if moves else (0.0, True)), "moved into the pool, or copied"
    assert got["torch_shared_pickled"] == (43.0 if moves else 1.0)
    assert got["torch_shared_channel"] == 44.0
    assert got["zctipc_channel"] == (1.0, True, False), "zctipc memory stays zctipc memory, shared"
    assert got["zctipc_queue_after"] == (2.0, True), "and is still shared by a zctipc queue afterwards"
    assert got["received_channel"] == (9.0, True)
    assert got["plain_channel"] == ((3.0, False, True) if moves else (3.0, True, False))


def test_a_full_pool_leaves_the_storage_untouched_and_nothing_taken(env):
    got = run(
        env,
        """
        zctipc.set_pool_limit(16 << 20)
        hog = []
        while True:
            try:
                hog.append(zctipc.empty((1 << 18,), dtype="uint8", block=False))
            except zctipc.OutOfSharedMemory:
                break
        held = slots()
        t = torch.arange(1 << 16, dtype=torch.float32)
        where, before = t.untyped_storage().data_ptr(), t.clone()
        for how, obj in [("bare", t), ("dict", {"t": t, "v": t[3:]}), ("storage", t.untyped_storage())]:
            try:
                q.put(obj, timeout=0.2)
                got[how] = "sent"
            except zctipc.OutOfSharedMemory:
                got[how] = (t.untyped_storage().data_ptr() == where, torch.equal(t, before), slots() == held, q.empty())
        del hog
        zctipc.set_pool_limit(1 << 34)
        r = roundtrip(t)
        got["after"] = torch.equal(r, before)
        del r
        """,
    )
    for how in ("bare", "dict", "storage"):
        assert got[how] == (True, True, True, True), f"{how}: OutOfSharedMemory, the storage untouched, nothing taken"
    assert got["after"]


def test_threads_putting_one_tensor_at_once(env):
    got = run(
        env,
        """
        t = torch.arange(1000.0)
        where = t.untyped_storage().data_ptr()
        errors = []

        def put():
            try:
                for i in range(40):
                    q.put(t if i % 2 else {"x": t, "y": t[1:]})
            except Exception as exc:
                errors.append(repr(exc))

        threads = [threading.Thread(target=put) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        ok = True
        for _ in range(160):
            r = q.get(timeout=30)
            if isinstance(r, dict):
                ok &= torch.equal(r["x"], t) and same(r["x"], r["y"]) and r["y"].storage_offset() == 1
            else:
                ok &= torch.equal(r, t)
            del r
        got["threads"] = (errors, ok, t.untyped_storage().data_ptr() == where)
        """,
    )
    errors, ok, stayed = got["threads"]
    assert errors == [] and ok
    assert stayed == (not got["moves"])


def test_simple_and_joinable_queues(env):
    got = run(
        env,
        """
        for Q in (zctipc.SimpleQueue, zctipc.JoinableQueue):
            qq = Q()
            t = torch.arange(6.0)
            qq.put(t)
            qq.put({"a": t[1:], "s": t.untyped_storage()})
            a, b = qq.get(), qq.get()
            if Q is zctipc.JoinableQueue:
                qq.task_done()
                qq.task_done()
                qq.join()
            a[0] = 10.0
            b["a"][0] = 11.0
            got[Q.__name__] = (t[0].item(), t[1].item(), b["s"].nbytes())
            del a, b
            qq.close()
        """,
    )
    moves = got["moves"]
    for name in ("SimpleQueue", "JoinableQueue"):
        assert got[name] == ((10.0, 11.0, 24) if moves else (0.0, 1.0, 24)), name


CHILDREN = """
import torch.utils.data as tud


def child_writes(t, d, s, out):
    t[0] = 11.0
    d["v"][0] = 12.0
    s[3] = 13
    out.put(storages.can_move())


def child_gets(q2, out):
    x = q2.get(timeout=60)
    x["t"][0] = 21.0
    out.put(x["t"][1].item())


class Items(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((4,), float(i)), i


def as_list(batch):
    return [b[0] for b in batch]


if __name__ == "__main__":
    ctx = zctipc.get_context()
    out = ctx.Queue()
    t = torch.zeros(8)
    s = torch.zeros(4).untyped_storage()
    p = ctx.Process(target=child_writes, args=(t, {"v": t[4:]}, s, out))
    p.start()
    got["child_moves"] = out.get(timeout=60)
    p.join()
    got["args"] = (t[0].item(), t[4].item(), s[3])
    q2 = ctx.Queue()
    p = ctx.Process(target=child_gets, args=(q2, out))
    p.start()
    u = torch.arange(4.0)
    q2.put({"t": u})
    got["queue"] = (out.get(timeout=60), u[0].item())
    p.join()
    q2.close()
    for name, collate in (("default", None), ("as_list", as_list)):
        dl = tud.DataLoader(Items(), batch_size=4, num_workers=2, multiprocessing_context=ctx, collate_fn=collate)
        got[name] = [[x.tolist() for x in (b if collate else b[:1])] for b in dl]
        del dl
    out.close()
"""


def test_child_processes_and_the_dataloader(env, tmp_path):
    got = run(env, CHILDREN, script=tmp_path / "children.py")
    moves = got["moves"]
    assert got["child_moves"] == moves, "the child's torch is the parent's"
    assert got["args"] == (11.0, 12.0, 13), "a child's arguments are shared under every torch"
    assert got["queue"] == (1.0, 21.0 if moves else 0.0), "a zctipc queue shares, or carries a copy"
    assert got["default"] == [[[[float(i)] * 4 for i in range(4)]], [[[float(i)] * 4 for i in range(4, 8)]]]
    assert got["as_list"] == [[[float(i)] * 4 for i in range(4)], [[float(i)] * 4 for i in range(4, 8)]]
