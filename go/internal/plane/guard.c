// The fault guard of the data plane: a SIGBUS raised while a step of the
// plane touches shared memory (another process of the user shrank the
// segment file: Note in package fault) ends that step with ZP_FAULT rather
// than the process.
//
// The handler is installed once, over the one the Go runtime installed,
// which it calls for every SIGBUS that is not the plane's: the runtime then
// handles it as before (a panic in Go code that asked for one, a crash
// otherwise, the handler before it for code that is not Go's). It runs on
// the thread's signal stack when it has one (SA_ONSTACK, as the runtime
// requires of handlers beside its own) and does not block SIGBUS while it
// runs (SA_NODEFER), so that jumping out of it leaves the thread's signal
// mask as it was without saving it on every step (a system call each).
#include "guard.h"

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>

// The guard armed on this thread. A thread-local of the initial-exec model,
// as the Go runtime's own in this library: each thread's copy exists from
// the start, where one made on first use could be allocated inside the
// signal handler; and reading it costs a load, where pthread_getspecific
// and pthread_setspecific cost a call each on every step.
static __thread zp_guard *armed __attribute__((tls_model("initial-exec")));
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int installed;
static struct sigaction before;

static void on_bus(int sig, siginfo_t *info, void *ctx) {
    zp_guard *g = armed;
    if (g != NULL) {
        g->addr = (uintptr_t)info->si_addr;
        siglongjmp(g->jb, 1);
    }
    if (before.sa_flags & SA_SIGINFO) {
        before.sa_sigaction(sig, info, ctx);
    } else if (before.sa_handler == SIG_DFL) {
        // Returning re-raises the fault, which the default then acts on.
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGBUS, &dfl, NULL);
    } else if (before.sa_handler != SIG_IGN) {
        before.sa_handler(sig);
    }
}

static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_bus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &before);
    __atomic_store_n(&installed, 1, __ATOMIC_RELEASE);
}

zp_guard *zp_guard_arm(zp_guard *g) {
    if (!__atomic_load_n(&installed, __ATOMIC_ACQUIRE)) {
        pthread_once(&once, install);
    }
    g->outer = armed;
    g->addr = 0;
    g->held[0] = g->held[1] = NULL;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    armed = g;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    return g;
}

void zp_guard_disarm(zp_guard *g) {
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    armed = g->outer;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}
