// The steps of a queue's ring: put, get, and catching up after killed
// consumers. Package queue's documentation describes the ring (records
// that wrap, unbounded rings whose pages come and go, the warm window) and
// Note [threat model of the ring words] in package queue what a forged
// word may and may not do; this file is that protocol, and the only copy
// of it. Every word is read and written with sequentially consistent
// atomics, as Go's sync/atomic does; the ring's bytes are plain memory,
// published by the commit of a position.
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <time.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "guard.h"
#include "plane.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define SEQ __ATOMIC_SEQ_CST
#define CONTENDED (1u << 31)

static inline uint32_t *u32(const zp_queue *q, int off) { return (uint32_t *)(q->data + off); }
static inline uint64_t *u64(const zp_queue *q, int off) { return (uint64_t *)(q->data + off); }
static inline uint8_t *ring(const zp_queue *q) { return q->data + ZP_RING_AT; }
static inline uint32_t ld32(const uint32_t *p) { return __atomic_load_n(p, SEQ); }
static inline uint64_t ld64(const uint64_t *p) { return __atomic_load_n(p, SEQ); }
static inline void st32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, SEQ); }
static inline void st64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, SEQ); }
static inline uint32_t count_of(uint64_t w) { return (uint32_t)(w >> 32); }
static inline uint32_t pos_of(uint64_t w) { return (uint32_t)w; }
static inline uint64_t word(uint32_t count, uint32_t pos) { return (uint64_t)count << 32 | pos; }
static inline uint32_t min32(uint32_t a, uint32_t b) { return a < b ? a : b; }
static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, sizeof v); }

static void wake(uint32_t *w, int32_t n) { syscall(SYS_futex, w, FUTEX_WAKE, n, NULL, NULL, 0); }

// -- locks and sequence words (package lock, package futex) ---------------

// try_lock takes the lock if it is free, and notes it at *at (when at is not
// NULL: Note [a step that faults lets its locks go]).
static int try_lock(uint32_t *lock, uint32_t pid, uint64_t start, uint32_t *volatile *at) {
    uint32_t free = 0;
    if (!__atomic_compare_exchange_n(lock, &free, pid, 0, SEQ, SEQ)) {
        return 0;
    }
    if (at != NULL) {
        *at = lock;
    }
    st64((uint64_t *)(lock + 2), start); // the holder's start time, then its pid
    st32(lock + 1, pid);
    return 1;
}

static void unlock(uint32_t *lock) {
    st32(lock + 1, 0);
    if (__atomic_exchange_n(lock, 0, SEQ) & CONTENDED) {
        wake(lock, 1);
    }
}

// Note [a step that faults lets its locks go]. A step that faults (the file
// was shrunk under it) leaves by a jump from the signal handler, past the
// unlock it would have come to. The lock is its own process's, which is
// alive: no waiter would ever take it over, and every later call, in every
// process, would wait for it for ever, the faulting process's own first.
// So a step notes each lock while it holds it (in its guard, zp_guard's
// held: the put and get steps, with the lock a ZP_LOCKED caller passed
// in), and lets go, after the fault, of those still noted, when their
// words can still be written. The caller holds no lock after ZP_FAULT.
typedef struct held {
    uint32_t *volatile *put, *volatile *get; // where the step notes them
} held;

// let_go lets go of the lock noted at *at.
static void let_go(uint32_t *volatile *at) {
    unlock(*at);
    *at = NULL;
}

// take_up_to takes up to n from *word, never below zero, and returns how
// many it took.
static uint32_t take_up_to(uint32_t *word, uint32_t n) {
    uint32_t w = ld32(word);
    for (;;) {
        uint32_t k = w < n ? w : n;
        if (k == 0 || __atomic_compare_exchange_n(word, &w, w - k, 0, SEQ, SEQ)) {
            return k;
        }
    }
}

// count_up adds one to *word, never past 2^32 - 1. A sleeper count forged
// to 2^32 - 1 by another process would otherwise wrap round to 0 as a
// sleeper counts itself, and a signal, which wakes only when the count is
// not 0, would leave that sleeper to its timeout (a lost wake-up); held at
// 2^32 - 1, a forged count costs wake-ups for nobody, no more.
static void count_up(uint32_t *word) {
    uint32_t w = ld32(word);
    while (w != UINT32_MAX && !__atomic_compare_exchange_n(word, &w, w + 1, 0, SEQ, SEQ)) {
    }
}

void zp_count_sleeper(uint32_t *waiters, uint32_t *mine) {
    count_up(waiters);
    if (mine != NULL) {
        count_up(mine);
    }
}

void zp_uncount_sleepers(uint32_t *waiters, uint32_t *mine, uint32_t n) {
    if (mine != NULL) {
        // Only what mine still has: a count forged there, or taken back by
        // whoever took the party's place, may have taken this party's
        // sleepers from the word already.
        n = take_up_to(mine, n);
    }
    if (n > 0) {
        take_up_to(waiters, n);
    }
}

