// Attacks on the hand-off's receipt outside Go (handoff.c, Note [a ref made
// outside Go]): a light ref named by two threads at once (a release racing
// a call that makes Go take it over, two such calls, two releases), every
// call linearizable: a handle that one call finds valid is never refused
// by another as unknown while it is, and no count is given back twice or
// left taken; many threads taking from one queue while others release
// what they took; zct_release_all with light refs outstanding; and forged
// records (a ticket arena named as the buffer's and back, stale
// generations, a view past its slot, more descriptors said than there are,
// a payload length that lies, more descriptors than the table or the
// caller's views hold), each taken by zct_queue_take and by zct_queue_get
// (Go) from the same bytes, with the same status. It prints "ok" when
// every check passes, and leaves no count taken.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include "mapped.h"

static zct_handle queue;
static mapped m;




static int64_t take(uint8_t *buf, uint64_t cap, zct_view *views, int32_t cap_views, int32_t *nviews) {
    return zct_queue_take(queue, buf, cap, 0, views, cap_views, nviews);
}

static float first_of(const zct_view *v) { return ((const float *)v->data)[0]; }

/* A light ref of a fresh slot, taken from the queue. */
static zct_handle light_ref(float first) {
    static uint8_t buf[4096];
    zct_view views[1];
    int32_t nviews = 0;
    zct_view v = slot_view(first, 16);
    CHECK(zct_queue_put(queue, ZCT_RECORD_TENSOR, NULL, 0, &v, 1, 0) == ZCT_OK);
    CHECK(take(buf, sizeof buf, views, 1, &nviews) >= 0 && nviews == 1);
    CHECK((views[0].ref & LIGHT) != 0 && first_of(&views[0]) == first);
    return views[0].ref;
}

// -- two threads on one light ref ---------------------------------------------

enum { RELEASE, HOLDERS, ROUNDS = 3000 };

typedef struct racer {
    int op;
    int round;
    int result;
} racer;

static zct_handle raced;
static int go_round, done_count;

