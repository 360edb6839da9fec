// The steps of a pool arena's slot protocol (docs/format.md, "Pool
// arenas"; package pool's documentation): a slot taken off the free stack
// and pushed back on it, a slot handed out with a new generation, a count
// added for one generation and given back, a descriptor's check of the slot
// it names, and a ticket's word armed and taken. This file is that
// protocol, and the only copy of it: package pool runs these steps through
// cgo, and the C ABI's calls may run them directly (a queue record that
// carries descriptors of pool slots). What is once per arena (its layout's
// checks, mapping it, its segment's own count, reserving its pages) stays
// in Go. Words are read and written with sequentially consistent atomics,
// as Go's sync/atomic does. Every step runs under the fault guard
// (zp_guarded): another process of the user may shrink the arena's file.
//
// Threat model: any process of the user may write any word of an arena.
// A step never reads or writes outside the arena's slot table, its header
// words and (for a ticket) the first word of a slot it was given: the slot
// index is checked against nslots, which the caller read once and checked
// against the mapping's size (package pool's arenaOf), never read again
// from the shared header. A forged free stack is treated as empty (pop), a
// forged count or generation makes a check fail (ZP_STALE), never a count
// revived from zero.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "plane.h"

#define SEQ __ATOMIC_SEQ_CST

static inline uint64_t *head_of(const zp_arena *a) { return (uint64_t *)(a->data + ZP_ARENA_FREE_HEAD); }
static inline uint32_t *seq_of(const zp_arena *a) { return (uint32_t *)(a->data + ZP_ARENA_FREE_SEQ); }
static inline uint32_t *waiters_of(const zp_arena *a) { return (uint32_t *)(a->data + ZP_ARENA_WAITERS); }
static inline int64_t *free_count_of(const zp_arena *a) { return (int64_t *)(a->data + ZP_ARENA_FREE_COUNT); }
static inline uint8_t *meta(const zp_arena *a, uint32_t i) {
    return a->data + ZP_ARENA_SLOT_TABLE + (uint64_t)i * ZP_SLOT_META;
}
static inline int64_t *refcount_of(const zp_arena *a, uint32_t i) { return (int64_t *)meta(a, i); }
static inline uint32_t *next_of(const zp_arena *a, uint32_t i) { return (uint32_t *)(meta(a, i) + 8); }
static inline uint32_t *gen_of(const zp_arena *a, uint32_t i) { return (uint32_t *)(meta(a, i) + 12); }
static inline uint64_t *ticket_of(const zp_arena *a, uint32_t i) {
    return (uint64_t *)(a->data + a->slots_at + (uint64_t)i * a->slot_size);
}

// -- the free stack -----------------------------------------------------------

typedef struct slot_args {
    const zp_arena *a;
    uint32_t slot;
    uint32_t gen;
    uint64_t nonce;
    uint32_t *got; // pop: the slot; hand out, add ref: a generation; release: whether last
} slot_args;

static int pop(void *arg) {
    slot_args *s = arg;
    const zp_arena *a = s->a;
    uint64_t *head = head_of(a);
    uint64_t h = __atomic_load_n(head, SEQ);
    for (;;) {
        uint32_t top = (uint32_t)h;
        if (top == 0 || top > a->nslots) {
            return ZP_WAIT; // empty (or garbage, which is treated as empty)
        }
        uint32_t next = __atomic_load_n(next_of(a, top - 1), SEQ);
        // The tag (the high half) grows with every change, so that a head
        // popped and pushed back meanwhile (ABA) fails the exchange.
        if (__atomic_compare_exchange_n(head, &h, ((h >> 32) + 1) << 32 | next, 0, SEQ, SEQ)) {
            __atomic_sub_fetch(free_count_of(a), 1, SEQ);
            *s->got = top - 1;
            return ZP_OK;
        }
    }
}

// push puts slot i back on the free stack, bumps the free word and wakes
// the owners that wait on it, when any does.
static int push(const zp_arena *a, uint32_t i, zp_out *out) {
    uint64_t *head = head_of(a);
    uint64_t h = __atomic_load_n(head, SEQ);
    do {
        __atomic_store_n(next_of(a, i), (uint32_t)h, SEQ);
    } while (!__atomic_compare_exchange_n(head, &h, ((h >> 32) + 1) << 32 | (uint64_t)(i + 1), 0, SEQ, SEQ));
    __atomic_add_fetch(free_count_of(a), 1, SEQ);
    uint32_t *seq = seq_of(a);
    __atomic_add_fetch(seq, 1, SEQ);
    if (__atomic_load_n(waiters_of(a), SEQ) > 0) {
        // The kernel reads the word itself: a page cut off since the add
        // above says EFAULT rather than SIGBUS, the same fault (package
        // futex's Wake says so too).
        if (syscall(SYS_futex, seq, FUTEX_WAKE, 1 << 30, NULL, NULL, 0) == -1 && errno == EFAULT) {
            out->addr = (uintptr_t)seq;
            return ZP_FAULT;
        }
    }
    return ZP_OK;
}

