// A C program that uses libzctipc.so through zctipc.h only, as any C, Rust or
// Elixir binding would. It prints "ok" when every check passes.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zctipc.h"
#include "check.h"

static void *fail_in_thread(void *name) {
    zct_handle h = 0;
    zct_info info;
    int rc = zct_segment_attach((const char *)name, ZCT_KIND_ANY, 0, &h, &info);
    CHECK(rc == ZCT_E_NOT_FOUND);
    CHECK(strstr(zct_last_error(), "does not exist") != NULL);
    CHECK(zct_last_errno() == 2); /* ENOENT */
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *name = argv[1];
    CHECK(zct_abi_version() == ZCT_ABI_VERSION);
    CHECK(strlen(zct_version()) > 0);

    int64_t shape[2] = {3, 4};
    zct_handle h = 0;
    zct_info info;
    CHECK(zct_segment_create(name, ZCT_FLOAT32, 2, shape, &h, &info) == ZCT_OK);
    CHECK(h != 0 && info.data != NULL);
    CHECK(info.nbytes == 48 && info.ndim == 2 && info.strides[0] == 16 && info.strides[1] == 4);
    CHECK(info.dtype == ZCT_FLOAT32 && info.kind == ZCT_KIND_TENSOR && info.refcount == 1);
    CHECK(strncmp(info.name, "zctipc_", 7) == 0);
    ((float *)info.data)[11] = 1.5f;

    /* Each thread has its own last error: a failure in another thread
       does not overwrite this thread's message. */
    CHECK(zct_segment_create(name, ZCT_FLOAT32, 2, shape, &h, &info) == ZCT_E_EXISTS);
    char mine[512];
    snprintf(mine, sizeof mine, "%s", zct_last_error());
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, fail_in_thread, "zctipc_does_not_exist") == 0);
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK(strcmp(mine, zct_last_error()) == 0);
    CHECK(strstr(mine, "already exists") != NULL);

    zct_handle again = 0;
    zct_info seen;
    CHECK(zct_segment_attach(name, ZCT_KIND_TENSOR, 1, &again, &seen) == ZCT_OK);
    CHECK(seen.readonly == 1 && ((const float *)seen.data)[11] == 1.5f);
    CHECK(zct_segment_attach(name, ZCT_KIND_QUEUE, 0, &again, &seen) == ZCT_E_INVALID);

    int64_t bad_shape[1] = {-1};
    CHECK(zct_segment_create(NULL, ZCT_FLOAT32, 1, bad_shape, &h, &info) == ZCT_E_INVALID);
    CHECK(zct_segment_create(NULL, 99, 1, shape, &h, &info) == ZCT_E_DTYPE);
    CHECK(zct_segment_create(NULL, ZCT_FLOAT32, ZCT_MAX_NDIM + 1, shape, &h, &info) == ZCT_E_INVALID);
    CHECK(zct_segment_create(NULL, ZCT_FLOAT32, 1, NULL, &h, &info) == ZCT_E_INVALID);
    CHECK(zct_segment_close(987654321) == ZCT_E_CLOSED);

    char one[1];
    uint64_t len = 0;
    CHECK(zct_segment_list(one, 1, &len) == ZCT_E_RANGE && len > 0);
    /* As large as the list said, and again while it grows: the test's other
       programs run beside this one, making segments in the same directory. */
    char *list = NULL;
    int listed;
    do {
        list = realloc(list, len + 1024);
        CHECK(list != NULL);
        listed = zct_segment_list(list, len + 1024, &len);
    } while (listed == ZCT_E_RANGE);
    CHECK(listed == ZCT_OK);
    CHECK(strstr(list, name) != NULL);
    free(list);

    int64_t rc = 0;
    CHECK(zct_segment_refcount(again, &rc) == ZCT_OK && rc == 1);
    CHECK(zct_segment_close(again) == ZCT_OK);
    CHECK(zct_segment_close(again) == ZCT_E_CLOSED);
    CHECK(zct_segment_close(h) == ZCT_OK);
    CHECK(zct_segment_stat(name, &seen) == ZCT_E_NOT_FOUND);
    puts("ok");
    return 0;
}
