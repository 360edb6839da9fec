// The steps of a stream's reader, looking at the next frame and letting it
// go, and of its writer, claiming a frame and publishing it (package
// stream's documentation describes the stream: frames in slots, the claim
// and the publish of the writer, readers that are evicted and rejoin).
// This file is that protocol, and the only copy of it: package stream's
// Reader and Writer run these steps through cgo, and the C ABI's calls run
// them directly. What a step cannot finish (a wait, a rejoin, an eviction)
// is the caller's. Words are read and written with sequentially
// consistent atomics, as Go's sync/atomic does.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "plane.h"

#define SEQ __ATOMIC_SEQ_CST

static inline uint64_t *w64(uint8_t *p, int off) { return (uint64_t *)(p + off); }
static inline uint32_t *w32(uint8_t *p, int off) { return (uint32_t *)(p + off); }

// Note [a call of Go's waits for the busy word]. A step of the C ABI's
// takes a reader or a writer by its busy word for one call, a reader's
// look for the whole of its wait; a call of Go's (Hold.Enter in package
// plane) waits for the word between tries. A thread that looks again and
// again, each look waiting a while (Python's waits, in slices of 50 ms),
// gives the word back for a few nanoseconds between two looks, which the
// tries of Go's almost never met: a set_wait or a stats call of another
// thread waited for tens of seconds. So a call of Go's that finds the word
// held says that it waits (ZP_BUSY_WANTED), a step here then does not take
// the word but goes to Go (which queues it behind that call), and a step
// that lets the word go leaves the mark for the call of Go's, which takes
// the word once the step in flight ends.
int zp_enter(int32_t *busy) {
    int32_t free = 0;
    return __atomic_compare_exchange_n(busy, &free, ZP_BUSY_HELD, 0, SEQ, SEQ);
}

void zp_leave(int32_t *busy) { __atomic_and_fetch(busy, ~ZP_BUSY_HELD, SEQ); }

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

typedef struct arm_args {
    const zp_reader *r;
    uint32_t **word;
    uint32_t *seen;
    uint32_t n;
} arm_args;

// A reader's sleepers are counted on the data word and in its slot
// (zp_count_sleeper's mine): a writer that evicts a dead reader, or a
// reader that takes its slot, takes back what the slot counts.
static int read_arm(void *arg) {
    arm_args *a = arg;
    zp_count_sleeper(w32(a->r->data, ZP_STREAM_DATA_WAITERS), w32(a->r->slot, ZP_READER_ARMED));
    *a->word = w32(a->r->data, ZP_STREAM_DATA_SEQ);
    *a->seen = __atomic_load_n(*a->word, SEQ);
    return ZP_OK;
}

int zp_read_arm(const zp_reader *r, uint32_t **word, uint32_t *seen, zp_out *out) {
    arm_args a = {r, word, seen, 0};
    return zp_guarded(read_arm, &a, out);
}

static int read_disarm(void *arg) {
    arm_args *a = arg;
    zp_uncount_sleepers(w32(a->r->data, ZP_STREAM_DATA_WAITERS), w32(a->r->slot, ZP_READER_ARMED), a->n);
    return ZP_OK;
}

int zp_read_disarm(const zp_reader *r, uint32_t n, zp_out *out) {
    arm_args a = {r, NULL, NULL, n};
    return zp_guarded(read_disarm, &a, out);
}

// -- the writer --------------------------------------------------------------

// slowest returns the lowest position of the live readers (the next frame
// when there is none).
static uint64_t slowest(const zp_writer *w) {
    uint64_t low = w->next;
    for (uint32_t i = 0; i < w->readers; i++) {
        uint8_t *slot = w->data + ZP_STREAM_READERS_AT + (uint64_t)i * ZP_READER_SIZE;
        if ((__atomic_load_n(w64(slot, ZP_READER_WORD), SEQ) & 3) == 1) { // active
            uint64_t pos = __atomic_load_n(w64(slot, ZP_READER_POSITION), SEQ);
            low = pos < low ? pos : low;
        }
    }
    return low;
}

typedef struct slowest_args {
    zp_writer *w;
    uint64_t *low;
} slowest_args;

static int read_slowest(void *arg) {
    slowest_args *a = arg;
    a->w->min_pos = slowest(a->w);
    *a->low = a->w->min_pos;
    return ZP_OK;
}

int zp_write_slowest(zp_writer *w, uint64_t *low, zp_out *out) {
    slowest_args a = {w, low};
    return zp_guarded(read_slowest, &a, out);
}

