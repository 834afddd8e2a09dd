//! The core limit's arithmetic, with no driver calls (see `timing` for those): a container is
//! charged the GPU time its kernels take, measured with events on its own streams, and its
//! launches are paced so that this time over any window stays at its share of the wall clock.
//!
//! Nothing here depends on the GPU's size: a launch costs nanoseconds of GPU time, whatever the
//! number of SMs that ran it.
//!
//! - [`Pacer`]: a virtual-time token bucket (GCRA) in GPU time. Each nanosecond charged moves the
//!   container's virtual clock on by `1 / share` ns; a launch waits while that clock is ahead of
//!   the wall clock, at most [`MAX_WAIT`].
//! - [`Estimates`]: what a launch will cost, charged when it is made, so that the kernels in
//!   flight count before their events are read back; the difference is settled at completion.
//! - [`Dilation`]: under time-slicing, a kernel preempted mid-way by another context's time slice
//!   shows that slice in its events' elapsed time. NVML's per-process samples that fall while the
//!   container's kernels were in flight tell which part was its own; without such evidence the
//!   whole elapsed time is charged (never less strict than the limit).
//! - [`Windows`]: the GPU time of each whole second, for the measured share shown beside the limit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// No launch waits longer: a container charged far ahead (one huge kernel) must not hang.
pub const MAX_WAIT: Duration = Duration::from_secs(1);
/// Idle time a container may bank: after a pause it may run this long at full speed times its
/// share. Small, so that a 1-second window holds the share within a point or two.
const BURST: Duration = Duration::from_millis(20);
/// A launch need not wait for less than this: sleeping costs more than the GPU time it saves,
/// and launches made in a burst queue behind each other, so the GPU runs them back to back.
const SLACK: Duration = Duration::from_millis(1);

/// The virtual clock of one container's GPU time, relative to a fixed origin.
#[derive(Debug)]
pub struct Pacer {
    origin: Instant,
    /// Percent of one GPU, 1..=100.
    share: f64,
    /// The virtual clock, ns since `origin`: when the GPU time charged so far is paid for.
    virtual_ns: f64,
}

impl Pacer {
    pub fn new(percent: u32, now: Instant) -> Self {
        Pacer {
            origin: now,
            share: f64::from(percent.clamp(1, 100)) / 100.0,
            virtual_ns: 0.0,
        }
    }

    fn wall_ns(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.origin).as_nanos() as f64
    }

    /// Charge `gpu_ns` of GPU time (negative: give back an over-estimate) at `now`.
    pub fn charge(&mut self, gpu_ns: f64, now: Instant) {
        let floor = self.wall_ns(now) - BURST.as_nanos() as f64;
        let debt_cap = self.wall_ns(now) + 60e9;
        self.virtual_ns = (self.virtual_ns.max(floor) + gpu_ns / self.share).min(debt_cap);
    }

    /// How long a launch made at `now` must wait: zero while the container is within its share.
    pub fn wait(&self, now: Instant) -> Duration {
        let ahead = self.virtual_ns - self.wall_ns(now);
        if ahead <= SLACK.as_nanos() as f64 {
            return Duration::ZERO;
        }
        Duration::from_nanos(ahead as u64).min(MAX_WAIT)
    }
}

/// What identifies a launch's cost: a kernel and its grid, or an instantiated graph.
pub type Key = (usize, u64);

/// Most keys remembered; past that the map starts again (an application generating kernels
/// without end must not grow the process).
const MAX_KEYS: usize = 4096;

/// The expected GPU time of launches by key: an exponential average of what each took.
#[derive(Debug, Default)]
pub struct Estimates {
    by_key: HashMap<Key, f64>,
    /// Of every launch: for a key not seen yet.
    overall: f64,
}

impl Estimates {
    pub fn expect(&self, key: Key) -> f64 {
        self.by_key.get(&key).copied().unwrap_or(self.overall)
    }

    /// What `key`'s launches took, if one has completed.
    pub fn known(&self, key: Key) -> Option<f64> {
        self.by_key.get(&key).copied()
    }

