// A hand-off without entering Go (Note [a data plane the runtime never
// enters] in package plane): zct_queue_put_array of an array in a pool
// slot, zct_queue_take's adoption of a record whose descriptors all name
// slots of pool arenas this process maps, and the release of the refs it
// makes. They run the steps package buffer runs for each descriptor
// (buffer.Find, Describe and Send on the way out; buffer.Adopt on the way
// in; Note [one hand-over] in package handover), written once in the data
// plane as the sequences Go's packages run too (Note [a hand-off's steps in
// one call] in its pool.c): a count added and recorded (zp_slot_ref), a
// ticket taken out of an arena (zp_pool_take), a count's entry dropped and
// its ticket armed by the put of its record (zp_send), a descriptor's
// checks and its ticket taken (zp_slot_adopt), a count given back
// (zp_slot_release). Whatever they
// cannot finish here goes to Go, whole: another kind of memory or
// descriptor, an arena this process has not listed, a full table of refs
// or queue, a release that unpins an arena's last count.
//
// Note [a ref made outside Go]: the refs made here are light: a slot's
// arena, index, generation and ledger entry in a table of this file, under
// a handle with the top bit set, which Go's handles never have. A release
// runs here; any other call that names one (zct_ref_holders, a put of it
// again, an encode) finds it missing from Go's table and has Go take it
// over (zct_light_ref_claim): the same count, the same ledger entry, under
// the same handle, as Go's own ref thereafter.
//
// Threat model: the records come from a ring any process of the user may
// write. A record is read from this process's own copy; it is adopted
// here only when every check package buffer makes passes, and any doubt
// leaves it to Go, which says what is wrong. A count is taken only by
// winning its ticket (Note [a count is taken once] in package pool).
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "_cgo_export.h"
#include "internal.h"
#include "plane.h"

// The getrandom system call (Linux 3.17), which the C library headers of
// the oldest glibc the wheels target (2.17) do not name.
#ifndef SYS_getrandom
#if defined(__x86_64__)
#define SYS_getrandom 318
#elif defined(__aarch64__)
#define SYS_getrandom 278
#endif
#endif

#define SEQ __ATOMIC_SEQ_CST
#define REFS 4096      // light refs at once; past that, takes go through Go
#define REF_PROBE 64
#define MAX_DESC 16    // descriptors adopted here in one record; more go to Go
#define LIGHT (1ull << 63)

typedef struct light_ref {
    uint64_t handle; // 0: free; UINT64_MAX: being filled or released
    uint64_t next;   // the handle it gets once filled
    const zp_arena *arena;
    int64_t *pins;
    uint32_t slot, gen;
    int32_t entry;   // in the ledger, or -1
} light_ref;

static light_ref refs[REFS];
static uint64_t next_light;

static uint32_t ref_hash(uint64_t h) { return (uint32_t)((h * 0x9E3779B97F4A7C15ull) >> 52); }

// reserve claims a free entry of the table for a handle to come: its index,
// or -1.
static int32_t reserve(void) {
    uint64_t h = (__atomic_add_fetch(&next_light, 1, SEQ) | LIGHT);
    for (uint32_t i = 0; i < REF_PROBE; i++) {
        int32_t at = (int32_t)((ref_hash(h) + i) % REFS);
        uint64_t free = 0;
        if (__atomic_compare_exchange_n(&refs[at].handle, &free, UINT64_MAX, 0, SEQ, SEQ)) {
            refs[at].next = h;
            return at;
        }
    }
    return -1;
}

static void unreserve(int32_t at) { __atomic_store_n(&refs[at].handle, 0, SEQ); }

// publish fills reserved entry at and returns its handle.
static uint64_t publish(int32_t at, const zp_arena *a, int64_t *pins, uint32_t slot, uint32_t gen, int32_t entry) {
    light_ref *r = &refs[at];
    uint64_t h = r->next;
    r->arena = a;
    r->pins = pins;
    r->slot = slot;
    r->gen = gen;
    r->entry = entry;
    __atomic_store_n(&r->handle, h, SEQ);
    return h;
}

