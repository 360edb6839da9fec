/* A stand-in for libcuda.so.1 on machines without a GPU, for tests only:
 * "device memory" is host memory in memfds, so that the Go core's CUDA
 * code (dlopen, entry points, the structures it passes, handle caching,
 * VMM file-descriptor sharing across processes) runs end to end and the
 * tests can check the bytes. It implements the entry points zctipc uses
 * and nothing else, and knows nothing of kernels or streams.
 *
 * Legacy IPC handles name the memfd behind an address as
 * /proc/<pid>/fd/<fd>; an importer opens that path and maps it.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../go/internal/cuda/driver.h" /* the driver's types, as zctipc declares them */


enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101, INVALID_CONTEXT = 201,
       INVALID_HANDLE = 400, NOT_SUPPORTED = 801 };
#define GRANULARITY (64 << 10)

static int initialized;
static __thread void *current;

/* Mapped ranges: what cuMemMap and cuIpcOpenMemHandle made. */
static struct range { CUdeviceptr base; size_t size; int fd; int opened; } ranges[4096];
static int nranges;

static int counters[3]; /* opens, stream waits, event records */

int mock_counters(int *opens, int *waits, int *records) {
	*opens = counters[0];
	*waits = counters[1];
	*records = counters[2];
	return 0;
}

static int devices(void) {
	const char *n = getenv("ZCTIPC_MOCK_CUDA_DEVICES");
	return n ? atoi(n) : 1;
}

/* Each device's memory, ZCTIPC_MOCK_CUDA_MEMORY bytes (16 GiB unless set),
 * of which cuMemCreate takes and cuMemRelease gives back what this process
 * made: a device runs out as a real one does. */
static size_t device_memory(void) {
	const char *n = getenv("ZCTIPC_MOCK_CUDA_MEMORY");
	return n ? (size_t)strtoull(n, NULL, 10) : (size_t)16 << 30;
}
static size_t used[64];
static struct made { size_t size; int dev; } made[65536]; /* by handle: what cuMemCreate made */

static struct range *find(CUdeviceptr p) {
	for (int i = 0; i < nranges; i++) {
		if (ranges[i].size && p >= ranges[i].base && p < ranges[i].base + ranges[i].size) return &ranges[i];
	}
	return NULL;
}

static void add_range(CUdeviceptr base, size_t size, int fd, int opened) {
	for (int i = 0; i < nranges; i++) {
		if (ranges[i].size == 0) {
			ranges[i] = (struct range){base, size, fd, opened};
			return;
		}
	}
	ranges[nranges++] = (struct range){base, size, fd, opened};
}

CUresult cuInit(unsigned int flags) {
	(void)flags;
	initialized = 1;
	return OK;
}
CUresult cuDriverGetVersion(int *v) { *v = 12040; return OK; }
CUresult cuGetErrorString(CUresult r, const char **s) {
	switch (r) {
	case INVALID_VALUE: *s = "invalid argument (mock)"; break;
	case OUT_OF_MEMORY: *s = "out of memory (mock)"; break;
	case INVALID_DEVICE: *s = "invalid device ordinal (mock)"; break;
	case INVALID_HANDLE: *s = "invalid resource handle (mock)"; break;
	case NOT_SUPPORTED: *s = "operation not supported (mock)"; break;
	default: *s = "mock CUDA error";
	}
	return OK;
}
CUresult cuDeviceGetCount(int *n) {
	if (!initialized) return NOT_INITIALIZED;
	*n = devices();
	return OK;
}
CUresult cuDeviceGet(int *d, int ordinal) {
	if (ordinal < 0 || ordinal >= devices()) return INVALID_DEVICE;
	*d = ordinal;
	return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
	*ctx = (void *)(uintptr_t)(0x1000 + dev);
	return OK;
}
CUresult cuCtxGetCurrent(void **ctx) { *ctx = current; return OK; }
CUresult cuCtxSetCurrent(void *ctx) { current = ctx; return OK; }
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
	if (attr != 9 || find(p) == NULL) return INVALID_VALUE;
	*(int *)data = 0;
	return OK;
}

static int need_context(void) { return current != NULL; }

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
	struct range *r = find(p);
	if (!need_context() || r == NULL) return INVALID_VALUE;
	*base = r->base;
	*size = r->size;
	return OK;
}
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
	struct range *r = find(p);
	if (r == NULL || r->base != p) return INVALID_VALUE;
	memset(h, 0, sizeof *h);
	snprintf(h->reserved, sizeof h->reserved, "/proc/%d/fd/%d", (int)getpid(), r->fd);
	return OK;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
	(void)flags;
	char path[65];
	memcpy(path, h.reserved, 64);
	path[64] = 0;
	char own[32];
	snprintf(own, sizeof own, "/proc/%d/", (int)getpid());
	if (strncmp(path, own, strlen(own)) == 0) return INVALID_HANDLE; /* CUDA refuses one's own handle */
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) return INVALID_HANDLE;
	struct stat st;
	fstat(fd, &st);
	void *m = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		close(fd);
		return INVALID_VALUE;
	}
	add_range((CUdeviceptr)(uintptr_t)m, st.st_size, fd, 1);
	counters[0]++;
	*p = (CUdeviceptr)(uintptr_t)m;
	return OK;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
	struct range *r = find(p);
	if (r == NULL || !r->opened) return INVALID_VALUE;
	munmap((void *)(uintptr_t)r->base, r->size);
	close(r->fd);
	r->size = 0;
	return OK;
}

