// Attacks on the element-type codes of the C ABI. Every call that takes a
// dtype refuses an unknown code (0, negative, past 16 bits, past the last
// one) with ZCT_E_DTYPE, leaving its out-parameters, the queue and every
// count as they were; every valid code round-trips through each of them;
// a table takes only uint8 in one dimension. On the decoding side, a
// dtype forged into a segment header, a descriptor, a queue record or a
// stream's layout is refused (ZCT_E_DTYPE where zctipc.h says so for a
// header, ZCT_E_CORRUPT otherwise), and a valid code of another itemsize
// is refused when its array would reach past its bytes. It prints "ok"
// when every check passes, and leaves nothing behind.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"

#define RING_AT 512 /* the ring, in a queue's data (format.md, "Queues") */
#define STREAM_DTYPE 28 /* the u32 dtype code of a stream's frames, in its data (format.md, "Streams") */
#define NCODES 15

/* The element types of format.md, by code. */
static const int SIZE[NCODES + 1] = {0, 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 2, 8, 16};
static const char *NAME[NCODES + 1] = {"",        "bool",    "int8",    "int16",   "int32",    "int64",
                                       "uint8",   "uint16",  "uint32",  "uint64",  "float16",  "float32",
                                       "float64", "bfloat16", "complex64", "complex128"};

/* Codes no call may take: none, negative, past 16 bits (whose low bits
   are a valid code, which a conversion would wrap onto), past the last. */
static const int32_t BAD[] = {
    0,
    -1,
    INT32_MIN,
    INT32_MAX,
    1 << 16,
    (1 << 16) + ZCT_FLOAT32,
    (int32_t)0xFFFF0000 + ZCT_FLOAT32, /* -65536 + 11 */
    0x7FFF0000 + ZCT_UINT8,
    ZCT_COMPLEX128 + 1,
    0xFFFF,
    256 + ZCT_FLOAT32,
};
#define NBAD (int)(sizeof BAD / sizeof BAD[0])

static zct_handle queue;
static uint8_t *qdata; /* the queue's data, mapped */
static char buf[1 << 16];
static zct_view views[8];

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* CRC-32 (IEEE), as a header's checksum is. */
static uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++) crc = crc & 1 ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
    }
    return ~crc;
}

/* Write a header's checksum again (format.md, "Checksum"). */
static void reseal(uint8_t *h) {
    uint16_t hlen;
    memcpy(&hlen, h + 6, 2);
    put32(h + 56, crc32_update(crc32_update(0, h, 56), h + 128, hlen - 128u));
}

/* Map the file of segment name read-write; *size receives its size. */
static uint8_t *map_file(const char *name, size_t *size) {
    char path[512];
    const char *dir = getenv("ZCTIPC_SHM_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "/dev/shm", name);
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    struct stat st;
    CHECK(fstat(fd, &st) == 0);
    uint8_t *p = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED);
    CHECK(close(fd) == 0);
    *size = st.st_size;
    return p;
}

static int64_t refcount_of(zct_handle seg) {
    int64_t n = -1;
    CHECK(zct_segment_refcount(seg, &n) == ZCT_OK);
    return n;
}

static int64_t queue_items(void) {
    int64_t items = -1, unfinished = -1;
    CHECK(zct_queue_len(queue, &items, &unfinished) == ZCT_OK);
    return items;
}

static uint64_t slots_in_use(void) {
    zct_pool_stats st;
    CHECK(zct_pool_stats_get(&st) == ZCT_OK);
    return st.slots_in_use;
}

/* Put raw (size bytes, a multiple of 8, its first word its size) as the
   queue's next record: a bytes record of that size, overwritten. */
static void forge(const uint8_t *raw, uint32_t size) {
    static char zeros[4096];
    CHECK(zct_queue_put(queue, ZCT_RECORD_BYTES, zeros, size - ZCT_RECORD_HEADER, NULL, 0, 0) == ZCT_OK);
    uint64_t ring, word;
    memcpy(&ring, qdata, 8);
    memcpy(&word, qdata + 96, 8);
    uint32_t tail = (uint32_t)word;
    for (uint32_t i = 0; i < size; i++) qdata[RING_AT + (tail - size + i) % ring] = raw[i];
}

/* A record's header: size bytes in all, of type, with ndesc descriptors
   and plen bytes of payload. */
static void record_header(uint8_t *raw, uint32_t size, uint8_t type, uint16_t ndesc, uint32_t plen) {
    memset(raw, 0, ZCT_RECORD_HEADER);
    put32(raw, size);
    raw[4] = type;
    put16(raw + 6, ndesc);
    put32(raw + 8, plen);
}

