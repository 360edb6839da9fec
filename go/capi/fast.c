// The calls that run without entering Go (Note [a data plane the runtime
// never enters] in package plane): a queue's put of a plain record or of
// an inline array, its take of either (waiting as the default policy does,
// or polling), arming and disarming a sleep; a stream reader's look and
// release, and its arm and disarm; a stream writer's claim and publish.
// Each runs the data plane's step on the queue, reader or writer its
// handle names here; whatever that step cannot finish (a wait of another
// policy, a record with views, an error to report in full) goes to the
// export in Go (zctipc_go_*), which runs the same step again.
//
// Threat model: any code in the process may call with any handle. A handle
// is looked up in a table of this file, which Go fills when it opens a
// queue, reader or writer and empties before it closes one, waiting until
// no call here holds it: a stale or forged handle finds nothing (Go then
// says ZCT_E_CLOSED), and what it named is never let go while a step runs
// on it.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "_cgo_export.h"
#include "internal.h"
#include "plane.h"

// SLOTS bounds the queues open at once that take the fast way; the others
// take Go's. A handle's slots are the PROBE after its hash.
#define SLOTS 1024
#define PROBE 16
#define SEQ __ATOMIC_SEQ_CST
// MAX_INLINE bounds the inline arrays the plane puts: package queue's
// MaxCapacity, the largest record of any queue.
#define MAX_INLINE (1u << 30)

typedef struct slot {
    uint64_t handle;  // 0: free; UINT64_MAX: being claimed or closed
    int32_t users;    // calls here that hold the queue, the reader or the writer
    int32_t armed[3]; // sleeps armed through this handle (a queue's ZCT_WAIT_*, a reader's 0) not taken back
    int32_t waits;    // how the handle's calls wait (ZCT_FAST_*, internal.h): here, or in Go
    int64_t asked;    // a writer's: when its look last went to Go for the dead (now_ns), under its busy word
    uint64_t asked_next; // and the frame it found no room for then (its next)
    const zp_queue *q; // a queue's handle
    zp_reader *r;      // or a stream reader's
    zp_writer *w;      // or a stream writer's
} slot;

static slot slots[SLOTS];
static int poisoned;

static uint32_t hash(uint64_t h) { return (uint32_t)((h * 0x9E3779B97F4A7C15ull) >> 54); }

// enter puts the queue q, the stream reader r or the stream writer w (one
// of them) in the table under handle h.
static void enter(uint64_t h, const zp_queue *q, zp_reader *r, zp_writer *w) {
    for (uint32_t i = 0; i < PROBE; i++) {
        slot *s = &slots[(hash(h) + i) % SLOTS];
        uint64_t free = 0;
        if (__atomic_load_n(&s->users, SEQ) != 0) {
            continue;
        }
        // Claimed with a marker first, so that no lookup sees h before q.
        if (__atomic_compare_exchange_n(&s->handle, &free, UINT64_MAX, 0, SEQ, SEQ)) {
            s->q = q;
            s->r = r;
            s->w = w;
            memset(s->armed, 0, sizeof s->armed);
            s->waits = ZCT_FAST_SLEEP;
            s->asked = 0;
            s->asked_next = 0;
            __atomic_store_n(&s->handle, h, SEQ);
            return;
        }
    }
    // Every slot taken: this handle's calls go through Go.
}

ZCT_HIDDEN void zct_fast_register(uint64_t h, void *q) { enter(h, q, NULL, NULL); }

ZCT_HIDDEN void zct_fast_register_reader(uint64_t h, void *r) { enter(h, NULL, r, NULL); }

ZCT_HIDDEN void zct_fast_register_writer(uint64_t h, void *w) { enter(h, NULL, NULL, w); }

// acquire returns the slot of handle h, holding it, or NULL.
static slot *acquire_any(uint64_t h) {
    if (h == 0 || h == UINT64_MAX || __atomic_load_n(&poisoned, SEQ)) {
        return NULL;
    }
    for (uint32_t i = 0; i < PROBE; i++) {
        slot *s = &slots[(hash(h) + i) % SLOTS];
        if (__atomic_load_n(&s->handle, SEQ) != h) {
            continue;
        }
        __atomic_add_fetch(&s->users, 1, SEQ);
        if (__atomic_load_n(&s->handle, SEQ) == h) {
            return s;
        }
        __atomic_sub_fetch(&s->users, 1, SEQ);
        return NULL;
    }
    return NULL;
}

