// The pool arenas this process maps, by name (package pool's index), for
// the C ABI's take of a record whose descriptors name slots: it finds the
// arenas here without entering Go, or leaves the record to Go, which maps
// what it does not find. Package pool adds an arena once it mapped it and
// removes it before it unmaps it; a removal waits until no call here holds
// the arena, so what a lookup returns stays mapped until it lets go.
//
// Threat model: the names looked up come from records that any process of
// the user may have written. A name is only compared; a lookup that finds
// nothing costs the caller a trip through Go, never a wrong arena.
#define _GNU_SOURCE
#include <sched.h>
#include <string.h>

#include "plane.h"

#define SEQ __ATOMIC_SEQ_CST
#define ARENAS 4096 // entries; an arena that finds none free is Go's alone
#define PROBE 32

enum { FREE = 0, FILLING, LIVE, LEAVING };

typedef struct entry {
    int32_t state;
    int32_t owned;  // this process's own arena, which it hands slots out of
    int32_t users;  // calls that hold the arena
    uint32_t epoch; // bumped each time the entry is filled: a lookup that raced a refill sees it
    uint32_t len;
    const zp_arena *arena;
    int64_t *pins; // the count of the arena's segment, which a slot in use holds one of
    int32_t tickets;
    char name[ZP_MAX_NAME];
} entry;

static entry arenas[ARENAS];

// The live entries by the address of their arena's data, for a lookup by
// address (zp_arenas_find); changed and read under by_addr_lock.
static int32_t by_addr[ARENAS];
static int32_t n_by_addr;
static int32_t by_addr_lock;

static void lock_by_addr(void) {
    while (__atomic_exchange_n(&by_addr_lock, 1, SEQ) != 0) {
        sched_yield(); // held for an insert, a delete or a search: short
    }
}

static void unlock_by_addr(void) { __atomic_store_n(&by_addr_lock, 0, SEQ); }

static uintptr_t base_of(int32_t at) { return (uintptr_t)arenas[at].arena->data; }

