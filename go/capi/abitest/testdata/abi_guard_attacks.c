// Attacks on the data plane's fault guard (guard.c in package plane) and on
// the waits of a queue whose file is cut (package futex), through the C ABI:
//   - many threads not made by Go fault at once in their steps on queues
//     whose files another thread cuts, round after round: each call ends
//     with ZCT_E_CORRUPT (or its ordinary statuses), never the process;
//   - a SIGBUS outside the plane's steps, in a thread that armed the guard
//     many times (and faulted in it), is not swallowed: a pthread of an
//     exec'd child, and the forking thread of a child forked without exec,
//     both die of it;
//   - a SIGBUS handler the program installed before the library was loaded
//     (from .preinit_array, before any library's constructor) still gets
//     its own faults, on the main thread and on a pthread, while the
//     plane's faults stay the plane's;
//   - sleepers of every kind (takes, waits, joins, puts for room, zct_sleep
//     on an armed word) asleep on a queue whose file is cut under them all
//     return, with a status that says so, whether a wake follows the cut
//     (a put, a close) or not.
// It prints "ok" when every check passes.
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include "child.h"
#include "mapped.h"

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* -- many threads faulting at once ------------------------------------- */

#define QUEUES 3
#define THREADS 16
static zct_handle queues[QUEUES];
static volatile int cut;

static void *fault_hammer(void *arg) {
    long id = (long)arg;
    uint8_t buf[4096];
    uint8_t payload[700];
    memset(payload, (int)id, sizeof payload);
    int after = 0;
    for (unsigned i = 0; !cut || after++ < 200; i++) {
        zct_handle q = queues[(id + i) % QUEUES];
        int r;
        uint32_t *word, seen;
        switch ((id + i) % 5) {
        case 0:
            r = zct_queue_put(q, ZCT_RECORD_BYTES, payload, 1 + i % sizeof payload, NULL, 0, 0);
            CHECK(r == ZCT_OK || r == ZCT_E_FULL || r == ZCT_E_CORRUPT || r == ZCT_E_NO_SPACE);
            break;
        case 1:
            r = (int)take_plain(q, buf, sizeof buf, 0);
            CHECK(r >= 0 || r == ZCT_E_EMPTY || r == ZCT_E_CORRUPT);
            break;
        case 2:
            r = zct_queue_arm(q, ZCT_WAIT_SPACE, &word, &seen);
            CHECK(r == ZCT_OK || r == ZCT_E_CORRUPT);
            if (r == ZCT_OK) {
                int d = zct_queue_disarm(q, ZCT_WAIT_SPACE, 0);
                CHECK(d == ZCT_OK || d == ZCT_E_CORRUPT);
            }
            break;
        case 3: {
            uint64_t room;
            r = zct_queue_room(q, &room);
            CHECK(r == ZCT_OK || r == ZCT_E_CORRUPT);
            break;
        }
        default:
            r = zct_queue_task_done(q);
            CHECK(r == ZCT_OK || r == ZCT_E_CORRUPT || r == ZCT_E_INVALID);
        }
    }
    return NULL;
}

static void many_threads_fault(void) {
    for (int round = 0; round < 4; round++) {
        mapped m[QUEUES];
        for (int i = 0; i < QUEUES; i++) {
            CHECK(zct_queue_create(NULL, i == 0 ? 0 : 1u << (12 + i * 2), 0, &queues[i]) == ZCT_OK);
            m[i] = map_queue(queues[i]);
        }
        pthread_t t[THREADS];
        cut = 0;
        for (long i = 0; i < THREADS; i++) {
            CHECK(pthread_create(&t[i], NULL, fault_hammer, (void *)i) == 0);
        }
        usleep(30 * 1000);
        for (int i = 0; i < QUEUES; i++) { /* the hostile process, one file after another */
            CHECK(ftruncate(m[i].fd, (off_t)((round + i) % 2 ? 0 : m[i].data_at)) == 0);
        }
        cut = 1;
        for (int i = 0; i < THREADS; i++) {
            CHECK(pthread_join(t[i], NULL) == 0);
        }
        for (int i = 0; i < QUEUES; i++) {
            CHECK(unlink(m[i].path) == 0);
            unmap_queue(&m[i]);
            (void)zct_queue_close(queues[i]);
        }
    }
}

/* -- SIGBUS outside the plane's steps ---------------------------------- */