static void release(slot *s) { __atomic_sub_fetch(&s->users, 1, SEQ); }

// acquire returns the slot of queue handle h, holding it, or NULL (a
// stream endpoint's handle among them); acquire_reader, of reader handle
// h; acquire_writer, of writer handle h.
static slot *acquire(uint64_t h) {
    slot *s = acquire_any(h);
    if (s != NULL && s->q == NULL) {
        release(s);
        return NULL;
    }
    return s;
}

static slot *acquire_reader(uint64_t h) {
    slot *s = acquire_any(h);
    if (s != NULL && s->r == NULL) {
        release(s);
        return NULL;
    }
    return s;
}

static slot *acquire_writer(uint64_t h) {
    slot *s = acquire_any(h);
    if (s != NULL && s->w == NULL) {
        release(s);
        return NULL;
    }
    return s;
}

// Note [an arm is the handle's once counted]: an arm counts its sleeper on
// the word (and a reader's in its slot) first, and only then in its
// handle's armed, which any thread's disarm on the handle takes from (arms
// are counted, not owned). Counted in armed first, a disarm on another
// thread could take it back while the sleeper was half counted: it took
// from the slot's count before the arm had added to it, left the word's
// alone, and the arm then left one sleeper too many on the word. A close
// waits for the calls that hold the handle, so it still takes back an arm
// that counts itself last.

// zct_fast_unregister takes handle h out of the table, waits until no call
// here holds its queue, reader or writer, and takes back the sleeps armed
// through it.
ZCT_HIDDEN void zct_fast_unregister(uint64_t h) {
    for (uint32_t i = 0; i < PROBE; i++) {
        slot *s = &slots[(hash(h) + i) % SLOTS];
        if (__atomic_load_n(&s->handle, SEQ) != h) {
            continue;
        }
        __atomic_store_n(&s->handle, UINT64_MAX, SEQ);
        // Takes and looks waiting here look again, see the close and leave
        // (a spurious wake-up to the sleepers of other processes).
        if (s->q != NULL) {
            zp_signal((uint32_t *)(s->q->data + ZP_OFF_DATA_SEQ), (uint32_t *)(s->q->data + ZP_OFF_DATA_WAITERS),
                      1 << 30);
        } else if (s->r != NULL) {
            zp_signal((uint32_t *)(s->r->data + ZP_STREAM_DATA_SEQ),
                      (uint32_t *)(s->r->data + ZP_STREAM_DATA_WAITERS), 1 << 30);
        } // a writer's steps here never wait
        while (__atomic_load_n(&s->users, SEQ) != 0) {
            sched_yield(); // steps never wait, and waits here end at once: this is short
        }
        for (int w = 0; w < 3 && s->w == NULL; w++) {
            int32_t n = __atomic_exchange_n(&s->armed[w], 0, SEQ);
            zp_out out = {0};
            if (n > 0 && s->q != NULL) {
                zp_unarm(s->q, w, (uint32_t)n); // a shrunk file: nothing to take back
            } else if (n > 0) {
                zp_read_disarm(s->r, (uint32_t)n, &out); // likewise
            }
        }
        s->q = NULL;
        s->r = NULL;
        s->w = NULL;
        __atomic_store_n(&s->handle, 0, SEQ);
        return;
    }
}

ZCT_HIDDEN void zct_fast_poison(void) { __atomic_store_n(&poisoned, 1, SEQ); }

// zct_fast_set_wait says how handle h waits (zct_queue_set_wait): here,
// sleeping as the default policy or polling for ever; or as another policy
// of Go's, in Go.
ZCT_HIDDEN void zct_fast_set_wait(uint64_t h, int32_t waits) {
    slot *s = acquire_any(h);
    if (s != NULL) {
        __atomic_store_n(&s->waits, waits, SEQ);
        release(s);
    }
}

// -- waiting for a message ---------------------------------------------------

#define SPIN_NS 50000           // futex.Sleeping: a message within it costs no wake-up
#define RECHECK_NS 1000000000LL // package queue's recheckEvery
#define STREAM_RECHECK_NS 100000000LL // package stream's recheckEvery

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// deadline_of returns the clock's time timeout_ms from now, or 0 (for ever)
// for a timeout that is not positive or too long to add to the clock, as
// Go's waits take it (zctipc.h, zct_queue_put).
static int64_t deadline_of(int64_t timeout_ms) {
    if (timeout_ms <= 0) {
        return 0;
    }
    int64_t now = now_ns();
    if (timeout_ms > (INT64_MAX - now) / 1000000LL) {
        return 0;
    }
    return now + timeout_ms * 1000000LL;
}