void zp_take_back_sleepers(uint32_t *waiters, uint32_t *mine) {
    uint32_t n = __atomic_exchange_n(mine, 0, SEQ);
    if (n > 0) {
        take_up_to(waiters, n);
    }
}

void zp_signal_word(uint32_t *word, uint32_t *waiters, int32_t n) {
    __atomic_add_fetch(word, 1, SEQ);
    if (ld32(waiters) != 0) {
        wake(word, n);
    }
}

// Note [a put that found the lock held]. A put that does not wait (a
// timeout of 0) and finds the put lock held by another put says the queue
// is full, as one that finds no room does, and a host that waits for room
// then sleeps on the space word (Python's queues do, outside Go). Only a
// get moves that word: a put that went to sleep behind another put, on a
// queue with room but no consumer, would sleep until its timeout, and then
// report a full queue. So a put that lets the put lock go, put or not,
// wakes one sleeper on the space word, which looks again.
static void pass_space_on(const zp_queue *q) {
    if (ld32(u32(q, ZP_OFF_SPACE_WAITERS)) != 0) {
        zp_signal_word(u32(q, ZP_OFF_SPACE_SEQ), u32(q, ZP_OFF_SPACE_WAITERS), 1);
    }
}

// -- pages ------------------------------------------------------------------

static int advise(uintptr_t start, uintptr_t end, int advice) {
    if (end <= start) {
        return 0;
    }
    return madvise((void *)start, end - start, advice) == 0 ? 0 : errno;
}

// reserve_mem reserves the pages that hold mem[0:n] (shm.ReservePages).
static int reserve_mem(const zp_queue *q, uint8_t *mem, uint32_t n) {
    if (n == 0) {
        return 0;
    }
    uintptr_t page = q->page, start = (uintptr_t)mem, end = start + n;
    return advise(start & ~(page - 1), (end + page - 1) & ~(page - 1), MADV_POPULATE_WRITE);
}

// release_mem gives back the pages wholly inside mem[0:n] (shm.ReleasePages).
static int release_mem(const zp_queue *q, uint8_t *mem, uint32_t n) {
    uintptr_t page = q->page, start = (uintptr_t)mem, end = start + n;
    return advise((start + page - 1) & ~(page - 1), end & ~(page - 1), MADV_REMOVE);
}

// page_end returns the ring offset where the page that holds ring offset
// off-1 ends.
static uint32_t page_end(const zp_queue *q, uint32_t off) {
    uintptr_t page = q->page, base = (uintptr_t)ring(q);
    return (uint32_t)(((base + off + page - 1) & ~(page - 1)) - base);
}

// release_ring_pages is release_mem, and when mem runs to the ring's end,
// the ring's last page too: its bytes past the ring are past the file's end.
static int release_ring_pages(const zp_queue *q, uint8_t *mem, uint32_t n) {
    if (n > 0 && mem + n == ring(q) + q->capacity) {
        n += page_end(q, q->capacity) - q->capacity;
    }
    return release_mem(q, mem, n);
}

typedef int (*page_fn)(const zp_queue *, uint8_t *, uint32_t);

// pages applies fn to the ring's memory between positions from and to (less
// than a ring apart), in two parts when it wraps; the first error.
static int pages(const zp_queue *q, uint32_t from, uint32_t to, page_fn fn) {
    uint32_t n = min32(to - from, q->capacity), pos = from & q->mask;
    if (pos + n <= q->capacity) {
        return fn(q, ring(q) + pos, n);
    }
    int first = fn(q, ring(q) + pos, q->capacity - pos);
    int second = fn(q, ring(q), pos + n - q->capacity);
    return first ? first : second;
}

// -- the warm window and reservations (package queue: Unbounded queues) ----

static uint32_t window(const zp_queue *q) { return min32(ld32(u32(q, ZP_OFF_WINDOW)), ZP_WARM_WINDOW); }

static int in_window(const zp_queue *q, uint32_t at, uint32_t size) {
    return q->warm && (at & q->mask) + size <= ZP_WARM_WINDOW;
}

static void settle_reserved(const zp_queue *q, uint32_t tail) {
    if (ld32(u32(q, ZP_OFF_RESERVED)) - tail > q->capacity) {
        st32(u32(q, ZP_OFF_RESERVED), tail);
    }
}

static int grow_window(const zp_queue *q, uint32_t to) {
    uint32_t w = window(q);
    if (to <= w) {
        return 0;
    }
    uint32_t up_to = min32((to + ZP_RESERVE_STEP - 1) & ~(ZP_RESERVE_STEP - 1), ZP_WARM_WINDOW);
    int err = reserve_mem(q, ring(q) + w, up_to - w);
    if (err) {
        // Part of them may be reserved: no word claims those, so they go back.
        release_mem(q, ring(q) + w, up_to - w);
        return err;
    }
    st32(u32(q, ZP_OFF_WINDOW), up_to);
    return 0;
}