    pub fn learn(&mut self, key: Key, gpu_ns: f64) {
        if self.by_key.len() >= MAX_KEYS && !self.by_key.contains_key(&key) {
            self.by_key.clear();
        }
        let e = self.by_key.entry(key).or_insert(gpu_ns);
        *e += 0.25 * (gpu_ns - *e);
        self.overall += 0.05 * (gpu_ns - self.overall);
    }
}

/// Host wall-clock spans (µs since the epoch) during which this process had a kernel in flight.
#[derive(Debug, Default)]
pub struct InFlight {
    spans: std::collections::VecDeque<(u64, u64)>,
}

/// Spans remembered: a few seconds' worth, as NVML's samples arrive a second or so late.
const MAX_SPANS: usize = 4096;
const SPAN_HORIZON_US: u64 = 5_000_000;
/// See [`InFlight::contains`]; also how late a poll may be for what it saw to place a span.
pub const EDGE_US: u64 = 1_000;
/// See [`InFlight::add`].
const TOUCH_US: u64 = 100;

impl InFlight {
    /// Add `[start, end]`, merging it with the last span where they touch (or nearly: the
    /// reaper's polls cut one stretch of work into pieces).
    pub fn add(&mut self, start: u64, end: u64) {
        if let Some(last) = self.spans.back_mut() {
            if start <= last.1.saturating_add(TOUCH_US) && end >= last.0 {
                *last = (last.0.min(start), last.1.max(end));
                return;
            }
        }
        self.spans.push_back((start, end));
        while self.spans.len() > MAX_SPANS
            || self
                .spans
                .front()
                .is_some_and(|s| s.1.saturating_add(SPAN_HORIZON_US) < end)
        {
            self.spans.pop_front();
        }
    }

    /// Whether `t` surely falls inside a span: spans are placed from when the reaper saw a
    /// completion, up to [`EDGE_US`] late, so their last [`EDGE_US`] may be past the end.
    pub fn contains(&self, t: u64) -> bool {
        self.spans
            .iter()
            .any(|&(a, b)| a <= t && t.saturating_add(EDGE_US) <= b)
    }
}

/// How much of the time the container's kernels are in flight is its own GPU time.
#[derive(Debug)]
pub struct Dilation {
    own: f64,
    other: f64,
    /// Other processes NVML gave samples to lately: pid → when, µs.
    neighbours: HashMap<u32, u64>,
    /// The newest sample seen, µs.
    latest: u64,
}

/// A process with a sample this recent is a neighbour.
const NEIGHBOUR_US: u64 = 2_000_000;
/// Neighbours remembered (a GPU runs far fewer processes at once).
const MAX_NEIGHBOURS: usize = 256;

/// See [`Dilation::factor`].
const PRIOR: f64 = 4.0;

/// Each sample's weight decays by this per newer sample: about the last 60 samples count.
const DECAY: f64 = 1.0 - 1.0 / 60.0;

impl Default for Dilation {
    fn default() -> Self {
        Dilation {
            own: 0.0,
            other: 0.0,
            neighbours: HashMap::new(),
            latest: 0,
        }
    }
}

impl Dilation {
    /// A sample that fell while a kernel of ours was in flight: `own` if NVML gave it to one of
    /// the container's processes, else another process held the GPU then.
    pub fn observe(&mut self, own: bool) {
        self.own *= DECAY;
        self.other *= DECAY;
        if own {
            self.own += 1.0;
        } else {
            self.other += 1.0;
        }
    }

    /// A sample at `at_us` gave the GPU to `pid`, another process (`foreign`) or ours.
    pub fn held(&mut self, pid: u32, foreign: bool, at_us: u64) {
        self.latest = self.latest.max(at_us);
        if foreign {
            if self.neighbours.len() >= MAX_NEIGHBOURS && !self.neighbours.contains_key(&pid) {
                self.neighbours.clear();
            }
            let seen = self.neighbours.entry(pid).or_default();
            *seen = (*seen).max(at_us);
        }
        let latest = self.latest;
        self.neighbours
            .retain(|_, at| at.saturating_add(NEIGHBOUR_US) >= latest);
    }

