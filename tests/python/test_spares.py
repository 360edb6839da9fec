"""Spare files: the pages of a large tensor or table this process let go
are reused for the next one it makes (go/shm/spare.go), never served stale
to another process, and never left behind."""

import os
import time

import numpy as np
import pyarrow as pa
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
