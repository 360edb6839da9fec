/*
 * attach: a C program that reads a float32 tensor another process made (a
 * Python or Go program, say), once by its segment name and once by its
 * TensorRef, through libzctipc.so and zctipc.h alone.
 *
 *   cc -std=c11 -I DIR attach.c -L DIR -lzctipc -Wl,-rpath,DIR -o attach
 *   ./attach NAME 'TENSORREF-JSON'
 *
 * DIR holds zctipc.h and libzctipc.so: the installed Python package's
 * directory (python -c 'import zctipc, os; print(os.path.dirname(zctipc.__file__))').
 * It prints the library's version, the sum of the tensor's elements as read
 * both ways, and lets go of everything before it exits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zctipc.h"

static int fail(const char *what, int status) {
    fprintf(stderr, "attach: %s: status %d: %s\n", what, status, zct_last_error());
    return 1;
}

static double sum(const zct_info *t) {
    double s = 0;
    const float *v = (const float *)t->data;
    for (uint64_t i = 0; i < t->nbytes / sizeof(float); i++) {
        s += v[i];
    }
    return s;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: attach NAME TENSORREF-JSON\n");
        return 2;
    }
    /* The first call into the library. */
    printf("zctipc %s\n", zct_version());
    if (zct_abi_version() != ZCT_ABI_VERSION) {
        fprintf(stderr, "attach: libzctipc has C ABI %d, this program was built for %d\n", zct_abi_version(),
                ZCT_ABI_VERSION);
        return 1;
    }
    /* Crash cleanup: what this process holds is given up if it dies. */
    int status = zct_cleanup_enable(NULL);
    if (status != ZCT_OK && status != ZCT_E_NO_DAEMON) {
        return fail("zct_cleanup_enable", status);
    }

    zct_handle by_name = 0, by_ref = 0;
    zct_info named, reffed;
    status = zct_segment_attach(argv[1], ZCT_KIND_TENSOR, 1, &by_name, &named);
    if (status != ZCT_OK) {
        return fail("zct_segment_attach", status);
    }
    if (named.dtype != ZCT_FLOAT32) {
        fprintf(stderr, "attach: %s holds dtype %d, not float32\n", named.name, named.dtype);
        return 1;
    }
    status = zct_tensor_ref_attach(argv[2], strlen(argv[2]), 1, &by_ref, &reffed);
    if (status != ZCT_OK) {
        return fail("zct_tensor_ref_attach", status);
    }
    printf("by name %s: sum %.1f\n", named.name, sum(&named));
    printf("by ref %s: sum %.1f\n", reffed.name, sum(&reffed));

    /* Let go of everything, as at any normal exit. */
    int64_t released = 0;
    if ((status = zct_segment_close(by_name)) != ZCT_OK || (status = zct_segment_close(by_ref)) != ZCT_OK) {
        return fail("zct_segment_close", status);
    }
    if ((status = zct_release_all(&released)) != ZCT_OK) {
        return fail("zct_release_all", status);
    }
    if ((status = zct_cleanup_disable()) != ZCT_OK) {
        return fail("zct_cleanup_disable", status);
    }
    return 0;
}
