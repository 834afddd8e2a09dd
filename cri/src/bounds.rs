//! Bounds on what requests carry. A peer's `i64::MAX` seconds must never reach `Instant + Duration`
//! (which panics on overflow) or a timer, so every duration from a request is clamped here first.

use std::time::Duration;

/// The longest wait any request may ask for: a year, far beyond any grace period or exec timeout
/// and far below what `Instant` and tokio's timers can represent.
pub const MAX_REQUEST_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The most bytes of labels, and of annotations, one pod or container may carry: the Kubernetes
/// API's own limit on an object's annotations. Every relist and event repeats them, so without a
/// cap a few clients could push `ListPodSandbox` past the kubelet's 16 MiB message limit.
pub const MAX_METADATA_BYTES: usize = 256 << 10;

/// Labels or annotations over [`MAX_METADATA_BYTES`]; the request is `InvalidArgument`.
#[derive(Debug, thiserror::Error)]
#[error("{rpc}: {what} take {bytes} bytes, over the limit of {MAX_METADATA_BYTES}")]
pub struct OverLimit {
    pub rpc: &'static str,
    pub what: &'static str,
    pub bytes: usize,
}

/// Refuse labels or annotations over [`MAX_METADATA_BYTES`] (keys and values together).
pub fn check_metadata(
    rpc: &'static str,
    labels: &std::collections::HashMap<String, String>,
    annotations: &std::collections::HashMap<String, String>,
) -> Result<(), OverLimit> {
    for (what, map) in [("labels", labels), ("annotations", annotations)] {
        let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
        if bytes > MAX_METADATA_BYTES {
            return Err(OverLimit { rpc, what, bytes });
        }
    }
    Ok(())
}

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

    #[test]
    fn labels_and_annotations_are_capped() {
        let small: std::collections::HashMap<String, String> =
            [("app".to_string(), "web".to_string())].into();
        check_metadata("RunPodSandbox", &small, &small).unwrap();
        let big: std::collections::HashMap<String, String> = (0..300)
            .map(|i| (format!("k{i}"), "v".repeat(1024)))
            .collect();
        let e = check_metadata("RunPodSandbox", &small, &big).unwrap_err();
        assert_eq!(e.what, "annotations");
        assert!(e.to_string().contains("over the limit"), "{e}");
    }
}
