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

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct sigaction before;

static void on_bus(int sig, siginfo_t *info, void *ctx) {
    zp_guard *g = pthread_getspecific(key);
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
    pthread_key_create(&key, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_bus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &before);
}

zp_guard *zp_guard_arm(zp_guard *g) {
    pthread_once(&once, install);
    g->outer = pthread_getspecific(key);
    g->addr = 0;
    g->held[0] = g->held[1] = NULL;
    pthread_setspecific(key, g);
    return g;
}

void zp_guard_disarm(zp_guard *g) { pthread_setspecific(key, g->outer); }