static void unreserve(const zp_queue *q, uint32_t from, uint32_t to) {
    uint32_t lap_end = from - (from & q->mask) + q->capacity;
    if ((int32_t)(to - lap_end) <= 0) {
        pages(q, from, to, release_ring_pages);
        return;
    }
    pages(q, from, lap_end, release_ring_pages);
    uint32_t w = lap_end + window(q);
    if ((int32_t)(to - w) > 0) {
        pages(q, w, to, release_ring_pages);
    }
}

// reserve reserves the pages for a record from position start to end, under
// the put lock; an errno when the file system is full.
static int reserve(const zp_queue *q, uint32_t start, uint32_t end) {
    uint32_t off = start & q->mask;
    if (q->warm && off < ZP_WARM_WINDOW) {
        int err = grow_window(q, min32(off + (end - start), ZP_WARM_WINDOW));
        if (err) {
            return err;
        }
        if (off + (end - start) <= ZP_WARM_WINDOW) {
            return 0;
        }
    }
    uint32_t reserved = ld32(u32(q, ZP_OFF_RESERVED));
    if ((int32_t)(end - reserved) <= 0) {
        return 0;
    }
    uint32_t step = ZP_CHUNK;
    if (q->warm) {
        step = ZP_RESERVE_STEP;
        uint32_t lap_window = start - off + ZP_WARM_WINDOW;
        if ((int32_t)(lap_window - reserved) > 0) {
            reserved = lap_window; // the lap's window is reserved for good
        }
    }
    uint32_t up_to = (end + step - 1) & ~(step - 1);
    int err = pages(q, reserved, up_to, reserve_mem);
    if (err) {
        unreserve(q, reserved, up_to);
        return err;
    }
    st32(u32(q, ZP_OFF_RESERVED), up_to);
    uint32_t next = start - off + q->capacity;
    if (q->warm && (int32_t)(up_to - next) > 0 && up_to - next > window(q)) {
        st32(u32(q, ZP_OFF_WINDOW), min32(up_to - next, ZP_WARM_WINDOW));
    }
    return 0;
}

// -- skip records ----------------------------------------------------------

static int skip_at(const zp_queue *q, uint32_t at) {
    uint32_t pos = at & q->mask;
    return q->warm && pos % 8 == 0 && ring(q)[pos + 4] == ZP_TYPE_SKIP && rd32(ring(q) + pos) == q->capacity - pos;
}

static int only_skip(const zp_queue *q, uint32_t head, uint32_t tail) {
    return skip_at(q, head) && head + (q->capacity - (head & q->mask)) == tail;
}

// skip_to says whether a record of size goes to the start of the next lap
// (*next) rather than at tail.
static int skip_to(const zp_queue *q, uint32_t tail, uint32_t head, uint32_t items, uint32_t size, uint32_t *next) {
    uint32_t off = tail & q->mask;
    *next = tail;
    if (!q->warm || head != tail || off == 0 || off + size <= window(q) || size > ZP_WARM_WINDOW) {
        return 0;
    }
    uint32_t lap = tail + (q->capacity - off);
    if (lap - head + size > q->capacity || (q->max_items != 0 && items >= q->max_items)) {
        return 0;
    }
    *next = lap;
    return 1;
}

static void write_skip(const zp_queue *q, uint32_t off) {
    wr32(ring(q) + off, q->capacity - off);
    wr32(ring(q) + off + 4, ZP_TYPE_SKIP); // and no descriptors
}

static int skip(const zp_queue *q, uint32_t *tail, uint32_t head, uint32_t items, uint32_t size) {
    uint32_t next;
    if (!skip_to(q, *tail, head, items, size, &next)) {
        return 0;
    }
    int err = reserve(q, *tail, *tail + 8);
    if (err) {
        return err;
    }
    write_skip(q, *tail & q->mask);
    *tail = next;
    return 0;
}

static void give_back(const zp_queue *q, uint32_t head) {
    uint32_t from = ld32(u32(q, ZP_OFF_GIVEN_BACK)), to = head & ~(ZP_CHUNK - 1);
    if (from == to) {
        return;
    }
    if (to - from > q->capacity) {
        from = to; // a forged given_back: give back nothing, go on from head
    }
    if (!q->warm) {
        pages(q, from, to, release_ring_pages);
    } else {
        for (uint32_t at = from; (int32_t)(to - at) > 0;) {
            uint32_t lap = at - (at & q->mask);
            if (at - lap < ZP_WARM_WINDOW) {
                at = lap + ZP_WARM_WINDOW;
                continue;
            }
            uint32_t end = lap + q->capacity;
            if ((int32_t)(end - to) > 0) {
                end = to;
            }
            pages(q, at, end, release_ring_pages);
            at = end;
        }
    }
    st32(u32(q, ZP_OFF_GIVEN_BACK), to);
}

static void give_back_skipped(const zp_queue *q, uint32_t at) {
    give_back(q, at);
    uint32_t off = at & q->mask;
    if (off >= ZP_WARM_WINDOW) {
        uint32_t up_to = min32(((at + 8 + ZP_RESERVE_STEP - 1) & ~(ZP_RESERVE_STEP - 1)) + q->page, at - off + q->capacity);
        pages(q, at & ~(ZP_CHUNK - 1), up_to, release_ring_pages);
    }
    st32(u32(q, ZP_OFF_GIVEN_BACK), at - off + q->capacity);
}

