// Helpers the export layer calls; not part of the public ABI.
#ifndef ZCTIPC_LASTERROR_H
#define ZCTIPC_LASTERROR_H
#include <stddef.h>

#define ZCT_HIDDEN __attribute__((visibility("hidden")))

extern ZCT_HIDDEN const char *zct_version_string;
ZCT_HIDDEN void zct_set_last_error(const char *msg, size_t len, int errnum);

#endif
