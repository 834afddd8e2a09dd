/*
 * A fake NVIDIA driver library for crishim's GPU tests: built by the tests as
 * libcuda.so.<version> (soname libcuda.so.1) into a fake driver root. There is no GPU: each
 * "device" is a /dev/nvidia<minor> character node (major 195) that the process can see, and
 * device memory is a per-process counter of FAKE_MEMORY bytes per device. It exports every
 * entry point crishim's interceptor hooks, cuGetProcAddress with the driver's _v2/_ptsz rules,
 * and two names the interceptor does not know (a function and a data symbol), to show that
 * they pass through.
 *
 * The device root is /dev, or $FAKE_NVIDIA_DEVICE_ROOT (the daemon's NVML probe runs on a
 * host whose fake nodes live in a temporary directory).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUfunction;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { unsigned char bytes[16]; } CUuuid;
typedef struct { int type; int id; } CUmemLocation;
typedef struct { int type; int requestedHandleTypes; CUmemLocation location; } CUmemAllocationProp;
typedef struct { unsigned gx, gy, gz, bx, by, bz, shared; CUstream stream; void *attrs; unsigned nattrs; } CUlaunchConfig;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_NOT_FOUND 500

#define FAKE_MEMORY (1ull << 30)
#define MAX_DEVICES 16
#define MAX_ALLOCS 4096

EXPORT int cuFakeData = 0x5ca1ab1e;

static int initialized;
static int ndev;
static int minors[MAX_DEVICES];
static unsigned long long used[MAX_DEVICES];
static int current = -1;
static unsigned long long next_ptr = 0x200000000ull;
static struct { unsigned long long key; unsigned long long size; int dev; } allocs[MAX_ALLOCS];

static const char *device_root(void) {
    const char *r = getenv("FAKE_NVIDIA_DEVICE_ROOT");
    return r && *r ? r : "/dev";
}

static void enumerate(void) {
    char path[4096];
    struct stat st;
    ndev = 0;
    for (int m = 0; m < 255 && ndev < MAX_DEVICES; m++) {
        snprintf(path, sizeof path, "%s/nvidia%d", device_root(), m);
        if (stat(path, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == 195)
            minors[ndev++] = m;
    }
}

static CUuuid uuid_of(int minor) {
    /* GPU-c0ffee00-0000-4000-8000-0000000000MM */
    CUuuid u = {{0xc0, 0xff, 0xee, 0x00, 0x00, 0x00, 0x40, 0x00, 0x80, 0x00, 0, 0, 0, 0, 0, 0}};
    u.bytes[15] = (unsigned char)minor;
    return u;
}

static unsigned long long record(unsigned long long size, int dev) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].key == 0) {
            allocs[i].key = next_ptr;
            allocs[i].size = size;
            allocs[i].dev = dev;
            used[dev] += size;
            next_ptr += (size + 0xfffff) & ~0xfffffull;
            next_ptr += 0x100000;
            return allocs[i].key;
        }
    }
    return 0;
}

