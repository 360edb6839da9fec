/* The data plane: the per-message steps of a queue, written once in C so
 * that a host (Python through the C ABI) runs them without entering the Go
 * runtime, and Go runs the same code through cgo (Note [a data plane the
 * runtime never enters] in plane.go).
 *
 * Everything here touches shared memory that another process of the user
 * may shrink: each entry point runs under zp_guard, which turns the SIGBUS
 * of a page past the file's end into ZP_FAULT, and never waits: a step that
 * must wait (a lock held by another, no room, no message) says so and the
 * caller, in Go, waits. */
#ifndef ZCTIPC_PLANE_H
#define ZCTIPC_PLANE_H

#include <stdint.h>

/* The plane's functions are the library's own: not exported from it. */
#define ZP_API __attribute__((visibility("hidden")))

/* Results of the plane's steps. */
enum {
    ZP_OK = 0,
    ZP_BUSY = 1,     /* the lock is held by another: wait for it, then call again holding it */
    ZP_WAIT = 2,     /* no room (put) or no message (get): wait for the word to move from *seen */
    ZP_CATCH_UP = 3, /* put, unbounded ring: no room; the put lock is still held (but with ZP_LET_GO):
                        catch up, then call again */
    ZP_CORRUPT = 4,  /* the ring's words or a record cannot be right */
    ZP_NO_MEMORY = 5, /* reserving pages failed (errno in *err); nothing was put */
    ZP_RANGE = 6,    /* get: the first record does not fit the buffer or the views */
    ZP_FAULT = 7,    /* the memory faulted (the file was shrunk); the step let go of the locks it held,
                        a ZP_LOCKED caller's too, where their words could still be written */
    ZP_TOO_LARGE = 8, /* put: a record larger than the queue takes (need) */
};

/* Flags of zp_put and zp_get. */
enum {
    ZP_LOCKED = 1, /* the caller holds the lock already */
    ZP_PLAIN = 2,  /* get: take the first record only if it is plain, a pickle, bytes or an inline
                      array with no descriptor whose payload lies within it, as the ring and the copy
                      in buf both say; leave any other (ZP_RANGE). An inline array's own header is
                      the taker's to read (zp_inline_read) */
    ZP_LET_GO = 4, /* put: a caller that does not catch up: ZP_CATCH_UP holds no lock; calling again
                      without the flag does the catch-up */
};

/* Layout of a queue segment's data region (docs/format.md). */
enum {
    ZP_OFF_CAPACITY = 0,
    ZP_OFF_MAX_ITEMS = 8,
    ZP_OFF_RING_VERSION = 16,
    ZP_OFF_PUT_LOCK = 64,
    ZP_OFF_TAIL = 96,
    ZP_OFF_RESERVED = 104,
    ZP_OFF_WINDOW = 108,
    ZP_OFF_WINDOW_NEED = 112,
    ZP_OFF_GET_LOCK = 128,
    ZP_OFF_HEAD = 160,
    ZP_OFF_GIVEN_BACK = 168,
    ZP_OFF_DONE = 192,
    ZP_OFF_DATA_SEQ = 256,
    ZP_OFF_DATA_WAITERS = 260,
    ZP_OFF_SPACE_SEQ = 320,
    ZP_OFF_SPACE_WAITERS = 324,
    ZP_OFF_JOIN_SEQ = 384,
    ZP_OFF_JOIN_WAITERS = 388,
    ZP_RING_AT = 512,
};

/* Sizes of the ring (package queue says why). */
#define ZP_CHUNK (2u << 20)
#define ZP_WARM_WINDOW ZP_CHUNK
#define ZP_RESERVE_STEP (64u << 10)
#define ZP_TYPE_SKIP 0xFF
#define ZP_RECORD_HEADER 16u
#define ZP_TYPE_INLINE 4

/* A queue as this process sees it: read from its layout once, at open. */
typedef struct zp_queue {
    uint8_t *data;        /* the data region */
    uint32_t capacity;    /* ring bytes, a power of two */
    uint32_t mask;
    uint32_t max_items;   /* 0: no limit */
    uint32_t max_record;
    uint32_t sparse;      /* ring version 2 or 3: pages come and go */
    uint32_t warm;        /* ring version 3: a warm window */
    uint32_t page;        /* the page size */
    uint32_t pid;         /* this process, for the locks */
    uint64_t start;       /* and its start time */
} zp_queue;

/* An arena of pool slots as this process sees it (pool.c, below): its
 * layout, read and checked once, by package pool, when it made or mapped
 * the arena; never read again from the shared header, which another
 * process may write. */
typedef struct zp_arena {
    uint8_t *data;      /* the data region */
    uint64_t slot_size; /* bytes per slot */
    uint64_t slots_at;  /* where the slots start in data */
    uint32_t nslots;
} zp_arena;

typedef struct zp_ledger zp_ledger; /* the ledger (ledger.c, below) */

/* A count that a record hands over (package buffer, Note [counts that
 * wait]): its ledger entry to drop (entry in l; -1 or l NULL: none), then
 * its ticket to arm, slot tslot of ticket arena t (a copy of its view; data
 * NULL: no ticket) with nonce, as zp_slot_send does. The put step runs the
 * sends of the records it puts once it has found room for them and before
 * the store that makes them visible; a put that puts nothing runs none. */
