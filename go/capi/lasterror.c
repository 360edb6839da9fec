// The per-thread last error of the C ABI.
//
// It lives in C because Go has no thread-local storage: an exported Go
// function runs on the calling C thread, so storage keyed by that thread is
// the caller's own. A pthread key is used rather than __thread: the Go
// runtime's own TLS is initial-exec, which puts every __thread variable of
// the library in the small static TLS block that dlopen can fail to fit.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "zctipc.h"
#include "internal.h"

#define MESSAGE_CAP 2048

struct last_error {
    int errnum;
    char message[MESSAGE_CAP];
};

static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static const struct last_error none = {0, ""};

static void make_key(void) { pthread_key_create(&key, free); }

static const struct last_error *current(void) {
    pthread_once(&key_once, make_key);
    const struct last_error *e = pthread_getspecific(key);
    return e ? e : &none;
}

ZCT_HIDDEN void zct_set_last_error(const char *msg, size_t len, int errnum) {
    pthread_once(&key_once, make_key);
    struct last_error *e = pthread_getspecific(key);
    if (e == NULL) {
        e = malloc(sizeof *e);
        if (e == NULL || pthread_setspecific(key, e) != 0) {
            free(e);
            return; /* no memory for a message: the status code still tells */
        }
    }
    if (len >= MESSAGE_CAP) {
        len = MESSAGE_CAP - 1;
    }
    memcpy(e->message, msg, len);
    e->message[len] = '\0';
    e->errnum = errnum;
}

const char *zct_last_error(void) { return current()->message; }

int zct_last_errno(void) { return current()->errnum; }
