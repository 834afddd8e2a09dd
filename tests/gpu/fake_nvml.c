/*
 * A fake NVML for crishim's GPU tests, built as libnvidia-ml.so.<version> (soname
 * libnvidia-ml.so.1). Devices are the /dev/nvidia<minor> nodes (major 195) under /dev or
 * $FAKE_NVIDIA_DEVICE_ROOT, with the same UUIDs and memory as fake_cuda.c. MIG devices are the
 * lines "<GPU minor> <GPU instance> <compute instance>" of <device root>/fake-mig, each with
 * half a GPU's memory and the UUID MIG-c0ffee00-0000-4000-9000-000000<minor><gi><ci> (hex). Processes and their
 * memory are what fake_cuda.c publishes in its state directory (see there). Utilization is the
 * simulated GPU's (fake_common.h), as a real time-sliced GPU's reads:
 * - nvmlDeviceGetUtilizationRates: the percent of the last second the GPU was busy;
 * - nvmlDeviceGetProcessUtilization: a sample at every sample time ($FAKE_NVML_SAMPLE_MS,
 *   default 167) for the process whose context had the GPU then, at 99 (the last 256 kept);
 *   none while idle (NVML_ERROR_NOT_FOUND).
 * NVML advances the simulation too where it may write its file, and never creates it.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <time.h>

#include "fake_common.h"

#define EXPORT __attribute__((visibility("default")))
#define FAKE_MEMORY (1ull << 30)
#define MAX_DEVICES 16

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define MAX_PROCS 256

typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil; } nvmlProcessUtilizationSample_t;

struct proc { unsigned int pid; unsigned long long used; };

static const char *state_dir(void) { return fake_state_dir(); }

/* The live processes fake_cuda.c says have a context on device `minor`. */
static int processes(int minor, struct proc *out) {
    DIR *d = opendir(state_dir());
    struct dirent *e;
    int n = 0;
    if (!d) return 0;
    while ((e = readdir(d)) && n < MAX_PROCS) {
        unsigned int pid;
        int m;
        char path[4096];
        unsigned long long used, sm, at;
        if (sscanf(e->d_name, "%u-%d", &pid, &m) != 2 || m != minor) continue;
        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) continue;
        snprintf(path, sizeof path, "%s/%s", state_dir(), e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned long long started = 0;
        int got = fscanf(f, "%llu %llu %llu %llu", &used, &sm, &at, &started);
        /* A file of a process that is gone, whose pid another one has now: not listed. */
        if (got == 4 && started != start_time((int)pid)) got = 0;
        if (got >= 3) {
            out[n].pid = pid;
            out[n].used = used;
            n++;
        }
        fclose(f);
    }
    closedir(d);
    return n;
}

static int ndev;
static int minors[MAX_DEVICES];