typedef struct zp_send {
    zp_arena t;
    zp_ledger *l;
    uint64_t nonce;
    int32_t entry;
    uint32_t tslot;
} zp_send;

/* One record to put: prefix (its header and descriptors, encoded; the
 * header's size field included) then payload; size is their sum rounded up
 * to 8 bytes; sends[0..nsends) are the counts it hands over. */
typedef struct zp_record {
    const void *prefix;
    const void *payload;
    uint64_t payload_len;
    uint32_t prefix_len;
    uint32_t size;
    const zp_send *sends;
    int32_t nsends;
} zp_record;

/* What a step reports besides its result. */
typedef struct zp_out {
    uint32_t seen;   /* ZP_WAIT: the word's value to sleep on */
    int32_t n;       /* records put or taken */
    uint64_t filled; /* get: bytes of buf filled */
    int32_t views;   /* get: views the records taken make */
    uint32_t need;   /* ZP_RANGE: the first record's size; ZP_CORRUPT: a size or head */
    uint32_t need_views; /* ZP_RANGE: its views; ZP_CORRUPT: tail */
    int32_t err;     /* ZP_NO_MEMORY: errno */
    int32_t what;    /* ZP_CORRUPT: which check (ZP_BAD_*) */
    uintptr_t addr;  /* ZP_FAULT: the address */
} zp_out;

/* What a ZP_CORRUPT met. */
enum {
    ZP_BAD_POSITIONS = 1, /* head need, tail need_views */
    ZP_BAD_SKIP = 2,      /* a skip record of need bytes at ring offset need_views */
    ZP_BAD_RECORD = 3,    /* a record of need bytes */
    ZP_IN_SENDS = 4,      /* ZP_FAULT of a put: in or after its sends, once a count may have left the ledger
                             (its record may be in the queue or not); the counts of its sends are lost rather
                             than given up twice */
};

/* Put recs[0..n) in order: wait (ZP_WAIT) for room for the first, then as
 * many of the others as fit, committed with one store, the sends of those
 * put run just before it (zp_send). A send of a ticket past its arena's
 * slots is ZP_RANGE, before anything is done. */
ZP_API int zp_put(const zp_queue *q, const zp_record *recs, int32_t n, int32_t flags, zp_out *out);

/* zp_put of one record, given by its parts (for Go, which may pass its
 * pointers as arguments but not inside a zp_record). */
ZP_API int zp_put1(const zp_queue *q, const void *prefix, uint32_t prefix_len, const void *payload,
                   uint64_t payload_len, uint32_t size, const zp_send *sends, int32_t nsends, int32_t flags,
                   zp_out *out);

/* Take records into buf (capacity cap): up to max_records in all while they
 * fit and make at most max_views views. */
ZP_API int zp_get(const zp_queue *q, void *buf, uint64_t cap, int32_t max_records, int32_t max_views, int32_t flags,
           zp_out *out);

/* Catch up an unbounded ring whose put found no room (ZP_CATCH_UP): give
 * back what killed consumers left. The caller holds the put lock and the
 * get lock, and keeps both; *moved says whether anything was given back. */
ZP_API int zp_catch_up(const zp_queue *q, int32_t *moved, zp_out *out);

/* Arm a sleep on the queue's wait word which (0 data, 1 space, 2 join):
 * count the caller among its sleepers and give the word and its value;
 * disarm takes one back (pass_on: a woken sleeper of data that takes no
 * message wakes another when messages are there); unarm takes back n at
 * once, for a handle that closes. */
ZP_API int zp_arm(const zp_queue *q, int32_t which, uint32_t **word, uint32_t *seen);
ZP_API int zp_disarm(const zp_queue *q, int32_t which, int32_t pass_on);
ZP_API int zp_unarm(const zp_queue *q, int32_t which, uint32_t n);

/* The lock words (package lock): take a free lock (ZP_OK, else ZP_BUSY),
 * or let one go; and a sequence word: bump it and wake up to n of its
 * sleepers. Each ZP_FAULT when the memory faulted. */
ZP_API int zp_try_lock(uint32_t *lock, uint32_t pid, uint64_t start);
ZP_API int zp_unlock(uint32_t *lock);
ZP_API int zp_signal(uint32_t *word, uint32_t *waiters, int32_t n);

/* Look at word for spin_ns, yielding the CPU between looks after the first
 * 64 (package futex, Note [paced spin]); or, with poll, keeping the CPU, a
 * spin-wait hint between looks (package futex's Policy.Poll): ZP_OK once
 * it moved from seen, ZP_WAIT when it did not, ZP_FAULT when its memory
 * faulted. */
ZP_API int zp_spin(const uint32_t *word, uint32_t seen, int64_t spin_ns, int32_t poll);

/* -- inline arrays (inline.c) ------------------------------------------- */

#define ZP_MAX_NDIM 32
#define ZP_DTYPES 64
#define ZP_INLINE_HEADER 8u

/* What an inline array breaks (zp_inline_check, zp_inline_read). */
enum {
    ZP_BAD_INLINE_HEADER = 1, /* too short, ndim past ZP_MAX_NDIM, flags past 7, its zero word not zero */
    ZP_BAD_INLINE_DTYPE = 2,  /* a code zp_dtype_sizes does not know */
    ZP_BAD_INLINE_SHAPE = 3,  /* a negative dimension */
    ZP_BAD_INLINE_BYTES = 4,  /* its elements are not the bytes its shape and dtype make */
};

