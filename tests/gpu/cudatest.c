/*
 * crishim's GPU test program. Runs in a container and uses the driver the way a CUDA
 * application (or the CUDA runtime) does: dlopen("libcuda.so.1"), dlsym on that handle, and
 * cuGetProcAddress for the rest. Every result is printed as "<what> <values...>" lines.
 *
 *   cudatest info                   devices, UUIDs, cuMemGetInfo (both ways), cuDeviceTotalMem
 *   cudatest alloc MIB...           one allocation each, alternating dlsym'd cuMemAlloc_v2 and
 *                                   cuGetProcAddress("cuMemAlloc"); prints each result code
 *   cudatest hold MIB SECONDS       allocate, print "hold <rc>", sleep
 *   cudatest cycle MIB N            allocate and free N times
 *   cudatest create MIB             cuMemCreate on device 0, then cuMemRelease
 *   cudatest passthrough            a function and a data symbol the interceptor does not hook
 *   cudatest nvml                   nvmlDeviceGetMemoryInfo of device 0
 *   cudatest arrays MIB1 MIB2       a 2D float array of MIB1 (cuArrayCreate_v2 by dlsym), a 3D one
 *                                   of MIB2 (cuArray3DCreate by cuGetProcAddress), the 2D one
 *                                   destroyed, the 3D one again, then mipmapped arrays of 220 MiB
 *                                   with 2 levels and 1 (cuMipmappedArrayCreate); prints each
 *                                   result code
 *   cudatest pool MIB1 MIB2         from a memory pool: MIB1 by dlsym'd cuMemAllocFromPoolAsync,
 *                                   MIB2 through cuGetProcAddress, the first freed
 *                                   (cuMemFreeAsync), MIB2 again; prints each result code
 *   cudatest poolkeep MIB           a pool that keeps freed memory (release threshold: all): MIB
 *                                   allocated and freed, then a plain 100 MiB allocation, MIB
 *                                   from the pool again and freed, the pool trimmed, a plain
 *                                   100 MiB again; then cuMemAllocAsync (the device's pool) of
 *                                   200 MiB and of 100 MiB; prints each result code
 *   cudatest graphmem MIB1 MIB2     a graph that allocates MIB1 (a memory allocation node) and
 *                                   frees it (a free node): launched, then a plain MIB2
 *                                   allocation, launched again, the graph memory trimmed, MIB2
 *                                   again (held), the graph launched and uploaded once more;
 *                                   prints each result code; with $CUDATEST_ATTRS set, also
 *                                   the device's graph memory in use and reserved after each
 *   cudatest graphshare MIB         two graphs that each allocate and free MIB, launched one
 *                                   after the other on one stream, then the first again, then
 *                                   the graph memory trimmed: prints the graph memory in use and
 *                                   reserved after each (a real GPU's behaviour, for reading)
 *   cudatest asyncalloc MIB         cuMemAllocAsync on the default stream and cuMemFreeAsync
 *   cudatest procs                  NVML's compute processes on device 0 (_v3 and v1): how many,
 *                                   and whether this process is among them (with $CUDATEST_PIDS
 *                                   set, every pid)
 *   cudatest util                   NVML's utilization of device 0, the whole device's
 *   cudatest burn SECONDS BLOCKS    launch kernels of BLOCKS blocks without pause; prints
 *                                   "burn P": this process's share of the fake GPU's time in
 *                                   the second half, percent (the GPU time the fake driver's
 *                                   cuFakeOwnTime counts, over the wall time). With
 *                                   $CUDATEST_WINDOWS set, also "window I S" for each whole
 *                                   second I from the start (0, 1, ...): the share in it, with
 *                                   one decimal (a thread reads cuFakeOwnTime once a second);
 *                                   with $CUDATEST_PTX, "window I B": the blocks a second that
 *                                   second ran.
 *                                   With $FAKE_CUDA_CAPTURING set (launches only recorded into
 *                                   a graph, no GPU time), P is the launch rate of the second
 *                                   half as a percent of 1,000,000 blocks a second instead.
 *                                   With $CUDATEST_PTX set (a real GPU), each launch runs a
 *                                   kernel whose blocks spin that many iterations and is
 *                                   waited for, and the rate is printed as blocks a second
 *                                   instead. With $CUDATEST_COOP set, the
 *                                   launches are cuLaunchCooperativeKernel's; with
 *                                   $CUDATEST_GRAPH set, each is a cuGraphLaunch of a graph
 *                                   holding one block in a kernel node and the rest in a
 *                                   kernel node of a child graph ($CUDATEST_GRAPH=update:
 *                                   instantiated from the same shape with a block a node, then
 *                                   updated to it with cuGraphExecUpdate; =setparams and
 *                                   =setchild: its kernel node and child graph node given the
 *                                   real grid and child with
 *                                   cuGraphExec{Kernel,ChildGraph}NodeSetParams, setparams with
 *                                   all but one block in the outer kernel)
 *   cudatest busy SECONDS BLOCKS    burn, but each launch is waited for (cuCtxSynchronize):
 *                                   one kernel in flight at a time; prints "busy P" (and the
 *                                   same windows)
 *   cudatest forks N                fork N children while a thread allocates and frees without
 *                                   pause; each child asks for its memory info and exits; the
 *                                   first still running after 2 s is killed, counted as hung,
 *                                   and ends the run
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { int type; int requestedHandleTypes; struct { int type; int id; } location; void *win32; unsigned char flags[8]; } Prop;

/* CUDA_KERNEL_NODE_PARAMS_v2. */
typedef struct { void *func; unsigned gx, gy, gz, bx, by, bz, shared; void **params, **extra; void *kern, *ctx; } KernelNodeParams;