// Note [a writer's look for the dead]. A writer that waits for room looks
// now and then for readers to evict: those that died without a word, and,
// with a reader timeout, those not seen for that long. Package stream's
// look (evictStale) tells a dead reader by its pid and start time, in Go;
// but each call into Go after an idle spell wakes the runtime's monitor
// thread, some sixty times under load, so a writer blocked for room that
// asked Go five times a second woke its process three hundred times a
// second. So the C ABI's looks first ask this step, which reads the table
// and each holding reader's /proc entry, and go to Go only when a reader
// is suspect or Go has not looked for a while. A suspect is a reader with
// no process (or a pid out of range), a zombie (which holds no mapping),
// or not seen for longer than the timeout by its slot: Go then evicts it,
// or finds it alive (blocked on for less than the timeout, say). What only
// Go tells, a pid another process took since, waits for Go's next look.
// With a reader timeout, the first look that finds no room for a frame
// goes to Go all the same: Go counts a reader's time unseen from when it
// learned that the writer waits for it (Note [waiting is alive] in package
// stream), and a writer that polled without telling it evicted a stopped
// reader a whole timeout late.

// gone_here says whether the process pid looks gone by its /proc entry:
// there is none, or it is a zombie. An entry that cannot be read is alive.
static int gone_here(uint64_t pid) {
    if (pid == 0 || pid > INT32_MAX) {
        return 1;
    }
    char path[32], stat[512];
    snprintf(path, sizeof path, "/proc/%u/stat", (unsigned)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return errno == ENOENT || errno == ESRCH;
    }
    ssize_t n = read(fd, stat, sizeof stat - 1);
    int err = errno;
    close(fd);
    if (n <= 0) {
        return n < 0 && err == ESRCH; // it exited while read
    }
    stat[n] = 0;
    const char *end = strrchr(stat, ')'); // the name may hold one: the state follows the last
    return end != NULL && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X' || end[2] == 'x');
}

typedef struct suspects_args {
    zp_writer *w;
    int64_t now;
    int32_t *suspect;
} suspects_args;

static int find_suspects(void *arg) {
    suspects_args *a = arg;
    zp_writer *w = a->w;
    uint64_t need = w->next - w->frames + 1; // as package stream's waitForRoom
    *a->suspect = 0;
    for (uint32_t i = 0; i < w->readers; i++) {
        uint8_t *slot = w->data + ZP_STREAM_READERS_AT + (uint64_t)i * ZP_READER_SIZE;
        uint64_t word = __atomic_load_n(w64(slot, ZP_READER_WORD), SEQ);
        if ((word & 3) != 1 || __atomic_load_n(w64(slot, ZP_READER_POSITION), SEQ) >= need) {
            continue; // not active, or not holding the writer back
        }
        int64_t seen = __atomic_load_n((int64_t *)(slot + ZP_READER_SEEN), SEQ);
        if ((w->reader_timeout > 0 && seen < a->now - w->reader_timeout) || gone_here(word >> 32)) {
            *a->suspect = 1;
            return ZP_OK;
        }
    }
    return ZP_OK;
}

int zp_write_suspects(zp_writer *w, int64_t now_ns, int32_t *suspect, zp_out *out) {
    suspects_args a = {w, now_ns, suspect};
    return zp_guarded(find_suspects, &a, out);
}

static uint32_t *table_entry(const zp_writer *w, uint64_t pos) {
    return w32(w->data, (int)(w->table + 4 * (pos % w->frames)));
}

// Note [the slots a writer takes back]. The slot table is shared memory,
// which any process of the user may write. A writer that took back the
// slot the table names for each frame its readers passed would, given one
// slot twice (the entry of frame 1 forged to frame 0's slot), hold that
// slot twice among its free ones and hand it to two frames in flight at
// once, each published whole, and lose the other slot for good; given the
// slot of a frame still in flight, it would fill that slot under its
// reader. So the writer keeps the slot it gave each frame in flight
// (given, in its own memory, from its claim; or, for the frames in flight
// when it took the role over, read once from the table and checked to be
// distinct), takes back only that, and refuses a table whose entry says
// otherwise: readers read the slots from the table, so it is corrupt.

