/*
 * zctipc.h: the C ABI of libzctipc.so, zero-copy tensor IPC.
 *
 * Hand-written and checked in. A Go test (go/capi/abitest/abi_test.go)
 * checks that every function declared here is exported by the built
 * library, and the export layer (go/capi) includes this file, so the
 * compiler checks every signature against its Go implementation.
 *
 * Rules:
 *   - Every function but zct_abi_version, zct_version, zct_last_error and
 *     zct_last_errno returns ZCT_OK (0) or a negative zct_status, and writes
 *     its results through out-parameters, which are left unchanged on error.
 *   - After a failure, zct_last_error() returns a message for the calling
 *     thread, and zct_last_errno() the errno behind it (0 when none).
 *   - Objects are named by zct_handle integers. Data pointers are addresses of
 *     shared mappings: they stay valid until the last handle on their
 *     segment in this process is closed.
 *   - A Go runtime does not survive fork(): a child forked after the library
 *     was loaded must not call it.
 *   - If a call fails with ZCT_E_INTERNAL (a bug, caught), the library is
 *     poisoned and every later call returns ZCT_E_POISONED.
 */
#ifndef ZCTIPC_H
#define ZCTIPC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* BEGIN CDEF (python/zctipc/_ffi_build.py feeds from here to END CDEF to cffi) */

#define ZCT_ABI_VERSION 15
#define ZCT_MAX_NDIM 32
#define ZCT_NAME_CAP 256

typedef enum zct_status {
    ZCT_OK = 0,
    ZCT_E_INVALID = -1,      /* a bad argument: name, shape, dtype code, NULL pointer, wrong segment kind */
    ZCT_E_NOT_FOUND = -2,    /* no such segment, or it is being removed */
    ZCT_E_EXISTS = -3,       /* a segment of that name already exists; it was not touched */
    ZCT_E_PERMISSION = -4,   /* owned by another user, mode not 0600, a symbolic link, not a regular file */
    ZCT_E_NOT_ZCTIPC = -5,   /* the file does not start with the zctipc magic */
    ZCT_E_VERSION = -6,      /* a header layout version this library does not read */
    ZCT_E_CORRUPT = -7,      /* a header that fails validation: checksum, bounds, truncation */
    ZCT_E_NO_SPACE = -8,     /* no room in shared memory, now or by waiting */
    ZCT_E_DTYPE = -9,        /* an unknown dtype code */
    ZCT_E_CLOSED = -10,      /* the handle is closed or was never valid */
    ZCT_E_RANGE = -11,       /* an output buffer is too small; the needed size was written */
    ZCT_E_FULL = -12,        /* a queue or the pool is full, and the timeout passed */
    ZCT_E_EMPTY = -13,       /* a queue is empty, and the timeout passed */
    ZCT_E_INTERRUPTED = -14, /* a signal arrived while waiting: run its handler, then call again (the Go
                                runtime's own preemption signal can end a wait so, with no handler to run) */
    ZCT_E_NO_DAEMON = -15,   /* the cleanup daemon zctipcd cannot be reached (file_descriptor needs it) */
    ZCT_E_BUSY = -16,        /* a stream's writer role, or every reader slot, is held by a live process
                                (zct_last_errno EBUSY); or the process that shares a CUDA allocation
                                serves as many consumers as it may: try again (EAGAIN) */
    ZCT_E_ENDED = -17,       /* the stream has ended (a reader: and every frame was read) */
    ZCT_E_NO_CUDA = -18,     /* no CUDA driver or device here; the message says why */
    ZCT_E_CUDA = -19,        /* the CUDA driver refused a call; the message names it and the CUresult */
    ZCT_E_OS = -20,          /* another operating-system error; see zct_last_errno() */
    ZCT_E_CUDA_OOM = -21,    /* a GPU had not the memory asked; the message says how much was free */
    ZCT_E_TAKEN = -22,       /* a descriptor whose count was already taken (its bytes were received before) */
    ZCT_E_INTERNAL = -98,    /* a bug was caught; the library is now poisoned */
    ZCT_E_POISONED = -99     /* an earlier call failed with ZCT_E_INTERNAL */
} zct_status;

/* Segment kinds (the low byte of the header flags). */
typedef enum zct_kind {
    ZCT_KIND_ANY = 0,
    ZCT_KIND_TENSOR = 1,
    ZCT_KIND_ARENA = 2,
    ZCT_KIND_QUEUE = 3,
    ZCT_KIND_STREAM = 4,
    ZCT_KIND_TABLE = 5,
    ZCT_KIND_LEDGER = 6,
    ZCT_KIND_EVENT = 7
} zct_kind;

/* Element types (header dtype codes). */
typedef enum zct_dtype {
    ZCT_BOOL = 1,
    ZCT_INT8 = 2,
    ZCT_INT16 = 3,
    ZCT_INT32 = 4,
    ZCT_INT64 = 5,
    ZCT_UINT8 = 6,
    ZCT_UINT16 = 7,
    ZCT_UINT32 = 8,
    ZCT_UINT64 = 9,
    ZCT_FLOAT16 = 10,
    ZCT_FLOAT32 = 11,
    ZCT_FLOAT64 = 12,
    ZCT_BFLOAT16 = 13,
    ZCT_COMPLEX64 = 14,
    ZCT_COMPLEX128 = 15
} zct_dtype;