/* An inline record of an array of dtype code of shape {n} whose elements
   are nbytes bytes; its size. */
static uint32_t inline_record(uint8_t *raw, uint16_t code, int64_t n, uint32_t nbytes) {
    uint32_t plen = 16 + nbytes, size = (ZCT_RECORD_HEADER + plen + 7) & ~7u;
    memset(raw, 0, size);
    record_header(raw, size, ZCT_RECORD_INLINE, 0, plen);
    uint8_t *p = raw + ZCT_RECORD_HEADER;
    put16(p, code);
    p[3] = 1;
    put64(p + 8, (uint64_t)n);
    memset(p + 16, 1, nbytes);
    return size;
}

/* A tensor record of the descriptor d (len bytes, a multiple of 8); its size. */
static uint32_t tensor_record(uint8_t *raw, const uint8_t *d, uint64_t len) {
    uint32_t size = ZCT_RECORD_HEADER + (uint32_t)len;
    record_header(raw, size, ZCT_RECORD_TENSOR, 1, 0);
    memcpy(raw + ZCT_RECORD_HEADER, d, len);
    return size;
}

/* Take the next record with get, take, get_many or peek (how 0..3) and
   return the status (a peek moves *cursor past it). */
static int next_record(int how, uint64_t *cursor) {
    int32_t type = 0, nviews = 0, records = 0;
    uint64_t off = 0, plen = 0, filled = 0, missed = 0;
    zct_record recs[4];
    switch (how) {
    case 0:
        return zct_queue_get(queue, buf, sizeof buf, 0, &type, &off, &plen, views, 8, &nviews);
    case 1: {
        int64_t r = zct_queue_take(queue, buf, sizeof buf, 0, views, 8, &nviews);
        return r < 0 ? (int)r : ZCT_OK;
    }
    case 2: {
        int status = zct_queue_get_many(queue, buf, sizeof buf, 1, 0, &records, recs, &filled, views, 8, &nviews);
        CHECK(status == ZCT_OK || records == (status == ZCT_E_EMPTY ? 0 : 1));
        return status;
    }
    default:
        return zct_queue_peek(queue, cursor, buf, sizeof buf, &type, &off, &plen, views, 8, &nviews, &missed);
    }
}

/* A peek took nothing: the record it refused and the one after it are
   still in the queue, and a get takes them as the peek read them. */
static void drain_peeked(int status) {
    CHECK(next_record(0, NULL) == status);
    CHECK(next_record(0, NULL) == ZCT_OK && memcmp(buf + ZCT_RECORD_HEADER, "next", 4) == 0);
}

