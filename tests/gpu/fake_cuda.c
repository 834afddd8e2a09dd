/*
 * A fake NVIDIA driver library for crishim's GPU tests: built by the tests as
 * libcuda.so.<version> (soname libcuda.so.1) into a fake driver root. There is no GPU: each
 * "device" is a /dev/nvidia<minor> character node (major 195) that the process can see, and
 * device memory is a per-process counter of FAKE_MEMORY bytes per device. It exports every
 * entry point crishim's interceptor hooks, cuGetProcAddress with the driver's _v2/_ptsz rules,
 * and names the interceptor does not know (cuFakeIdentify, cuFakeOwnTime and a data symbol,
 * cuFakeData), to show that they pass through.
 *
 * The device root is /dev, or $FAKE_NVIDIA_DEVICE_ROOT (the daemon's NVML probe runs on a
 * host whose fake nodes live in a temporary directory).
 *
 * What the fake NVML reports about processes' memory comes from here: each process with a
 * context keeps a file <state>/<pid>-<minor> ("<bytes held> <SM percent> <updated, ms> <start
 * time>"; the SM percent is its launch rate of the last 100 ms as a percent of FAKE_CAPACITY
 * blocks a second, which nothing reads any more), where <state> is $FAKE_NVIDIA_STATE or
 * /tmp/fake-nvidia. Processes in different containers see each other only if that directory
 * is shared, and their pids mean the same only in one pid namespace (tests give such pods the
 * host's). A context takes $FAKE_CUDA_CONTEXT_MIB MiB (default 0), as a real one takes a few
 * hundred. Memory pools keep freed memory up to their release threshold (default 0), in 2 MiB
 * steps. A graph's memory allocation nodes are mapped from the device's graph memory when the
 * graph is first launched or uploaded, and stay mapped to it (in use) across its launches, as
 * the real driver keeps them, until cuDeviceGraphMemTrim or its destruction; the graph memory
 * keeps what it holds until cuDeviceGraphMemTrim.
 *
 * GPU time is simulated: every device is one time-sliced GPU shared by every process using it
 * (<state>/gpu-<minor>.sim; see fake_common.h for the scheduler and the knobs kept there,
 * $FAKE_GPU_SLICE_US and $FAKE_NVML_SAMPLE_MS). Each process has one in-order queue a device
 * for all its streams (SIM_QUEUE items; a launch into a full queue waits for room, sleeping).
 * - Every launch (cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch,
 *   and their _ptsz) queues one kernel of ceil(blocks / $FAKE_CUDA_SMS) waves of
 *   $FAKE_CUDA_WAVE_US us (defaults 132 and 10; a graph's blocks are its kernels', child
 *   graphs' included), read from the launching process's environment. While
 *   $FAKE_CUDA_CAPTURING is set, launches and event records are only captured into a graph:
 *   nothing is queued.
 * - Events: cuEventRecord[WithFlags][_ptsz] queues a marker, done (with its time) when the GPU
 *   reaches it; cuEventQuery, cuEventSynchronize, cuEventElapsedTime[_v2] (ms between two done
 *   events; CUDA_ERROR_NOT_READY while either is pending, CUDA_ERROR_INVALID_HANDLE if either
 *   was never recorded or times nothing); an event never recorded is done.
 * - cuStreamSynchronize, cuStreamQuery and cuCtxSynchronize wait for (or ask about) the
 *   process's queue on the stream's (context's) device. Streams from cuStreamCreate name their
 *   device; the null and special streams are the current context's.
 * - cuFakeOwnTime(device, &ns): the GPU time this process's kernels have run on it, ns.
 * Where the state directory cannot hold the simulation, kernels take no time and markers are
 * done at once.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "fake_common.h"

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
#define CUDA_ERROR_OPERATING_SYSTEM 304
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600

#define FAKE_MEMORY (1ull << 30)
#define FAKE_CAPACITY 1000000ull
#define MAX_DEVICES 16
#define MAX_ALLOCS 4096
#define MAX_POOLS 32
#define POOL_STEP (2ull << 20)

EXPORT int cuFakeData = 0x5ca1ab1e;

static int initialized;
static int ndev;
static int minors[MAX_DEVICES];
static unsigned long long used[MAX_DEVICES];
/* The current device: cuCtxSetCurrent's on the thread that called it, as a real driver's is
 * per thread; elsewhere the one the process's last context was made on (a simplification that
 * lets a test's helper threads allocate without a context of their own). */
static int current_process = -1;
static __thread int current_thread = -2;
#define current (current_thread != -2 ? current_thread : current_process)
static unsigned long long next_ptr = 0x200000000ull;
/* pool: -1 for a plain allocation, else the index in pools[] it came from. */
static struct { unsigned long long key; unsigned long long size; int dev; int pool; } allocs[MAX_ALLOCS];
static struct { int used; int dev; unsigned long long reserved, live, threshold; } pools[MAX_POOLS];
static int contexts[MAX_DEVICES];
static int primary[MAX_DEVICES];
static unsigned long long window_start[MAX_DEVICES], window_blocks[MAX_DEVICES], sm[MAX_DEVICES];

static unsigned long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000 + (unsigned long long)t.tv_nsec / 1000000;
}

static const char *state_dir(void) { return fake_state_dir(); }

/* Publish this process's use of device `dev` for the fake NVML (nothing without a context). */
static void publish(int dev) {
    char path[4096], line[128];
    if (dev < 0 || dev >= MAX_DEVICES) return;
    snprintf(path, sizeof path, "%s/%d-%d", state_dir(), (int)getpid(), minors[dev]);
    if (contexts[dev] + primary[dev] == 0) {
        unlink(path);
        return;
    }
    if (mkdir(state_dir(), 0777) == 0 && chmod(state_dir(), 0777) != 0) {}
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return;
    int n = snprintf(line, sizeof line, "%llu %llu %llu %llu\n", used[dev], sm[dev], now_ms(), start_time(getpid()));
    if (write(fd, line, (size_t)n) < 0) {}
    close(fd);
}

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

