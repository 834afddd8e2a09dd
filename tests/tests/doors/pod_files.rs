//! Files a container process can write in a host directory: the pod's `/etc/hostname`, `hosts`
//! and `resolv.conf` live under `state_dir`, on the node's `/run`. A container writing without
//! end used to fill `/run`; they now sit on a tmpfs of their own, bounded per pod.

use crishim_tests::pods::{assert_no_leaks, sh_container, PodEnv, PodTraces, LOOP_UNTIL_TERM};

/// The bound of the pod files' tmpfs (`mode=0700,size=1m`).
const BOUND: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_cannot_fill_the_node_through_its_pod_files() {
    let env = PodEnv::start().await;
    let cfg = env.pod_config("pod-files-door");
    let pod = env.d.run_pod(&cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &cfg);
    let c = sh_container(&env, "writer", LOOP_UNTIL_TERM, "writer");
    let id = env.d.run_container(&pod, &c, &cfg).await.unwrap();
    traces.add_container(&id);

    let files = env.d.state_dir().join("pod-files").join(&pod);
    for f in ["hostname", "hosts", "resolv.conf"] {
        // 8 MiB into one file: the write stops at the bound with ENOSPC.
        let r = env
            .d
            .exec_sync(
                &id,
                &[
                    "/bin/sh",
                    "-c",
                    &format!("head -c 8388608 /dev/zero > /etc/{f}; echo rc=$?"),
                ],
                60,
            )
            .await
            .unwrap();
        let out = String::from_utf8_lossy(&r.stdout);
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(
            !out.contains("rc=0"),
            "writing 8 MiB to /etc/{f} succeeded: {out} {err}"
        );
        let size = std::fs::metadata(files.join(f)).unwrap().len();
        assert!(size <= BOUND, "/etc/{f} holds {size} bytes on the node");
        // Truncated again, so the next file has room.
        env.d
            .exec_ok(&id, &["/bin/sh", "-c", &format!(": > /etc/{f}")])
            .await;
    }
    // Still a root-only directory on the node.
    let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&files).unwrap());
    assert_eq!(mode & 0o777, 0o700, "{}", files.display());

    traces.capture(&env.d).await;
    env.d.stop_pod(&pod).await.unwrap();
    env.d.remove_pod(&pod).await.unwrap();
    assert!(!files.exists(), "{} left", files.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(files.to_str().unwrap()),
        "the pod files' tmpfs is still mounted"
    );
    assert_no_leaks(&env.d, &traces).await;
    env.stop();
}
