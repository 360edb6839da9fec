// Records and ring words that another process of the user forges, met by
// the C ABI's take (zct_queue_take runs the data plane's get step without
// Go, for plain records only: Note [a data plane the runtime never enters]
// in package plane). A record whose size cannot be one, a skip record
// where none may be, a payload length or type that says what the record
// is not, a length rewritten while a take copies the record, positions on
// either side of 2^31 and 2^32: each take either gives a record whole, as
// it lies in the ring, or says ZCT_E_CORRUPT; nothing is read out of the
// ring or written out of the caller's buffer, and messages put afterwards
// flow. It prints "ok" when every check passes.
#define _GNU_SOURCE
#include <pthread.h>
#include "mapped.h"

#define CANARY 0xA5

static uint8_t buf[1 << 17];

static uint32_t tail_of(const mapped *m) { return (uint32_t)ld64(m, TAIL); }
static uint32_t head_of(const mapped *m) { return (uint32_t)ld64(m, HEAD); }
static uint8_t *at(const mapped *m, uint32_t pos) { return m->data + RING_AT + (pos & (m->capacity - 1)); }

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* Put a bytes record of plen bytes of fill, and check that a take gives it
   back whole. */
static void flows(zct_handle q, uint32_t plen, uint8_t fill) {
    static uint8_t payload[1 << 16];
    memset(payload, fill, plen);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, payload, plen, NULL, 0, 0) == ZCT_OK);
    memset(buf, CANARY, sizeof buf);
    CHECK(take_plain(q, buf, sizeof buf, 0) == plen);
    for (uint32_t i = 0; i < plen; i++) {
        CHECK(buf[ZCT_RECORD_HEADER + i] == fill);
    }
    uint32_t size = (ZCT_RECORD_HEADER + plen + 7) & ~7u;
    CHECK(buf[size] == CANARY); /* nothing written past the record */
}

/* Put a bytes record of plen bytes, then let edit forge it in the ring;
   a take must say ZCT_E_CORRUPT, and a take after it find the queue empty
   (the step dropped what it could not read, up to the tail). */
static void refused(zct_handle q, const mapped *m, uint32_t plen, void (*edit)(uint8_t *rec, const mapped *m),
                    int64_t want) {
    static uint8_t payload[4096];
    uint32_t tail = tail_of(m);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, payload, plen, NULL, 0, 0) == ZCT_OK);
    edit(at(m, tail), m);
    memset(buf, CANARY, sizeof buf);
    int64_t r = take_plain(q, buf, 4096, 0);
    if (r != want) {
        fprintf(stderr, "take gave %lld, not %lld\n", (long long)r, (long long)want);
    }
    CHECK(r == want);
    if (want == ZCT_E_CORRUPT) {
        CHECK(take_plain(q, buf, 4096, 0) == ZCT_E_EMPTY);
    }
    CHECK(buf[4096] == CANARY);
    CHECK(ld32(m, GET_LOCK) == 0 && ld32(m, PUT_LOCK) == 0);
}

static void size_zero(uint8_t *r, const mapped *m) { (void)m, put32(r, 0); }
static void size_eight(uint8_t *r, const mapped *m) { (void)m, put32(r, 8); }
static void size_odd(uint8_t *r, const mapped *m) { (void)m, put32(r, 36); }
static void size_past_tail(uint8_t *r, const mapped *m) { (void)m, put32(r, 4096); }
static void size_huge(uint8_t *r, const mapped *m) { (void)m, put32(r, 0xFFFFFFF8u); }
static void size_ring(uint8_t *r, const mapped *m) { put32(r, m->capacity); }
static void plen_past_size(uint8_t *r, const mapped *m) { (void)m, put32(r + 8, 200); }
static void plen_huge(uint8_t *r, const mapped *m) { (void)m, put32(r + 8, 0x3FFFFFF0u); }
static void plen_short(uint8_t *r, const mapped *m) { (void)m, put32(r + 8, 8); } /* padding past 7 bytes */
static void type_zero(uint8_t *r, const mapped *m) { (void)m, r[4] = 0; }
static void type_skip(uint8_t *r, const mapped *m) { (void)m, r[4] = 0xFF; }
static void type_tensor(uint8_t *r, const mapped *m) { (void)m, r[4] = ZCT_RECORD_TENSOR; }
static void type_inline(uint8_t *r, const mapped *m) { (void)m, r[4] = ZCT_RECORD_INLINE; }
static void ndesc_one(uint8_t *r, const mapped *m) { (void)m, r[6] = 1; }

