/*
 * What the fake driver (fake_cuda.c) and the fake NVML (fake_nvml.c) share.
 */
#ifndef CRISHIM_FAKE_COMMON_H
#define CRISHIM_FAKE_COMMON_H

#include <stdio.h>
#include <string.h>

/* A process's start time (field 22 of /proc/<pid>/stat): with its pid, it names the process,
 * so a file left by a process that is gone does not pass for a new one with its pid. */
static unsigned long long start_time(int pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long long v = 0;
    if (p) sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &v);
    return v;
}

#endif