typedef struct push_args {
    const zp_arena *a;
    uint32_t slot;
    zp_out *out;
} push_args;

static int pushed(void *arg) {
    push_args *p = arg;
    return push(p->a, p->slot, p->out);
}

// hand_out gives a slot just popped its new generation and its first count.
static int hand_out(void *arg) {
    slot_args *s = arg;
    *s->got = __atomic_add_fetch(gen_of(s->a, s->slot), 1, SEQ);
    __atomic_store_n(refcount_of(s->a, s->slot), 1, SEQ);
    return ZP_OK;
}

// -- counts -------------------------------------------------------------------

// The park of the test hook (zp_pool_park_add_ref): the add ref of the
// count at park_rc waits, between its check and its exchange, until
// park_resume.
static int64_t *park_rc;
static uint32_t park_parked, park_resume;

static void park(int64_t *rc) {
    int64_t *want = rc;
    if (__atomic_compare_exchange_n(&park_rc, &want, NULL, 0, SEQ, SEQ)) {
        __atomic_store_n(&park_parked, 1, SEQ);
        while (!__atomic_load_n(&park_resume, SEQ)) {
            sched_yield();
        }
    }
}

// add_ref: package pool's Note [a count for one generation]. The count
// and the generation are two words: the slot may be freed and handed out
// again between the check and the exchange, so the generation is read
// again after it, and a count that landed on another generation is that
// generation's (ZP_POOL_MOVED, with it in *got), for the caller to give
// back as any of its holders would.
static int add_ref(void *arg) {
    slot_args *s = arg;
    int64_t *rc = refcount_of(s->a, s->slot);
    uint32_t *gen = gen_of(s->a, s->slot);
    int64_t n = __atomic_load_n(rc, SEQ);
    for (;;) {
        if (n <= 0 || __atomic_load_n(gen, SEQ) != s->gen) {
            return ZP_POOL_STALE;
        }
        if (__atomic_load_n(&park_rc, __ATOMIC_RELAXED) == rc) {
            park(rc);
            n = __atomic_load_n(rc, SEQ); // as if the load had come after what ran meanwhile
        }
        if (__atomic_compare_exchange_n(rc, &n, n + 1, 0, SEQ, SEQ)) {
            break;
        }
    }
    uint32_t g = __atomic_load_n(gen, SEQ);
    if (g != s->gen) {
        *s->got = g;
        return ZP_POOL_MOVED;
    }
    *s->got = g;
    return ZP_OK;
}

typedef struct release_args {
    const zp_arena *a;
    uint32_t slot;
    uint32_t *last;
    zp_out *out;
} release_args;

// release gives a count back: the last one pushes the slot back on the free
// stack. A count that is already zero (or forged below it) is not taken
// lower: ZP_POOL_STALE.
static int release(void *arg) {
    release_args *r = arg;
    int64_t *rc = refcount_of(r->a, r->slot);
    int64_t n = __atomic_load_n(rc, SEQ);
    do {
        if (n <= 0) {
            return ZP_POOL_STALE;
        }
    } while (!__atomic_compare_exchange_n(rc, &n, n - 1, 0, SEQ, SEQ));
    *r->last = n == 1;
    return n == 1 ? push(r->a, r->slot, r->out) : ZP_OK;
}

static int check(void *arg) {
    slot_args *s = arg;
    if (__atomic_load_n(refcount_of(s->a, s->slot), SEQ) <= 0 || __atomic_load_n(gen_of(s->a, s->slot), SEQ) != s->gen) {
        return ZP_POOL_STALE;
    }
    return ZP_OK;
}

// -- tickets ------------------------------------------------------------------

static int ticket_arm(void *arg) {
    slot_args *s = arg;
    __atomic_store_n(ticket_of(s->a, s->slot), s->nonce, SEQ);
    return ZP_OK;
}

static int ticket_take(void *arg) {
    slot_args *s = arg;
    uint64_t want = s->nonce;
    return __atomic_compare_exchange_n(ticket_of(s->a, s->slot), &want, 0, 0, SEQ, SEQ) ? ZP_OK : ZP_POOL_TAKEN;
}

