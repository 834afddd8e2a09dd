//! Volume mounts: recursive read-only mounts, and mount propagation between the node and a
//! container.

use std::path::Path;
use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::pods::{
    assert_no_leaks, marker, mounts, mounts_under, set_container_privileged, set_pod_privileged,
    sh_container, PodEnv, PodTraces, LOOP_UNTIL_TERM,
};

use super::{mount_tmpfs, volume, SharedDir};

/// `Status` announces recursive read-only mounts (this kernel has `mount_setattr`), and such a
/// mount makes a submount read-only too, where a plain read-only bind leaves it writable.
#[tokio::test]
async fn recursive_read_only_mounts_are_announced_and_reach_submounts() {
    let shared = SharedDir::new();
    let host_dir = shared.path().to_path_buf();
    let sub = host_dir.join("sub");
    mount_tmpfs(&sub, "crishim-rro");
    let env = PodEnv::start().await;
    let d = &env.d;
    let status = d.runtime_status().await.expect("Status");
    let features = status.runtime_handlers[0].features.unwrap();
    assert!(features.recursive_read_only_mounts, "{status:#?}");
    assert!(
        features.user_namespaces,
        "idmapped mounts work on this kernel and filesystem: {status:#?}"
    );
    assert!(status.features.unwrap().supplemental_groups_policy);

    let cfg = env.pod_config("rro");
    let mut c = sh_container(&env, "rro", LOOP_UNTIL_TERM, &marker("rro"));
    let bind = |path: &str, recursive: bool| cri::Mount {
        container_path: path.to_string(),
        host_path: host_dir.to_string_lossy().into_owned(),
        readonly: true,
        recursive_read_only: recursive,
        ..Default::default()
    };
    c.mounts = vec![bind("/mnt/rro", true), bind("/mnt/ro", false)];
    let (pod, id, traces) = env.run_traced(&cfg, &c).await;
    let ro = d
        .exec_sync(&id, &["touch", "/mnt/ro/sub/f"], 10)
        .await
        .unwrap();
    assert_eq!(ro.exit_code, 0, "ro leaves submounts writable: {ro:?}");
    let r = d
        .exec_sync(&id, &["touch", "/mnt/rro/sub/g"], 10)
        .await
        .unwrap();
    assert_ne!(r.exit_code, 0, "rro must reach the submount");
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("Read-only"),
        "{r:?}"
    );
    assert!(!sub.join("g").exists());

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    shared.unmount_all();
    assert_no_leaks(d, &traces).await;
    env.stop();
}

