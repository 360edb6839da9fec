// A stream writer's claim and publish, which zct_stream_write_look and
// _increment run in C on the writer's state in C memory (fast.c), falling
// back to Go for the rest: slot table entries forged by another process
// (a slot past the ring, one slot twice, a slot moved) are refused with
// ZCT_E_CORRUPT and a message naming the frame and the slots, the same
// every time, and nothing is claimed; positions forged past 2^31 and 2^32
// claim and publish each frame once, in a slot no frame in flight holds;
// threads that claim and publish while others read the counts and peek,
// and one closes the writer under them, each see every call run whole or
// say closed, and a stale handle never reaches the writer after it; a file
// shrunk under the writer ends its calls with ZCT_E_CORRUPT, never a
// SIGBUS. It prints "ok" when every check passes.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"

#define CLAIM 320
#define PUBLISHED 328
#define SEQ __ATOMIC_SEQ_CST

typedef struct {
    zct_handle s;
    zct_stream_info info;
} stream;

static stream make(int32_t frames, int32_t readers, int32_t policy) {
    stream st;
    int64_t shape[1] = {4};
    CHECK(zct_stream_create(NULL, ZCT_FLOAT32, 1, shape, frames, readers, policy, 0, &st.s, &st.info) ==
          ZCT_OK);
    return st;
}

static uint64_t *w64(const stream *st, int off) { return (uint64_t *)((uint8_t *)st->info.data + off); }

static uint32_t *table(const stream *st, uint64_t pos) {
    return (uint32_t *)((uint8_t *)st->info.data + 576 + 64 * st->info.readers) + pos % (uint64_t)st->info.frames;
}

static float *frame(const stream *st, int32_t slot) {
    return (float *)((uint8_t *)st->info.data + st->info.ring_offset + (uint64_t)slot * st->info.stride);
}

/* Claim and publish frame value; the slot it went to. */
static int32_t write_frame(const stream *st, zct_handle w, float value) {
    int32_t slot = -1;
    CHECK(zct_stream_write_look(w, 0, &slot) == ZCT_OK);
    CHECK(slot >= 0 && slot < st->info.frames);
    for (int i = 0; i < 4; i++) {
        frame(st, slot)[i] = value;
    }
    CHECK(zct_stream_write_increment(w) == ZCT_OK);
    return slot;
}

static float read_frame(const stream *st, zct_handle r) {
    int32_t slot = -1, whole = 0;
    CHECK(zct_stream_read_look(r, 0, &slot) == ZCT_OK);
    float v = frame(st, slot)[0];
    CHECK(zct_stream_read_increment(r, &whole) == ZCT_OK && whole == 1);
    return v;
}

/* The status and message of a look that must fail as corrupt, asked three
   times: the same each time, and nothing claimed. */
static void refused_as(const stream *st, zct_handle w, const char *want) {
    char first[512];
    uint64_t claim = *w64(st, CLAIM), published = *w64(st, PUBLISHED);
    for (int i = 0; i < 3; i++) {
        int32_t slot = -1;
        CHECK(zct_stream_write_look(w, i == 2 ? 10 : 0, &slot) == ZCT_E_CORRUPT);
        if (strstr(zct_last_error(), want) == NULL) {
            fprintf(stderr, "want %s in: %s\n", want, zct_last_error());
            exit(1);
        }
        if (i == 0) {
            snprintf(first, sizeof first, "%s", zct_last_error());
        }
        CHECK(strcmp(first, zct_last_error()) == 0);
    }
    CHECK(*w64(st, CLAIM) == claim && *w64(st, PUBLISHED) == published);
}

