//! Prometheus metrics: `[metrics] address = "127.0.0.1:1338"` serves the text format at
//! `/metrics` (off when unset). Counters and histograms are kept in memory by the code that sees
//! the event; gauges of pods, containers and shims are read from the store at scrape time.
//!
//! Label values come from a fixed set (RPC names, gRPC codes, states), never from requests, so
//! the number of series is bounded.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` to serve `/metrics` on; unset: no endpoint.
    #[serde(default)]
    pub address: Option<String>,
}

/// Upper bounds (seconds) of the latency histograms' buckets.
const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
/// Upper bounds (seconds) of the pull-duration buckets: pulls take seconds to many minutes.
const PULL_BUCKETS: [f64; 10] = [0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];

#[derive(Debug, Clone, Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], secs: f64) {
        if self.counts.len() != bounds.len() {
            self.counts = vec![0; bounds.len()];
        }
        for (i, b) in bounds.iter().enumerate() {
            if secs <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += secs;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str, bounds: &[f64]) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in bounds.iter().enumerate() {
            let n = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

#[derive(Default)]
struct State {
    requests: BTreeMap<(&'static str, String), u64>,
    durations: BTreeMap<&'static str, Histogram>,
    pod_start: Histogram,
    pull_bytes: u64,
    pull_duration: Histogram,
    pulls: BTreeMap<&'static str, u64>,
    oom_kills: u64,
    /// Chunk errors per lazy layer as last scraped, and those of layers gone since: the
    /// counter stays monotonic when a layer's server goes.
    lazy_errors: BTreeMap<String, u64>,
    lazy_errors_gone: u64,
}

/// The process's metrics.
#[derive(Default)]
pub struct Metrics {
    state: Mutex<State>,
}

/// The one set of metrics of this process.
pub fn global() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(Metrics::default)
}

/// What the store says at scrape time.
#[derive(Debug, Default, Clone)]
pub struct Gauges {
    pub pods: BTreeMap<&'static str, u64>,
    pub containers: BTreeMap<&'static str, u64>,
    pub shims: u64,
    /// GPU containers with a memory limit.
    pub gpu: Vec<crishim_gpu::container::GpuUsage>,
    /// Lazy layers (chain ID hex) and where each stands.
    pub lazy: Vec<(String, crishim_images::LazyStatus)>,
}

impl Metrics {
    /// One CRI call: its method, gRPC code (`OK`, `NotFound`, …) and duration.
    pub fn request(&self, method: &'static str, code: tonic::Code, took: Duration) {
        let mut s = self.state.lock().unwrap();
        let code = if code == tonic::Code::Ok {
            "OK".to_string()
        } else {
            format!("{code:?}")
        };
        *s.requests.entry((method, code)).or_default() += 1;
        s.durations
            .entry(method)
            .or_default()
            .observe(&LATENCY_BUCKETS, took.as_secs_f64());
    }

    /// From `RunPodSandbox` to the pod's first container started.
    pub fn pod_started(&self, took: Duration) {
        let mut s = self.state.lock().unwrap();
        s.pod_start.observe(&LATENCY_BUCKETS, took.as_secs_f64());
    }

    /// One `PullImage`: its outcome, and for a success the image's size.
    pub fn pull(&self, ok: bool, bytes: u64, took: Duration) {
        let mut s = self.state.lock().unwrap();
        *s.pulls
            .entry(if ok { "success" } else { "failure" })
            .or_default() += 1;
        if ok {
            s.pull_bytes = s.pull_bytes.saturating_add(bytes);
            s.pull_duration.observe(&PULL_BUCKETS, took.as_secs_f64());
        }
    }

    pub fn oom_killed(&self) {
        self.state.lock().unwrap().oom_kills += 1;
    }

    /// The Prometheus text exposition of everything, with `gauges` read now.
    pub fn render(&self, gauges: &Gauges) -> String {
        let mut s = self.state.lock().unwrap();
        let now: BTreeMap<String, u64> = gauges
            .lazy
            .iter()
            .map(|(k, v)| (k.clone(), v.chunk_errors))
            .collect();
        let gone: u64 = s
            .lazy_errors
            .iter()
            .filter(|(k, _)| !now.contains_key(*k))
            .map(|(_, v)| v)
            .sum();
        s.lazy_errors_gone += gone;
        s.lazy_errors = now;
        let mut out = String::new();
        head(
            &mut out,
            "crishim_cri_requests_total",
            "counter",
            "CRI calls by method and gRPC code.",
        );
        for ((method, code), n) in &s.requests {
            let _ = writeln!(
                out,
                "crishim_cri_requests_total{{method=\"{method}\",code=\"{code}\"}} {n}"
            );
        }
        head(
            &mut out,
            "crishim_cri_request_duration_seconds",
            "histogram",
            "CRI call latency by method.",
        );
        for (method, h) in &s.durations {
            h.render(
                &mut out,
                "crishim_cri_request_duration_seconds",
                &format!("method=\"{method}\""),
                &LATENCY_BUCKETS,
            );
        }
        head(
            &mut out,
            "crishim_pod_start_duration_seconds",
            "histogram",
            "From RunPodSandbox to the pod's first container started.",
        );
        s.pod_start.render(
            &mut out,
            "crishim_pod_start_duration_seconds",
            "",
            &LATENCY_BUCKETS,
        );
        head(
            &mut out,
            "crishim_image_pull_bytes_total",
            "counter",
            "Bytes of images pulled.",
        );
        let _ = writeln!(out, "crishim_image_pull_bytes_total {}", s.pull_bytes);
        head(
            &mut out,
            "crishim_image_pull_duration_seconds",
            "histogram",
            "Duration of successful pulls.",
        );
        s.pull_duration.render(
            &mut out,
            "crishim_image_pull_duration_seconds",
            "",
            &PULL_BUCKETS,
        );
        head(
            &mut out,
            "crishim_image_pulls_total",
            "counter",
            "Pulls by result.",
        );
        for result in ["success", "failure"] {
            let n = s.pulls.get(result).copied().unwrap_or(0);
            let _ = writeln!(out, "crishim_image_pulls_total{{result=\"{result}\"}} {n}");
        }
        head(
            &mut out,
            "crishim_oom_kills_total",
            "counter",
            "Containers the OOM killer ended.",
        );
        let _ = writeln!(out, "crishim_oom_kills_total {}", s.oom_kills);
        render_lazy(&mut out, &s, &gauges.lazy);
        head(&mut out, "crishim_pods", "gauge", "Pod sandboxes by state.");
        for (state, n) in &gauges.pods {
            let _ = writeln!(out, "crishim_pods{{state=\"{state}\"}} {n}");
        }
        head(
            &mut out,
            "crishim_containers",
            "gauge",
            "Containers by state.",
        );
        for (state, n) in &gauges.containers {
            let _ = writeln!(out, "crishim_containers{{state=\"{state}\"}} {n}");
        }
        head(
            &mut out,
            "crishim_shims",
            "gauge",
            "Pod shims being followed.",
        );
        let _ = writeln!(out, "crishim_shims {}", gauges.shims);
        // Container IDs are the daemon's own hex names; anything else is not printed.
        let safe = |id: &str| id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric());
        let shown = || gauges.gpu.iter().filter(|g| safe(&g.container_id));
        fn id(g: &crishim_gpu::container::GpuUsage) -> &str {
            &g.container_id
        }
        per_container(
            &mut out,
            ("crishim_gpu_memory_limit_bytes", "gauge"),
            "GPU memory a container may hold, over all its GPUs.",
            shown().filter_map(|g| Some((id(g), g.limit_bytes?))),
        );
        per_container(
            &mut out,
            ("crishim_gpu_memory_used_bytes", "gauge"),
            "GPU memory a container's processes hold, from its accounting file.",
            shown()
                .filter(|g| g.limit_bytes.is_some())
                .map(|g| (id(g), g.used_bytes)),
        );
        per_container(
            &mut out,
            ("crishim_gpu_throttled_seconds_total", "counter"),
            "Time the core limiter has held a container's kernel launches back.",
            shown().map(|g| (id(g), g.throttled_us as f64 / 1e6)),
        );
        let cores = || shown().filter(|g| g.core_percent.is_some());
        per_container(
            &mut out,
            ("crishim_gpu_core_limit_percent", "gauge"),
            "A container's core limit, percent of one GPU.",
            shown().filter_map(|g| Some((id(g), g.core_percent?))),
        );
        per_container(
            &mut out,
            ("crishim_gpu_core_share_percent", "gauge"),
            "The share of one GPU a container's kernels took in the last whole second, as the core limiter measured it.",
            cores().filter_map(|g| Some((id(g), f64::from(g.share_permille?) / 10.0))),
        );
        per_container(
            &mut out,
            ("crishim_gpu_time_seconds_total", "counter"),
            "GPU time a container's kernels took, as the core limiter measured it.",
            cores().map(|g| (id(g), g.gpu_ns as f64 / 1e9)),
        );
        out
    }
}