// take_light removes the light ref h from the table into *out: 1, or 0
// when h names none.
static int take_light(uint64_t h, light_ref *out) {
    if ((h & LIGHT) == 0 || h == UINT64_MAX) {
        return 0;
    }
    uint32_t first = ref_hash(h);
    for (uint32_t i = 0; i < REF_PROBE; i++) {
        light_ref *r = &refs[(first + i) % REFS];
        uint64_t want = h;
        if (__atomic_load_n(&r->handle, SEQ) != h ||
            !__atomic_compare_exchange_n(&r->handle, &want, UINT64_MAX, 0, SEQ, SEQ)) {
            continue;
        }
        *out = *r;
        __atomic_store_n(&r->handle, 0, SEQ);
        return 1;
    }
    return 0;
}

// give_back gives up one count on slot of a, and its ledger entry in l
// (-1: none) first, in one step of the plane (zp_slot_release): ZCT_OK, or
// a status. The pin on the arena that the slot's last count held is given
// back there while others hold the arena, and in Go when it may be the
// last (its segment goes then).
static int give_back(const zp_arena *a, int64_t *pins, uint32_t slot, zp_ledger *l, int32_t entry) {
    zp_out out = {0};
    int32_t unpin = 0;
    int r = zp_slot_release(a, pins, slot, l, entry, &unpin, &out);
    if (r == ZP_FAULT) {
        return zct_faulted();
    }
    if (r != ZP_OK) {
        char msg[96];
        int n = snprintf(msg, sizeof msg, "slot %u released more often than held: stale", slot);
        zct_set_last_error(msg, n > 0 ? (size_t)n : 0, 0);
        return ZCT_E_CORRUPT;
    }
    return unpin ? zctipc_go_arena_unpin((void *)a) : ZCT_OK;
}

// release_light gives up a light ref's count, its ledger entry first
// (package ledger, Note [never give up what was not taken]).
static int release_light(const light_ref *r) {
    return give_back(r->arena, r->pins, r->slot, zp_ledger_current(), r->entry);
}

int zct_ref_release(zct_handle ref) {
    light_ref r;
    if (take_light(ref, &r)) {
        return release_light(&r);
    }
    return zctipc_go_ref_release(ref);
}

ZCT_HIDDEN uint64_t zct_light_ref_any(void) {
    for (uint32_t i = 0; i < REFS; i++) {
        uint64_t h = __atomic_load_n(&refs[i].handle, SEQ);
        if (h != 0 && h != UINT64_MAX) {
            return h;
        }
    }
    return 0;
}

ZCT_HIDDEN int zct_light_ref_claim(uint64_t h, void **arena, uint32_t *slot, uint32_t *gen, int32_t *entry) {
    light_ref r;
    if (!take_light(h, &r)) {
        return 0;
    }
    *arena = (void *)r.arena;
    *slot = r.slot;
    *gen = r.gen;
    *entry = r.entry;
    return 1;
}

// -- adopting a record -------------------------------------------------------

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

// One descriptor of the record, as it is adopted.
typedef struct adopting {
    zp_desc d;
    zp_found_arena buffers, tickets;
    int32_t held_buffers, held_tickets; // where the arenas are held, or -1
    int32_t ref;                         // the entry of the ref reserved for it
} adopting;

static void let_go(adopting *a, int32_t n) {
    for (int32_t j = 0; j < n; j++) {
        zp_arenas_release(a[j].held_buffers);
        zp_arenas_release(a[j].held_tickets);
        if (a[j].ref >= 0) {
            unreserve(a[j].ref);
        }
    }
}

// refused is the status of a record whose descriptor j's ticket another
// taker won, said as package buffer says it; the counts taken before j
// were given back and those after it given up.
static int64_t refused(const uint8_t *rec, const adopting *a) {
    char msg[700];
    int n = snprintf(msg, sizeof msg,
                     "descriptor of \"%.*s\": ticket %u of arena \"%.*s\": descriptor was already taken: its count "
                     "belongs to whoever received it first",
                     (int)a->d.name_len, (const char *)rec + a->d.name_at, a->d.ticket_slot, (int)a->d.arena_len,
                     (const char *)rec + a->d.arena_at);
    zct_set_last_error(msg, n > 0 ? (size_t)n : 0, 0);
    return ZCT_E_TAKEN;
}

