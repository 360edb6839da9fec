// What the export layer shares between its files; not part of the public ABI.
#ifndef ZCTIPC_INTERNAL_H
#define ZCTIPC_INTERNAL_H
#include <stddef.h>
#include "zctipc.h"

#define ZCT_HIDDEN __attribute__((visibility("hidden")))

ZCT_HIDDEN void zct_set_last_error(const char *msg, size_t len, int errnum);
ZCT_HIDDEN const char *zct_library_path(void);

// fast.c's table of queues (Note [a data plane the runtime never enters]
// in package plane).
ZCT_HIDDEN void zct_fast_register(uint64_t h, void *q);
ZCT_HIDDEN void zct_fast_register_reader(uint64_t h, void *r);
ZCT_HIDDEN void zct_fast_register_writer(uint64_t h, void *w);
ZCT_HIDDEN void zct_fast_unregister(uint64_t h);
ZCT_HIDDEN void zct_fast_poison(void);
/* How a handle's calls wait (zct_fast_set_wait): as the default policy,
   here; polling for ever, here; as another policy, in Go. */
enum { ZCT_FAST_SLEEP = 0, ZCT_FAST_POLL = 1, ZCT_FAST_GO = 2 };
ZCT_HIDDEN void zct_fast_set_wait(uint64_t h, int32_t waits);

// Const-qualified spellings, so that the prototypes cgo generates for the
// exports match the hand-written ones in zctipc.h exactly.
typedef const char zct_cchar;
typedef const void zct_cvoid;
typedef const int64_t zct_cint64;
typedef const uint64_t zct_cuint64;
typedef const zct_view zct_cview;
typedef const zct_cuda_ipc zct_ccuda_ipc;
typedef const zct_cuda_vmm zct_ccuda_vmm;

#endif
