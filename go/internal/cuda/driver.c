#include <dlfcn.h>
#include <string.h>

#include "driver.h"

// The driver's entry points, found with dlsym.
static struct {
	CUresult (*Init)(unsigned int);
	CUresult (*DriverGetVersion)(int *);
	CUresult (*GetErrorString)(CUresult, const char **);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*CtxGetCurrent)(CUcontext *);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
	CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
	CUresult (*IpcCloseMemHandle)(CUdeviceptr);
	CUresult (*EventCreate)(CUevent *, unsigned int);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventDestroy)(CUevent);
	CUresult (*IpcGetEventHandle)(CUipcEventHandle *, CUevent);
	CUresult (*IpcOpenEventHandle)(CUevent *, CUipcEventHandle);
	CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned int);
	CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
	CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
	CUresult (*MemRelease)(CUmemGenericAllocationHandle);
	CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
	CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
	CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*MemAddressFree)(CUdeviceptr, size_t);
	CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*MemUnmap)(CUdeviceptr, size_t);
	CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*MemGetInfo)(size_t *, size_t *);
	CUresult (*CtxSynchronize)(void);
	CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
} cu;

// zct_cuda_load opens the driver and finds every entry point; it returns
// NULL, or what went wrong.
const char *zct_cuda_load(const char *path) {
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		return dlerror();
	}
#define SYM(field, name) if ((*(void **)&cu.field = dlsym(lib, name)) == NULL) return "libcuda.so.1 lacks " name;
	SYM(Init, "cuInit")
	SYM(DriverGetVersion, "cuDriverGetVersion")
	SYM(GetErrorString, "cuGetErrorString")
	SYM(DeviceGetCount, "cuDeviceGetCount")
	SYM(DeviceGet, "cuDeviceGet")
	SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
	SYM(CtxGetCurrent, "cuCtxGetCurrent")
	SYM(CtxSetCurrent, "cuCtxSetCurrent")
	SYM(PointerGetAttribute, "cuPointerGetAttribute")
	SYM(MemGetAddressRange, "cuMemGetAddressRange_v2")
	SYM(IpcGetMemHandle, "cuIpcGetMemHandle")
	SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2")
	SYM(IpcCloseMemHandle, "cuIpcCloseMemHandle")
	SYM(EventCreate, "cuEventCreate")
	SYM(EventRecord, "cuEventRecord")
	SYM(EventDestroy, "cuEventDestroy_v2")
	SYM(IpcGetEventHandle, "cuIpcGetEventHandle")
	SYM(IpcOpenEventHandle, "cuIpcOpenEventHandle")
	SYM(StreamWaitEvent, "cuStreamWaitEvent")
	SYM(MemGetAllocationGranularity, "cuMemGetAllocationGranularity")
	SYM(MemCreate, "cuMemCreate")
	SYM(MemRelease, "cuMemRelease")
	SYM(MemExportToShareableHandle, "cuMemExportToShareableHandle")
	SYM(MemImportFromShareableHandle, "cuMemImportFromShareableHandle")
	SYM(MemAddressReserve, "cuMemAddressReserve")
	SYM(MemAddressFree, "cuMemAddressFree")
	SYM(MemMap, "cuMemMap")
	SYM(MemUnmap, "cuMemUnmap")
	SYM(MemSetAccess, "cuMemSetAccess")
	SYM(MemGetInfo, "cuMemGetInfo_v2")
	SYM(CtxSynchronize, "cuCtxSynchronize")
	SYM(DeviceGetAttribute, "cuDeviceGetAttribute")
#undef SYM
	return NULL;
}