static void forged_records(zct_handle q, const mapped *m) {
    flows(q, 5, 1);
    refused(q, m, 100, size_zero, ZCT_E_CORRUPT);
    refused(q, m, 100, size_eight, ZCT_E_CORRUPT);
    refused(q, m, 100, size_odd, ZCT_E_CORRUPT);
    refused(q, m, 100, size_past_tail, ZCT_E_CORRUPT);
    refused(q, m, 100, size_huge, ZCT_E_CORRUPT);
    refused(q, m, 100, size_ring, ZCT_E_CORRUPT);
    refused(q, m, 100, plen_past_size, ZCT_E_CORRUPT);
    refused(q, m, 100, plen_huge, ZCT_E_CORRUPT);
    refused(q, m, 100, plen_short, ZCT_E_CORRUPT);
    refused(q, m, 100, type_zero, ZCT_E_CORRUPT);
    refused(q, m, 100, type_skip, ZCT_E_CORRUPT);
    refused(q, m, 100, type_tensor, ZCT_E_CORRUPT);
    refused(q, m, 100, type_inline, ZCT_E_CORRUPT);
    refused(q, m, 100, ndesc_one, ZCT_E_CORRUPT);
    flows(q, 100, 2);
}

/* A record that runs past the ring's end, its payload length at offset 0:
   taken whole, through the fast take. */
static void wrapped(zct_handle q, const mapped *m) {
    for (uint32_t i = 0; i < m->capacity / 8 + 3; i++) {
        uint32_t off = tail_of(m) & (m->capacity - 1);
        flows(q, off == m->capacity - 8 ? 300 : 8 + (i % 5) * 8, (uint8_t)i);
    }
}

/* The positions moved to near 2^31 and 2^32 (counts too), as a long-lived
   queue leaves them: records are put and taken across the wrap. */
static void positions(zct_handle q, const mapped *m, uint32_t start, uint32_t count) {
    CHECK(head_of(m) == tail_of(m));
    st64(m, TAIL, (uint64_t)count << 32 | start);
    st64(m, HEAD, (uint64_t)count << 32 | start);
    for (uint32_t i = 0; i < 3 * m->capacity / 256; i++) {
        flows(q, 200 + i % 50, (uint8_t)(i + 3));
    }
    CHECK(tail_of(m) - start >= 2 * m->capacity);
}

/* An unbounded ring's positions (and its reserved and given_back words)
   moved to just before 2^31 and 2^32: messages put three at a time cross
   them, each emptied ring rewinds to its next lap, laps wrap. */
static void positions_unbounded(zct_handle q, const mapped *m, uint32_t start, uint32_t count) {
    CHECK(head_of(m) == tail_of(m));
    st64(m, TAIL, (uint64_t)count << 32 | start);
    st64(m, HEAD, (uint64_t)count << 32 | start);
    st32(m, RESERVED, start);
    st32(m, GIVEN_BACK, start & ~(CHUNK - 1));
    static uint8_t payload[1 << 16];
    for (uint32_t i = 0; i < 40; i++) {
        for (uint32_t k = 0; k < 3; k++) {
            memset(payload, (int)(i * 3 + k), sizeof payload);
            CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, payload, 1000 + 20000 * k, NULL, 0, 0) == ZCT_OK);
        }
        for (uint32_t k = 0; k < 3; k++) {
            CHECK(take_plain(q, buf, sizeof buf, 0) == 1000 + 20000 * k);
            CHECK(buf[ZCT_RECORD_HEADER] == (uint8_t)(i * 3 + k) && buf[ZCT_RECORD_HEADER + 999] == (uint8_t)(i * 3 + k));
        }
        CHECK(take_plain(q, buf, sizeof buf, 0) == ZCT_E_EMPTY);
        CHECK(ld32(m, PUT_LOCK) == 0 && ld32(m, GET_LOCK) == 0);
    }
    CHECK((uint32_t)(tail_of(m) - start) > 8u * m->capacity / 4 || tail_of(m) < start); /* laps passed */
    struct stat st;
    CHECK(fstat(m->fd, &st) == 0);
    CHECK((uint64_t)st.st_blocks * 512 < (4u << 20)); /* an empty queue holds a few pages */
}

/* A writer that rewrites a record's payload length and type while the
   take checks and copies it: what a take gives is what it copied, plain,
   or ZCT_E_CORRUPT (the Go path, which decodes its copy), never a length
   past the record. */
