// The inline array of a queue record (docs/format.md, "inline"; package
// message's Inline): its header written and read, and the rules an array
// must keep to travel inline, once, for the C ABI's calls that never enter
// Go and for package message, which calls these through package plane.
// They touch only the caller's memory (a record already copied out of the
// ring, or the header being built), so they need no guard.
#include <string.h>

#include "plane.h"

uint8_t zp_dtype_sizes[ZP_DTYPES];

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

int zp_inline_check(uint32_t dtype, uint32_t flags, uint32_t ndim, const int64_t *shape, uint64_t nbytes) {
    if (ndim > ZP_MAX_NDIM || flags > 7) {
        return ZP_BAD_INLINE_HEADER;
    }
    if (dtype >= ZP_DTYPES || zp_dtype_sizes[dtype] == 0) {
        return ZP_BAD_INLINE_DTYPE;
    }
    for (uint32_t i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            return ZP_BAD_INLINE_SHAPE;
        }
    }
    // The bytes the shape makes, as package header's ByteCount counts
    // them (zp_byte_count).
    uint64_t n;
    if (!zp_byte_count(ndim, shape, zp_dtype_sizes[dtype], &n)) {
        return ZP_BAD_INLINE_BYTES;
    }
    return n == nbytes ? ZP_OK : ZP_BAD_INLINE_BYTES;
}

uint32_t zp_inline_head(uint8_t *dst, uint16_t dtype, uint8_t flags, uint8_t ndim, const int64_t *shape) {
    memcpy(dst, &dtype, 2);
    dst[2] = flags;
    dst[3] = ndim;
    memset(dst + 4, 0, 4);
    if (ndim > 0) {
        memcpy(dst + ZP_INLINE_HEADER, shape, 8u * ndim);
    }
    return ZP_INLINE_HEADER + 8u * ndim;
}

int zp_inline_read(const uint8_t *payload, uint64_t len, zp_inline *out) {
    memset(out, 0, sizeof *out);
    if (len < ZP_INLINE_HEADER) {
        return ZP_BAD_INLINE_HEADER;
    }
    uint16_t dtype;
    memcpy(&dtype, payload, 2);
    out->dtype = dtype;
    out->flags = payload[2];
    out->ndim = payload[3];
    if (out->ndim > ZP_MAX_NDIM || rd32(payload + 4) != 0 || len < ZP_INLINE_HEADER + 8ull * out->ndim) {
        return ZP_BAD_INLINE_HEADER;
    }
    if (out->ndim > 0) {
        memcpy(out->shape, payload + ZP_INLINE_HEADER, 8u * out->ndim);
    }
    out->at = ZP_INLINE_HEADER + 8u * out->ndim;
    out->nbytes = len - out->at;
    return zp_inline_check(out->dtype, out->flags, out->ndim, out->shape, out->nbytes);
}
