// A process's ledger (package ledger; docs/format.md, "ledger"): the
// entries that record the counts it holds, written once here, for package
// ledger, which calls these through package plane, and for the C ABI's
// calls that take a count without entering Go. Which entries are free is
// this process's alone, a stack in C memory under a spin lock: its
// critical sections are a push or a pop. Which entries are taken is kept
// beside it, so that a drop of an entry no one holds (dropped twice, never
// recorded, past the reserved ones, or recorded in a ledger this process
// had before) changes nothing: pushed, it would hand one entry to two
// recorders, and enough of them would push past the stack's room. An
// entry is its taker's until it drops it, and is written with plain
// stores, state last, for the daemon that reads the ledger meanwhile.
//
// The ledger's file lies in the segment directory under the file_system
// strategy, where another process of the user may shrink it: every write
// of an entry runs under the fault guard, and a write that faults records
// nothing (the count goes unrecorded, as when the ledger is full).
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "plane.h"

#define SEQ __ATOMIC_SEQ_CST

static zp_ledger *current;

void zp_ledger_set_current(zp_ledger *l) { __atomic_store_n(&current, l, SEQ); }

zp_ledger *zp_ledger_current(void) { return __atomic_load_n(&current, SEQ); }

static void lock(zp_ledger *l);
static void unlock(zp_ledger *l);

static uint8_t *entry_of(zp_ledger *l, int32_t n) {
    return __atomic_load_n(&l->data, SEQ) + ZP_LEDGER_ENTRIES_AT + (uint64_t)n * ZP_LEDGER_ENTRY_SIZE;
}

void zp_ledger_move(zp_ledger *l, uint8_t *data) { __atomic_store_n(&l->data, data, SEQ); }

uint32_t zp_ledger_capacity(zp_ledger *l) {
    lock(l);
    uint32_t n = l->capacity;
    unlock(l);
    return n;
}

static void lock(zp_ledger *l) {
    while (__atomic_exchange_n(&l->lock, 1, SEQ) != 0) {
        sched_yield(); // held for a push or a pop: short
    }
}

static void unlock(zp_ledger *l) { __atomic_store_n(&l->lock, 0, SEQ); }

zp_ledger *zp_ledger_new(uint8_t *data, uint32_t capacity) {
    zp_ledger *l = calloc(1, sizeof *l);
    if (l == NULL) {
        return NULL;
    }
    l->free = malloc(sizeof *l->free * ZP_LEDGER_MAX_ENTRIES);
    l->taken = calloc(ZP_LEDGER_MAX_ENTRIES, 1);
    if (l->free == NULL || l->taken == NULL) {
        free(l->free);
        free(l->taken);
        free(l);
        return NULL;
    }
    l->data = data;
    zp_ledger_grow(l, capacity);
    return l;
}

void zp_ledger_grow(zp_ledger *l, uint32_t capacity) {
    if (capacity > ZP_LEDGER_MAX_ENTRIES) {
        capacity = ZP_LEDGER_MAX_ENTRIES;
    }
    lock(l);
    // The lowest entries are taken first: pushed last.
    for (uint32_t i = capacity; i > l->capacity; i--) {
        l->free[l->nfree++] = (int32_t)(i - 1);
    }
    if (capacity > l->capacity) {
        l->capacity = capacity;
    }
    unlock(l);
}

uint32_t zp_ledger_free(zp_ledger *l) {
    lock(l);
    uint32_t n = l->nfree;
    unlock(l);
    return n;
}

static int32_t pop(zp_ledger *l) {
    lock(l);
    int32_t n = ZP_LEDGER_FULL;
    if (l->nfree > 0) {
        n = l->free[--l->nfree];
        l->taken[n] = 1;
    }
    unlock(l);
    return n;
}

// untake makes taken entry n neither taken nor free, for its taker to push
// once cleared, and reports whether it was taken.
static int untake(zp_ledger *l, int32_t n) {
    lock(l);
    int was = n >= 0 && (uint32_t)n < l->capacity && l->taken[n];
    if (was) {
        l->taken[n] = 0;
    }
    unlock(l);
    return was;
}

static void push(zp_ledger *l, int32_t n) {
    lock(l);
    l->free[l->nfree++] = n;
    unlock(l);
}

