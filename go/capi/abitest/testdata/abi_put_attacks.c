// Attacks on zct_queue_put_array's send of pool memory outside Go
// (handoff.c, put_array_here): every array it is given is sent as Go's
// zctipc_go_queue_put_array (the call before the send moved to C, still
// exported) sends it, or refused with Go's status and reason; the record
// each puts is the same bytes but for its ticket, and reads alike through
// zct_queue_take and zct_queue_get; a full queue (no wait, and a wait Go
// does) leaves no count nor ticket taken; threads putting one slot at once
// while others take; thousands of records in flight (ticket arenas grown
// by Go); a replayed record refused; slots freed, trimmed and handed out
// again while they are put, never counted on the wrong generation. It prints "ok" when every check
// passes, and leaves no count taken.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "mapped.h"


/* The call zct_queue_put_array made before its send moved to C. */
extern int zctipc_go_queue_put_array(zct_handle h, int32_t type, const void *addr, uint64_t extent, int32_t dtype,
                                     int32_t ndim, const int64_t *shape, const int64_t *strides, int32_t flags,
                                     int64_t timeout_ms);


static const char *dir(void) {
    const char *d = getenv("ZCTIPC_SHM_DIR");
    return d ? d : "/dev/shm";
}



static zct_handle qc, qg; /* the records C sends, and Go's */
static uint8_t bufc[1 << 16], bufg[1 << 16];

/* Where the ticket of a record's one descriptor starts in the record. */
static uint32_t ticket_at(const uint8_t *rec) {
    const uint8_t *d = rec + ZCT_RECORD_HEADER;
    uint32_t ndim = d[6], name_len = d[7];
    return ZCT_RECORD_HEADER + ((32 + 16 * ndim + name_len + 7) & ~7u);
}

static int same_view(const zct_view *a, const zct_view *b) {
    if (a->data != b->data || a->offset != b->offset || a->nbytes != b->nbytes || a->dtype != b->dtype ||
        a->ndim != b->ndim || a->kind != b->kind || a->flags != b->flags)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || a->strides[i] != b->strides[i]) return 0;
    return 1;
}

static int cases;
static zct_handle own_slot; /* the slot the arrays lie in */

static int64_t holders(void) {
    int64_t n = -1;
    CHECK(zct_ref_holders(own_slot, &n) == ZCT_OK);
    return n;
}

/* Put the array both ways: the same status and reason; when sent, the same
   record but for its ticket, the same view through take (C's record) and
   get (Go's) and through get (C's) and take (Go's); no count left. */