static volatile int stop;
static const mapped *flipped;

static void *flipper(void *arg) {
    (void)arg;
    while (!stop) {
        uint8_t *rec = at(flipped, head_of(flipped));
        for (int i = 0; i < 64; i++) {
            put32(rec + 8, 0x3FFFFFF0u);
            rec[4] = ZCT_RECORD_TENSOR;
            put32(rec + 8, 100);
            rec[4] = ZCT_RECORD_BYTES;
        }
    }
    return NULL;
}

static void rewritten_while_taken(zct_handle q, const mapped *m) {
    static uint8_t payload[100];
    flipped = m;
    stop = 0;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, flipper, NULL) == 0);
    int good = 0, corrupt = 0;
    for (int i = 0; i < 200000; i++) {
        CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, payload, sizeof payload, NULL, 0, 0) == ZCT_OK);
        int32_t nviews = -1;
        int64_t r = zct_queue_take(q, buf, sizeof buf, 0, NULL, 0, &nviews);
        if (r == ZCT_E_CORRUPT) {
            corrupt++;
            continue;
        }
        if (r == ZCT_E_RANGE) {
            /* The writer hit a skip record (an unbounded ring's), which is
               now a record of a lap's size: the caller would need a larger
               buffer. Drop it as a consumer that had one would. */
            st64(m, HEAD, ld64(m, TAIL));
            continue;
        }
        CHECK(r >= 0);
        CHECK((r & ZCT_TAKE_FIELD_MASK) == sizeof payload);
        CHECK(r >> ZCT_TAKE_TYPE_SHIFT == ZCT_RECORD_BYTES);
        CHECK(nviews == 0);
        uint32_t plen;
        memcpy(&plen, buf + 8, 4);
        CHECK(plen == sizeof payload && buf[4] == ZCT_RECORD_BYTES); /* the copy the caller reads says so too */
        good++;
    }
    stop = 1;
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(take_plain(q, buf, sizeof buf, 0) == ZCT_E_EMPTY);
    flows(q, 100, 9);
    (void)good, (void)corrupt;
}

/* Forged positions: off the 8-byte grid, or more than a ring apart. */
static void forged_positions(zct_handle q, const mapped *m) {
    uint64_t t = ld64(m, TAIL), h = ld64(m, HEAD);
    uint64_t bad[][2] = {{t + 4, h}, {t, h + 4}, {t + m->capacity + 8, h}, {t, h + 8}};
    for (int i = 0; i < 4; i++) {
        st64(m, TAIL, bad[i][0]);
        st64(m, HEAD, bad[i][1]);
        CHECK(take_plain(q, buf, sizeof buf, 0) == ZCT_E_CORRUPT);
        CHECK(strstr(zct_last_error(), "head") != NULL);
        CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "x", 1, NULL, 0, 0) == ZCT_E_CORRUPT);
        CHECK(ld32(m, GET_LOCK) == 0 && ld32(m, PUT_LOCK) == 0);
    }
    st64(m, TAIL, t);
    st64(m, HEAD, h);
    flows(q, 10, 4);
}

static void attack(zct_handle q, int unbounded) {
    mapped m = map_queue(q);
    forged_records(q, &m);
    if (!unbounded) {
        wrapped(q, &m);
        positions(q, &m, 0x7FFFFF00u, 0x7FFFFFF0u);
        positions(q, &m, 0xFFFFFF00u, 0xFFFFFFF0u);
    } else {
        positions_unbounded(q, &m, 0x7FFFF000u, 0x7FFFFFF0u);
        positions_unbounded(q, &m, 0xFFFFF000u, 0xFFFFFFF0u);
        positions_unbounded(q, &m, 0xFFF00000u, 0);
    }
    rewritten_while_taken(q, &m);
    forged_positions(q, &m);
    unmap_queue(&m);
    CHECK(zct_queue_close(q) == ZCT_OK);
}

int main(void) {
    zct_handle q;
    CHECK(zct_queue_create(NULL, 4096, 0, &q) == ZCT_OK);
    attack(q, 0);
    CHECK(zct_queue_create(NULL, 1 << 16, 0, &q) == ZCT_OK);
    attack(q, 0);
    CHECK(zct_queue_create(NULL, 0, 0, &q) == ZCT_OK);
    attack(q, 1);
    printf("ok\n");
    return 0;
}