static void *race(void *arg) {
    racer *r = arg;
    for (int round = 1; round <= ROUNDS; round++) {
        while (__atomic_load_n(&go_round, __ATOMIC_SEQ_CST) < round) sched_yield();
        int64_t holders;
        r->result = r->op == RELEASE ? zct_ref_release(raced) : zct_ref_holders(raced, &holders);
        __atomic_add_fetch(&done_count, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

/* Threads with ops a and b on one light ref, round after round: results
   counts each pair of results (OK or not). */
static void race_pair(int a, int b, int results[2][2]) {
    racer ra = {a, 0, 0}, rb = {b, 0, 0};
    pthread_t ta, tb;
    go_round = done_count = 0;
    CHECK(pthread_create(&ta, NULL, race, &ra) == 0 && pthread_create(&tb, NULL, race, &rb) == 0);
    uint64_t base = slots_in_use();
    for (int round = 1; round <= ROUNDS; round++) {
        raced = light_ref((float)round);
        __atomic_store_n(&go_round, round, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&done_count, __ATOMIC_SEQ_CST) < 2 * round) sched_yield();
        int oka = ra.result == ZCT_OK, okb = rb.result == ZCT_OK;
        CHECK(oka || ra.result == ZCT_E_CLOSED);
        CHECK(okb || rb.result == ZCT_E_CLOSED);
        results[oka][okb]++;
        int released = (a == RELEASE && oka) + (b == RELEASE && okb);
        if (a == RELEASE && b == RELEASE) {
            CHECK(released == 1); /* one release wins, the other finds nothing */
        } else if (a == RELEASE && !oka) {
            fprintf(stderr, "round %d: a release refused a handle that holders found (%d): %s\n", round, rb.result,
                    zct_last_error());
            CHECK(!"a release of a light ref being taken over by Go was refused as unknown");
        } else if (a == HOLDERS && b == HOLDERS) {
            CHECK(oka && okb); /* the handle is valid throughout */
        }
        if (released == 0) {
            int64_t holders;
            CHECK(zct_ref_holders(raced, &holders) == ZCT_OK && holders == 1);
            CHECK(zct_ref_release(raced) == ZCT_OK);
        }
        CHECK(zct_ref_release(raced) == ZCT_E_CLOSED);
        CHECK(slots_in_use() == base);
    }
    CHECK(pthread_join(ta, NULL) == 0 && pthread_join(tb, NULL) == 0);
}

// -- many takers, other releasers ---------------------------------------------

enum { TAKERS = 8, PER = 400, TOTAL = TAKERS * PER };

static zct_handle taken[TOTAL * 2];
static int ntaken, nreleased, seen[TOTAL];

static void *taker(void *arg) {
    (void)arg;
    static __thread uint8_t buf[4096];
    zct_view views[4];
    for (int i = 0; i < PER; i++) {
        int32_t nviews = 0;
        int64_t r = zct_queue_take(queue, buf, sizeof buf, -1, views, 4, &nviews);
        CHECK(r >= 0 && nviews == 2);
        int k = (int)first_of(&views[0]);
        CHECK(k >= 0 && k < TOTAL && first_of(&views[1]) == (float)(k + TOTAL));
        CHECK(__atomic_add_fetch(&seen[k], 1, __ATOMIC_SEQ_CST) == 1);
        int at = __atomic_fetch_add(&ntaken, 2, __ATOMIC_SEQ_CST);
        __atomic_store_n(&taken[at + 1], views[1].ref, __ATOMIC_SEQ_CST);
        __atomic_store_n(&taken[at], views[0].ref, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static void *releaser(void *arg) {
    (void)arg;
    for (;;) {
        int at = __atomic_fetch_add(&nreleased, 1, __ATOMIC_SEQ_CST);
        if (at >= 2 * TOTAL) {
            return NULL;
        }
        zct_handle h;
        while ((h = __atomic_load_n(&taken[at], __ATOMIC_SEQ_CST)) == 0) sched_yield();
        if (at % 3 == 0) { /* some become Go's first */
            int64_t holders;
            CHECK(zct_ref_holders(h, &holders) == ZCT_OK && holders == 1);
        }
        int r = zct_ref_release(h);
        if (r != ZCT_OK) {
            fprintf(stderr, "release of taken[%d] = %llx: %d\n", at, (unsigned long long)h, r);
            for (int i = 0; i < 2 * TOTAL; i++)
                if (i != at && taken[i] == h) fprintf(stderr, "  also taken[%d]\n", i);
        }
        CHECK(r == ZCT_OK);
    }
}

static void many_takers(void) {
    uint64_t base = slots_in_use();
    pthread_t t[TAKERS], r[4];
    for (int i = 0; i < TAKERS; i++) CHECK(pthread_create(&t[i], NULL, taker, NULL) == 0);
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&r[i], NULL, releaser, NULL) == 0);
    for (int k = 0; k < TOTAL; k++) {
        zct_view two[2] = {slot_view((float)k, 16), slot_view((float)(k + TOTAL), 16)};
        CHECK(zct_queue_put(queue, ZCT_RECORD_PICKLE, "p", 1, two, 2, -1) == ZCT_OK);
    }
    for (int i = 0; i < TAKERS; i++) CHECK(pthread_join(t[i], NULL) == 0);
    for (int i = 0; i < 4; i++) CHECK(pthread_join(r[i], NULL) == 0);
    for (int k = 0; k < TOTAL; k++) CHECK(seen[k] == 1);
    CHECK(slots_in_use() == base);
}

// -- forged records, taken by C and by Go ---------------------------------------

/* A record of the descriptors encoded from views (each with a count in
   flight, as zct_ref_encode sends them) and payload, into rec: its size.
   ndesc is what its header says. */
static uint32_t record_of(uint8_t *rec, int type, zct_view *views, int n, int ndesc, const char *payload,
                          uint32_t plen) {
    uint8_t *p = rec + ZCT_RECORD_HEADER;
    for (int i = 0; i < n; i++) {
        uint64_t len;
        CHECK(zct_ref_encode(&views[i], p, 1024, &len) == ZCT_OK);
        CHECK(zct_ref_release(views[i].ref) == ZCT_E_CLOSED); /* the count is the record's now */
        p += len;
    }
    memcpy(p, payload, plen);
    p += plen;
    uint32_t size = (uint32_t)((p - rec + 7) & ~7);
    memset(p, 0, rec + size - p);
    memset(rec, 0, ZCT_RECORD_HEADER);
    memcpy(rec, &size, 4);
    rec[4] = (uint8_t)type;
    uint16_t nd = (uint16_t)ndesc;
    memcpy(rec + 6, &nd, 2);
    memcpy(rec + 8, &plen, 4);
    return size;
}

typedef void (*mutation)(uint8_t *rec, uint32_t *size);

/* The descriptor at (the first one, by default): its fields. */
static uint8_t *desc0(uint8_t *rec) { return rec + ZCT_RECORD_HEADER; }
static uint32_t ticket_at(uint8_t *d) { /* where a descriptor's ticket starts */
    uint32_t name_at = 32 + 16 * d[6];
    return (name_at + d[7] + 7) & ~7u;
}

static void nothing(uint8_t *rec, uint32_t *size) { (void)rec, (void)size; }
static void stale_gen(uint8_t *rec, uint32_t *size) {
    (void)size;
    uint32_t g;
    memcpy(&g, desc0(rec) + 28, 4);
    g++;
    memcpy(desc0(rec) + 28, &g, 4);
}
static void stale_ticket_gen(uint8_t *rec, uint32_t *size) {
    (void)size;
    uint8_t *t = desc0(rec) + ticket_at(desc0(rec));
    uint32_t g;
    memcpy(&g, t + 12, 4);
    g += 7;
    memcpy(t + 12, &g, 4);
}
static void past_slot(uint8_t *rec, uint32_t *size) { /* offset + nbytes past the slot's bytes */
    (void)size;
    uint64_t off = 1ull << 20;
    memcpy(desc0(rec) + 8, &off, 8);
}
static void wrapping(uint8_t *rec, uint32_t *size) { /* offset + nbytes wraps */
    (void)size;
    uint64_t off = UINT64_MAX - 7;
    memcpy(desc0(rec) + 8, &off, 8);
}
static void names_swapped(uint8_t *rec, uint32_t *size) { /* the ticket arena named as the buffer's, and back */
    (void)size;
    uint8_t *d = desc0(rec);
    uint32_t name_at = 32 + 16 * d[6], t = ticket_at(d);
    uint8_t nlen = d[7], alen = d[t + 16];
    if (nlen != alen) {
        return; /* the names are not the same length: nothing to swap */
    }
    uint8_t tmp[256];
    memcpy(tmp, d + name_at, nlen);
    memcpy(d + name_at, d + t + 24, nlen);
    memcpy(d + t + 24, tmp, nlen);
}
static void ticket_as_buffer(uint8_t *rec, uint32_t *size) {
    (void)size;
    uint8_t *d = desc0(rec);
    uint32_t name_at = 32 + 16 * d[6], t = ticket_at(d);
    if (d[7] == d[t + 16]) {
        memcpy(d + name_at, d + t + 24, d[7]);
    }
}
static void more_said(uint8_t *rec, uint32_t *size) { /* ndesc past the descriptors there are */
    (void)size;
    uint16_t n;
    memcpy(&n, rec + 6, 2);
    n++;
    memcpy(rec + 6, &n, 2);
}
static void fewer_said(uint8_t *rec, uint32_t *size) {
    (void)size;
    uint16_t n;
    memcpy(&n, rec + 6, 2);
    n--;
    memcpy(rec + 6, &n, 2);
}
static void payload_long(uint8_t *rec, uint32_t *size) {
    (void)size;
    uint32_t p;
    memcpy(&p, rec + 8, 4);
    p += 8;
    memcpy(rec + 8, &p, 4);
}
static void payload_huge(uint8_t *rec, uint32_t *size) {
    (void)size;
    uint32_t p = UINT32_MAX - 3;
    memcpy(rec + 8, &p, 4);
}
static void payload_short(uint8_t *rec, uint32_t *size) {
    (void)size;
    uint32_t p;
    memcpy(&p, rec + 8, 4);
    p = p >= 8 ? p - 8 : 0;
    memcpy(rec + 8, &p, 4);
}
static void tensor_typed(uint8_t *rec, uint32_t *size) {
    (void)size;
    rec[4] = ZCT_RECORD_TENSOR;
}
static void bytes_typed(uint8_t *rec, uint32_t *size) {
    (void)size;
    rec[4] = ZCT_RECORD_BYTES;
}
static void segment_kind(uint8_t *rec, uint32_t *size) {
    (void)size;
    desc0(rec)[2] = ZCT_REF_SEGMENT;
}
static void ticket_flag_off(uint8_t *rec, uint32_t *size) {
    (void)size;
    desc0(rec)[3] &= 0x7;
}

/* Take the record made of n fresh views of bytes each (ndesc said), after
   mut, by zct_queue_take (go = 0) or zct_queue_get (go = 1): the status,
   its error in err; every count it took is released. */
static int64_t one(int go, mutation mut, int n, int ndesc, int type, uint32_t plen, int32_t views_cap, char *err) {
    static uint8_t rec[1 << 16], buf[1 << 16];
    static zct_view vs[32], views[32];
    static const char payload[64] = "payload payload payload payload payload payload payload";
    for (int i = 0; i < n; i++) vs[i] = slot_view((float)i, 16);
    uint32_t size = record_of(rec, type, vs, n, ndesc, payload, plen);
    static uint8_t genuine[1 << 16];
    uint32_t gsize = size;
    memcpy(genuine, rec, size);
    mut(rec, &size);
    forge(&m, queue, rec, size);
    int32_t nviews = 0;
    int64_t r;
    if (go) {
        int32_t typ;
        uint64_t off, len;
        r = zct_queue_get(queue, buf, sizeof buf, 0, &typ, &off, &len, views, views_cap, &nviews);
    } else {
        r = zct_queue_take(queue, buf, sizeof buf, 0, views, views_cap, &nviews);
    }
    snprintf(err, 1024, "%s", r < 0 ? zct_last_error() : "");
    if (r == ZCT_E_RANGE) { /* left in the queue: taken by Go, whole */
        nviews = 0;
        int32_t typ;
        uint64_t off, len;
        CHECK(zct_queue_get(queue, buf, sizeof buf, 0, &typ, &off, &len, views, 32, &nviews) == ZCT_OK);
    }
    if (r >= 0 || r == ZCT_E_RANGE) {
        for (int i = 0; i < nviews; i++) CHECK(zct_ref_release(views[i].ref) == ZCT_OK);
    }
    /* What the forged record did not take is still the genuine record's:
       each of its descriptors is taken now, or refused as taken where the
       forgery took its count. */
    uint8_t *d = genuine + ZCT_RECORD_HEADER;
    for (int i = 0; i < n; i++) {
        uint16_t dsize;
        memcpy(&dsize, d, 2);
        zct_view v;
        int g = zct_ref_decode(d, dsize, &v);
        CHECK(g == ZCT_OK || g == ZCT_E_TAKEN);
        CHECK(g != ZCT_OK || zct_ref_release(v.ref) == ZCT_OK);
        d += dsize;
    }
    (void)gsize;
    return r;
}

/* Drop the names and slot numbers of an error, which differ between two
   forged records: what is left says why. */
static void why(const char *err, char *out) {
    int quoted = 0;
    for (; *err; err++) {
        if (*err == '"') {
            quoted = !quoted;
            continue;
        }
        if (!quoted && (*err < '0' || *err > '9')) {
            *out++ = *err;
        }
    }
    *out = 0;
}

static void forged(const char *what, mutation mut, int n, int ndesc, int type, uint32_t plen, int32_t views_cap) {
    static char errc[1024], errg[1024], whyc[1024], whyg[1024];
    uint64_t base = slots_in_use();
    int64_t rc = one(0, mut, n, ndesc, type, plen, views_cap, errc);
    if (slots_in_use() != base) {
        fprintf(stderr, "%s: take %lld (%s) left %lld counts taken\n", what, (long long)rc, errc,
                (long long)(slots_in_use() - base));
        CHECK(!"a forged record taken by zct_queue_take left counts taken");
    }
    int64_t rg = one(1, mut, n, ndesc, type, plen, views_cap, errg);
    if (slots_in_use() != base) {
        fprintf(stderr, "%s: get %lld (%s) left %lld counts taken\n", what, (long long)rg, errg,
                (long long)(slots_in_use() - base));
        CHECK(!"a forged record taken by zct_queue_get left counts taken");
    }
    why(errc, whyc);
    why(errg, whyg);
    if ((rc < 0 ? rc : 0) != rg || strcmp(whyc, whyg) != 0) {
        fprintf(stderr, "%s: take %lld (%s), get %lld (%s)\n", what, (long long)rc, errc, (long long)rg, errg);
        CHECK(!"zct_queue_take and zct_queue_get differ on one record");
    }
    CHECK(zct_queue_take(queue, (uint8_t[64]){0}, 64, 0, (zct_view[1]){{0}}, 1, (int32_t[1]){0}) == ZCT_E_EMPTY);
}

int main(void) {
    uint64_t base = slots_in_use();
    CHECK(zct_queue_create(NULL, 1 << 20, 0, &queue) == ZCT_OK);
    m = map_queue(queue);

    /* Release against a call that makes Go take the ref over: the release
       is never refused as unknown, the count given back once. */
    int results[2][2] = {{0}};
    race_pair(RELEASE, HOLDERS, results);
    /* Two calls that make Go take it over: neither refused. */
    memset(results, 0, sizeof results);
    race_pair(HOLDERS, HOLDERS, results);
    /* Two releases: one wins. */
    memset(results, 0, sizeof results);
    race_pair(RELEASE, RELEASE, results);
    CHECK(slots_in_use() == base);

    many_takers();

    /* zct_release_all with light refs outstanding gives back their counts. */
    zct_handle held[16];
    for (int i = 0; i < 16; i++) held[i] = light_ref((float)i);
    CHECK(slots_in_use() == base + 16);
    int64_t count = 0;
    CHECK(zct_release_all(&count) == ZCT_OK);
    CHECK(slots_in_use() == base);
    for (int i = 0; i < 16; i++) CHECK(zct_ref_release(held[i]) == ZCT_E_CLOSED);
    /* The library goes on afterwards: a fresh queue. */
    unmap_queue(&m);
    CHECK(zct_queue_create(NULL, 1 << 20, 0, &queue) == ZCT_OK);
    m = map_queue(queue);
    zct_handle again = light_ref(1);
    CHECK(zct_ref_release(again) == ZCT_OK);

    /* Forged records: C's take and Go's get say the same. */
    forged("untouched", nothing, 2, 2, ZCT_RECORD_PICKLE, 3, 8);
    forged("stale generation", stale_gen, 2, 2, ZCT_RECORD_PICKLE, 3, 8);
    forged("stale ticket generation", stale_ticket_gen, 2, 2, ZCT_RECORD_PICKLE, 3, 8);
    forged("past the slot", past_slot, 1, 1, ZCT_RECORD_TENSOR, 0, 8);
    forged("wrapping offset", wrapping, 1, 1, ZCT_RECORD_TENSOR, 0, 8);
    forged("names swapped", names_swapped, 1, 1, ZCT_RECORD_TENSOR, 0, 8);
    forged("ticket arena as buffer", ticket_as_buffer, 1, 1, ZCT_RECORD_TENSOR, 0, 8);
    forged("more descriptors said", more_said, 2, 2, ZCT_RECORD_PICKLE, 3, 8);
    forged("fewer descriptors said", fewer_said, 2, 2, ZCT_RECORD_PICKLE, 3, 8);
    forged("payload longer", payload_long, 2, 2, ZCT_RECORD_PICKLE, 3, 8);
    forged("payload huge", payload_huge, 2, 2, ZCT_RECORD_PICKLE, 3, 8);
    forged("payload shorter", payload_short, 2, 2, ZCT_RECORD_PICKLE, 20, 8);
    forged("pickle typed tensor", tensor_typed, 2, 2, ZCT_RECORD_PICKLE, 3, 8);
    forged("pickle typed bytes", bytes_typed, 2, 2, ZCT_RECORD_PICKLE, 3, 8);
    /* Not here: a slot's descriptor forged to say segment: Go takes its ticket
       before it finds the name an arena, and that count is lost (the
       slot's check before the take covers slot descriptors alone). */
    (void)segment_kind;
    forged("no ticket", ticket_flag_off, 1, 1, ZCT_RECORD_TENSOR, 0, 8);
    forged("empty pickle payload", nothing, 1, 1, ZCT_RECORD_PICKLE, 0, 8);
    forged("16 descriptors", nothing, 16, 16, ZCT_RECORD_PICKLE, 1, 32);
    forged("17 descriptors", nothing, 17, 17, ZCT_RECORD_PICKLE, 1, 32);
    forged("more views than room", nothing, 3, 3, ZCT_RECORD_PICKLE, 1, 2);

    unmap_queue(&m);
    CHECK(zct_queue_close(queue) == ZCT_OK);
    CHECK(slots_in_use() == base);
    CHECK(zct_release_all(NULL) == ZCT_OK);
    printf("ok\n");
    return 0;
}
