// The steps of a stream's reader: looking at the next frame and letting it
// go (package stream's documentation describes the stream: frames in
// slots, the claim and the publish of the writer, readers that are evicted
// and rejoin). This file is that protocol for a reader, and the only copy
// of it: package stream's Reader runs these steps through cgo, and the C
// ABI's reader calls run them directly. What a step cannot finish (a wait,
// a rejoin) is the caller's. Words are read and written with sequentially
// consistent atomics, as Go's sync/atomic does.
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "plane.h"

#define SEQ __ATOMIC_SEQ_CST

static inline uint64_t *w64(uint8_t *p, int off) { return (uint64_t *)(p + off); }
static inline uint32_t *w32(uint8_t *p, int off) { return (uint32_t *)(p + off); }

int zp_reader_enter(zp_reader *r) {
    int32_t free = 0;
    return __atomic_compare_exchange_n(&r->busy, &free, 1, 0, SEQ, SEQ);
}

void zp_reader_leave(zp_reader *r) { __atomic_store_n(&r->busy, 0, SEQ); }

// seen notes that the reader is alive now (Note [waiting is alive] in
// package stream): the wall clock, as Go's time.Now().UnixNano().
static void seen(zp_reader *r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    __atomic_store_n((int64_t *)(r->slot + ZP_READER_SEEN), (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec, SEQ);
}

static void drop(zp_reader *r, uint64_t n) {
    __atomic_add_fetch(w64(r->slot, ZP_READER_DROPPED), n, SEQ);
    __atomic_add_fetch(w64(r->data, ZP_STREAM_DROPPED), n, SEQ);
}

typedef struct look_args {
    zp_reader *r;
    int32_t *slot;
    zp_out *out;
} look_args;

static int look(void *arg) {
    look_args *a = arg;
    zp_reader *r = a->r;
    if (r->looking) {
        *a->slot = r->at;
        return ZP_OK;
    }
    for (;;) {
        if (__atomic_load_n(w64(r->slot, ZP_READER_WORD), SEQ) != r->word) {
            return ZP_REJOIN;
        }
        // Frames older than a ring behind the writer's claim are gone.
        uint64_t claim = __atomic_load_n(w64(r->data, ZP_STREAM_CLAIM), SEQ);
        if (claim > r->pos + r->frames) {
            drop(r, claim - r->frames - r->pos);
            r->pos = claim - r->frames;
            __atomic_store_n(w64(r->slot, ZP_READER_POSITION), r->pos, SEQ);
        }
        uint32_t word = __atomic_load_n(w32(r->data, ZP_STREAM_DATA_SEQ), SEQ);
        if (r->pos < __atomic_load_n(w64(r->data, ZP_STREAM_PUBLISHED), SEQ)) {
            uint32_t at = __atomic_load_n(w32(r->data, (int)(r->table + 4 * (r->pos % r->frames))), SEQ);
            if (at >= r->frames) {
                a->out->need = at;
                return ZP_CORRUPT;
            }
            r->at = (int32_t)at;
            r->looking = 1;
            seen(r); // it holds this frame from now: a wait before does not count
            *a->slot = r->at;
            return ZP_OK;
        }
        if (__atomic_load_n(w32(r->data, ZP_STREAM_ENDED), SEQ) != 0) {
            // The writer may have published its last frames and ended
            // between the load of published above and this one: the end
            // comes after every publish, so a load now sees them.
            if (r->pos < __atomic_load_n(w64(r->data, ZP_STREAM_PUBLISHED), SEQ)) {
                continue;
            }
            return ZP_ENDED;
        }
        a->out->seen = word;
        return ZP_WAIT;
    }
}

int zp_read_look(zp_reader *r, int32_t *slot, zp_out *out) {
    look_args a = {r, slot, out};
    return zp_guarded(look, &a, out);
}

typedef struct increment_args {
    zp_reader *r;
    int32_t *whole;
} increment_args;

static int increment(void *arg) {
    increment_args *a = arg;
    zp_reader *r = a->r;
    if (!r->looking) {
        return ZP_NO_FRAME;
    }
    r->looking = 0;
    // Under Block the writer takes a frame's slot again only once every
    // live reader passed it, or, evicting this reader, to claim the frame a
    // ring ahead: either way the claim says so.
    int whole = __atomic_load_n(w64(r->data, ZP_STREAM_CLAIM), SEQ) <= r->pos + r->frames;
    if (whole) {
        __atomic_add_fetch(w64(r->slot, ZP_READER_RECEIVED), 1, SEQ);
    } else {
        drop(r, 1);
    }
    r->pos++;
    __atomic_store_n(w64(r->slot, ZP_READER_POSITION), r->pos, SEQ);
    seen(r);
    *a->whole = whole;
    uint64_t wanted = __atomic_load_n(w64(r->data, ZP_STREAM_WANTED), SEQ);
    if (wanted != 0 && r->pos >= wanted) {
        zp_signal_word(w32(r->data, ZP_STREAM_SPACE_SEQ), w32(r->data, ZP_STREAM_SPACE_WAITERS), 1);
    }
    return ZP_OK;
}

int zp_read_increment(zp_reader *r, int32_t *whole, zp_out *out) {
    increment_args a = {r, whole};
    return zp_guarded(increment, &a, out);
}
