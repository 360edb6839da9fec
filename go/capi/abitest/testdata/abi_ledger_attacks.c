// Attacks on this process's ledger through the C ABI (ledger.c in package
// plane, handoff.c's records of light refs): a light ref taken under one
// ledger and released after zct_cleanup_disable and zct_cleanup_enable
// made another must leave the new ledger's records as they are, and a
// ledger whose file another process shrank records nothing and faults
// nothing; light refs taken and released by one thread while another
// disables and enables cleanup over and over (the plane ledger moved to
// each new file under them) leave no entry held in the last ledger once
// all are released (one would be given up twice by a sweep). The daemon
// is never reached (its path names no program): the
// ledger is kept all the same. It prints "ok" when every check passes.
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include "mapped.h"

#define LEDGER_DATA (64u + 65536u * 512u) /* a ledger's data region (format.md, "ledger") */
#define NO_DAEMON "/nonexistent/zctipcd"

/* The ledger file of this process in the segment directory, mapped, its
   data region at *data; NULL when there is none. */
static uint8_t *map_ledger(uint8_t **data, uint64_t *size, char *path, size_t cap) {
    const char *dir = getenv("ZCTIPC_SHM_DIR");
    dir = dir ? dir : "/dev/shm";
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    uint8_t *found = NULL;
    for (struct dirent *e; found == NULL && (e = readdir(d)) != NULL;) {
        snprintf(path, cap, "%s/%s", dir, e->d_name);
        int fd = open(path, O_RDWR);
        if (fd < 0) {
            continue;
        }
        struct stat st;
        uint64_t data_at = 0;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 24 && pread(fd, &data_at, 8, 16) == 8 &&
            (uint64_t)st.st_size > data_at && (uint64_t)st.st_size - data_at == LEDGER_DATA) {
            found = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            CHECK(found != MAP_FAILED);
            *data = found + data_at;
            *size = (uint64_t)st.st_size;
        }
        close(fd);
    }
    closedir(d);
    return found;
}

/* The entries of ledger data, reserved so far, that are not free. */
static int held_entries(const uint8_t *data, uint32_t *states, int cap) {
    uint32_t capacity = __atomic_load_n((const uint32_t *)data, __ATOMIC_SEQ_CST);
    int n = 0;
    for (uint32_t i = 0; i < capacity && i < (uint32_t)cap; i++) {
        states[i] = __atomic_load_n((const uint32_t *)(data + 64 + (uint64_t)i * 512), __ATOMIC_SEQ_CST);
        n += states[i] != 0;
    }
    return n;
}

/* Take one tensor record of a fresh slot from q: a light ref. */
static zct_handle light_ref(zct_handle q) {
    zct_view v = slot_view(1, 16);
    CHECK(zct_queue_put(q, ZCT_RECORD_TENSOR, NULL, 0, &v, 1, 0) == ZCT_OK);
    static uint8_t buf[4096];
    zct_view views[2];
    int32_t nviews = -1;
    CHECK(zct_queue_take(q, buf, sizeof buf, 0, views, 2, &nviews) >= 0);
    CHECK(nviews == 1 && (views[0].ref & LIGHT) != 0);
    return views[0].ref;
}

/* A light ref, as light_ref takes it, into a buffer of the caller's. */
static zct_handle light_ref_into(zct_handle q, uint8_t *buf, size_t cap) {
    zct_view v = slot_view(1, 16);
    CHECK(zct_queue_put(q, ZCT_RECORD_TENSOR, NULL, 0, &v, 1, 0) == ZCT_OK);
    zct_view views[2];
    int32_t nviews = -1;
    CHECK(zct_queue_take(q, buf, cap, 0, views, 2, &nviews) >= 0);
    CHECK(nviews == 1 && (views[0].ref & LIGHT) != 0);
    return views[0].ref;
}

static int moving = 1;

