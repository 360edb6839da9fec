// Producers and consumers killed (SIGKILL) at random points of their
// puts, takes, rewinds and sleeps, which run the data plane's steps through
// the C ABI (zct_queue_put, zct_queue_take, zct_queue_arm and
// zct_queue_disarm without Go; their waits in Go or in zct_sleep), on a
// bounded queue, an unbounded one and an unbounded one with a message
// limit. Every message is taken at most once and in order by each
// consumer, and every message whose put returned is taken, but for at
// most one per consumer killed (the documented rule: a consumer killed
// after its commit takes its message with it); the locks the dead held are
// taken over. It prints "ok" when every check passes.
#define _GNU_SOURCE
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include "mapped.h"

#define PRODUCERS 2
#define CONSUMERS 2
#define MAX_IDS 1024
#define MAX_SEQ 4096

/* What the processes say they did, in memory they share (a memfd each
   inherits). */
typedef struct {
    uint32_t put[MAX_IDS]; /* puts of producer id that returned */
    uint8_t taken[MAX_IDS][MAX_SEQ];
} book;

static book *b;

static void fill(uint8_t *p, uint32_t id, uint32_t seq, uint32_t n) {
    memcpy(p, &id, 4);
    memcpy(p + 4, &seq, 4);
    for (uint32_t i = 8; i < n; i++) {
        p[i] = (uint8_t)(id * 31 + seq + i);
    }
}

static uint32_t length(uint32_t seq) { return 8 + (seq * 397) % 3000; }

static int producer(zct_handle q, uint32_t id) {
    static uint8_t payload[4096];
    for (uint32_t seq = 0; seq < MAX_SEQ; seq++) {
        fill(payload, id, seq, length(seq));
        CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, payload, length(seq), NULL, 0, -1) == ZCT_OK);
        __atomic_store_n(&b->put[id], seq + 1, __ATOMIC_SEQ_CST);
    }
    pause();
    return 0;
}

/* Take the next message, waiting as a host does: in Go (timeout -1), or
   outside it (arm, look, zct_sleep, disarm). */
static int64_t take(zct_handle q, uint8_t *buf, uint64_t cap, int outside) {
    if (!outside) {
        int64_t r;
        do { /* a signal (the Go runtime's own): call again, as zctipc.h says */
            r = take_plain(q, buf, cap, -1);
        } while (r == ZCT_E_INTERRUPTED);
        return r;
    }
    for (;;) {
        int64_t r = take_plain(q, buf, cap, 0);
        if (r != ZCT_E_EMPTY) {
            return r;
        }
        uint32_t *word, seen;
        CHECK(zct_queue_arm(q, ZCT_WAIT_DATA, &word, &seen) == ZCT_OK);
        r = take_plain(q, buf, cap, 0);
        int woken = 0;
        if (r == ZCT_E_EMPTY) {
            /* A signal ends a sleep early (ZCT_E_INTERRUPTED): the Go
               runtime's preemption signal can reach this thread, which
               has run Go code. Not woken: look again. */
            int s = zct_sleep(word, seen, 50);
            CHECK(s == ZCT_OK || s == ZCT_E_EMPTY || s == ZCT_E_INTERRUPTED);
            woken = s == ZCT_OK;
        }
        CHECK(zct_queue_disarm(q, ZCT_WAIT_DATA, woken && r == ZCT_E_EMPTY) == ZCT_OK);
        if (r != ZCT_E_EMPTY) {
            return r;
        }
    }
}

/* Book a message taken; the messages of one producer come in order. */
static void book_taken(const uint8_t *buf, int64_t n, int32_t *last) {
    uint32_t id, seq;
    CHECK(n >= 8);
    memcpy(&id, buf + ZCT_RECORD_HEADER, 4);
    memcpy(&seq, buf + ZCT_RECORD_HEADER + 4, 4);
    CHECK(id < MAX_IDS && seq < MAX_SEQ && (uint32_t)n == length(seq));
    static uint8_t want[4096];
    fill(want, id, seq, (uint32_t)n);
    CHECK(memcmp(buf + ZCT_RECORD_HEADER, want, (size_t)n) == 0);
    CHECK((int32_t)seq > last[id]);
    last[id] = (int32_t)seq;
    __atomic_add_fetch(&b->taken[id][seq], 1, __ATOMIC_SEQ_CST);
}

static _Noreturn void consumer(zct_handle q, int outside) {
    static uint8_t buf[8192];
    static int32_t last[MAX_IDS];
    memset(last, 0xFF, sizeof last);
    for (;;) {
        book_taken(buf, take(q, buf, sizeof buf, outside), last);
    }
}