static void enumerate(void) {
    const char *root = getenv("FAKE_NVIDIA_DEVICE_ROOT");
    char path[4096];
    struct stat st;
    if (!root || !*root) root = "/dev";
    ndev = 0;
    for (int m = 0; m < 255 && ndev < MAX_DEVICES; m++) {
        snprintf(path, sizeof path, "%s/nvidia%d", root, m);
        if (stat(path, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == 195)
            minors[ndev++] = m;
    }
}

static int minor_of(nvmlDevice_t d) { return (int)(intptr_t)d - 1; }

/* MIG handles are 0x1000 + 16 * (line of fake-mig) + 1; GPU handles are minor + 1 (< 0x1000). */
#define MIG_BASE 0x1000
struct mig { int minor, gi, ci; };

static int migs(struct mig *out, int max) {
    const char *root = getenv("FAKE_NVIDIA_DEVICE_ROOT");
    char path[4096];
    int n = 0;
    snprintf(path, sizeof path, "%s/fake-mig", root && *root ? root : "/dev");
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    while (n < max && fscanf(f, "%d %d %d", &out[n].minor, &out[n].gi, &out[n].ci) == 3) n++;
    fclose(f);
    return n;
}

static int mig_of(nvmlDevice_t d, struct mig *m) {
    struct mig all[16];
    long i = ((long)(intptr_t)d - MIG_BASE - 1) / 16;
    if ((intptr_t)d <= MIG_BASE || i < 0 || i >= migs(all, 16)) return 0;
    *m = all[i];
    return 1;
}

static void uuid_string(int minor, char *buf, unsigned int len) {
    snprintf(buf, len, "GPU-c0ffee00-0000-4000-8000-0000000000%02x", minor);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { enumerate(); return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
    snprintf(v, len, "550.54.14");
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = (unsigned int)ndev; return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i >= (unsigned int)ndev) return NVML_ERROR_INVALID_ARGUMENT;
    *d = (nvmlDevice_t)(intptr_t)(minors[i] + 1);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    char buf[96];
    for (int i = 0; i < ndev; i++) {
        uuid_string(minors[i], buf, sizeof buf);
        if (strcmp(buf, uuid) == 0) {
            *d = (nvmlDevice_t)(intptr_t)(minors[i] + 1);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    struct mig m;
    if (mig_of(d, &m))
        snprintf(uuid, len, "MIG-c0ffee00-0000-4000-9000-000000%02x%02x%02x", m.minor, m.gi, m.ci);
    else
        uuid_string(minor_of(d), uuid, len);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    struct mig all[16];
    int n = migs(all, 16);
    *current = *pending = 0;
    for (int i = 0; i < n; i++)
        if (all[i].minor == minor_of(d)) *current = *pending = 1;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    (void)d;
    *count = 7;
    return NVML_SUCCESS;
}
/* The index-th MIG device of GPU d: the index-th line of fake-mig naming d's minor. */
EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *out) {
    struct mig all[16];
    int n = migs(all, 16);
    unsigned int seen = 0;
    for (int i = 0; i < n; i++) {
        if (all[i].minor != minor_of(d)) continue;
        if (seen++ == index) {
            *out = (nvmlDevice_t)(intptr_t)(MIG_BASE + 16 * i + 1);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    struct mig m;
    if (!mig_of(d, &m)) return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned int)m.gi;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    struct mig m;
    if (!mig_of(d, &m)) return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned int)m.ci;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor) {
    *minor = (unsigned int)minor_of(d);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    struct mig mg;
    m->total = mig_of(d, &mg) ? FAKE_MEMORY / 2 : FAKE_MEMORY;
    m->used = 0;
    m->free = m->total;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    (void)d;
    m->total = FAKE_MEMORY;
    m->reserved = 0;
    m->used = 0;
    m->free = FAKE_MEMORY;
    return NVML_SUCCESS;
}
/* Device `d`'s simulated GPU (fake_common.h), locked and advanced to now, if a process has used
 * it; sim_done releases it. MIG devices have none. */
static struct sim *sim_take(nvmlDevice_t d, int *fd) {
    int writable = 0;
    if ((intptr_t)d <= 0 || (intptr_t)d > MIG_BASE) return NULL;
    struct sim *s = sim_open(minor_of(d), 0, fd, &writable);
    if (!s) return NULL;
    sim_lock(*fd);
    if (writable) sim_advance(s, sim_clock(CLOCK_MONOTONIC));
    return s;
}
static void sim_done(struct sim *s, int fd) {
    sim_unlock(fd);
    sim_close(s, fd);
}

/* The whole device's: the part of the last second the simulated GPU was busy. */
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    int fd;
    struct sim *s = sim_take(d, &fd);
    u->gpu = 0;
    u->memory = 0;
    if (s) {
        u->gpu = sim_utilization(s);
        sim_done(s, fd);
    }
    return NVML_SUCCESS;
}

/* Fill `count` entries of `size` bytes with `fill`, NVML's way: too small a count gets the
 * count needed and NVML_ERROR_INSUFFICIENT_SIZE. */
#define LIST(TYPE, FILL)                                                  \
    struct proc p[MAX_PROCS];                                             \
    int n = processes(minor_of(d), p);                                    \
    unsigned int room = *count;                                           \
    *count = (unsigned int)n;                                             \
    if ((unsigned int)n > room || (n && !out)) return NVML_ERROR_INSUFFICIENT_SIZE; \
    for (int i = 0; i < n; i++) {                                         \
        TYPE *o = &((TYPE *)out)[i];                                      \
        memset(o, 0, sizeof *o);                                          \
        FILL;                                                             \
    }                                                                     \
    return NVML_SUCCESS;

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count, void *out) {
    LIST(nvmlProcessInfo_v1_t, (o->pid = p[i].pid, o->usedGpuMemory = p[i].used))
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count, void *out) {
    LIST(nvmlProcessInfo_t, (o->pid = p[i].pid, o->usedGpuMemory = p[i].used))
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, void *out) {
    LIST(nvmlProcessInfo_t, (o->pid = p[i].pid, o->usedGpuMemory = p[i].used))
}
/* The simulated GPU's samples newer than `since` (CLOCK_REALTIME us), oldest first: at each
 * sample time, the process whose context had the GPU, at 99. None: NVML_ERROR_NOT_FOUND. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, void *out, unsigned int *count,
                                                    unsigned long long since) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessUtilizationSample_t got[SIM_SAMPLES];
    unsigned int n = 0;
    int fd;
    struct sim *s = sim_take(d, &fd);
    if (s) {
        uint64_t first = s->nsamples > SIM_SAMPLES ? s->nsamples - SIM_SAMPLES : 0;
        for (uint64_t k = first; k < s->nsamples; k++) {
            const struct sim_sample *x = &s->samples[k % SIM_SAMPLES];
            if (x->real_us <= since) continue;
            memset(&got[n], 0, sizeof got[n]);
            got[n].pid = (unsigned int)x->pid;
            got[n].timeStamp = x->real_us;
            got[n].smUtil = (unsigned int)x->sm;
            n++;
        }
        sim_done(s, fd);
    }
    unsigned int room = *count;
    *count = n;
    if (n == 0) return NVML_ERROR_NOT_FOUND;
    if (!out || n > room) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, got, n * sizeof got[0]);
    return NVML_SUCCESS;
}