/* What a ref's memory is. */
typedef enum zct_ref_kind {
    ZCT_REF_INLINE = 0,      /* none: a view of an inline record's array, in the buffer a get took the
                                record into (its ref is 0, its offset from the buffer's start) */
    ZCT_REF_SEGMENT = 1,     /* the data of a tensor segment */
    ZCT_REF_SLOT = 2         /* a slot of a pool arena */
} zct_ref_kind;

/* Descriptor flags (zct_view.flags): the Python type a receiver rebuilds,
   in bits 0-1, and whether the array is read-only. */
typedef enum zct_view_flags {
    ZCT_VIEW_NUMPY = 0,
    ZCT_VIEW_TORCH = 1,
    ZCT_VIEW_SHARED_TENSOR = 2,
    ZCT_VIEW_TYPE_MASK = 3,
    ZCT_VIEW_READONLY = 4
} zct_view_flags;

/* Queue record types. A get gives a record's arrays as views: one per
   descriptor, each holding a new ref, and for an inline record one of its
   array, which lies in the get's buffer and holds no ref. */
typedef enum zct_record_type {
    ZCT_RECORD_PICKLE = 1,   /* a pickle that refers to its views by index */
    ZCT_RECORD_TENSOR = 2,   /* one view and no payload */
    ZCT_RECORD_BYTES = 3,    /* raw bytes and no view */
    ZCT_RECORD_INLINE = 4    /* a small array copied in: the payload holds it (format.md, "inline"), and a
                                get gives it as one view (ZCT_REF_INLINE) */
} zct_record_type;

/* Bytes of a record's header: a record takes these, its views'
   descriptors and its payload, rounded up to a multiple of 8 (format.md,
   "Records"); a queue takes records up to its capacity. */
#define ZCT_RECORD_HEADER 16

/* What zct_queue_take packs into its result, when that is not negative
   (a status): the payload's length is result & ZCT_TAKE_FIELD_MASK, its
   offset in buf (result >> ZCT_TAKE_OFFSET_SHIFT) & ZCT_TAKE_FIELD_MASK,
   and the record type result >> ZCT_TAKE_TYPE_SHIFT. The payload starts
   at ZCT_RECORD_HEADER exactly when the record has no descriptor: then it
   has no view but an inline record's array. */
enum { ZCT_TAKE_FIELD_MASK = 0x3FFFFFFF, ZCT_TAKE_OFFSET_SHIFT = 30, ZCT_TAKE_TYPE_SHIFT = 60 };

/* One record that zct_queue_get_many took, decoded: its zct_record_type,
   how many views are its own (they follow those of the records before it),
   and where its payload lies in the caller's buffer. */
typedef struct {
    int32_t type;
    int32_t nviews;
    uint64_t payload_offset;
    uint64_t payload_len;
} zct_record;

typedef uint64_t zct_handle;

/* What a segment header says, and where its data is mapped in this process. */
typedef struct zct_info {
    void *data;                      /* the data; NULL from zct_segment_stat and zct_header_decode */
    uint64_t nbytes;                 /* bytes of data */
    uint64_t data_offset;            /* where the data starts in the segment */
    uint64_t file_size;              /* bytes in the file (mapped bytes for a handle) */
    int64_t shape[ZCT_MAX_NDIM];
    int64_t strides[ZCT_MAX_NDIM];   /* in bytes */
    int64_t creator_pid;
    uint64_t creator_start_time;     /* clock ticks since boot, as /proc/PID/stat field 22 */
    int64_t created_ns;              /* CLOCK_REALTIME nanoseconds */
    int64_t refcount;                /* the shared count when the call read it */
    int32_t dtype;                   /* a zct_dtype */
    int32_t ndim;
    int32_t kind;                    /* a zct_kind */
    int32_t readonly;                /* 1 when data is mapped read-only */
    char name[ZCT_NAME_CAP];         /* full name, NUL-terminated */
} zct_info;

/* An array laid over a ref's memory. On put, ref, offset and the layout are
   read; on get, every field is written. */
typedef struct zct_view {
    zct_handle ref;                  /* the count that holds the memory; 0 for an inline array (kind
                                        ZCT_REF_INLINE), which lies in a get's buffer */
    void *data;                      /* get: the array's first byte */
    uint64_t offset;                 /* bytes from the start of the ref's memory */
    uint64_t nbytes;                 /* get: bytes the array may touch */
    int64_t shape[ZCT_MAX_NDIM];
    int64_t strides[ZCT_MAX_NDIM];   /* in bytes, not negative */
    int32_t dtype;
    int32_t ndim;
    int32_t kind;                    /* get: a zct_ref_kind */
    int32_t flags;                   /* bits 0-1: the Python type to rebuild (0 NumPy, 1 torch, 2 SharedTensor) */
} zct_view;

/* The state of this process's pool. */
typedef struct zct_pool_stats {
    uint64_t arenas;
    uint64_t reserved;               /* bytes of arena segments */
    uint64_t limit;
    uint64_t slots_in_use;           /* slots out of the free stacks, held here or anywhere */
    uint64_t bytes_in_use;
} zct_pool_stats;

/* Library identity. */
int zct_abi_version(void);           /* ZCT_ABI_VERSION of the library */
const char *zct_version(void);       /* the release, "MAJOR.MINOR.PATCH" */

/* The last failure on the calling thread. */
const char *zct_last_error(void);
int zct_last_errno(void);

