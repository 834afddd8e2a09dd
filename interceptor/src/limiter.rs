//! The core limit: a token bucket on kernel launches, as vcuda and HAMi-core do.
//!
//! A launch costs its grid size in blocks. Tokens refill at a rate that a watcher thread tunes
//! from the GPU's utilization (NVML) each time it has a new reading. The rate moves in
//! proportion to how far the reading is from the target, in log space, so that it settles
//! where the readings *average* the target: a time-slicing GPU attributes each of its samples
//! to one process, and the container's readings then jump between 0 and 99. Without NVML there
//! is nothing to steer by, and launches are not throttled (said once on stderr).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the watcher looks for a new utilization reading.
pub const PERIOD: Duration = Duration::from_millis(100);
/// The bucket holds this much time's worth of tokens: bursts stay short.
const BURST: Duration = Duration::from_millis(50);
const MIN_RATE: f64 = 1000.0;
/// No launch waits longer: a controller that steered too far must not hang a process.
const MAX_WAIT: Duration = Duration::from_secs(1);
const MAX_RATE: f64 = 1e12;
/// The log of the rate moves by this times the error relative to the target, per reading.
const GAIN: f64 = 0.3;
/// The most one reading moves the rate: halved at most, or grown by half.
const MAX_STEP_DOWN: f64 = -std::f64::consts::LN_2;
const MAX_STEP_UP: f64 = 0.4;

#[derive(Debug)]
pub struct Bucket {
    /// Blocks per second.
    rate: f64,
    tokens: f64,
    last: Instant,
    /// Blocks taken since the last steer, and when that was: the rate the process really used.
    taken: f64,
    steered: Instant,
}

impl Bucket {
    /// Unthrottled until the watcher has seen the GPU busy.
    pub fn new(now: Instant) -> Self {
        Bucket {
            rate: MAX_RATE,
            tokens: MAX_RATE * BURST.as_secs_f64(),
            last: now,
            taken: 0.0,
            steered: now,
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    fn capacity(&self) -> f64 {
        (self.rate * BURST.as_secs_f64()).max(1.0)
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.capacity());
        self.last = now;
    }

    /// Take `cost` tokens at `now`: how long the launch must wait first (zero when tokens were
    /// there). The bucket may go negative, so a launch bigger than the bucket still runs, later,
    /// but never more than [`MAX_WAIT`] later.
    pub fn take(&mut self, cost: u64, now: Instant) -> Duration {
        self.refill(now);
        self.taken += cost as f64;
        self.tokens = (self.tokens - cost as f64).max(-self.rate * MAX_WAIT.as_secs_f64());
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }

    /// Steer the rate towards `target` percent from a new `utilization` reading, percent.
    pub fn steer(&mut self, target: u32, utilization: u32, now: Instant) {
        self.refill(now);
        let target = f64::from(target.clamp(1, 100));
        let observed = f64::from(utilization.min(100));
        let since = now.saturating_duration_since(self.steered).as_secs_f64();
        if observed > target && since > 0.0 {
            // Slow down from what the process used, not from a rate it never reached (the
            // bucket starts unthrottled).
            let used = std::mem::take(&mut self.taken) / since;
            self.rate = self.rate.min((2.0 * used).max(MIN_RATE));
        }
        self.taken = 0.0;
        self.steered = now;
        let step = (GAIN * (target - observed) / target).clamp(MAX_STEP_DOWN, MAX_STEP_UP);
        self.rate = (self.rate * step.exp()).clamp(MIN_RATE, MAX_RATE);
        self.tokens = self.tokens.min(self.capacity());
    }
}

/// A launch's grid size: what it costs, in blocks.
pub(crate) fn blocks(x: u32, y: u32, z: u32) -> u64 {
    u64::from(x)
        .saturating_mul(u64::from(y))
        .saturating_mul(u64::from(z))
}

/// The core limiter's bucket, shared by the process's threads.
pub(crate) static BUCKET: Mutex<Option<Bucket>> = Mutex::new(None);

/// Hold the bucket's lock across a `fork` (see `state::register_fork_handlers`).
pub(crate) fn hold_for_fork(held: &mut Vec<Box<dyn std::any::Any>>) {
    held.push(Box::new(crate::lock(&BUCKET)));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launches_within_the_bucket_do_not_wait_and_beyond_it_they_do() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        assert_eq!(b.take(1000, t0), Duration::ZERO);
        // Steer down hard: 100% busy against 25%.
        for i in 0..200 {
            b.steer(25, 100, t0 + PERIOD * i);
        }
        assert_eq!(b.rate(), MIN_RATE);
        let t = t0 + PERIOD * 200;
        b.take(MIN_RATE as u64 / 20, t);
        let wait = b.take(MIN_RATE as u64 / 2, t);
        assert!(wait >= Duration::from_millis(450), "{wait:?}");
        assert_eq!(b.take(u64::MAX, t), MAX_WAIT, "bounded");
    }