/* The size of each element type by its code, 0 for a code that names
 * none: package dtype's table, which package plane copies in once. */
ZP_API extern uint8_t zp_dtype_sizes[ZP_DTYPES];

/* An inline array read from a record's payload. */
typedef struct zp_inline {
    uint16_t dtype;
    uint8_t flags;
    uint8_t ndim;
    uint32_t at;     /* where its elements start in the payload */
    uint64_t nbytes; /* the bytes of its elements */
    int64_t shape[ZP_MAX_NDIM];
} zp_inline;

/* Whether an array may travel inline: ZP_OK, or the ZP_BAD_INLINE_* it breaks. */
ZP_API int zp_inline_check(uint32_t dtype, uint32_t flags, uint32_t ndim, const int64_t *shape, uint64_t nbytes);

/* Write an inline array's header (ZP_INLINE_HEADER + 8 * ndim bytes) into
 * dst and return its size: its elements follow it. */
ZP_API uint32_t zp_inline_head(uint8_t *dst, uint16_t dtype, uint8_t flags, uint8_t ndim, const int64_t *shape);

/* Read and check the inline array that a payload of len bytes holds:
 * ZP_OK, or the ZP_BAD_INLINE_* it breaks. */
ZP_API int zp_inline_read(const uint8_t *payload, uint64_t len, zp_inline *out);

/* Bump a sequence word and wake up to n of its sleepers, when it has any
 * (unguarded: for a step that runs under its own guard). */
ZP_API void zp_signal_word(uint32_t *word, uint32_t *waiters, int32_t n);

/* The sleepers of a sequence word, counted on its waiters word and, for a
 * party whose death another process sees (a stream reader, in its slot),
 * on mine as well (NULL when none): package futex's Note [a dead party's
 * sleepers]. A count adds one to waiters, then to mine (never past 2^32 - 1:
 * a forged count must not wrap round to 0); an uncount takes n
 * from mine (only what it has, when there is a mine), then as many from
 * waiters, never below zero; a take-back takes all of mine from waiters,
 * for a party that died. Unguarded, for a step under its own guard. */
ZP_API void zp_count_sleeper(uint32_t *waiters, uint32_t *mine);
ZP_API void zp_uncount_sleepers(uint32_t *waiters, uint32_t *mine, uint32_t n);
ZP_API void zp_take_back_sleepers(uint32_t *waiters, uint32_t *mine);

/* The same, guarded, for package futex: op ZP_COUNT, ZP_UNCOUNT (n) or
 * ZP_TAKE_BACK (mine not NULL): ZP_OK, ZP_RANGE for a bad op, ZP_FAULT
 * when the memory faulted. */
enum { ZP_COUNT = 0, ZP_UNCOUNT = 1, ZP_TAKE_BACK = 2 };
ZP_API int zp_sleepers(int32_t op, uint32_t *waiters, uint32_t *mine, uint32_t n);

/* Run step(arg) under the fault guard, as every step of queue.c runs:
 * ZP_FAULT, with out->addr, when its memory faulted. */
ZP_API int zp_guarded(int (*step)(void *), void *arg, zp_out *out);

/* -- stream readers (stream.c) ------------------------------------------ */

/* Layout of a stream segment's data region (docs/format.md), the words a
 * reader's steps use; package stream has the rest. */
enum {
    ZP_STREAM_CLAIM = 320,
    ZP_STREAM_PUBLISHED = 328,
    ZP_STREAM_ENDED = 336,
    ZP_STREAM_DATA_SEQ = 384,
    ZP_STREAM_DATA_WAITERS = 388,
    ZP_STREAM_SPACE_SEQ = 448,
    ZP_STREAM_SPACE_WAITERS = 452,
    ZP_STREAM_WANTED = 456,
    ZP_STREAM_DROPPED = 512,
    ZP_STREAM_READERS_AT = 576, /* the table of readers: ZP_READER_SIZE bytes each */
    ZP_READER_SIZE = 64,
    /* A reader slot's fields, from its start. */
    ZP_READER_WORD = 0,
    ZP_READER_POSITION = 8,
    ZP_READER_SEEN = 32,
    ZP_READER_DROPPED = 40,
    ZP_READER_RECEIVED = 48,
    ZP_READER_ARMED = 56, /* u32: the reader's sleepers among the data word's (Note [a dead party's sleepers]) */
};

/* More results, of the reader's steps. */
enum {
    ZP_ENDED = 9,    /* look: the stream ended and every frame was read */
    ZP_REJOIN = 10,  /* look: the reader's slot word changed (evicted, or taken over): Go rejoins */
    ZP_NO_FRAME = 11, /* increment: no frame looked at */
};

/* A reader of a stream as this process holds it: package stream's Reader
 * keeps it in C memory, so that the C ABI's calls run its steps too. Its
 * calls are one at a time: whoever runs a step holds busy (zp_enter). */
typedef struct zp_reader {
    uint8_t *data;     /* the stream's data region */
    uint8_t *slot;     /* this reader's slot in the table of readers */
    uint64_t frames;   /* slots in the ring */
    uint64_t table;    /* where the slot table starts in data */
    uint64_t word;     /* the slot's word while this reader holds it */
    uint64_t pos;      /* the next frame to read */
    int32_t looking;   /* look gave frame pos, and increment has not passed it */
    int32_t at;        /* its slot, while looking */
    int32_t busy;      /* a call runs on the reader (ZP_BUSY_HELD), one of Go's waits for it (ZP_BUSY_WANTED) */
} zp_reader;