static void *cuda;
static CUresult (*getproc)(const char *, void **, int, unsigned long long);

static void *sym(const char *name);

/* burn's graph: a kernel node of `outer` blocks, and a child graph with one of `inner`; the
 * kernel node and the child graph node are stored where `nodes` points, if not null. */
static CUresult burn_graph(void **graph, void *fn, void **params, unsigned inner, unsigned outer, void **nodes) {
    CUresult (*create)(void **, unsigned) = sym("cuGraphCreate");
    CUresult (*add_kernel)(void **, void *, void *, size_t, void *) = sym("cuGraphAddKernelNode_v2");
    CUresult (*add_child)(void **, void *, void *, size_t, void *) = sym("cuGraphAddChildGraphNode");
    KernelNodeParams k =
        {fn, inner, 1, 1, 1, 1, 1, 0, params, NULL, NULL, NULL};
    void *child = NULL, *node = NULL;
    CUresult r = create(graph, 0);
    if (r == 0) r = create(&child, 0);
    if (r == 0) r = add_kernel(&node, child, NULL, 0, &k);
    k.gx = outer;
    if (r == 0) r = add_kernel(&node, *graph, NULL, 0, &k);
    if (r == 0 && nodes) nodes[0] = node;
    if (r == 0) r = add_child(&node, *graph, NULL, 0, child);
    if (r == 0 && nodes) nodes[1] = node;
    return r;
}

static void *proc(const char *name);
static void device0(void *prop);

/* Device 0's graph memory: in use (CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) and reserved, in MiB. */
static void graph_attrs(const char *when) {
    CUresult (*get)(int, int, void *) = sym("cuDeviceGetGraphMemAttribute");
    unsigned long long used = 0, reserved = 0;
    get(0, 0, &used);
    get(0, 2, &reserved);
    printf("attrs %s used %llu reserved %llu\n", when, used >> 20, reserved >> 20);
}

/* graphmem's graph, instantiated: an allocation of `mib` on device 0, then its free. */
static CUresult alloc_graph(void **exec, size_t mib) {
    CUresult (*create)(void **, unsigned) = sym("cuGraphCreate");
    CUresult (*add_alloc)(void **, void *, void **, size_t, void *) = sym("cuGraphAddMemAllocNode");
    CUresult (*add_free)(void **, void *, void **, size_t, CUdeviceptr) = sym("cuGraphAddMemFreeNode");
    CUresult (*instantiate)(void **, void *, unsigned long long) = sym("cuGraphInstantiateWithFlags");
    /* CUDA_MEM_ALLOC_NODE_PARAMS: CUmemPoolProps (88 bytes), access descriptors, size, address. */
    struct { unsigned char props[88]; const void *access; size_t naccess; size_t bytesize; CUdeviceptr dptr; } p;
    memset(&p, 0, sizeof p);
    device0(p.props);
    p.bytesize = mib << 20;
    void *graph = NULL, *alloc_node = NULL, *free_node = NULL;
    CUresult r = create(&graph, 0);
    if (r == 0) r = add_alloc(&alloc_node, graph, NULL, 0, &p);
    if (r == 0) r = add_free(&free_node, graph, &alloc_node, 1, p.dptr);
    if (r == 0) r = instantiate(exec, graph, 0);
    return r;
}

