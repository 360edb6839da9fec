// Where libzctipc.so lies, so that it can find the zctipcd shipped beside it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include "internal.h"

ZCT_HIDDEN const char *zct_library_path(void) {
    Dl_info info;
    if (dladdr((void *)zct_library_path, &info) == 0 || info.dli_fname == NULL) {
        return "";
    }
    return info.dli_fname;
}