// put_one puts one record of type typ with no descriptor, in one try: its
// header is written into the first ZP_RECORD_HEADER bytes of prefix, whose
// head bytes after them begin the payload, and payload (length bytes)
// ends it. A catch-up is Go's: it waits for a lock.
static int put_one(slot *s, int32_t type, uint8_t *prefix, uint32_t head, const void *payload, uint64_t length) {
    uint32_t plen = (uint32_t)(head + length);
    uint32_t size = (ZP_RECORD_HEADER + plen + 7) & ~7u;
    memcpy(prefix, &size, 4);
    prefix[4] = (uint8_t)type;
    memcpy(prefix + 8, &plen, 4);
    zp_record rec = {prefix, payload, length, ZP_RECORD_HEADER + head, size};
    zp_out out = {0};
    return zp_put(s->q, &rec, 1, ZP_LET_GO, &out);
}

int zct_queue_put(zct_handle h, int32_t type, const void *payload, uint64_t length, const zct_view *views,
                  int32_t nviews, int64_t timeout_ms) {
    if (nviews == 0 && (type == ZCT_RECORD_PICKLE || type == ZCT_RECORD_BYTES) && (payload != NULL || length == 0) &&
        length <= UINT32_MAX - 2 * ZP_RECORD_HEADER) {
        slot *s = acquire(h);
        if (s != NULL) {
            uint8_t header[ZP_RECORD_HEADER] = {0};
            int r = put_one(s, type, header, 0, payload, length);
            release(s);
            if (r == ZP_OK) {
                return ZCT_OK;
            }
            if (r == ZP_WAIT && timeout_ms == 0) {
                zct_set_last_error("queue is full", 13, 0);
                return ZCT_E_FULL;
            }
        }
    }
    return zctipc_go_queue_put(h, type, (zct_cvoid *)payload, length, (zct_cview *)views, nviews, timeout_ms);
}

ZCT_HIDDEN int zct_fast_put_prefix(uint64_t h, const uint8_t *prefix, uint32_t prefix_len, uint32_t size,
                                   const zp_send *sends, int32_t nsends, zp_out *out) {
    slot *s = acquire(h);
    if (s == NULL) {
        return -1;
    }
    zp_record rec = {prefix, NULL, 0, prefix_len, size, sends, nsends};
    int r = zp_put(s->q, &rec, 1, ZP_LET_GO, out);
    release(s);
    return r;
}

int zct_queue_put_inline(zct_handle h, const void *data, uint64_t nbytes, int32_t dtype, int32_t ndim,
                         const int64_t *shape, int32_t flags, int64_t timeout_ms) {
    // What the plane may not put (a bad argument, a record past 1 GiB) goes
    // to Go, which says why.
    if (ndim >= 0 && ndim <= ZP_MAX_NDIM && flags >= 0 && flags <= 7 && dtype >= 0 && (nbytes == 0 || data != NULL) &&
        (ndim == 0 || shape != NULL) && nbytes <= MAX_INLINE &&
        zp_inline_check((uint32_t)dtype, (uint32_t)flags, (uint32_t)ndim, shape, nbytes) == ZP_OK) {
        slot *s = acquire(h);
        if (s != NULL) {
            uint8_t prefix[ZP_RECORD_HEADER + ZP_INLINE_HEADER + 8 * ZP_MAX_NDIM] = {0};
            uint32_t head = zp_inline_head(prefix + ZP_RECORD_HEADER, (uint16_t)dtype, (uint8_t)flags, (uint8_t)ndim, shape);
            int r = put_one(s, ZCT_RECORD_INLINE, prefix, head, data, nbytes);
            release(s);
            if (r == ZP_OK) {
                return ZCT_OK;
            }
            if (r == ZP_WAIT && timeout_ms == 0) {
                zct_set_last_error("queue is full", 13, 0);
                return ZCT_E_FULL;
            }
        }
    }
    return zctipc_go_queue_put_inline(h, (zct_cvoid *)data, nbytes, dtype, ndim, (zct_cint64 *)shape, flags, timeout_ms);
}

// FALLBACK: what a call here cannot finish goes to Go.
#define FALLBACK INT64_MIN