/* Segments. Names are given with or without the "zctipc_" prefix. */

/* Create a segment for a C-contiguous array; NULL or "" name: a random one.
   The caller holds one handle and the segment's refcount is 1. */
int zct_segment_create(const char *name, int32_t dtype, int32_t ndim, const int64_t *shape,
                       zct_handle *out, zct_info *info);
/* Create a segment of kind ZCT_KIND_TABLE holding nbytes (an Arrow IPC
   stream, written by the caller), zeroed. */
int zct_table_create(const char *name, uint64_t nbytes, zct_handle *segment, zct_info *info);
/* zct_segment_create (kind ZCT_KIND_TENSOR) or zct_table_create (kind
   ZCT_KIND_TABLE, dtype uint8, one dimension: a table of another dtype or
   shape is ZCT_E_INVALID) for a caller that writes every byte of the data:
   the data is not zeroed, and a large segment may be made from the pages
   of one this process let go, which is several times faster than fresh
   pages. The segment gets its name only with
   zct_segment_publish, once the data is written: until then no process can
   attach it, and closing it removes it. */
int zct_segment_create_uninit(const char *name, int32_t kind, int32_t dtype, int32_t ndim,
                              const int64_t *shape, zct_handle *out, zct_info *info);
/* Give a segment made by zct_segment_create_uninit its name (nothing for one
   that has it); ZCT_E_EXISTS when another segment took it meanwhile. */
int zct_segment_publish(zct_handle h);
/* Attach an existing segment of the given kind (ZCT_KIND_ANY: any kind).
   This process counts once in the refcount, however many handles it opens. */
int zct_segment_attach(const char *name, int32_t kind, int32_t readonly,
                       zct_handle *out, zct_info *info);
int zct_segment_info(zct_handle h, zct_info *info);
/* Attach the tensor segment a TensorRef describes (its JSON, len bytes, as
   Python's SharedTensor.ref() and Go's Tensor.Ref make it; docs/format.md),
   after checking it against the segment's header: dtype, shape, strides,
   offset, bytes, id and kind must all be the segment's. A mismatch is
   ZCT_E_INVALID, naming what differs. */
int zct_tensor_ref_attach(const char *json, uint64_t len, int32_t readonly, zct_handle *out, zct_info *info);
/* The segment's refcount; refcount must not be NULL (ZCT_E_INVALID). */
int zct_segment_refcount(zct_handle h, int64_t *refcount);
/* Add or drop one count on behalf of a holder that is not a process, such
   as a message in flight; the count that reaches zero unlinks the segment.
   refcount, which receives the new count, may be NULL. */
int zct_segment_addref(zct_handle h, int64_t *refcount);
int zct_segment_dropref(zct_handle h, int64_t *refcount);
/* Close a handle. The last handle in this process unmaps the segment and
   drops this process's count. */
int zct_segment_close(zct_handle h);
/* Remove a segment's name now; holders keep their mappings. */
int zct_segment_unlink(const char *name);
/* Read and validate a segment's header without attaching it. */
int zct_segment_stat(const char *name, zct_info *info);
/* Write the names of all library segments, '\n'-separated and NUL-terminated,
   into buf. *len receives the length without the NUL; when cap is too
   small the call returns ZCT_E_RANGE and only *len is written. */
int zct_segment_list(char *buf, uint64_t cap, uint64_t *len);
/* Release every ref this process holds and drop its count on every segment
   it holds, leaving mappings in place (for process exit). *count receives
   how many segments were released. */
int zct_release_all(int64_t *count);

/* Crash safety. A process records the counts it holds in a ledger, which
   the per-user cleanup daemon zctipcd gives up when the process dies.

   A C program that wants it calls zct_cleanup_enable(NULL) before its first
   segment, and at a normal exit (an atexit handler, say) zct_release_all()
   then zct_cleanup_disable(), so that it leaves nothing behind; when it is
   killed instead, the daemon gives up what it held. Without cleanup, what a
   C program holds at exit stays until zctipc gc. */

/* Sharing strategies: where new segments live. */
#define ZCT_STRATEGY_FILE_SYSTEM 0     /* files in /dev/shm (or $ZCTIPC_SHM_DIR) */
#define ZCT_STRATEGY_FILE_DESCRIPTOR 1 /* memfds, passed with SCM_RIGHTS by zctipcd */
int zct_set_strategy(int32_t strategy);
int zct_get_strategy(int32_t *strategy);
/* Make this process's ledger and say hello to the user's daemon, starting
   the program daemon_path when none runs; with NULL or "", the zctipcd
   beside libzctipc.so (as the Python wheel ships it), else the one on PATH,
   else none. The ledger is kept when the daemon cannot be reached
   (ZCT_E_NO_DAEMON): the next daemon finds it. Every exchange with the
   daemon has a deadline (2 s). */
int zct_cleanup_enable(const char *daemon_path);
/* Remove the ledger and close the connection: after zct_release_all, at
   exit. */
int zct_cleanup_disable(void);
/* Reports, as JSON written into buf as zct_segment_list writes: every
   library segment with its holders (zct_census); what gc removed, or would
   with dry_run (zct_gc: done by the daemon when one runs); and whether a
   daemon runs, with its status (zct_daemon_status). */