// prepared reads descriptor a->d of rec at *at and finds what adopting it here
// needs: 1, or 0 when Go is to adopt the record.
static int prepared(const uint8_t *rec, uint32_t size, uint32_t *at, adopting *a) {
    a->held_buffers = a->held_tickets = a->ref = -1;
    if (zp_desc_read(rec + *at, size - *at, &a->d) != ZP_OK || a->d.kind != ZP_REF_SLOT || a->d.arena_len == 0) {
        return 0;
    }
    a->d.name_at += *at;
    a->d.arena_at += *at;
    *at += a->d.size;
    a->held_buffers = zp_arenas_acquire(rec + a->d.name_at, a->d.name_len, 0, &a->buffers);
    a->held_tickets = zp_arenas_acquire(rec + a->d.arena_at, a->d.arena_len, 1, &a->tickets);
    if (a->held_buffers < 0 || a->held_tickets < 0) {
        return 0;
    }
    // The checks of pool.TakeTicket, pool.Adopt and buffer.Adopt's bytes
    // (zp_slot_adopt's), before any count changes hands: a descriptor that
    // fails one is Go's to refuse, and to say why.
    zp_out out = {0};
    zp_adopted res;
    if (zp_slot_adopt(a->tickets.arena, a->tickets.pins, a->buffers.arena, &a->d, ZP_ADOPT_CHECK, NULL, NULL, 0, &res,
                      &out) != ZP_OK) {
        return 0;
    }
    a->ref = reserve();
    return a->ref >= 0;
}

// recorded turns the entry a step of the plane gave the count on slot of
// a into one of ledger l (-1: none): when l was full, Go grows it and it is
// recorded here, as package ledger records one.
static int32_t recorded(zp_ledger *l, int32_t e, const zp_found_arena *a, uint32_t slot, uint32_t gen) {
    while (e == ZP_LEDGER_FULL && zctipc_go_ledger_grow() == ZCT_OK) {
        e = zp_ledger_record(l, ZP_LEDGER_SLOT, a->name, a->len, NULL, 0, slot, gen);
    }
    return e < 0 ? -1 : e;
}

// take adopts descriptor a's count (its ticket taken, the ticket's slot
// given back, the count recorded in l: zp_slot_adopt), its checks passed:
// ZP_OK with *entry, ZP_POOL_TAKEN, or a status (a negative ZCT_E_*).
static int take(const adopting *a, zp_ledger *l, int32_t *entry) {
    zp_out out = {0};
    zp_adopted res;
    int r = zp_slot_adopt(a->tickets.arena, a->tickets.pins, a->buffers.arena, &a->d, ZP_ADOPT_TAKE, l,
                          a->buffers.name, a->buffers.len, &res, &out);
    if (!res.taken) {
        return r == ZP_FAULT ? zct_faulted() : ZP_POOL_TAKEN;
    }
    if (r == ZP_FAULT) {
        return zct_faulted();
    }
    if (r != ZP_OK) {
        char msg[96];
        int n = snprintf(msg, sizeof msg, "slot %u released more often than held: stale", a->d.ticket_slot);
        zct_set_last_error(msg, n > 0 ? (size_t)n : 0, 0);
        return ZCT_E_CORRUPT;
    }
    *entry = recorded(l, res.entry, &a->buffers, a->d.slot, a->d.generation);
    int u = res.unpin ? zctipc_go_arena_unpin((void *)a->tickets.arena) : ZCT_OK;
    if (u != ZCT_OK && *entry >= 0) {
        zp_ledger_drop(l, *entry); // the count is lost with the status, unrecorded as before
    }
    return u == ZCT_OK ? ZP_OK : u;
}