static void both(const void *addr, uint64_t extent, int32_t dtype, int32_t ndim, const int64_t *shape,
                 const int64_t *strides, int32_t flags) {
    cases++;
    uint64_t base = slots_in_use();
    int rc = zct_queue_put_array(qc, ZCT_RECORD_TENSOR, addr, extent, dtype, ndim, shape, strides, flags, 0);
    char errc[512];
    snprintf(errc, sizeof errc, "%s", zct_last_error());
    int rg = zctipc_go_queue_put_array(qg, ZCT_RECORD_TENSOR, addr, extent, dtype, ndim, shape, strides, flags, 0);
    if (rc != rg || (rc != ZCT_OK && strcmp(errc, zct_last_error()) != 0)) {
        fprintf(stderr, "case %d (ndim %d, flags %d, dtype %d, extent %llu): C %d (%s), Go %d (%s)\n", cases, ndim,
                flags, dtype, (unsigned long long)extent, rc, errc, rg, zct_last_error());
        CHECK(0);
    }
    if (rc != ZCT_OK) {
        CHECK(slots_in_use() == base && (own_slot == 0 || holders() == 1));
        return;
    }
    CHECK(slots_in_use() == base && holders() == 3);
    for (int round = 0; round < 2; round++) {
        static zct_view vc[8], vg[8];
        int32_t nc = -1, ng = -1, type = 0;
        uint64_t off = 0, plen = 0;
        zct_handle first = round == 0 ? qc : qg, second = round == 0 ? qg : qc;
        uint8_t *bf = round == 0 ? bufc : bufg, *bs = round == 0 ? bufg : bufc;
        zct_view *vf = round == 0 ? vc : vg, *vs = round == 0 ? vg : vc;
        int32_t *nf = round == 0 ? &nc : &ng, *ns = round == 0 ? &ng : &nc;
        CHECK(zct_queue_take(first, bf, 1 << 16, 0, vf, 8, nf) >= 0 && *nf == 1);
        CHECK(zct_queue_get(second, bs, 1 << 16, 0, &type, &off, &plen, vs, 8, ns) == ZCT_OK);
        CHECK(type == ZCT_RECORD_TENSOR && *ns == 1 && plen == 0);
        if (!same_view(&vc[0], &vg[0])) {
            fprintf(stderr, "case %d round %d: views differ: nbytes %llu/%llu offset %llu/%llu flags %d/%d\n", cases,
                    round, (unsigned long long)vc[0].nbytes, (unsigned long long)vg[0].nbytes,
                    (unsigned long long)vc[0].offset, (unsigned long long)vg[0].offset, vc[0].flags, vg[0].flags);
            CHECK(0);
        }
        uint32_t sc, sg;
        memcpy(&sc, bufc, 4);
        memcpy(&sg, bufg, 4);
        CHECK(sc == sg);
        uint32_t t = ticket_at(bufc);
        CHECK(t == ticket_at(bufg) && t < sc);
        /* the ticket's flag bit is in the base; its nonce, slot and
           generation differ; its arena's name length and name are alike
           (both this process's own ticket arenas, of one naming) */
        if (memcmp(bufc, bufg, t) != 0) {
            for (uint32_t i = 0; i < t; i++)
                if (bufc[i] != bufg[i]) fprintf(stderr, "case %d: byte %u: C %02x, Go %02x\n", cases, i, bufc[i], bufg[i]);
            CHECK(0);
        }
        CHECK(bufc[t + 16] == bufg[t + 16]);
        CHECK(zct_ref_release(vc[0].ref) == ZCT_OK);
        CHECK(zct_ref_release(vg[0].ref) == ZCT_OK);
        CHECK(slots_in_use() == base && holders() == 1);
        if (round == 0) {
            CHECK(zct_queue_put_array(qc, ZCT_RECORD_TENSOR, addr, extent, dtype, ndim, shape, strides, flags, 0) ==
                  ZCT_OK);
            CHECK(zctipc_go_queue_put_array(qg, ZCT_RECORD_TENSOR, addr, extent, dtype, ndim, shape, strides, flags,
                                            0) == ZCT_OK);
        }
    }
}