/* Take a reader or a writer for one call by its busy word (1), or find it
 * taken, or wanted by a call of Go's (0); let it go. Note [a call of Go's
 * waits for the busy word] in stream.c. */
enum { ZP_BUSY_HELD = 1, ZP_BUSY_WANTED = 2 };
ZP_API int zp_enter(int32_t *busy);
ZP_API void zp_leave(int32_t *busy);

/* Look at the next frame without waiting: ZP_OK with its slot; ZP_WAIT
 * with out->seen, the data word to sleep on; ZP_ENDED; ZP_REJOIN; ZP_CORRUPT
 * with out->need the slot the table gave; ZP_FAULT. */
ZP_API int zp_read_look(zp_reader *r, int32_t *slot, zp_out *out);

/* Let go of the frame looked at: ZP_OK with *whole, whether the writer
 * left its slot alone meanwhile; ZP_NO_FRAME; ZP_FAULT. */
ZP_API int zp_read_increment(zp_reader *r, int32_t *whole, zp_out *out);

/* Count a sleeper on the stream's data word, which every publish bumps,
 * and give the word and its value to sleep on; take n sleepers back. They
 * touch the stream's words only, and so need no turn of the reader's.
 * ZP_OK or ZP_FAULT. */
ZP_API int zp_read_arm(const zp_reader *r, uint32_t **word, uint32_t *seen, zp_out *out);
ZP_API int zp_read_disarm(const zp_reader *r, uint32_t n, zp_out *out);

/* -- the stream's writer (stream.c) -------------------------------------- */

/* What a writer's ZP_CORRUPT met. */
enum {
    ZP_BAD_SLOT = 1,    /* the table says frame out->filled lives in slot out->need, past the ring */
    ZP_NO_FREE_SLOT = 2, /* no slot is free with out->filled frames in flight */
    ZP_MOVED_SLOT = 3,   /* the table says frame out->filled lives in slot out->need, where this writer
                            put it in slot out->need_views (one slot twice, or a slot moved) */
};

/* The writer of a stream as this process holds it: package stream's Writer
 * keeps it in C memory, as a reader's. Under Block the slots that no frame
 * in flight holds are free: the warm ones, at most warm_slots, released
 * most recently, oldest first (a ring of frames entries from warm_head);
 * and the cold ones (a stack of up to frames entries), which the writer
 * takes while fewer than warm_slots are warm. freed is the position below
 * which every frame's slot was put back. given is the slot the writer gave
 * each frame from freed on, by its position mod frames: the slots it takes
 * back are those, never what the shared table says (Note [the slots a
 * writer takes back] in stream.c). */
typedef struct zp_writer {
    uint8_t *data;       /* the stream's data region */
    uint64_t frames;     /* slots in the ring */
    uint64_t table;      /* where the slot table starts in data */
    uint32_t readers;    /* reader slots */
    int32_t block;       /* the policy is Block */
    int32_t refresh;     /* read the readers on every claim (a ring larger than the warm slots) */
    uint32_t warm_slots; /* how many free slots to keep warm */
    int32_t busy;        /* a call runs on the writer, one of Go's waits for it: as a reader's */
    int32_t claimed;     /* a frame is claimed and not yet published */
    int32_t slot;        /* the slot of the frame claimed */
    uint32_t warm_head;
    uint32_t warm_n;
    uint32_t cold_n;
    uint64_t next;       /* the position of the next frame to claim */
    uint64_t min_pos;    /* the slowest reader's position when last read */
    uint64_t freed;
    int64_t reader_timeout; /* ns a live reader may go unseen before it is evicted; 0: for ever */
    int32_t *warm;       /* frames entries each */
    int32_t *cold;
    int32_t *given;
} zp_writer;

/* Claim the next frame without waiting: ZP_OK with its slot (the same
 * again until zp_write_increment); ZP_WAIT when a live reader still holds
 * it (the caller waits for room, evicting the readers that died, then
 * calls again); ZP_ENDED; ZP_CORRUPT with out->what a ZP_BAD_SLOT,
 * ZP_NO_FREE_SLOT or ZP_MOVED_SLOT; ZP_FAULT. */
ZP_API int zp_write_look(zp_writer *w, int32_t *slot, zp_out *out);

/* Publish the frame claimed: ZP_OK, ZP_NO_FRAME, ZP_FAULT. */
ZP_API int zp_write_increment(zp_writer *w, zp_out *out);

/* Read the live readers' positions: the lowest, or the next frame when
 * none is live, into w->min_pos and *low. ZP_OK or ZP_FAULT. */
ZP_API int zp_write_slowest(zp_writer *w, uint64_t *low, zp_out *out);

/* Whether a wait for room may evict a reader now, by what the data plane
 * tells: *suspect is 1 when a reader that holds the writer back (active,
 * below the position the next claim needs) has no process, is a zombie, or
 * was not seen for longer than reader_timeout by the wall clock now_ns; 0
 * when none is. ZP_OK or ZP_FAULT. A reader whose pid another process took
 * is the caller's to find (package proc, by start time): Note [a writer's
 * look for the dead] in stream.c. */
ZP_API int zp_write_suspects(zp_writer *w, int64_t now_ns, int32_t *suspect, zp_out *out);

/* -- descriptors (descriptor.c) ------------------------------------------ */