static uint32_t cross_skip(const zp_queue *q, uint32_t gets, uint32_t head) {
    uint32_t next = head + (q->capacity - (head & q->mask));
    st64(u64(q, ZP_OFF_HEAD), word(gets, next));
    give_back_skipped(q, head);
    return next;
}

// rewind moves an emptied version 3 ring on to the next lap and gives back
// the window's pages past the largest record put since the last rewind;
// under the get lock, after the commit (package queue: The warm window).
static void rewind_ring(const zp_queue *q, uint32_t gets, uint32_t head, held *locks) {
    uint32_t off = head & q->mask;
    if (!try_lock(u32(q, ZP_OFF_PUT_LOCK), q->pid, q->start, locks->put)) {
        return;
    }
    uint64_t t = ld64(u64(q, ZP_OFF_TAIL));
    uint32_t puts = count_of(t), tail = pos_of(t);
    if (tail != head || puts != gets) {
        let_go(locks->put);
        return;
    }
    uint32_t need = ld32(u32(q, ZP_OFF_WINDOW_NEED));
    if (need < ZP_RECORD_HEADER) {
        need = ZP_RECORD_HEADER;
    }
    settle_reserved(q, tail);
    if (off != 0) {
        if (reserve(q, head, head + 8) != 0) {
            let_go(locks->put); // out of memory for the skip: the ring stays where it is
            return;
        }
        write_skip(q, off);
        uint32_t next = head + (q->capacity - off);
        st64(u64(q, ZP_OFF_TAIL), word(puts, next)); // commit the skip
        st64(u64(q, ZP_OFF_HEAD), word(gets, next)); // and cross it
        give_back_skipped(q, head);
    }
    uint32_t keep = min32(page_end(q, need + 8), ZP_WARM_WINDOW);
    if (window(q) > keep) {
        // The words first: a process killed before the pages go leaves
        // pages in use that no word claims, never a word that claims pages
        // that are gone.
        st32(u32(q, ZP_OFF_WINDOW), keep);
        st32(u32(q, ZP_OFF_RESERVED), pos_of(ld64(u64(q, ZP_OFF_TAIL))));
        release_mem(q, ring(q) + keep, page_end(q, ZP_WARM_WINDOW + 1) - keep);
    }
    st32(u32(q, ZP_OFF_WINDOW_NEED), 0);
    let_go(locks->put);
}

// -- records ---------------------------------------------------------------

static int sound(const zp_queue *q, uint32_t head, uint32_t tail) {
    return head % 8 == 0 && tail % 8 == 0 && tail - head <= q->capacity;
}

// may_catch_up says whether a put that found no room may find some once it
// catches up (zp_catch_up): given_back behind head's chunk, as a consumer
// killed before its give_back leaves it.
static int may_catch_up(const zp_queue *q, uint32_t head, uint32_t tail) {
    return q->sparse &&
           !(ld32(u32(q, ZP_OFF_GIVEN_BACK)) == (head & ~(ZP_CHUNK - 1)) && (head == tail || !skip_at(q, head)));
}

static int room(const zp_queue *q, uint32_t tail, uint32_t head, uint32_t items, uint32_t size) {
    if (q->sparse && !in_window(q, tail, size)) {
        head = ld32(u32(q, ZP_OFF_GIVEN_BACK));
    }
    return tail - head + size <= q->capacity && (q->max_items == 0 || items < q->max_items);
}

// copy_in copies n bytes from src to ring offset *pos, wrapping, and moves
// *pos on; with src NULL it writes zeros.
static void copy_in(const zp_queue *q, uint32_t *pos, const void *src, uint64_t n) {
    const uint8_t *s = src;
    while (n > 0) {
        uint32_t k = q->capacity - *pos;
        if (n < k) {
            k = (uint32_t)n;
        }
        if (s) {
            memcpy(ring(q) + *pos, s, k);
            s += k;
        } else {
            memset(ring(q) + *pos, 0, k);
        }
        n -= k;
        *pos = (*pos + k) & q->mask;
    }
}

static void write_record(const zp_queue *q, uint32_t at, const zp_record *r) {
    uint32_t pos = at & q->mask;
    copy_in(q, &pos, r->prefix, r->prefix_len);
    copy_in(q, &pos, r->payload, r->payload_len);
    copy_in(q, &pos, NULL, r->size - r->prefix_len - r->payload_len);
}

static void read_record(const zp_queue *q, uint32_t at, uint32_t size, uint8_t *dst) {
    uint32_t pos = at & q->mask, first = min32(size, q->capacity - pos);
    memcpy(dst, ring(q) + pos, first);
    memcpy(dst + first, ring(q), size - first);
}

static void corrupt(zp_out *out, int32_t what, uint32_t a, uint32_t b) {
    out->what = what;
    out->need = a;
    out->need_views = b;
}

