/*
 * What the fake driver (fake_cuda.c) and the fake NVML (fake_nvml.c) share: a process's start
 * time, and the simulated GPU.
 *
 * The simulated GPU: one time-sliced GPU per device, shared by every process using it, in the
 * file <state>/gpu-<minor>.sim (<state> is $FAKE_NVIDIA_STATE or /tmp/fake-nvidia; mode 0666,
 * since containers of different users share it). The file is a struct sim, mmap'ed shared and
 * only touched under flock(LOCK_EX) on it (the kernel drops a dead holder's lock). Simulated
 * time is CLOCK_MONOTONIC, in ns; whoever takes the lock first advances the simulation to now
 * (sim_advance), lazily: nothing runs between calls.
 *
 * - Each process using the device has a slot (at most SIM_SLOTS), named by its pid and start
 *   time (and the pid namespace it was seen from): a slot whose process is gone is freed, at
 *   most every SIM_LIVENESS_NS, by anyone in the same pid namespace; a process frees its own on
 *   exit. A slot's queue (SIM_QUEUE items, in order, for all its streams) holds kernels (ns of
 *   work left) and event markers (done at once when reached; their value is then the time).
 * - The GPU runs one slot at a time: the current one runs its items in order until its queue
 *   is empty (the next ready slot, round-robin by index, gets the GPU at once) or its time
 *   slice ends (slice_ns, $FAKE_GPU_SLICE_US, default 2000 us), when it is preempted, even
 *   mid-kernel, and the next ready slot (possibly itself, if alone) gets a fresh slice. A
 *   marker at the head of a slot that is not running waits for its turn, as a real context's
 *   start event is stamped when the context gets the GPU. Nothing ready: the GPU is idle.
 * - What a slot ran adds to its own_ns; what the GPU ran, to the busy ns of SIM_BUCKET_NS
 *   buckets (the last SIM_BUCKETS kept), for NVML's device utilization.
 * - Every sample_ns of simulated time ($FAKE_NVML_SAMPLE_MS, default 167 ms), at instants that
 *   are multiples of it, the process whose slot runs gets a per-process utilization sample
 *   (pid, CLOCK_REALTIME us, 99), as real NVML reports a time-sliced GPU; the last SIM_SAMPLES
 *   are kept. An idle GPU gives none.
 * The slice and the sample period are read from the environment of the process that creates
 * the file, and kept in it.
 */
#ifndef CRISHIM_FAKE_COMMON_H
#define CRISHIM_FAKE_COMMON_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

static inline const char *fake_state_dir(void) {
    const char *d = getenv("FAKE_NVIDIA_STATE");
    return d && *d ? d : "/tmp/fake-nvidia";
}

#define SIM_MAGIC 0x6d69732d75706766ull /* "fgpu-sim" */
#define SIM_VERSION 1
#define SIM_SLOTS 32
#define SIM_QUEUE 1024
#define SIM_SAMPLES 256
#define SIM_BUCKETS 128
#define SIM_BUCKET_NS 10000000ull
#define SIM_LIVENESS_NS 100000000ull
#define SIM_KERNEL 1
#define SIM_MARKER 2

/* A kernel (value: ns of work left) or an event marker (value: when it was done, once done). */
struct sim_item {
    uint64_t kind;
    uint64_t value;
};

struct sim_slot {
    uint64_t pid;    /* 0: free */
    uint64_t start;  /* start_time(pid) */
    uint64_t pidns;  /* the inode of the pid namespace pid is in (0: unknown) */
    uint64_t token;  /* unique to this registration: its process checks that the slot is still its own */
    uint64_t own_ns; /* GPU time this slot has run, ns */
    uint64_t head;   /* items [head, tail) are queued; item s is items[s % SIM_QUEUE] */
    uint64_t tail;
    uint64_t spare;
    struct sim_item items[SIM_QUEUE];
};

struct sim_sample {
    uint64_t pid;
    uint64_t mono_ns; /* the sample instant */
    uint64_t real_us; /* the same instant on CLOCK_REALTIME, us (NVML's timeStamp) */
    uint64_t sm;
};

struct sim {
    uint64_t magic, version, size;
    uint64_t slice_ns, sample_ns;
    uint64_t last;       /* the simulated time reached, CLOCK_MONOTONIC ns */
    uint64_t cur;        /* the running slot + 1; 0: idle */
    uint64_t ran;        /* the slot that last had the GPU + 1 (round-robin from there); 0: none */
    uint64_t slice_end;  /* when the running slot's slice ends */
    uint64_t checked;    /* the last liveness check */
    uint64_t tokens;     /* the last token given */
    uint64_t bucket;     /* the newest busy bucket's index (time / SIM_BUCKET_NS) */
    uint64_t busy[SIM_BUCKETS]; /* busy ns of bucket b at busy[b % SIM_BUCKETS] */
    uint64_t nsamples;   /* samples ever taken; sample k at samples[k % SIM_SAMPLES] */
    struct sim_sample samples[SIM_SAMPLES];
    struct sim_slot slots[SIM_SLOTS];
};