/* Layout of a queue record's descriptor (docs/format.md, "Descriptors"). */
#define ZP_DESC_BASE 32u   /* the fixed part; shape, strides and the name follow */
#define ZP_TICKET_BASE 24u /* a ticket block before its arena's name */
#define ZP_DESC_TICKET 8u  /* flags bit 3: a ticket block follows the name */
#define ZP_MAX_NAME 255u
#define ZP_REF_SEGMENT 1   /* kinds: the data region of a tensor segment */
#define ZP_REF_SLOT 2      /* a slot of a pool arena */

/* What a descriptor breaks (zp_desc_read, zp_desc_check), in the order they
 * are checked; package message words each as it always has. */
enum {
    ZP_BAD_DESC_TRUNCATED = 1,   /* fewer than ZP_DESC_BASE bytes */
    ZP_BAD_DESC_TICKET_CUT = 2,  /* flags bit 3, and its size or the bytes leave no room for a ticket block */
    ZP_BAD_DESC_TICKET_SIZE = 3, /* a ticket arena name of 0 bytes, or a size that is not the ticket's end */
    ZP_BAD_DESC_SIZE = 4,        /* ndim past ZP_MAX_NDIM, a size that is not what ndim and the name make,
                                    or a size past the bytes there are */
    ZP_BAD_DESC_KIND = 5,        /* neither ZP_REF_SEGMENT nor ZP_REF_SLOT */
    ZP_BAD_DESC_FLAGS = 6,       /* a flag past bit 2 */
    ZP_BAD_DESC_NDIM = 7,        /* ndim past ZP_MAX_NDIM (zp_desc_check) */
    ZP_BAD_DESC_NAME = 8,        /* a name of 0 bytes or past ZP_MAX_NAME */
    ZP_BAD_DESC_TICKET = 9,      /* a ticket arena name past ZP_MAX_NAME, or a ticket whose nonce is 0 */
    ZP_BAD_DESC_DTYPE = 10,      /* a code zp_dtype_sizes does not know */
    ZP_BAD_DESC_NEGATIVE = 11,   /* a negative dimension or stride */
    ZP_BAD_DESC_OVERFLOW = 12,   /* the bytes the shape makes pass 2^63 - 1 */
    ZP_BAD_DESC_EXTENT = 13,     /* the array reaches past nbytes, or offset + nbytes wraps */
};

/* A descriptor decoded: its fields, and where its names lie in the bytes
 * it was read from (offsets, not pointers: Go reads into its own memory,
 * where C must not store a pointer to Go memory). package plane's Desc is
 * laid out the same, which plane/descriptor.go checks when it compiles. */
typedef struct zp_desc {
    uint8_t kind;
    uint8_t flags;      /* bits 0-2; bit 3 never: arena_len says whether there is a ticket */
    uint16_t dtype;
    uint32_t ndim;
    uint32_t size;      /* read: its encoded size, as its first u16 says */
    uint32_t name_at;   /* read: where its name starts in the bytes read */
    uint32_t name_len;
    uint32_t arena_at;  /* read: where its ticket arena's name starts */
    uint32_t arena_len; /* 0: no ticket */
    uint32_t slot;
    uint32_t generation;
    uint32_t ticket_slot;
    uint32_t ticket_generation;
    uint32_t reserved;
    uint64_t offset;
    uint64_t nbytes;
    uint64_t nonce;     /* the ticket's, never 0 when it has one */
    int64_t shape[ZP_MAX_NDIM];
    int64_t strides[ZP_MAX_NDIM]; /* bytes */
} zp_desc;

/* The bytes an array of this shape and element size makes, 0 when a
 * dimension is 0, into *n: 1, or 0 when the product of the nonzero
 * dimensions and itemsize passes 2^63 - 1 (package header's ByteCount, likewise). */
ZP_API int zp_byte_count(uint32_t ndim, const int64_t *shape, uint64_t itemsize, uint64_t *n);

/* One past the last byte an array with this shape and non-negative byte
 * strides touches, 0 when it has no elements, into *end: 1, or 0 when that
 * passes 2^63 - 1 (package header's Extent, which a test holds it to). */
ZP_API int zp_extent(uint32_t ndim, const int64_t *shape, const int64_t *strides, uint64_t itemsize, uint64_t *end);

/* The encoded size of a descriptor of ndim dimensions, a name of name_len
 * bytes and a ticket arena's of arena_len (0: no ticket); a multiple of 8. */
ZP_API uint64_t zp_desc_size(uint64_t ndim, uint64_t name_len, uint64_t arena_len);

/* Check a descriptor's fields: ZP_OK, or the ZP_BAD_DESC_* (from KIND on)
 * it breaks. */
ZP_API int zp_desc_check(const zp_desc *d);

/* Read and check the descriptor at the start of src (len bytes, a private
 * copy): ZP_OK, or the ZP_BAD_DESC_* it breaks, with the fields read before
 * that in *out. Its size is out->size. */
ZP_API int zp_desc_read(const uint8_t *src, uint64_t len, zp_desc *out);

/* Write d, which checks, with its name (d->name_len bytes) and its ticket
 * arena's (d->arena_len), into dst (cap bytes) and return its size; 0, and
 * nothing written, when its dimensions or names do not fit the format or
 * it does not fit in cap. name_at and arena_at are not read. */
ZP_API uint32_t zp_desc_write(uint8_t *dst, uint64_t cap, const zp_desc *d, const uint8_t *name, const uint8_t *arena);