/// Lazy layers by state, their bytes, and the chunks refused for failing their digest.
fn render_lazy(out: &mut String, s: &State, lazy: &[(String, crishim_images::LazyStatus)]) {
    use crishim_images::LazyState;
    head(out, "crishim_lazy_layers", "gauge", "Lazy layers by state.");
    for (state, name) in [
        (LazyState::Lazy, "lazy"),
        (LazyState::Local, "local"),
        (LazyState::Quarantined, "quarantined"),
    ] {
        let n = lazy.iter().filter(|(_, l)| l.state == state).count();
        let _ = writeln!(out, "crishim_lazy_layers{{state=\"{name}\"}} {n}");
    }
    let sum =
        |f: fn(&crishim_images::LazyStatus) -> u64| -> u64 { lazy.iter().map(|(_, l)| f(l)).sum() };
    for (name, help, v) in [
        (
            "crishim_lazy_local_bytes",
            "Compressed bytes of lazy layers held locally.",
            sum(|l| l.local_bytes),
        ),
        (
            "crishim_lazy_size_bytes",
            "Compressed bytes of lazy layers in all.",
            sum(|l| l.size_bytes),
        ),
    ] {
        head(out, name, "gauge", help);
        let _ = writeln!(out, "{name} {v}");
    }
    head(
        out,
        "crishim_lazy_chunk_errors_total",
        "counter",
        "Chunks of lazy layers that failed their digest (each read got EIO).",
    );
    let errors = s.lazy_errors_gone + s.lazy_errors.values().sum::<u64>();
    let _ = writeln!(out, "crishim_lazy_chunk_errors_total {errors}");
}