static pid_t start(const char *self, const char *name, int fd, const char *role, uint32_t id) {
    char fds[16], ids[16];
    snprintf(fds, sizeof fds, "%d", fd);
    snprintf(ids, sizeof ids, "%u", id);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execl(self, self, role, name, fds, ids, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void stop(pid_t pid) {
    int status;
    kill(pid, SIGKILL);
    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFSIGNALED(status)) {
        fprintf(stderr, "a child ended with status %d\n", WEXITSTATUS(status));
    }
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

static void run(const char *self, const char *name, uint64_t capacity, uint64_t maxsize, int rounds) {
    int fd = memfd_create("book", 0);
    CHECK(fd >= 0 && ftruncate(fd, sizeof(book)) == 0);
    b = mmap(NULL, sizeof(book), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(b != MAP_FAILED);
    zct_handle q;
    CHECK(zct_queue_create(name, capacity, maxsize, &q) == ZCT_OK);
    mapped m = map_queue(q);
    pid_t producers[PRODUCERS], consumers[CONSUMERS];
    uint32_t ids = 0, consumer_kills = 0;
    for (int i = 0; i < PRODUCERS; i++) {
        producers[i] = start(self, name, fd, "producer", ids++);
    }
    for (int i = 0; i < CONSUMERS; i++) {
        consumers[i] = start(self, name, fd, "consumer", (uint32_t)i);
    }
    unsigned seed = (unsigned)getpid();
    for (int round = 0; round < rounds && ids < MAX_IDS; round++) {
        struct timespec ts = {0, (long)(200 + rand_r(&seed) % 20000) * 1000};
        nanosleep(&ts, NULL);
        int victim = rand_r(&seed) % (PRODUCERS + CONSUMERS);
        if (victim < PRODUCERS) {
            stop(producers[victim]);
            producers[victim] = start(self, name, fd, "producer", ids++);
        } else {
            victim -= PRODUCERS;
            stop(consumers[victim]);
            consumer_kills++;
            consumers[victim] = start(self, name, fd, "consumer", (uint32_t)round);
        }
    }
    for (int i = 0; i < PRODUCERS; i++) {
        stop(producers[i]);
    }
    for (int i = 0; i < CONSUMERS; i++) {
        stop(consumers[i]);
        consumer_kills++;
    }
    /* Drain what is left, taking over any lock the dead held. */
    static uint8_t buf[8192];
    static int32_t last[MAX_IDS];
    memset(last, 0xFF, sizeof last);
    for (;;) {
        int64_t r = take_plain(q, buf, sizeof buf, 200);
        if (r == ZCT_E_EMPTY) {
            break;
        }
        book_taken(buf, r, last);
    }
    CHECK(ld64(&m, TAIL) >> 32 == ld64(&m, HEAD) >> 32); /* counts agree: empty */
    /* A put takes over the producers' lock a dead producer may hold. */
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "last", 4, NULL, 0, 5000) == ZCT_OK);
    CHECK(take_plain(q, buf, sizeof buf, 0) == 4);
    CHECK(ld32(&m, PUT_LOCK) == 0 && ld32(&m, GET_LOCK) == 0);
    uint32_t lost = 0, total = 0;
    for (uint32_t id = 0; id < ids; id++) {
        for (uint32_t seq = 0; seq < MAX_SEQ; seq++) {
            CHECK(b->taken[id][seq] <= 1);
            if (seq < b->put[id]) {
                total++;
                lost += b->taken[id][seq] == 0;
            } else if (seq > b->put[id]) {
                CHECK(b->taken[id][seq] == 0); /* never put */
            }
        }
    }
    if (lost > consumer_kills) {
        fprintf(stderr, "%u of %u messages lost, %u consumers killed\n", lost, total, consumer_kills);
    }
    CHECK(lost <= consumer_kills);
    CHECK(total > 0);
    CHECK(unlink(m.path) == 0); /* the dead's counts: the daemon's work, which is off here */
    unmap_queue(&m);
    CHECK(zct_queue_close(q) == ZCT_OK);
    CHECK(munmap(b, sizeof(book)) == 0 && close(fd) == 0);
}

int main(int argc, char **argv) {
    if (argc == 5) {
        b = mmap(NULL, sizeof(book), PROT_READ | PROT_WRITE, MAP_SHARED, atoi(argv[3]), 0);
        CHECK(b != MAP_FAILED);
        zct_handle q;
        CHECK(zct_queue_attach(argv[2], 0, &q) == ZCT_OK);
        uint32_t id = (uint32_t)atoi(argv[4]);
        if (strcmp(argv[1], "producer") == 0) {
            return producer(q, id);
        }
        consumer(q, id % 2);
    }
    CHECK(argc == 2);
    char name[256];
    snprintf(name, sizeof name, "%s-bounded", argv[1]);
    run(argv[0], name, 1 << 15, 0, 60);
    snprintf(name, sizeof name, "%s-unbounded", argv[1]);
    run(argv[0], name, 0, 0, 60);
    snprintf(name, sizeof name, "%s-limited", argv[1]);
    run(argv[0], name, 0, 8, 60);
    printf("ok\n");
    return 0;
}