/* A SIGBUS of the program's own, on a file of its own that it shrank. */
static void own_sigbus(void) {
    char path[] = "/tmp/zctipc-guard-XXXXXX";
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

/* Steps that arm the guard, one that faults in it, in this thread. */
static void *use_the_plane(void *unused) {
    (void)unused;
    zct_handle q;
    CHECK(zct_queue_create(NULL, 4096, 0, &q) == ZCT_OK);
    uint8_t buf[64];
    for (int i = 0; i < 50; i++) {
        CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "x", 1, NULL, 0, 0) == ZCT_OK);
        CHECK(take_plain(q, buf, sizeof buf, 0) == 1);
    }
    mapped m = map_queue(q);
    CHECK(ftruncate(m.fd, 0) == 0);
    CHECK(zct_queue_put(q, ZCT_RECORD_BYTES, "x", 1, NULL, 0, 0) == ZCT_E_CORRUPT);
    CHECK(take_plain(q, buf, sizeof buf, 0) == ZCT_E_CORRUPT);
    CHECK(unlink(m.path) == 0);
    unmap_queue(&m);
    (void)zct_queue_close(q);
    return NULL;
}

static void *plane_then_own_sigbus(void *unused) {
    use_the_plane(unused);
    own_sigbus();
    return NULL; /* not reached */
}

/* The handler installed before the library was loaded. */
static volatile int handled, expected;
static __thread sigjmp_buf caught;

static void early_bus(int sig, siginfo_t *info, void *ctx) {
    (void)info;
    (void)ctx;
    handled++;
    if (expected) {
        expected = 0;
        siglongjmp(caught, 1);
    }
    signal(sig, SIG_DFL); /* not one of ours: die of it */
}

static void preinit(int argc, char **argv, char **envp) {
    (void)envp;
    if (argc == 2 && strcmp(argv[1], "early") == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = early_bus;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, NULL);
    }
}
__attribute__((section(".preinit_array"), used)) static void (*run_preinit)(int, char **, char **) = preinit;

static void *early_in_thread(void *unused) {
    use_the_plane(unused);
    int before = handled;
    if (sigsetjmp(caught, 1) == 0) {
        expected = 1;
        own_sigbus();
        CHECK(0); /* not reached */
    }
    CHECK(handled == before + 1);
    return NULL;
}

static int child(const char *mode) {
    if (strcmp(mode, "thread") == 0) { /* a pthread that armed the guard faults outside it */
        pthread_t t;
        CHECK(pthread_create(&t, NULL, plane_then_own_sigbus, NULL) == 0);
        CHECK(pthread_join(t, NULL) == 0);
        return 3; /* not reached */
    }
    if (strcmp(mode, "early") == 0) {
        early_in_thread(NULL);
        pthread_t t;
        CHECK(pthread_create(&t, NULL, early_in_thread, NULL) == 0);
        CHECK(pthread_join(t, NULL) == 0);
        CHECK(zct_release_all(NULL) == ZCT_OK);
        return 0;
    }
    return 2;
}

/* A child forked without exec, from a thread that armed the guard again
   and again and faulted in it, touches a cut mapping of its own. */
static void forked_child_dies(void) {
    use_the_plane(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        own_sigbus();
        _exit(3);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS)) {
        fprintf(stderr, "forked child: status %#x\n", status);
    }
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS);
}

/* -- sleepers on a cut file -------------------------------------------- */

enum { TAKE, WAIT, JOIN, PUT, SLEEP, KINDS };
#define PER_KIND 3
static zct_handle wq;
static int results[KINDS * PER_KIND];

static void *sleeper(void *arg) {
    long i = (long)arg;
    int kind = (int)(i / PER_KIND);
    uint8_t buf[4096];
    uint8_t big[1000];
    memset(big, 7, sizeof big);
    int r = 0;
    switch (kind) {
    case TAKE:
        r = (int)take_plain(wq, buf, sizeof buf, -1);
        break;
    case WAIT:
        r = zct_queue_wait(wq, -1);
        break;
    case JOIN:
        r = zct_queue_join(wq, -1);
        break;
    case PUT:
        r = zct_queue_put(wq, ZCT_RECORD_BYTES, big, sizeof big, NULL, 0, -1);
        break;
    case SLEEP: {
        uint32_t *word, seen;
        CHECK(zct_queue_arm(wq, ZCT_WAIT_DATA, &word, &seen) == ZCT_OK);
        r = zct_sleep(word, seen, -1);
        /* Its disarm meets the cut file too. */
        int d = zct_queue_disarm(wq, ZCT_WAIT_DATA, 0);
        CHECK(d == ZCT_OK || d == ZCT_E_CORRUPT || d == ZCT_E_CLOSED);
        break;
    }
    }
    results[i] = r;
    return NULL;
}

