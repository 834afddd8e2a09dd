//! The core limit's driver side: each launch of a limited container is admitted by its
//! [`Limiter`], bracketed by two events on its own stream, and a thread of the process (the
//! *reaper*) reads the events back off the launch path: the GPU time between them is charged,
//! and the container's share is written to its accounting file. The same thread reads NVML's
//! per-process samples, which say how much of the time our kernels were in flight another
//! context held the GPU (time-slicing), and whether anyone else uses it at all (the `shared`
//! policy).

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cuda::*;
use crate::limiter::{Admission, Key, Limiter};
use crate::real::{Lib, Slot};
use crate::state::Limited;
use crate::{lock, wall_us};
use crishim_proto::vgpu::CorePolicy;

pub mod slots {
    use super::{Lib, Slot};

    pub static CU_CTX_GET_CURRENT: Slot = Slot::new(Lib::Cuda, c"cuCtxGetCurrent");
    pub static CU_CTX_SET_CURRENT: Slot = Slot::new(Lib::Cuda, c"cuCtxSetCurrent");
    pub static CU_EVENT_CREATE: Slot = Slot::new(Lib::Cuda, c"cuEventCreate");
    pub static CU_EVENT_DESTROY_V2: Slot = Slot::new(Lib::Cuda, c"cuEventDestroy_v2");
    pub static CU_EVENT_RECORD: Slot = Slot::new(Lib::Cuda, c"cuEventRecord");
    pub static CU_EVENT_RECORD_PTSZ: Slot = Slot::new(Lib::Cuda, c"cuEventRecord_ptsz");
    pub static CU_EVENT_QUERY: Slot = Slot::new(Lib::Cuda, c"cuEventQuery");
    pub static CU_EVENT_ELAPSED_TIME_V2: Slot = Slot::new(Lib::Cuda, c"cuEventElapsedTime_v2");
    pub static CU_EVENT_ELAPSED_TIME: Slot = Slot::new(Lib::Cuda, c"cuEventElapsedTime");
}

type CUevent = *mut c_void;
type CUcontext = *mut c_void;
const CUDA_ERROR_NOT_READY: CUresult = 600;

/// Launches measured at once; past it a launch is charged its estimate only.
const MAX_PENDING: usize = 4096;
/// Events kept for reuse, per context.
const MAX_FREE: usize = 2 * MAX_PENDING;
/// How often the reaper reads events back while launches are in flight.
const POLL: Duration = Duration::from_micros(500);
/// How often it wakes with nothing in flight.
const IDLE: Duration = Duration::from_millis(10);
/// How often it writes to the accounting file, and reads what the container's other processes
/// were charged.
const FLUSH: Duration = Duration::from_millis(50);
/// How often it reads NVML's samples (NVML makes one every 1/6 s or so).
const SAMPLES: Duration = Duration::from_millis(100);
/// Another process used the GPU this recently: the GPU is shared.
const SHARED_FOR_US: u64 = 2_000_000;

/// A launch in flight: its context, its events and what it was admitted with.
#[derive(Clone, Copy)]
struct Pending {
    ctx: usize,
    stream: (usize, bool),
    start: usize,
    end: usize,
    admission: Admission,
}

#[derive(Default)]
struct Timing {
    /// The process these belong to: a forked child starts afresh.
    pid: u32,
    pending: VecDeque<Pending>,
    /// Recorded events free for reuse, by context.
    free: HashMap<usize, Vec<usize>>,
}

static TIMING: Mutex<Option<Timing>> = Mutex::new(None);
static LIMITER: Mutex<Option<Limiter>> = Mutex::new(None);
/// The pid whose reaper runs.
static REAPER: AtomicU32 = AtomicU32::new(0);
/// When (µs since the epoch) NVML last gave a sample to a process not the container's; 0: never.
static FOREIGN_US: AtomicU64 = AtomicU64::new(0);
/// Whether NVML's per-process samples are read, and this process's own told from them (the
/// `shared` policy needs them).
static SAMPLED: AtomicBool = AtomicBool::new(false);

/// Hold this module's locks across a `fork` (see `state::register_fork_handlers`).
pub(crate) fn hold_for_fork(held: &mut Vec<Box<dyn std::any::Any>>) {
    held.push(Box::new(lock(&TIMING)));
    held.push(Box::new(lock(&LIMITER)));
}

/// Run `f` on this process's limiter, made for a limit of `percent` on first use.
fn with_limiter<R>(percent: u32, f: impl FnOnce(&mut Limiter) -> R) -> R {
    f(lock(&LIMITER).get_or_insert_with(|| Limiter::new(percent, Instant::now())))
}

