/* The CUDA driver, reached through pointers found with dlsym: the types
   zctipc uses (as the driver API defines them) and trampolines to the entry
   points. */
#ifndef ZCTIPC_CUDA_DRIVER_H
#define ZCTIPC_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

// Nothing here is part of libzctipc's ABI.
#pragma GCC visibility push(hidden)

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef uint64_t CUmemGenericAllocationHandle;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { char reserved[64]; } CUipcEventHandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;


/* zct_cuda_load opens the driver at path and finds every entry point: NULL,
   or what went wrong. */
const char *zct_cuda_load(const char *path);
const char *zct_cuErrorString(CUresult r);
CUresult zct_cuInit(void);
CUresult zct_cuDriverGetVersion(int *v);
CUresult zct_cuDeviceGetCount(int *n);
CUresult zct_cuPrimaryCtx(int ordinal, CUcontext *ctx);
CUresult zct_cuCtxGetCurrent(CUcontext *ctx);
CUresult zct_cuCtxSetCurrent(CUcontext ctx);
CUresult zct_cuPointerDevice(CUdeviceptr p, int *ordinal);
CUresult zct_cuAddressRange(CUdeviceptr p, CUdeviceptr *base, size_t *size);
CUresult zct_cuIpcGetMemHandle(CUdeviceptr p, void *out);
CUresult zct_cuIpcOpenMemHandle(const void *h, CUdeviceptr *p);
CUresult zct_cuIpcCloseMemHandle(CUdeviceptr p);
CUresult zct_cuEventCreateShared(void *out, uintptr_t *event);
CUresult zct_cuEventRecord(uintptr_t ev, uintptr_t stream);
CUresult zct_cuEventDestroy(uintptr_t ev);
CUresult zct_cuIpcOpenEvent(const void *h, uintptr_t *event);
CUresult zct_cuStreamWaitEvent(uintptr_t stream, uintptr_t ev);
CUresult zct_cuGranularity(int ordinal, size_t *g);
CUresult zct_cuMemCreate(int ordinal, size_t size, CUmemGenericAllocationHandle *h);
CUresult zct_cuMemGetInfo(size_t *free, size_t *total);
CUresult zct_cuCtxSynchronize(void);
CUresult zct_cuDeviceAttribute(int ordinal, int attribute, int *value);
CUresult zct_cuMemRelease(CUmemGenericAllocationHandle h);
CUresult zct_cuMemExportFD(CUmemGenericAllocationHandle h, int *fd);
CUresult zct_cuMemImportFD(int fd, CUmemGenericAllocationHandle *h);
CUresult zct_cuMemMapOn(CUmemGenericAllocationHandle h, size_t size, size_t align, int resident, int mapping,
                        CUdeviceptr *p);
CUresult zct_cuMemUnmapFree(CUdeviceptr p, size_t size);


#pragma GCC visibility pop

#endif