// -- the guarded entry points -------------------------------------------------

// A slot past the arena's table, or a ticket in a slot too small for its
// word, is the caller's bug or a forged descriptor: ZP_RANGE, nothing read.
static inline int bad_slot(const zp_arena *a, uint32_t slot) { return slot >= a->nslots; }

int zp_pool_pop(const zp_arena *a, uint32_t *slot, zp_out *out) {
    slot_args s = {.a = a, .got = slot};
    return zp_guarded(pop, &s, out);
}

int zp_pool_push(const zp_arena *a, uint32_t slot, zp_out *out) {
    if (bad_slot(a, slot)) {
        return ZP_RANGE;
    }
    push_args p = {.a = a, .slot = slot, .out = out};
    return zp_guarded(pushed, &p, out);
}

int zp_pool_hand_out(const zp_arena *a, uint32_t slot, uint32_t *gen, zp_out *out) {
    if (bad_slot(a, slot)) {
        return ZP_RANGE;
    }
    slot_args s = {.a = a, .slot = slot, .got = gen};
    return zp_guarded(hand_out, &s, out);
}

int zp_pool_add_ref(const zp_arena *a, uint32_t slot, uint32_t gen, uint32_t *landed, zp_out *out) {
    if (bad_slot(a, slot)) {
        return ZP_RANGE;
    }
    slot_args s = {.a = a, .slot = slot, .gen = gen, .got = landed};
    return zp_guarded(add_ref, &s, out);
}

int zp_pool_release(const zp_arena *a, uint32_t slot, uint32_t *last, zp_out *out) {
    *last = 0;
    if (bad_slot(a, slot)) {
        return ZP_RANGE;
    }
    release_args r = {.a = a, .slot = slot, .last = last, .out = out};
    return zp_guarded(release, &r, out);
}

int zp_pool_check(const zp_arena *a, uint32_t slot, uint32_t gen, zp_out *out) {
    if (bad_slot(a, slot)) {
        return ZP_CORRUPT;
    }
    slot_args s = {.a = a, .slot = slot, .gen = gen};
    return zp_guarded(check, &s, out);
}

int zp_ticket_arm(const zp_arena *a, uint32_t slot, uint64_t nonce, zp_out *out) {
    if (bad_slot(a, slot) || a->slot_size < 8) {
        return ZP_RANGE;
    }
    slot_args s = {.a = a, .slot = slot, .nonce = nonce};
    return zp_guarded(ticket_arm, &s, out);
}

int zp_ticket_take(const zp_arena *a, uint32_t slot, uint64_t nonce, zp_out *out) {
    if (bad_slot(a, slot) || a->slot_size < 8) {
        return ZP_RANGE;
    }
    slot_args s = {.a = a, .slot = slot, .nonce = nonce};
    return zp_guarded(ticket_take, &s, out);
}

void zp_pool_park_add_ref(int64_t *rc) {
    __atomic_store_n(&park_parked, 0, SEQ);
    __atomic_store_n(&park_resume, 0, SEQ);
    __atomic_store_n(&park_rc, rc, SEQ);
}

int zp_pool_add_ref_parked(void) { return (int)__atomic_load_n(&park_parked, SEQ); }

void zp_pool_resume_add_ref(void) {
    __atomic_store_n(&park_rc, NULL, SEQ);
    __atomic_store_n(&park_resume, 1, SEQ);
}

// -- sequences: a hand-off's steps, each whole in one call --------------------

// Note [a hand-off's steps in one call]: a descriptor sent and taken runs
// several steps of the protocol in a row (a count added then recorded; a
// ticket checked, taken and its slot given back; a count's record dropped
// then given back), and Go pays one cgo crossing per call into the plane,
// which on a slow machine costs more than all the steps together. So each
// such sequence is one call here, made of the steps above under one guard,
// and both package pool (through cgo, once per descriptor) and the C ABI's
// handoff.c run the same sequence. What needs Go (growing a full ledger,
// giving up an arena's possibly last pin, which unmaps it) is a result the
// caller acts on.

// move_pin moves the count of an arena's segment by delta while it stays
// above floor: a pin (+1 while it has one, floor 0) or an unpin (-1 while
// it is not the last, floor 1; the last is Go's to give up, which removes
// the segment). 1 when it moved.
static int move_pin(int64_t *pins, int64_t floor, int64_t delta) {
    int64_t n = __atomic_load_n(pins, SEQ);
    while (n > floor) {
        if (__atomic_compare_exchange_n(pins, &n, n + delta, 0, SEQ, SEQ)) {
            return 1;
        }
    }
    return 0;
}