typedef struct recording {
    uint8_t *e;
    uint32_t state;
    const uint8_t *name, *final;
    uint32_t name_len, final_len;
    uint32_t index, gen;
} recording;

static int write_entry(void *arg) {
    recording *r = arg;
    uint8_t *e = r->e;
    memcpy(e + ZP_LEDGER_E_INDEX, &r->index, 4);
    memcpy(e + ZP_LEDGER_E_GEN, &r->gen, 4);
    memset(e + ZP_LEDGER_E_DEV, 0, 16);
    e[ZP_LEDGER_E_NAME_LEN] = (uint8_t)r->name_len;
    e[ZP_LEDGER_E_FINAL_LEN] = (uint8_t)r->final_len;
    memset(e + ZP_LEDGER_E_NAME, 0, 2 * ZP_LEDGER_NAME_CAP);
    if (r->name_len > 0) {
        memcpy(e + ZP_LEDGER_E_NAME, r->name, r->name_len);
    }
    if (r->final_len > 0) {
        memcpy(e + ZP_LEDGER_E_FINAL, r->final, r->final_len);
    }
    __atomic_store_n((uint32_t *)(e + ZP_LEDGER_E_STATE), r->state, SEQ);
    return ZP_OK;
}

int32_t zp_ledger_record(zp_ledger *l, uint32_t state, const uint8_t *name, uint32_t name_len, const uint8_t *final,
                         uint32_t final_len, uint32_t index, uint32_t gen) {
    if (name_len > ZP_LEDGER_NAME_CAP || final_len > ZP_LEDGER_NAME_CAP) {
        return ZP_LEDGER_FULL; // unrecordable: the caller says why (package ledger refuses it first)
    }
    int32_t n = pop(l);
    if (n < 0) {
        return n;
    }
    recording r = {entry_of(l, n), state, name, final, name_len, final_len, index, gen};
    zp_out out;
    if (zp_guarded(write_entry, &r, &out) != ZP_OK) {
        untake(l, n);
        push(l, n);
        return ZP_LEDGER_FAULTED;
    }
    return n;
}

typedef struct storing {
    uint8_t *e;
    uint32_t state;
    uint64_t dev, ino;
    int32_t op;
} storing;

enum { DROP, OPENED, CREATED };

static int store(void *arg) {
    storing *s = arg;
    uint8_t *e = s->e;
    switch (s->op) {
    case DROP:
        __atomic_store_n((uint32_t *)(e + ZP_LEDGER_E_STATE), ZP_LEDGER_FREE, SEQ);
        break;
    case OPENED:
        __atomic_store_n((uint64_t *)(e + ZP_LEDGER_E_DEV), s->dev, SEQ);
        __atomic_store_n((uint64_t *)(e + ZP_LEDGER_E_INO), s->ino, SEQ);
        break;
    default:
        // The final name becomes the name, then the state says so: a
        // reader that sees a segment's state sees its name.
        e[ZP_LEDGER_E_NAME_LEN] = e[ZP_LEDGER_E_FINAL_LEN];
        memcpy(e + ZP_LEDGER_E_NAME, e + ZP_LEDGER_E_FINAL, ZP_LEDGER_NAME_CAP);
        __atomic_store_n((uint32_t *)(e + ZP_LEDGER_E_STATE), ZP_LEDGER_SEGMENT, SEQ);
    }
    return ZP_OK;
}

static int stored(zp_ledger *l, int32_t n, int32_t op, uint64_t dev, uint64_t ino) {
    if (n < 0 || (uint32_t)n >= ZP_LEDGER_MAX_ENTRIES) {
        return ZP_RANGE;
    }
    storing s = {entry_of(l, n), 0, dev, ino, op};
    zp_out out;
    return zp_guarded(store, &s, &out);
}

int zp_ledger_drop(zp_ledger *l, int32_t n) {
    if (!untake(l, n)) {
        return ZP_RANGE; // no one holds it: its record, if any, is not ours to clear
    }
    int r = stored(l, n, DROP, 0, 0);
    push(l, n); // a faulted entry's file is gone with its records: free
    return r;
}

int zp_ledger_opened(zp_ledger *l, int32_t n, uint64_t dev, uint64_t ino) { return stored(l, n, OPENED, dev, ino); }

int zp_ledger_created(zp_ledger *l, int32_t n) { return stored(l, n, CREATED, 0, 0); }
