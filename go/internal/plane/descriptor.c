// A queue record's descriptor (docs/format.md, "Descriptors"; package
// message's Descriptor): its size, its bytes written and read, the rules a
// descriptor must keep, and the byte counts of an array that they use
// (package header's ByteCount and Extent count the same in Go, which a
// test holds them to: header.go says why there are two), once, for the
// C ABI's calls that never enter Go and for package message, which calls
// them through package plane.
//
// Threat model: the bytes read are a record another process wrote, copied
// out of the ring already (the reader works on its own copy, so a writer
// cannot change them between a check and a use), but forged: every length
// in them is checked against the bytes there are before anything past the
// 32-byte base is read, and every count is checked for overflow before it
// is trusted. Only the caller's memory is touched, so no guard is needed.
#include <stddef.h>
#include <string.h>

#include "plane.h"

static inline uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint64_t align8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

int zp_byte_count(uint32_t ndim, const int64_t *shape, uint64_t itemsize, uint64_t *n) {
    // A dimension of 0 makes no bytes, but the product of the others past
    // 2^63 - 1 is refused still: whether a shape overflows does not depend
    // on where its zero is.
    uint64_t count = itemsize;
    int empty = 0;
    *n = 0;
    for (uint32_t i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            empty = 1;
            continue;
        }
        unsigned __int128 m = (unsigned __int128)count * (uint64_t)shape[i];
        if (m > (unsigned __int128)INT64_MAX) {
            return 0;
        }
        count = (uint64_t)m;
    }
    *n = empty ? 0 : count;
    return 1;
}

int zp_extent(uint32_t ndim, const int64_t *shape, const int64_t *strides, uint64_t itemsize, uint64_t *end) {
    uint64_t last = 0;
    *end = 0;
    for (uint32_t i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            return 1;
        }
        // (uint64_t)shape[i] - 1, not shape[i] - 1: Go's uint64(d-1) wraps
        // where C's signed subtraction would be undefined.
        unsigned __int128 m = (unsigned __int128)((uint64_t)shape[i] - 1) * (uint64_t)strides[i];
        if (m >> 64 != 0) {
            return 0;
        }
        uint64_t next = last + (uint64_t)m;
        if (next < last || next > INT64_MAX) {
            return 0;
        }
        last = next;
    }
    uint64_t e = last + itemsize;
    *end = e; // given even when refused, as package header's Extent does
    return e >= last && e <= INT64_MAX;
}

uint64_t zp_desc_size(uint64_t ndim, uint64_t name_len, uint64_t arena_len) {
    uint64_t n = align8(ZP_DESC_BASE + 16 * ndim + name_len);
    if (arena_len > 0) {
        n += align8(ZP_TICKET_BASE + arena_len);
    }
    return n;
}

int zp_desc_check(const zp_desc *d) {
    // In the order package message has always checked them, so that a
    // descriptor broken twice is refused for the same reason as before.
    if (d->kind != ZP_REF_SEGMENT && d->kind != ZP_REF_SLOT) {
        return ZP_BAD_DESC_KIND;
    }
    if (d->flags & ~7u) {
        return ZP_BAD_DESC_FLAGS;
    }
    if (d->ndim > ZP_MAX_NDIM) {
        return ZP_BAD_DESC_NDIM;
    }
    if (d->name_len == 0 || d->name_len > ZP_MAX_NAME) {
        return ZP_BAD_DESC_NAME;
    }
    if (d->arena_len > ZP_MAX_NAME || (d->arena_len > 0 && d->nonce == 0)) {
        return ZP_BAD_DESC_TICKET;
    }
    uint64_t itemsize = d->dtype < ZP_DTYPES ? zp_dtype_sizes[d->dtype] : 0;
    if (itemsize == 0) {
        return ZP_BAD_DESC_DTYPE;
    }
    for (uint32_t i = 0; i < d->ndim; i++) {
        if (d->shape[i] < 0 || d->strides[i] < 0) {
            return ZP_BAD_DESC_NEGATIVE;
        }
    }
    uint64_t n, extent;
    if (!zp_byte_count(d->ndim, d->shape, itemsize, &n)) {
        return ZP_BAD_DESC_OVERFLOW;
    }
    if (!zp_extent(d->ndim, d->shape, d->strides, itemsize, &extent) || extent > d->nbytes ||
        d->offset + d->nbytes < d->offset) {
        return ZP_BAD_DESC_EXTENT;
    }
    return ZP_OK;
}