// first_above returns the index in by_addr of the first entry whose data
// starts above addr. The caller holds by_addr_lock.
static int32_t first_above(uintptr_t addr) {
    int32_t lo = 0, hi = n_by_addr;
    while (lo < hi) {
        int32_t mid = (lo + hi) / 2;
        if (base_of(by_addr[mid]) <= addr) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

static void insert_by_addr(int32_t at) {
    lock_by_addr();
    int32_t i = first_above(base_of(at));
    memmove(&by_addr[i + 1], &by_addr[i], sizeof by_addr[0] * (size_t)(n_by_addr - i));
    by_addr[i] = at;
    n_by_addr++;
    unlock_by_addr();
}

static void delete_by_addr(int32_t at) {
    lock_by_addr();
    for (int32_t i = 0; i < n_by_addr; i++) {
        if (by_addr[i] == at) {
            memmove(&by_addr[i], &by_addr[i + 1], sizeof by_addr[0] * (size_t)(n_by_addr - i - 1));
            n_by_addr--;
            break;
        }
    }
    unlock_by_addr();
}

static uint32_t hash(const uint8_t *name, uint32_t len) {
    uint32_t h = 2166136261u; // FNV-1a
    for (uint32_t i = 0; i < len; i++) {
        h = (h ^ name[i]) * 16777619u;
    }
    return h;
}

// fill fills *found from entry at, which the caller holds.
static void fill(int32_t at, zp_found_arena *found) {
    entry *e = &arenas[at];
    found->arena = e->arena;
    found->pins = e->pins;
    found->name = (const uint8_t *)e->name;
    found->len = e->len;
}

int zp_arenas_add(const uint8_t *name, uint32_t len, const zp_arena *a, int32_t tickets, int32_t owned, int64_t *pins) {
    if (len == 0 || len > ZP_MAX_NAME) {
        return ZP_RANGE;
    }
    uint32_t h = hash(name, len);
    for (uint32_t i = 0; i < PROBE; i++) {
        entry *e = &arenas[(h + i) % ARENAS];
        int32_t free = FREE;
        if (__atomic_load_n(&e->users, SEQ) != 0 ||
            !__atomic_compare_exchange_n(&e->state, &free, FILLING, 0, SEQ, SEQ)) {
            continue;
        }
        memcpy(e->name, name, len);
        e->len = len;
        e->arena = a;
        e->pins = pins;
        e->tickets = tickets;
        e->owned = owned;
        __atomic_add_fetch(&e->epoch, 1, SEQ);
        __atomic_store_n(&e->state, LIVE, SEQ);
        insert_by_addr((int32_t)((h + i) % ARENAS));
        return ZP_OK;
    }
    return ZP_BUSY; // every entry taken: the arena is Go's alone
}

void zp_arenas_remove(const zp_arena *a) {
    for (uint32_t i = 0; i < ARENAS; i++) {
        entry *e = &arenas[i];
        int32_t live = LIVE;
        if (__atomic_load_n(&e->state, SEQ) != LIVE || e->arena != a ||
            !__atomic_compare_exchange_n(&e->state, &live, LEAVING, 0, SEQ, SEQ)) {
            continue;
        }
        delete_by_addr((int32_t)i);
        while (__atomic_load_n(&e->users, SEQ) != 0) {
            sched_yield(); // a holder runs a few steps, never a wait
        }
        e->arena = NULL;
        __atomic_store_n(&e->state, FREE, SEQ);
        return;
    }
}

int32_t zp_arenas_acquire(const uint8_t *name, uint32_t len, int32_t tickets, zp_found_arena *found) {
    if (len == 0 || len > ZP_MAX_NAME) {
        return -1;
    }
    uint32_t h = hash(name, len);
    for (uint32_t i = 0; i < PROBE; i++) {
        int32_t at = (int32_t)((h + i) % ARENAS);
        entry *e = &arenas[at];
        if (__atomic_load_n(&e->state, SEQ) != LIVE) {
            continue;
        }
        uint32_t epoch = __atomic_load_n(&e->epoch, SEQ);
        if (e->len != len || memcmp(e->name, name, len) != 0) {
            continue;
        }
        __atomic_add_fetch(&e->users, 1, SEQ);
        // Still the entry compared, not one removed and filled again since:
        // its fields are then stable until the users go.
        if (__atomic_load_n(&e->state, SEQ) != LIVE || __atomic_load_n(&e->epoch, SEQ) != epoch ||
            e->len != len || memcmp(e->name, name, len) != 0) {
            __atomic_sub_fetch(&e->users, 1, SEQ);
            return -1;
        }
        if (e->tickets != tickets) { // Note [a ticket arena is not a buffer's]: Go says so
            __atomic_sub_fetch(&e->users, 1, SEQ);
            return -1;
        }
        fill(at, found);
        return at;
    }
    return -1;
}

void zp_arenas_release(int32_t at) {
    if (at >= 0 && at < ARENAS) {
        __atomic_sub_fetch(&arenas[at].users, 1, SEQ);
    }
}

int32_t zp_arenas_hold(int32_t at) {
    if (at < 0 || at >= ARENAS) {
        return ZP_RANGE;
    }
    __atomic_add_fetch(&arenas[at].users, 1, SEQ);
    return ZP_OK;
}

void zp_arenas_disown(const zp_arena *a) {
    for (uint32_t i = 0; i < ARENAS; i++) {
        if (__atomic_load_n(&arenas[i].state, SEQ) == LIVE && arenas[i].arena == a) {
            __atomic_store_n(&arenas[i].owned, 0, SEQ);
        }
    }
}

int32_t zp_arenas_find(const void *addr, uint64_t n, zp_found_arena *found, uint32_t *slot, uint64_t *off) {
    uintptr_t p = (uintptr_t)addr;
    lock_by_addr();
    int32_t i = first_above(p) - 1;
    int32_t at = i >= 0 ? by_addr[i] : -1;
    if (at >= 0) {
        entry *e = &arenas[at];
        const zp_arena *a = e->arena;
        uint64_t rel = (uint64_t)(p - base_of(at));
        // A slot's bytes, wholly in one buffer slot, as package pool's
        // lookup finds them: a ticket is no buffer of anyone's.
        if (__atomic_load_n(&e->state, SEQ) != LIVE || e->tickets || rel < a->slots_at ||
            (rel - a->slots_at) / a->slot_size >= a->nslots ||
            n > a->slot_size - (rel - a->slots_at) % a->slot_size) {
            at = -1;
        } else {
            *slot = (uint32_t)((rel - a->slots_at) / a->slot_size);
            *off = (rel - a->slots_at) % a->slot_size;
            __atomic_add_fetch(&e->users, 1, SEQ); // under the lock: a removal waits for it
            fill(at, found);
        }
    }
    unlock_by_addr();
    return at;
}

// held_own_tickets holds entry i and fills *found when it is one of this
// process's own ticket arenas: 1 then, else 0 (and nothing held).
static int held_own_tickets(int32_t i, zp_found_arena *found) {
    entry *e = &arenas[i];
    if (__atomic_load_n(&e->state, SEQ) != LIVE || !e->tickets || !__atomic_load_n(&e->owned, SEQ)) {
        return 0;
    }
    uint32_t epoch = __atomic_load_n(&e->epoch, SEQ);
    __atomic_add_fetch(&e->users, 1, SEQ);
    // Still the entry looked at, not one removed and filled again since
    // (another process's arena, or one of buffers, whose slots a ticket
    // must never be handed out of), nor disowned meanwhile.
    if (__atomic_load_n(&e->state, SEQ) != LIVE || __atomic_load_n(&e->epoch, SEQ) != epoch || !e->tickets ||
        !__atomic_load_n(&e->owned, SEQ)) {
        __atomic_sub_fetch(&e->users, 1, SEQ);
        return 0;
    }
    fill(i, found);
    return 1;
}

int32_t zp_arenas_own_tickets(int32_t after, zp_found_arena *found) {
    for (int32_t i = after + 1; i < ARENAS; i++) {
        if (held_own_tickets(i, found)) {
            return i;
        }
    }
    return -1;
}

int32_t zp_arenas_own_tickets_at(int32_t at, zp_found_arena *found) {
    return at >= 0 && at < ARENAS && held_own_tickets(at, found) ? at : -1;
}
