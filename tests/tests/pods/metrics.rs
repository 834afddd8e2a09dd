//! The Prometheus endpoint.

use std::time::{Duration, Instant};

use crishim_tests::daemon::{check_prometheus_text, metrics_address, metrics_toml, sample, scrape};
use crishim_tests::pods::{assert_no_leaks, marker, sh_container, PodEnv, LOOP_UNTIL_TERM};
use crishim_tests::DaemonOptions;

/// `[metrics] address`: the Prometheus endpoint counts CRI calls by method and code, times pod
/// start-up and pulls, and reports pods and containers by state.
#[tokio::test]
async fn metrics_count_calls_pod_starts_pulls_and_states() {
    let addr = metrics_address();
    let opts = DaemonOptions::new().extra_toml(&metrics_toml(&addr));
    let env = PodEnv::start_with(opts).await;
    let cfg = env.pod_config("metrics");
    let c = sh_container(&env, "metrics", LOOP_UNTIL_TERM, &marker("metrics"));
    let (pod, _id, traces) = env.run_traced(&cfg, &c).await;
    let _ = env.d.container_status("no-such-container").await;

    let text = scrape(&addr).await;
    let ok = |m: &str| {
        sample(
            &text,
            &format!("crishim_cri_requests_total{{method=\"{m}\",code=\"OK\"}}"),
        )
    };
    assert_eq!(ok("RunPodSandbox"), 1.0, "{text}");
    assert_eq!(ok("StartContainer"), 1.0, "{text}");
    assert_eq!(
        sample(
            &text,
            "crishim_cri_requests_total{method=\"ContainerStatus\",code=\"NotFound\"}"
        ),
        1.0,
        "{text}"
    );
    assert!(
        sample(
            &text,
            "crishim_cri_request_duration_seconds_count{method=\"CreateContainer\"}"
        ) >= 1.0
    );
    assert_eq!(
        sample(&text, "crishim_pod_start_duration_seconds_count"),
        1.0,
        "{text}"
    );
    assert!(
        sample(&text, "crishim_image_pulls_total{result=\"success\"}") >= 1.0,
        "{text}"
    );
    assert!(
        sample(&text, "crishim_image_pull_bytes_total") > 0.0,
        "{text}"
    );
    for series in [
        "crishim_pods{state=\"ready\"}",
        "crishim_containers{state=\"running\"}",
        "crishim_shims",
    ] {
        assert_eq!(sample(&text, series), 1.0, "{series} in {text}");
    }

    check_prometheus_text(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    env.d.stop_pod(&pod).await.unwrap();
    let text = scrape(&addr).await;
    check_prometheus_text(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for series in [
        "crishim_pods{state=\"notready\"}",
        "crishim_containers{state=\"exited\"}",
    ] {
        assert_eq!(sample(&text, series), 1.0, "{series} in {text}");
    }
    // Idle connections that never send a request hold the scrape slots only for their 5 s read
    // timeout: a real scrape behind them still gets its answer.
    let idle: Vec<_> = futures_util::future::join_all(
        (0..24).map(|_| tokio::net::TcpStream::connect(addr.clone())),
    )
    .await;
    let t0 = Instant::now();
    let text = tokio::time::timeout(Duration::from_secs(15), scrape(&addr))
        .await
        .expect("a scrape behind 24 idle connections");
    assert!(text.contains("crishim_shims"), "{text}");
    assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
    drop(idle);
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}