static void forged_tables(void) {
    static const struct {
        uint32_t entry; /* what frame 1's entry is forged to */
        const char *says;
    } forged[] = {
        {4, "frame 1 in slot 4 of 4"},
        {0xFFFFFFFF, "frame 1 in slot 4294967295 of 4"},
        {0, "frame 1 in slot 0, where its writer put it in slot 1"}, /* frame 0's, released already */
        {2, "frame 1 in slot 2, where its writer put it in slot 1"}, /* frame 2's, in flight */
    };
    for (size_t k = 0; k < sizeof forged / sizeof forged[0]; k++) {
        stream st = make(4, 1, 0);
        zct_handle w, r;
        int32_t index;
        CHECK(zct_stream_reader(st.s, -1, &r, &index) == ZCT_OK);
        CHECK(zct_stream_writer(st.s, &w) == ZCT_OK);
        for (int i = 0; i < 4; i++) {
            CHECK(write_frame(&st, w, (float)i) == i);
        }
        CHECK(read_frame(&st, r) == 0.0f && read_frame(&st, r) == 1.0f);
        *table(&st, 1) = forged[k].entry;
        refused_as(&st, w, forged[k].says);
        *table(&st, 1) = 1;
        for (int i = 4; i < 40; i++) {
            write_frame(&st, w, (float)i);
            CHECK(read_frame(&st, r) == (float)(i - 2));
        }
        CHECK(zct_stream_writer_close(w) == ZCT_OK);
        CHECK(zct_stream_reader_close(r) == ZCT_OK);
        CHECK(zct_stream_close(st.s) == ZCT_OK);
    }
}

static void positions_past_2_to_the_32(void) {
    const uint64_t bases[] = {(1ull << 31) - 3, (1ull << 32) - 3, (1ull << 33) + 1};
    for (size_t k = 0; k < 3; k++) {
        for (int32_t frames = 2; frames <= 5; frames += 3) {
            stream st = make(frames, 2, 0);
            uint64_t base = bases[k];
            *w64(&st, CLAIM) = *w64(&st, PUBLISHED) = base;
            zct_handle w, r[2];
            int32_t index;
            for (int i = 0; i < 2; i++) {
                CHECK(zct_stream_reader(st.s, -1, &r[i], &index) == ZCT_OK);
            }
            CHECK(zct_stream_writer(st.s, &w) == ZCT_OK);
            int32_t in[64] = {0}; /* the slot of each frame in flight, by position mod 64 */
            uint64_t read = base;
            for (uint64_t p = base; p < base + 40; p++) {
                int32_t slot = write_frame(&st, w, (float)(p - base));
                for (uint64_t q = read; q < p; q++) {
                    CHECK(in[q % 64] != slot);
                }
                in[p % 64] = slot;
                CHECK(*w64(&st, PUBLISHED) == p + 1 && *w64(&st, CLAIM) == p + 1);
                CHECK(*table(&st, p) == (uint32_t)slot);
                /* The readers stay as far behind as the ring lets them. */
                for (; read + (uint64_t)frames < p + 2; read++) {
                    for (int i = 0; i < 2; i++) {
                        CHECK(read_frame(&st, r[i]) == (float)(read - base));
                    }
                }
            }
            for (int i = 0; i < 2; i++) {
                uint64_t position, received, dropped;
                while (read_frame(&st, r[i]) != 39.0f) {
                }
                CHECK(zct_stream_reader_stats(r[i], &position, &received, &dropped) == ZCT_OK);
                CHECK(position == base + 40 && received == 40 && dropped == 0);
                CHECK(zct_stream_reader_close(r[i]) == ZCT_OK);
            }
            CHECK(zct_stream_writer_close(w) == ZCT_OK);
            CHECK(zct_stream_close(st.s) == ZCT_OK);
        }
    }
}

/* -- threads, and a close under them ------------------------------------- */

typedef struct {
    const stream *st;
    zct_handle w, r;
    int stop;
    int64_t increments[8];
    int bad;
} hammered;

typedef struct {
    hammered *h;
    int i;
} who;

static void *claim_and_publish(void *arg) {
    who *me = arg;
    hammered *h = me->h;
    for (;;) {
        int32_t slot = -1;
        int k = zct_stream_write_look(h->w, 20, &slot);
        if (k == ZCT_E_CLOSED) {
            return NULL;
        }
        if (k != ZCT_OK && k != ZCT_E_FULL) {
            fprintf(stderr, "look: %d %s\n", k, zct_last_error());
            __atomic_store_n(&h->bad, 1, SEQ);
            return NULL;
        }
        k = zct_stream_write_increment(h->w);
        if (k == ZCT_OK) {
            h->increments[me->i]++;
        } else if (k == ZCT_E_CLOSED) {
            return NULL;
        } else if (k != ZCT_E_INVALID) { /* another thread published the frame first */
            fprintf(stderr, "increment: %d %s\n", k, zct_last_error());
            __atomic_store_n(&h->bad, 1, SEQ);
            return NULL;
        }
    }
}