static int next_event = 1;
CUresult cuEventCreate(void **e, unsigned int flags) {
	if ((flags & 4) && !(flags & 2)) return INVALID_VALUE; /* interprocess events must disable timing */
	*e = (void *)(uintptr_t)(next_event++);
	return OK;
}
CUresult cuEventRecord(void *e, void *stream) { (void)e; (void)stream; counters[2]++; return OK; }
CUresult cuEventDestroy_v2(void *e) { return e ? OK : INVALID_HANDLE; }
CUresult cuIpcGetEventHandle(CUipcEventHandle *h, void *e) {
	memset(h, 0, sizeof *h);
	snprintf(h->reserved, sizeof h->reserved, "event %d %lu", (int)getpid(), (unsigned long)(uintptr_t)e);
	return OK;
}
CUresult cuIpcOpenEventHandle(void **e, CUipcEventHandle h) {
	if (strncmp(h.reserved, "event ", 6) != 0) return INVALID_HANDLE;
	*e = (void *)(uintptr_t)(0x100000 + next_event++);
	return OK;
}
CUresult cuStreamWaitEvent(void *stream, void *e, unsigned int flags) {
	(void)stream; (void)flags;
	if (e == NULL) return INVALID_HANDLE;
	counters[1]++;
	return OK;
}

static int prop_ok(const CUmemAllocationProp *p) {
	return p->type == 1 && p->requestedHandleTypes == 1 && p->location.type == 1 && p->location.id >= 0 &&
	       p->location.id < devices();
}
CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, int option) {
	if (!prop_ok(p) || option != 0) return INVALID_VALUE;
	*g = GRANULARITY;
	return OK;
}
CUresult cuMemCreate(uint64_t *h, size_t size, const CUmemAllocationProp *p, unsigned long long flags) {
	if (!prop_ok(p) || flags != 0 || size == 0 || size % GRANULARITY) return INVALID_VALUE;
	/* A device without POSIX file-descriptor handles (some virtualized GPUs)
	   refuses them as a real driver does. */
	if (getenv("ZCTIPC_MOCK_CUDA_NO_FD_HANDLES")) return NOT_SUPPORTED;
	int dev = p->location.id;
	if (size > device_memory() - used[dev]) return OUT_OF_MEMORY;
	int fd = memfd_create("mockcuda", MFD_CLOEXEC);
	if (fd < 0 || fd + 1 >= 65536 || ftruncate(fd, size) != 0) return INVALID_VALUE;
	*h = (uint64_t)fd + 1;
	made[*h] = (struct made){size, dev};
	used[dev] += size;
	return OK;
}
CUresult cuMemRelease(uint64_t h) {
	if (h < 65536 && made[h].size) {
		used[made[h].dev] -= made[h].size;
		made[h].size = 0;
	}
	return close((int)h - 1) == 0 ? OK : INVALID_HANDLE;
}
static int syncs;
int mock_syncs(void) { return syncs; }
CUresult cuCtxSynchronize(void) {
	if (!need_context()) return INVALID_CONTEXT;
	syncs++;
	return OK;
}
CUresult cuDeviceGetAttribute(int *value, int attribute, int dev) {
	if (dev < 0 || dev >= devices()) return INVALID_DEVICE;
	switch (attribute) {
	case 102: *value = 1; return OK; /* virtual memory management */
	case 103: *value = getenv("ZCTIPC_MOCK_CUDA_NO_FD_HANDLES") ? 0 : 1; return OK; /* POSIX fd handles */
	default: return INVALID_VALUE;
	}
}
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
	if (!need_context()) return INVALID_CONTEXT;
	int dev = (int)((uintptr_t)current - 0x1000);
	*total = device_memory();
	*free = *total - used[dev];
	return OK;
}
CUresult cuMemExportToShareableHandle(void *out, uint64_t h, int type, unsigned long long flags) {
	if (type != 1 || flags != 0) return INVALID_VALUE;
	int fd = fcntl((int)h - 1, F_DUPFD_CLOEXEC, 0);
	if (fd < 0) return INVALID_HANDLE;
	*(int *)out = fd;
	return OK;
}
CUresult cuMemImportFromShareableHandle(uint64_t *h, void *os, int type) {
	if (type != 1) return INVALID_VALUE;
	int fd = fcntl((int)(uintptr_t)os, F_DUPFD_CLOEXEC, 0);
	if (fd < 0) return INVALID_HANDLE;
	*h = (uint64_t)fd + 1;
	return OK;
}
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
	(void)align;
	if (addr != 0 || flags != 0 || size % GRANULARITY) return INVALID_VALUE;
	void *m = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) return INVALID_VALUE;
	*p = (CUdeviceptr)(uintptr_t)m;
	return OK;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { return munmap((void *)(uintptr_t)p, size) == 0 ? OK : INVALID_VALUE; }
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, uint64_t h, unsigned long long flags) {
	if (flags != 0) return INVALID_VALUE;
	void *m = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, (int)h - 1, offset);
	if (m == MAP_FAILED) return INVALID_VALUE;
	add_range(p, size, (int)h - 1, 0);
	return OK;
}
CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
	struct range *r = find(p);
	if (r == NULL || r->base != p || r->size != size) return INVALID_VALUE;
	r->size = 0;
	void *m = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	return m == MAP_FAILED ? INVALID_VALUE : OK;
}
CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *d, size_t count) {
	if (count == 0) return INVALID_VALUE;
	for (size_t i = 0; i < count; i++) {
		if (d[i].location.type != 1 || d[i].location.id < 0 || d[i].location.id >= devices() || d[i].flags != 3) return INVALID_VALUE;
	}
	return mprotect((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE) == 0 ? OK : INVALID_VALUE;
}
