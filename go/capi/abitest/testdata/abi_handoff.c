// A hand-off outside Go (handoff.c, Note [a ref made outside Go]):
// zct_queue_put_array of pool memory puts a record that a take here and a
// get through Go read alike, and refuses what Go refuses; zct_queue_take of records whose descriptors name pool slots gives views
// under light refs, whose release gives every count back; a light ref named
// by any other call becomes Go's and keeps working; a replayed descriptor
// is refused alone or in a record, giving back or up every other count;
// more refs than the table holds go through Go. It prints "ok" when every check passes, and
// leaves no count taken.
#define _GNU_SOURCE
#include "mapped.h"

static zct_handle queue;
static mapped m; /* its file */




static int64_t take(uint8_t *buf, uint64_t cap, zct_view *views, int32_t *nviews) {
    return zct_queue_take(queue, buf, cap, 0, views, 8, nviews);
}

static float first_of(const zct_view *v) { return ((const float *)v->data)[0]; }

int main(void) {
    static uint8_t buf[1 << 16];
    static zct_view views[8];
    int32_t nviews = -1;
    uint64_t base = slots_in_use();

    CHECK(zct_queue_create(NULL, 1 << 20, 0, &queue) == ZCT_OK);
    m = map_queue(queue);

    /* A tensor record: one view under a light ref, the slot's bytes. */
    zct_view v = slot_view(10, 16);
    CHECK(zct_queue_put(queue, ZCT_RECORD_TENSOR, NULL, 0, &v, 1, 0) == ZCT_OK);
    CHECK(slots_in_use() >= base + 1);
    int64_t r = take(buf, sizeof buf, views, &nviews);
    CHECK(r >= 0 && nviews == 1);
    CHECK((r >> ZCT_TAKE_TYPE_SHIFT) == ZCT_RECORD_TENSOR);
    CHECK((views[0].ref & LIGHT) != 0 && views[0].kind == ZCT_REF_SLOT);
    CHECK(views[0].ndim == 1 && views[0].shape[0] == 4 && views[0].strides[0] == 4 && views[0].nbytes == 16);
    CHECK(views[0].dtype == ZCT_FLOAT32 && first_of(&views[0]) == 10);
    uint32_t size;
    memcpy(&size, buf, 4);
    static uint8_t replay[4096];
    memcpy(replay, buf, size);
    CHECK(zct_ref_release(views[0].ref) == ZCT_OK);
    CHECK(zct_ref_release(views[0].ref) == ZCT_E_CLOSED); /* once */
    CHECK(slots_in_use() == base);

    /* The same bytes again: refused, and nothing taken. */
    forge(&m, queue, replay, size);
    CHECK(take(buf, sizeof buf, views, &nviews) == ZCT_E_TAKEN);
    CHECK(strstr(zct_last_error(), "already taken") != NULL);
    CHECK(slots_in_use() == base);
    CHECK(take(buf, sizeof buf, views, &nviews) == ZCT_E_EMPTY);

    /* A pickle of three views whose middle one is the replay: refused
       whole; the first's count goes back and the last's is given up. */
    zct_view three[3] = {slot_view(1, 16), slot_view(2, 16), slot_view(3, 16)};
    CHECK(zct_queue_put(queue, ZCT_RECORD_PICKLE, "p", 1, three, 3, 0) == ZCT_OK);
    CHECK(slots_in_use() == base + 3);
    CHECK(take(buf, sizeof buf, views, &nviews) >= 0 && nviews == 3);
    for (int i = 0; i < 3; i++) CHECK(first_of(&views[i]) == 1 + i && (views[i].ref & LIGHT) != 0);
    uint32_t psize;
    memcpy(&psize, buf, 4);
    static uint8_t pickle[4096];
    memcpy(pickle, buf, psize);
    uint16_t d0, d1;
    memcpy(&d0, pickle + ZCT_RECORD_HEADER, 2); /* the descriptors' sizes */
    memcpy(&d1, pickle + ZCT_RECORD_HEADER + d0, 2);
    for (int i = 0; i < 3; i++) CHECK(zct_ref_release(views[i].ref) == ZCT_OK);
    CHECK(slots_in_use() == base);

    /* Fresh first and last descriptors (counts in flight, as
       zct_ref_encode sends them) around the stale middle one. */
    zct_view a = slot_view(5, 16), c = slot_view(6, 16);
    uint64_t alen, clen;
    static uint8_t forged[4096];
    uint8_t *p = forged + ZCT_RECORD_HEADER;
    CHECK(zct_ref_encode(&a, p, 1024, &alen) == ZCT_OK);
    p += alen;
    memcpy(p, pickle + ZCT_RECORD_HEADER + d0, d1);
    p += d1;
    CHECK(zct_ref_encode(&c, p, 1024, &clen) == ZCT_OK);
    p += clen;
    *p++ = 'p';
    uint32_t fsize = (uint32_t)((p - forged + 7) & ~7);
    memset(forged, 0, ZCT_RECORD_HEADER);
    memcpy(forged, &fsize, 4);
    forged[4] = ZCT_RECORD_PICKLE;
    uint16_t ndesc = 3;
    memcpy(forged + 6, &ndesc, 2);
    uint32_t one = 1;
    memcpy(forged + 8, &one, 4);
    CHECK(slots_in_use() == base + 2);
    forge(&m, queue, forged, fsize);
    CHECK(take(buf, sizeof buf, views, &nviews) == ZCT_E_TAKEN);
    CHECK(strstr(zct_last_error(), "already taken") != NULL);
    CHECK(slots_in_use() == base);
    forge(&m, queue, forged, fsize); /* and again: every ticket taken now */
    CHECK(take(buf, sizeof buf, views, &nviews) == ZCT_E_TAKEN);
    CHECK(slots_in_use() == base);

    /* A light ref that another call names becomes Go's, and works on. */
    v = slot_view(20, 16);
    CHECK(zct_queue_put(queue, ZCT_RECORD_TENSOR, NULL, 0, &v, 1, 0) == ZCT_OK);
    CHECK(take(buf, sizeof buf, views, &nviews) >= 0 && nviews == 1 && (views[0].ref & LIGHT) != 0);
    int64_t holders = 0;
    CHECK(zct_ref_holders(views[0].ref, &holders) == ZCT_OK && holders == 1);
    CHECK(zct_queue_put(queue, ZCT_RECORD_TENSOR, NULL, 0, &views[0], 1, 0) == ZCT_OK); /* sent on */
    CHECK(zct_ref_release(views[0].ref) == ZCT_E_CLOSED);                              /* the put's */
    CHECK(take(buf, sizeof buf, views, &nviews) >= 0 && nviews == 1 && first_of(&views[0]) == 20);
    zct_handle held = views[0].ref;
    CHECK(zct_ref_holders(held, &holders) == ZCT_OK && holders == 1);
    CHECK(zct_ref_release(held) == ZCT_OK); /* Go's release of a ref that was light */
    CHECK(zct_ref_holders(held, &holders) == ZCT_E_CLOSED);
    CHECK(slots_in_use() == base);

    /* Handles that name nothing. */
    CHECK(zct_ref_release(LIGHT | 12345) == ZCT_E_CLOSED);
    CHECK(zct_ref_release(UINT64_MAX) == ZCT_E_CLOSED);
    CHECK(zct_ref_holders(LIGHT | 12345, &holders) == ZCT_E_CLOSED);

    /* More refs held at once than the table of light refs holds: the rest
       are Go's, and every one is right. */
    enum { MANY = 5000 };
    static zct_handle many[MANY];
    int light = 0;
    for (int i = 0; i < MANY; i++) {
        v = slot_view((float)i, 16);
        CHECK(zct_queue_put(queue, ZCT_RECORD_TENSOR, NULL, 0, &v, 1, 0) == ZCT_OK);
        CHECK(take(buf, sizeof buf, views, &nviews) >= 0 && nviews == 1 && first_of(&views[0]) == (float)i);
        many[i] = views[0].ref;
        light += (many[i] & LIGHT) != 0;
    }
    CHECK(light > 1000 && light < MANY);
    CHECK(slots_in_use() == base + MANY);
    for (int i = 0; i < MANY; i++) CHECK(zct_ref_release(many[i]) == ZCT_OK);
    CHECK(slots_in_use() == base);

    /* zct_queue_put_array of pool memory, outside Go: the record it puts is
       taken here and through Go alike, whole, and every count comes back. */
    uint64_t put_base = slots_in_use();
    int64_t shape2[2] = {2, 2}, strides2[2] = {16, 4};
    for (int round = 0; round < 2; round++) {
        void *at;
        uint64_t got;
        zct_handle own;
        CHECK(zct_pool_alloc(64, 0, &own, &at, &got) == ZCT_OK);
        for (int i = 0; i < 16; i++) ((float *)at)[i] = (float)(100 * round + i);
        /* every other row of a 4x4 array: a strided view, at an offset */
        CHECK(zct_queue_put_array(queue, ZCT_RECORD_TENSOR, (float *)at + 1, 60, ZCT_FLOAT32, 2, shape2, strides2, 3,
                                  0) == ZCT_OK);
        CHECK(slots_in_use() == put_base + 1);
        CHECK(zct_ref_release(own) == ZCT_OK); /* the record holds it now */
        CHECK(slots_in_use() == put_base + 1);
        int32_t type = 0;
        uint64_t off = 0, plen = 0;
        if (round == 0) {
            CHECK(take(buf, sizeof buf, views, &nviews) >= 0 && nviews == 1);
        } else {
            CHECK(zct_queue_get(queue, buf, sizeof buf, 0, &type, &off, &plen, views, 8, &nviews) == ZCT_OK);
            CHECK(type == ZCT_RECORD_TENSOR && nviews == 1);
        }
        CHECK(views[0].kind == ZCT_REF_SLOT && views[0].offset == 4 && views[0].flags == 3);
        CHECK(views[0].ndim == 2 && views[0].shape[0] == 2 && views[0].strides[0] == 16 && views[0].nbytes == 24);
        CHECK(((float *)views[0].data)[0] == (float)(100 * round + 1) && ((float *)views[0].data)[5] == (float)(100 * round + 6));
        CHECK(zct_ref_release(views[0].ref) == ZCT_OK);
        CHECK(slots_in_use() == put_base);
    }
    {
        void *at;
        uint64_t got;
        zct_handle own;
        CHECK(zct_pool_alloc(64, 0, &own, &at, &got) == ZCT_OK);
        static float heap[16];
        /* not zctipc memory; reaching past its extent; a scalar */
        CHECK(zct_queue_put_array(queue, ZCT_RECORD_TENSOR, heap, 64, ZCT_FLOAT32, 2, shape2, strides2, 0, 0) ==
              ZCT_E_NOT_FOUND);
        CHECK(zct_queue_put_array(queue, ZCT_RECORD_TENSOR, at, 20, ZCT_FLOAT32, 2, shape2, strides2, 0, 0) ==
              ZCT_E_INVALID);
        CHECK(slots_in_use() == put_base + 1);
        CHECK(zct_queue_put_array(queue, ZCT_RECORD_TENSOR, at, 4, ZCT_FLOAT32, 0, NULL, NULL, 0, 0) == ZCT_OK);
        CHECK(take(buf, sizeof buf, views, &nviews) >= 0 && nviews == 1 && views[0].ndim == 0 && views[0].nbytes == 4);
        CHECK(zct_ref_release(views[0].ref) == ZCT_OK);
        /* a full queue: refused at once with a timeout of 0, no count left */
        zct_handle small;
        CHECK(zct_queue_create(NULL, 4096, 0, &small) == ZCT_OK);
        int sent = 0;
        for (;;) {
            int r = zct_queue_put_array(small, ZCT_RECORD_TENSOR, at, 64, ZCT_UINT8, 1, (int64_t[]){64},
                                        (int64_t[]){1}, 0, 0);
            if (r == ZCT_E_FULL) break;
            CHECK(r == ZCT_OK);
            sent++;
        }
        CHECK(sent > 1 && slots_in_use() == put_base + 1);
        int32_t hnd = 0;
        for (int i = 0; i < sent; i++) {
            CHECK(zct_queue_take(small, buf, sizeof buf, 0, views, 8, &nviews) >= 0 && nviews == 1);
            CHECK(zct_ref_release(views[0].ref) == ZCT_OK);
            hnd++;
        }
        CHECK(hnd == sent);
        CHECK(zct_queue_close(small) == ZCT_OK);
        CHECK(zct_ref_release(own) == ZCT_OK);
        CHECK(slots_in_use() == put_base);
    }

    unmap_queue(&m);
    CHECK(zct_queue_close(queue) == ZCT_OK);
    CHECK(slots_in_use() == base);
    CHECK(zct_release_all(NULL) == ZCT_OK);
    printf("ok\n");
    return 0;
}