int zct_census(char *buf, uint64_t cap, uint64_t *len);
int zct_gc(int32_t dry_run, char *buf, uint64_t cap, uint64_t *len);
int zct_daemon_status(char *buf, uint64_t cap, uint64_t *len);

/* Validate a header held in memory, as zct_segment_attach validates the one
   it reads. file_size is the size of the file it came from. */
int zct_header_decode(const void *buf, uint64_t len, uint64_t file_size, zct_info *info);

/* Refs: counts on zctipc memory, the data of a tensor segment or a pool slot.
   A ref is made by zct_ref_find or zct_pool_alloc and handed on by a put or
   zct_ref_encode, or made by a get or zct_ref_decode; whoever has it either
   hands it on or releases it, once. */

/* 1 when the nbytes at addr are zctipc memory that zct_ref_find finds, else
   0 (or a negative status); no count is taken. */
int zct_memory_holds(const void *addr, uint64_t nbytes);
/* If the nbytes at addr lie in zctipc memory this process maps, make a ref
   with one more count on it; *offset receives addr's offset in the ref's
   memory. Otherwise ZCT_E_NOT_FOUND. */
int zct_ref_find(const void *addr, uint64_t nbytes, zct_handle *ref, uint64_t *offset);
int zct_ref_release(zct_handle ref);
/* How many counts the ref's memory has, in every process (a slot's count, or
   a segment's refcount). */
int zct_ref_holders(zct_handle ref, int64_t *count);
/* Turn a segment ref into a segment handle (for SharedTensor); the ref is gone. */
int zct_ref_segment(zct_handle ref, zct_handle *segment, zct_info *info);
/* Encode a view of a ref as a descriptor (docs/format.md) into buf. On
   success the ref's count travels in the bytes, and the ref is gone. */
int zct_ref_encode(const zct_view *view, void *buf, uint64_t cap, uint64_t *len);
/* Decode a descriptor made by zct_ref_encode, taking over its count. */
int zct_ref_decode(const void *buf, uint64_t len, zct_view *view);
/* Encode a view of a ref as a descriptor, as zct_ref_encode does, but keep
   the ref and its count: the descriptor carries none. Whoever holds the
   ref keeps the memory alive for those who attach the descriptor. */
int zct_ref_describe(const zct_view *view, void *buf, uint64_t cap, uint64_t *len);
/* Attach a descriptor made by zct_ref_describe with a new count of this
   process's own, while the memory still has one (ZCT_E_NOT_FOUND once its
   holders all let go); the descriptor may be attached any number of times. */
int zct_ref_attach(const void *buf, uint64_t len, zct_view *view);

/* The pool. timeout_ms: -1 waits for ever, 0 not at all. */
/* A slot of at least nbytes, with one count, its bytes not zeroed; *size
   receives its size. ZCT_E_INVALID above the largest size class;
   ZCT_E_FULL when the pool stayed full until the timeout (a slot may be
   freed later); ZCT_E_NO_SPACE at once when waiting cannot help (the
   slot's arena is larger than the pool's limit, or the shared-memory file
   system is full and no slot of its class is in use to come back). */
int zct_pool_alloc(uint64_t nbytes, int64_t timeout_ms, zct_handle *ref, void **data, uint64_t *size);
/* zct_pool_alloc for a sender that can send the bytes another way: the
   slot takes new pages of the shared-memory file system (a slot never
   used, or a new arena) only while leave bytes stay free there besides
   them; a slot used before is always taken. Without them, ZCT_E_FULL
   when a slot of its class is in use (it comes back with its pages),
   else ZCT_E_NO_SPACE. */
int zct_pool_alloc_leaving(uint64_t nbytes, uint64_t leave, int64_t timeout_ms, zct_handle *ref, void **data,
                           uint64_t *size);
/* Give back the arenas of the pool with no slot in use anywhere: their
   memory returns to the shared-memory file system. */
int zct_pool_trim(void);
int zct_pool_stats_get(zct_pool_stats *stats);
int zct_pool_set_limit(uint64_t bytes);

/* Queues. capacity: the ring's bytes, the largest message (rounded up to a
   power of two); 0 makes an unbounded queue, whose ring of 1 GiB uses the
   memory of the messages it holds (16 MiB, bounded, before Linux 5.14).
   maxsize: the most messages at once, 0 for no limit. */
int zct_queue_create(const char *name, uint64_t capacity, uint64_t maxsize, zct_handle *queue);
/* Attach a queue; with adopt, take over a count a message in flight carried. */
int zct_queue_attach(const char *name, int32_t adopt, zct_handle *queue);
/* The queue's name, its capacity (the largest record it takes: the ring's
   bytes, less 2 MiB for an unbounded queue; format.md) and most messages
   (0: no limit). */
int zct_queue_describe(zct_handle queue, char *name, uint64_t cap, uint64_t *capacity, uint64_t *maxsize);
/* How this handle's calls wait for messages or room: poll 0 spins for
   spin_ns (yielding the CPU between looks) and then sleeps on a futex;
   poll 1 polls without yielding for spin_ns before sleeping. A negative
   spin_ns is the policy's default: for poll 0 (the default policy) 50 us,
   stretched to twice the recent waits, up to 200 us, while they are that
   short; for ever for poll 1. */