// zct_faulted says that shared memory faulted in a step that changed what
// this file or handoff.c holds (an arm taken back, a frame let go of, a
// count moved): Go cannot run it again, so it is said here, as Go says it.
ZCT_HIDDEN int zct_faulted(void) {
    static const char msg[] = "shared memory faulted: another process shrank a segment file this process maps";
    zct_set_last_error(msg, sizeof msg - 1, 0);
    return ZCT_E_CORRUPT;
}

static int64_t corrupt_status(const zp_out *out) {
    // What the step met is gone from the queue: say it here.
    char msg[160];
    uint32_t a = out->need, b = out->need_views;
    int n = out->what == ZP_BAD_POSITIONS
                ? snprintf(msg, sizeof msg, "queue: header is corrupt: head %u and tail %u", a, b)
                : snprintf(msg, sizeof msg, "queue: header is corrupt: a %s of %u bytes at %u",
                           out->what == ZP_BAD_SKIP ? "skip" : "record", a, b);
    zct_set_last_error(msg, n > 0 ? (size_t)n : 0, 0);
    return ZCT_E_CORRUPT;
}

// take_inline reads the inline array of the record rec (its payload plen
// bytes) into the view views[0], as Go's take gives it (a view with no
// ref, ZCT_REF_INLINE, whose offset is from the start of the get's
// buffer), and returns result; or the status of one whose array breaks
// the rules, which is gone from the queue as Go's take leaves it.
static int64_t take_inline(const uint8_t *rec, uint32_t plen, zct_view *views, int64_t result) {
    zp_inline in;
    int bad = zp_inline_read(rec + ZP_RECORD_HEADER, plen, &in);
    if (bad != ZP_OK) {
        // Said as Go's take says it (package message): the record is gone
        // from the queue, so Go could not.
        char msg[160];
        int n = bad == ZP_BAD_INLINE_HEADER
                    ? snprintf(msg, sizeof msg, "malformed message: an inline array header (ndim %u, flags %#x)",
                               (unsigned)in.ndim, (unsigned)in.flags)
                : bad == ZP_BAD_INLINE_DTYPE
                    ? snprintf(msg, sizeof msg, "malformed message: dtype code %u: unsupported dtype", (unsigned)in.dtype)
                : bad == ZP_BAD_INLINE_SHAPE
                    ? snprintf(msg, sizeof msg, "malformed message: negative shape in an inline array")
                    : snprintf(msg, sizeof msg, "malformed message: an inline array of %u dimensions holds %llu bytes of elements",
                               (unsigned)in.ndim, (unsigned long long)in.nbytes);
        zct_set_last_error(msg, n > 0 ? (size_t)n : 0, 0);
        return ZCT_E_CORRUPT;
    }
    zct_view *v = &views[0];
    memset(v, 0, sizeof *v);
    v->offset = ZP_RECORD_HEADER + in.at;
    v->data = (void *)(rec + v->offset);
    v->nbytes = in.nbytes;
    uint64_t step = zp_dtype_sizes[in.dtype]; // unsigned: an empty array's others may make it wrap, as Go's do
    for (int i = in.ndim - 1; i >= 0; i--) {   // C order
        v->shape[i] = in.shape[i];
        v->strides[i] = (int64_t)step;
        step *= in.shape[i] > 1 ? (uint64_t)in.shape[i] : 1;
    }
    v->dtype = in.dtype;
    v->ndim = in.ndim;
    v->kind = ZCT_REF_INLINE;
    v->flags = in.flags;
    return result;
}

// waiting is a wait as the default policy waits (a spin, then a sleep on
// a sequence word among its sleepers), or as the policy that polls for
// ever: what a queue's take and a stream reader's look share. look runs
// the step once: a status or a result to return, FALLBACK, or AGAIN with
// *seen the word's value to sleep on; arm counts the caller among the
// word's sleepers (ZP_OK, else Go waits), and disarm takes that back when
// the wait ends with result.
typedef struct waiting {
    slot *s;
    uint64_t h;         // the handle, whose close ends the wait: Go says so
    uint32_t *word;     // the sequence word that the step's other side bumps
    int64_t recheck_ns; // a sleep's longest: wake-ups lost with killed processes are made up for
    const char *empty;  // what a wait that found nothing says
    int64_t (*look)(void *ctx, uint32_t *seen);
    int (*arm)(void *ctx);
    void (*disarm)(void *ctx, int64_t result);
    void *ctx;
} waiting;