static CUresult release(unsigned long long key) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].key == key && key != 0) {
            used[allocs[i].dev] -= allocs[i].size;
            allocs[i].key = 0;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult alloc_on(int dev, unsigned long long size, unsigned long long *out) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_CONTEXT;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (used[dev] + size > FAKE_MEMORY) return CUDA_ERROR_OUT_OF_MEMORY;
    *out = record(size, dev);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuInit(unsigned int flags) {
    (void)flags;
    enumerate();
    initialized = 1;
    return ndev ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

EXPORT CUresult cuDriverGetVersion(int *v) { *v = 12040; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *n) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    *n = ndev;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    snprintf(name, len, "Fake GPU %d", d);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *u = uuid_of(minors[d]);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = FAKE_MEMORY;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice d) {
    if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (unsigned int)FAKE_MEMORY;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice d) {
    (void)flags;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    current = d;
    *ctx = (CUcontext)(intptr_t)(d + 1);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) { return cuCtxCreate_v2(ctx, 0, d); }
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    current = (int)(intptr_t)ctx - 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *d = current;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) { return alloc_on(current, size, p); }
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned int size) {
    unsigned long long out = 0;
    CUresult r = alloc_on(current, size, &out);
    if (r == CUDA_SUCCESS) *p = (CUdeviceptr_v1)out;
    return r;
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int elem) {
    (void)elem;
    *pitch = (w + 511) & ~(size_t)511;
    return alloc_on(current, (unsigned long long)*pitch * h, p);
}
EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *p, unsigned int *pitch, unsigned int w, unsigned int h, unsigned int elem) {
    size_t pt = 0;
    CUdeviceptr out = 0;
    CUresult r = cuMemAllocPitch_v2(&out, &pt, w, h, elem);
    if (r == CUDA_SUCCESS) { *p = (CUdeviceptr_v1)out; *pitch = (unsigned int)pt; }
    return r;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags) { (void)flags; return alloc_on(current, size, p); }
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s) { (void)s; return alloc_on(current, size, p); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream s) { return cuMemAllocAsync(p, size, s); }
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) {
    (void)flags;
    return alloc_on(prop->location.id, size, h);
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return release(h); }

/* Arrays: CUDA_ARRAY_DESCRIPTOR and CUDA_ARRAY3D_DESCRIPTOR (_v2); their size as the interceptor
 * counts it (elements x channels x format size), with no padding. */
typedef struct { size_t w, h; unsigned int format, channels; } ArrayDesc;
typedef struct { size_t w, h, d; unsigned int format, channels, flags; } Array3DDesc;
static size_t element_size(unsigned int f) {
    switch (f) {
    case 0x01: case 0x08: return 1;
    case 0x02: case 0x09: case 0x10: return 2;
    default: return 4;
    }
}
EXPORT CUresult cuArrayCreate_v2(unsigned long long *a, const ArrayDesc *d) {
    size_t h = d->h ? d->h : 1;
    return alloc_on(current, d->w * h * d->channels * element_size(d->format), a);
}
EXPORT CUresult cuArray3DCreate_v2(unsigned long long *a, const Array3DDesc *d) {
    size_t h = d->h ? d->h : 1, depth = d->d ? d->d : 1;
    return alloc_on(current, d->w * h * depth * d->channels * element_size(d->format), a);
}
EXPORT CUresult cuArrayDestroy(unsigned long long a) { return release(a); }
EXPORT CUresult cuMipmappedArrayCreate(unsigned long long *a, const Array3DDesc *d, unsigned int levels) {
    unsigned long long total = 0;
    for (unsigned int l = 0; l < levels && l < 32; l++) {
        size_t w = d->w >> l ? d->w >> l : 1;
        size_t h = d->h ? (d->h >> l ? d->h >> l : 1) : 1;
        size_t depth = d->d ? (d->d >> l ? d->d >> l : 1) : 1;
        total += (unsigned long long)w * h * depth * d->channels * element_size(d->format);
    }
    return alloc_on(current, total, a);
}
EXPORT CUresult cuMipmappedArrayDestroy(unsigned long long a) { return release(a); }

/* Memory pools: one fake pool handle; allocations from it land on the current device. */
EXPORT CUresult cuMemPoolCreate(void **pool, const void *props) { (void)props; *pool = (void *)0x9001; return CUDA_SUCCESS; }
EXPORT CUresult cuMemPoolDestroy(void *pool) { (void)pool; return CUDA_SUCCESS; }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, void *pool, CUstream s) {
    (void)pool; (void)s;
    return alloc_on(current, size, p);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, void *pool, CUstream s) {
    return cuMemAllocFromPoolAsync(p, size, pool, s);
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return release(p); }
EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) { return release(p); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return release(p); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }
EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *free = FAKE_MEMORY - used[current];
    *total = FAKE_MEMORY;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total) {
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) { *free = (unsigned int)f; *total = (unsigned int)t; }
    return r;
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, CUstream s, void **params, void **extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)s; (void)params; (void)extra;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shared, CUstream s, void **params, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)c; (void)f; (void)params; (void)extra;
    return CUDA_SUCCESS;
}