static void equivalence(void) {
    zct_handle own;
    void *at;
    uint64_t size;
    CHECK(zct_pool_alloc(256, 0, &own, &at, &size) == ZCT_OK);
    CHECK(size >= 256);
    own_slot = own;
    uint8_t *p = at;
    for (uint64_t i = 0; i < size; i++) p[i] = (uint8_t)i;
    /* the slot's size, as zct_queue_put_array's extent may reach */
    uint64_t slot = size;
    zct_handle probe;
    uint64_t off;
    CHECK(zct_ref_find(p, slot, &probe, &off) == ZCT_OK && off == 0);
    CHECK(zct_ref_release(probe) == ZCT_OK);

    int64_t sh[33], st[33];
    for (int i = 0; i < 33; i++) sh[i] = 1, st[i] = 0;
    /* 0-d, every flag, and flags past 7 */
    for (int32_t f = -1; f <= 9; f++) both(p, 4, ZCT_FLOAT32, 0, NULL, NULL, f);
    both(p, 0, ZCT_FLOAT32, 0, NULL, NULL, 0); /* 0-d past its extent of 0 */
    both(p + 3, 8, ZCT_FLOAT64, 0, NULL, NULL, 0);
    /* empty dimensions, with and without strides that reach far */
    sh[0] = 0, st[0] = 8;
    both(p, 0, ZCT_FLOAT64, 1, sh, st, 0);
    both(p, slot, ZCT_FLOAT64, 1, sh, st, 0);
    sh[0] = 3, sh[1] = 0, st[0] = 1 << 20, st[1] = 8;
    both(p, 0, ZCT_FLOAT64, 2, sh, st, 0);
    sh[0] = 0, sh[1] = INT64_MAX, st[0] = INT64_MAX, st[1] = INT64_MAX;
    both(p, 16, ZCT_UINT8, 2, sh, st, 0);
    /* strided, at offsets in the slot, up to its end exactly and past */
    sh[0] = 4, sh[1] = 4, st[0] = 32, st[1] = 4;
    both(p, 128, ZCT_FLOAT32, 2, sh, st, 1);
    both(p + 8, 120, ZCT_FLOAT32, 2, sh, st, 2);
    both(p + slot - 112, 112, ZCT_FLOAT32, 2, sh, st, 3);
    both(p + slot - 111, 111, ZCT_FLOAT32, 2, sh, st, 3); /* past the slot */
    both(p + slot - 112, 111, ZCT_FLOAT32, 2, sh, st, 3); /* past its extent */
    both(p + slot - 112, 113, ZCT_FLOAT32, 2, sh, st, 3); /* extent past the slot */
    sh[0] = (int64_t)slot, st[0] = 1;
    both(p, slot, ZCT_UINT8, 1, sh, st, 0);
    both(p, slot + 1, ZCT_UINT8, 1, sh, st, 0);
    both(p + 1, slot, ZCT_UINT8, 1, sh, st, 0);
    both(p, UINT64_MAX, ZCT_UINT8, 1, sh, st, 0);
    both(p + 1, UINT64_MAX - 1, ZCT_UINT8, 1, sh, st, 0);
    /* zero strides: many elements, few bytes; then more than int64 holds */
    sh[0] = 1 << 20, st[0] = 0;
    both(p, 8, ZCT_FLOAT64, 1, sh, st, 0);
    sh[0] = (int64_t)1 << 40, sh[1] = (int64_t)1 << 40, st[0] = 0, st[1] = 0;
    both(p, 8, ZCT_FLOAT64, 2, sh, st, 0);
    sh[0] = INT64_MAX, st[0] = 0;
    both(p, 1, ZCT_UINT8, 1, sh, st, 0);
    both(p, 2, ZCT_UINT16, 1, sh, st, 0);
    /* negative strides and shapes */
    sh[0] = 2, st[0] = -4;
    both(p + 4, 8, ZCT_FLOAT32, 1, sh, st, 0);
    sh[0] = -1, st[0] = 4;
    both(p, 8, ZCT_FLOAT32, 1, sh, st, 0);
    /* strides that overflow */
    sh[0] = 3, st[0] = INT64_MAX;
    both(p, slot, ZCT_UINT8, 1, sh, st, 0);
    /* dtype codes: every one up to past the last, and wide ones */
    sh[0] = 2, st[0] = 8;
    for (int32_t dt = -2; dt < 40; dt++) both(p, 32, dt, 1, sh, st, 0);
    both(p, 32, 65536 + ZCT_FLOAT32, 1, sh, st, 0);
    both(p, 32, INT32_MIN, 1, sh, st, 0);
    /* ndim: 32 (the most), 33, negative */
    for (int i = 0; i < 33; i++) sh[i] = 1, st[i] = 8;
    both(p, 8, ZCT_FLOAT64, 32, sh, st, 0);
    both(p, 8, ZCT_FLOAT64, 33, sh, st, 0);
    both(p, 8, ZCT_FLOAT64, -1, sh, st, 0);
    /* NULL shape or strides, NULL address */
    both(p, 8, ZCT_FLOAT64, 1, NULL, st, 0);
    both(p, 8, ZCT_FLOAT64, 1, sh, NULL, 0);
    both(NULL, 8, ZCT_FLOAT64, 1, sh, st, 0);
    /* other record types */
    for (int32_t type = -1; type <= 5; type++) {
        if (type == ZCT_RECORD_TENSOR) continue;
        int rc = zct_queue_put_array(qc, type, p, 8, ZCT_FLOAT64, 0, NULL, NULL, 0, 0);
        int rg = zctipc_go_queue_put_array(qg, type, p, 8, ZCT_FLOAT64, 0, NULL, NULL, 0, 0);
        CHECK(rc == rg);
        if (rc == ZCT_OK) { /* Go sends it, both times */
            zct_view v[8];
            int32_t n;
            CHECK(zct_queue_take(qc, bufc, sizeof bufc, 0, v, 8, &n) >= 0 && n == 1);
            CHECK(zct_ref_release(v[0].ref) == ZCT_OK);
            CHECK(zct_queue_take(qg, bufg, sizeof bufg, 0, v, 8, &n) >= 0 && n == 1);
            CHECK(zct_ref_release(v[0].ref) == ZCT_OK);
        }
        CHECK(holders() == 1);
    }
    /* a slot's table and header: no buffer's bytes */
    both(p - 64, 8, ZCT_UINT8, 0, NULL, NULL, 0);
    CHECK(zct_ref_release(own) == ZCT_OK);
    own_slot = 0;
    /* a slot released: its bytes are no count's */
    both(p, 8, ZCT_FLOAT64, 0, NULL, NULL, 0);
}