// release puts the slots of the frames every reader has passed back among
// the warm ones, and the warm ones beyond warm_slots, oldest first, among
// the cold ones. A table entry that is not the slot this writer gave the
// frame (past the ring, or another) is corrupt.
static int release_slots(zp_writer *w, zp_out *out) {
    for (; w->freed < w->min_pos; w->freed++) {
        uint32_t i = __atomic_load_n(table_entry(w, w->freed), SEQ);
        uint32_t given = (uint32_t)w->given[w->freed % w->frames];
        if (i != given) {
            out->what = i >= w->frames ? ZP_BAD_SLOT : ZP_MOVED_SLOT;
            out->need = i;
            out->need_views = given;
            out->filled = w->freed;
            return ZP_CORRUPT;
        }
        if (w->warm_n == w->warm_slots) {
            if (w->cold_n == w->frames) {
                out->what = ZP_NO_FREE_SLOT;
                out->filled = w->next - w->min_pos;
                return ZP_CORRUPT;
            }
            w->cold[w->cold_n++] = w->warm[w->warm_head];
            w->warm_head = (w->warm_head + 1) % (uint32_t)w->frames;
            w->warm_n--;
        }
        w->warm[(w->warm_head + w->warm_n) % (uint32_t)w->frames] = (int32_t)i;
        w->warm_n++;
    }
    return ZP_OK;
}

// take gives the free slot for the next frame: the warm one released
// longest ago once there are warm_slots of them, and a cold one before
// (while the writer starts, or when readers fall behind), so that a slot
// comes round again only after warm_slots others. 0 when none is free.
static int take_slot(zp_writer *w, int32_t *slot) {
    if (w->warm_n > 0 && (w->warm_n >= w->warm_slots || w->cold_n == 0)) {
        *slot = w->warm[w->warm_head];
        w->warm_head = (w->warm_head + 1) % (uint32_t)w->frames;
        w->warm_n--;
        return 1;
    }
    if (w->cold_n > 0) {
        *slot = w->cold[--w->cold_n];
        return 1;
    }
    return 0;
}

typedef struct write_look_args {
    zp_writer *w;
    int32_t *slot;
    zp_out *out;
} write_look_args;

static int write_look(void *arg) {
    write_look_args *a = arg;
    zp_writer *w = a->w;
    if (w->claimed) {
        *a->slot = w->slot;
        return ZP_OK;
    }
    if (__atomic_load_n(w32(w->data, ZP_STREAM_ENDED), SEQ) != 0) {
        return ZP_ENDED;
    }
    int32_t slot = (int32_t)(w->next % w->frames);
    if (w->block) {
        // When the ring is larger than the warm slots, read the readers on
        // every claim, so that the slots they released go back among the
        // warm ones at once.
        if (w->next >= w->min_pos + w->frames || w->refresh) {
            w->min_pos = slowest(w);
        }
        if (w->next >= w->min_pos + w->frames) {
            return ZP_WAIT;
        }
        int k = release_slots(w, a->out);
        if (k != ZP_OK) {
            return k;
        }
        if (!take_slot(w, &slot)) {
            a->out->what = ZP_NO_FREE_SLOT;
            a->out->filled = w->next - w->min_pos;
            return ZP_CORRUPT;
        }
        w->given[w->next % w->frames] = slot;
        __atomic_store_n(table_entry(w, w->next), (uint32_t)slot, SEQ);
    }
    // The claim is stored before the slot is handed out: readers of the
    // frame this slot held learn that it is being overwritten.
    uint64_t *claim = w64(w->data, ZP_STREAM_CLAIM);
    if (__atomic_load_n(claim, SEQ) < w->next + 1) {
        __atomic_store_n(claim, w->next + 1, SEQ);
    }
    w->slot = slot;
    w->claimed = 1;
    *a->slot = slot;
    return ZP_OK;
}

int zp_write_look(zp_writer *w, int32_t *slot, zp_out *out) {
    write_look_args a = {w, slot, out};
    return zp_guarded(write_look, &a, out);
}

static int write_increment(void *arg) {
    zp_writer *w = arg;
    if (!w->claimed) {
        return ZP_NO_FRAME;
    }
    __atomic_store_n(w64(w->data, ZP_STREAM_PUBLISHED), w->next + 1, SEQ);
    w->claimed = 0;
    w->next++;
    zp_signal_word(w32(w->data, ZP_STREAM_DATA_SEQ), w32(w->data, ZP_STREAM_DATA_WAITERS), INT32_MAX);
    return ZP_OK;
}

int zp_write_increment(zp_writer *w, zp_out *out) { return zp_guarded(write_increment, w, out); }