/* Not hooked by the interceptor: must reach the application untouched. */
EXPORT int cuFakeIdentify(void) { return 0x5ca1ab1e; }

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);

static const struct { const char *name; void *fn; } TABLE[] = {
    {"cuInit", (void *)cuInit},
    {"cuDriverGetVersion", (void *)cuDriverGetVersion},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount},
    {"cuDeviceGet", (void *)cuDeviceGet},
    {"cuDeviceGetName", (void *)cuDeviceGetName},
    {"cuDeviceGetUuid", (void *)cuDeviceGetUuid},
    {"cuDeviceGetUuid_v2", (void *)cuDeviceGetUuid_v2},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem},
    {"cuDeviceTotalMem_v2", (void *)cuDeviceTotalMem_v2},
    {"cuCtxCreate_v2", (void *)cuCtxCreate_v2},
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
    {"cuCtxGetDevice", (void *)cuCtxGetDevice},
    {"cuCtxSynchronize", (void *)cuCtxSynchronize},
    {"cuMemAlloc", (void *)cuMemAlloc},
    {"cuMemAlloc_v2", (void *)cuMemAlloc_v2},
    {"cuMemAllocPitch", (void *)cuMemAllocPitch},
    {"cuMemAllocPitch_v2", (void *)cuMemAllocPitch_v2},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync},
    {"cuMemAllocAsync_ptsz", (void *)cuMemAllocAsync_ptsz},
    {"cuMemCreate", (void *)cuMemCreate},
    {"cuMemRelease", (void *)cuMemRelease},
    {"cuMemPoolCreate", (void *)cuMemPoolCreate},
    {"cuMemPoolDestroy", (void *)cuMemPoolDestroy},
    {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync},
    {"cuMemAllocFromPoolAsync_ptsz", (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuArrayCreate_v2", (void *)cuArrayCreate_v2},
    {"cuArray3DCreate_v2", (void *)cuArray3DCreate_v2},
    {"cuArrayDestroy", (void *)cuArrayDestroy},
    {"cuMipmappedArrayCreate", (void *)cuMipmappedArrayCreate},
    {"cuMipmappedArrayDestroy", (void *)cuMipmappedArrayDestroy},
    {"cuMemFree", (void *)cuMemFree},
    {"cuMemFree_v2", (void *)cuMemFree_v2},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync},
    {"cuMemFreeAsync_ptsz", (void *)cuMemFreeAsync_ptsz},
    {"cuMemGetInfo", (void *)cuMemGetInfo},
    {"cuMemGetInfo_v2", (void *)cuMemGetInfo_v2},
    {"cuLaunchKernel", (void *)cuLaunchKernel},
    {"cuLaunchKernel_ptsz", (void *)cuLaunchKernel_ptsz},
    {"cuLaunchKernelEx", (void *)cuLaunchKernelEx},
    {"cuGetProcAddress", (void *)cuGetProcAddress},
    {"cuFakeIdentify", (void *)cuFakeIdentify},
};

static void *find(const char *name) {
    for (size_t i = 0; i < sizeof TABLE / sizeof TABLE[0]; i++)
        if (strcmp(TABLE[i].name, name) == 0) return TABLE[i].fn;
    return NULL;
}

/* The driver's rules: an un-suffixed name means its _v2 from CUDA 3.2 on (for those that have
 * one) and its _ptsz with the per-thread default stream flag. */
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    char name[256];
    void *fn = NULL;
    if (flags & 2) {
        snprintf(name, sizeof name, "%s_ptsz", symbol);
        fn = find(name);
    }
    if (!fn && version >= 3020) {
        snprintf(name, sizeof name, "%s_v2", symbol);
        fn = find(name);
    }
    if (!fn) fn = find(symbol);
    *pfn = fn;
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    CUresult r = cuGetProcAddress(symbol, pfn, version, flags);
    if (status) *status = r == CUDA_SUCCESS ? 0 : 1;
    return r;
}
