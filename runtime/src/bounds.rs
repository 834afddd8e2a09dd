//! Bounds on what requests carry. A peer's `i64::MAX` seconds must never reach `Instant + Duration`
//! (which panics on overflow) or a timer, so every duration from a request is clamped here first.

use std::time::Duration;

/// The longest wait any request may ask for: a year, far beyond any grace period or exec timeout
/// and far below what `Instant` and tokio's timers can represent.
pub const MAX_REQUEST_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// `secs` from a request as a duration: negative is zero, huge is [`MAX_REQUEST_DURATION`].
pub fn request_secs(secs: i64) -> Duration {
    Duration::from_secs(secs.clamp(0, MAX_REQUEST_DURATION.as_secs() as i64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_durations_are_clamped_before_arithmetic() {
        assert_eq!(request_secs(-5), Duration::ZERO);
        assert_eq!(request_secs(30), Duration::from_secs(30));
        assert_eq!(request_secs(i64::MAX), MAX_REQUEST_DURATION);
        // What the handlers do with it must not overflow.
        let _ = std::time::Instant::now() + request_secs(i64::MAX);
        let _ = tokio::time::Instant::now() + request_secs(i64::MAX);
    }
}