/// Whether launches wait for their share now, under `policy`.
fn enforced(policy: CorePolicy) -> bool {
    match policy {
        CorePolicy::Force => true,
        CorePolicy::Disable => false,
        // Never less strict than the limit when nothing can tell whether the GPU is shared.
        CorePolicy::Shared => {
            !SAMPLED.load(Ordering::Relaxed)
                || wall_us().saturating_sub(FOREIGN_US.load(Ordering::Relaxed)) < SHARED_FOR_US
        }
    }
}

/// Make a launch of `key` on `stream` (per-thread default stream semantics where `.1`) with
/// `go`, for a container with a core limit of `percent`: wait for its share, then measure it.
pub(crate) fn launch(
    l: &'static Limited,
    percent: u32,
    stream: (CUstream, bool),
    key: Key,
    go: impl FnOnce() -> CUresult,
) -> CUresult {
    ensure_reaper(l, percent);
    let policy = l.config.core_policy.unwrap_or_default();
    let enforce = !l.config.mps && enforced(policy);
    let admission = admit(percent, key, enforce);
    let measured = start(stream);
    let r = go();
    if r != CUDA_SUCCESS {
        abandon(&[admission], false);
        if let Some((ctx, ev)) = measured {
            give_back(ctx, &[ev]);
        }
        return r;
    }
    let pending = measured.is_some_and(|(ctx, start)| finish(ctx, start, stream, admission));
    if !pending {
        abandon(&[admission], true);
    }
    r
}

/// Settle admissions that will not complete here (see `Limiter::abandon`).
fn abandon(admissions: &[Admission], made: bool) {
    if let Some(l) = lock(&LIMITER).as_mut() {
        let now = Instant::now();
        for a in admissions {
            l.abandon(*a, made, now);
        }
    }
}

/// Charge the launch's estimate, after waiting (at most `limiter::MAX_WAIT` in all) while the
/// container is ahead of its share. Unenforced, it is admitted at once.
fn admit(percent: u32, key: Key, enforce: bool) -> Admission {
    let mut waited = if enforce {
        Duration::ZERO
    } else {
        crate::limiter::MAX_WAIT
    };
    loop {
        let r = with_limiter(percent, |l| l.admit(key, Instant::now(), waited));
        match r {
            Ok(a) => return a,
            Err(wait) => {
                crate::limiter::note_throttled(wait);
                std::thread::sleep(wait);
                waited += wait.max(Duration::from_micros(1));
            }
        }
    }
}