/// A metric's `# HELP` and `# TYPE` lines.
fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A series with one sample per GPU container: its head, then `name{container="…"} value`.
fn per_container<'a, V: std::fmt::Display>(
    out: &mut String,
    (name, kind): (&str, &str),
    help: &str,
    rows: impl Iterator<Item = (&'a str, V)>,
) {
    head(out, name, kind, help);
    for (container, value) in rows {
        let _ = writeln!(out, "{name}{{container=\"{container}\"}} {value}");
    }
}

/// Connections served at once.
const MAX_SCRAPES: usize = 16;

/// The most a scrape waits for its gauges (the GPU usage in them has a 2 s deadline of its own).
const GAUGES_DEADLINE: Duration = Duration::from_secs(3);

/// Serve `/metrics` on `listener` until the process ends: one small GET per connection.
pub async fn serve(
    listener: tokio::net::TcpListener,
    gauges: impl Fn() -> Gauges + Send + Sync + 'static,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gauges = std::sync::Arc::new(gauges);
    // Scrapes at once; more wait for a slot (each holds one for at most its 5 s read).
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok((mut sock, _)) = listener.accept().await else {
            // Out of descriptors, say: back off rather than spin.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let gauges = gauges.clone();
        tokio::spawn(async move {
            let _slot = slot;
            // A request head is small; a peer that sends more, or nothing, is dropped.
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                true
            })
            .await;
            if read != Ok(true) {
                return;
            }
            let line = String::from_utf8_lossy(&head);
            let (status, body) = if line.starts_with("GET /metrics ") {
                // The gauges read files containers write (the GPU accounting files): never on
                // an async worker, and never for longer than the deadline.
                let read = tokio::task::spawn_blocking(move || gauges());
                match tokio::time::timeout(GAUGES_DEADLINE, read).await {
                    Ok(Ok(g)) => ("200 OK", global().render(&g)),
                    _ => (
                        "503 Service Unavailable",
                        "the gauges took too long to read\n".to_string(),
                    ),
                }
            } else {
                ("404 Not Found", "not found: try /metrics\n".to_string())
            };
            let reply = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(reply.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_has_every_family_and_counts() {
        let m = Metrics::default();
        m.request("RunPodSandbox", tonic::Code::Ok, Duration::from_millis(30));
        m.request(
            "RunPodSandbox",
            tonic::Code::NotFound,
            Duration::from_millis(2),
        );
        m.pod_started(Duration::from_millis(80));
        m.pull(true, 1000, Duration::from_secs(2));
        m.pull(false, 0, Duration::from_secs(1));
        m.oom_killed();
        let g = Gauges {
            pods: [("ready", 2)].into(),
            containers: [("running", 3), ("exited", 1)].into(),
            shims: 2,
            gpu: vec![
                crishim_gpu::container::GpuUsage {
                    container_id: "abc123".into(),
                    limit_bytes: Some(256 << 20),
                    used_bytes: 100 << 20,
                    throttled_us: 2_500_000,
                    core_percent: Some(30),
                    gpu_ns: 1_500_000_000,
                    share_permille: Some(298),
                },
                crishim_gpu::container::GpuUsage {
                    container_id: "bad\"}\n1".into(),
                    limit_bytes: Some(1),
                    used_bytes: 1,
                    throttled_us: 1,
                    core_percent: Some(1),
                    gpu_ns: 1,
                    share_permille: Some(1),
                },
            ],
            lazy: vec![(
                "ab".into(),
                crishim_images::LazyStatus {
                    state: crishim_images::LazyState::Lazy,
                    local_bytes: 10,
                    size_bytes: 100,
                    fetched_bytes: 10,
                    chunk_errors: 2,
                    reason: None,
                },
            )],
        };
        let text = m.render(&g);
        for line in [
            "crishim_cri_requests_total{method=\"RunPodSandbox\",code=\"OK\"} 1",
            "crishim_cri_requests_total{method=\"RunPodSandbox\",code=\"NotFound\"} 1",
            "crishim_cri_request_duration_seconds_bucket{method=\"RunPodSandbox\",le=\"0.0025\"} 1",
            "crishim_cri_request_duration_seconds_count{method=\"RunPodSandbox\"} 2",
            "crishim_pod_start_duration_seconds_bucket{le=\"0.1\"} 1",
            "crishim_image_pull_bytes_total 1000",
            "crishim_image_pulls_total{result=\"failure\"} 1",
            "crishim_oom_kills_total 1",
            "crishim_containers{state=\"running\"} 3",
            "crishim_pods{state=\"ready\"} 2",
            "crishim_shims 2",
            "crishim_gpu_memory_limit_bytes{container=\"abc123\"} 268435456",
            "crishim_gpu_memory_used_bytes{container=\"abc123\"} 104857600",
            "crishim_gpu_throttled_seconds_total{container=\"abc123\"} 2.5",
            "crishim_gpu_core_limit_percent{container=\"abc123\"} 30",
            "crishim_gpu_core_share_percent{container=\"abc123\"} 29.8",
            "crishim_gpu_time_seconds_total{container=\"abc123\"} 1.5",
            "crishim_lazy_layers{state=\"lazy\"} 1",
            "crishim_lazy_local_bytes 10",
            "crishim_lazy_chunk_errors_total 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains("bad"), "an odd label value is not printed");
    }
}