// Trampolines: cgo cannot call a C function pointer itself.
CUresult zct_cuInit(void) { return cu.Init(0); }
CUresult zct_cuDriverGetVersion(int *v) { return cu.DriverGetVersion(v); }
const char *zct_cuErrorString(CUresult r) {
	const char *s = NULL;
	if (cu.GetErrorString == NULL || cu.GetErrorString(r, &s) != 0 || s == NULL) return "unknown CUDA error";
	return s;
}
CUresult zct_cuDeviceGetCount(int *n) { return cu.DeviceGetCount(n); }
CUresult zct_cuPrimaryCtx(int ordinal, CUcontext *ctx) {
	CUdevice dev;
	CUresult r = cu.DeviceGet(&dev, ordinal);
	if (r != 0) return r;
	return cu.DevicePrimaryCtxRetain(ctx, dev);
}
CUresult zct_cuCtxGetCurrent(CUcontext *ctx) { return cu.CtxGetCurrent(ctx); }
CUresult zct_cuCtxSetCurrent(CUcontext ctx) { return cu.CtxSetCurrent(ctx); }
CUresult zct_cuPointerDevice(CUdeviceptr p, int *ordinal) {
	return cu.PointerGetAttribute(ordinal, 9, p); // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
}
CUresult zct_cuAddressRange(CUdeviceptr p, CUdeviceptr *base, size_t *size) {
	return cu.MemGetAddressRange(base, size, p);
}
CUresult zct_cuIpcGetMemHandle(CUdeviceptr p, void *out) { return cu.IpcGetMemHandle((CUipcMemHandle *)out, p); }
CUresult zct_cuIpcOpenMemHandle(const void *h, CUdeviceptr *p) {
	CUipcMemHandle handle;
	memcpy(&handle, h, sizeof handle);
	return cu.IpcOpenMemHandle(p, handle, 1); // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
}
CUresult zct_cuIpcCloseMemHandle(CUdeviceptr p) { return cu.IpcCloseMemHandle(p); }
CUresult zct_cuEventCreateShared(void *out, uintptr_t *event) {
	CUevent ev;
	CUresult r = cu.EventCreate(&ev, 2 | 4); // CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS
	if (r != 0) return r;
	if ((r = cu.IpcGetEventHandle((CUipcEventHandle *)out, ev)) != 0) {
		cu.EventDestroy(ev);
		return r;
	}
	*event = (uintptr_t)ev;
	return 0;
}
CUresult zct_cuEventRecord(uintptr_t ev, uintptr_t stream) { return cu.EventRecord((CUevent)ev, (CUstream)stream); }
CUresult zct_cuEventDestroy(uintptr_t ev) { return cu.EventDestroy((CUevent)ev); }
CUresult zct_cuIpcOpenEvent(const void *h, uintptr_t *event) {
	CUipcEventHandle handle;
	CUevent ev;
	memcpy(&handle, h, sizeof handle);
	CUresult r = cu.IpcOpenEventHandle(&ev, handle);
	*event = (uintptr_t)ev;
	return r;
}
CUresult zct_cuStreamWaitEvent(uintptr_t stream, uintptr_t ev) {
	return cu.StreamWaitEvent((CUstream)stream, (CUevent)ev, 0);
}

static CUmemAllocationProp zct_prop(int ordinal) {
	CUmemAllocationProp p;
	memset(&p, 0, sizeof p);
	p.type = 1;                 // CU_MEM_ALLOCATION_TYPE_PINNED
	p.requestedHandleTypes = 1; // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	p.location.type = 1;        // CU_MEM_LOCATION_TYPE_DEVICE
	p.location.id = ordinal;
	return p;
}
CUresult zct_cuGranularity(int ordinal, size_t *g) {
	CUmemAllocationProp p = zct_prop(ordinal);
	return cu.MemGetAllocationGranularity(g, &p, 0); // CU_MEM_ALLOC_GRANULARITY_MINIMUM
}
CUresult zct_cuMemCreate(int ordinal, size_t size, CUmemGenericAllocationHandle *h) {
	CUmemAllocationProp p = zct_prop(ordinal);
	return cu.MemCreate(h, size, &p, 0);
}
CUresult zct_cuMemRelease(CUmemGenericAllocationHandle h) { return cu.MemRelease(h); }
CUresult zct_cuMemGetInfo(size_t *free, size_t *total) { return cu.MemGetInfo(free, total); }
CUresult zct_cuCtxSynchronize(void) { return cu.CtxSynchronize(); }
CUresult zct_cuDeviceAttribute(int ordinal, int attribute, int *value) {
	CUdevice dev;
	CUresult r = cu.DeviceGet(&dev, ordinal);
	return r != 0 ? r : cu.DeviceGetAttribute(value, attribute, dev);
}
CUresult zct_cuMemExportFD(CUmemGenericAllocationHandle h, int *fd) {
	return cu.MemExportToShareableHandle(fd, h, 1, 0);
}
CUresult zct_cuMemImportFD(int fd, CUmemGenericAllocationHandle *h) {
	return cu.MemImportFromShareableHandle(h, (void *)(uintptr_t)fd, 1);
}
// Reserve a range, map the allocation, and give the device it lives on and
// the device that maps it (when another) access.
CUresult zct_cuMemMapOn(CUmemGenericAllocationHandle h, size_t size, size_t align, int resident, int mapping,
                        CUdeviceptr *p) {
	CUresult r = cu.MemAddressReserve(p, size, align, 0, 0);
	if (r != 0) return r;
	if ((r = cu.MemMap(*p, size, 0, h, 0)) != 0) {
		cu.MemAddressFree(*p, size);
		return r;
	}
	CUmemAccessDesc d[2];
	int n = 0;
	d[n].location.type = 1; // CU_MEM_LOCATION_TYPE_DEVICE
	d[n].location.id = resident;
	d[n++].flags = 3;       // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	if (mapping != resident) {
		d[n].location.type = 1;
		d[n].location.id = mapping;
		d[n++].flags = 3;
	}
	if ((r = cu.MemSetAccess(*p, size, d, n)) != 0) {
		cu.MemUnmap(*p, size);
		cu.MemAddressFree(*p, size);
	}
	return r;
}
CUresult zct_cuMemUnmapFree(CUdeviceptr p, size_t size) {
	CUresult r = cu.MemUnmap(p, size);
	CUresult f = cu.MemAddressFree(p, size);
	return r != 0 ? r : f;
}
