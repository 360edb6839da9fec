// torch's CUDAPluggableAllocator calls an allocator through two C functions
// of its own signatures; these translate them to the cache's exports.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include "internal.h"

// Note [failing into torch]: torch does not look at what its allocate
// function returns: a NULL becomes a tensor at address 0, and the first
// kernel that touches it faults and takes the CUDA context down with it.
// The one way to fail that torch reports (as a RuntimeError to Python) is a
// C++ exception. libzctipc has no C++ of its own, so it throws
// std::runtime_error through the C++ runtime the process already loaded
// (torch links libstdc++), found with dlopen(RTLD_NOLOAD) and dlsym:
// nothing is linked, and a process without it (a C caller) gets NULL
// instead. C frames are unwound
// through by their unwind tables, which the compilers emit on x86-64 and
// arm64 Linux by default.
typedef void *(*allocate_exception_fn)(size_t);
typedef void (*throw_fn)(void *, void *, void (*)(void *));
typedef void (*runtime_error_fn)(void *, const char *);

static void throw_runtime_error(const char *msg) {
    // Loaded already (torch loads it into a local scope, which RTLD_DEFAULT
    // does not search), or not at all: then there is no C++ caller.
    void *cxx = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD);
    if (cxx == NULL) {
        return;
    }
    allocate_exception_fn allocate_exception = (allocate_exception_fn)dlsym(cxx, "__cxa_allocate_exception");
    throw_fn cxa_throw = (throw_fn)dlsym(cxx, "__cxa_throw");
    runtime_error_fn construct = (runtime_error_fn)dlsym(cxx, "_ZNSt13runtime_errorC1EPKc");
    void *type = dlsym(cxx, "_ZTISt13runtime_error");
    void *destroy = dlsym(cxx, "_ZNSt13runtime_errorD1Ev");
    dlclose(cxx); // the reference NOLOAD took; the library stays loaded
    if (allocate_exception == NULL || cxa_throw == NULL || construct == NULL || type == NULL || destroy == NULL) {
        return;
    }
    void *e = allocate_exception(64); // at least sizeof(std::runtime_error)
    construct(e, msg);
    cxa_throw(e, type, (void (*)(void *))destroy);
}

void *zct_torch_alloc(size_t size, int device, void *stream) {
    uint64_t ptr = 0;
    if (zct_cuda_cache_alloc(device, size, (uint64_t)(uintptr_t)stream, &ptr) != ZCT_OK) {
        throw_runtime_error(zct_last_error());
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