    /// The part of the in-flight time that is the container's: what the samples in flight say,
    /// starting from [`PRIOR`] samples' worth of what time-slicing would give with every
    /// neighbour busy (1 alone, 1/2 beside one, …), never under 1/8.
    pub fn factor(&self) -> f64 {
        let guess = 1.0 / (1.0 + self.neighbours.len() as f64);
        ((self.own + PRIOR * guess) / (self.own + self.other + PRIOR)).clamp(0.125, 1.0)
    }
}

/// GPU time by whole seconds of the wall clock: the last complete second's share.
#[derive(Debug, Default)]
pub struct Windows {
    /// (second, ns) of the second being filled; none before the first launch completed.
    current: Option<(u64, f64)>,
    /// (second, permille) of the last complete one.
    last: Option<(u64, u32)>,
}

impl Windows {
    /// Add `gpu_ns` that completed during wall-clock second `second` (since the epoch).
    pub fn add(&mut self, second: u64, gpu_ns: f64) {
        self.roll(second);
        let current = self.current.get_or_insert((second, 0.0));
        current.1 += gpu_ns;
    }

    /// The last complete second and its share, permille of one GPU, as of `second`.
    pub fn last(&mut self, second: u64) -> Option<(u64, u32)> {
        self.roll(second);
        self.last
    }

    fn roll(&mut self, second: u64) {
        let Some((at, ns)) = self.current else {
            return;
        };
        if second > at {
            let permille = (ns / 1e6).round().clamp(0.0, 1000.0) as u32;
            self.last = Some(if second == at + 1 {
                (at, permille)
            } else {
                // A second with nothing completed in it.
                (second - 1, 0)
            });
            self.current = Some((second, 0.0));
        }
    }
}

/// One process's core limiter: what its launches are charged and how long they wait.
#[derive(Debug)]
pub struct Limiter {
    pub pacer: Pacer,
    pub estimates: Estimates,
    pub in_flight: InFlight,
    pub dilation: Dilation,
    pub windows: Windows,
    /// GPU time charged, ns, not yet written to the ledger.
    pub unwritten_ns: f64,
    /// Launches in flight that were admitted with no estimate for their key.
    unknown_in_flight: u32,
}

/// See [`Limiter::complete`].
const PREEMPTED: f64 = 2.0;
/// See [`Limiter::complete`]: no shorter than the longest time slices, and twice
/// [`EDGE_US`], so that a sample can fall inside such a launch's span at all.
const LONG: Duration = Duration::from_millis(2);

/// How often a launch of a kernel with no estimate yet looks again whether it may go.
const UNKNOWN_POLL: Duration = Duration::from_millis(1);

/// What a launch was admitted with, settled when it completes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admission {
    pub key: Key,
    /// GPU time charged for it in advance, ns.
    pub estimate: f64,
    /// No launch of its key had completed.
    pub unknown: bool,
}

impl Limiter {
    pub fn new(percent: u32, now: Instant) -> Self {
        Limiter {
            pacer: Pacer::new(percent, now),
            estimates: Estimates::default(),
            in_flight: InFlight::default(),
            dilation: Dilation::default(),
            windows: Windows::default(),
            unwritten_ns: 0.0,
            unknown_in_flight: 0,
        }
    }

    /// Admit a launch of `key` at `now`, the launch having `waited` so far: its [`Admission`],
    /// charged, or how long to wait first. A launch waits for the pacer once; a launch of a key
    /// with no estimate yet also waits, up to [`MAX_WAIT`] in all, while another such launch is
    /// in flight, so that a new kernel cannot be queued by the thousand before the first of
    /// them says what it takes.
    pub fn admit(
        &mut self,
        key: Key,
        now: Instant,
        waited: Duration,
    ) -> Result<Admission, Duration> {
        if waited.is_zero() {
            let wait = self.pacer.wait(now);
            if !wait.is_zero() {
                return Err(wait);
            }
        }
        let estimate = self.estimates.known(key);
        if estimate.is_none() && self.unknown_in_flight > 0 && waited < MAX_WAIT {
            return Err(UNKNOWN_POLL.min(MAX_WAIT - waited));
        }
        if estimate.is_none() {
            self.unknown_in_flight += 1;
        }
        let a = Admission {
            key,
            estimate: estimate.unwrap_or_else(|| self.estimates.expect(key)),
            unknown: estimate.is_none(),
        };
        self.pacer.charge(a.estimate, now);
        Ok(a)
    }