/* -- full queues ---------------------------------------------------------- */

typedef struct later {
    zct_handle q;
    int n;
} later;

static void *take_later(void *arg) {
    later *l = arg;
    static uint8_t buf[1 << 16];
    zct_view v[8];
    int32_t n;
    usleep(50 * 1000);
    for (int i = 0; i < l->n; i++) {
        CHECK(zct_queue_take(l->q, buf, sizeof buf, 5000, v, 8, &n) >= 0 && n == 1);
        CHECK(zct_ref_release(v[0].ref) == ZCT_OK);
    }
    return NULL;
}

/* The segment files of the directory this process maps (its own arenas
   among them): the other programs of the test share the directory, and
   only what this one maps is its own. */
static int count_files(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    CHECK(f != NULL);
    char line[1024], seen[256][300];
    int n = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        char *path = strstr(line, dir());
        if (path == NULL || strstr(path, "/zctipc_") == NULL) continue;
        path[strcspn(path, "\n")] = 0;
        int known = 0;
        for (int i = 0; i < n && !known; i++) known = strcmp(seen[i], path) == 0;
        if (!known && n < 256) snprintf(seen[n++], sizeof seen[0], "%s", path);
    }
    fclose(f);
    return n;
}

static void full(void) {
    zct_handle own, small;
    void *at;
    uint64_t size;
    CHECK(zct_pool_alloc(64, 0, &own, &at, &size) == ZCT_OK);
    uint64_t base = slots_in_use();
    CHECK(zct_queue_create(NULL, 4096, 2, &small) == ZCT_OK);
    int64_t sh[1] = {64}, st[1] = {1};
    CHECK(zct_queue_put_array(small, ZCT_RECORD_TENSOR, at, 64, ZCT_UINT8, 1, sh, st, 0, 0) == ZCT_OK);
    CHECK(zct_queue_put_array(small, ZCT_RECORD_TENSOR, at, 64, ZCT_UINT8, 1, sh, st, 0, 0) == ZCT_OK);
    CHECK(slots_in_use() == base);
    int files = count_files();
    for (int i = 0; i < 2000; i++) {
        CHECK(zct_queue_put_array(small, ZCT_RECORD_TENSOR, at, 64, ZCT_UINT8, 1, sh, st, 0, 0) == ZCT_E_FULL);
        CHECK(zct_queue_put_array(small, ZCT_RECORD_TENSOR, at, 64, ZCT_UINT8, 1, sh, st, 0, 1) ==
              ZCT_E_FULL);
    }
    CHECK(slots_in_use() == base && count_files() == files);
    /* a wait Go does: a taker makes room */
    later l = {small, 4};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, take_later, &l) == 0);
    CHECK(zct_queue_put_array(small, ZCT_RECORD_TENSOR, at, 64, ZCT_UINT8, 1, sh, st, 0, 5000) == ZCT_OK);
    CHECK(zct_queue_put_array(small, ZCT_RECORD_TENSOR, at, 64, ZCT_UINT8, 1, sh, st, 0, -1) == ZCT_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(slots_in_use() == base);
    /* a long run of puts and takes makes no ticket arena */
    static uint8_t buf[4096];
    zct_view v[8];
    int32_t n;
    for (int i = 0; i < 20000; i++) {
        CHECK(zct_queue_put_array(small, ZCT_RECORD_TENSOR, at, 64, ZCT_UINT8, 1, sh, st, 0, 0) == ZCT_OK);
        CHECK(zct_queue_take(small, buf, sizeof buf, 0, v, 8, &n) >= 0 && n == 1);
        CHECK(zct_ref_release(v[0].ref) == ZCT_OK);
    }
    CHECK(slots_in_use() == base && count_files() == files);
    CHECK(zct_queue_close(small) == ZCT_OK);
    CHECK(zct_ref_release(own) == ZCT_OK);
}