// plain says whether the record of size bytes whose header is h (its 16
// bytes, in a row) is a plain one (ZP_PLAIN): a pickle, bytes or an inline
// array with no descriptor, its size its header's, its payload within it,
// and its padding less than 8 bytes.
static int plain(const uint8_t *h, uint32_t size) {
    uint16_t ndesc;
    memcpy(&ndesc, h + 6, sizeof ndesc);
    uint32_t plen = rd32(h + 8);
    return (h[4] == 1 || h[4] == 3 || h[4] == ZP_TYPE_INLINE) && ndesc == 0 && rd32(h) == size && plen <= size - ZP_RECORD_HEADER &&
           ((ZP_RECORD_HEADER + plen + 7) & ~7u) == size;
}

// -- put and get -----------------------------------------------------------

// hand_over runs the sends of the k records a put is about to commit: their
// counts' ledger entries dropped and their tickets armed while the records
// are still invisible, so that a put that finds no room, or waits for the
// lock, never holds a count outside the ledger (package buffer, Note
// [counts that wait]). Every ticket's word is read first, so that a ticket
// arena whose file was shrunk faults before any count changes hands; a
// fault after that (a shrink racing these few instructions, or the
// queue's own file shrunk under the commit or the steps after it) says so
// (ZP_IN_SENDS) until the put returns: the counts have left the ledger,
// and the record may be in the queue, so its caller must not give them up.
static void hand_over(const zp_record *recs, int32_t k, zp_out *out) {
    for (int32_t i = 0; i < k; i++) {
        for (int32_t j = 0; j < recs[i].nsends; j++) {
            zp_send_probe(&recs[i].sends[j]);
        }
    }
    for (int32_t i = 0; i < k; i++) {
        for (int32_t j = 0; j < recs[i].nsends; j++) {
            out->what = ZP_IN_SENDS;
            zp_send_run(&recs[i].sends[j]);
        }
    }
}

static int put(const zp_queue *q, const zp_record *recs, int32_t n, int32_t flags, zp_out *out, held *locks) {
    for (int32_t i = 0; i < n; i++) {
        uint64_t used = (uint64_t)recs[i].prefix_len + recs[i].payload_len;
        if (recs[i].size > q->max_record || used > recs[i].size || recs[i].size - used >= 8 || recs[i].size % 8 != 0) {
            out->need = recs[i].size;
            return ZP_TOO_LARGE;
        }
    }
    uint32_t *put_lock = u32(q, ZP_OFF_PUT_LOCK);
    if (flags & ZP_LOCKED) {
        *locks->put = put_lock;
    } else if (!try_lock(put_lock, q->pid, q->start, locks->put)) {
        return ZP_BUSY;
    }
    uint32_t seen = ld32(u32(q, ZP_OFF_SPACE_SEQ));
    uint64_t t = ld64(u64(q, ZP_OFF_TAIL)), h = ld64(u64(q, ZP_OFF_HEAD));
    uint32_t puts = count_of(t), tail = pos_of(t), gets = count_of(h), head = pos_of(h);
    if (!sound(q, head, tail)) {
        let_go(locks->put);
        corrupt(out, ZP_BAD_POSITIONS, head, tail);
        return ZP_CORRUPT;
    }
    uint32_t at;
    skip_to(q, tail, head, puts - gets, recs[0].size, &at);
    if (!room(q, at, head, puts - gets, recs[0].size)) {
        out->seen = seen;
        // Pages a killed consumer left may be given back (zp_catch_up):
        // only when some may be is the put lock kept for it, and only for
        // a caller that catches up (not ZP_LET_GO).
        if (may_catch_up(q, head, tail)) {
            if (flags & ZP_LET_GO) {
                let_go(locks->put);
            }
            return ZP_CATCH_UP;
        }
        let_go(locks->put);
        return ZP_WAIT;
    }
    if (q->sparse) {
        settle_reserved(q, tail);
    }
    int32_t k = 0;
    int err = 0;
    while (k < n) {
        uint32_t size = recs[k].size;
        if (q->warm && (err = skip(q, &tail, head, puts + (uint32_t)k - gets, size)) != 0) {
            break;
        }
        if (!room(q, tail, head, puts + (uint32_t)k - gets, size)) {
            break;
        }
        if (q->sparse && (err = reserve(q, tail, tail + size)) != 0) {
            break;
        }
        write_record(q, tail, &recs[k]);
        if (q->warm && size > ld32(u32(q, ZP_OFF_WINDOW_NEED))) {
            st32(u32(q, ZP_OFF_WINDOW_NEED), min32(size, ZP_WARM_WINDOW));
        }
        tail += size;
        k++;
    }
    hand_over(recs, k, out);
    st64(u64(q, ZP_OFF_TAIL), word(puts + (uint32_t)k, tail)); // commit
    let_go(locks->put);
    pass_space_on(q);
    out->n = k;
    if (k == 0) {
        out->err = err;
        out->need = recs[0].size;
        return ZP_NO_MEMORY;
    }
    // Wake a consumer when the queue was empty; one that leaves messages
    // behind wakes the next, so a busy queue makes no wake-up per message.
    if (count_of(ld64(u64(q, ZP_OFF_HEAD))) == puts) {
        zp_signal_word(u32(q, ZP_OFF_DATA_SEQ), u32(q, ZP_OFF_DATA_WAITERS), 1);
    } else {
        __atomic_add_fetch(u32(q, ZP_OFF_DATA_SEQ), 1, SEQ);
    }
    out->what = 0;
    return ZP_OK;
}