    /// An admitted launch will not complete here: the driver refused it (`made` false: its
    /// estimate is given back), or it went unmeasured (its estimate stands).
    pub fn abandon(&mut self, a: Admission, made: bool, now: Instant) {
        if !made {
            self.pacer.charge(-a.estimate, now);
        }
        if a.unknown {
            self.unknown_in_flight = self.unknown_in_flight.saturating_sub(1);
        }
    }

    /// An admitted launch completed: its events were `elapsed_ns` apart, and the end was seen
    /// at `end_us` (wall clock, µs since the epoch; `placed` if that is within a poll of the
    /// end). What it is charged: its own part of that time.
    ///
    /// Only a launch longer than a time slice ([`LONG`]) can hold another context's whole slice
    /// in every run: such launches are charged the [`Dilation`] factor, and, where placed, say
    /// where NVML's samples count. A shorter one caught by a slice shows it as a launch far
    /// longer than its kernel usually takes: charged at most [`PREEMPTED`] times the usual (a
    /// kernel that really grew is learnt within a few launches, as the estimate moves by a
    /// quarter each time).
    pub fn complete(
        &mut self,
        a: Admission,
        elapsed_ns: f64,
        end_us: u64,
        placed: bool,
        now: Instant,
    ) -> f64 {
        let elapsed_ns = elapsed_ns.clamp(0.0, 3600e9);
        let long = elapsed_ns >= LONG.as_nanos() as f64;
        let mut own = elapsed_ns;
        if long {
            own *= self.dilation.factor();
            if placed {
                let start_us = end_us.saturating_sub((elapsed_ns / 1e3) as u64);
                self.in_flight.add(start_us, end_us);
            }
        }
        if !a.unknown && a.estimate > 0.0 {
            own = own.min(PREEMPTED * a.estimate);
        }
        self.pacer.charge(own - a.estimate, now);
        self.estimates.learn(a.key, own);
        if a.unknown {
            self.unknown_in_flight = self.unknown_in_flight.saturating_sub(1);
        }
        self.windows.add(end_us / 1_000_000, own);
        self.unwritten_ns += own;
        own
    }

    /// GPU time the container's other processes were charged (from the ledger).
    pub fn charge_others(&mut self, gpu_ns: f64, now: Instant) {
        self.pacer.charge(gpu_ns, now);
    }

    /// An NVML sample at `at_us` (wall clock) gave the GPU to `pid`, one of the container's
    /// processes (`own`) or another.
    pub fn sample(&mut self, pid: u32, own: bool, at_us: u64) {
        self.dilation.held(pid, !own, at_us);
        if self.in_flight.contains(at_us) {
            self.dilation.observe(own);
        }
    }
}

/// Microseconds this process's launches waited, not yet written to the ledger.
static THROTTLED_US: AtomicU64 = AtomicU64::new(0);

/// Count time a launch was held back; the watcher writes it to the ledger.
pub(crate) fn note_throttled(wait: Duration) {
    THROTTLED_US.fetch_add(wait.as_micros() as u64, Ordering::Relaxed);
}

/// The time launches waited since the last call, in microseconds.
pub(crate) fn take_throttled() -> u64 {
    THROTTLED_US.swap(0, Ordering::Relaxed)
}

/// A forked child starts with none of its parent's unwritten time.
pub(crate) fn forget_throttled() {
    THROTTLED_US.store(0, Ordering::Relaxed);
}

/// A launch's grid size, in blocks: part of its [`Key`].
pub(crate) fn blocks(x: u32, y: u32, z: u32) -> u64 {
    u64::from(x)
        .saturating_mul(u64::from(y))
        .saturating_mul(u64::from(z))
}

#[cfg(test)]
mod tests;