#define AGAIN (INT64_MIN + 1)

// wait_for runs w's step until it finds something or timeout_ms passes
// (for ever when negative): its result, ZCT_E_EMPTY, ZCT_E_INTERRUPTED, or
// FALLBACK (*left_ms then says how much of the timeout is left for Go).
static int64_t wait_for(const waiting *w, int64_t timeout_ms, int64_t *left_ms) {
    int64_t deadline = deadline_of(timeout_ms);
    int asleep = 0; // counted among the word's sleepers
    int64_t result;
    for (;;) {
        uint32_t seen = 0;
        result = w->look(w->ctx, &seen);
        if (result != AGAIN) {
            break;
        }
        int64_t ns = w->recheck_ns, left = 1;
        if (deadline != 0) {
            left = deadline - now_ns();
            ns = left < ns ? left : ns;
        }
        if (timeout_ms == 0 || left <= 0) {
            zct_set_last_error(w->empty, strlen(w->empty), 0);
            result = ZCT_E_EMPTY;
            break;
        }
        int32_t waits = __atomic_load_n(&w->s->waits, SEQ);
        if (waits == ZCT_FAST_GO || __atomic_load_n(&w->s->handle, SEQ) != w->h) {
            result = FALLBACK; // another policy's wait, or a closed handle: Go's
            break;
        }
        if (waits == ZCT_FAST_POLL && !asleep) {
            zp_spin(w->word, seen, ns, 1); // moved, faulted or not: the step says which
            continue;
        }
        if (!asleep) {
            if (zp_spin(w->word, seen, SPIN_NS, 0) != ZP_WAIT) { // moved, or faulted: the step says which
                continue;
            }
            if (w->arm(w->ctx) != ZP_OK) { // a shrunk file: Go says so
                result = FALLBACK;
                break;
            }
            asleep = 1;
            continue; // look again now that the other side wakes this one
        }
        struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
        long k = syscall(SYS_futex, w->word, FUTEX_WAIT, seen, &ts, NULL, 0);
        if (k != 0 && errno == EINTR) {
            zct_set_last_error("interrupted by a signal", 23, EINTR);
            result = ZCT_E_INTERRUPTED;
            break;
        }
        if (k != 0 && errno == EFAULT) {
            result = FALLBACK;
            break;
        }
    }
    if (asleep) {
        w->disarm(w->ctx, result);
    }
    if (result == FALLBACK && deadline != 0) {
        // Rounded up, so that Go's wait ends at the deadline or within a
        // millisecond after it, never before: rounded down, the last part
        // of a millisecond left was a timeout of 0, which does not wait
        // (a take of 1 ms on a handle whose policy waits in Go returned
        // empty at once).
        int64_t left = deadline - now_ns();
        *left_ms = left > 0 ? (left + 999999) / 1000000LL : 0;
    }
    return result;
}

// A take of a plain record: the queue, and where the record and its view go.
typedef struct taking {
    const zp_queue *q;
    void *buf;
    uint64_t capacity;
    zct_view *views;
    int32_t views_cap;
    int32_t *nviews;
} taking;

static int64_t take_look(void *ctx, uint32_t *seen) {
    taking *t = ctx;
    zp_out out = {0};
    int r = zp_get(t->q, t->buf, t->capacity, 1, t->views_cap > 0 ? 1 : 0, ZP_PLAIN, &out);
    if (r == ZP_OK) {
        const uint8_t *rec = t->buf;
        uint32_t plen;
        memcpy(&plen, rec + 8, 4);
        int64_t result = (int64_t)((uint64_t)plen | (uint64_t)ZP_RECORD_HEADER << ZCT_TAKE_OFFSET_SHIFT |
                                   (uint64_t)rec[4] << ZCT_TAKE_TYPE_SHIFT);
        *t->nviews = 0;
        if (rec[4] == ZCT_RECORD_INLINE) {
            result = take_inline(rec, plen, t->views, result);
            *t->nviews = result >= 0;
        }
        return result;
    }
    if (r == ZP_RANGE && t->views_cap > 0) {
        // Not plain, or not room for it: a record with views is taken
        // whole, then adopted here when it can be, or by Go (handoff.c).
        // One that does not fit is left, for Go to say so.
        memset(&out, 0, sizeof out);
        r = zp_get(t->q, t->buf, t->capacity, 1, t->views_cap, 0, &out);
        if (r == ZP_OK) {
            return zct_fast_adopt(t->buf, (uint32_t)out.filled, t->views, t->views_cap, t->nviews);
        }
    }
    if (r == ZP_CORRUPT) {
        return corrupt_status(&out);
    }
    *seen = out.seen;
    return r == ZP_WAIT ? AGAIN : FALLBACK;
}