static inline uint64_t sim_clock(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static inline uint64_t sim_env(const char *name, double unit, uint64_t dflt) {
    const char *v = getenv(name);
    double d = v && *v ? strtod(v, NULL) * unit : 0;
    return d >= 1 ? (uint64_t)d : dflt;
}

/* The inode of this process's pid namespace; 0 if unknown. */
static inline uint64_t sim_pidns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static inline void sim_lock(int fd) {
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {}
}
static inline void sim_unlock(int fd) { flock(fd, LOCK_UN); }

/* Map device `minor`'s simulation; with `create`, create (and initialize) it if missing.
 * Returns it, with its descriptor in *fd and whether it may be written in *writable; NULL if it
 * cannot be had. */
static inline struct sim *sim_open(int minor, int create, int *fd, int *writable) {
    char path[4096];
    const char *dir = fake_state_dir();
    if (create && mkdir(dir, 0777) == 0 && chmod(dir, 0777) != 0) {}
    snprintf(path, sizeof path, "%s/gpu-%d.sim", dir, minor);
    *writable = 1;
    *fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0666);
    if (*fd < 0 && !create) {
        *writable = 0;
        *fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (*fd < 0) return NULL;
    struct stat st;
    sim_lock(*fd);
    if (fstat(*fd, &st) != 0) goto fail;
    if (*writable && st.st_uid == geteuid() && (st.st_mode & 0777) != 0666 && fchmod(*fd, 0666) != 0) {}
    if ((uint64_t)st.st_size != sizeof(struct sim)) {
        if (!*writable || ftruncate(*fd, sizeof(struct sim)) != 0) goto fail;
    }
    struct sim *s = mmap(NULL, sizeof(struct sim), *writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED,
                         *fd, 0);
    if (s == MAP_FAILED) goto fail;
    if (s->magic != SIM_MAGIC || s->version != SIM_VERSION || s->size != sizeof(struct sim)) {
        if (!*writable) {
            munmap(s, sizeof(struct sim));
            goto fail;
        }
        memset(s, 0, sizeof *s);
        s->version = SIM_VERSION;
        s->size = sizeof(struct sim);
        s->slice_ns = sim_env("FAKE_GPU_SLICE_US", 1e3, 2000000ull);
        s->sample_ns = sim_env("FAKE_NVML_SAMPLE_MS", 1e6, 167000000ull);
        s->last = sim_clock(CLOCK_MONOTONIC);
        s->bucket = s->last / SIM_BUCKET_NS;
        s->checked = s->last;
        s->magic = SIM_MAGIC;
    }
    sim_unlock(*fd);
    return s;
fail:
    sim_unlock(*fd);
    close(*fd);
    *fd = -1;
    return NULL;
}

static inline void sim_close(struct sim *s, int fd) {
    if (s) munmap(s, sizeof *s);
    if (fd >= 0) close(fd);
}

static inline void sim_free_slot(struct sim *s, int i) {
    memset(&s->slots[i], 0, sizeof s->slots[i] - sizeof s->slots[i].items);
    if (s->cur == (uint64_t)i + 1) s->cur = 0;
}

/* Free the slots of processes that are gone (those this process can see: its pid namespace's). */
static inline void sim_reap(struct sim *s, uint64_t now) {
    uint64_t ns = sim_pidns();
    s->checked = now;
    for (int i = 0; i < SIM_SLOTS; i++) {
        struct sim_slot *c = &s->slots[i];
        if (!c->pid || c->pidns != ns) continue;
        unsigned long long st = start_time((int)c->pid);
        int gone = (kill((pid_t)c->pid, 0) != 0 && errno == ESRCH) || (st != 0 && st != c->start);
        if (gone) sim_free_slot(s, i);
    }
}

/* Busy buckets up to the one of time t: those skipped over were idle. */
static inline void sim_roll(struct sim *s, uint64_t t) {
    uint64_t b = t / SIM_BUCKET_NS;
    if (b <= s->bucket) return;
    uint64_t n = b - s->bucket;
    if (n >= SIM_BUCKETS) {
        memset(s->busy, 0, sizeof s->busy);
    } else {
        for (uint64_t k = s->bucket + 1; k <= b; k++) s->busy[k % SIM_BUCKETS] = 0;
    }
    s->bucket = b;
}

/* Slot c ran from t for `run` ns. real_off: CLOCK_REALTIME - CLOCK_MONOTONIC, ns. */
static inline void sim_account(struct sim *s, struct sim_slot *c, uint64_t t, uint64_t run, int64_t real_off) {
    uint64_t end = t + run;
    c->own_ns += run;
    /* Busy time: only the kept buckets matter. */
    uint64_t from = end - t > SIM_BUCKETS * SIM_BUCKET_NS ? end - SIM_BUCKETS * SIM_BUCKET_NS : t;
    while (from < end) {
        sim_roll(s, from);
        uint64_t edge = (from / SIM_BUCKET_NS + 1) * SIM_BUCKET_NS;
        uint64_t part = (edge < end ? edge : end) - from;
        s->busy[(from / SIM_BUCKET_NS) % SIM_BUCKETS] += part;
        from += part;
    }
    /* Sample instants k * sample_ns in [t, end): this slot's process had the GPU. */
    uint64_t p = s->sample_ns, k = (t + p - 1) / p, kend = (end + p - 1) / p;
    if (kend - k > SIM_SAMPLES) k = kend - SIM_SAMPLES;
    for (; k < kend; k++) {
        struct sim_sample *x = &s->samples[s->nsamples++ % SIM_SAMPLES];
        x->pid = c->pid;
        x->mono_ns = k * p;
        x->real_us = (uint64_t)((int64_t)(k * p) + real_off) / 1000;
        x->sm = 99;
    }
}

/* The next slot with queued items after slot `after` (round-robin; `after` itself last), or -1. */
static inline int sim_next_ready(struct sim *s, int after) {
    for (int i = 1; i <= SIM_SLOTS; i++) {
        int j = (after + i) % SIM_SLOTS;
        struct sim_slot *c = &s->slots[j];
        if (c->pid && c->head != c->tail) return j;
    }
    return -1;
}

/* Run the GPU from s->last to now: O(items done + slices) (an idle span is O(1)). */
static inline void sim_advance(struct sim *s, uint64_t now) {
    if (now <= s->last) return;
    if (now - s->checked >= SIM_LIVENESS_NS) sim_reap(s, now);
    int64_t real_off = (int64_t)(sim_clock(CLOCK_REALTIME) - sim_clock(CLOCK_MONOTONIC));
    uint64_t t = s->last;
    while (t < now) {
        struct sim_slot *c = s->cur ? &s->slots[s->cur - 1] : NULL;
        if (!c || c->head == c->tail) {
            int n = sim_next_ready(s, s->ran ? (int)s->ran - 1 : SIM_SLOTS - 1);
            if (n < 0) {
                s->cur = 0;
                break; /* idle until now */
            }
            s->cur = s->ran = (uint64_t)n + 1;
            s->slice_end = t + s->slice_ns;
            c = &s->slots[n];
        }
        while (c->head != c->tail) {
            struct sim_item *it = &c->items[c->head % SIM_QUEUE];
            if (it->kind == SIM_MARKER) {
                it->value = t;
                c->head++;
                continue;
            }
            if (t >= now || t >= s->slice_end) break;
            uint64_t run = it->value;
            if (run > now - t) run = now - t;
            if (run > s->slice_end - t) run = s->slice_end - t;
            sim_account(s, c, t, run, real_off);
            it->value -= run;
            t += run;
            if (it->value == 0) c->head++;
        }
        if (c->head == c->tail) continue; /* the next ready slot gets the GPU at once */
        if (t >= s->slice_end) {
            /* Preempted: the next ready slot (itself if alone) gets a fresh slice. */
            int n = sim_next_ready(s, (int)s->cur - 1);
            s->cur = s->ran = (uint64_t)n + 1;
            s->slice_end = t + s->slice_ns;
            continue;
        }
        break; /* t == now */
    }
    if (s->cur && s->slots[s->cur - 1].head == s->slots[s->cur - 1].tail) s->cur = 0;
    s->last = now;
    sim_roll(s, now);
}

/* Percent of the last second (the last 100 whole buckets) the GPU was busy, rounded. */
static inline unsigned sim_utilization(struct sim *s) {
    uint64_t sum = 0, want = 1000000000ull / SIM_BUCKET_NS;
    for (uint64_t k = 1; k <= want && k <= s->bucket; k++) sum += s->busy[(s->bucket - k) % SIM_BUCKETS];
    uint64_t pct = (sum * 100 + 500000000ull) / 1000000000ull;
    return pct > 100 ? 100 : (unsigned)pct;
}

#endif