/* Every valid code, through every call that takes or gives one. */
static void valid_codes_round_trip(void) {
    for (int32_t code = 1; code <= NCODES; code++) {
        const int64_t s = SIZE[code];
        int64_t shape[2] = {2, 3}, strides[2] = {3 * s, s};
        zct_handle seg = 0;
        zct_info info, got;
        CHECK(zct_segment_create(NULL, code, 2, shape, &seg, &info) == ZCT_OK);
        CHECK(info.dtype == code && info.ndim == 2 && info.nbytes == (uint64_t)(6 * s));
        CHECK(info.strides[0] == 3 * s && info.strides[1] == s);
        CHECK(zct_segment_stat(info.name, &got) == ZCT_OK && got.dtype == code && got.nbytes == info.nbytes);

        /* The header as the file holds it decodes to the same code. */
        size_t fsize;
        uint8_t *file = map_file(info.name, &fsize);
        CHECK(zct_header_decode(file, fsize < 4096 ? fsize : 4096, fsize, &got) == ZCT_OK && got.dtype == code);
        CHECK(munmap(file, fsize) == 0);

        /* A TensorRef names it by its name. */
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"segment\":\"%s\",\"dtype\":\"%s\",\"shape\":[2,3],\"strides\":[%lld,%lld],\"nbytes\":%lld}",
                 info.name, NAME[code], (long long)(3 * s), (long long)s, (long long)(6 * s));
        zct_handle other = 0;
        CHECK(zct_tensor_ref_attach(json, strlen(json), 1, &other, &got) == ZCT_OK && got.dtype == code);
        CHECK(zct_segment_close(other) == ZCT_OK);

        zct_handle un = 0;
        CHECK(zct_segment_create_uninit(NULL, ZCT_KIND_TENSOR, code, 2, shape, &un, &got) == ZCT_OK);
        CHECK(got.dtype == code && got.nbytes == info.nbytes);
        CHECK(zct_segment_close(un) == ZCT_OK);

        /* A stream's frames, made and attached. */
        zct_handle st = 0, st2 = 0;
        zct_stream_info si, si2;
        CHECK(zct_stream_create(NULL, code, 2, shape, 2, 1, 0, 0, &st, &si) == ZCT_OK);
        CHECK(si.dtype == code && si.frame_bytes == (uint64_t)(6 * s));
        CHECK(zct_stream_attach(si.name, &st2, &si2) == ZCT_OK && si2.dtype == code && si2.frame_bytes == si.frame_bytes);
        CHECK(zct_stream_close(st2) == ZCT_OK && zct_stream_close(st) == ZCT_OK);

        /* Inline, by array and by view through a queue. */
        int32_t nviews = 0;
        CHECK(zct_queue_put_inline(queue, info.data, info.nbytes, code, 2, shape, 0, 0) == ZCT_OK);
        CHECK(next_record(0, NULL) == ZCT_OK);
        CHECK(views[0].kind == ZCT_REF_INLINE && views[0].dtype == code && views[0].nbytes == info.nbytes);
        CHECK(views[0].strides[0] == 3 * s && views[0].strides[1] == s);
        CHECK(zct_queue_put_array(queue, ZCT_RECORD_TENSOR, info.data, info.nbytes, code, 2, shape, strides, 0, 0) ==
              ZCT_OK);
        CHECK(next_record(0, NULL) == ZCT_OK);
        CHECK(views[0].ref != 0 && views[0].dtype == code && views[0].nbytes == info.nbytes);
        CHECK(zct_ref_release(views[0].ref) == ZCT_OK);
        zct_view v;
        memset(&v, 0, sizeof v);
        uint64_t off = 1;
        CHECK(zct_ref_find(info.data, info.nbytes, &v.ref, &off) == ZCT_OK && off == 0);
        v.dtype = code;
        v.ndim = 2;
        memcpy(v.shape, shape, sizeof shape);
        memcpy(v.strides, strides, sizeof strides);
        CHECK(zct_queue_put(queue, ZCT_RECORD_TENSOR, NULL, 0, &v, 1, 0) == ZCT_OK);
        int32_t type = 0;
        uint64_t poff = 0, plen = 0;
        CHECK(zct_queue_get(queue, buf, sizeof buf, 0, &type, &poff, &plen, views, 8, &nviews) == ZCT_OK);
        CHECK(type == ZCT_RECORD_TENSOR && nviews == 1 && views[0].dtype == code);
        CHECK(zct_ref_release(views[0].ref) == ZCT_OK);

        /* Descriptors, described and encoded. */
        uint8_t d[1024];
        uint64_t len = 0;
        zct_view back;
        CHECK(zct_ref_find(info.data, info.nbytes, &v.ref, &off) == ZCT_OK);
        CHECK(zct_ref_describe(&v, d, sizeof d, &len) == ZCT_OK);
        CHECK(zct_ref_attach(d, len, &back) == ZCT_OK && back.dtype == code && back.nbytes == info.nbytes);
        CHECK(zct_ref_release(back.ref) == ZCT_OK);
        CHECK(zct_ref_encode(&v, d, sizeof d, &len) == ZCT_OK);
        CHECK(zct_ref_decode(d, len, &back) == ZCT_OK && back.dtype == code);
        CHECK(zct_ref_release(back.ref) == ZCT_OK);

        CHECK(refcount_of(seg) == 1);
        CHECK(zct_segment_close(seg) == ZCT_OK);
    }
    CHECK(queue_items() == 0);
}

/* Every bad code, at every call that takes one: ZCT_E_DTYPE, out-parameters
   untouched, nothing made, nothing put, no count taken. */