ZCT_HIDDEN int64_t zct_fast_adopt(uint8_t *rec, uint32_t size, zct_view *views, int32_t views_cap, int32_t *nviews) {
    if (size < ZP_RECORD_HEADER) { // zp_get takes none: Go says so
        return zctipc_go_queue_adopt(rec, size, views, views_cap, nviews);
    }
    uint16_t ndesc;
    memcpy(&ndesc, rec + 6, 2);
    uint8_t type = rec[4];
    uint32_t plen = rd32(rec + 8);
    if (rd32(rec) != size || ndesc == 0 || ndesc > MAX_DESC || ndesc > views_cap ||
        (type != ZCT_RECORD_PICKLE && type != ZCT_RECORD_TENSOR) || (type == ZCT_RECORD_TENSOR && (ndesc != 1 || plen != 0))) {
        return zctipc_go_queue_adopt(rec, size, views, views_cap, nviews);
    }
    adopting a[MAX_DESC];
    uint32_t at = ZP_RECORD_HEADER;
    int32_t n = 0;
    int ok = 1;
    while (ok && n < ndesc) {
        ok = prepared(rec, size, &at, &a[n]);
        n++;
    }
    // The payload ends the record (message.Record.Decode's framing).
    if (!ok || plen > size - at || ((at + plen + 7) & ~7u) != size) {
        let_go(a, n);
        return zctipc_go_queue_adopt(rec, size, views, views_cap, nviews);
    }
    zp_ledger *l = zp_ledger_current();
    int32_t entries[MAX_DESC];
    for (int32_t j = 0; j < n; j++) {
        int r = take(&a[j], l, &entries[j]);
        if (r == ZP_OK) {
            continue;
        }
        // The counts taken before the one refused go back, and the rest
        // are given up (Note [one hand-over]): their tickets are taken so
        // that their counts are let go of.
        int64_t status = r == ZP_POOL_TAKEN ? refused(rec, &a[j]) : r;
        for (int32_t k = j + 1; k < n; k++) {
            int32_t none;
            if (take(&a[k], NULL, &none) == ZP_OK) {
                give_back(a[k].buffers.arena, a[k].buffers.pins, a[k].d.slot, NULL, -1);
            }
        }
        for (int32_t k = 0; k < j; k++) {
            give_back(a[k].buffers.arena, a[k].buffers.pins, a[k].d.slot, l, entries[k]);
        }
        let_go(a, n);
        return status;
    }
    for (int32_t j = 0; j < n; j++) {
        adopting *x = &a[j];
        const zp_arena *b = x->buffers.arena;
        int32_t entry = entries[j];
        zct_view *v = &views[j];
        memset(v, 0, sizeof *v);
        v->ref = publish(x->ref, b, x->buffers.pins, x->d.slot, x->d.generation, entry);
        x->ref = -1;
        v->offset = x->d.offset;
        v->data = b->data + b->slots_at + (uint64_t)x->d.slot * b->slot_size + x->d.offset;
        v->nbytes = x->d.nbytes;
        for (uint32_t i = 0; i < x->d.ndim; i++) {
            v->shape[i] = x->d.shape[i];
            v->strides[i] = x->d.strides[i];
        }
        v->dtype = x->d.dtype;
        v->ndim = (int32_t)x->d.ndim;
        v->kind = ZCT_REF_SLOT;
        v->flags = x->d.flags;
    }
    let_go(a, n);
    *nviews = n;
    return (int64_t)((uint64_t)plen | (uint64_t)at << ZCT_TAKE_OFFSET_SHIFT | (uint64_t)type << ZCT_TAKE_TYPE_SHIFT);
}

// -- sending an array ------------------------------------------------------

// take_ticket pops a ticket slot out of the held arena t, hands it out,
// pins it and zeroes its word in one step of the plane (zp_pool_take), as
// package pool's take does: 1 once taken, 0 when the arena has none free,
// -1 when it faulted (the file is gone, and the slot with it).
static int take_ticket(zp_found_arena *t, uint32_t *slot, uint32_t *gen) {
    zp_out out = {0};
    int r = zp_pool_take(t->arena, t->pins, UINT64_MAX, 1, slot, gen, &out);
    if (r == ZP_WAIT || (r == ZP_FAULT && *slot == UINT32_MAX)) {
        return 0;
    }
    if (r == ZP_POOL_UNPINNED) {
        uint32_t last;
        zp_pool_release(t->arena, *slot, &last, &out); // the slot goes back; no pin to give
    }
    return r == ZP_OK ? 1 : -1;
}

// Note [the ticket arena tried first]: the arena table has thousands of
// entries, and this process's ticket arena lies wherever its name hashed
// to; going through the table up to it on every send cost a hand-off's put
// more than the rest of the plane's work, and more again on a cold cache.
// So a send first tries the entry that gave the last ticket (an index only:
// it is held and checked as a scan's entry is), and goes through the table
// from its start, as before, only when that one has none to give.
static int32_t ticket_hint = -1;