static void *take_and_release(void *arg) {
    zct_handle q = *(zct_handle *)arg;
    static uint8_t buf[4096];
    zct_handle held[4];
    int n = 0;
    for (int i = 0; i < 3000 || __atomic_load_n(&moving, __ATOMIC_SEQ_CST); i++) {
        if (n == 4) {
            CHECK(zct_ref_release(held[0]) == ZCT_OK);
            memmove(held, held + 1, 3 * sizeof held[0]);
            n--;
        }
        held[n++] = light_ref_into(q, buf, sizeof buf);
    }
    for (int i = 0; i < n; i++) CHECK(zct_ref_release(held[i]) == ZCT_OK);
    return NULL;
}

/* Cleanup disabled and enabled 200 times while another thread takes and
   releases light refs: once all are released, the last ledger holds no
   entry, and every slot is free. */
static void moves_under_refs(zct_handle q) {
    CHECK(zct_cleanup_enable(NO_DAEMON) != ZCT_OK);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, take_and_release, &q) == 0);
    for (int i = 0; i < 200; i++) {
        CHECK(zct_cleanup_disable() == ZCT_OK);
        CHECK(zct_cleanup_enable(NO_DAEMON) != ZCT_OK);
    }
    __atomic_store_n(&moving, 0, __ATOMIC_SEQ_CST);
    CHECK(pthread_join(t, NULL) == 0);
    char path[512];
    uint8_t *data;
    uint64_t size;
    uint8_t *file = map_ledger(&data, &size, path, sizeof path);
    CHECK(file != NULL);
    static uint32_t states[65536];
    CHECK(held_entries(data, states, 65536) == 0);
    CHECK(munmap(file, (size_t)size) == 0);
    CHECK(slots_in_use() == 0);
}

int main(void) {
    zct_handle q;
    CHECK(zct_queue_create(NULL, 1 << 16, 0, &q) == ZCT_OK);
    zct_handle warm = light_ref(q); /* the arena mapped and listed before any ledger */
    CHECK(zct_ref_release(warm) == ZCT_OK);

    /* A light ref recorded in the first ledger, at its first entry. */
    CHECK(zct_cleanup_enable(NO_DAEMON) != ZCT_OK);
    zct_handle old = light_ref(q);
    CHECK(zct_cleanup_disable() == ZCT_OK);

    /* A second ledger, whose first entries record light refs of its own. */
    CHECK(zct_cleanup_enable(NO_DAEMON) != ZCT_OK);
    zct_handle fresh[4];
    for (int i = 0; i < 4; i++) fresh[i] = light_ref(q);
    char path[512];
    uint8_t *data;
    uint64_t size;
    uint8_t *file = map_ledger(&data, &size, path, sizeof path);
    CHECK(file != NULL);
    static uint32_t before[65536], after[65536];
    int held = held_entries(data, before, 65536);
    CHECK(held >= 4);

    /* The old light ref's release clears no record of the second ledger:
       its entry was the first ledger's. */
    CHECK(zct_ref_release(old) == ZCT_OK);
    CHECK(held_entries(data, after, 65536) == held);
    for (int i = 0; i < 4; i++) CHECK(zct_ref_release(fresh[i]) == ZCT_OK);
    CHECK(held_entries(data, after, 65536) == held - 4);
    for (int i = 0; i < 4; i++) fresh[i] = light_ref(q);
    CHECK(held_entries(data, after, 65536) == held);

    /* The ledger's file shrunk by another process: takes and releases go
       on, recording nothing, and nothing faults. */
    CHECK(truncate(path, 0) == 0);
    zct_handle more[4];
    for (int i = 0; i < 4; i++) more[i] = light_ref(q);
    for (int i = 0; i < 4; i++) {
        CHECK(zct_ref_release(fresh[i]) == ZCT_OK);
        CHECK(zct_ref_release(more[i]) == ZCT_OK);
    }
    CHECK(munmap(file, (size_t)size) == 0);

    CHECK(zct_cleanup_disable() == ZCT_OK);
    moves_under_refs(q);

    CHECK(zct_queue_close(q) == ZCT_OK);
    CHECK(slots_in_use() == 0);
    CHECK(zct_release_all(NULL) == ZCT_OK);
    CHECK(zct_cleanup_disable() == ZCT_OK);
    printf("ok\n");
    return 0;
}