static void *counts(void *arg) {
    hammered *h = arg;
    uint64_t last = 0, position, received, dropped, published, lost;
    int32_t readers, ended;
    float buf[4];
    while (!__atomic_load_n(&h->stop, SEQ)) {
        CHECK(zct_stream_reader_stats(h->r, &position, &received, &dropped) == ZCT_OK);
        CHECK(zct_stream_stats(h->st->s, &published, &lost, &readers, &ended) == ZCT_OK);
        CHECK(published >= last && readers == 1 && lost == 0);
        CHECK(position <= published && dropped == 0);
        last = published;
        uint64_t at = ZCT_PEEK_LATEST;
        int k = zct_stream_peek(h->st->s, &at, buf, sizeof buf);
        CHECK(k == ZCT_OK || k == ZCT_E_EMPTY);
    }
    return NULL;
}

static void *drain(void *arg) {
    hammered *h = arg;
    uint64_t position, received, dropped;
    for (;;) {
        int32_t slot, whole;
        int k = zct_stream_read_look(h->r, 20, &slot);
        if (k == ZCT_E_EMPTY) {
            if (__atomic_load_n(&h->stop, SEQ)) {
                return NULL;
            }
            continue;
        }
        CHECK(k == ZCT_OK);
        CHECK(zct_stream_read_increment(h->r, &whole) == ZCT_OK && whole == 1);
        CHECK(zct_stream_reader_stats(h->r, &position, &received, &dropped) == ZCT_OK);
        CHECK(received == position && dropped == 0);
    }
}

static void closed_under_threads(int32_t frames) {
    stream st = make(frames, 1, 0);
    hammered h = {.st = &st};
    int32_t index;
    CHECK(zct_stream_reader(st.s, -1, &h.r, &index) == ZCT_OK);
    CHECK(zct_stream_writer(st.s, &h.w) == ZCT_OK);
    pthread_t writers[8], counter, drainer;
    who whos[8];
    for (int i = 0; i < 8; i++) {
        whos[i] = (who){&h, i};
        CHECK(pthread_create(&writers[i], NULL, claim_and_publish, &whos[i]) == 0);
    }
    CHECK(pthread_create(&counter, NULL, counts, &h) == 0);
    CHECK(pthread_create(&drainer, NULL, drain, &h) == 0);
    uint64_t published = 0, lost;
    int32_t readers, ended;
    for (int i = 0; i < 60000 && published < 5000; i++) {
        usleep(1000);
        CHECK(zct_stream_stats(st.s, &published, &lost, &readers, &ended) == ZCT_OK);
    }
    CHECK(published >= 5000);
    zct_handle stale = h.w;
    CHECK(zct_stream_writer_close(h.w) == ZCT_OK);
    for (int i = 0; i < 8; i++) {
        CHECK(pthread_join(writers[i], NULL) == 0);
    }
    __atomic_store_n(&h.stop, 1, SEQ);
    CHECK(pthread_join(counter, NULL) == 0);
    CHECK(pthread_join(drainer, NULL) == 0);
    CHECK(!h.bad);
    int64_t total = 0;
    for (int i = 0; i < 8; i++) {
        total += h.increments[i];
    }
    CHECK(zct_stream_stats(st.s, &published, &lost, &readers, &ended) == ZCT_OK);
    CHECK((int64_t)published == total); /* one frame per increment that said so */
    uint64_t position, received, dropped;
    CHECK(zct_stream_reader_stats(h.r, &position, &received, &dropped) == ZCT_OK);
    CHECK(position == published && received == published && dropped == 0);

    /* The stale handle, while a new writer holds the role: closed, and the
       new writer's claim stands. */
    zct_handle w;
    CHECK(zct_stream_writer(st.s, &w) == ZCT_OK);
    int32_t slot = -1, again = -1;
    CHECK(zct_stream_write_look(w, 0, &slot) == ZCT_OK);
    uint32_t *word;
    uint32_t seen;
    zct_handle others[] = {stale, h.r, st.s, 0, UINT64_MAX, stale + 1000};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        CHECK(zct_stream_write_look(others[i], 0, &again) == ZCT_E_CLOSED);
        CHECK(zct_stream_write_look(others[i], -1, &again) == ZCT_E_CLOSED);
        CHECK(zct_stream_write_increment(others[i]) == ZCT_E_CLOSED);
        CHECK(zct_stream_writer_arm(others[i], &word, &seen) == ZCT_E_CLOSED);
        CHECK(zct_stream_writer_disarm(others[i]) == ZCT_E_CLOSED);
    }
    CHECK(zct_stream_writer_close(stale) == ZCT_E_CLOSED);
    CHECK(*w64(&st, CLAIM) == published + 1 && *w64(&st, PUBLISHED) == published);
    CHECK(zct_stream_write_look(w, 0, &again) == ZCT_OK && again == slot);
    CHECK(zct_stream_write_increment(w) == ZCT_OK);
    CHECK(zct_stream_writer_close(w) == ZCT_OK);
    CHECK(zct_stream_reader_close(h.r) == ZCT_OK);
    CHECK(zct_stream_close(st.s) == ZCT_OK);
}

