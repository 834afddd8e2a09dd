//! CRI log files, in the kubelet's pod log directory: a container that can write that directory
//! (a log shipper with a hostPath of `/var/log/pods`) plants a symlink or a FIFO where another
//! container's log goes. The shim, as host root, used to follow it (appending container output
//! to any host file) or block on it (hanging the pod's single-threaded shim).

use std::path::Path;
use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::pods::{assert_no_leaks, sh_container, PodEnv, PodTraces, LOOP_UNTIL_TERM};
use tonic::Code;

const SECRET: &str = "kept as it was\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_shipper_cannot_steer_the_shims_log_writes() {
    let env = PodEnv::start().await;
    let cfg = env.pod_config("log-door");
    let log_dir = Path::new(&cfg.log_directory).to_path_buf();
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let host = tempfile::tempdir().unwrap();
    let target = host.path().join("profile.sh");
    std::fs::write(&target, SECRET).unwrap();

    // The shipper: the pod's log directory mounted read-write, as a hostPath.
    let mut shipper = sh_container(&env, "shipper", LOOP_UNTIL_TERM, "shipper");
    shipper.mounts.push(cri::Mount {
        container_path: "/logs".into(),
        host_path: log_dir.to_string_lossy().into_owned(),
        ..Default::default()
    });
    let shipper = env.d.run_container(&pod, &shipper, &cfg).await.unwrap();
    traces.add_container(&shipper);
    // What it plants: the victim's log file a symlink to a host file, a directory a symlink
    // out, a FIFO.
    let host_dir = host.path().to_string_lossy().into_owned();
    env.d
        .exec_ok(
            &shipper,
            &[
                "/bin/sh",
                "-c",
                &format!(
                    "ln -s {target} /logs/victim.log && ln -s {host_dir} /logs/out && mkfifo /logs/fifo.log",
                    target = target.display()
                ),
            ],
        )
        .await;

    for (name, log_path) in [
        ("victim", "victim.log"),
        ("climber", "out/profile.sh"),
        ("maker", "out/new/0.log"),
        ("fifo", "fifo.log"),
    ] {
        let mut c = sh_container(&env, name, "echo ';touch /tmp/owned'", name);
        c.log_path = log_path.into();
        let started = Instant::now();
        let e = env
            .d
            .create_container(&pod, &c, &cfg)
            .await
            .expect_err("a planted log path must not be written");
        assert_eq!(e.code(), Code::FailedPrecondition, "{log_path}: {e:?}");
        assert!(e.message().contains(log_path), "{}", e.message());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{log_path}: {:?}",
            started.elapsed()
        );
    }
    assert_eq!(std::fs::read_to_string(&target).unwrap(), SECRET);
    assert!(!host.path().join("new").exists());

    // A running container's log replaced by a symlink before the kubelet's reopen.
    let writer = sh_container(&env, "writer", LOOP_UNTIL_TERM, "writer");
    let writer = env.d.run_container(&pod, &writer, &cfg).await.unwrap();
    traces.add_container(&writer);
    env.d
        .exec_ok(
            &shipper,
            &[
                "/bin/sh",
                "-c",
                &format!(
                    "mv /logs/writer.log /logs/writer.log.1 && ln -s {} /logs/writer.log",
                    target.display()
                ),
            ],
        )
        .await;
    let e = env.d.reopen_container_log(&writer).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), SECRET);
    // Once the shipper puts a plain file back, the reopen works.
    env.d
        .exec_ok(&shipper, &["/bin/sh", "-c", "rm /logs/writer.log"])
        .await;
    env.d.reopen_container_log(&writer).await.unwrap();
    assert!(log_dir.join("writer.log").is_file());

    traces.capture(&env.d).await;
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}