static void bad_codes_are_refused(const char *name) {
    int64_t shape[2] = {2, 3}, strides[2] = {12, 4};
    zct_handle seg = 0;
    zct_info info;
    CHECK(zct_segment_create(NULL, ZCT_FLOAT32, 2, shape, &seg, &info) == ZCT_OK);
    char made[300];
    snprintf(made, sizeof made, "%s_bad", name);
    for (int i = 0; i < NBAD; i++) {
        const int32_t code = BAD[i];
        zct_handle out = 0xD7;
        zct_info before, after;
        memset(&before, 0xAB, sizeof before);
        memcpy(&after, &before, sizeof after);
        CHECK(zct_segment_create(made, code, 2, shape, &out, &after) == ZCT_E_DTYPE);
        CHECK(strstr(zct_last_error(), "dtype") != NULL);
        CHECK(out == 0xD7 && memcmp(&before, &after, sizeof after) == 0);
        CHECK(zct_segment_create_uninit(made, ZCT_KIND_TENSOR, code, 2, shape, &out, &after) == ZCT_E_DTYPE);
        CHECK(zct_segment_create_uninit(made, ZCT_KIND_TABLE, code, 1, shape, &out, &after) == ZCT_E_DTYPE);
        CHECK(out == 0xD7 && memcmp(&before, &after, sizeof after) == 0);
        CHECK(zct_segment_stat(made, &after) == ZCT_E_NOT_FOUND);

        zct_stream_info sbefore, safter;
        memset(&sbefore, 0xAB, sizeof sbefore);
        memcpy(&safter, &sbefore, sizeof safter);
        CHECK(zct_stream_create(made, code, 2, shape, 2, 1, 0, 0, &out, &safter) == ZCT_E_DTYPE);
        CHECK(out == 0xD7 && memcmp(&sbefore, &safter, sizeof safter) == 0);
        CHECK(zct_segment_stat(made, &after) == ZCT_E_NOT_FOUND);

        CHECK(zct_queue_put_inline(queue, info.data, 24, code, 2, shape, 0, 0) == ZCT_E_DTYPE);
        CHECK(zct_queue_put_array(queue, ZCT_RECORD_TENSOR, info.data, 24, code, 2, shape, strides, 0, 0) ==
              ZCT_E_DTYPE);
        CHECK(queue_items() == 0 && refcount_of(seg) == 1);

        /* Views: the refs stay the caller's, under their handles. */
        zct_view v[2];
        memset(v, 0, sizeof v);
        uint64_t off;
        for (int j = 0; j < 2; j++) {
            CHECK(zct_ref_find(info.data, 24, &v[j].ref, &off) == ZCT_OK);
            v[j].dtype = ZCT_FLOAT32;
            v[j].ndim = 2;
            memcpy(v[j].shape, shape, sizeof shape);
            memcpy(v[j].strides, strides, sizeof strides);
        }
        v[1].dtype = code;
        CHECK(zct_queue_put(queue, ZCT_RECORD_PICKLE, "p", 1, v, 2, 0) == ZCT_E_DTYPE);
        CHECK(queue_items() == 0 && refcount_of(seg) == 3);
        uint8_t d[1024];
        uint64_t len = 0x77;
        CHECK(zct_ref_describe(&v[1], d, sizeof d, &len) == ZCT_E_DTYPE && len == 0x77);
        CHECK(zct_ref_encode(&v[1], d, sizeof d, &len) == ZCT_E_DTYPE && len == 0x77);
        int64_t holders = 0;
        CHECK(zct_ref_holders(v[1].ref, &holders) == ZCT_OK && holders == 3);
        CHECK(zct_ref_release(v[0].ref) == ZCT_OK && zct_ref_release(v[1].ref) == ZCT_OK);
        CHECK(refcount_of(seg) == 1);
    }

    /* A TensorRef names its dtype: a name of none is ZCT_E_DTYPE, one of
       another type a mismatch, and one that is not a name a bad argument. */
    char json[1024];
    const char *unknown[] = {"float33", "invalid", "dtype(11)", "FLOAT32", "object"};
    zct_handle other = 0;
    zct_info got;
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        snprintf(json, sizeof json,
                 "{\"segment\":\"%s\",\"dtype\":\"%s\",\"shape\":[2,3],\"strides\":[12,4],\"nbytes\":24}", info.name,
                 unknown[i]);
        CHECK(zct_tensor_ref_attach(json, strlen(json), 1, &other, &got) == ZCT_E_DTYPE);
    }
    snprintf(json, sizeof json,
             "{\"segment\":\"%s\",\"dtype\":\"int32\",\"shape\":[2,3],\"strides\":[12,4],\"nbytes\":24}", info.name);
    CHECK(zct_tensor_ref_attach(json, strlen(json), 1, &other, &got) == ZCT_E_INVALID);
    CHECK(strstr(zct_last_error(), "dtype int32 where the segment holds float32") != NULL);
    snprintf(json, sizeof json, "{\"segment\":\"%s\",\"dtype\":11,\"shape\":[2,3],\"strides\":[12,4],\"nbytes\":24}",
             info.name);
    CHECK(zct_tensor_ref_attach(json, strlen(json), 1, &other, &got) == ZCT_E_INVALID);
    CHECK(refcount_of(seg) == 1);
    CHECK(zct_segment_close(seg) == ZCT_OK);
}

/* A table is uint8 in one dimension (format.md, "Segment kinds"):
   zct_segment_create_uninit makes no table of another type or shape. */