/* A fresh device address for `size` bytes, with a 1 MiB gap after it. */
static unsigned long long new_address(unsigned long long size) {
    unsigned long long at = next_ptr;
    next_ptr += ((size + 0xfffff) & ~0xfffffull) + 0x100000;
    return at;
}

static unsigned long long record(unsigned long long size, int dev, int pool) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].key == 0) {
            allocs[i].key = new_address(size);
            allocs[i].size = size;
            allocs[i].dev = dev;
            allocs[i].pool = pool;
            if (pool < 0) used[dev] += size;
            return allocs[i].key;
        }
    }
    return 0;
}

/* A pool gives back what it reserves past max(live, keep). */
static void pool_shrink(int p, unsigned long long keep) {
    unsigned long long target = pools[p].live > keep ? pools[p].live : keep;
    if (target >= pools[p].reserved) return;
    target = (target + POOL_STEP - 1) / POOL_STEP * POOL_STEP;
    if (pools[p].reserved > target) {
        used[pools[p].dev] -= pools[p].reserved - target;
        pools[p].reserved = target;
    }
}

static CUresult release(unsigned long long key) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].key == key && key != 0) {
            int p = allocs[i].pool, dev = allocs[i].dev;
            if (p < 0) {
                used[dev] -= allocs[i].size;
            } else {
                pools[p].live -= allocs[i].size;
                pool_shrink(p, pools[p].threshold);
            }
            allocs[i].key = 0;
            publish(dev);
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
    *out = record(size, dev, -1);
    publish(dev);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Allocate from pool p, growing its reservation in POOL_STEPs when what it keeps is short. */
static CUresult pool_alloc(int p, unsigned long long size, unsigned long long *out) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (p < 0 || p >= MAX_POOLS || !pools[p].used || size == 0) return CUDA_ERROR_INVALID_VALUE;
    int dev = pools[p].dev;
    if (pools[p].live + size > pools[p].reserved) {
        unsigned long long grow = pools[p].live + size - pools[p].reserved;
        grow = (grow + POOL_STEP - 1) / POOL_STEP * POOL_STEP;
        if (used[dev] + grow > FAKE_MEMORY) return CUDA_ERROR_OUT_OF_MEMORY;
        used[dev] += grow;
        pools[p].reserved += grow;
    }
    *out = record(size, dev, p);
    if (!*out) return CUDA_ERROR_OUT_OF_MEMORY;
    pools[p].live += size;
    publish(dev);
    return CUDA_SUCCESS;
}

/* Pools are handles 0x9000 + index; index d < MAX_DEVICES is device d's default pool. */
static int pool_index(void *handle) {
    long i = (long)(intptr_t)handle - 0x9000;
    return i >= 0 && i < MAX_POOLS && pools[i].used ? (int)i : -1;
}

static void *default_pool(int dev) {
    if (!pools[dev].used) {
        pools[dev].used = 1;
        pools[dev].dev = dev;
    }
    return (void *)(intptr_t)(0x9000 + dev);
}

static unsigned long long context_bytes(void) {
    const char *m = getenv("FAKE_CUDA_CONTEXT_MIB");
    return m ? strtoull(m, NULL, 10) << 20 : 0;
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
/* A context takes context_bytes() on its device; the primary one once, however often retained. */
static CUresult make_context(CUcontext *ctx, CUdevice d, int is_primary) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    if (!is_primary || primary[d] == 0) {
        if (used[d] + context_bytes() > FAKE_MEMORY) return CUDA_ERROR_OUT_OF_MEMORY;
        used[d] += context_bytes();
    }
    if (is_primary) primary[d]++;
    else contexts[d]++;
    current_process = d;
    current_thread = -2;
    *ctx = (CUcontext)(intptr_t)(d + 1);
    publish(d);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice d) {
    (void)flags;
    return make_context(ctx, d, 0);
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) { return make_context(ctx, d, 1); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    int d = (int)(intptr_t)ctx - 1;
    if (d < 0 || d >= ndev || contexts[d] == 0) return CUDA_ERROR_INVALID_CONTEXT;
    contexts[d]--;
    used[d] -= context_bytes();
    publish(d);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (d < 0 || d >= ndev || primary[d] == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--primary[d] == 0) used[d] -= context_bytes();
    publish(d);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    current_thread = (int)(intptr_t)ctx - 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *d = current;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) {
    *ctx = current < 0 ? NULL : (CUcontext)(intptr_t)(current + 1);
    return CUDA_SUCCESS;
}
static void drain(int dev);
/* Waits until this process's queue on the current device is empty (the simulated GPU ran it). */
EXPORT CUresult cuCtxSynchronize(void) {
    if (current >= 0) drain(current);
    return CUDA_SUCCESS;
}

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
/* While every stream is being captured ($FAKE_CUDA_CAPTURING), an asynchronous allocation only
 * becomes a graph's allocation node: an address, no memory. */
static int captured(CUdeviceptr *p, size_t size) {
    if (!getenv("FAKE_CUDA_CAPTURING")) return 0;
    *p = new_address(size);
    return 1;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s) {
    (void)s;
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (captured(p, size)) return CUDA_SUCCESS;
    return pool_alloc(pool_index(default_pool(current)), size, p);
}
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