int zct_queue_set_wait(zct_handle queue, int32_t poll, int64_t spin_ns);
/* Add one count to the queue for a message in flight (pickled handles). */
int zct_queue_addref(zct_handle queue);
int zct_queue_close(zct_handle queue);
/* Append a record. On success the views' refs travel with it and are gone;
   on failure they are left to the caller. type is a zct_record_type;
   another value, or a record that its type does not allow (an inline
   payload that is no inline array, views in an inline or bytes record), is
   ZCT_E_INVALID. A timeout_ms too large to add to the clock waits for ever. */
int zct_queue_put(zct_handle queue, int32_t type, const void *payload, uint64_t len,
                  const zct_view *views, int32_t nviews, int64_t timeout_ms);
/* Put an inline record (ZCT_RECORD_INLINE): a small array copied in, its
   nbytes of elements in C order at data, of dtype, ndim dimensions of
   shape and flags (zct_view_flags). The library writes the array's header,
   shape and elements straight into the queue's ring (format.md, "inline"),
   reading data once, while the call runs. ZCT_E_INVALID when ndim is
   outside 0..ZCT_MAX_NDIM, flags outside 0..7, a dimension negative,
   nbytes not the bytes that shape and dtype make, or the record larger
   than the queue takes (zct_queue_describe's capacity); ZCT_E_DTYPE for
   an unknown dtype; waiting, ZCT_E_FULL and ZCT_E_CLOSED as for
   zct_queue_put. */
int zct_queue_put_inline(zct_handle queue, const void *data, uint64_t nbytes, int32_t dtype, int32_t ndim,
                         const int64_t *shape, int32_t flags, int64_t timeout_ms);
/* zct_ref_find and zct_queue_put of one view in one call: put a record of
   type with no payload and one view, of the array of dtype, ndim, shape and
   byte strides whose extent bytes start at addr, when they are zctipc
   memory. ZCT_E_NOT_FOUND when they are not; ZCT_E_INVALID when the array
   reaches past extent; on any failure no count is left taken. */
int zct_queue_put_array(zct_handle queue, int32_t type, const void *addr, uint64_t extent, int32_t dtype,
                        int32_t ndim, const int64_t *shape, const int64_t *strides, int32_t flags,
                        int64_t timeout_ms);
/* Take the next record into buf: its type, where its payload lies in buf,
   and its views (zct_record_type says which it has). A record larger than
   cap or with more than views_cap views stays in the queue: ZCT_E_RANGE,
   with the needed sizes in *payload_len (record bytes) and *nviews. */
int zct_queue_get(zct_handle queue, void *buf, uint64_t cap, int64_t timeout_ms,
                  int32_t *type, uint64_t *payload_offset, uint64_t *payload_len,
                  zct_view *views, int32_t views_cap, int32_t *nviews);
/* Take the next record as zct_queue_get does, in one call with few
   arguments: the result, when it is not negative (a status), packs the
   payload's length, its offset in buf and the record type (ZCT_TAKE_*),
   and *nviews receives the number of views. A record that does not fit
   stays in the queue: ZCT_E_RANGE, and zct_queue_get says what it needs. */
int64_t zct_queue_take(zct_handle queue, void *buf, uint64_t cap, int64_t timeout_ms,
                       zct_view *views, int32_t views_cap, int32_t *nviews);
/* Append count records of one type without views, their payloads laid end
   to end in data, payload i ending at ends[i]: the first when it fits
   (waiting as zct_queue_put does), then as many more as fit at once.
   *written receives how many were appended. */
int zct_queue_put_many(zct_handle queue, int32_t type, const void *data, const uint64_t *ends,
                       int32_t count, int64_t timeout_ms, int32_t *written);
/* Take up to max_records records into buf: the first when there is one
   (waiting as zct_queue_get does), then those that follow while they fit in
   buf and their views in views. *records receives how many, recs (room for
   max_records) what each is and where its payload lies, views the views of
   them all in order (as zct_queue_get gives them), and *filled the bytes
   of buf used. A first record that does not fit: ZCT_E_RANGE, with
   *filled and *nviews what it needs, as for zct_queue_get. A record that
   cannot be given (it does not decode, or a count its descriptors carry
   cannot be taken: a descriptor replayed, memory gone) costs only itself:
   its recs entry has type 0 and no views (none of its counts is left
   taken), the others are given whole, and the call returns its error
   (ZCT_E_CORRUPT, ZCT_E_TAKEN, ...) with *records, recs, views and
   *filled written; the views' refs are the caller's, as on success. A
   call that fails before it took a record sets *records to 0. */
int zct_queue_get_many(zct_handle queue, void *buf, uint64_t cap, int32_t max_records, int64_t timeout_ms,
                       int32_t *records, zct_record *recs, uint64_t *filled,
                       zct_view *views, int32_t views_cap, int32_t *nviews);
/* The messages in the queue and those not yet marked done; neither pointer
   may be NULL (ZCT_E_INVALID). */
int zct_queue_len(zct_handle queue, int64_t *items, int64_t *unfinished);
/* The size of the largest record a put would find room for now, header
   included (0 when maxsize messages are in the queue). */
int zct_queue_room(zct_handle queue, uint64_t *bytes);
int zct_queue_task_done(zct_handle queue);
/* Wait until every message put was marked done; ZCT_E_FULL at the timeout. */
int zct_queue_join(zct_handle queue, int64_t timeout_ms);
/* Wait until the queue holds a message, without taking it (another consumer
   may take it first); ZCT_E_EMPTY at the timeout. For waiting on a queue
   among other things: zctipc's Python package signals a readiness file
   descriptor from it. */