    #[test]
    fn steering_converges_both_ways() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        b.steer(50, 100, t0);
        let slowed = b.rate();
        assert!(slowed < MAX_RATE);
        b.steer(50, 10, t0 + PERIOD);
        assert!(b.rate() > slowed);
        let r = b.rate();
        b.steer(50, 50, t0 + PERIOD * 2);
        assert_eq!(b.rate(), r, "at the target: unchanged");
    }

    /// Drive a bucket for `steps` readings 200 ms apart (NVML's sample period), with a process
    /// that launches all its tokens allow, at most `cap` blocks a second. `reading` maps the
    /// share of the GPU the process got in a step (0..=1) and the step's number to the reading
    /// NVML gives. The mean share over the second half of the steps.
    fn drive(target: u32, steps: u32, cap: f64, reading: impl Fn(f64, u32) -> u32) -> f64 {
        const FULL: f64 = 1e6; // blocks a second the GPU runs alone
        let dt = Duration::from_millis(200);
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        let mut shares = Vec::new();
        for i in 0..steps {
            let used = b.rate().min(cap) * dt.as_secs_f64();
            b.take(used as u64, t0 + dt * i);
            let share = used / dt.as_secs_f64() / FULL;
            if i >= steps / 2 {
                shares.push(share);
            }
            b.steer(target, reading(share, i), t0 + dt * (i + 1));
        }
        shares.iter().sum::<f64>() / shares.len() as f64
    }

    #[test]
    fn alone_the_share_settles_at_the_target() {
        for target in [10, 30, 70] {
            let got = drive(target, 100, 1e6, |share, _| (share * 100.0) as u32);
            let want = f64::from(target) / 100.0;
            assert!((got - want).abs() < 0.03, "{target}%: got {got:.3}");
        }
    }

    #[test]
    fn time_sliced_samples_that_read_all_or_nothing_average_to_the_target() {
        // A busy neighbour time-slices with the process: NVML gives each sample to one
        // process, at 99. The process gets a sample in proportion to its share of the GPU's
        // time; a fixed pseudo-random sequence decides which.
        let mut seed = 0x2545_f491_u64;
        let draws: Vec<f64> = (0..400)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed % 10_000) as f64 / 10_000.0
            })
            .collect();
        let got = drive(30, 400, 0.5e6, |share, i| {
            if draws[i as usize] < share {
                99
            } else {
                0
            }
        });
        assert!((0.25..=0.33).contains(&got), "got {got:.3} for 30%");
    }

    #[test]
    fn tokens_refill_with_time() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        for i in 0..100 {
            b.steer(10, 100, t0 + PERIOD * i);
        }
        let t = t0 + PERIOD * 100;
        assert!(!b.take(1_000_000, t).is_zero());
        let later = t + MAX_WAIT + Duration::from_millis(100);
        assert_eq!(b.take(1, later), Duration::ZERO);
    }
}
