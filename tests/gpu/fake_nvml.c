/*
 * A fake NVML for crishim's GPU tests, built as libnvidia-ml.so.<version> (soname
 * libnvidia-ml.so.1). Devices are the /dev/nvidia<minor> nodes (major 195) under /dev or
 * $FAKE_NVIDIA_DEVICE_ROOT, with the same UUIDs and memory as fake_cuda.c.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

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
    uuid_string(minor_of(d), uuid, len);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor) {
    *minor = (unsigned int)minor_of(d);
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    (void)d;
    m->total = FAKE_MEMORY;
    m->used = 0;
    m->free = FAKE_MEMORY;
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
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    (void)d;
    u->gpu = 0;
    u->memory = 0;
    return NVML_SUCCESS;
}