static void tables_are_uint8(const char *name) {
    char made[300];
    snprintf(made, sizeof made, "%s_table", name);
    int64_t shape[2] = {2, 3};
    zct_handle out = 0xD7;
    zct_info info;
    for (int32_t code = 1; code <= NCODES; code++) {
        if (code == ZCT_UINT8) continue;
        CHECK(zct_segment_create_uninit(made, ZCT_KIND_TABLE, code, 1, shape, &out, &info) == ZCT_E_INVALID);
        CHECK(strstr(zct_last_error(), "uint8") != NULL);
    }
    CHECK(zct_segment_create_uninit(made, ZCT_KIND_TABLE, ZCT_UINT8, 2, shape, &out, &info) == ZCT_E_INVALID);
    CHECK(zct_segment_create_uninit(made, ZCT_KIND_TABLE, ZCT_UINT8, 0, shape, &out, &info) == ZCT_E_INVALID);
    CHECK(out == 0xD7);
    CHECK(zct_segment_stat(made, &info) == ZCT_E_NOT_FOUND);
    CHECK(zct_segment_create_uninit(made, ZCT_KIND_TABLE, ZCT_UINT8, 1, shape, &out, &info) == ZCT_OK);
    CHECK(info.kind == ZCT_KIND_TABLE && info.dtype == ZCT_UINT8 && info.ndim == 1 && info.nbytes == 2);
    CHECK(zct_segment_publish(out) == ZCT_OK);
    zct_info got;
    CHECK(zct_segment_stat(made, &got) == ZCT_OK && got.dtype == ZCT_UINT8);
    CHECK(zct_segment_close(out) == ZCT_OK);
    CHECK(zct_table_create(NULL, 5, &out, &info) == ZCT_OK);
    CHECK(info.kind == ZCT_KIND_TABLE && info.dtype == ZCT_UINT8 && info.ndim == 1 && info.shape[0] == 5);
    CHECK(zct_segment_close(out) == ZCT_OK);
}

/* A segment header whose dtype was forged, in memory and in a file that
   this process never mapped (one it mapped it reads by the header it
   validated then, which a writer cannot change under it). */
static void forged_headers_are_refused(const char *name) {
    static const struct {
        uint16_t code;
        int status;
    } forged[] = {
        {0, ZCT_E_DTYPE},
        {ZCT_COMPLEX128 + 1, ZCT_E_DTYPE},
        {0xFFFF, ZCT_E_DTYPE},
        {0x8000 | ZCT_FLOAT32, ZCT_E_DTYPE},
        {0x100 | ZCT_FLOAT32, ZCT_E_DTYPE},
        /* a larger itemsize: the array would reach past its bytes */
        {ZCT_FLOAT64, ZCT_E_CORRUPT},
        {ZCT_INT64, ZCT_E_CORRUPT},
        {ZCT_COMPLEX64, ZCT_E_CORRUPT},
        {ZCT_COMPLEX128, ZCT_E_CORRUPT},
    };
    char made[300];
    snprintf(made, sizeof made, "%s_hdr", name);
    int64_t shape[2] = {2, 3};
    zct_handle seg = 0, out = 0xD7;
    zct_info info, got;
    CHECK(zct_segment_create(made, ZCT_FLOAT32, 2, shape, &seg, &info) == ZCT_OK);
    size_t fsize;
    uint8_t *file = map_file(info.name, &fsize);
    uint8_t *copy = malloc(fsize);
    CHECK(copy != NULL);
    memcpy(copy, file, fsize);
    CHECK(munmap(file, fsize) == 0);
    CHECK(zct_segment_close(seg) == ZCT_OK);
    CHECK(zct_segment_stat(info.name, &got) == ZCT_E_NOT_FOUND);
    char path[512];
    const char *dir = getenv("ZCTIPC_SHM_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "/dev/shm", info.name);
    int fd = open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
    CHECK(fd >= 0);
    CHECK(write(fd, copy, fsize) == (ssize_t)fsize && close(fd) == 0);
    free(copy);
    file = map_file(info.name, &fsize);
    uint8_t saved[256];
    memcpy(saved, file, sizeof saved);
    char json[1024];
    snprintf(json, sizeof json,
             "{\"segment\":\"%s\",\"dtype\":\"float32\",\"shape\":[2,3],\"strides\":[12,4],\"nbytes\":24}", info.name);
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        uint8_t h[256];
        memcpy(h, saved, sizeof h);
        put16(h + 12, forged[i].code);
        CHECK(zct_header_decode(h, sizeof h, fsize, &got) == ZCT_E_CORRUPT); /* its checksum */
        CHECK(strstr(zct_last_error(), "checksum") != NULL);
        reseal(h);
        memset(&got, 0xAB, sizeof got);
        zct_info untouched;
        memcpy(&untouched, &got, sizeof got);
        CHECK(zct_header_decode(h, sizeof h, fsize, &got) == forged[i].status);
        CHECK(memcmp(&got, &untouched, sizeof got) == 0);
        /* in the file: every reader of it refuses it alike */
        memcpy(file, h, sizeof h);
        CHECK(zct_segment_stat(info.name, &got) == forged[i].status);
        CHECK(zct_segment_attach(info.name, ZCT_KIND_ANY, 0, &out, &got) == forged[i].status);
        CHECK(zct_segment_attach(info.name, ZCT_KIND_TENSOR, 1, &out, &got) == forged[i].status);
        CHECK(zct_tensor_ref_attach(json, strlen(json), 1, &out, &got) == forged[i].status);
        uint64_t len = 0;
        CHECK(zct_segment_observe(info.name, buf, sizeof buf, &len) == forged[i].status);
        CHECK(out == 0xD7 && memcmp(&got, &untouched, sizeof got) == 0);
        memcpy(file, saved, sizeof saved);
    }
    /* A smaller itemsize keeps the array in its bytes: it is read so. */
    uint8_t h[256];
    memcpy(h, saved, sizeof h);
    put16(h + 12, ZCT_UINT8);
    reseal(h);
    CHECK(zct_header_decode(h, sizeof h, fsize, &got) == ZCT_OK);
    CHECK(got.dtype == ZCT_UINT8 && got.nbytes == 24);
    CHECK(got.strides[0] * (got.shape[0] - 1) + got.strides[1] * (got.shape[1] - 1) + 1 <= 24);
    CHECK(munmap(file, fsize) == 0);
    /* Repaired, it attaches. */
    CHECK(zct_segment_attach(info.name, ZCT_KIND_TENSOR, 0, &seg, &got) == ZCT_OK && got.dtype == ZCT_FLOAT32);
    CHECK(zct_segment_close(seg) == ZCT_OK);
    CHECK(zct_segment_unlink(info.name) == ZCT_OK);
}