int zct_queue_wait(zct_handle queue, int64_t timeout_ms);
/* Sleeping outside the library's Go runtime, which a thread that waits
   long should do (a sleep inside it wakes the runtime's monitor thread some
   sixty times; one in zct_sleep costs nothing): arm the word to wait on,
   which counts the thread among its sleepers and gives *word and the value
   *seen to sleep on; look again without waiting (a get or put with
   timeout 0); if it must still wait, zct_sleep(*word, *seen, ...) as long
   and as often as it likes; then disarm. which: ZCT_WAIT_DATA (messages
   may be there), ZCT_WAIT_SPACE (room), ZCT_WAIT_JOIN (every message done).
   pass_on: the thread was woken and takes no message, so that a consumer
   is woken in its place. A disarm with no arm before it is refused;
   closing the handle wakes its sleepers and takes back what they armed. */
enum { ZCT_WAIT_DATA = 0, ZCT_WAIT_SPACE = 1, ZCT_WAIT_JOIN = 2 };
int zct_queue_arm(zct_handle queue, int32_t which, uint32_t **word, uint32_t *seen);
int zct_queue_disarm(zct_handle queue, int32_t which, int32_t pass_on);
/* Sleep while *word == seen, up to timeout_ms (-1: for ever): ZCT_OK when
   woken or the word moved (look again), ZCT_E_EMPTY at the timeout,
   ZCT_E_INTERRUPTED on a signal, ZCT_E_CLOSED when the word is no longer
   mapped. Plain C: it neither enters the Go runtime nor touches the word
   but through the kernel, so it is safe after the handle was closed. A
   sleep that begins after the close may find the address taken by another
   mapping, and then lasts until its timeout: sleep in bounded slices, and
   stop once the handle was closed. */
int zct_sleep(const uint32_t *word, uint32_t seen, int64_t timeout_ms);

/* Streams: one writer and up to 64 readers of a ring of fixed-size frames
   (docs/format.md). timeout_ms: -1 waits for ever, 0 not at all. */
typedef struct zct_stream_info {
    void *data;                      /* the data region; slot i is at data + ring_offset + i * stride */
    uint64_t ring_offset;
    uint64_t stride;                 /* bytes from one slot to the next */
    uint64_t frame_bytes;
    int64_t shape[ZCT_MAX_NDIM];     /* of one frame, C-contiguous */
    int64_t reader_timeout_ms;       /* 0: readers are evicted only when their process dies */
    int32_t dtype;
    int32_t ndim;
    int32_t frames;                  /* slots in the ring */
    int32_t readers;                 /* reader slots */
    int32_t policy;                  /* 0 block, 1 overwrite */
    char name[ZCT_NAME_CAP];
} zct_stream_info;

int zct_stream_create(const char *name, int32_t dtype, int32_t ndim, const int64_t *shape, int32_t frames,
                      int32_t readers, int32_t policy, int64_t reader_timeout_ms,
                      zct_handle *stream, zct_stream_info *info);
int zct_stream_attach(const char *name, zct_handle *stream, zct_stream_info *info);
/* Close this process's handle; its writer and readers must be closed first. */
int zct_stream_close(zct_handle stream);
/* End the stream: no more frames; readers read what was published, then get
   ZCT_E_ENDED; waiters wake. */
int zct_stream_end(zct_handle stream);
int zct_stream_stats(zct_handle stream, uint64_t *published, uint64_t *dropped, int32_t *readers, int32_t *ended);
/* Become the writer (ZCT_E_BUSY while another live process is). */
int zct_stream_writer(zct_handle stream, zct_handle *writer);
/* Claim the next frame: *slot receives its slot. ZCT_E_FULL at the timeout
   (under the block policy), ZCT_E_ENDED once ended. */
int zct_stream_write_look(zct_handle writer, int64_t timeout_ms, int32_t *slot);
/* Publish the frame claimed. */
int zct_stream_write_increment(zct_handle writer);
int zct_stream_writer_close(zct_handle writer);
/* Join as the reader of slot index, or of the first free one when index is
   negative; *slot receives it. ZCT_E_BUSY when taken. */
int zct_stream_reader(zct_handle stream, int32_t index, zct_handle *reader, int32_t *slot);
/* The next frame's slot. ZCT_E_EMPTY at the timeout, ZCT_E_ENDED when the
   stream ended and every frame was read. */
int zct_stream_read_look(zct_handle reader, int64_t timeout_ms, int32_t *slot);
/* Release the frame looked at; *whole is 0 when the writer overwrote it
   meanwhile (it then counts as dropped). */
int zct_stream_read_increment(zct_handle reader, int32_t *whole);
/* Release the frame looked at, if any (*whole as zct_stream_read_increment
   says; 1 when none was), then look at the next: one call per frame. */
int zct_stream_read_next(zct_handle reader, int64_t timeout_ms, int32_t *slot, int32_t *whole);
int zct_stream_reader_stats(zct_handle reader, uint64_t *position, uint64_t *received, uint64_t *dropped);
/* How the reader waits for frames, and the writer for room, as
   zct_queue_set_wait says. */
int zct_stream_reader_set_wait(zct_handle reader, int32_t poll, int64_t spin_ns);
int zct_stream_writer_set_wait(zct_handle writer, int32_t poll, int64_t spin_ns);
/* Arm and disarm the reader's wait for frames, for zct_sleep, as
   zct_queue_arm and zct_queue_disarm do. */