/* -- end of descriptors -------------------------------------------------- */

/* The views a record of type typ and ndesc descriptors gives its taker. */
static inline int32_t zp_views(uint8_t typ, uint16_t ndesc) { return typ == ZP_TYPE_INLINE ? ndesc + 1 : ndesc; }

/* -- pool arenas (pool.c) ------------------------------------------------ */

/* Layout of an arena's data region (docs/format.md, "Pool arenas"), the
 * words the slot protocol uses; package pool has the rest. */
enum {
    ZP_ARENA_FREE_HEAD = 64,   /* u64: tag << 32 | (index + 1) of the first free slot */
    ZP_ARENA_FREE_SEQ = 128,   /* u32 futex word, bumped on every free */
    ZP_ARENA_WAITERS = 132,    /* u32 owners waiting for a free slot */
    ZP_ARENA_FREE_COUNT = 136, /* i64 slots on the free stack */
    ZP_ARENA_SLOT_TABLE = 192, /* nslots entries of ZP_SLOT_META bytes */
    ZP_SLOT_META = 16,         /* i64 refcount, u32 next free (index + 1, 0 for none), u32 generation */
};

/* More results, of the slot protocol's steps; numbered apart from the
 * results above, which other steps extend. */
enum {
    ZP_POOL_STALE = 32, /* the slot is free, or of another generation: no count was added, or taken */
    ZP_POOL_MOVED = 33, /* add ref: the slot was handed out again meanwhile; the count landed on the
                           generation given, and is the caller's to give back */
    ZP_POOL_TAKEN = 34, /* ticket take: the word did not hold the nonce (taken, or never armed) */
};

/* Each step below reports ZP_FAULT, with out->addr, when the arena's memory
 * faulted, and ZP_RANGE for a slot past nslots (a ticket's: or slots of
 * fewer than 8 bytes), touching nothing. */

/* Take the slot on top of the free stack: ZP_OK with *slot, ZP_WAIT when
 * the stack is empty (or its head is garbage). */
ZP_API int zp_pool_pop(const zp_arena *a, uint32_t *slot, zp_out *out);

/* Put slot back on the free stack, bump the free word and wake every owner
 * waiting on it. */
ZP_API int zp_pool_push(const zp_arena *a, uint32_t slot, zp_out *out);

/* Hand out a slot just popped: its generation bumped (the new one in *gen)
 * and a count of one. */
ZP_API int zp_pool_hand_out(const zp_arena *a, uint32_t slot, uint32_t *gen, zp_out *out);

/* Add a count to slot, in use and of generation gen: ZP_OK (*landed is
 * gen); ZP_POOL_STALE, nothing added; ZP_POOL_MOVED, the count landed on
 * generation *landed, which the slot was handed out as meanwhile: the
 * caller gives it back (zp_pool_release), as any of its holders would. */
ZP_API int zp_pool_add_ref(const zp_arena *a, uint32_t slot, uint32_t gen, uint32_t *landed, zp_out *out);

/* Give back a count on slot: ZP_OK, with *last 1 when it was the last,
 * and the slot was pushed back on the free stack (the caller then unpins
 * the arena: its segment's own count); ZP_POOL_STALE when the count was
 * zero already. */
ZP_API int zp_pool_release(const zp_arena *a, uint32_t slot, uint32_t *last, zp_out *out);

/* A descriptor's check of the slot it names: ZP_OK when it is in use and of
 * generation gen, ZP_POOL_STALE when not, ZP_CORRUPT for a slot past nslots. */
ZP_API int zp_pool_check(const zp_arena *a, uint32_t slot, uint32_t gen, zp_out *out);

/* A ticket (package pool, Note [a count is taken once]): arm stores the
 * nonce in the first word of slot; take moves it from nonce to zero, once:
 * ZP_OK for the one that wins, ZP_POOL_TAKEN for every other. */
ZP_API int zp_ticket_arm(const zp_arena *a, uint32_t slot, uint64_t nonce, zp_out *out);
ZP_API int zp_ticket_take(const zp_arena *a, uint32_t slot, uint64_t nonce, zp_out *out);

/* -- a hand-off's sequences (pool.c, Note [a hand-off's steps in one call]) --
 * Each runs several of the steps above in a row, under one guard, for a
 * caller that pays per call (Go, through cgo); the C ABI's handoff.c runs
 * the same ones. pins is the count of the arena's segment, which every slot
 * in use holds one of: a step pins while it is above 0, and unpins while it
 * is above 1; the last is the caller's to give up (it removes the arena). */

enum {
    ZP_POOL_REFUSED = 35,  /* adopt: a check failed or the ticket was taken: nothing changed, and the
                              caller's step-by-step path says why */
    ZP_POOL_UNPINNED = 36, /* take: the slot was handed out (*slot, *gen) but its arena's count is 0:
                              the caller pins it, or gives the slot back, as it says */
    ZP_POOL_RESERVE = 37,  /* take: the slot popped (*slot) reaches past reserved_to: the caller
                              reserves its pages and hands it out itself */
};

/* Take a slot: pop, hand out (a new generation, a count of one), pin the
 * arena, and with zero store 0 in the slot's first word (a ticket not yet
 * armed). ZP_OK; ZP_WAIT, the stack empty; ZP_POOL_RESERVE; ZP_POOL_UNPINNED;
 * ZP_FAULT (*slot UINT32_MAX: before the pop). */