static int get(const zp_queue *q, uint8_t *buf, uint64_t cap, int32_t max_records, int32_t max_views, int32_t flags,
               zp_out *out, held *locks) {
    uint32_t *get_lock = u32(q, ZP_OFF_GET_LOCK);
    if (flags & ZP_LOCKED) {
        *locks->get = get_lock;
    } else if (!try_lock(get_lock, q->pid, q->start, locks->get)) {
        return ZP_BUSY;
    }
    uint32_t gets, head, tail;
    for (;;) {
        uint32_t seen = ld32(u32(q, ZP_OFF_DATA_SEQ));
        uint64_t h = ld64(u64(q, ZP_OFF_HEAD));
        gets = count_of(h);
        head = pos_of(h);
        tail = pos_of(ld64(u64(q, ZP_OFF_TAIL)));
        if (head != tail && !sound(q, head, tail)) {
            let_go(locks->get);
            corrupt(out, ZP_BAD_POSITIONS, head, tail);
            return ZP_CORRUPT;
        }
        if (head != tail && !only_skip(q, head, tail)) {
            break;
        }
        if (head != tail) {
            // A skip and nothing after it, left by a consumer killed in its
            // rewind: cross it; the queue is empty still.
            cross_skip(q, gets, head);
            continue;
        }
        let_go(locks->get);
        out->seen = seen;
        return ZP_WAIT;
    }
    int32_t n = 0, views = 0, crossed = 0;
    uint64_t filled = 0;
    uint32_t skipped = 0;
    const uint8_t *r = ring(q);
    while (n < max_records && head != tail) {
        uint32_t pos = head & q->mask, size = rd32(r + pos);
        if (q->warm && r[pos + 4] == ZP_TYPE_SKIP) {
            if (size != q->capacity - pos || size > tail - head) {
                st64(u64(q, ZP_OFF_HEAD), word(gets + (uint32_t)n, tail));
                let_go(locks->get);
                corrupt(out, ZP_BAD_SKIP, size, pos);
                out->n = n, out->filled = filled, out->views = views;
                return ZP_CORRUPT;
            }
            skipped = head, crossed = 1;
            head += size; // to the next lap: no message
            continue;
        }
        if (size < ZP_RECORD_HEADER || size % 8 != 0 || size > tail - head || pos % 8 != 0) {
            // A record that cannot be one: drop everything up to the tail
            // rather than read out of bounds.
            st64(u64(q, ZP_OFF_HEAD), word(gets + (uint32_t)n, tail));
            let_go(locks->get);
            corrupt(out, ZP_BAD_RECORD, size, pos);
            out->n = n, out->filled = filled, out->views = views;
            return ZP_CORRUPT;
        }
        uint16_t ndesc;
        memcpy(&ndesc, r + pos + 6, sizeof ndesc);
        int32_t need = zp_views(r[pos + 4], ndesc);
        if (flags & ZP_PLAIN && n == 0) {
            // The header's second half may be past the end of the ring:
            // records wrap.
            uint8_t header[ZP_RECORD_HEADER];
            memcpy(header, r + pos, 8);
            memcpy(header + 8, r + ((pos + 8) & q->mask), 8);
            if (!plain(header, size)) {
                let_go(locks->get);
                out->need = size, out->need_views = (uint32_t)need;
                return ZP_RANGE;
            }
        }
        if (filled + size > cap || views + need > max_views) {
            if (n == 0) {
                let_go(locks->get);
                out->need = size, out->need_views = (uint32_t)need;
                return ZP_RANGE;
            }
            break;
        }
        read_record(q, head, size, buf + filled);
        if (flags & ZP_PLAIN && n == 0 && !plain(buf, size)) {
            // Rewritten while it was copied, by another process of the
            // user: the caller reads the copy, which is what must be plain.
            // It is left (not committed) for a get that decodes its copy.
            let_go(locks->get);
            out->need = size, out->need_views = (uint32_t)need;
            return ZP_RANGE;
        }
        filled += size;
        views += need;
        head += size;
        n++;
    }
    st64(u64(q, ZP_OFF_HEAD), word(gets + (uint32_t)n, head)); // commit
    if (crossed) {
        give_back_skipped(q, skipped);
    }
    if (q->sparse) {
        give_back(q, head);
    }
    if (q->warm && n > 0 && head == tail) {
        rewind_ring(q, gets + (uint32_t)n, head, locks);
    }
    let_go(locks->get);
    out->n = n, out->filled = filled, out->views = views;
    if (count_of(ld64(u64(q, ZP_OFF_TAIL))) != gets + (uint32_t)n) {
        // Messages left behind: wake the next consumer (the cascade of a
        // put's single wake-up).
        zp_signal_word(u32(q, ZP_OFF_DATA_SEQ), u32(q, ZP_OFF_DATA_WAITERS), 1);
        zp_signal_word(u32(q, ZP_OFF_SPACE_SEQ), u32(q, ZP_OFF_SPACE_WAITERS), 1);
    } else {
        // Note [an empty queue wakes every space sleeper] in package queue.
        zp_signal_word(u32(q, ZP_OFF_SPACE_SEQ), u32(q, ZP_OFF_SPACE_WAITERS), 1 << 30);
    }
    return ZP_OK;
}

