// What the C programs that attack the data plane share: a queue's data
// region mapped straight from its file, to forge what another process of
// the user may write there, and its words (format.md, "Queues").
#ifndef ABITEST_MAPPED_H
#define ABITEST_MAPPED_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"

#define RING_AT 512 /* the ring, in a queue's data */
#define PUT_LOCK 64
#define TAIL 96
#define RESERVED 104
#define GET_LOCK 128
#define HEAD 160
#define GIVEN_BACK 168
#define DATA_WAITERS 260
#define SPACE_WAITERS 324
#define JOIN_WAITERS 388
#define CHUNK (2u << 20)

/* A queue's file, mapped. */
typedef struct {
    char path[512];
    int fd;
    uint8_t *file;
    uint64_t size;
    uint8_t *data;      /* its data region */
    uint64_t data_at;   /* where that starts in the file */
    uint32_t capacity;  /* ring bytes */
} mapped;

static inline mapped map_queue(zct_handle q) {
    mapped m;
    char name[256];
    uint64_t capacity, maxsize;
    CHECK(zct_queue_describe(q, name, sizeof name, &capacity, &maxsize) == ZCT_OK);
    const char *dir = getenv("ZCTIPC_SHM_DIR");
    snprintf(m.path, sizeof m.path, "%s/%s", dir ? dir : "/dev/shm", name);
    m.fd = open(m.path, O_RDWR);
    CHECK(m.fd >= 0);
    struct stat st;
    CHECK(fstat(m.fd, &st) == 0);
    m.size = (uint64_t)st.st_size;
    m.file = mmap(NULL, m.size, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
    CHECK(m.file != MAP_FAILED);
    memcpy(&m.data_at, m.file + 16, 8);
    m.data = m.file + m.data_at;
    uint64_t ring;
    memcpy(&ring, m.data, 8);
    m.capacity = (uint32_t)ring;
    return m;
}

static inline void unmap_queue(mapped *m) {
    CHECK(munmap(m->file, m->size) == 0);
    CHECK(close(m->fd) == 0);
}

static inline uint32_t *word32(const mapped *m, int off) { return (uint32_t *)(m->data + off); }
static inline uint64_t *word64(const mapped *m, int off) { return (uint64_t *)(m->data + off); }
static inline uint32_t ld32(const mapped *m, int off) { return __atomic_load_n(word32(m, off), __ATOMIC_SEQ_CST); }
static inline uint64_t ld64(const mapped *m, int off) { return __atomic_load_n(word64(m, off), __ATOMIC_SEQ_CST); }
static inline void st32(const mapped *m, int off, uint32_t v) { __atomic_store_n(word32(m, off), v, __ATOMIC_SEQ_CST); }
static inline void st64(const mapped *m, int off, uint64_t v) { __atomic_store_n(word64(m, off), v, __ATOMIC_SEQ_CST); }

/* Take one plain record into buf: its payload's length, or a status (a
   record with views is refused as corrupt). */
static inline int64_t take_plain(zct_handle q, void *buf, uint64_t cap, int64_t timeout_ms) {
    int32_t nviews = -1;
    zct_view views[8];
    int64_t r = zct_queue_take(q, buf, cap, timeout_ms, views, 8, &nviews);
    if (r < 0) {
        return r;
    }
    CHECK(nviews == 0);
    CHECK(((r >> ZCT_TAKE_OFFSET_SHIFT) & ZCT_TAKE_FIELD_MASK) == ZCT_RECORD_HEADER);
    return r & ZCT_TAKE_FIELD_MASK;
}

/* How many pool slots are out of their free stacks, held here or anywhere. */
static inline uint64_t slots_in_use(void) {
    zct_pool_stats st;
    CHECK(zct_pool_stats_get(&st) == ZCT_OK);
    return st.slots_in_use;
}

/* Put raw (size bytes, a multiple of 8, its first word its size) as the
   next record of queue q, whose file m maps: a bytes record of that size,
   overwritten, as a writer who lies would leave it. */
static inline void forge(const mapped *m, zct_handle q, const uint8_t *raw, uint32_t size) {
    static char zeros[1 << 16];
    CHECK(size >= ZCT_RECORD_HEADER && size - ZCT_RECORD_HEADER <= sizeof zeros);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, zeros, size - ZCT_RECORD_HEADER, NULL, 0, 0) == ZCT_OK);
    uint32_t tail = (uint32_t)ld64(m, TAIL);
    for (uint32_t i = 0; i < size; i++) m->data[RING_AT + (tail - size + i) % m->capacity] = raw[i];
}

/* A view of four float32s from first, in a fresh pool slot of bytes. */
static inline zct_view slot_view(float first, uint64_t bytes) {
    zct_handle ref;
    void *mem;
    uint64_t size;
    CHECK(zct_pool_alloc(bytes, 0, &ref, &mem, &size) == ZCT_OK);
    for (int i = 0; i < 4; i++) ((float *)mem)[i] = first + (float)i;
    zct_view v;
    memset(&v, 0, sizeof v);
    v.ref = ref;
    v.dtype = ZCT_FLOAT32;
    v.ndim = 1;
    v.shape[0] = 4;
    v.strides[0] = 4;
    return v;
}

/* A light ref's handle has its top bit set (handoff.c). */
#define LIGHT (1ull << 63)

#endif