ZP_API int zp_pool_take(const zp_arena *a, int64_t *pins, uint64_t reserved_to, int32_t zero, uint32_t *slot,
                        uint32_t *gen, zp_out *out);

/* Give back a count on slot, its ledger entry (in l, -1: none) dropped
 * first; when it was the slot's last, the slot goes back on the free stack
 * and its pin is given back, or *unpin says the caller gives it up. ZP_OK,
 * ZP_POOL_STALE (the count was zero already), ZP_RANGE, ZP_FAULT. */
ZP_API int zp_slot_release(const zp_arena *a, int64_t *pins, uint32_t slot, zp_ledger *l, int32_t entry,
                           int32_t *unpin, zp_out *out);

/* Add a count to slot for generation *gen (current: the one it has now,
 * read into *gen) and record it in ledger l (NULL: none) under the arena's
 * name: ZP_OK with *entry (ZP_LEDGER_NONE or ZP_LEDGER_FAULTED: unrecorded;
 * ZP_LEDGER_FULL: the caller grows the ledger and records it); ZP_POOL_STALE; ZP_POOL_MOVED with *gen the
 * generation the count landed on, unrecorded, for the caller to give back;
 * ZP_RANGE; ZP_FAULT. */
ZP_API int zp_slot_ref(const zp_arena *a, uint32_t slot, int32_t current, uint32_t *gen, zp_ledger *l,
                       const uint8_t *name, uint32_t len, int32_t *entry, zp_out *out);

/* Send a count: drop its ledger entry (-1: none), then arm its ticket,
 * slot tslot of ticket arena t, with nonce. ZP_OK, ZP_RANGE, ZP_FAULT. */
ZP_API int zp_slot_send(zp_ledger *l, int32_t entry, const zp_arena *t, uint32_t tslot, uint64_t nonce, zp_out *out);

/* The steps of a send (zp_send), unguarded, for a step under its own guard
 * (the put's): whether its ticket is in its arena's slots; a read of its
 * ticket's word, which faults where the arm would, before any count
 * changes hands; the send itself (zp_slot_send's). */
ZP_API int zp_send_ok(const zp_send *s);
ZP_API void zp_send_probe(const zp_send *s);
ZP_API void zp_send_run(const zp_send *s);

/* Steps of zp_slot_adopt. */
enum {
    ZP_ADOPT_DESC = 1,  /* check the descriptor's fields (zp_desc_check) */
    ZP_ADOPT_CHECK = 2, /* check its ticket's slot and generation, and its buffer's and bounds */
    ZP_ADOPT_TAKE = 4,  /* take its ticket, give back the ticket slot's count, record the buffer's */
};

/* What zp_slot_adopt did besides its result. */
typedef struct zp_adopted {
    int32_t entry; /* the buffer count's ledger entry, or as zp_slot_ref's */
    int32_t taken; /* the ticket was taken: a ZP_FAULT or ZP_POOL_STALE came after it */
    int32_t unpin; /* the ticket slot's pin on its arena is the caller's to give up */
} zp_adopted;

/* Adopt the count descriptor d carries: its ticket in arena t (whose
 * segment's count is tpins), its buffer in arena b (NULL: a ticket alone),
 * recorded in ledger l under name. ZP_OK; ZP_POOL_REFUSED, nothing changed;
 * after the take, ZP_POOL_STALE (the ticket slot's count was zero) or
 * ZP_FAULT, with res->taken. */
ZP_API int zp_slot_adopt(const zp_arena *t, int64_t *tpins, const zp_arena *b, const zp_desc *d, int32_t steps,
                         zp_ledger *l, const uint8_t *name, uint32_t len, zp_adopted *res, zp_out *out);

/* For tests: the next zp_pool_add_ref of the count at rc waits between its
 * check and its exchange (parked says it does) until resume, so that a test
 * may free the slot and hand it out again there (package pool's Note [a
 * count for one generation]). A load of a global when not used. */
ZP_API void zp_pool_park_add_ref(int64_t *rc);
ZP_API int zp_pool_add_ref_parked(void);
ZP_API void zp_pool_resume_add_ref(void);
/* -- the arenas this process maps (arenas.c) ----------------------------- */


/* An arena found by name: its layout, the count of its segment (which a
 * slot in use holds one of), and its name as the table keeps it. */
typedef struct zp_found_arena {
    const zp_arena *arena;
    int64_t *pins;
    const uint8_t *name;
    uint32_t len;
} zp_found_arena;

/* Add arena a, mapped under name (tickets: an arena of tickets), once
 * mapped: ZP_OK, ZP_BUSY when the table has no room (the arena is then
 * Go's alone), ZP_RANGE for a bad name. Remove it, before it is unmapped:
 * waits until no call holds it. */
ZP_API int zp_arenas_add(const uint8_t *name, uint32_t len, const zp_arena *a, int32_t tickets, int32_t owned,
                         int64_t *pins);
ZP_API void zp_arenas_remove(const zp_arena *a);
/* Arena a is this process's own no more (its pool let it go): no slot is
 * handed out of it here. */
ZP_API void zp_arenas_disown(const zp_arena *a);

/* Find the arena of tickets (or of buffers) named name, and hold it (it
 * stays mapped until zp_arenas_release): where it is held, or -1 when
 * this process does not map it (or not as an arena of that purpose). A
 * holder may hold it once more (zp_arenas_hold), for another release. */