static int catch_up(const zp_queue *q, int32_t *moved) {
    uint32_t tail = pos_of(ld64(u64(q, ZP_OFF_TAIL)));
    uint64_t h = ld64(u64(q, ZP_OFF_HEAD));
    uint32_t gets = count_of(h), head = pos_of(h), before = ld32(u32(q, ZP_OFF_GIVEN_BACK));
    *moved = 0;
    if (!sound(q, head, tail)) {
        return ZP_OK; // the put that called reports it
    }
    if (head != tail && skip_at(q, head) && q->capacity - (head & q->mask) <= tail - head) {
        // A skip the consumers have not come to: it is no message.
        head = cross_skip(q, gets, head);
    }
    give_back(q, head);
    *moved = ld32(u32(q, ZP_OFF_GIVEN_BACK)) != before || ld64(u64(q, ZP_OFF_HEAD)) != h;
    return ZP_OK;
}

// -- sleeps armed outside (zct_sleep) ------------------------------------

static const int wait_words[3][2] = {{ZP_OFF_DATA_SEQ, ZP_OFF_DATA_WAITERS},
                                     {ZP_OFF_SPACE_SEQ, ZP_OFF_SPACE_WAITERS},
                                     {ZP_OFF_JOIN_SEQ, ZP_OFF_JOIN_WAITERS}};

static int arm(const zp_queue *q, int32_t which, uint32_t **word, uint32_t *seen) {
    uint32_t *w = u32(q, wait_words[which][0]);
    zp_count_sleeper(u32(q, wait_words[which][1]), NULL);
    *word = w;
    *seen = ld32(w);
    return ZP_OK;
}

static int disarm(const zp_queue *q, int32_t which, int32_t pass_on) {
    zp_uncount_sleepers(u32(q, wait_words[which][1]), NULL, 1);
    if (pass_on && which == 0 && count_of(ld64(u64(q, ZP_OFF_TAIL))) != count_of(ld64(u64(q, ZP_OFF_HEAD)))) {
        zp_signal_word(u32(q, ZP_OFF_DATA_SEQ), u32(q, ZP_OFF_DATA_WAITERS), 1);
    }
    return ZP_OK;
}

static int unarm(const zp_queue *q, int32_t which, uint32_t n) {
    zp_uncount_sleepers(u32(q, wait_words[which][1]), NULL, n);
    return ZP_OK;
}

// -- the guarded entry points ---------------------------------------------

// let_go_after_fault lets go of the locks a step that faulted held (Note [a
// step that faults lets its locks go]); a lock whose word faults too is
// gone with its file.
static void let_go_after_fault(zp_guard *g) {
    for (int i = 0; i < 2; i++) {
        if (g->held[i] != NULL) {
            zp_unlock(g->held[i]);
        }
    }
}

// GUARDED runs call with the fault guard armed: ZP_FAULT after a SIGBUS,
// with out's address set (when out is given) and the locks the step noted
// in g.held let go (none for a step that holds no lock).
#define GUARDED(out, call)                                                                                             \
    do {                                                                                                               \
        zp_guard g;                                                                                                    \
        zp_guard_arm(&g);                                                                                              \
        if (sigsetjmp(g.jb, 0)) {                                                                                      \
            zp_guard_disarm(&g);                                                                                       \
            if ((out) != NULL) {                                                                                       \
                ((zp_out *)(out))->addr = g.addr;                                                                      \
            }                                                                                                          \
            let_go_after_fault(&g);                                                                                    \
            return ZP_FAULT;                                                                                           \
        }                                                                                                              \
        int r_ = (call);                                                                                               \
        zp_guard_disarm(&g);                                                                                           \
        return r_;                                                                                                     \
    } while (0)

int zp_arm(const zp_queue *q, int32_t which, uint32_t **word, uint32_t *seen) {
    if (which < 0 || which > 2) {
        return ZP_RANGE;
    }
    GUARDED(NULL, arm(q, which, word, seen));
}

int zp_disarm(const zp_queue *q, int32_t which, int32_t pass_on) {
    if (which < 0 || which > 2) {
        return ZP_RANGE;
    }
    GUARDED(NULL, disarm(q, which, pass_on));
}

int zp_unarm(const zp_queue *q, int32_t which, uint32_t n) {
    if (which < 0 || which > 2) {
        return ZP_RANGE;
    }
    GUARDED(NULL, unarm(q, which, n));
}