int zct_stream_reader_arm(zct_handle reader, uint32_t **word, uint32_t *seen);
int zct_stream_reader_disarm(zct_handle reader);
/* Arm and disarm the writer's wait for room, for zct_sleep, likewise:
   until the disarm, readers that move past the frame the writer waits for
   wake it. Only a look evicts dead or stale readers: a writer that sleeps
   long looks again now and then (a look with timeout 0) even when not
   woken. */
int zct_stream_writer_arm(zct_handle writer, uint32_t **word, uint32_t *seen);
int zct_stream_writer_disarm(zct_handle writer);
int zct_stream_reader_close(zct_handle reader);

/* Events: a flag in shared memory that processes set, clear and wait for. */
int zct_event_create(const char *name, zct_handle *event, char *full_name, uint64_t cap);
int zct_event_attach(const char *name, zct_handle *event);
int zct_event_close(zct_handle event);
int zct_event_set(zct_handle event);
int zct_event_clear(zct_handle event);
int zct_event_is_set(zct_handle event, int32_t *set);
/* Wait until the event is set: *set receives 1, or 0 at the timeout. */
int zct_event_wait(zct_handle event, int64_t timeout_ms, int32_t *set);

/* CUDA device memory. The driver is loaded on first use; without it (or
   without a device) every call fails with ZCT_E_NO_CUDA. */
typedef struct zct_cuda_ipc {
    uint8_t handle[64];              /* cuIpcGetMemHandle of the allocation's base */
    uint8_t event[64];               /* an interprocess event recorded on the producer's stream; zero: none */
    uint64_t offset;                 /* of the memory from the allocation's base */
    uint64_t size;                   /* of the allocation */
    int32_t device;
    int32_t reserved;
} zct_cuda_ipc;

int zct_cuda_devices(int32_t *count, int32_t *driver_version);
/* Legacy IPC: describe the device memory at ptr on device, with an event
   recorded on stream (0: the legacy default stream). The export holds the
   event until zct_cuda_ipc_release; the memory stays the caller's.
   zct_cuda_ipc_record records the event again for another send. */
int zct_cuda_ipc_export(int32_t device, uint64_t ptr, uint64_t stream, zct_cuda_ipc *ipc, zct_handle *export_);
int zct_cuda_ipc_record(zct_handle export_, uint64_t stream);
int zct_cuda_ipc_release(zct_handle export_);
/* The address of described memory here: the allocation is opened once per
   process (cached), or is this process's own; stream (0: the legacy default
   stream) is made to wait for the producer's event, on the GPU. */
int zct_cuda_ipc_open(const zct_cuda_ipc *ipc, uint64_t stream, uint64_t *ptr);
int zct_cuda_ipc_close(const zct_cuda_ipc *ipc);
/* Close cached allocations nothing uses, keeping at most keep open. */
int zct_cuda_ipc_trim(int32_t keep);
/* How many allocations this process has opened with cuIpcOpenMemHandle. */
int zct_cuda_ipc_opens(int64_t *count);
/* VMM: shareable memory (cuMemCreate with POSIX file-descriptor handles),
   size rounded up to the device's granularity, mapped here. */
int zct_cuda_alloc(int32_t device, uint64_t size, zct_handle *alloc, uint64_t *ptr, uint64_t *size_out);
/* Serve the allocation's file descriptor to this user's processes; *name
   receives the share name. */
int zct_cuda_share(zct_handle alloc, char *name, uint64_t cap);
/* Fetch a shared allocation's descriptor (SCM_RIGHTS) from the process that
   shares it and map it for device (-1: the device it lives on). */
int zct_cuda_import(const char *name, int32_t device, zct_handle *alloc, uint64_t *ptr, uint64_t *size,
                    int32_t *resident);
/* Unmap and release this process's hold (and stop sharing it). */
int zct_cuda_free(zct_handle alloc);

/* The caching allocator of shareable device memory: every block lies in a
   VMM allocation another process can map by name (zct_cuda_vmm_export), and
   a freed block is kept for the next request of its size on its device and
   stream, so a steady-state allocation makes no driver call. A request of 0
   bytes gets address 0. When the driver runs out of memory the cache gives
   back what it holds unused and tries once more: ZCT_E_CUDA_OOM after. */
int zct_cuda_cache_alloc(int32_t device, uint64_t size, uint64_t stream, uint64_t *ptr);
/* ZCT_OK when device can make memory shareable by file descriptor (virtual
   memory management, POSIX file-descriptor handles); asks the device's
   attributes, without making a context on it. */
int zct_cuda_shareable(int32_t device);
int zct_cuda_cache_free(uint64_t ptr);
/* Give unused cached allocations back to the driver (device -1: of every
   device); *released receives how many. */
int zct_cuda_cache_trim(int32_t device, int64_t *released);
typedef struct zct_cuda_cache_info {
    int64_t segments;                /* allocations held, in use or cached */
    uint64_t reserved;               /* their bytes */
    uint64_t in_use;                 /* bytes of blocks handed out */
    int64_t blocks;                  /* blocks handed out */
    uint64_t creates;                /* driver allocations made, ever */
    uint64_t hits;                   /* requests served from the cache, ever */
    uint64_t trimmed;                /* allocations given back, ever */
    uint64_t requested;              /* requests, ever */
} zct_cuda_cache_info;
int zct_cuda_cache_stats(zct_cuda_cache_info *info);
/* torch.cuda.memory.CUDAPluggableAllocator's two functions over the cache.
   When an allocation fails, zct_torch_alloc throws std::runtime_error (a C++
   exception, with zct_last_error's message) where the process has a C++
   runtime loaded, since torch reports nothing else; otherwise it returns
   NULL. C callers use zct_cuda_cache_alloc. */