/* Memory pools, with CUmemPoolProps read as far as its location (as CUmemAllocationProp). */
EXPORT CUresult cuMemPoolCreate(void **pool, const CUmemAllocationProp *props) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (props->location.id < 0 || props->location.id >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    for (int i = MAX_DEVICES; i < MAX_POOLS; i++) {
        if (!pools[i].used) {
            memset(&pools[i], 0, sizeof pools[i]);
            pools[i].used = 1;
            pools[i].dev = props->location.id;
            *pool = (void *)(intptr_t)(0x9000 + i);
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuMemPoolDestroy(void *pool) {
    int p = pool_index(pool);
    if (p < MAX_DEVICES) return CUDA_ERROR_INVALID_VALUE;
    pool_shrink(p, 0);
    pools[p].used = 0;
    publish(pools[p].dev);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetDefaultMemPool(void **pool, CUdevice d) {
    if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *pool = default_pool(d);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetMemPool(void **pool, CUdevice d) { return cuDeviceGetDefaultMemPool(pool, d); }
/* CUmemPool_attribute: 4 release threshold, 5 reserved now, 7 used now. */
EXPORT CUresult cuMemPoolSetAttribute(void *pool, int attr, void *value) {
    int p = pool_index(pool);
    if (p < 0 || attr != 4) return CUDA_ERROR_INVALID_VALUE;
    pools[p].threshold = *(unsigned long long *)value;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolGetAttribute(void *pool, int attr, void *value) {
    int p = pool_index(pool);
    if (p < 0) return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case 4: *(unsigned long long *)value = pools[p].threshold; return CUDA_SUCCESS;
    case 5: *(unsigned long long *)value = pools[p].reserved; return CUDA_SUCCESS;
    case 7: *(unsigned long long *)value = pools[p].live; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}
EXPORT CUresult cuMemPoolTrimTo(void *pool, size_t keep) {
    int p = pool_index(pool);
    if (p < 0) return CUDA_ERROR_INVALID_VALUE;
    pool_shrink(p, keep);
    publish(pools[p].dev);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, void *pool, CUstream s) {
    (void)s;
    if (captured(p, size)) return CUDA_SUCCESS;
    return pool_alloc(pool_index(pool), size, p);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, void *pool, CUstream s) {
    return cuMemAllocFromPoolAsync(p, size, pool, s);
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return release(p); }
EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) { return release(p); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    (void)s;
    return getenv("FAKE_CUDA_CAPTURING") ? CUDA_SUCCESS : release(p);
}
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
/* A launch is work for the SM percent this process publishes, over 100 ms windows. */
static void publish_launch(int dev, unsigned long long blocks) {
    unsigned long long now = now_ms();
    window_blocks[dev] += blocks;
    if (window_start[dev] == 0) window_start[dev] = now;
    unsigned long long elapsed = now - window_start[dev];
    if (elapsed >= 100) {
        unsigned long long pct = window_blocks[dev] * 1000 / elapsed * 100 / FAKE_CAPACITY;
        sm[dev] = pct > 100 ? 100 : pct;
        window_start[dev] = now;
        window_blocks[dev] = 0;
        publish(dev);
    }
}

/* The simulated GPU (fake_common.h): this process's side. Each device's simulation is mapped
 * once per process (a forked child maps its own, and has no slot until it uses the GPU), and
 * taken under sim_mu, then its file lock (which does not exclude this process's threads). */
#define EVENT_MAGIC 0xe7e47e57u
#define EV_NONE 0
#define EV_PENDING 1
#define EV_DONE 2
#define CU_EVENT_DISABLE_TIMING 0x2
/* A CUevent: its last record's marker (device, sequence number), and once it is done, when. A
 * destroyed event stays allocated while markers in flight name it (refs). */
typedef struct {
    unsigned magic, flags;
    int state, dev, refs, destroyed;
    uint64_t seq, gen, stamp;
} fake_event;
/* A marker in flight for event e's record number gen. */
struct pending { fake_event *e; uint64_t gen, seq; };
static struct {
    struct sim *s;
    int fd, writable, slot;
    pid_t owner;
    uint64_t token;
    /* This process's markers in flight, in queue order: at most a queue's worth. */
    struct pending fifo[SIM_QUEUE];
    uint64_t fhead, ftail;
} sims[MAX_DEVICES];
static pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t sms, wave_ns;

static void nap(void) {
    struct timespec t = {0, 100000};
    nanosleep(&t, NULL);
}

static void settle(struct pending p, uint64_t stamp) {
    fake_event *e = p.e;
    e->refs--;
    if (p.gen == e->gen && e->state == EV_PENDING) {
        e->state = EV_DONE;
        e->stamp = stamp;
    }
    if (e->destroyed && e->refs == 0) {
        e->magic = 0;
        free(e);
    }
}

/* Every marker in flight on dev is done at `stamp` (its queue is gone). */
static void settle_all(int dev, uint64_t stamp) {
    while (sims[dev].fhead != sims[dev].ftail) settle(sims[dev].fifo[sims[dev].fhead++ % SIM_QUEUE], stamp);
}

/* Take device dev's simulation under sim_mu: mapped (created) if need be, locked, advanced to
 * now, and the events whose markers are done settled (before their queue items can be reused:
 * only this process queues on its slot, always after this). With `reg`, this process gets a slot
 * if it has none. Returns CUDA_SUCCESS holding the file lock, or an error holding nothing. */
static CUresult sim_enter(int dev, int reg) {
    pid_t me = getpid();
    if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_CONTEXT;
    if (sims[dev].owner != me) {
        if (sims[dev].s) sim_close(sims[dev].s, sims[dev].fd);
        settle_all(dev, sim_clock(CLOCK_MONOTONIC));
        sims[dev].s = NULL;
        sims[dev].slot = -1;
        sims[dev].owner = me;
    }
    if (!sims[dev].s) {
        sims[dev].s = sim_open(minors[dev], 1, &sims[dev].fd, &sims[dev].writable);
        if (sims[dev].s && !sims[dev].writable) {
            sim_close(sims[dev].s, sims[dev].fd);
            sims[dev].s = NULL;
        }
        if (!sims[dev].s) return CUDA_ERROR_OPERATING_SYSTEM;
    }
    struct sim *s = sims[dev].s;
    sim_lock(sims[dev].fd);
    uint64_t now = sim_clock(CLOCK_MONOTONIC);
    sim_advance(s, now);
    int i = sims[dev].slot;
    if (i >= 0 && (s->slots[i].token != sims[dev].token || s->slots[i].pid != (uint64_t)me)) {
        /* Taken for a process that was gone (seen from another pid namespace): start again. */
        settle_all(dev, now);
        i = sims[dev].slot = -1;
    }
    if (i >= 0) {
        struct sim_slot *c = &s->slots[i];
        while (sims[dev].fhead != sims[dev].ftail && sims[dev].fifo[sims[dev].fhead % SIM_QUEUE].seq < c->head) {
            struct pending p = sims[dev].fifo[sims[dev].fhead++ % SIM_QUEUE];
            settle(p, c->items[p.seq % SIM_QUEUE].value);
        }
    } else if (reg) {
        for (int pass = 0; pass < 2 && i < 0; pass++) {
            if (pass) sim_reap(s, now);
            for (int j = 0; j < SIM_SLOTS && i < 0; j++)
                if (!s->slots[j].pid) i = j;
        }
        if (i < 0) {
            sim_unlock(sims[dev].fd);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        struct sim_slot *c = &s->slots[i];
        memset(c, 0, sizeof *c - sizeof c->items);
        c->pid = (uint64_t)me;
        c->start = start_time(me);
        c->pidns = sim_pidns();
        c->token = sims[dev].token = ++s->tokens;
        sims[dev].slot = i;
    }
    return CUDA_SUCCESS;
}

static void sim_leave(int dev) { sim_unlock(sims[dev].fd); }

/* Queue a kernel of `ns` (or, with e, e's marker) on this process's queue for dev, waiting while
 * the queue is full as a driver waits for room in its pushbuffer. */
static CUresult enqueue(int dev, uint64_t kind, uint64_t ns, fake_event *e) {
    pthread_mutex_lock(&sim_mu);
    CUresult r = sim_enter(dev, 1);
    while (r == CUDA_SUCCESS) {
        struct sim_slot *c = &sims[dev].s->slots[sims[dev].slot];
        if (c->tail - c->head < SIM_QUEUE) break;
        sim_leave(dev);
        pthread_mutex_unlock(&sim_mu);
        nap();
        pthread_mutex_lock(&sim_mu);
        r = sim_enter(dev, 1);
    }
    if (r == CUDA_ERROR_OPERATING_SYSTEM) {
        /* No simulation to be had (the state directory is not writable): the kernel ran at once,
         * in no time, and the marker is done now. */
        if (e) {
            e->gen++;
            e->state = EV_DONE;
            e->dev = dev;
            e->stamp = sim_clock(CLOCK_MONOTONIC);
        }
        r = CUDA_SUCCESS;
    } else if (r == CUDA_SUCCESS) {
        struct sim_slot *c = &sims[dev].s->slots[sims[dev].slot];
        uint64_t seq = c->tail;
        c->items[seq % SIM_QUEUE] = (struct sim_item){kind, ns};
        c->tail++;
        if (e) {
            e->gen++;
            e->state = EV_PENDING;
            e->dev = dev;
            e->seq = seq;
            e->refs++;
            sims[dev].fifo[sims[dev].ftail++ % SIM_QUEUE] = (struct pending){e, e->gen, seq};
        }
        sim_leave(dev);
    }
    pthread_mutex_unlock(&sim_mu);
    return r;
}

/* Whether this process's queue on dev is empty (advancing the simulation to now); if not, how
 * long to wait before asking again: until its kernel running now ends, 20 to 100 us. */
static int drained(int dev, long *wait_ns) {
    int done = 1;
    *wait_ns = 100000;
    pthread_mutex_lock(&sim_mu);
    if (sims[dev].owner == getpid() && sims[dev].slot >= 0 && sim_enter(dev, 0) == CUDA_SUCCESS) {
        if (sims[dev].slot >= 0) {
            struct sim *s = sims[dev].s;
            struct sim_slot *c = &s->slots[sims[dev].slot];
            done = c->head == c->tail;
            if (!done && s->cur == (uint64_t)sims[dev].slot + 1 && c->items[c->head % SIM_QUEUE].kind == SIM_KERNEL) {
                uint64_t left = c->items[c->head % SIM_QUEUE].value;
                *wait_ns = left < 20000 ? 20000 : left > 100000 ? 100000 : (long)left;
            }
        }
        sim_leave(dev);
    }
    pthread_mutex_unlock(&sim_mu);
    return done;
}

static void drain(int dev) {
    long ns;
    while (!drained(dev, &ns)) {
        struct timespec t = {0, ns};
        nanosleep(&t, NULL);
    }
}

/* A fork must not copy sim_mu held; a process that exits gives its slots (and queued work) up. */
static void sim_prepare(void) { pthread_mutex_lock(&sim_mu); }
static void sim_resume(void) { pthread_mutex_unlock(&sim_mu); }
__attribute__((constructor)) static void sim_init(void) { pthread_atfork(sim_prepare, sim_resume, sim_resume); }
__attribute__((destructor)) static void sim_fini(void) {
    if (pthread_mutex_trylock(&sim_mu) != 0) return;
    for (int d = 0; d < MAX_DEVICES; d++) {
        if (!sims[d].s || sims[d].owner != getpid() || sims[d].slot < 0) continue;
        sim_lock(sims[d].fd);
        struct sim *s = sims[d].s;
        sim_advance(s, sim_clock(CLOCK_MONOTONIC));
        if (s->slots[sims[d].slot].token == sims[d].token) sim_free_slot(s, sims[d].slot);
        sim_unlock(sims[d].fd);
    }
    pthread_mutex_unlock(&sim_mu);
}

/* Streams are handles naming their device (all of a process's streams on it share one queue):
 * 0x5a<device><n>. Any other stream (0, the legacy or per-thread one) is the current device's. */
static int stream_dev(CUstream s) {
    uintptr_t v = (uintptr_t)s;
    if (v >> 24 == 0x5a && ((v >> 16) & 0xff) < (uintptr_t)ndev) return (int)((v >> 16) & 0xff);
    return current;
}

/* A kernel of `blocks` blocks takes ceil(blocks / $FAKE_CUDA_SMS) waves of $FAKE_CUDA_WAVE_US. */
static uint64_t kernel_ns(unsigned long long blocks) {
    if (!sms) {
        wave_ns = sim_env("FAKE_CUDA_WAVE_US", 1e3, 10000);
        sms = sim_env("FAKE_CUDA_SMS", 1, 132);
    }
    return (blocks + sms - 1) / sms * wave_ns;
}

/* A launch of `blocks` blocks on stream s: a kernel in the process's queue, unless every stream
 * is being captured ($FAKE_CUDA_CAPTURING), when it is only recorded into a graph. */
static CUresult launched(unsigned long long blocks, CUstream s) {
    int dev = stream_dev(s);
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    publish_launch(dev, blocks);
    if (getenv("FAKE_CUDA_CAPTURING")) return CUDA_SUCCESS;
    return enqueue(dev, SIM_KERNEL, kernel_ns(blocks), NULL);
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, CUstream s, void **params, void **extra) {
    (void)f; (void)bx; (void)by; (void)bz; (void)shared; (void)params; (void)extra;
    return launched((unsigned long long)gx * gy * gz, s);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shared, CUstream s, void **params, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shared, CUstream s, void **params) {
    (void)f; (void)bx; (void)by; (void)bz; (void)shared; (void)params;
    return launched((unsigned long long)gx * gy * gz, s);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shared, CUstream s, void **params) {
    return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, s, params);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)f; (void)params; (void)extra;
    return launched((unsigned long long)c->gx * c->gy * c->gz, c->stream);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    return cuLaunchKernelEx(c, f, params, extra);
}

/* Events: a record queues a marker, done when the GPU reaches it in the process's queue. */
static fake_event *event_of(void *h) {
    fake_event *e = h;
    return e && e->magic == EVENT_MAGIC && !e->destroyed ? e : NULL;
}
EXPORT CUresult cuEventCreate(fake_event **out, unsigned flags) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    fake_event *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = EVENT_MAGIC;
    e->flags = flags;
    e->dev = -1;
    *out = e;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(fake_event *h) {
    pthread_mutex_lock(&sim_mu);
    fake_event *e = event_of(h);
    if (e) {
        e->destroyed = 1;
        if (e->refs == 0) {
            e->magic = 0;
            free(e);
        }
    }
    pthread_mutex_unlock(&sim_mu);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
EXPORT CUresult cuEventDestroy(fake_event *h) { return cuEventDestroy_v2(h); }
/* While every stream is being captured, a record is a graph's node: the event is left as it was. */
EXPORT CUresult cuEventRecord(fake_event *h, CUstream s) {
    fake_event *e = event_of(h);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    int dev = stream_dev(s);
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (getenv("FAKE_CUDA_CAPTURING")) return CUDA_SUCCESS;
    return enqueue(dev, SIM_MARKER, 0, e);
}
EXPORT CUresult cuEventRecord_ptsz(fake_event *e, CUstream s) { return cuEventRecord(e, s); }
EXPORT CUresult cuEventRecordWithFlags(fake_event *e, CUstream s, unsigned flags) {
    (void)flags;
    return cuEventRecord(e, s);
}
EXPORT CUresult cuEventRecordWithFlags_ptsz(fake_event *e, CUstream s, unsigned flags) {
    return cuEventRecordWithFlags(e, s, flags);
}
/* Under sim_mu: settle e if its marker is done by now. */
static void event_poll(fake_event *e) {
    if (e->state != EV_PENDING) return;
    if (sim_enter(e->dev, 0) == CUDA_SUCCESS) sim_leave(e->dev);
}
EXPORT CUresult cuEventQuery(fake_event *h) {
    pthread_mutex_lock(&sim_mu);
    fake_event *e = event_of(h);
    CUresult r = CUDA_ERROR_INVALID_HANDLE;
    if (e) {
        event_poll(e);
        r = e->state == EV_PENDING ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_mu);
    return r;
}
EXPORT CUresult cuEventSynchronize(fake_event *h) {
    CUresult r;
    while ((r = cuEventQuery(h)) == CUDA_ERROR_NOT_READY) nap();
    return r;
}
EXPORT CUresult cuEventElapsedTime_v2(float *ms, fake_event *ha, fake_event *hb) {
    pthread_mutex_lock(&sim_mu);
    fake_event *a = event_of(ha), *b = event_of(hb);
    CUresult r = CUDA_ERROR_INVALID_HANDLE;
    if (a && b && ms) {
        event_poll(a);
        event_poll(b);
        if (a->state == EV_NONE || b->state == EV_NONE || ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
            r = CUDA_ERROR_INVALID_HANDLE;
        else if (a->state == EV_PENDING || b->state == EV_PENDING)
            r = CUDA_ERROR_NOT_READY;
        else {
            *ms = (float)(((double)b->stamp - (double)a->stamp) / 1e6);
            r = CUDA_SUCCESS;
        }
    } else if (a && b) {
        r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&sim_mu);
    return r;
}
EXPORT CUresult cuEventElapsedTime(float *ms, fake_event *a, fake_event *b) { return cuEventElapsedTime_v2(ms, a, b); }

/* Streams: handles on one queue a device. */
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    static unsigned n;
    (void)flags;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *s = (CUstream)(uintptr_t)(0x5a000000u | (unsigned)current << 16 | (++n & 0xffff));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    (void)s;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) {
    int dev = stream_dev(s);
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    drain(dev);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
EXPORT CUresult cuStreamQuery(CUstream s) {
    int dev = stream_dev(s);
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    long ns;
    return drained(dev, &ns) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuStreamQuery_ptsz(CUstream s) { return cuStreamQuery(s); }

/* Not in a real driver: this process's GPU time on device dev so far, ns (what it ran). */
EXPORT CUresult cuFakeOwnTime(CUdevice dev, unsigned long long *ns) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    if (!ns) return CUDA_ERROR_INVALID_VALUE;
    *ns = 0;
    pthread_mutex_lock(&sim_mu);
    if (sims[dev].owner == getpid() && sims[dev].slot >= 0 && sim_enter(dev, 0) == CUDA_SUCCESS) {
        if (sims[dev].slot >= 0) *ns = sims[dev].s->slots[sims[dev].slot].own_ns;
        sim_leave(dev);
    }
    pthread_mutex_unlock(&sim_mu);
    return CUDA_SUCCESS;
}

/* Graphs: enough for the interceptor to read a graph's kernels and memory nodes, and for a
 * launch to run them and map their memory. */
#define MAX_GRAPH_NODES 16
typedef struct fake_graph fake_graph;
/* blocks: a kernel's; bytes and dev: an allocation's, or a free's (of the allocation it frees). */
typedef struct { int type; unsigned long long blocks; fake_graph *child; unsigned long long bytes, ptr; int dev; } fake_node;
struct fake_graph { size_t n; fake_node nodes[MAX_GRAPH_NODES]; };
/* mem: bytes its allocation nodes map on each device; mapped: whether they are mapped now. */
typedef struct {
    unsigned long long blocks, mem[MAX_DEVICES];
    int mapped;
    /* The graph it was made from, and the blocks each of that graph's nodes runs in it. */
    const fake_graph *graph;
    unsigned long long node_blocks[MAX_GRAPH_NODES];
} fake_exec;
/* CUDA_KERNEL_NODE_PARAMS_v2. */
typedef struct { CUfunction func; unsigned gx, gy, gz, bx, by, bz, shared; void **params, **extra; void *kern, *ctx; } KernelNodeParams;
/* CUDA_MEM_ALLOC_NODE_PARAMS: CUmemPoolProps (88 bytes, a CUmemAllocationProp's head first), the
 * access descriptors, the size and the address. */
typedef struct { CUmemAllocationProp prop; void *win32; unsigned char rest[64]; const void *access; size_t naccess; size_t bytesize; CUdeviceptr dptr; } MemAllocNodeParams;
#define NODE_KERNEL 0
#define NODE_GRAPH 4
#define NODE_MEM_ALLOC 10
#define NODE_MEM_FREE 11
/* Each device's graph memory: what it holds from the device, and what graphs' allocations use. */
static unsigned long long graph_reserved[MAX_DEVICES], graph_live[MAX_DEVICES];

EXPORT CUresult cuGraphCreate(fake_graph **g, unsigned flags) {
    (void)flags;
    *g = calloc(1, sizeof **g);
    return *g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult add_node(fake_node **out, fake_graph *g, fake_node n) {
    if (g->n == MAX_GRAPH_NODES) return CUDA_ERROR_OUT_OF_MEMORY;
    g->nodes[g->n] = n;
    *out = &g->nodes[g->n++];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddKernelNode_v2(fake_node **out, fake_graph *g, void *deps, size_t ndeps,
                                        const KernelNodeParams *p) {
    (void)deps; (void)ndeps;
    return add_node(out, g, (fake_node){NODE_KERNEL, (unsigned long long)p->gx * p->gy * p->gz, NULL, 0, 0, 0});
}
EXPORT CUresult cuGraphAddChildGraphNode(fake_node **out, fake_graph *g, void *deps, size_t ndeps, fake_graph *child) {
    (void)deps; (void)ndeps;
    return add_node(out, g, (fake_node){NODE_GRAPH, 0, child, 0, 0, 0});
}
EXPORT CUresult cuGraphAddMemAllocNode(fake_node **out, fake_graph *g, void *deps, size_t ndeps, MemAllocNodeParams *p) {
    (void)deps; (void)ndeps;
    if (p->prop.location.type != 1 || p->prop.location.id < 0 || p->prop.location.id >= ndev || p->bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    p->dptr = new_address(p->bytesize);
    return add_node(out, g, (fake_node){NODE_MEM_ALLOC, 0, NULL, p->bytesize, p->dptr, p->prop.location.id});
}
EXPORT CUresult cuGraphAddMemFreeNode(fake_node **out, fake_graph *g, void *deps, size_t ndeps, CUdeviceptr ptr) {
    (void)deps; (void)ndeps;
    for (size_t i = 0; i < g->n; i++)
        if (g->nodes[i].type == NODE_MEM_ALLOC && g->nodes[i].ptr == ptr)
            return add_node(out, g, (fake_node){NODE_MEM_FREE, 0, NULL, g->nodes[i].bytes, ptr, g->nodes[i].dev});
    return CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuGraphMemAllocNodeGetParams(fake_node *n, MemAllocNodeParams *p) {
    if (n->type != NODE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->prop.type = 1;
    p->prop.location.type = 1;
    p->prop.location.id = n->dev;
    p->bytesize = n->bytes;
    p->dptr = n->ptr;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphGetNodes(fake_graph *g, fake_node **nodes, size_t *n) {
    if (nodes) {
        for (size_t i = 0; i < *n && i < g->n; i++) nodes[i] = &g->nodes[i];
        if (*n > g->n) *n = g->n;
    } else {
        *n = g->n;
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphNodeGetType(fake_node *n, int *type) { *type = n->type; return CUDA_SUCCESS; }
EXPORT CUresult cuGraphKernelNodeGetParams_v2(fake_node *n, KernelNodeParams *p) {
    if (n->type != NODE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->gx = (unsigned)n->blocks;
    p->gy = p->gz = p->bx = p->by = p->bz = 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphChildGraphNodeGetGraph(fake_node *n, fake_graph **g) {
    if (n->type != NODE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    *g = n->child;
    return CUDA_SUCCESS;
}
/* Add g's kernels' blocks and its memory nodes' bytes (child graphs included) to e. */
static void graph_cost(fake_exec *e, const fake_graph *g) {
    for (size_t i = 0; i < g->n; i++) {
        const fake_node *n = &g->nodes[i];
        switch (n->type) {
        case NODE_KERNEL: e->blocks += n->blocks; break;
        case NODE_GRAPH: graph_cost(e, n->child); break;
        case NODE_MEM_ALLOC: e->mem[n->dev] += n->bytes; break;
        }
    }
}
static unsigned long long blocks_of(const fake_graph *g) {
    fake_exec e;
    memset(&e, 0, sizeof e);
    graph_cost(&e, g);
    return e.blocks;
}
/* The graph memory e's allocations were mapped from is no longer in use. */
static void unmap_graph(fake_exec *e) {
    if (!e->mapped) return;
    for (int d = 0; d < ndev; d++) graph_live[d] -= e->mem[d];
    e->mapped = 0;
}
/* The instantiated graphs, for cuDeviceGraphMemTrim to unmap. */
#define MAX_EXECS 256
static fake_exec *execs[MAX_EXECS];
static void exec_of(fake_exec *e, const fake_graph *g) {
    unmap_graph(e);
    memset(e, 0, sizeof *e);
    graph_cost(e, g);
    e->graph = g;
    for (size_t i = 0; i < g->n; i++)
        e->node_blocks[i] = g->nodes[i].type == NODE_KERNEL ? g->nodes[i].blocks
                            : g->nodes[i].type == NODE_GRAPH ? blocks_of(g->nodes[i].child) : 0;
}
/* Node n of e's graph runs `blocks` blocks in e from now on. */
static CUresult set_node_blocks(fake_exec *e, const fake_node *n, int type, unsigned long long blocks) {
    if (n < e->graph->nodes || n >= e->graph->nodes + e->graph->n || n->type != type) return CUDA_ERROR_INVALID_VALUE;
    size_t i = (size_t)(n - e->graph->nodes);
    e->blocks = e->blocks - e->node_blocks[i] + blocks;
    e->node_blocks[i] = blocks;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(fake_exec *e, const fake_node *n, const KernelNodeParams *p) {
    return set_node_blocks(e, n, NODE_KERNEL, (unsigned long long)p->gx * p->gy * p->gz);
}
EXPORT CUresult cuGraphExecChildGraphNodeSetParams(fake_exec *e, const fake_node *n, const fake_graph *child) {
    return set_node_blocks(e, n, NODE_GRAPH, blocks_of(child));
}
EXPORT CUresult cuGraphInstantiateWithFlags(fake_exec **e, fake_graph *g, unsigned long long flags) {
    (void)flags;
    int slot = 0;
    while (slot < MAX_EXECS && execs[slot]) slot++;
    if (slot == MAX_EXECS || !(*e = calloc(1, sizeof **e))) return CUDA_ERROR_OUT_OF_MEMORY;
    execs[slot] = *e;
    exec_of(*e, g);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphExecUpdate_v2(fake_exec *e, fake_graph *g, void *info) {
    (void)info;
    exec_of(e, g);
    return CUDA_SUCCESS;
}
/* Map what e's allocation nodes need from each device's graph memory, growing it where what it
 * holds unused is short; nothing where they are mapped already. */
static CUresult map_graph(fake_exec *e) {
    if (e->mapped) return CUDA_SUCCESS;
    for (int d = 0; d < ndev; d++) {
        unsigned long long unused = graph_reserved[d] - graph_live[d];
        if (e->mem[d] > unused && used[d] + (e->mem[d] - unused) > FAKE_MEMORY) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int d = 0; d < ndev; d++) {
        unsigned long long unused = graph_reserved[d] - graph_live[d];
        if (e->mem[d] > unused) {
            used[d] += e->mem[d] - unused;
            graph_reserved[d] += e->mem[d] - unused;
            publish(d);
        }
        graph_live[d] += e->mem[d];
    }
    e->mapped = 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphUpload(fake_exec *e, CUstream s) { (void)s; return map_graph(e); }
EXPORT CUresult cuGraphLaunch(fake_exec *e, CUstream s) {
    CUresult r = map_graph(e);
    if (r != CUDA_SUCCESS) return r;
    return launched(e->blocks, s);
}
EXPORT CUresult cuGraphLaunch_ptsz(fake_exec *e, CUstream s) { return cuGraphLaunch(e, s); }
/* CUgraphMem_attribute: 0 used now, 2 reserved now. */
EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice d, int attr, void *value) {
    if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
    case 0: *(unsigned long long *)value = graph_live[d]; return CUDA_SUCCESS;
    case 2: *(unsigned long long *)value = graph_reserved[d]; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}
/* Every graph here has finished running: trimming unmaps them all. */
EXPORT CUresult cuDeviceGraphMemTrim(CUdevice d) {
    if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    for (int i = 0; i < MAX_EXECS; i++)
        if (execs[i] && execs[i]->mem[d]) unmap_graph(execs[i]);
    used[d] -= graph_reserved[d] - graph_live[d];
    graph_reserved[d] = graph_live[d];
    publish(d);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphExecDestroy(fake_exec *e) {
    for (int i = 0; i < MAX_EXECS; i++)
        if (execs[i] == e) execs[i] = NULL;
    unmap_graph(e);
    free(e);
    return CUDA_SUCCESS;
}

/* Every stream is being captured into a graph while $FAKE_CUDA_CAPTURING is set. */
EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status) {
    (void)s;
    *status = getenv("FAKE_CUDA_CAPTURING") ? 1 : 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status) { return cuStreamIsCapturing(s, status); }

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
    {"cuDevicePrimaryCtxRelease_v2", (void *)cuDevicePrimaryCtxRelease_v2},
    {"cuCtxDestroy_v2", (void *)cuCtxDestroy_v2},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
    {"cuCtxGetDevice", (void *)cuCtxGetDevice},
    {"cuCtxSynchronize", (void *)cuCtxSynchronize},
    {"cuCtxGetCurrent", (void *)cuCtxGetCurrent},
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
    {"cuMemPoolSetAttribute", (void *)cuMemPoolSetAttribute},
    {"cuMemPoolGetAttribute", (void *)cuMemPoolGetAttribute},
    {"cuMemPoolTrimTo", (void *)cuMemPoolTrimTo},
    {"cuDeviceGetDefaultMemPool", (void *)cuDeviceGetDefaultMemPool},
    {"cuDeviceGetMemPool", (void *)cuDeviceGetMemPool},
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
    {"cuLaunchKernelEx_ptsz", (void *)cuLaunchKernelEx_ptsz},
    {"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel},
    {"cuLaunchCooperativeKernel_ptsz", (void *)cuLaunchCooperativeKernel_ptsz},
    {"cuEventCreate", (void *)cuEventCreate},
    {"cuEventDestroy", (void *)cuEventDestroy},
    {"cuEventDestroy_v2", (void *)cuEventDestroy_v2},
    {"cuEventRecord", (void *)cuEventRecord},
    {"cuEventRecord_ptsz", (void *)cuEventRecord_ptsz},
    {"cuEventRecordWithFlags", (void *)cuEventRecordWithFlags},
    {"cuEventRecordWithFlags_ptsz", (void *)cuEventRecordWithFlags_ptsz},
    {"cuEventQuery", (void *)cuEventQuery},
    {"cuEventSynchronize", (void *)cuEventSynchronize},
    {"cuEventElapsedTime", (void *)cuEventElapsedTime},
    {"cuEventElapsedTime_v2", (void *)cuEventElapsedTime_v2},
    {"cuStreamCreate", (void *)cuStreamCreate},
    {"cuStreamDestroy_v2", (void *)cuStreamDestroy_v2},
    {"cuStreamSynchronize", (void *)cuStreamSynchronize},
    {"cuStreamSynchronize_ptsz", (void *)cuStreamSynchronize_ptsz},
    {"cuStreamQuery", (void *)cuStreamQuery},
    {"cuStreamQuery_ptsz", (void *)cuStreamQuery_ptsz},
    {"cuGraphCreate", (void *)cuGraphCreate},
    {"cuGraphAddKernelNode_v2", (void *)cuGraphAddKernelNode_v2},
    {"cuGraphAddChildGraphNode", (void *)cuGraphAddChildGraphNode},
    {"cuGraphGetNodes", (void *)cuGraphGetNodes},
    {"cuGraphNodeGetType", (void *)cuGraphNodeGetType},
    {"cuGraphKernelNodeGetParams_v2", (void *)cuGraphKernelNodeGetParams_v2},
    {"cuGraphChildGraphNodeGetGraph", (void *)cuGraphChildGraphNodeGetGraph},
    {"cuGraphAddMemAllocNode", (void *)cuGraphAddMemAllocNode},
    {"cuGraphAddMemFreeNode", (void *)cuGraphAddMemFreeNode},
    {"cuGraphMemAllocNodeGetParams", (void *)cuGraphMemAllocNodeGetParams},
    {"cuGraphUpload", (void *)cuGraphUpload},
    {"cuGraphExecKernelNodeSetParams_v2", (void *)cuGraphExecKernelNodeSetParams_v2},
    {"cuGraphExecChildGraphNodeSetParams", (void *)cuGraphExecChildGraphNodeSetParams},
    {"cuDeviceGetGraphMemAttribute", (void *)cuDeviceGetGraphMemAttribute},
    {"cuDeviceGraphMemTrim", (void *)cuDeviceGraphMemTrim},
    {"cuGraphInstantiateWithFlags", (void *)cuGraphInstantiateWithFlags},
    {"cuGraphLaunch", (void *)cuGraphLaunch},
    {"cuGraphLaunch_ptsz", (void *)cuGraphLaunch_ptsz},
    {"cuGraphExecUpdate_v2", (void *)cuGraphExecUpdate_v2},
    {"cuStreamIsCapturing", (void *)cuStreamIsCapturing},
    {"cuStreamIsCapturing_ptsz", (void *)cuStreamIsCapturing_ptsz},
    {"cuGraphExecDestroy", (void *)cuGraphExecDestroy},
    {"cuGetProcAddress", (void *)cuGetProcAddress},
    {"cuFakeIdentify", (void *)cuFakeIdentify},
    {"cuFakeOwnTime", (void *)cuFakeOwnTime},
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
