// torch's CUDAPluggableAllocator calls an allocator through two C functions
// of its own signatures; these translate them to the cache's exports.
#include <stdint.h>
#include "internal.h"

void *zct_torch_alloc(size_t size, int device, void *stream) {
    uint64_t ptr = 0;
    if (zct_cuda_cache_alloc(device, size, (uint64_t)(uintptr_t)stream, &ptr) != ZCT_OK) {
        return NULL;
    }
    return (void *)(uintptr_t)ptr;
}

void zct_torch_free(void *ptr, size_t size, int device, void *stream) {
    (void)size;
    (void)device;
    (void)stream;
    zct_cuda_cache_free((uint64_t)(uintptr_t)ptr);
}