void *zct_torch_alloc(size_t size, int device, void *stream);
void zct_torch_free(void *ptr, size_t size, int device, void *stream);

/* Memory of the caching allocator, described for another process. */
typedef struct zct_cuda_vmm {
    char name[64];                   /* the share name of the allocation, NUL-terminated */
    uint8_t event[64];               /* an interprocess event recorded on the producer's stream; zero: none */
    uint64_t offset;                 /* of the memory from the allocation's base */
    uint64_t size;                   /* of the allocation */
    int32_t device;                  /* the device it lives on */
    int32_t reserved;
} zct_cuda_vmm;
/* Describe the shareable memory at ptr with an event recorded on stream:
   anywhere in a block of the cache in use, in an allocation of
   zct_cuda_alloc (shared by this call if it was not), or in one this
   process mapped by zct_cuda_vmm_open (described by its producer's name);
   ZCT_E_NOT_FOUND for other memory. The
   export is an event handle as zct_cuda_ipc_export makes:
   zct_cuda_ipc_record records it again, zct_cuda_ipc_release destroys it. */
int zct_cuda_vmm_export(uint64_t ptr, uint64_t stream, zct_cuda_vmm *vmm, zct_handle *export_);
/* The address of described memory here: the allocation is fetched by file
   descriptor and mapped once per process (cached), or is this process's
   own; stream is made to wait for the producer's event, on the GPU. */
int zct_cuda_vmm_open(const zct_cuda_vmm *vmm, uint64_t stream, uint64_t *ptr);
int zct_cuda_vmm_close(const zct_cuda_vmm *vmm);
/* How many allocations this process has mapped by zct_cuda_vmm_open, ever.
   A mapping stays while a user holds it, and the 8 most recently idle stay
   after; zct_cuda_ipc_trim unmaps idle ones. */
int zct_cuda_vmm_imports(int64_t *count);

/* Observing without taking (zctipc top and tail): these calls read queues,
   streams and pool arenas that other processes use, and take nothing from
   them: no message, no frame, no lock, no reader slot, no wake-up. */

/* Cursors of zct_queue_peek besides one it returned, and the frame of
   zct_stream_peek that was published last. */
#define ZCT_PEEK_OLDEST 0xFFFFFFFFFFFFFFFF  /* the oldest message in the queue */
#define ZCT_PEEK_NEWEST 0xFFFFFFFFFFFFFFFE  /* the next message put */
#define ZCT_PEEK_LATEST 0xFFFFFFFFFFFFFFFF  /* the frame published last */
/* Copy the record at *cursor into buf without taking it, as zct_queue_get
   says it (type, payload, views), and move *cursor past it. A record a
   consumer took before it could be copied is skipped: *missed receives how
   many were. Each view of a descriptor holds a new ref of this process's
   own (never the count the record carries, which stays its taker's); a
   view whose memory every holder let go meanwhile has ref 0 and data NULL
   (an inline array's has ref 0 too, and lies in buf: ZCT_REF_INLINE). ZCT_E_EMPTY when
   no record is there yet (or consumers took every one before it could be
   copied, many times over: ask again later), ZCT_E_RANGE when it does not
   fit (the sizes as zct_queue_get writes them); both write *cursor (to ask
   again) and *missed. With buf NULL and cap 0, the record is passed over without a
   copy: *cursor moves past it, *type receives 0, and *payload_len and
   *nviews its sizes. A record that does not decode, or whose memory cannot
   be attached, fails (ZCT_E_CORRUPT, say) with *cursor past it, so that the
   next call goes on. The copy is checked to be the record (a consumer may
   take it, and a producer write over it, meanwhile): docs/format.md,
   "Peeking". */
int zct_queue_peek(zct_handle queue, uint64_t *cursor, void *buf, uint64_t cap, int32_t *type,
                   uint64_t *payload_offset, uint64_t *payload_len, zct_view *views, int32_t views_cap,
                   int32_t *nviews, uint64_t *missed);
/* Copy frame *position (ZCT_PEEK_LATEST: the frame published last) into
   buf (frame_bytes at least) without joining as a reader, and write the
   position of the frame copied: *position, or a later one when the writer
   overwrote it first. ZCT_E_EMPTY when it is not published yet (or the
   writer overwrote every frame before it could be copied, many times over),
   ZCT_E_ENDED when the stream ended before it; both write *position (to ask
   again). */
int zct_stream_peek(zct_handle stream, uint64_t *position, void *buf, uint64_t cap);
/* Report, as JSON written into buf as zct_census writes, the state of the
   segment name (a queue, stream or pool arena: its counts, positions, lock
   and role holders, reader slots), mapped without a count for the call. */
int zct_segment_observe(const char *name, char *buf, uint64_t cap, uint64_t *len);

/* END CDEF */

#ifdef __cplusplus
}
#endif

#endif /* ZCTIPC_H */
