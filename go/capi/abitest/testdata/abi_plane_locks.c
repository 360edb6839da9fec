// Attacks on the locks of the data plane's steps through the C ABI
// (Note [a data plane the runtime never enters] in package plane): a put
// that found no room while a killed consumer left pages to give back (the
// step keeps the producers' lock for the catch-up: zct_queue_put must not
// hand Go a lock its own process holds), a queue file shrunk under the
// ring while a step holds a lock (the step ends ZCT_E_CORRUPT and lets its
// locks go), and peers stopped or killed in their puts and gets. Every
// lock is free after every call. It prints "ok" when every check passes.
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include "mapped.h"

static char buf[1 << 16];

#define locks_free(m) CHECK(ld32(m, PUT_LOCK) == 0 && ld32(m, GET_LOCK) == 0)

/* A put finds no room while given_back lags behind head's chunk (a consumer
   killed between its commit and its give-back): the step keeps the
   producers' lock for the catch-up, which the C ABI's put leaves to Go. */
static void catch_up(const char *name) {
    zct_handle q;
    CHECK(zct_queue_create(name, 0, 1, &q) == ZCT_OK); /* unbounded, one message at most */
    mapped m = map_queue(q);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "first", 5, NULL, 0, 0) == ZCT_OK);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "second", 6, NULL, 0, 0) == ZCT_E_FULL);
    locks_free(&m);
    for (int round = 0; round < 3; round++) {
        uint32_t head = (uint32_t)ld64(&m, HEAD);
        st32(&m, GIVEN_BACK, (head & ~(CHUNK - 1)) - CHUNK); /* what the killed consumer left */
        int64_t timeouts[] = {0, 20, 0};
        CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "second", 6, NULL, 0, timeouts[round]) == ZCT_E_FULL);
        locks_free(&m);
        CHECK(ld32(&m, GIVEN_BACK) == (head & ~(CHUNK - 1))); /* caught up */
    }
    CHECK(take_plain(q, buf, sizeof buf, 0) == 5 && memcmp(buf + ZCT_RECORD_HEADER, "first", 5) == 0);
    locks_free(&m);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "second", 6, NULL, 0, 1000) == ZCT_OK);
    CHECK(take_plain(q, buf, sizeof buf, 0) == 6 && memcmp(buf + ZCT_RECORD_HEADER, "second", 6) == 0);
    locks_free(&m);
    unmap_queue(&m);
    CHECK(zct_queue_close(q) == ZCT_OK);
}

/* The file is cut right after the queue's words and the ring's first
   page: a put or get whose record lies past it faults inside its step,
   holding a lock, and must end ZCT_E_CORRUPT with every lock free, so that
   the calls after it fail at once rather than wait for ever on a lock
   their own process holds. */
static void shrunk_under_a_lock(void) {
    zct_handle q;
    CHECK(zct_queue_create(NULL, 1 << 16, 0, &q) == ZCT_OK);
    mapped m = map_queue(q);
    static char payload[1000];
    for (int i = 0; i < 20; i++) { /* 20 KB: past the page kept */
        CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, payload, sizeof payload, NULL, 0, 0) == ZCT_OK);
    }
    uint64_t keep = (m.data_at + RING_AT + 4096 + 4095) & ~4095ull;
        CHECK(ftruncate(m.fd, (off_t)keep) == 0); /* the hostile process */
    for (int i = 0; i < 3; i++) {
        CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, payload, sizeof payload, NULL, 0, -1) == ZCT_E_CORRUPT);
        locks_free(&m);
    }
    int took = 0;
    for (int i = 0; i < 20; i++) {
        int64_t r = take_plain(q, buf, sizeof buf, -1);
        if (r == ZCT_E_CORRUPT) {
            break;
        }
        CHECK(r == (int64_t)sizeof payload);
        took++;
    }
    CHECK(took >= 4 && took < 20);
    locks_free(&m);
    CHECK(take_plain(q, buf, sizeof buf, -1) == ZCT_E_CORRUPT);
    locks_free(&m);
    uint32_t *word;
    uint32_t seen;
    CHECK(zct_queue_arm(q, ZCT_WAIT_DATA, &word, &seen) == ZCT_OK); /* the words are there still */
    CHECK(zct_queue_disarm(q, ZCT_WAIT_DATA, 1) == ZCT_OK);
    CHECK(ld32(&m, DATA_WAITERS) == 0);
    /* And cut to nothing: every step faults, arming too. */
    CHECK(ftruncate(m.fd, 0) == 0);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "x", 1, NULL, 0, -1) == ZCT_E_CORRUPT);
    CHECK(take_plain(q, buf, sizeof buf, -1) == ZCT_E_CORRUPT);
    CHECK(zct_queue_arm(q, ZCT_WAIT_DATA, &word, &seen) == ZCT_E_CORRUPT);
    CHECK(zct_queue_disarm(q, ZCT_WAIT_DATA, 0) == ZCT_E_INVALID);
    CHECK(unlink(m.path) == 0);
    unmap_queue(&m);
    (void)zct_queue_close(q); /* its count lay in the file */
}

/* A peer stopped and then killed, many times, while it puts and gets: the
   calls here wait on a lock a stopped peer holds (and time out), and take
   over one a killed peer held; every message put is taken once. */
static void stopped_and_killed_peers(const char *self, const char *name) {
    zct_handle q;
    CHECK(zct_queue_create(name, 1 << 14, 0, &q) == ZCT_OK);
    mapped m = map_queue(q);
    unsigned seed = (unsigned)getpid();
    for (int round = 0; round < 50; round++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            execl(self, self, "peer", name, (char *)NULL);
            _exit(127);
        }
        struct timespec ts = {0, (long)(rand_r(&seed) % 5000) * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGSTOP);
        int64_t r = take_plain(q, buf, sizeof buf, 30);
        CHECK(r >= 0 || r == ZCT_E_EMPTY);
        int pr = zct_queue_put(q, ZCT_RECORD_BYTES, "main", 4, NULL, 0, 30);
        CHECK(pr == ZCT_OK || pr == ZCT_E_FULL);
        kill(pid, SIGKILL);
        int status;
        CHECK(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status));
        /* Its locks are taken over from the dead. */
        CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "after", 5, NULL, 0, 2000) == ZCT_OK);
        for (;;) {
            r = take_plain(q, buf, sizeof buf, 0);
            if (r == ZCT_E_EMPTY) {
                break;
            }
            CHECK(r >= 0);
        }
        locks_free(&m);
    }
    CHECK(unlink(m.path) == 0); /* the killed peers' counts: the daemon's work, which is off here */
    unmap_queue(&m);
    CHECK(zct_queue_close(q) == ZCT_OK);
}

static int peer(const char *name) {
    zct_handle q;
    CHECK(zct_queue_attach(name, 0, &q) == ZCT_OK);
    for (;;) {
        CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, buf, 3000, NULL, 0, -1) == ZCT_OK);
        CHECK(take_plain(q, buf, sizeof buf, -1) >= 0);
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "peer") == 0) {
        return peer(argv[2]);
    }
    CHECK(argc == 2);
    char name[256];
    snprintf(name, sizeof name, "%s-catchup", argv[1]);
    catch_up(name);
    shrunk_under_a_lock();
    snprintf(name, sizeof name, "%s-peers", argv[1]);
    stopped_and_killed_peers(argv[0], name);
    printf("ok\n");
    return 0;
}