static void *sym(const char *name) {
    void *p = dlsym(cuda, name);
    if (!p) {
        printf("missing %s\n", name);
        exit(12);
    }
    return p;
}

static void *proc(const char *name) {
    void *p = NULL;
    CUresult r = getproc(name, &p, 12040, 0);
    if (r != 0 || !p) {
        printf("getproc %s %d\n", name, r);
        exit(13);
    }
    return p;
}

static void start(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        printf("dlopen %s\n", dlerror());
        exit(10);
    }
    getproc = dlsym(cuda, "cuGetProcAddress");
    if (!getproc) {
        printf("missing cuGetProcAddress\n");
        exit(12);
    }
    CUresult (*init)(unsigned) = sym("cuInit");
    CUresult r = init(0);
    if (r != 0) {
        printf("init %d\n", r);
        exit(11);
    }
    CUresult (*get)(int *, int) = sym("cuDeviceGet");
    CUresult (*ctx)(void **, unsigned, int) = sym("cuCtxCreate_v2");
    int dev = 0;
    void *c = NULL;
    if ((r = get(&dev, 0)) != 0 || (r = ctx(&c, 0, dev)) != 0) {
        printf("context %d\n", r);
        exit(14);
    }
}

static CUresult alloc(int mib, int via_proc) {
    CUresult (*f)(CUdeviceptr *, size_t) = via_proc ? proc("cuMemAlloc") : sym("cuMemAlloc_v2");
    CUdeviceptr p = 0;
    return f(&p, (size_t)mib << 20);
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A CUmemPoolProps (or CUmemAllocationProp) for pinned device memory on device 0. */
static void device0(void *p) {
    Prop *prop = p;
    memset(prop, 0, sizeof *prop);
    prop->type = 1;
    prop->location.type = 1;
    prop->location.id = 0;
}

/* A kernel for a real GPU: each block counts to n, then stores the count (so the loop stays). */
static const char SPIN_PTX[] =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry spin(.param .u64 n, .param .u64 out)\n{\n"
    "  .reg .pred p;\n  .reg .u64 i, lim, o;\n"
    "  ld.param.u64 lim, [n];\n  ld.param.u64 o, [out];\n  mov.u64 i, 0;\n"
    "LOOP:\n  add.u64 i, i, 1;\n  setp.lt.u64 p, i, lim;\n  @p bra LOOP;\n"
    "  st.global.u64 [o], i;\n  ret;\n}\n";

/* The fake driver's count of this process's GPU time on device 0, ns. */
static CUresult (*own_time)(int, unsigned long long *);

static unsigned long long own_ns(void) {
    unsigned long long ns = 0;
    CUresult r = own_time(0, &ns);
    if (r != 0) {
        printf("own time %d\n", r);
        exit(19);
    }
    return ns;
}

/* burn's $CUDATEST_WINDOWS: each whole second from t0, this process's share of the GPU's time. */
struct windows { double t0; int count; };
static void *share_windows(void *arg) {
    const struct windows *w = arg;
    unsigned long long before = own_ns();
    double at = w->t0;
    for (int i = 0; i < w->count; i++) {
        double until = w->t0 + i + 1;
        struct timespec t = {(time_t)until, (long)((until - (double)(time_t)until) * 1e9)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) != 0) {}
        unsigned long long own = own_ns();
        double now = seconds();
        printf("window %d %.1f\n", i, (double)(own - before) / 1e9 / (now - at) * 100);
        before = own;
        at = now;
    }
    return NULL;
}

static volatile int stop_churn;

/* Allocate and free 1 MiB until told to stop: the interceptor's locks are taken all the time. */
static void *churn(void *arg) {
    (void)arg;
    CUresult (*alloc_v2)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUresult (*free_v2)(CUdeviceptr) = sym("cuMemFree_v2");
    while (!stop_churn) {
        CUdeviceptr p = 0;
        if (alloc_v2(&p, (size_t)1 << 20) == 0) free_v2(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: cudatest info|alloc|hold|cycle|create|passthrough|nvml ...\n");
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "nvml") == 0) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        if (!nvml) { printf("dlopen %s\n", dlerror()); return 10; }
        int (*init)(void) = dlsym(nvml, "nvmlInit_v2");
        int (*byidx)(unsigned, void **) = dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
        int (*mem)(void *, unsigned long long *) = dlsym(nvml, "nvmlDeviceGetMemoryInfo");
        void *d = NULL;
        unsigned long long m[3] = {0, 0, 0};
        int r = init();
        if (r == 0) r = byidx(0, &d);
        if (r == 0) r = mem(d, m);
        printf("nvml %d total %llu free %llu used %llu\n", r, m[0], m[1], m[2]);
        return 0;
    }
    if (strcmp(cmd, "util") == 0) {
        void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        if (!nvml) { printf("dlopen %s\n", dlerror()); return 10; }
        int (*init)(void) = dlsym(nvml, "nvmlInit_v2");
        int (*byidx)(unsigned, void **) = dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
        int (*util)(void *, unsigned *) = dlsym(nvml, "nvmlDeviceGetUtilizationRates");
        void *d = NULL;
        unsigned u[2] = {0, 0};
        init();
        byidx(0, &d);
        int r = util(d, u);
        printf("util %d %u\n", r, u[0]);
        return 0;
    }
    start();
    if (strcmp(cmd, "info") == 0) {
        CUresult (*count)(int *) = sym("cuDeviceGetCount");
        CUresult (*uuid)(unsigned char *, int) = sym("cuDeviceGetUuid");
        CUresult (*info)(size_t *, size_t *) = sym("cuMemGetInfo_v2");
        CUresult (*pinfo)(size_t *, size_t *) = proc("cuMemGetInfo");
        CUresult (*total)(size_t *, int) = sym("cuDeviceTotalMem_v2");
        int n = 0;
        count(&n);
        printf("devices %d\n", n);
        for (int i = 0; i < n; i++) {
            unsigned char u[16];
            uuid(u, i);
            printf("device %d GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", i,
                   u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                   u[14], u[15]);
        }
        size_t f = 0, t = 0;
        CUresult r = info(&f, &t);
        printf("meminfo %d %zu %zu\n", r, f, t);
        r = pinfo(&f, &t);
        printf("procaddr-meminfo %d %zu %zu\n", r, f, t);
        r = total(&t, 0);
        printf("totalmem %d %zu\n", r, t);
    } else if (strcmp(cmd, "alloc") == 0) {
        for (int i = 2; i < argc; i++) {
            int mib = atoi(argv[i]);
            int via_proc = (i % 2) == 1;
            printf("alloc %d %s %d\n", mib, via_proc ? "procaddr" : "direct", alloc(mib, via_proc));
        }
    } else if (strcmp(cmd, "hold") == 0 && argc == 4) {
        printf("hold %d\n", alloc(atoi(argv[2]), 0));
        sleep((unsigned)atoi(argv[3]));
    } else if (strcmp(cmd, "cycle") == 0 && argc == 4) {
        CUresult (*alloc_v2)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
        CUresult (*free_v2)(CUdeviceptr) = proc("cuMemFree");
        int bad = 0;
        for (int i = 0; i < atoi(argv[3]); i++) {
            CUdeviceptr p = 0;
            if (alloc_v2(&p, (size_t)atoi(argv[2]) << 20) != 0 || free_v2(p) != 0) bad++;
        }
        printf("cycle failures %d\n", bad);
    } else if (strcmp(cmd, "create") == 0 && argc == 3) {
        CUresult (*create)(unsigned long long *, size_t, const Prop *, unsigned long long) = sym("cuMemCreate");
        CUresult (*release)(unsigned long long) = proc("cuMemRelease");
        Prop prop;
        device0(&prop);
        unsigned long long h = 0;
        CUresult r = create(&h, (size_t)atoi(argv[2]) << 20, &prop, 0);
        printf("create %d\n", r);
        if (r == 0) printf("release %d\n", release(h));
    } else if (strcmp(cmd, "arrays") == 0 && argc == 4) {
        /* 1024 floats a row: 4 KiB; 256 rows a MiB. */
        struct { size_t w, h; unsigned int format, channels; } d2 = {1024, 0, 0x20, 1};
        struct { size_t w, h, d; unsigned int format, channels, flags; } d3 = {1024, 256, 0, 0x20, 1, 0};
        CUresult (*create2d)(void **, const void *) = sym("cuArrayCreate_v2");
        CUresult (*create3d)(void **, const void *) = proc("cuArray3DCreate");
        CUresult (*destroy)(void *) = sym("cuArrayDestroy");
        int a = atoi(argv[2]), b = atoi(argv[3]);
        void *x = NULL, *y = NULL;
        d2.h = (size_t)a * 256;
        CUresult r = create2d(&x, &d2);
        printf("array2d %d %d\n", a, r);
        d3.d = (size_t)b;
        r = create3d(&y, &d3);
        printf("array3d %d %d\n", b, r);
        if (r == 0) destroy(y);
        printf("destroy %d\n", destroy(x));
        r = create3d(&y, &d3);
        printf("array3d %d %d\n", b, r);
        if (r == 0) destroy(y);
        /* A mipmapped 2D array of 220 MiB at level 0: two levels hold 275 MiB, one 220. */
        CUresult (*mip)(void **, const void *, unsigned int) = proc("cuMipmappedArrayCreate");
        CUresult (*mipdestroy)(void *) = sym("cuMipmappedArrayDestroy");
        d3.w = 1024;
        d3.h = (size_t)220 * 256;
        d3.d = 0;
        for (unsigned int levels = 2; levels >= 1; levels--) {
            r = mip(&y, &d3, levels);
            printf("mipmapped 220 levels %u %d\n", levels, r);
            if (r == 0) mipdestroy(y);
        }
    } else if (strcmp(cmd, "pool") == 0 && argc == 4) {
        CUresult (*create)(void **, const void *) = sym("cuMemPoolCreate");
        CUresult (*from)(CUdeviceptr *, size_t, void *, void *) = sym("cuMemAllocFromPoolAsync");
        CUresult (*pfrom)(CUdeviceptr *, size_t, void *, void *) = proc("cuMemAllocFromPoolAsync");
        CUresult (*free_async)(CUdeviceptr, void *) = sym("cuMemFreeAsync");
        /* CUmemPoolProps is 88 bytes; its head is a CUmemAllocationProp's. */
        union { Prop prop; unsigned char bytes[88]; } props;
        memset(&props, 0, sizeof props);
        device0(&props.prop);
        void *pool = NULL;
        create(&pool, &props);
        int a = atoi(argv[2]), b = atoi(argv[3]);
        CUdeviceptr x = 0, y = 0;
        printf("pool %d %d\n", a, from(&x, (size_t)a << 20, pool, NULL));
        CUresult r = pfrom(&y, (size_t)b << 20, pool, NULL);
        printf("pool %d %d\n", b, r);
        if (r == 0) free_async(y, NULL);
        printf("free %d\n", free_async(x, NULL));
        r = pfrom(&y, (size_t)b << 20, pool, NULL);
        printf("pool %d %d\n", b, r);
        if (r == 0) free_async(y, NULL);
    } else if (strcmp(cmd, "poolkeep") == 0 && argc == 3) {
        CUresult (*create)(void **, const void *) = sym("cuMemPoolCreate");
        CUresult (*set)(void *, int, void *) = sym("cuMemPoolSetAttribute");
        CUresult (*trim)(void *, size_t) = proc("cuMemPoolTrimTo");
        CUresult (*from)(CUdeviceptr *, size_t, void *, void *) = sym("cuMemAllocFromPoolAsync");
        CUresult (*free_async)(CUdeviceptr, void *) = sym("cuMemFreeAsync");
        CUresult (*async)(CUdeviceptr *, size_t, void *) = proc("cuMemAllocAsync");
        union { Prop prop; unsigned char bytes[88]; } props;
        memset(&props, 0, sizeof props);
        device0(&props.prop);
        void *pool = NULL;
        unsigned long long all = ~0ull;
        create(&pool, &props);
        set(pool, 4, &all);
        size_t mib = (size_t)atoi(argv[2]) << 20;
        CUdeviceptr x = 0, y = 0;
        printf("keep alloc %d\n", from(&x, mib, pool, NULL));
        printf("keep free %d\n", free_async(x, NULL));
        printf("plain 100 %d\n", alloc(100, 0));
        CUresult r = from(&x, mib, pool, NULL);
        printf("keep again %d\n", r);
        if (r == 0) free_async(x, NULL);
        printf("trim %d\n", trim(pool, 0));
        r = alloc(100, 1);
        printf("plain 100 %d\n", r);
        /* alloc() does not free: the 100 MiB stay held for what follows. */
        r = async(&x, (size_t)100 << 20, NULL);
        printf("async 100 %d\n", r);
        CUresult r2 = async(&y, (size_t)100 << 20, NULL);
        printf("async 100 %d\n", r2);
        if (r == 0) free_async(x, NULL);
        if (r2 == 0) free_async(y, NULL);
    } else if (strcmp(cmd, "graphshare") == 0 && argc == 3) {
        CUresult (*launch)(void *, void *) = sym("cuGraphLaunch");
        CUresult (*trim)(int) = proc("cuDeviceGraphMemTrim");
        CUresult (*sync)(void) = sym("cuCtxSynchronize");
        int mib = atoi(argv[2]);
        void *a = NULL, *b = NULL;
        CUresult r = alloc_graph(&a, (size_t)mib);
        if (r == 0) r = alloc_graph(&b, (size_t)mib);
        if (r != 0) {
            printf("graphs %d %d\n", mib, r);
            return 18;
        }
        graph_attrs("instantiated");
        printf("first %d\n", launch(a, NULL));
        sync();
        graph_attrs("first launched");
        printf("second %d\n", launch(b, NULL));
        sync();
        graph_attrs("second launched");
        printf("first again %d\n", launch(a, NULL));
        sync();
        graph_attrs("first again");
        printf("trim %d\n", trim(0));
        graph_attrs("trimmed");
    } else if (strcmp(cmd, "graphmem") == 0 && argc == 4) {
        CUresult (*launch)(void *, void *) = sym("cuGraphLaunch");
        CUresult (*upload)(void *, void *) = proc("cuGraphUpload");
        CUresult (*trim)(int) = proc("cuDeviceGraphMemTrim");
        CUresult (*sync)(void) = sym("cuCtxSynchronize");
        int a = atoi(argv[2]), b = atoi(argv[3]);
        void *exec = NULL;
        CUresult r = alloc_graph(&exec, (size_t)a);
        if (r != 0) {
            printf("graph %d %d\n", a, r);
            return 18;
        }
        int attrs = getenv("CUDATEST_ATTRS") != NULL;
        printf("graph %d launch %d\n", a, launch(exec, NULL));
        sync();
        if (attrs) graph_attrs("launched");
        printf("plain %d %d\n", b, alloc(b, 0));
        printf("graph %d again %d\n", a, launch(exec, NULL));
        sync();
        if (attrs) graph_attrs("again");
        printf("trim %d\n", trim(0));
        if (attrs) graph_attrs("trimmed");
        /* alloc() does not free: the MIB2 stay held for what follows. */
        printf("plain %d %d\n", b, alloc(b, 1));
        printf("graph %d held %d\n", a, launch(exec, NULL));
        sync();
        printf("upload %d held %d\n", a, upload(exec, NULL));
    } else if (strcmp(cmd, "asyncalloc") == 0 && argc == 3) {
        CUresult (*async)(CUdeviceptr *, size_t, void *) = proc("cuMemAllocAsync");
        CUresult (*free_async)(CUdeviceptr, void *) = sym("cuMemFreeAsync");
        int mib = atoi(argv[2]);
        CUdeviceptr x = 0;
        CUresult r = async(&x, (size_t)mib << 20, NULL);
        printf("async %d %d\n", mib, r);
        if (r == 0) free_async(x, NULL);
    } else if (strcmp(cmd, "procs") == 0) {
        void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        if (!nvml) { printf("dlopen %s\n", dlerror()); return 10; }
        int (*init)(void) = dlsym(nvml, "nvmlInit_v2");
        int (*byidx)(unsigned, void **) = dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
        int (*v3)(void *, unsigned *, void *) = dlsym(nvml, "nvmlDeviceGetComputeRunningProcesses_v3");
        int (*v1)(void *, unsigned *, void *) = dlsym(nvml, "nvmlDeviceGetComputeRunningProcesses");
        void *d = NULL;
        init();
        byidx(0, &d);
        struct { unsigned pid; unsigned long long used; unsigned gi, ci; } p3[64];
        struct { unsigned pid; unsigned long long used; } p1[64];
        unsigned n3 = 64, n1 = 64;
        int r3 = v3(d, &n3, p3), r1 = v1(d, &n1, p1), self = 0;
        for (unsigned i = 0; i < n3 && r3 == 0; i++) self |= p3[i].pid == (unsigned)getpid();
        printf("procs v3 %d %u self %d\n", r3, n3, self);
        if (getenv("CUDATEST_PIDS")) for (unsigned i = 0; i < n3 && r3 == 0; i++) printf("pid %u\n", p3[i].pid);
        self = 0;
        for (unsigned i = 0; i < n1 && r1 == 0; i++) self |= p1[i].pid == (unsigned)getpid();
        printf("procs v1 %d %u self %d\n", r1, n1, self);
    } else if ((strcmp(cmd, "burn") == 0 || strcmp(cmd, "busy") == 0) && argc == 4) {
        int busy = strcmp(cmd, "busy") == 0;
        CUresult (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                           void **, void **) = sym("cuLaunchKernel");
        const char *ptx = getenv("CUDATEST_PTX");
        void *fn = NULL, **params = NULL;
        unsigned long long n = ptx ? strtoull(ptx, NULL, 10) : 0;
        CUdeviceptr out = 0;
        void *args[2] = {&n, &out};
        CUresult (*sync)(void) = sym("cuCtxSynchronize");
        CUresult (*coop)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **) = getenv("CUDATEST_COOP") ? sym("cuLaunchCooperativeKernel") : NULL;
        if (ptx) {
            CUresult (*load)(void **, const void *) = sym("cuModuleLoadData");
            CUresult (*get)(void **, void *, const char *) = sym("cuModuleGetFunction");
            CUresult (*alloc_v2)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
            void *module = NULL;
            CUresult r = load(&module, SPIN_PTX);
            if (r == 0) r = get(&fn, module, "spin");
            if (r == 0) r = alloc_v2(&out, 8);
            if (r != 0) {
                printf("burn module %d\n", r);
                return 15;
            }
            params = args;
        }
        unsigned blocks = (unsigned)atoi(argv[3]);
        void *exec = NULL;
        CUresult (*graph_launch)(void *, void *) = NULL;
        if (getenv("CUDATEST_GRAPH")) {
            CUresult (*instantiate)(void **, void *, unsigned long long) = sym("cuGraphInstantiateWithFlags");
            const char *mode = getenv("CUDATEST_GRAPH");
            int set_kernel_mode = strcmp(mode, "setparams") == 0, set_child_mode = strcmp(mode, "setchild") == 0;
            /* All but one block sit in the node a mode tests, so that a hook missing it would see
             * a cost far below the real one: the child graph's kernel, or for setparams the outer
             * kernel. */
            unsigned inner = set_kernel_mode ? 1 : blocks - 1, outer = set_kernel_mode ? blocks - 1 : 1;
            void *graph = NULL, *big_nodes[2] = {NULL, NULL};
            CUresult r = burn_graph(&graph, fn, params, inner, outer, big_nodes);
            if (strcmp(mode, "update") == 0) {
                /* The same shape with a block a node, instantiated, then updated to the real one. */
                CUresult (*update)(void *, void *, void *) = sym("cuGraphExecUpdate_v2");
                void *small = NULL;
                char info[64] = {0};
                if (r == 0) r = burn_graph(&small, fn, params, 1, 1, NULL);
                if (r == 0) r = instantiate(&exec, small, 0);
                if (r == 0) r = update(exec, graph, info);
            } else if (set_kernel_mode || set_child_mode) {
                /* The same shape with a block a node, instantiated, then its kernel node given the
                 * real grid and its child graph node the real child graph. */
                CUresult (*set_kernel)(void *, void *, const void *) = proc("cuGraphExecKernelNodeSetParams");
                CUresult (*set_child)(void *, void *, void *) = sym("cuGraphExecChildGraphNodeSetParams");
                CUresult (*child_of)(void *, void **) = sym("cuGraphChildGraphNodeGetGraph");
                KernelNodeParams k =
                    {fn, outer, 1, 1, 1, 1, 1, 0, params, NULL, NULL, NULL};
                void *small = NULL, *small_nodes[2] = {NULL, NULL}, *big_child = NULL;
                if (r == 0) r = child_of(big_nodes[1], &big_child);
                if (r == 0) r = burn_graph(&small, fn, params, 1, 1, small_nodes);
                if (r == 0) r = instantiate(&exec, small, 0);
                if (r == 0) r = set_kernel(exec, small_nodes[0], &k);
                if (r == 0) r = set_child(exec, small_nodes[1], big_child);
            } else if (r == 0) {
                r = instantiate(&exec, graph, 0);
            }
            if (r != 0) {
                printf("burn graph %d\n", r);
                return 17;
            }
            graph_launch = sym("cuGraphLaunch");
        }
        /* The fake's GPU time: what this process ran (nothing while capturing: launches are
         * only recorded then, and the launch rate is printed as before). */
        int rate = ptx || getenv("FAKE_CUDA_CAPTURING");
        own_time = rate ? NULL : sym("cuFakeOwnTime");
        double total = atof(argv[2]), t0 = seconds(), half = t0 + total / 2, end = t0 + total, t_half = 0;
        unsigned long long counted = 0, own_half = 0;
        double now;
        pthread_t windows;
        struct windows w = {t0, (int)total};
        int windowed = !rate && getenv("CUDATEST_WINDOWS") && w.count > 0;
        if (windowed) pthread_create(&windows, NULL, share_windows, &w);
        /* On a real GPU, windows are the blocks a second each whole second ran. */
        int ptx_windows = ptx && getenv("CUDATEST_WINDOWS"), window = 0;
        unsigned long long window_blocks = 0;
        while ((now = seconds()) < end) {
            if (ptx_windows && now >= t0 + window + 1) {
                printf("window %d %llu\n", window, window_blocks);
                window_blocks = 0;
                window = (int)(now - t0);
            }
            CUresult r = exec   ? graph_launch(exec, NULL)
                         : coop ? coop(fn, blocks, 1, 1, 1, 1, 1, 0, NULL, params)
                                : launch(fn, blocks, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
            if (r != 0) {
                printf("%s launch %d\n", cmd, r);
                return 16;
            }
            if (ptx || busy) sync();
            window_blocks += blocks;
            if (now >= half) {
                if (!t_half && own_time) {
                    own_half = own_ns();
                    t_half = seconds();
                }
                counted += blocks;
            }
        }
        if (windowed) pthread_join(windows, NULL);
        if (ptx) {
            printf("%s %.0f blocks/s\n", cmd, (double)counted / (end - half));
        } else if (rate) {
            printf("%s %.0f\n", cmd, (double)counted / (end - half) / 1e6 * 100);
        } else {
            unsigned long long own_end = own_ns();
            double t_end = seconds();
            if (!t_half) t_half = t_end;
            printf("%s %.0f\n", cmd, t_end > t_half ? (double)(own_end - own_half) / 1e9 / (t_end - t_half) * 100 : 0);
        }
    } else if (strcmp(cmd, "forks") == 0 && argc == 3) {
        CUresult (*info)(size_t *, size_t *) = sym("cuMemGetInfo_v2");
        pthread_t t;
        pthread_create(&t, NULL, churn, NULL);
        int n = atoi(argv[2]), hung = 0;
        for (int i = 0; i < n; i++) {
            pid_t pid = fork();
            if (pid == 0) {
                size_t f = 0, total = 0;
                info(&f, &total);
                _exit(0);
            }
            int status = 0, done = 0;
            for (int ms = 0; ms < 2000 && !done; ms++) {
                if (waitpid(pid, &status, WNOHANG) == pid) done = 1;
                else usleep(1000);
            }
            if (!done) {
                hung++;
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                break;
            }
        }
        stop_churn = 1;
        pthread_join(t, NULL);
        printf("forks %d hung %d\n", n, hung);
    } else if (strcmp(cmd, "passthrough") == 0) {
        int (*identify)(void) = sym("cuFakeIdentify");
        int (*pidentify)(void) = proc("cuFakeIdentify");
        int *data = sym("cuFakeData");
        printf("identify %x %x data %x\n", identify(), pidentify(), *data);
    } else {
        fprintf(stderr, "cudatest: unknown command %s\n", cmd);
        return 2;
    }
    return 0;
}