int zp_desc_read(const uint8_t *src, uint64_t len, zp_desc *out) {
    memset(out, 0, offsetof(zp_desc, shape));
    if (len < ZP_DESC_BASE) {
        return ZP_BAD_DESC_TRUNCATED;
    }
    // The 32-byte base first: what a refusal below reports comes from it.
    uint64_t n = rd16(src);
    out->size = (uint32_t)n;
    out->kind = src[2];
    out->flags = src[3] & ~(uint8_t)ZP_DESC_TICKET;
    out->dtype = rd16(src + 4);
    out->ndim = src[6];
    out->name_len = src[7];
    out->offset = rd64(src + 8);
    out->nbytes = rd64(src + 16);
    out->slot = rd32(src + 24);
    out->generation = rd32(src + 28);
    out->name_at = ZP_DESC_BASE + 16 * out->ndim;
    uint64_t base = align8(out->name_at + out->name_len);
    uint64_t have = n < len ? n : len;
    if (src[3] & ZP_DESC_TICKET) {
        if (base + ZP_TICKET_BASE > have) {
            return ZP_BAD_DESC_TICKET_CUT;
        }
        out->nonce = rd64(src + base);
        out->ticket_slot = rd32(src + base + 8);
        out->ticket_generation = rd32(src + base + 12);
        out->arena_len = src[base + 16];
        if (out->arena_len == 0 || n != base + align8(ZP_TICKET_BASE + out->arena_len) || n > len) {
            return ZP_BAD_DESC_TICKET_SIZE;
        }
        out->arena_at = (uint32_t)(base + ZP_TICKET_BASE);
        base = n;
    }
    if (out->ndim > ZP_MAX_NDIM || n != base || n > len) {
        return ZP_BAD_DESC_SIZE;
    }
    // Every byte read from here lies below base == n <= len.
    if (out->ndim > 0) {
        memcpy(out->shape, src + ZP_DESC_BASE, 8u * out->ndim);
        memcpy(out->strides, src + ZP_DESC_BASE + 8u * out->ndim, 8u * out->ndim);
    }
    return zp_desc_check(out);
}

uint32_t zp_desc_write(uint8_t *dst, uint64_t cap, const zp_desc *d, const uint8_t *name, const uint8_t *arena) {
    if (d->ndim > ZP_MAX_NDIM || d->name_len > ZP_MAX_NAME || d->arena_len > ZP_MAX_NAME) {
        return 0;
    }
    uint32_t n = (uint32_t)zp_desc_size(d->ndim, d->name_len, d->arena_len);
    if (n > cap) {
        return 0;
    }
    uint16_t size = (uint16_t)n;
    memset(dst, 0, n);
    memcpy(dst, &size, 2);
    dst[2] = d->kind;
    dst[3] = d->flags | (d->arena_len > 0 ? ZP_DESC_TICKET : 0);
    memcpy(dst + 4, &d->dtype, 2);
    dst[6] = (uint8_t)d->ndim;
    dst[7] = (uint8_t)d->name_len;
    memcpy(dst + 8, &d->offset, 8);
    memcpy(dst + 16, &d->nbytes, 8);
    memcpy(dst + 24, &d->slot, 4);
    memcpy(dst + 28, &d->generation, 4);
    uint32_t at = ZP_DESC_BASE;
    if (d->ndim > 0) {
        memcpy(dst + at, d->shape, 8u * d->ndim);
        memcpy(dst + at + 8u * d->ndim, d->strides, 8u * d->ndim);
        at += 16u * d->ndim;
    }
    if (d->name_len > 0) {
        memcpy(dst + at, name, d->name_len);
    }
    if (d->arena_len > 0) {
        at = (uint32_t)align8(at + d->name_len);
        memcpy(dst + at, &d->nonce, 8);
        memcpy(dst + at + 8, &d->ticket_slot, 4);
        memcpy(dst + at + 12, &d->ticket_generation, 4);
        dst[at + 16] = (uint8_t)d->arena_len;
        memcpy(dst + at + ZP_TICKET_BASE, arena, d->arena_len);
    }
    return n;
}