static int take_arm(void *ctx) {
    uint32_t *unused, seen;
    return zp_arm(((taking *)ctx)->q, ZCT_WAIT_DATA, &unused, &seen);
}

static void take_disarm(void *ctx, int64_t result) {
    // A put wakes one sleeper; one that leaves without a message passes
    // the wake-up on.
    zp_disarm(((taking *)ctx)->q, ZCT_WAIT_DATA, result < 0);
}

int64_t zct_queue_take(zct_handle h, void *buf, uint64_t capacity, int64_t timeout_ms, zct_view *views,
                       int32_t views_cap, int32_t *nviews) {
    if (buf != NULL && nviews != NULL && views_cap >= 0 && (views_cap == 0 || views != NULL)) {
        slot *s = acquire(h);
        if (s != NULL) {
            int64_t left = timeout_ms;
            taking t = {s->q, buf, capacity, views, views_cap, nviews};
            waiting w = {s, h, (uint32_t *)(s->q->data + ZP_OFF_DATA_SEQ), RECHECK_NS, "queue is empty",
                         take_look, take_arm, take_disarm, &t};
            int64_t r = wait_for(&w, timeout_ms, &left);
            release(s);
            if (r != FALLBACK) {
                return r;
            }
            timeout_ms = left;
        }
    }
    return zctipc_go_queue_take(h, buf, capacity, timeout_ms, views, views_cap, nviews);
}

int zct_queue_arm(zct_handle h, int32_t which, uint32_t **word, uint32_t *seen) {
    if (which >= 0 && which < 3 && word != NULL && seen != NULL) {
        slot *s = acquire(h);
        if (s != NULL) {
            int r = zp_arm(s->q, which, word, seen);
            if (r == ZP_OK) {
                __atomic_add_fetch(&s->armed[which], 1, SEQ); // once counted (Note [an arm is the handle's once counted])
            }
            release(s);
            if (r == ZP_OK) {
                return ZCT_OK;
            }
        }
    }
    return zctipc_go_queue_arm(h, which, word, seen);
}

int zct_queue_disarm(zct_handle h, int32_t which, int32_t pass_on) {
    if (which >= 0 && which < 3) {
        slot *s = acquire(h);
        if (s != NULL) {
            int32_t n = __atomic_load_n(&s->armed[which], SEQ);
            while (n > 0 && !__atomic_compare_exchange_n(&s->armed[which], &n, n - 1, 0, SEQ, SEQ)) {
            }
            int r = n > 0 ? zp_disarm(s->q, which, pass_on) : ZP_RANGE;
            release(s);
            if (n <= 0) {
                char msg[96];
                int k = snprintf(msg, sizeof msg, "queue wait word %d was not armed: invalid argument", which);
                zct_set_last_error(msg, k > 0 ? (size_t)k : 0, EINVAL);
                return ZCT_E_INVALID;
            }
            if (r == ZP_OK) {
                return ZCT_OK;
            }
            return zct_faulted(); // the arm is taken back from this handle, and Go's count never held it
        }
    }
    return zctipc_go_queue_disarm(h, which, pass_on);
}

// -- stream writers ----------------------------------------------------------

// A writer's claim and publish run here while the ring has room; a wait
// for room (which evicts the readers that died), an end, a corrupt table
// and a closed handle go to Go, which runs the same step again and says
// what it met. A look that does not wait, with no room, says so here
// unless a reader may be evicted (look_for_the_dead).

#define ASK_GO_NS 5000000000LL // a dead reader whose pid another process took is evicted this late

