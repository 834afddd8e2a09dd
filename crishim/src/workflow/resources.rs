//! A container's resources as the CRI's Linux resources, the way the kubelet converts them. Below
//! both `manifest`, which refuses a manifest whose quantities do not parse, and `translate`.

use crishim_proto::cri;
use k8s_openapi::api::core::v1::Container;

use super::error::WorkflowError;

const CPU_PERIOD: i64 = 100_000;

/// CPU and memory limits (and CPU requests as shares), the way the kubelet converts them.
pub fn resources(c: &Container) -> Result<cri::LinuxContainerResources, WorkflowError> {
    let r = c.resources.as_ref();
    let get = |which: &str, key: &str| {
        r.and_then(|r| match which {
            "limits" => r.limits.as_ref(),
            _ => r.requests.as_ref(),
        })
        .and_then(|m| m.get(key))
        .map(|q| {
            parse_quantity(&q.0).ok_or_else(|| {
                WorkflowError::Invalid(format!(
                    "container {:?}: resources.{which}.{key} {:?} is not a quantity",
                    c.name, q.0
                ))
            })
        })
        .transpose()
    };
    let mut out = cri::LinuxContainerResources::default();
    if let Some(cpu) = get("limits", "cpu")? {
        out.cpu_period = CPU_PERIOD;
        out.cpu_quota = ((cpu * CPU_PERIOD as f64).ceil() as i64).max(1000);
    }
    if let Some(cpu) = get("requests", "cpu")?.or(get("limits", "cpu")?) {
        out.cpu_shares = ((cpu * 1024.0) as i64).max(2);
    }
    if let Some(mem) = get("limits", "memory")? {
        out.memory_limit_in_bytes = mem.ceil() as i64;
    }
    get("requests", "memory")?;
    Ok(out)
}

/// A Kubernetes quantity (`500m`, `2`, `64Mi`, `1G`, `1e3`) as a number.
pub fn parse_quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        _ => return None,
    };
    Some(n * factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_kubernetes_writes_them() {
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("2"), Some(2.0));
        assert_eq!(parse_quantity("64Mi"), Some(64.0 * 1024.0 * 1024.0));
        assert_eq!(parse_quantity("1G"), Some(1e9));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("lots"), None);
        assert_eq!(parse_quantity("-1"), None);
        assert_eq!(parse_quantity("5Qi"), None);
    }

    #[test]
    fn limits_become_cfs_quota_and_memory_limit() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "a",
            "resources": {"limits": {"cpu": "250m", "memory": "128Mi"}}
        }))
        .unwrap();
        let r = resources(&c).unwrap();
        assert_eq!((r.cpu_period, r.cpu_quota), (100_000, 25_000));
        assert_eq!(r.cpu_shares, 256);
        assert_eq!(r.memory_limit_in_bytes, 128 << 20);
    }
}