/* then: 0 nothing after the cut, 1 a put after it, 2 a close after it. */
static void sleepers_on_a_cut_file(int then) {
    /* Room for one 1000-byte record and not two: the puts for room sleep
       behind the first, which is never taken (the join waits on it). */
    CHECK(zct_queue_create(NULL, 2048, 0, &wq) == ZCT_OK);
    mapped m = map_queue(wq);
    uint8_t big[1000];
    memset(big, 1, sizeof big);
    /* The takes and waits sleep first, on an empty queue. */
    pthread_t t[KINDS * PER_KIND];
    for (long i = 0; i < KINDS * PER_KIND; i++) {
        int kind = (int)(i / PER_KIND);
        if (kind == TAKE || kind == WAIT || kind == SLEEP) {
            CHECK(pthread_create(&t[i], NULL, sleeper, (void *)i) == 0);
        }
    }
    int64_t deadline = now_ms() + 20000;
    while (ld32(&m, DATA_WAITERS) < 3 * PER_KIND && now_ms() < deadline) usleep(1000);
    CHECK(ld32(&m, DATA_WAITERS) >= 3 * PER_KIND);
    /* Then the joins and puts, behind a record a thread took no part in. */
    CHECK(zct_queue_put(wq, ZCT_RECORD_BYTES, big, sizeof big, NULL, 0, 0) == ZCT_OK);
    uint8_t buf[4096];
    (void)buf;
    for (long i = 0; i < KINDS * PER_KIND; i++) {
        int kind = (int)(i / PER_KIND);
        if (kind == JOIN || kind == PUT) {
            CHECK(pthread_create(&t[i], NULL, sleeper, (void *)i) == 0);
        }
    }
    usleep(300 * 1000); /* let them fall asleep (a take may have had the record) */
    CHECK(ftruncate(m.fd, 0) == 0); /* the hostile process */
    if (then == 1) {
        int r = zct_queue_put(wq, ZCT_RECORD_BYTES, "x", 1, NULL, 0, 0);
        CHECK(r == ZCT_E_CORRUPT);
    } else if (then == 2) {
        int r = zct_queue_close(wq);
        CHECK(r == ZCT_OK || r == ZCT_E_CORRUPT);
    }
    for (int i = 0; i < KINDS * PER_KIND; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
    }
    for (int i = 0; i < KINDS * PER_KIND; i++) {
        int kind = i / PER_KIND, r = results[i];
        switch (kind) {
        case TAKE: /* one take may have had the record (1000 bytes) */
            if (!(r == ZCT_E_CORRUPT || r == 1000 || (then == 2 && r == ZCT_E_CLOSED))) {
                fprintf(stderr, "then %d: take %d: %d\n", then, i, r);
            }
            CHECK(r == ZCT_E_CORRUPT || r == 1000 || (then == 2 && r == ZCT_E_CLOSED));
            break;
        case SLEEP: /* woken, or its word gone with the file */
            if (!(r == ZCT_OK || r == ZCT_E_CLOSED || r == ZCT_E_CORRUPT)) {
                fprintf(stderr, "then %d: sleep %d: %d\n", then, i, r);
            }
            CHECK(r == ZCT_OK || r == ZCT_E_CLOSED || r == ZCT_E_CORRUPT);
            break;
        default:
            if (!(r == ZCT_E_CORRUPT || (kind == WAIT && r == ZCT_OK) || (kind == PUT && r == ZCT_OK) ||
                  (then == 2 && r == ZCT_E_CLOSED))) {
                fprintf(stderr, "then %d: kind %d thread %d: %d (%s)\n", then, kind, i, r, zct_last_error());
            }
            CHECK(r == ZCT_E_CORRUPT || (kind == WAIT && r == ZCT_OK) || (kind == PUT && r == ZCT_OK) ||
                  (then == 2 && r == ZCT_E_CLOSED));
        }
    }
    CHECK(unlink(m.path) == 0);
    unmap_queue(&m);
    if (then != 2) {
        (void)zct_queue_close(wq);
    }
}

int main(int argc, char **argv) {
    if (argc == 2) {
        return child(argv[1]);
    }
    alarm(240); /* a sleeper that never returns fails the test, not hangs it */
    many_threads_fault();
    forked_child_dies();
    run_child(argv[0], "thread", SIGBUS);
    run_child(argv[0], "early", 0);
    for (int then = 0; then < 3; then++) {
        sleepers_on_a_cut_file(then);
    }
    CHECK(zct_release_all(NULL) == ZCT_OK);
    printf("ok\n");
    return 0;
}