// look_for_the_dead says whether a writer's look that found no room and
// does not wait must go to Go, which evicts the readers that died: when
// the data plane suspects a reader, or Go last looked ASK_GO_NS ago (Note
// [a writer's look for the dead] in package plane); and, with a reader
// timeout, when the writer finds no room for a frame Go did not look for:
// Go counts a reader's time unseen from the moment it first learns that
// the writer waits for that frame (Note [waiting is alive] in package
// stream), so a look that did not tell it would evict a stopped reader up
// to a whole timeout late. Its caller holds the writer's busy word.
static int look_for_the_dead(slot *s) {
    int64_t now = now_ns();
    if (now - s->asked < ASK_GO_NS && (s->w->reader_timeout <= 0 || s->asked_next == s->w->next)) {
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        int32_t suspect = 1;
        zp_out out = {0};
        if (zp_write_suspects(s->w, (int64_t)wall.tv_sec * 1000000000LL + wall.tv_nsec, &suspect, &out) == ZP_OK &&
            !suspect) {
            return 0;
        }
    }
    s->asked = now;
    s->asked_next = s->w->next;
    return 1;
}

int zct_stream_write_look(zct_handle h, int64_t timeout_ms, int32_t *slot_out) {
    if (slot_out != NULL) {
        slot *s = acquire_writer(h);
        if (s != NULL) {
            int k = ZP_BUSY; // a call of Go's has it: Go waits for it
            int full = 0;
            if (zp_enter(&s->w->busy)) {
                zp_out out = {0};
                k = zp_write_look(s->w, slot_out, &out);
                full = k == ZP_WAIT && timeout_ms == 0 && !look_for_the_dead(s);
                zp_leave(&s->w->busy);
            }
            release(s);
            if (k == ZP_OK) {
                return ZCT_OK;
            }
            if (full) {
                static const char msg[] = "the stream's ring is full"; // as Go's (stream.ErrFull)
                zct_set_last_error(msg, sizeof msg - 1, 0);
                return ZCT_E_FULL;
            }
        }
    }
    return zctipc_go_stream_write_look(h, timeout_ms, slot_out);
}

int zct_stream_write_increment(zct_handle h) {
    slot *s = acquire_writer(h);
    if (s != NULL) {
        int k = ZP_BUSY;
        if (zp_enter(&s->w->busy)) {
            zp_out out = {0};
            k = zp_write_increment(s->w, &out);
            zp_leave(&s->w->busy);
        }
        release(s);
        if (k == ZP_OK) {
            return ZCT_OK;
        }
        if (k == ZP_FAULT) {
            return zct_faulted(); // the frame may be published: Go cannot run it again
        }
    }
    return zctipc_go_stream_write_increment(h);
}

// -- stream readers ----------------------------------------------------------

// A look of a stream reader's: the reader, and where the slot goes.
typedef struct looking {
    zp_reader *r;
    int32_t *slot;
} looking;

static int64_t look_look(void *ctx, uint32_t *seen) {
    looking *l = ctx;
    zp_out out = {0};
    int k = zp_read_look(l->r, l->slot, &out);
    *seen = out.seen;
    return k == ZP_OK ? ZCT_OK : k == ZP_WAIT ? AGAIN : FALLBACK; // an end, a rejoin, a fault: Go says it
}

static int look_arm(void *ctx) {
    uint32_t *unused, seen;
    zp_out out = {0};
    return zp_read_arm(((looking *)ctx)->r, &unused, &seen, &out);
}

static void look_disarm(void *ctx, int64_t result) {
    (void)result; // a publish wakes every sleeper: none passes a wake-up on
    zp_out out = {0};
    zp_read_disarm(((looking *)ctx)->r, 1, &out); // a shrunk file: nothing to take back
}

// look_waiting looks at the next frame of the reader in s (which the caller
// holds, and whose reader it entered), waiting as wait_for does.
static int64_t look_waiting(slot *s, uint64_t h, int64_t timeout_ms, int32_t *slot_out, int64_t *left_ms) {
    looking l = {s->r, slot_out};
    waiting w = {s, h, (uint32_t *)(s->r->data + ZP_STREAM_DATA_SEQ), STREAM_RECHECK_NS, "no frame to read yet",
                 look_look, look_arm, look_disarm, &l};
    return wait_for(&w, timeout_ms, left_ms);
}

int zct_stream_read_increment(zct_handle h, int32_t *whole) {
    if (whole != NULL) {
        slot *s = acquire_reader(h);
        if (s != NULL) {
            int k = ZP_NO_FRAME; // Go says why
            if (zp_enter(&s->r->busy)) {
                zp_out out = {0};
                k = zp_read_increment(s->r, whole, &out);
                zp_leave(&s->r->busy);
            }
            release(s);
            if (k == ZP_OK) {
                return ZCT_OK;
            }
            if (k == ZP_FAULT) {
                return zct_faulted();
            }
        }
    }
    return zctipc_go_stream_read_increment(h, whole);
}