int zp_put(const zp_queue *q, const zp_record *recs, int32_t n, int32_t flags, zp_out *out) {
    out->n = 0, out->what = 0;
    if (n <= 0) {
        return ZP_OK;
    }
    for (int32_t i = 0; i < n; i++) {
        for (int32_t j = 0; j < recs[i].nsends; j++) {
            if (!zp_send_ok(&recs[i].sends[j])) {
                return ZP_RANGE;
            }
        }
    }
    GUARDED(out, put(q, recs, n, flags, out, &(held){&g.held[0], &g.held[1]}));
}

int zp_put1(const zp_queue *q, const void *prefix, uint32_t prefix_len, const void *payload, uint64_t payload_len,
            uint32_t size, const zp_send *sends, int32_t nsends, int32_t flags, zp_out *out) {
    zp_record rec = {prefix, payload, payload_len, prefix_len, size, sends, nsends};
    return zp_put(q, &rec, 1, flags, out);
}

int zp_get(const zp_queue *q, void *buf, uint64_t cap, int32_t max_records, int32_t max_views, int32_t flags,
           zp_out *out) {
    out->n = 0, out->filled = 0, out->views = 0;
    GUARDED(out, get(q, buf, cap, max_records, max_views, flags, out, &(held){&g.held[0], &g.held[1]}));
}

int zp_catch_up(const zp_queue *q, int32_t *moved, zp_out *out) {
    *moved = 0;
    GUARDED(out, catch_up(q, moved));
}

static int locked(uint32_t *lock, uint32_t pid, uint64_t start) {
    return try_lock(lock, pid, start, NULL) ? ZP_OK : ZP_BUSY;
}

static int unlocked(uint32_t *lock) {
    unlock(lock);
    return ZP_OK;
}

static int signalled(uint32_t *word, uint32_t *waiters, int32_t n) {
    zp_signal_word(word, waiters, n);
    return ZP_OK;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// spin_hint is the processor's spin-wait hint: it lets a sibling hardware
// thread run, and saves power, between looks.
static inline void spin_hint(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// polled is zp_spin's poll: the clock is read every POLLS_PER_CLOCK looks.
#define POLLS_PER_CLOCK 256
static int polled(const uint32_t *word, uint32_t seen, int64_t spin_ns) {
    int64_t now = now_ns();
    int64_t until = spin_ns > INT64_MAX - now ? INT64_MAX : now + spin_ns;
    for (uint32_t i = 1;; i++) {
        if (ld32(word) != seen) {
            return ZP_OK;
        }
        spin_hint();
        if (i % POLLS_PER_CLOCK == 0 && now_ns() > until) {
            return ZP_WAIT;
        }
    }
}

// spun is zp_spin's look: the clock is read only once the spin has gone
// on past its first looks.
static int spun(const uint32_t *word, uint32_t seen, int64_t spin_ns, int32_t poll) {
    if (poll) {
        return polled(word, seen, spin_ns);
    }
    int64_t until = 0;
    for (int i = 0;; i++) {
        if (ld32(word) != seen) {
            return ZP_OK;
        }
        if (i >= 64) {
            // Give the CPU to whoever will change the word, when it waits
            // for one (more processes than cores); else this returns at once.
            sched_yield();
            if (i % 8 == 7) {
                int64_t now = now_ns();
                if (until == 0) {
                    until = now + spin_ns;
                } else if (now > until) {
                    return ZP_WAIT;
                }
            }
        }
    }
}

int zp_spin(const uint32_t *word, uint32_t seen, int64_t spin_ns, int32_t poll) {
    GUARDED(NULL, spun(word, seen, spin_ns, poll));
}

int zp_try_lock(uint32_t *lock, uint32_t pid, uint64_t start) { GUARDED(NULL, locked(lock, pid, start)); }

int zp_unlock(uint32_t *lock) { GUARDED(NULL, unlocked(lock)); }

int zp_signal(uint32_t *word, uint32_t *waiters, int32_t n) { GUARDED(NULL, signalled(word, waiters, n)); }

static int sleepers(int32_t op, uint32_t *waiters, uint32_t *mine, uint32_t n) {
    switch (op) {
    case ZP_COUNT:
        zp_count_sleeper(waiters, mine);
        break;
    case ZP_UNCOUNT:
        zp_uncount_sleepers(waiters, mine, n);
        break;
    case ZP_TAKE_BACK:
        zp_take_back_sleepers(waiters, mine);
        break;
    default:
        return ZP_RANGE;
    }
    return ZP_OK;
}

int zp_sleepers(int32_t op, uint32_t *waiters, uint32_t *mine, uint32_t n) {
    if (op == ZP_TAKE_BACK && mine == NULL) {
        return ZP_RANGE;
    }
    GUARDED(NULL, sleepers(op, waiters, mine, n));
}

int zp_guarded(int (*step)(void *), void *arg, zp_out *out) { GUARDED(out, step(arg)); }
