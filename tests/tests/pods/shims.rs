//! The pod's shim: its resident stack, and a shim that cannot start.

use std::path::Path;
use std::time::{Duration, Instant};

use crishim_tests::pods::PodEnv;
use crishim_tests::DaemonOptions;
use tonic::Code;

use super::{shims, wait_gone, Footprint};

/// A shim hands its main stack's pages back after each request: libcontainer's create and exec
/// run deep, and what they touched would otherwise stay resident for the pod's lifetime.
#[tokio::test]
async fn a_shims_stack_stays_small_after_create_and_exec() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let (pod, id) = env.run_sleeping("stack").await;
    assert_eq!(d.exec_ok(&id, &["echo", "x"]).await, "x\n");
    let shim = shims(d);
    assert_eq!(shim.len(), 1, "{shim:#?}");
    let stack_rss_kib = || -> u64 {
        let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", shim[0].pid)).unwrap();
        smaps
            .split_inclusive('\n')
            .skip_while(|l| !l.trim_end().ends_with("[stack]"))
            .find_map(|l| l.strip_prefix("Rss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("the shim's [stack] in smaps")
    };
    // Tests run a debug build, whose live frames alone take some 40 KiB; before the release the
    // stack held over 200 KiB there (and about 80 KiB in a release build). The shim releases it
    // just after its reply, so allow it a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut kib = stack_rss_kib();
    while kib > 96 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        kib = stack_rss_kib();
    }
    assert!(kib <= 96, "the shim keeps {kib} KiB of stack resident");
    d.stop_pod(&pod).await.unwrap();
    d.remove_pod(&pod).await.unwrap();
    env.stop();
}

/// A daemon that runs `shim` (a link to `crishim-shim`, or a stand-in) as the pods' shim.
async fn env_with_shim_binary(shim: &Path) -> PodEnv {
    PodEnv::start_with(DaemonOptions::new().shim_binary(shim)).await
}

/// A shim that cannot start the pod's infra process (here: no `crishim-pause` beside it) fails
/// RunPodSandbox with its reason, and leaves no shim, pod, mount or file behind.
#[tokio::test]
async fn a_shim_that_cannot_start_the_infra_fails_the_pod_with_why_and_leaves_nothing() {
    let bin = tempfile::tempdir().expect("tempdir");
    let shim = bin.path().join("crishim-shim");
    let real = crishim_tests::daemon::daemon_bin().with_file_name("crishim-shim");
    if std::fs::hard_link(&real, &shim).is_err() {
        std::fs::copy(&real, &shim).expect("copying crishim-shim");
    }
    let env = env_with_shim_binary(&shim).await;
    let d = &env.d;
    let before = Footprint::of(d);

    let cfg = env.pod_config("no-infra");
    let e = d.run_pod(&cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    assert!(
        e.message().contains("starting the pod's shim failed")
            && e.message()
                .contains(&bin.path().join("crishim-pause").display().to_string()),
        "{e:?}"
    );
    assert!(d.list_pod_ids(None).await.unwrap().is_empty());
    let left = wait_gone(&shims(d), Duration::from_secs(5)).await;
    assert!(left.is_empty(), "shims left: {left:#?}");
    before.assert_nothing_new(d, "the failed pod");
    env.stop();
}

/// A shim start that prints a flood instead of its ready report, or with its error (here a
/// script standing in for `crishim-shim`), fails RunPodSandbox promptly, with a message that fits
/// a gRPC status, and leaves nothing.
#[tokio::test]
async fn a_shim_start_printing_a_flood_fails_the_pod_with_a_short_message() {
    use std::os::unix::fs::PermissionsExt as _;
    let flood = "head -c 8388608 /dev/zero | tr '\\0' x";
    for (script, said, max) in [
        (format!("{flood}\nexit 0"), "unexpected ready report", 1024),
        (format!("{flood} >&2\nexit 1"), "xxxx", 5 * 1024),
    ] {
        let bin = tempfile::tempdir().expect("tempdir");
        let shim = bin.path().join("crishim-shim");
        std::fs::write(&shim, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
        let env = env_with_shim_binary(&shim).await;
        let d = &env.d;
        let before = Footprint::of(d);
        let t = Instant::now();
        let e = d.run_pod(&env.pod_config("flood")).await.unwrap_err();
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "took {:?}",
            t.elapsed()
        );
        assert_eq!(e.code(), Code::Internal, "{script}: {e:?}");
        let m = e.message();
        assert!(
            m.contains("starting the pod's shim failed") && m.contains(said) && m.len() < max,
            "{script}: {} bytes: {}",
            m.len(),
            &m[..m.len().min(300)]
        );
        assert!(d.list_pod_ids(None).await.unwrap().is_empty());
        before.assert_nothing_new(d, "the failed pod");
        env.stop();
    }
}
