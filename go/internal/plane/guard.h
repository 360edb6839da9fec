/* The fault guard of the data plane (guard.c). */
#ifndef ZCTIPC_PLANE_GUARD_H
#define ZCTIPC_PLANE_GUARD_H

#include <setjmp.h>
#include <stdint.h>

typedef struct zp_guard {
    sigjmp_buf jb;
    struct zp_guard *outer;
    volatile uintptr_t addr; /* the faulting address */
    /* The lock words the step holds, to let go after a fault (queue.c,
       Note [a step that faults lets its locks go]): here, not in the
       step's frame, since the guard is memory the compiler cannot follow
       (zp_guard_arm is in another file): what the step notes in it is
       read again after the jump. */
    uint32_t *volatile held[2];
} zp_guard;

__attribute__((visibility("hidden"))) zp_guard *zp_guard_arm(zp_guard *g);
__attribute__((visibility("hidden"))) void zp_guard_disarm(zp_guard *g);

/* Each step arms a guard, then sigsetjmp(g.jb, 0) in its own frame (the
 * only place it may run), which returns 1 again after a SIGBUS, with g.addr
 * the address; the step then disarms it and reports ZP_FAULT. */

#endif