/* -- threads -------------------------------------------------------------- */

#define PUTTERS 4
#define TAKERS 2
#define EACH 20000

static zct_handle shared_q;
static void *shared_at;
static int64_t taken_total, put_total;
static float *shared_mem;

static void *putter(void *arg) {
    (void)arg;
    int64_t sh[1] = {16}, st[1] = {4};
    for (int i = 0; i < EACH; i++) {
        int r = zct_queue_put_array(shared_q, ZCT_RECORD_TENSOR, shared_at, 64, ZCT_FLOAT32, 1, sh, st, 1, 5000);
        CHECK(r == ZCT_OK);
        __atomic_add_fetch(&put_total, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static void *taker(void *arg) {
    (void)arg;
    static __thread uint8_t buf[4096];
    zct_view v[8];
    int32_t n;
    for (;;) {
        if (__atomic_load_n(&taken_total, __ATOMIC_SEQ_CST) >= PUTTERS * EACH) return NULL;
        int64_t r = zct_queue_take(shared_q, buf, sizeof buf, 10, v, 8, &n);
        if (r == ZCT_E_EMPTY) continue;
        CHECK(r >= 0 && n == 1);
        CHECK(v[0].data == shared_at && v[0].nbytes == 64 && ((float *)v[0].data)[3] == 3.0f);
        CHECK(zct_ref_release(v[0].ref) == ZCT_OK);
        __atomic_add_fetch(&taken_total, 1, __ATOMIC_SEQ_CST);
    }
}

static void threads(void) {
    zct_handle own;
    uint64_t size;
    CHECK(zct_pool_alloc(64, 0, &own, &shared_at, &size) == ZCT_OK);
    shared_mem = shared_at;
    for (int i = 0; i < 16; i++) shared_mem[i] = (float)i;
    uint64_t base = slots_in_use();
    CHECK(zct_queue_create(NULL, 1 << 16, 0, &shared_q) == ZCT_OK);
    pthread_t t[PUTTERS + TAKERS];
    for (int i = 0; i < PUTTERS; i++) CHECK(pthread_create(&t[i], NULL, putter, NULL) == 0);
    for (int i = 0; i < TAKERS; i++) CHECK(pthread_create(&t[PUTTERS + i], NULL, taker, NULL) == 0);
    for (int i = 0; i < PUTTERS + TAKERS; i++) CHECK(pthread_join(t[i], NULL) == 0);
    CHECK(taken_total == PUTTERS * EACH && put_total == PUTTERS * EACH);
    CHECK(slots_in_use() == base);
    int64_t holders = 0;
    CHECK(zct_ref_holders(own, &holders) == ZCT_OK && holders == 1);
    static uint8_t buf[4096];
    zct_view v[8];
    int32_t n;
    CHECK(zct_queue_take(shared_q, buf, sizeof buf, 0, v, 8, &n) == ZCT_E_EMPTY);

    /* a record's bytes again, once taken: refused, nothing taken */
    mapped m = map_queue(shared_q);
    int64_t sh[1] = {16}, st[1] = {4};
    CHECK(zct_queue_put_array(shared_q, ZCT_RECORD_TENSOR, shared_at, 64, ZCT_FLOAT32, 1, sh, st, 1, 0) == ZCT_OK);
    CHECK(zct_queue_take(shared_q, buf, sizeof buf, 0, v, 8, &n) >= 0 && n == 1);
    uint32_t rsize;
    memcpy(&rsize, buf, 4);
    static uint8_t replay[4096];
    memcpy(replay, buf, rsize);
    CHECK(zct_ref_release(v[0].ref) == ZCT_OK);
    for (int round = 0; round < 2; round++) {
        forge(&m, shared_q, replay, rsize);
        if (round == 0) {
            CHECK(zct_queue_take(shared_q, buf, sizeof buf, 0, v, 8, &n) == ZCT_E_TAKEN);
        } else {
            int32_t type;
            uint64_t off, plen;
            CHECK(zct_queue_get(shared_q, buf, sizeof buf, 0, &type, &off, &plen, v, 8, &n) == ZCT_E_TAKEN);
        }
        CHECK(slots_in_use() == base);
        CHECK(zct_ref_holders(own, &holders) == ZCT_OK && holders == 1);
    }
    CHECK(zct_queue_close(shared_q) == ZCT_OK);
    CHECK(zct_ref_release(own) == ZCT_OK);
}

/* -- thousands in flight ---------------------------------------------------- */

#define FLIGHT 6000

static void flight(void) {
    zct_handle own, q;
    void *at;
    uint64_t size;
    CHECK(zct_pool_alloc(16, 0, &own, &at, &size) == ZCT_OK);
    uint64_t base = slots_in_use();
    CHECK(zct_queue_create(NULL, 0, 0, &q) == ZCT_OK);
    int files = count_files();
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < FLIGHT; i++) {
            CHECK(zct_queue_put_array(q, ZCT_RECORD_TENSOR, at, 8, ZCT_INT64, 0, NULL, NULL, 0, 0) == ZCT_OK);
        }
        int64_t holders = 0;
        CHECK(zct_ref_holders(own, &holders) == ZCT_OK && holders == FLIGHT + 1);
        CHECK(round == 1 || count_files() > files); /* Go made ticket arenas */
        static uint8_t buf[4096];
        zct_view v[8];
        int32_t n;
        for (int i = 0; i < FLIGHT; i++) {
            if (i % 2) {
                CHECK(zct_queue_take(q, buf, sizeof buf, 0, v, 8, &n) >= 0 && n == 1);
            } else {
                int32_t type;
                uint64_t off, plen;
                CHECK(zct_queue_get(q, buf, sizeof buf, 0, &type, &off, &plen, v, 8, &n) == ZCT_OK && n == 1);
            }
            CHECK(v[0].data == at && v[0].ndim == 0 && v[0].nbytes == 8);
            CHECK(zct_ref_release(v[0].ref) == ZCT_OK);
        }
        CHECK(zct_ref_holders(own, &holders) == ZCT_OK && holders == 1);
        CHECK(slots_in_use() == base);
    }
    CHECK(zct_queue_close(q) == ZCT_OK);
    CHECK(zct_ref_release(own) == ZCT_OK);
}

/* -- slots freed and handed out again while they are put ------------------ */

#define ROUNDS 5000

static void *volatile published;
static int racing;
static uint64_t churned; /* slots the churn released */

/* Hands slots out, tags them, publishes them and releases them, again
   and again: the slot a putter finds is freed and handed out anew
   between its find and its count. */
static void *churn(void *arg) {
    (void)arg;
    uint64_t tag = 1;
    while (__atomic_load_n(&racing, __ATOMIC_SEQ_CST)) {
        zct_handle ref;
        void *at;
        uint64_t size;
        CHECK(zct_pool_alloc(64, 0, &ref, &at, &size) == ZCT_OK);
        for (int i = 0; i < 8; i++) __atomic_store_n((uint64_t *)at + i, tag, __ATOMIC_SEQ_CST);
        tag++;
        __atomic_store_n(&published, at, __ATOMIC_SEQ_CST);
        if (tag % 64 == 0) CHECK(zct_pool_trim() == ZCT_OK);
        for (int k = 0; k < (int)(tag % 8); k++) sched_yield();
        CHECK(zct_ref_release(ref) == ZCT_OK);
        __atomic_add_fetch(&churned, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static void races(void) {
    zct_handle q;
    uint64_t base = slots_in_use();
    CHECK(zct_queue_create(NULL, 1 << 20, 0, &q) == ZCT_OK);
    racing = 1;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, churn, NULL) == 0);
    int64_t sh[1] = {8}, st[1] = {8};
    static uint8_t buf[4096];
    zct_view v[8];
    int32_t n;
    int sent = 0;
    while (__atomic_load_n(&published, __ATOMIC_SEQ_CST) == NULL) sched_yield();
    for (int i = 0; i < ROUNDS; i++) {
        void *at = __atomic_load_n(&published, __ATOMIC_SEQ_CST);
        int r = zct_queue_put_array(q, ZCT_RECORD_TENSOR, at, 64, ZCT_UINT64, 1, sh, st, 0, 0);
        if (r != ZCT_OK) {
            CHECK(r == ZCT_E_NOT_FOUND);
            continue;
        }
        sent++;
        /* the count is on the generation live at the put, which stays
           while it is held: once the churn let that one go (two slots
           later), it never hands the slot out anew, nor writes it */
        CHECK(zct_queue_take(q, buf, sizeof buf, 0, v, 8, &n) >= 0 && n == 1 && v[0].data == at);
        uint64_t c = __atomic_load_n(&churned, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&churned, __ATOMIC_SEQ_CST) < c + 2) sched_yield();
        const uint64_t *w = v[0].data;
        uint64_t first = __atomic_load_n(&w[0], __ATOMIC_SEQ_CST);
        for (int k = 0; k < 20; k++) sched_yield();
        for (int k = 0; k < 8; k++) CHECK(__atomic_load_n(&w[k], __ATOMIC_SEQ_CST) == first);
        CHECK(zct_ref_release(v[0].ref) == ZCT_OK);
    }
    __atomic_store_n(&racing, 0, __ATOMIC_SEQ_CST);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(sent > 0);
    CHECK(zct_queue_take(q, buf, sizeof buf, 0, v, 8, &n) == ZCT_E_EMPTY);
    CHECK(slots_in_use() == base);
    CHECK(zct_queue_close(q) == ZCT_OK);
}

int main(void) {
    uint64_t base = slots_in_use();
    CHECK(zct_queue_create(NULL, 1 << 20, 0, &qc) == ZCT_OK);
    CHECK(zct_queue_create(NULL, 1 << 20, 0, &qg) == ZCT_OK);
    equivalence();
    CHECK(zct_queue_close(qc) == ZCT_OK);
    CHECK(zct_queue_close(qg) == ZCT_OK);
    CHECK(slots_in_use() == base);
    full();
    threads();
    flight();
    races();
    CHECK(slots_in_use() == base);
    int64_t count;
    CHECK(zct_release_all(&count) == ZCT_OK);
    printf("ok\n");
    return 0;
}