/* -- a file shrunk under the writer -------------------------------------- */

typedef struct {
    zct_handle w;
    int status;
} waiter;

static void *wait_for_room(void *arg) {
    waiter *wt = arg;
    int32_t slot;
    wt->status = zct_stream_write_look(wt->w, 60000, &slot);
    return NULL;
}

static void shrink(const stream *st) {
    char path[512];
    const char *dir = getenv("ZCTIPC_SHM_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "/dev/shm", st->info.name);
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, 0) == 0);
    CHECK(close(fd) == 0);
    CHECK(unlink(path) == 0); /* its handles are left open: closing them says the fault again */
}

static void shrunk(void) {
    /* A writer waiting for room (in Go) when the file goes. */
    stream full = make(2, 1, 0);
    zct_handle r, w;
    int32_t index, slot;
    CHECK(zct_stream_reader(full.s, -1, &r, &index) == ZCT_OK);
    CHECK(zct_stream_writer(full.s, &w) == ZCT_OK);
    write_frame(&full, w, 0.0f);
    write_frame(&full, w, 1.0f);
    waiter wt = {w, 1};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, wait_for_room, &wt) == 0);
    usleep(200000);
    shrink(&full);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(wt.status == ZCT_E_CORRUPT);
    CHECK(zct_stream_write_look(w, 0, &slot) == ZCT_E_CORRUPT);

    /* A writer with room, and one with a frame claimed. */
    stream roomy = make(4, 1, 0), claimed = make(4, 1, 0);
    zct_handle w2, w3;
    CHECK(zct_stream_writer(roomy.s, &w2) == ZCT_OK);
    CHECK(zct_stream_writer(claimed.s, &w3) == ZCT_OK);
    write_frame(&roomy, w2, 0.0f);
    CHECK(zct_stream_write_look(w3, 0, &slot) == ZCT_OK);
    shrink(&roomy);
    shrink(&claimed);
    CHECK(zct_stream_write_look(w2, 0, &slot) == ZCT_E_CORRUPT);
    CHECK(zct_stream_write_look(w2, 10, &slot) == ZCT_E_CORRUPT);
    CHECK(zct_stream_write_increment(w3) == ZCT_E_CORRUPT);
    CHECK(zct_stream_write_increment(w3) == ZCT_E_CORRUPT);
}

int main(void) {
    forged_tables();
    positions_past_2_to_the_32();
    closed_under_threads(2);
    closed_under_threads(8);
    shrunk();
    printf("ok\n");
    return 0;
}