#[tokio::test]
async fn bidirectional_mount_propagates_mounts_both_ways() {
    let shared = SharedDir::new();
    let host_dir = shared.path().to_path_buf();
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut cfg = env.pod_config("bidi");
    set_pod_privileged(&mut cfg);
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox (privileged)");
    let mut traces = PodTraces::new(&pod, &cfg);

    let mut c = sh_container(&env, "bidi", LOOP_UNTIL_TERM, &marker("bidi"));
    set_container_privileged(&mut c);
    c.mounts = vec![volume(
        "/mnt/shared",
        &host_dir,
        cri::MountPropagation::PropagationBidirectional,
    )];
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("run the privileged container");
    traces.add_container(&id);
    traces.capture(d).await;
    let st = d.container_status(&id).await.unwrap();
    assert!(
        st.mounts.iter().any(|m| m.container_path == "/mnt/shared"
            && Path::new(&m.host_path) == host_dir
            && m.propagation == cri::MountPropagation::PropagationBidirectional as i32),
        "ContainerStatus.mounts lacks the bidirectional mount: {:#?}",
        st.mounts
    );

    // Container → host.
    d.exec_ok(
        &id,
        &[
            "sh",
            "-c",
            "mkdir -p /mnt/shared/sub && mount -t tmpfs -o size=1m crishim-bidi /mnt/shared/sub \
             && echo from-container > /mnt/shared/sub/f",
        ],
    )
    .await;
    let sub = host_dir.join("sub");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !mounts()
        .iter()
        .any(|m| Path::new(&m.mount_point) == sub && m.fstype == "tmpfs")
    {
        assert!(
            Instant::now() < deadline,
            "the container's tmpfs at /mnt/shared/sub did not appear at {} on the host; host mounts there: {:#?}",
            sub.display(),
            mounts_under(&host_dir)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        std::fs::read_to_string(sub.join("f")).unwrap(),
        "from-container\n"
    );

    // Host → container.
    let from_host = host_dir.join("fromhost");
    mount_tmpfs(&from_host, "crishim-bidi-host");
    std::fs::write(from_host.join("g"), "from-host\n").unwrap();
    assert_eq!(
        d.exec_ok(&id, &["cat", "/mnt/shared/fromhost/g"]).await,
        "from-host\n"
    );

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    // What propagated to the host stays there (that is what bidirectional means); ours to clean.
    shared.unmount_all();
    assert_no_leaks(d, &traces).await;
    env.stop();
}

/// `Mount.mount_options` that only take away reach the container's mount: a program on a
/// `noexec` volume does not run where the same file on a plain volume does. One that would
/// weaken a mount is refused by name, and the refused create leaves no container behind.
#[tokio::test]
async fn mount_options_reach_the_container_and_weakening_ones_are_refused() {
    let host_dir = tempfile::tempdir().unwrap();
    // busybox picks its applet by name: this file runs as `true`.
    std::fs::copy("/bin/busybox", host_dir.path().join("true")).expect("busybox-static");
    let env = PodEnv::start().await;
    let d = &env.d;
    let status = d.runtime_status().await.expect("Status");
    assert!(status.features.unwrap().mount_options, "{status:#?}");

    let cfg = env.pod_config("mopts");
    let mut c = sh_container(&env, "mopts", LOOP_UNTIL_TERM, &marker("mopts"));
    let mut hardened = volume(
        "/mnt/opts",
        host_dir.path(),
        cri::MountPropagation::PropagationPrivate,
    );
    hardened.mount_options = ["noexec", "nodev", "nosuid"].map(String::from).to_vec();
    let plain = volume(
        "/mnt/plain",
        host_dir.path(),
        cri::MountPropagation::PropagationPrivate,
    );
    c.mounts = vec![hardened.clone(), plain];
    let (pod, id, traces) = env.run_traced(&cfg, &c).await;

    let ran = d.exec_sync(&id, &["/mnt/plain/true"], 10).await.unwrap();
    assert_eq!(ran.exit_code, 0, "the plain volume runs it: {ran:?}");
    // The exec itself fails (EACCES), as with runc: an error, or a failed exit from a shell.
    match d.exec_sync(&id, &["/mnt/opts/true"], 10).await {
        Ok(r) => assert_ne!(r.exit_code, 0, "noexec must stop it: {r:?}"),
        Err(e) => assert!(e.message().contains("execute"), "{e:?}"),
    }
    let through_sh = d
        .exec_sync(&id, &["sh", "-c", "/mnt/opts/true"], 10)
        .await
        .unwrap();
    assert_eq!(through_sh.exit_code, 126, "{through_sh:?}");
    let info = d
        .exec_sync(&id, &["grep", " /mnt/opts ", "/proc/self/mountinfo"], 10)
        .await
        .unwrap();
    let line = String::from_utf8_lossy(&info.stdout).to_string();
    for flag in ["noexec", "nodev", "nosuid"] {
        assert!(line.contains(flag), "{flag} missing from {line:?}");
    }

    let mut weak = c.clone();
    weak.metadata.as_mut().unwrap().name = "weak".into();
    hardened.mount_options = vec!["exec".to_string()];
    weak.mounts = vec![hardened];
    let e = d
        .create_container(&pod, &weak, &cfg)
        .await
        .expect_err("exec is not an option that takes away");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("/mnt/opts") && e.message().contains("\"exec\""),
        "{e:?}"
    );
    let containers = d.list_containers(None).await.unwrap();
    assert_eq!(containers.len(), 1, "{containers:?}");

    d.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert_no_leaks(d, &traces).await;
    env.stop();
}