// read_next is zct_stream_read_next, and with whole NULL zct_stream_read_look:
// the frame looked at let go of (next only), then a look that waits as
// wait_for does.
static int read_next(zct_handle h, int64_t timeout_ms, int32_t *slot_out, int32_t *whole) {
    slot *s = slot_out != NULL ? acquire_reader(h) : NULL;
    int incremented = 0;
    if (s != NULL) {
        int64_t r = FALLBACK, left = timeout_ms;
        if (zp_enter(&s->r->busy)) { // else a call of Go's has it: Go waits for it
            zp_out out = {0};
            if (whole != NULL) {
                *whole = 1;
            }
            if (whole != NULL && s->r->looking) {
                if (zp_read_increment(s->r, whole, &out) != ZP_OK) {
                    zp_leave(&s->r->busy);
                    release(s);
                    return zct_faulted();
                }
                incremented = 1;
            }
            r = look_waiting(s, h, timeout_ms, slot_out, &left);
            zp_leave(&s->r->busy);
        }
        release(s);
        if (r != FALLBACK) {
            return (int)r;
        }
        timeout_ms = left;
    }
    if (whole == NULL) {
        return zctipc_go_stream_read_look(h, timeout_ms, slot_out);
    }
    if (incremented) {
        // Note [the rest of a next in Go].
        int32_t released = *whole;
        int k = zctipc_go_stream_read_next(h, timeout_ms, slot_out, whole);
        *whole = *whole && released;
        return k;
    }
    return zctipc_go_stream_read_next(h, timeout_ms, slot_out, whole);
}

// Note [the rest of a next in Go]. A next whose release ran here and whose
// look goes to Go (a wait of another policy, an end, a rejoin) lets the
// reader go in between, and another thread's look or next may run then
// and leave the reader looking at the next frame. A look in Go handed that
// frame out a second time: two nexts, one frame. So the rest is Go's next,
// which first releases a frame looked at meanwhile, as this next would
// have had it come after the other thread's; *whole is 0 when either
// frame it released was not whole.

int zct_stream_read_look(zct_handle h, int64_t timeout_ms, int32_t *slot_out) {
    return read_next(h, timeout_ms, slot_out, NULL);
}

int zct_stream_read_next(zct_handle h, int64_t timeout_ms, int32_t *slot_out, int32_t *whole) {
    if (whole == NULL) {
        return zctipc_go_stream_read_next(h, timeout_ms, slot_out, whole); // Go says what is wrong
    }
    return read_next(h, timeout_ms, slot_out, whole);
}

// A reader's arm and disarm for a sleep outside the library (zct_sleep)
// count the sleeper on the stream's data word here; an arm or a disarm
// that meets a shrunk file goes to Go, or says so.

int zct_stream_reader_arm(zct_handle h, uint32_t **word, uint32_t *seen) {
    if (word != NULL && seen != NULL) {
        slot *s = acquire_reader(h);
        if (s != NULL) {
            zp_out out = {0};
            int r = zp_read_arm(s->r, word, seen, &out);
            if (r == ZP_OK) {
                __atomic_add_fetch(&s->armed[0], 1, SEQ); // once counted (Note [an arm is the handle's once counted])
            }
            release(s);
            if (r == ZP_OK) {
                return ZCT_OK;
            }
        }
    }
    return zctipc_go_stream_reader_arm(h, word, seen);
}

int zct_stream_reader_disarm(zct_handle h) {
    slot *s = acquire_reader(h);
    if (s == NULL) {
        return zctipc_go_stream_reader_disarm(h);
    }
    int32_t n = __atomic_load_n(&s->armed[0], SEQ);
    while (n > 0 && !__atomic_compare_exchange_n(&s->armed[0], &n, n - 1, 0, SEQ, SEQ)) {
    }
    zp_out out = {0};
    int r = n > 0 ? zp_read_disarm(s->r, 1, &out) : ZP_RANGE;
    release(s);
    if (n <= 0) {
        static const char msg[] = "the reader's wait word was not armed: invalid argument";
        zct_set_last_error(msg, sizeof msg - 1, EINVAL);
        return ZCT_E_INVALID;
    }
    return r == ZP_OK ? ZCT_OK : zct_faulted(); // the arm is taken back from this handle, and Go's count never held it
}