/* Write n bytes at off in the oldest record of the queue, in its ring. */
static void patch_oldest(uint32_t off, const void *p, uint32_t n) {
    uint64_t ring, word;
    memcpy(&ring, qdata, 8);
    memcpy(&word, qdata + 160, 8);
    uint32_t head = (uint32_t)word;
    for (uint32_t i = 0; i < n; i++) qdata[RING_AT + (head + off + i) % ring] = ((const uint8_t *)p)[i];
}

/* Descriptors whose dtype was forged, attached, decoded, and in a queue's
   records, by every way of taking them. One that fails its own checks
   takes no count; one whose bytes were made to fit its forged dtype is
   refused for reaching past its segment, after the count it carried, if
   any, was taken: that count is given up, never left taken. */
static void forged_descriptors_are_refused(void) {
    static const struct {
        uint16_t code;
        uint64_t nbytes; /* 0: the descriptor's own */
        int fits;        /* whether the array lies in the descriptor's (forged) bytes */
    } forged[] = {
        {0, 0, 0},
        {ZCT_COMPLEX128 + 1, 0, 0},
        {0xFFFF, 0, 0},
        {0x100 | ZCT_FLOAT32, 0, 0},
        {ZCT_FLOAT64, 0, 0},     /* past its own 24 bytes */
        {ZCT_FLOAT64, 48, 1},    /* its bytes made to fit it: past the segment's 24 */
        {ZCT_COMPLEX128, 96, 1},
    };
    int64_t shape[2] = {2, 3}, strides[2] = {12, 4};
    zct_handle seg = 0;
    zct_info info;
    CHECK(zct_segment_create(NULL, ZCT_FLOAT32, 2, shape, &seg, &info) == ZCT_OK);
    zct_view v;
    memset(&v, 0, sizeof v);
    uint64_t off;
    CHECK(zct_ref_find(info.data, 24, &v.ref, &off) == ZCT_OK);
    v.dtype = ZCT_FLOAT32;
    v.ndim = 2;
    memcpy(v.shape, shape, sizeof shape);
    memcpy(v.strides, strides, sizeof strides);
    const zct_handle held = v.ref;
    uint8_t described[1024], encoded[1024], d[1024], raw[2048];
    uint64_t dlen = 0, elen = 0;
    CHECK(zct_ref_describe(&v, described, sizeof described, &dlen) == ZCT_OK);
    CHECK(refcount_of(seg) == 2); /* this process, and the described ref */

    /* A tensor record of the described bytes, unforged, decodes: its
       count is refused as never sent. So what the forged ones below fail
       on is their dtype. */
    forge(raw, tensor_record(raw, described, dlen));
    CHECK(next_record(0, NULL) == ZCT_E_TAKEN);

    zct_view back, untouched;
    memset(&untouched, 0xAB, sizeof untouched);
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        memcpy(d, described, dlen);
        put16(d + 4, forged[i].code);
        if (forged[i].nbytes) put64(d + 16, forged[i].nbytes);
        memcpy(&back, &untouched, sizeof back);
        CHECK(zct_ref_attach(d, dlen, &back) == ZCT_E_CORRUPT);
        CHECK(memcmp(&back, &untouched, sizeof back) == 0);

        /* Encoded, with a count. */
        CHECK(zct_ref_find(info.data, 24, &v.ref, &off) == ZCT_OK);
        CHECK(zct_ref_encode(&v, encoded, sizeof encoded, &elen) == ZCT_OK);
        CHECK(refcount_of(seg) == 3);
        memcpy(d, encoded, elen);
        put16(d + 4, forged[i].code);
        if (forged[i].nbytes) put64(d + 16, forged[i].nbytes);
        CHECK(zct_ref_decode(d, elen, &back) == ZCT_E_CORRUPT);
        CHECK(memcmp(&back, &untouched, sizeof back) == 0);
        if (forged[i].fits) {
            CHECK(refcount_of(seg) == 2); /* taken, and given up */
            CHECK(zct_ref_decode(encoded, elen, &back) == ZCT_E_TAKEN);
        } else {
            CHECK(refcount_of(seg) == 3); /* never taken: the true bytes have it */
            CHECK(zct_ref_decode(encoded, elen, &back) == ZCT_OK && back.dtype == ZCT_FLOAT32);
            CHECK(zct_ref_release(back.ref) == ZCT_OK);
        }

        /* In a queue's record: one that fails its own checks in described
           bytes, one that fits in a record put with its count. */
        for (int how = 0; how < 4; how++) {
            uint64_t cursor = ZCT_PEEK_OLDEST;
            CHECK(queue_items() == 0);
            if (forged[i].fits) {
                CHECK(zct_queue_put_array(queue, ZCT_RECORD_TENSOR, info.data, 24, ZCT_FLOAT32, 2, shape, strides, 0,
                                          0) == ZCT_OK);
                CHECK(refcount_of(seg) == 3);
                uint16_t code = forged[i].code;
                uint64_t nbytes = forged[i].nbytes;
                patch_oldest(ZCT_RECORD_HEADER + 4, &code, 2);
                patch_oldest(ZCT_RECORD_HEADER + 16, &nbytes, 8);
            } else {
                memcpy(d, described, dlen);
                put16(d + 4, forged[i].code);
                forge(raw, tensor_record(raw, d, dlen));
            }
            CHECK(zct_queue_put(queue, ZCT_RECORD_BYTES, "next", 4, NULL, 0, 0) == ZCT_OK);
            CHECK(next_record(how, &cursor) == ZCT_E_CORRUPT);
            CHECK(next_record(how, &cursor) == ZCT_OK && memcmp(buf + ZCT_RECORD_HEADER, "next", 4) == 0);
            if (how == 3) drain_peeked(ZCT_E_CORRUPT);
            CHECK(queue_items() == 0 && refcount_of(seg) == 2);
        }
    }

    /* A valid code of no larger itemsize keeps the array in its bytes:
       it is read as it says. */
    const uint16_t smaller[] = {ZCT_UINT8, ZCT_INT16, ZCT_INT32, ZCT_BOOL};
    for (size_t i = 0; i < sizeof smaller / sizeof smaller[0]; i++) {
        memcpy(d, described, dlen);
        put16(d + 4, smaller[i]);
        CHECK(zct_ref_attach(d, dlen, &back) == ZCT_OK && back.dtype == smaller[i] && back.nbytes == 24);
        CHECK(back.data == info.data);
        CHECK(zct_ref_release(back.ref) == ZCT_OK);
    }
    CHECK(zct_ref_release(held) == ZCT_OK);
    CHECK(refcount_of(seg) == 1);
    CHECK(zct_segment_close(seg) == ZCT_OK);
}