// given_back gives back a count on slot i, and the slot's pin on its arena
// when it was the last: ZP_OK (*unpin 1: the pin may be the arena's last,
// and is the caller's to give up), ZP_POOL_STALE, or push's ZP_FAULT.
static int given_back(const zp_arena *a, int64_t *pins, uint32_t i, int32_t *unpin, zp_out *out) {
    uint32_t last = 0;
    release_args r = {.a = a, .slot = i, .last = &last, .out = out};
    int res = release(&r);
    if (res == ZP_OK && last && !move_pin(pins, 1, -1)) {
        *unpin = 1;
    }
    return res;
}

// A count's ledger entry, recorded (ZP_LEDGER_NONE when there is no ledger
// or the name does not fit one) or dropped.
static int32_t recorded(zp_ledger *l, const uint8_t *name, uint32_t len, uint32_t slot, uint32_t gen) {
    if (l == NULL || len > ZP_LEDGER_NAME_CAP) {
        return ZP_LEDGER_NONE;
    }
    return zp_ledger_record(l, ZP_LEDGER_SLOT, name, len, NULL, 0, slot, gen);
}

static void dropped(zp_ledger *l, int32_t entry) {
    if (l != NULL && entry >= 0) {
        zp_ledger_drop(l, entry);
    }
}

typedef struct take_args {
    const zp_arena *a;
    int64_t *pins;
    uint64_t reserved_to;
    int32_t zero;
    uint32_t *slot, *gen;
} take_args;

static int take_step(void *arg) {
    take_args *t = arg;
    slot_args s = {.a = t->a, .got = t->slot};
    int r = pop(&s);
    if (r != ZP_OK) {
        return r;
    }
    if (t->a->slots_at + ((uint64_t)*t->slot + 1) * t->a->slot_size > t->reserved_to) {
        return ZP_POOL_RESERVE;
    }
    s.slot = *t->slot;
    s.got = t->gen;
    hand_out(&s);
    if (!move_pin(t->pins, 0, 1)) {
        return ZP_POOL_UNPINNED;
    }
    if (t->zero) {
        ticket_arm(&s); // nonce 0: a ticket no take wins until it is armed
    }
    return ZP_OK;
}

int zp_pool_take(const zp_arena *a, int64_t *pins, uint64_t reserved_to, int32_t zero, uint32_t *slot, uint32_t *gen,
                 zp_out *out) {
    *slot = UINT32_MAX;
    if (zero && a->slot_size < 8) {
        return ZP_RANGE;
    }
    take_args t = {.a = a, .pins = pins, .reserved_to = reserved_to, .zero = zero, .slot = slot, .gen = gen};
    return zp_guarded(take_step, &t, out);
}

typedef struct drop_args {
    const zp_arena *a;
    int64_t *pins;
    uint32_t slot;
    zp_ledger *l;
    int32_t entry;
    int32_t *unpin;
    zp_out *out;
} drop_args;

static int release_step(void *arg) {
    drop_args *d = arg;
    dropped(d->l, d->entry); // Note [never give up what was not taken] in package ledger
    return given_back(d->a, d->pins, d->slot, d->unpin, d->out);
}

int zp_slot_release(const zp_arena *a, int64_t *pins, uint32_t slot, zp_ledger *l, int32_t entry, int32_t *unpin,
                    zp_out *out) {
    *unpin = 0;
    if (bad_slot(a, slot)) {
        return ZP_RANGE;
    }
    drop_args d = {.a = a, .pins = pins, .slot = slot, .l = l, .entry = entry, .unpin = unpin, .out = out};
    return zp_guarded(release_step, &d, out);
}

typedef struct ref_args {
    const zp_arena *a;
    uint32_t slot;
    int32_t current;
    uint32_t *gen;
    zp_ledger *l;
    const uint8_t *name;
    uint32_t len;
    int32_t *entry;
} ref_args;

static int ref_step(void *arg) {
    ref_args *f = arg;
    if (f->current) {
        *f->gen = __atomic_load_n(gen_of(f->a, f->slot), SEQ);
    }
    uint32_t landed = 0;
    slot_args s = {.a = f->a, .slot = f->slot, .gen = *f->gen, .got = &landed};
    int r = add_ref(&s);
    if (r == ZP_POOL_MOVED) {
        *f->gen = landed;
    }
    if (r == ZP_OK) {
        *f->entry = recorded(f->l, f->name, f->len, f->slot, landed);
    }
    return r;
}

