//! The core limit: a token bucket on kernel launches, as vcuda and HAMi-core do.
//!
//! A launch costs its grid size in blocks. Tokens refill at a rate that a watcher thread tunes
//! every [`PERIOD`] from the GPU's utilization (NVML): above the target percent the rate shrinks,
//! below it grows, so the container's kernels get about their share of the GPU's time. Without
//! NVML there is nothing to steer by, and launches are not throttled (said once on stderr).

use std::time::{Duration, Instant};

/// How often the watcher samples utilization and adjusts the rate.
pub const PERIOD: Duration = Duration::from_millis(100);
/// The bucket holds this much time's worth of tokens: bursts stay short.
const BURST: Duration = Duration::from_millis(50);
const MIN_RATE: f64 = 1000.0;
/// No launch waits longer: a controller that steered too far must not hang a process.
const MAX_WAIT: Duration = Duration::from_secs(1);
const MAX_RATE: f64 = 1e12;

#[derive(Debug)]
pub struct Bucket {
    /// Blocks per second.
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// Unthrottled until the watcher has seen the GPU busy.
    pub fn new(now: Instant) -> Self {
        Bucket {
            rate: MAX_RATE,
            tokens: MAX_RATE * BURST.as_secs_f64(),
            last: now,
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
        self.tokens = (self.tokens - cost as f64).max(-self.rate * MAX_WAIT.as_secs_f64());
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }

    /// Steer the rate towards `target` percent from an observed `utilization` percent.
    pub fn steer(&mut self, target: u32, utilization: u32, now: Instant) {
        self.refill(now);
        let target = f64::from(target.clamp(1, 100));
        let observed = f64::from(utilization.min(100));
        let factor = if observed > target {
            // Busier than allowed: slow down in proportion, at least a little.
            (target / observed).clamp(0.5, 0.95)
        } else if observed < target * 0.9 {
            1.25
        } else {
            1.0
        };
        self.rate = (self.rate * factor).clamp(MIN_RATE, MAX_RATE);
        self.tokens = self.tokens.min(self.capacity());
    }
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
        b.steer(50, 48, t0 + PERIOD * 2);
        assert_eq!(b.rate(), r, "close to the target: unchanged");
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