// new_ticket hands a ticket slot out of one of this process's own arenas of
// tickets, as package pool's take does (its count of one, its pin on the
// arena), with its word zero: where the arena is held, or -1 when none has
// a slot free (Go makes a new arena).
static int32_t new_ticket(zp_found_arena *t, uint32_t *slot, uint32_t *gen) {
    int32_t hint = __atomic_load_n(&ticket_hint, __ATOMIC_RELAXED);
    if (zp_arenas_own_tickets_at(hint, t) >= 0) {
        if (take_ticket(t, slot, gen) == 1) {
            return hint;
        }
        zp_arenas_release(hint); // the table's scan below meets it again
    }
    zp_found_arena next;
    int32_t at = -1;
    for (;;) {
        int32_t n = zp_arenas_own_tickets(at, &next);
        if (at >= 0) {
            zp_arenas_release(at);
        }
        if (n < 0) {
            return -1;
        }
        at = n;
        *t = next;
        int taken = take_ticket(t, slot, gen);
        if (taken == 0) {
            continue;
        }
        if (taken < 0) {
            break;
        }
        __atomic_store_n(&ticket_hint, at, __ATOMIC_RELAXED);
        return at;
    }
    zp_arenas_release(at);
    return -1;
}

// nonce returns a ticket's nonce: never 0, which means taken.
static uint64_t nonce(void) {
    static __thread uint64_t state;
    if (state == 0) {
        uint64_t seed = 0;
        long got = -1;
#ifdef SYS_getrandom
        got = syscall(SYS_getrandom, &seed, sizeof seed, 0); // not glibc's wrapper, which came in 2.25
#endif
        if (got != (long)sizeof seed) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            seed = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 32 ^ (uint64_t)(uintptr_t)&seed;
        }
        state = seed | 1;
    }
    uint64_t z = (state += 0x9E3779B97F4A7C15ull); // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (z ^ (z >> 31)) | 1;
}

#define SENT INT32_MIN // put_array_here: sent; anything else: Go sends it

