"""Spare files: the pages of a large tensor or table this process let go
are reused for the next one it makes (go/internal/shm/spare.go), never served stale
to another process, and never left behind."""

import os
import time

import numpy as np
import pyarrow as pa
import pytest
from conftest import SHM

import zctipc

MIB = 1 << 20


def spares():
    return sorted(n for n in os.listdir(SHM) if n.startswith("zctipc-tmp-"))


def inode(name):
    return os.stat(os.path.join(SHM, name)).st_ino


def _attach_sum(name, conn):
    """Attach tensor name twice, with a request in between, and report its
    shape and sum each time (the second attach comes after the creator made
    a new segment of the same name from the first one's file)."""
    for _ in range(2):
        t = zctipc.attach_shared_tensor(name)
        seen = (t.numpy().shape, float(t.numpy().sum()))
        t.close()
        conn.send(seen)
        conn.recv()


def test_a_new_tensor_of_the_same_name_reuses_the_pages_and_is_never_seen_stale(segname):
    ctx = zctipc.get_context("spawn")
    here, there = ctx.Pipe()
    first = zctipc.create_shared_tensor(segname, data=np.ones(4 * MIB // 8))
    ino = inode(first.name)
    p = ctx.Process(target=_attach_sum, args=(segname, there))
    p.start()
    try:
        assert here.recv() == ((4 * MIB // 8,), 4 * MIB / 8)
        before = set(spares())
        first.close()  # the last count: kept as a spare, its name gone
        assert not os.path.exists(os.path.join(SHM, first.name))
        assert len(set(spares()) - before) == 1
        second = zctipc.create_shared_tensor(segname, data=np.full(MIB // 8, 2.0))
        assert inode(second.name) == ino, "made from the spare"
        here.send("again")
        assert here.recv() == ((MIB // 8,), 2.0 * MIB / 8), "the new segment, not the mapping the child cached"
        here.send("done")
        p.join(30)
        assert p.exitcode == 0
        second.close()
    finally:
        if p.is_alive():
            p.kill()


def test_a_zeroed_tensor_made_from_a_spare_is_zero():
    a = zctipc.create_shared_tensor(data=np.full(2 * MIB, 7, np.uint8))
    a.close()
    b = zctipc.create_shared_tensor(shape=(MIB,), dtype="uint8")
    try:
        assert not b.numpy().any()
    finally:
        b.close()


@pytest.mark.slow
def test_tables_reuse_pages_and_spares_go_after_a_second():
    table = pa.table({"x": np.arange(MIB, dtype=np.int64)})
    h = zctipc.share_table(table)
    first = h.name
    ino = inode(first)
    del h  # the last count
    h = zctipc.share_table(table)
    assert inode(h.name) == ino
    t = zctipc.attach_table(h)
    assert t.equals(table)
    del t
    h.close()
    assert spares()
    deadline = time.monotonic() + 10
    while spares() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not spares(), "spares are removed once they idled a second"


def _make_and_let_go(names, rounds, conn):
    """Make each of names in turn, filled with its index + 1, and let it go
    at once (its file becomes a spare for the next), rounds times."""
    conn.recv()
    for _ in range(rounds):
        for i, name in enumerate(names):
            try:
                zctipc.create_shared_tensor(name, data=np.full(2 * MIB // 8, float(i + 1))).close()
            except zctipc.SegmentExists:
                pass  # the attacher still holds the last one of this name
    conn.send("done")


@pytest.mark.slow
def test_a_name_is_visible_only_with_its_contents_complete(segname):
    """Two names made and let go in a loop, each from the other's spare
    pages: whoever attaches a name sees its own contents, complete, never
    the other tensor's bytes or zeros that the copy has not reached yet
    (Note [a name appears with its contents] in go/internal/shm/create.go)."""
    names = [segname + "_a", segname + "_b"]
    ctx = zctipc.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=_make_and_let_go, args=(names, 400, there))
    p.start()
    seen, wrong = 0, []
    try:
        here.send("go")
        while p.is_alive() and not here.poll():
            for i, name in enumerate(names):
                try:
                    t = zctipc.attach_shared_tensor(name, readonly=True)
                except zctipc.SegmentNotFound:
                    continue
                with t:
                    values = np.unique(t.numpy())
                seen += 1
                if values.tolist() != [float(i + 1)]:
                    wrong.append((name, values.tolist()))
        assert here.recv() == "done"
        p.join(30)
        assert p.exitcode == 0
    finally:
        if p.is_alive():
            p.kill()
    assert seen > 0, "no attach found a name: the test tested nothing"
    assert wrong == [], f"{len(wrong)} of {seen} attaches saw another tensor's bytes or an unfinished copy"