/* Inline records whose dtype was forged, by every way of taking them. */
static void forged_inline_records_are_refused(void) {
    static const struct {
        uint16_t code;
        int64_t n;
        uint32_t nbytes;
    } forged[] = {
        {0, 1, 1},
        {ZCT_COMPLEX128 + 1, 1, 16},
        {0xFFFF, 1, 8},
        {0x100 | ZCT_UINT8, 1, 1},
        {ZCT_FLOAT64, 1, 4},    /* fewer bytes than its shape makes */
        {ZCT_FLOAT32, 1, 8},    /* more */
        {ZCT_COMPLEX128, 2, 16},
        {ZCT_BOOL, 2, 1},
    };
    uint8_t raw[256];
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        uint32_t size = inline_record(raw, forged[i].code, forged[i].n, forged[i].nbytes);
        for (int how = 0; how < 4; how++) {
            uint64_t cursor = ZCT_PEEK_OLDEST;
            forge(raw, size);
            CHECK(zct_queue_put(queue, ZCT_RECORD_BYTES, "next", 4, NULL, 0, 0) == ZCT_OK);
            CHECK(next_record(how, &cursor) == ZCT_E_CORRUPT);
            CHECK(next_record(how, &cursor) == ZCT_OK && memcmp(buf + ZCT_RECORD_HEADER, "next", 4) == 0);
            if (how == 3) drain_peeked(ZCT_E_CORRUPT);
            CHECK(queue_items() == 0);
        }
    }
    /* The same record, told the truth, is an array. */
    forge(raw, inline_record(raw, ZCT_FLOAT64, 1, 8));
    CHECK(next_record(0, NULL) == ZCT_OK && views[0].dtype == ZCT_FLOAT64 && views[0].nbytes == 8);
}

