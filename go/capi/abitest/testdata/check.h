// CHECK, shared by the C programs of the ABI tests: a check that fails
// exits with status 1, saying where, what, and the library's last error.
#ifndef ABITEST_CHECK_H
#define ABITEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include "zctipc.h"

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", \
                    __FILE__, __LINE__, #cond, zct_last_error());          \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

#endif