ZP_API int32_t zp_arenas_acquire(const uint8_t *name, uint32_t len, int32_t tickets, zp_found_arena *found);
ZP_API int32_t zp_arenas_hold(int32_t at);
ZP_API void zp_arenas_release(int32_t at);

/* Find the buffer slot that holds the n bytes at addr, wholly, in an arena
 * this process maps, and hold its arena: where it is held (for
 * zp_arenas_release), with the slot and addr's offset in it; -1 when none
 * does (package pool's lookup). */
ZP_API int32_t zp_arenas_find(const void *addr, uint64_t n, zp_found_arena *found, uint32_t *slot, uint64_t *off);

/* The next of this process's own ticket arenas in the table after entry
 * after (-1: the first), held: where, or -1 when there is none. */
ZP_API int32_t zp_arenas_own_tickets(int32_t after, zp_found_arena *found);
/* Entry at, held, when it is one of this process's own ticket arenas: at,
 * else -1. */
ZP_API int32_t zp_arenas_own_tickets_at(int32_t at, zp_found_arena *found);

/* -- the ledger (ledger.c) ----------------------------------------------- */

/* Layout of a ledger's data region and of its entries (docs/format.md);
 * package ledger has the rest. */
enum {
    ZP_LEDGER_ENTRIES_AT = 64,
    ZP_LEDGER_ENTRY_SIZE = 512,
    ZP_LEDGER_NAME_CAP = 240,
    ZP_LEDGER_MAX_ENTRIES = 1 << 16,
    ZP_LEDGER_E_STATE = 0,
    ZP_LEDGER_E_INDEX = 4,
    ZP_LEDGER_E_GEN = 8,
    ZP_LEDGER_E_NAME_LEN = 12,
    ZP_LEDGER_E_FINAL_LEN = 13,
    ZP_LEDGER_E_DEV = 16,
    ZP_LEDGER_E_INO = 24,
    ZP_LEDGER_E_NAME = 32,
    ZP_LEDGER_E_FINAL = 32 + 240,
    /* Entry states. */
    ZP_LEDGER_FREE = 0,
    ZP_LEDGER_CREATING = 1,
    ZP_LEDGER_SEGMENT = 2,
    ZP_LEDGER_SLOT = 3,
    /* What zp_ledger_record returns when it records nothing. */
    ZP_LEDGER_FULL = -1,    /* no entry free: the owner grows the ledger, or the count goes unrecorded */
    ZP_LEDGER_FAULTED = -2, /* the ledger's memory faulted (its file was shrunk) */
    ZP_LEDGER_NONE = -3,    /* a sequence's (pool.c): no ledger, or a name it cannot hold: unrecorded */
};

/* A process's own ledger: its data region (mapped for as long as the
 * process lives) and which of its entries are free. */
struct zp_ledger {
    uint8_t *data;
    uint32_t capacity; /* entries reserved */
    uint32_t nfree;
    int32_t *free;     /* ZP_LEDGER_MAX_ENTRIES of room; the top is taken next */
    uint8_t *taken;    /* ZP_LEDGER_MAX_ENTRIES flags: 1 while an entry is its taker's */
    int32_t lock;      /* a spin lock over free and nfree */
};

/* Make the ledger of data, whose first capacity entries are reserved (NULL
 * when out of memory); it is never freed, since a release racing with the
 * ledger's close may still drop an entry. grow frees the entries up to
 * capacity, once reserved. */
ZP_API zp_ledger *zp_ledger_new(uint8_t *data, uint32_t capacity);
ZP_API void zp_ledger_grow(zp_ledger *l, uint32_t capacity);
/* How many entries are free now. */
ZP_API uint32_t zp_ledger_free(zp_ledger *l);
/* Point the ledger at data, a new ledger file's data region (the old one
 * stays mapped), keeping which entries are taken: a count recorded before
 * drops its entry number in the same ledger; how many entries it has. */
ZP_API void zp_ledger_move(zp_ledger *l, uint8_t *data);
ZP_API uint32_t zp_ledger_capacity(zp_ledger *l);

/* The ledger of this process's counts, or NULL when they are not recorded
 * (package ledger's Current, which sets it). */
ZP_API void zp_ledger_set_current(zp_ledger *l);
ZP_API zp_ledger *zp_ledger_current(void);

/* Record one count in a free entry, its fields then its state: the entry's
 * number, or ZP_LEDGER_FULL or ZP_LEDGER_FAULTED. name and final (a
 * Creating entry's final name) hold at most ZP_LEDGER_NAME_CAP bytes. */
ZP_API int32_t zp_ledger_record(zp_ledger *l, uint32_t state, const uint8_t *name, uint32_t name_len,
                                const uint8_t *final, uint32_t final_len, uint32_t index, uint32_t gen);

/* Clear entry n, which the caller recorded, and free it; say where a
 * Creating entry's file was made; turn a Creating entry into a Segment
 * entry of its final name. ZP_OK, ZP_RANGE for no entry (drop: none that
 * is taken, which it leaves as it is), ZP_FAULT. */
ZP_API int zp_ledger_drop(zp_ledger *l, int32_t n);
ZP_API int zp_ledger_opened(zp_ledger *l, int32_t n, uint64_t dev, uint64_t ino);
ZP_API int zp_ledger_created(zp_ledger *l, int32_t n);

#endif