fn current_ctx() -> Option<usize> {
    type F = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
    // SAFETY: cuCtxGetCurrent(CUcontext *pctx).
    let f = unsafe { slots::CU_CTX_GET_CURRENT.get::<F>() }?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` outlives the call.
    (unsafe { f(&mut ctx) } == CUDA_SUCCESS && !ctx.is_null()).then_some(ctx as usize)
}

fn record(ev: usize, stream: (CUstream, bool)) -> bool {
    type F = unsafe extern "C" fn(CUevent, CUstream) -> CUresult;
    let slot = if stream.1 {
        &slots::CU_EVENT_RECORD_PTSZ
    } else {
        &slots::CU_EVENT_RECORD
    };
    // SAFETY: cuEventRecord[_ptsz](CUevent, CUstream).
    let Some(f) = (unsafe { slot.get::<F>() }) else {
        return false;
    };
    // SAFETY: an event of the current context and the caller's stream.
    unsafe { f(ev as CUevent, stream.0) == CUDA_SUCCESS }
}

/// An event of the current context `ctx`: a free one, or a new one.
fn event(ctx: usize) -> Option<usize> {
    if let Some(ev) = with_timing(|t| t.free.get_mut(&ctx).and_then(Vec::pop)) {
        return Some(ev);
    }
    type F = unsafe extern "C" fn(*mut CUevent, u32) -> CUresult;
    // SAFETY: cuEventCreate(CUevent *phEvent, unsigned int Flags).
    let f = unsafe { slots::CU_EVENT_CREATE.get::<F>() }?;
    let mut ev: CUevent = std::ptr::null_mut();
    // SAFETY: `ev` outlives the call; flags 0 is CU_EVENT_DEFAULT, which times.
    (unsafe { f(&mut ev, 0) } == CUDA_SUCCESS).then_some(ev as usize)
}

/// The event recorded before the launch, with its context; `None` when the launch goes
/// unmeasured (too many in flight, or the driver refused an event: said once).
fn start(stream: (CUstream, bool)) -> Option<(usize, usize)> {
    if with_timing(|t| t.pending.len()) >= MAX_PENDING {
        return None;
    }
    let ctx = current_ctx()?;
    let ev = event(ctx)?;
    if record(ev, stream) {
        Some((ctx, ev))
    } else {
        unmeasured("cuEventRecord failed");
        give_back(ctx, &[ev]);
        None
    }
}

/// Record the end event and queue the launch for the reaper; false if it goes unmeasured.
fn finish(ctx: usize, start: usize, stream: (CUstream, bool), admission: Admission) -> bool {
    let Some(end) = event(ctx) else {
        give_back(ctx, &[start]);
        return false;
    };
    if !record(end, stream) {
        give_back(ctx, &[start, end]);
        return false;
    }
    with_timing(|t| {
        t.pending.push_back(Pending {
            ctx,
            stream: (stream.0 as usize, stream.1),
            start,
            end,
            admission,
        })
    });
    true
}

fn unmeasured(why: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        crate::warn(format_args!(
            "some kernel launches are charged their estimate only: {why}"
        ))
    });
}

/// Events back to `ctx`'s free list (destroyed past [`MAX_FREE`]).
fn give_back(ctx: usize, events: &[usize]) {
    let extra: Vec<usize> = with_timing(|t| {
        let free = t.free.entry(ctx).or_default();
        let room = MAX_FREE.saturating_sub(free.len()).min(events.len());
        free.extend_from_slice(&events[..room]);
        events[room..].to_vec()
    });
    for ev in extra {
        destroy(ev);
    }
}

fn destroy(ev: usize) {
    type F = unsafe extern "C" fn(CUevent) -> CUresult;
    // SAFETY: cuEventDestroy_v2(CUevent).
    if let Some(f) = unsafe { slots::CU_EVENT_DESTROY_V2.get::<F>() } {
        // SAFETY: an event this module created.
        unsafe { f(ev as CUevent) };
    }
}

/// Run `f` on this process's timing state (a forked child's starts empty: its parent's events
/// are not its own).
fn with_timing<R>(f: impl FnOnce(&mut Timing) -> R) -> R {
    let me = std::process::id();
    let mut g = lock(&TIMING);
    let t = g.get_or_insert_with(Timing::default);
    if t.pid != me {
        *t = Timing {
            pid: me,
            ..Timing::default()
        };
    }
    f(t)
}

/// A context is going away: its launches in flight and its free events go with it (not
/// destroyed: the driver destroys a context's events with it).
pub(crate) fn forget_context(ctx: usize) {
    let gone = with_timing(|t| {
        t.free.remove(&ctx);
        let (gone, kept) = std::mem::take(&mut t.pending)
            .into_iter()
            .partition(|p| p.ctx == ctx);
        t.pending = kept;
        gone
    });
    forgotten(gone);
}

/// Every context of this process may be going away (a primary context's reset or release).
pub(crate) fn forget_all() {
    let gone = with_timing(|t| {
        t.free.clear();
        std::mem::take(&mut t.pending)
    });
    forgotten(gone);
}

fn forgotten(gone: VecDeque<Pending>) {
    let admissions: Vec<Admission> = gone.iter().map(|p| p.admission).collect();
    if !admissions.is_empty() {
        abandon(&admissions, true);
    }
}

/// One completed launch: how it was admitted, and the ns between its events.
type Done = (Admission, f64);

/// Read back the events of launches that completed.
fn reap() -> Vec<Done> {
    type Query = unsafe extern "C" fn(CUevent) -> CUresult;
    type Elapsed = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
    type SetCurrent = unsafe extern "C" fn(CUcontext) -> CUresult;
    // SAFETY: the cuda.h signatures of these.
    let (Some(query), Some(elapsed), Some(set_current)) = (unsafe {
        (
            slots::CU_EVENT_QUERY.get::<Query>(),
            slots::CU_EVENT_ELAPSED_TIME_V2
                .get::<Elapsed>()
                .or_else(|| slots::CU_EVENT_ELAPSED_TIME.get::<Elapsed>()),
            slots::CU_CTX_SET_CURRENT.get::<SetCurrent>(),
        )
    }) else {
        return Vec::new();
    };
    let mut done = Vec::new();
    let mut freed: Vec<(usize, usize)> = Vec::new();
    let mut broken: Vec<Pending> = Vec::new();
    with_timing(|t| {
        let mut current = 0usize;
        // A stream runs in order: past its first launch still running, its others are too.
        let mut running: HashSet<(usize, usize, bool)> = HashSet::new();
        t.pending.retain(|p| {
            let stream = (p.ctx, p.stream.0, p.stream.1);
            if running.contains(&stream) {
                return true;
            }
            if current != p.ctx {
                // SAFETY: a context of this process that has not been destroyed (its launches
                // are forgotten first).
                unsafe { set_current(p.ctx as CUcontext) };
                current = p.ctx;
            }
            // SAFETY: events this module created and recorded.
            match unsafe { query(p.end as CUevent) } {
                CUDA_ERROR_NOT_READY => {
                    running.insert(stream);
                    true
                }
                CUDA_SUCCESS => {
                    let mut ms = 0f32;
                    // SAFETY: two completed events and an output that outlives the call.
                    let r = unsafe { elapsed(&mut ms, p.start as CUevent, p.end as CUevent) };
                    if r == CUDA_SUCCESS && ms.is_finite() {
                        done.push((p.admission, f64::from(ms.max(0.0)) * 1e6));
                        freed.push((p.ctx, p.start));
                        freed.push((p.ctx, p.end));
                    } else {
                        broken.push(*p);
                    }
                    false
                }
                _ => {
                    broken.push(*p);
                    false
                }
            }
        });
        if current != 0 {
            // SAFETY: as above; the reaper thread has no context of its own.
            unsafe { set_current(std::ptr::null_mut()) };
        }
    });
    for (ctx, ev) in freed {
        give_back(ctx, &[ev]);
    }
    for p in &broken {
        destroy(p.start);
        destroy(p.end);
    }
    let admissions: Vec<Admission> = broken.iter().map(|p| p.admission).collect();
    if !admissions.is_empty() {
        abandon(&admissions, true);
    }
    done
}

/// Start this process's reaper, once per process.
fn ensure_reaper(l: &'static Limited, percent: u32) {
    let me = std::process::id();
    // A load first: the launch path must not write the shared line every time.
    if REAPER.load(Ordering::Acquire) == me || REAPER.swap(me, Ordering::AcqRel) == me {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("crishim-vgpu".into())
        .spawn(move || reaper(l, percent));
    if let Err(e) = spawned {
        crate::warn(format_args!(
            "core limit {percent}%: no thread to measure kernels ({e}); launches are charged estimates"
        ));
    }
}

fn reaper(l: &'static Limited, percent: u32) {
    let mut sampler = crate::nvml::Samples::new(&l.config.device_uuids);
    let mut flushed = Instant::now();
    let mut sampled = Instant::now();
    let mut others_ns = None::<u64>;
    let mut polled_us = wall_us();
    loop {
        // Polled while launches are in flight; otherwise only the flushes and samples are due.
        let idle = with_timing(|t| t.pending.is_empty());
        std::thread::sleep(if idle { IDLE } else { POLL });
        let done = reap();
        let now = Instant::now();
        let end_us = wall_us();
        // What completed did so since the last poll: when, only as well as the poll was on time.
        let on_time = end_us.saturating_sub(polled_us) <= crate::limiter::EDGE_US;
        polled_us = end_us;
        if !done.is_empty() {
            with_limiter(percent, |lim| {
                for (admission, ns) in done {
                    lim.complete(admission, ns, end_us, on_time, now);
                }
            });
        }
        if now.duration_since(sampled) >= SAMPLES {
            sampled = now;
            // Own samples are told from foreign ones by the container's pids as the driver names
            // them; while this process's is not known, its samples would pass for another's.
            let known = crate::nvml::host_pid().is_some();
            if let (Some(s), true) = (&mut sampler, known) {
                let own = crate::nvml::own_pids(l);
                let seen = s.read();
                SAMPLED.store(true, Ordering::Relaxed);
                with_limiter(percent, |lim| {
                    for (pid, at_us) in seen {
                        let mine = own.contains(&pid);
                        if !mine {
                            FOREIGN_US.fetch_max(at_us, Ordering::Relaxed);
                        }
                        lim.sample(pid, mine, at_us);
                    }
                });
            }
        }
        if now.duration_since(flushed) >= FLUSH {
            flushed = now;
            let (add_ns, window) = with_limiter(percent, |lim| {
                let add = std::mem::take(&mut lim.unwritten_ns);
                (add, lim.windows.last(end_us / 1_000_000))
            });
            let throttled = crate::limiter::take_throttled();
            let r = lock(&l.ledger).flush_gpu_time(add_ns as u64, throttled, window);
            if let Ok(others) = r {
                // What the container's other processes were charged since the last look.
                if let Some(before) = others_ns {
                    let delta = others.saturating_sub(before);
                    if delta > 0 {
                        with_limiter(percent, |lim| lim.charge_others(delta as f64, now));
                    }
                }
                others_ns = Some(others);
            }
        }
    }
}
