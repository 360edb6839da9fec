/*
 * zctipc.h: the C ABI of libzctipc.so, zero-copy tensor IPC.
 *
 * Hand-written and checked in. A Go test (tests/go/capi_test.go) checks that
 * every function declared here is exported by the built library, and the
 * export layer (go/capi) includes this file, so the compiler checks every
 * signature against its Go implementation.
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

#define ZCT_ABI_VERSION 1
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
    ZCT_E_NO_SPACE = -8,     /* the shared-memory file system cannot hold the segment */
    ZCT_E_DTYPE = -9,        /* an unknown dtype code */
    ZCT_E_CLOSED = -10,      /* the handle is closed or was never valid */
    ZCT_E_RANGE = -11,       /* an output buffer is too small; the needed size was written */
    ZCT_E_OS = -20,          /* another operating-system error; see zct_last_errno() */
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
    ZCT_KIND_TABLE = 5
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
/* Attach an existing segment of the given kind (ZCT_KIND_ANY: any kind).
   This process counts once in the refcount, however many handles it opens. */
int zct_segment_attach(const char *name, int32_t kind, int32_t readonly,
                       zct_handle *out, zct_info *info);
int zct_segment_info(zct_handle h, zct_info *info);
int zct_segment_refcount(zct_handle h, int64_t *refcount);
/* Add or drop one count on behalf of a holder that is not a process, such
   as a message in flight; the count that reaches zero unlinks the segment. */
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
/* Drop this process's count on every segment it holds, leaving mappings in
   place (for process exit). *count receives how many were released. */
int zct_release_all(int64_t *count);

/* Validate a header held in memory, as zct_segment_attach validates the one
   it reads. file_size is the size of the file it came from. */
int zct_header_decode(const void *buf, uint64_t len, uint64_t file_size, zct_info *info);

/* END CDEF */

#ifdef __cplusplus
}
#endif

#endif /* ZCTIPC_H */