int zp_slot_ref(const zp_arena *a, uint32_t slot, int32_t current, uint32_t *gen, zp_ledger *l, const uint8_t *name,
                uint32_t len, int32_t *entry, zp_out *out) {
    *entry = ZP_LEDGER_NONE;
    if (bad_slot(a, slot)) {
        return ZP_RANGE;
    }
    ref_args f = {.a = a, .slot = slot, .current = current, .gen = gen, .l = l, .name = name, .len = len, .entry = entry};
    return zp_guarded(ref_step, &f, out);
}

typedef struct send_args {
    zp_ledger *l;
    int32_t entry;
    slot_args s;
} send_args;

static int send_step(void *arg) {
    send_args *a = arg;
    dropped(a->l, a->entry);
    return ticket_arm(&a->s);
}

int zp_slot_send(zp_ledger *l, int32_t entry, const zp_arena *t, uint32_t tslot, uint64_t nonce, zp_out *out) {
    if (bad_slot(t, tslot) || t->slot_size < 8) {
        return ZP_RANGE;
    }
    send_args a = {.l = l, .entry = entry, .s = {.a = t, .slot = tslot, .nonce = nonce}};
    return zp_guarded(send_step, &a, out);
}

// The sends a put step runs (zp_send): zp_slot_send's step, for a put that
// holds its own guard.

int zp_send_ok(const zp_send *s) { return s->t.data == NULL || (!bad_slot(&s->t, s->tslot) && s->t.slot_size >= 8); }

void zp_send_probe(const zp_send *s) {
    if (s->t.data != NULL) {
        (void)__atomic_load_n(ticket_of(&s->t, s->tslot), SEQ);
    }
}

void zp_send_run(const zp_send *s) {
    if (s->t.data == NULL) {
        dropped(s->l, s->entry);
        return;
    }
    send_args a = {.l = s->l, .entry = s->entry, .s = {.a = &s->t, .slot = s->tslot, .nonce = s->nonce}};
    send_step(&a);
}

typedef struct adopt_args {
    const zp_arena *t, *b;
    int64_t *tpins;
    const zp_desc *d;
    int32_t steps;
    zp_ledger *l;
    const uint8_t *name;
    uint32_t len;
    zp_adopted *res;
    zp_out *out;
} adopt_args;

static int adopt_step(void *arg) {
    adopt_args *x = arg;
    const zp_desc *d = x->d;
    if (x->steps & ZP_ADOPT_CHECK) {
        // The checks of pool.TakeTicket, pool.Adopt and buffer.Adopt's
        // bytes, before any count changes hands.
        slot_args s = {.a = x->t, .slot = d->ticket_slot, .gen = d->ticket_generation};
        if (check(&s) != ZP_OK) {
            return ZP_POOL_REFUSED;
        }
        if (x->b != NULL) {
            s = (slot_args){.a = x->b, .slot = d->slot, .gen = d->generation};
            if (check(&s) != ZP_OK || d->offset > x->b->slot_size || d->nbytes > x->b->slot_size - d->offset) {
                return ZP_POOL_REFUSED;
            }
        }
    }
    if (!(x->steps & ZP_ADOPT_TAKE)) {
        return ZP_OK;
    }
    slot_args s = {.a = x->t, .slot = d->ticket_slot, .nonce = d->nonce};
    if (ticket_take(&s) != ZP_OK) {
        return ZP_POOL_REFUSED;
    }
    x->res->taken = 1;
    int r = given_back(x->t, x->tpins, d->ticket_slot, &x->res->unpin, x->out);
    if (r == ZP_OK && x->b != NULL) {
        x->res->entry = recorded(x->l, x->name, x->len, d->slot, d->generation);
    }
    return r;
}

int zp_slot_adopt(const zp_arena *t, int64_t *tpins, const zp_arena *b, const zp_desc *d, int32_t steps, zp_ledger *l,
                  const uint8_t *name, uint32_t len, zp_adopted *res, zp_out *out) {
    res->entry = ZP_LEDGER_NONE;
    res->taken = res->unpin = 0;
    if ((steps & ZP_ADOPT_DESC) && zp_desc_check(d) != ZP_OK) {
        return ZP_POOL_REFUSED;
    }
    if (bad_slot(t, d->ticket_slot) || t->slot_size < 8 || d->nonce == 0 || (b != NULL && bad_slot(b, d->slot))) {
        return ZP_POOL_REFUSED;
    }
    adopt_args x = {.t = t, .b = b, .tpins = tpins, .d = d, .steps = steps, .l = l, .name = name, .len = len,
                    .res = res, .out = out};
    return zp_guarded(adopt_step, &x, out);
}