// put_array_here sends the array at addr as a tensor record whose one
// descriptor carries a new count on its pool slot, as Go's
// zct_queue_put_array does (buffer.Find, Describe, Send): the count taken,
// a ticket handed out, the record put in one try, whose put arms the
// ticket just before the record is visible. Anything it cannot do at once
// (memory that is no pool slot of an arena listed here, no ticket free, no
// room in the queue, a bad argument) leaves everything as it was, and Go
// does it, or says why not. The count is written in the ledger from its
// add until the put, having found room, arms the ticket (Note [counts that
// wait] in package buffer), so that a process killed before has it given
// up by the daemon.
static int put_array_here(zct_handle h, const void *addr, uint64_t extent, int32_t dtype, int32_t ndim,
                          const int64_t *shape, const int64_t *strides, int32_t flags) {
    // What Go's put checks of the array (describeArray, Describe, the
    // descriptor's Check): whatever fails any of them is Go's to refuse,
    // with its status and reason. A shape whose elements overflow though
    // its zero strides keep its extent small (2^40 x 2^40, strides 0)
    // passes the extent's check, not the byte count's.
    uint64_t end = 0, count = 0;
    for (int32_t i = 0; i < ndim; i++) {
        if (shape[i] < 0 || strides[i] < 0) {
            return 0;
        }
    }
    if (zp_extent((uint32_t)ndim, shape, strides, zp_dtype_sizes[dtype], &end) != 1 || end > extent ||
        !zp_byte_count((uint32_t)ndim, shape, zp_dtype_sizes[dtype], &count)) {
        return 0;
    }
    zp_found_arena b, t;
    uint32_t slot, gen, tslot, tgen;
    uint64_t off;
    int32_t held = zp_arenas_find(addr, extent, &b, &slot, &off);
    if (held < 0) {
        return 0;
    }
    // A count for the slot's generation now, recorded in the ledger, in
    // one step of the plane (zp_slot_ref), as buffer.Find takes it.
    zp_out out = {0};
    zp_ledger *l = zp_ledger_current();
    int32_t entry;
    int r = zp_slot_ref(b.arena, slot, 1, &gen, l, b.name, b.len, &entry, &out);
    if (r == ZP_POOL_MOVED) {
        give_back(b.arena, b.pins, slot, NULL, -1); // the new generation's count, given back as any holder would
    }
    if (r != ZP_OK) {
        zp_arenas_release(held);
        return 0;
    }
    entry = recorded(l, entry, &b, slot, gen);
    int32_t theld = new_ticket(&t, &tslot, &tgen);
    if (theld < 0) {
        give_back(b.arena, b.pins, slot, l, entry);
        zp_arenas_release(held);
        return 0;
    }
    zp_desc d;
    memset(&d, 0, sizeof d);
    d.kind = ZP_REF_SLOT;
    d.flags = (uint8_t)flags;
    d.dtype = (uint16_t)dtype;
    d.ndim = (uint32_t)ndim;
    d.name_len = b.len;
    d.arena_len = t.len;
    d.slot = slot;
    d.generation = gen;
    d.ticket_slot = tslot;
    d.ticket_generation = tgen;
    d.offset = off;
    d.nbytes = end;
    d.nonce = nonce();
    for (int32_t i = 0; i < ndim; i++) {
        d.shape[i] = shape[i];
        d.strides[i] = strides[i];
    }
    uint8_t prefix[ZP_RECORD_HEADER + ZP_DESC_BASE + 16 * ZP_MAX_NDIM + 2 * (ZP_MAX_NAME + 8) + ZP_TICKET_BASE];
    // d passes zp_desc_check by what was checked above (kind, flags, ndim,
    // dtype, signs, byte count and extent; names from the table of arenas,
    // a nonce never 0), so the write, which refuses what does not fit the
    // format, is its only check here.
    uint32_t n = zp_desc_write(prefix + ZP_RECORD_HEADER, sizeof prefix - ZP_RECORD_HEADER, &d, b.name, t.name);
    int sent = 0;
    if (n > 0) {
        uint32_t size = ZP_RECORD_HEADER + n; // a descriptor's size is a multiple of 8
        memset(prefix, 0, ZP_RECORD_HEADER);
        memcpy(prefix, &size, 4);
        prefix[4] = ZCT_RECORD_TENSOR;
        prefix[6] = 1; // one descriptor
        // The entry dropped and the ticket armed by the put itself, once
        // it found room and before the record is visible (zp_send; Note [a
        // count is taken once] in package pool), as Go's put does: a put
        // that does not go in sent nothing, and the count is in the ledger
        // still, for the give-back below or Go's put that waits.
        zp_send send = {.t = *t.arena, .l = l, .nonce = d.nonce, .entry = entry, .tslot = tslot};
        int r = zct_fast_put_prefix(h, prefix, size, size, &send, 1, &out);
        sent = r == ZP_OK;
        if (r == ZP_FAULT && out.what == ZP_IN_SENDS) {
            // Faulted in the send (the ticket arena's file shrunk under
            // it): the count may have left the ledger, and its ticket may
            // be armed; it is lost rather than given up twice.
            zp_arenas_release(theld);
            zp_arenas_release(held);
            return zct_faulted();
        }
    }
    if (!sent) {
        give_back(t.arena, t.pins, tslot, NULL, -1);
        give_back(b.arena, b.pins, slot, l, entry);
    }
    zp_arenas_release(theld);
    zp_arenas_release(held);
    return sent ? SENT : 0;
}

int zct_queue_put_array(zct_handle h, int32_t type, const void *addr, uint64_t extent, int32_t dtype, int32_t ndim,
                        const int64_t *shape, const int64_t *strides, int32_t flags, int64_t timeout_ms) {
    if (type == ZCT_RECORD_TENSOR && addr != NULL && ndim >= 0 && ndim <= ZP_MAX_NDIM &&
        (ndim == 0 || (shape != NULL && strides != NULL)) && flags >= 0 && flags <= 7 && dtype >= 0 &&
        dtype < ZP_DTYPES && zp_dtype_sizes[dtype] != 0) {
        int r = put_array_here(h, addr, extent, dtype, ndim, shape, strides, flags);
        if (r == SENT) {
            return ZCT_OK;
        }
        if (r != 0) {
            return r;
        }
    }
    return zctipc_go_queue_put_array(h, type, (zct_cvoid *)addr, extent, dtype, ndim, (zct_cint64 *)shape,
                                     (zct_cint64 *)strides, flags, timeout_ms);
}