/* A stream whose frames' dtype code (a u32 of its layout) was forged. */
static void forged_streams_are_refused(void) {
    static const uint32_t forged[] = {
        0,
        ZCT_COMPLEX128 + 1,
        0xFFFF,
        0x10000 + ZCT_FLOAT32, /* past 16 bits: its low half is the true code */
        0x10000 + ZCT_INT32,
        0xFFFF0000u + ZCT_FLOAT32,
        0x80000000u + ZCT_FLOAT32,
        0xFFFFFFFFu,
        ZCT_FLOAT64, /* another itemsize: the layout is of other frames */
        ZCT_UINT8,
        ZCT_INT16,
        ZCT_COMPLEX128,
    };
    int64_t shape[1] = {16};
    zct_handle s = 0, other = 0xD7;
    zct_stream_info si, got;
    CHECK(zct_stream_create(NULL, ZCT_FLOAT32, 1, shape, 4, 1, 0, 0, &s, &si) == ZCT_OK);
    uint8_t *word = (uint8_t *)si.data + STREAM_DTYPE;
    uint64_t len = 0;
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        put32(word, forged[i]);
        memset(&got, 0xAB, sizeof got);
        zct_stream_info untouched;
        memcpy(&untouched, &got, sizeof got);
        CHECK(zct_stream_attach(si.name, &other, &got) == ZCT_E_CORRUPT);
        CHECK(other == 0xD7 && memcmp(&got, &untouched, sizeof got) == 0);
        CHECK(zct_segment_observe(si.name, buf, sizeof buf, &len) == ZCT_E_CORRUPT);
    }
    /* One of the same itemsize cannot be told from the truth: it is read
       as it says, in the same frames. */
    put32(word, ZCT_INT32);
    CHECK(zct_stream_attach(si.name, &other, &got) == ZCT_OK && got.dtype == ZCT_INT32 && got.frame_bytes == 64);
    CHECK(zct_stream_close(other) == ZCT_OK);
    put32(word, ZCT_FLOAT32);
    CHECK(zct_stream_attach(si.name, &other, &got) == ZCT_OK && got.dtype == ZCT_FLOAT32);
    CHECK(zct_segment_observe(si.name, buf, sizeof buf, &len) == ZCT_OK);
    CHECK(strstr(buf, "\"dtype\":11,") != NULL);
    CHECK(zct_stream_close(other) == ZCT_OK && zct_stream_close(s) == ZCT_OK);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *name = argv[1];

    CHECK(zct_queue_create(NULL, 1 << 16, 0, &queue) == ZCT_OK);
    char qname[256];
    uint64_t capacity, maxsize;
    CHECK(zct_queue_describe(queue, qname, sizeof qname, &capacity, &maxsize) == ZCT_OK);
    size_t qsize;
    uint8_t *qfile = map_file(qname, &qsize);
    uint64_t data_offset;
    memcpy(&data_offset, qfile + 16, 8);
    qdata = qfile + data_offset;

    valid_codes_round_trip();
    bad_codes_are_refused(name);
    tables_are_uint8(name);
    forged_headers_are_refused(name);
    forged_descriptors_are_refused();
    forged_inline_records_are_refused();
    forged_streams_are_refused();

    CHECK(queue_items() == 0);
    CHECK(munmap(qfile, qsize) == 0);
    CHECK(zct_queue_close(queue) == ZCT_OK);
    CHECK(slots_in_use() == 0);
    CHECK(zct_release_all(NULL) == ZCT_OK);
    printf("ok\n");
    return 0;
}
