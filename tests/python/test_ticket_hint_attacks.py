"""Attacks on the C put's first try of the ticket arena that gave the last
ticket (Note [the ticket arena tried first] in go/capi/handoff.c): bursts
that leave the tried arena full while earlier ones have tickets free (the
arenas must not grow round after round), many threads sending at once, a
release of every segment between sends, and a fork after sends. Each runs
in a process of its own with a segment directory of its own (the
``isolated`` fixture), and must exit with nothing left: a hold on an arena
that the first try leaked would hang the arena's removal at exit.
"""

from conftest import left_in
from test_handoff_attacks import run

# Rounds of bursts: the first round makes the ticket arenas; in each round
# the oldest tickets come back first (the queue is FIFO), so the arena
# tried first is the newest while the first ones have free slots. The
# count of ticket arenas must not grow after the first round.
BURSTS = """
    def arenas():
        return sum(s.kind == "arena" and s.creator_pid == os.getpid() for s in zctipc.list_segments())

    if __name__ == "__main__":
        q = zctipc.Queue()
        a = zctipc.empty((N,), "int64")
        a[:] = 7
        counts, whole = [], 0
        for r in range(6):
            for _ in range(5000):
                q.put(a)
            for _ in range(4000):
                m = q.get(timeout=10)
                whole += int(m[0]) == 7 and int(m[-1]) == 7
                del m
            for _ in range(3900):
                q.put(a)
            counts.append(arenas())
            for _ in range(4900):
                m = q.get(timeout=10)
                whole += int(m[0]) == 7 and int(m[-1]) == 7
                del m
        del a
        gc.collect()
        print(json.dumps({"counts": counts, "whole": whole, "end": pool_in_use(os.getpid())}))
        q.close()
"""


def test_bursts_that_fill_the_tried_arena_do_not_grow_the_arenas(isolated, tmp_path):
    r = run(tmp_path, isolated, BURSTS)
    assert r["whole"] == 6 * 8900, r
    assert len(set(r["counts"])) == 1 and r["counts"][0] >= 3, r  # the buffer's arena and two of tickets or more
    assert r["end"] == [0, 0], r
    assert left_in(isolated) == []


# Eight threads put their own buffers at once into one queue while a
# consumer takes: the first try and the scan race on the tried arena.
THREADS = """
    if __name__ == "__main__":
        q = zctipc.Queue()
        per, nthreads = 1500, 8
        got, bad = [0], []

        def send(k):
            a = zctipc.empty((N,), "int64")
            a[:] = k
            for _ in range(per):
                q.put(a)

        def take():
            for _ in range(per * nthreads):
                m = q.get(timeout=30)
                if int(m[0]) != int(m[-1]) or not 1 <= int(m[0]) <= nthreads:
                    bad.append(int(m[0]))
                got[0] += 1
                del m

        c = threading.Thread(target=take)
        c.start()
        ts = [threading.Thread(target=send, args=(k,)) for k in range(1, nthreads + 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        c.join()
        gc.collect()
        print(json.dumps({"got": got[0], "bad": bad, "end": pool_in_use(os.getpid())}))
        q.close()
"""


def test_many_threads_sending_at_once_take_every_ticket_once(isolated, tmp_path):
    r = run(tmp_path, isolated, THREADS)
    assert r["got"] == 1500 * 8 and r["bad"] == [], r
    assert r["end"] == [0, 0], r
    assert left_in(isolated) == []


# Sends, then every segment let go (the tried ticket arena's file goes with
# it), then sends of a new buffer: they take tickets of a new arena, never
# of the one let go, and every message is taken whole.
RELEASED = """
    if __name__ == "__main__":
        q = zctipc.Queue()
        a = zctipc.empty((N,), "int64")
        a[:] = 3
        for _ in range(3000):
            q.put(a)
        first = sum(int(q.get(timeout=10)[0]) == 3 for _ in range(3000))
        del a
        gc.collect()
        zctipc.cleanup_all_segments()
        b = zctipc.empty((N,), "int64")
        b[:] = 5
        for _ in range(3000):
            q.put(b)
        second = sum(int(q.get(timeout=10)[-1]) == 5 for _ in range(3000))
        del b
        gc.collect()
        print(json.dumps({"first": first, "second": second}))
        q.close()
"""


def test_sends_after_every_segment_is_let_go_take_new_tickets(isolated, tmp_path):
    r = run(tmp_path, isolated, RELEASED)
    assert r == {"first": 3000, "second": 3000}, r
    assert left_in(isolated) == []


# A fork after sends: the child's put raises ForkedProcessError, and the
# parent's sends go on, taking tickets of its arenas as before.
FORKED = """
    if __name__ == "__main__":
        q = zctipc.Queue()
        a = zctipc.empty((N,), "int64")
        a[:] = 9
        for _ in range(2000):
            q.put(a)
        pid = os.fork()
        if pid == 0:
            try:
                q.put(a)
            except zctipc.ForkedProcessError:
                os._exit(0)
            except BaseException:
                os._exit(2)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        for _ in range(2000):
            q.put(a)
        got = sum(int(q.get(timeout=10)[0]) == 9 for _ in range(4000))
        del a
        gc.collect()
        print(json.dumps({"child": os.waitstatus_to_exitcode(status), "got": got, "end": pool_in_use(os.getpid())}))
        q.close()
"""


def test_a_forked_childs_put_is_refused_and_the_parent_goes_on(isolated, tmp_path):
    r = run(tmp_path, isolated, FORKED)
    assert r == {"child": 0, "got": 4000, "end": [0, 0]}, r
    assert left_in(isolated) == []
