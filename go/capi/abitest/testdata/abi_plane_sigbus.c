// The data plane's fault guard through the C ABI (guard.c in package
// plane): a queue's file shrunk while threads put, take, arm and disarm
// through it ends their calls with ZCT_E_CORRUPT and never the process,
// Go code that meets the shrunk file (zct_queue_len) says the same, and a
// SIGBUS raised outside the plane's steps still reaches what it reached
// before: the default action (the process dies of it), or a handler the
// program installed before or after the guard. It prints "ok" when every
// check passes.
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include "child.h"
#include "mapped.h"

static zct_handle queue;
static volatile int stop;

static void *hammer(void *arg) {
    long id = (long)arg;
    static __thread uint8_t buf[1 << 14];
    uint8_t payload[3000];
    memset(payload, (int)id, sizeof payload);
    int after = 0; /* calls after the cut */
    for (unsigned i = 0; !stop || after++ < 400; i++) {
        int r;
        uint32_t *word, seen;
        switch ((id + i) % 4) {
        case 0:
            r = zct_queue_put(queue, ZCT_RECORD_BYTES, payload, 1 + i % sizeof payload, NULL, 0, 0);
            /* An unbounded queue's reservation of pages past the cut fails as
               one on a full file system does (shm.ReservePages). */
            CHECK(r == ZCT_OK || r == ZCT_E_FULL || r == ZCT_E_CORRUPT || r == ZCT_E_NO_SPACE);
            break;
        case 1:
            r = (int)take_plain(queue, buf, sizeof buf, 0);
            CHECK(r >= 0 || r == ZCT_E_EMPTY || r == ZCT_E_CORRUPT);
            break;
        case 2:
            r = zct_queue_arm(queue, ZCT_WAIT_DATA, &word, &seen);
            CHECK(r == ZCT_OK || r == ZCT_E_CORRUPT);
            if (r == ZCT_OK) {
                int d = zct_queue_disarm(queue, ZCT_WAIT_DATA, 1);
                CHECK(d == ZCT_OK || d == ZCT_E_CORRUPT);
            }
            break;
        default: {
            int64_t items, unfinished;
            r = zct_queue_len(queue, &items, &unfinished); /* in Go */
            CHECK(r == ZCT_OK || r == ZCT_E_CORRUPT);
        }
        }
    }
    return NULL;
}

/* Threads at work on a queue whose file is cut (to nothing, or to its
   words and the ring's first page) under them. */
static void shrunk_under_threads(uint64_t capacity, int to_nothing) {
    CHECK(zct_queue_create(NULL, capacity, 0, &queue) == ZCT_OK);
    mapped m = map_queue(queue);
    pthread_t t[6];
    stop = 0;
    for (long i = 0; i < 6; i++) {
        CHECK(pthread_create(&t[i], NULL, hammer, (void *)i) == 0);
    }
    usleep(50 * 1000);
    uint64_t keep = to_nothing ? 0 : (m.data_at + RING_AT + 4096 + 4095) & ~4095ull;
    CHECK(ftruncate(m.fd, (off_t)keep) == 0); /* the hostile process */
    stop = 1;
    for (int i = 0; i < 6; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
    }
    if (!to_nothing) {
        CHECK(ld32(&m, PUT_LOCK) == 0 && ld32(&m, GET_LOCK) == 0);
    }
    CHECK(unlink(m.path) == 0);
    unmap_queue(&m);
    (void)zct_queue_close(queue);
}

/* A SIGBUS of the program's own, on a file of its own that it shrank. */
static void own_sigbus(void) {
    char path[] = "/tmp/zctipc-sigbus-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(unlink(path) == 0);
    CHECK(ftruncate(fd, 4096) == 0);
    volatile uint8_t *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED);
    p[0] = 1;
    CHECK(ftruncate(fd, 0) == 0);
    p[0] = 2; /* SIGBUS */
}

/* The steps that install the guard, and one that faults in it. */
static void use_the_plane(void) {
    zct_handle q;
    CHECK(zct_queue_create(NULL, 4096, 0, &q) == ZCT_OK);
    uint8_t buf[64];
    uint32_t *word, seen;
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "x", 1, NULL, 0, 0) == ZCT_OK);
    CHECK(take_plain(q, buf, sizeof buf, 0) == 1);
    CHECK(zct_queue_arm(q, ZCT_WAIT_DATA, &word, &seen) == ZCT_OK);
    CHECK(zct_queue_disarm(q, ZCT_WAIT_DATA, 0) == ZCT_OK);
    mapped m = map_queue(q);
    CHECK(ftruncate(m.fd, 0) == 0);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "x", 1, NULL, 0, 0) == ZCT_E_CORRUPT);
    CHECK(unlink(m.path) == 0);
    unmap_queue(&m);
    (void)zct_queue_close(q);
}

static sigjmp_buf caught;
static volatile int handled, expected;
static struct sigaction previous;

/* Counts every SIGBUS and hands it on to the handler before it, as a
   handler that chains does; one the program expected it ends here. */
static void on_bus(int sig, siginfo_t *info, void *ctx) {
    handled++;
    if (expected) {
        expected = 0;
        siglongjmp(caught, 1);
    }
    previous.sa_sigaction(sig, info, ctx);
}

static void install(void (*fn)(int, siginfo_t *, void *)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fn;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    CHECK(sigaction(SIGBUS, &sa, &previous) == 0);
}

static int child(const char *mode) {
    if (strcmp(mode, "default") == 0) { /* the default action, past the guard */
        use_the_plane();
        own_sigbus();
        return 3; /* not reached */
    }
    if (strcmp(mode, "before") == 0) { /* a handler that the guard goes over */
        install(on_bus);
        use_the_plane();
        int before = handled; /* Go's own faults, at the close, go through it */
        if (sigsetjmp(caught, 1) == 0) {
            expected = 1;
            own_sigbus();
        }
        CHECK(handled == before + 1);
        return 0;
    }
    if (strcmp(mode, "after") == 0) { /* a handler over the guard */
        use_the_plane();
        install(on_bus);
        use_the_plane(); /* the put's fault went through the handler to the guard */
        CHECK(handled >= 1);
        if (sigsetjmp(caught, 1) == 0) {
            expected = 1;
            own_sigbus();
        }
        return 0;
    }
    return 2;
}

int main(int argc, char **argv) {
    if (argc == 2) {
        return child(argv[1]);
    }
    for (int round = 0; round < 4; round++) {
        shrunk_under_threads(1 << 16, round % 2);
        shrunk_under_threads(0, round % 2);
    }
    run_child(argv[0], "default", SIGBUS);
    run_child(argv[0], "before", 0);
    run_child(argv[0], "after", 0);
    printf("ok\n");
    return 0;
}
