// What the export layer shares between its files; not part of the public ABI.
#ifndef ZCTIPC_INTERNAL_H
#define ZCTIPC_INTERNAL_H
#include <stddef.h>
#include "zctipc.h"

#define ZCT_HIDDEN __attribute__((visibility("hidden")))

ZCT_HIDDEN void zct_set_last_error(const char *msg, size_t len, int errnum);
// fast.c: say that shared memory faulted (another process shrank a segment
// file this process maps) and return ZCT_E_CORRUPT, for a step that cannot
// be run again in Go.
ZCT_HIDDEN int zct_faulted(void);
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

// handoff.c: a record's adoption outside Go, and the refs it makes (Note
// [a ref made outside Go]). zct_fast_adopt adopts the record of size bytes
// at rec that a take took, as zct_queue_take returns it; claim takes light
// ref h out of handoff.c's table for Go (1, or 0 when h is none); any
// returns a light ref's handle, or 0 when there is none.
ZCT_HIDDEN int64_t zct_fast_adopt(uint8_t *rec, uint32_t size, zct_view *views, int32_t views_cap, int32_t *nviews);
ZCT_HIDDEN int zct_light_ref_claim(uint64_t h, void **arena, uint32_t *slot, uint32_t *gen, int32_t *entry);
ZCT_HIDDEN uint64_t zct_light_ref_any(void);
// fast.c: put one record of prefix_len bytes and no payload (size: rounded
// up to 8), which hands over the counts of sends[0..nsends) (zp_send: run
// by the put once it found room, and only then), in one try, into queue h:
// a zp_put result (with out), or -1 when h is not in fast.c's table.
struct zp_send;
struct zp_out;
ZCT_HIDDEN int zct_fast_put_prefix(uint64_t h, const uint8_t *prefix, uint32_t prefix_len, uint32_t size,
                                   const struct zp_send *sends, int32_t nsends, struct zp_out *out);

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
