//! The shims' mount namespaces: the lean one exec runs in, the infra's empty one, and the
//! create views.

use std::path::{Path, PathBuf};

use crishim_proto::cri;
use crishim_tests::pods::{mounts, PodEnv};
use crishim_tests::{random_hex, Daemon, DaemonOptions};

use super::{mount_tmpfs, pod_with_a_volume, shims, volume, SharedDir};

/// Exec, kill and delete run in the shim's lean mount namespace: the system's mounts without the
/// pods' (their overlays, `/dev/shm`, network namespaces), which libcgroups' lookups would
/// otherwise read on every call. The exec still works, and the node's namespace is unchanged.
#[tokio::test]
async fn exec_runs_in_a_mount_namespace_without_the_pods_mounts() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let state = d.state_dir();
    let mut pods = Vec::new();
    for name in ["lean-a", "lean-b"] {
        pods.push(env.run_sleeping(name).await);
    }
    // Strictly below: the state directory itself is a (private) mount of the daemon's.
    let under_state = |info: &str| {
        info.lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|mp| Path::new(mp).starts_with(&state) && Path::new(mp) != state)
            .count()
    };
    let host_info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        under_state(&host_info) >= 4,
        "two pods' overlays and shm should be mounted on the node"
    );
    assert_eq!(d.exec_ok(&pods[0].1, &["echo", "lean"]).await, "lean\n");

    // The shim of the first pod now holds the lean namespace open (the other one holds the
    // view its create ran in, until it builds its own lean namespace from it), besides the
    // daemon's empty one, which its infra process is in.
    let own = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    let empty = own(d.infra_pid(&pods[0].0).await.unwrap());
    let held: Vec<(i32, std::path::PathBuf)> = shims(d)
        .iter()
        .filter(|s| s.command().contains(&pods[0].0))
        .flat_map(|s| {
            let mine = own(s.pid);
            std::fs::read_dir(format!("/proc/{}/fd", s.pid))
                .unwrap()
                .flatten()
                .filter({
                    let empty = empty.clone();
                    move |fd| {
                        std::fs::read_link(fd.path()).is_ok_and(|l| {
                            l.to_string_lossy().starts_with("mnt:[") && l != mine && l != empty
                        })
                    }
                })
                .map(move |fd| (s.pid, fd.path()))
        })
        .collect();
    assert_eq!(
        held.len(),
        1,
        "the exec's shim holds a second mount namespace: {held:?}"
    );
    let out = std::process::Command::new("nsenter")
        .arg(format!("--mount={}", held[0].1.display()))
        .args(["cat", "/proc/self/mountinfo"])
        .output()
        .expect("nsenter");
    assert!(out.status.success(), "{out:?}");
    let lean_info = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        under_state(&lean_info),
        0,
        "pods' mounts in the lean namespace:\n{lean_info}"
    );
    assert!(
        lean_info.lines().any(|l| l.contains(" - cgroup")),
        "the cgroup hierarchies are kept:\n{lean_info}"
    );
    assert!(
        lean_info.lines().any(|l| l.contains(" /proc ")),
        "{lean_info}"
    );
    let after = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !after
            .lines()
            .any(|l| l.split(' ').nth(4).is_some_and(|mp| mp.ends_with("/lean"))),
        "building it mounted nothing on the node:\n{after}"
    );
    for (pod, _) in &pods {
        d.stop_pod(pod).await.unwrap();
        d.remove_pod(pod).await.unwrap();
    }
    env.stop();
}

/// Each pod's infra process runs in the daemon's one empty mount namespace (a read-only tmpfs
/// root, nothing else), not in a copy of the node's mounts it would have to detach one by one:
/// two pods' infra processes share it, it is not the node's, and holds a single mount.
#[tokio::test]
async fn infra_processes_join_one_empty_mount_namespace() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut pods = Vec::new();
    for name in ["empty-a", "empty-b"] {
        pods.push(env.run_sleeping(name).await);
    }
    let mut spaces = Vec::new();
    for (pod, _) in &pods {
        let infra = d.infra_pid(pod).await.unwrap();
        let ns = std::fs::read_link(format!("/proc/{infra}/ns/mnt")).unwrap();
        let mounts = std::fs::read_to_string(format!("/proc/{infra}/mountinfo")).unwrap();
        spaces.push((ns, mounts.lines().count()));
    }
    let node = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    assert_eq!(spaces[0].0, spaces[1].0, "{spaces:?}");
    assert_ne!(spaces[0].0, node);
    assert_eq!(spaces[0].1, 1, "{spaces:?}");
    for (pod, _) in &pods {
        d.stop_pod(pod).await.unwrap();
        d.remove_pod(pod).await.unwrap();
    }
    env.stop();
}

/// With many pods on the node a container is created in a view of the mounts without the other
/// pods' (lean_ns::with_create_view). Its own rootfs, /dev/shm and volumes are all there, and a
/// HostToContainer volume still receives what the node mounts under it afterwards. The state
/// directory here is on the root file system, whose mount is private on this machine: the view is
/// built at the create.
#[tokio::test]
async fn with_many_pods_a_create_still_gets_its_mounts_and_the_nodes_propagation() {
    many_pods_then_a_viewed_create(DaemonOptions::new()).await;
}

/// The same with the state directory on a shared tmpfs, as `/run` is under systemd: the pod's
/// first create runs in the view its shim built while the CNI ADD ran, which the rootfs, the
/// pod's /dev/shm and the volume reached after it was built.
#[tokio::test]
async fn a_create_in_the_view_built_ahead_gets_its_mounts_and_the_nodes_propagation() {
    many_pods_then_a_viewed_create(DaemonOptions::new().state_on_tmpfs()).await;
}

/// Whether the pod's shim says it created the container in a view of the node's mounts.
fn created_in_a_view(d: &Daemon, pod: &str, id: &str) -> bool {
    let log = d.state_dir().join("pods").join(pod).join("shim.log");
    std::fs::read_to_string(log)
        .is_ok_and(|l| l.contains(&format!("created {id} in a view of the node's mounts")))
}

async fn many_pods_then_a_viewed_create(opts: DaemonOptions) {
    let shared = SharedDir::new();
    let host_dir = shared.path().to_path_buf();
    std::fs::write(host_dir.join("before"), "before\n").unwrap();
    let env = PodEnv::start_with(opts).await;
    let d = &env.d;
    // Seventeen pods, two mounts each or more (overlay, /dev/shm): past the view's
    // threshold of 32 other mounts.
    let mut pods = Vec::new();
    for n in 0..17 {
        pods.push(env.run_sleeping(&format!("many-{n}")).await.0);
    }
    let (pod, id) = pod_with_a_volume(
        &env,
        &env.pod_config("viewed"),
        "/mnt/vol",
        &host_dir,
        cri::MountPropagation::PropagationHostToContainer,
    )
    .await;
    let state = d.state_dir();
    let under_state = mounts()
        .iter()
        .filter(|m| Path::new(&m.mount_point).starts_with(&state))
        .count();
    assert!(
        created_in_a_view(d, &pod, &id),
        "the create did not use a pruned view ({under_state} mounts under {})",
        state.display()
    );
    assert_eq!(
        d.exec_ok(&id, &["cat", "/mnt/vol/before"]).await,
        "before\n"
    );
    let shm = d
        .exec_ok(&id, &["sh", "-c", "grep ' /dev/shm ' /proc/self/mountinfo"])
        .await;
    assert!(shm.contains(" - tmpfs "), "no tmpfs at /dev/shm: {shm}");
    // The node mounts under the volume after the container started: it reaches the container.
    let later = host_dir.join("later");
    mount_tmpfs(&later, "crishim-view-later");
    std::fs::write(later.join("f"), "later\n").unwrap();
    assert_eq!(
        d.exec_ok(&id, &["cat", "/mnt/vol/later/f"]).await,
        "later\n"
    );
    for p in pods.iter().chain([&pod]) {
        d.stop_pod(p).await.unwrap();
        d.remove_pod(p).await.unwrap();
    }
    shared.unmount_all();
    env.stop();
}

/// Volumes the kubelet would have mounted for pods, under `/var/lib/kubelet/pods/<uid>/volumes`;
/// unmounted and removed on drop (with `/var/lib/kubelet` itself where the test made it).
struct KubeletVolumes {
    made_root: bool,
    uids: Vec<String>,
}

const KUBELET_PODS: &str = "/var/lib/kubelet/pods";

impl KubeletVolumes {
    fn new() -> Self {
        let made_root = !Path::new("/var/lib/kubelet").exists();
        KubeletVolumes {
            made_root,
            uids: Vec::new(),
        }
    }

    /// Mount a tmpfs holding `token` as pod `uid`'s volume; returns its path.
    fn add(&mut self, uid: &str, token: &str) -> PathBuf {
        let dir = Path::new(KUBELET_PODS).join(uid).join("volumes/token");
        std::fs::create_dir_all(&dir).unwrap();
        self.uids.push(uid.to_string());
        nix::mount::mount(
            Some("crishim-test-volume"),
            &dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=64k"),
        )
        .expect("mounting a volume tmpfs");
        std::fs::write(dir.join("token"), token).unwrap();
        dir
    }
}

impl Drop for KubeletVolumes {
    fn drop(&mut self) {
        for uid in &self.uids {
            let dir = Path::new(KUBELET_PODS).join(uid);
            let _ =
                nix::mount::umount2(&dir.join("volumes/token"), nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_dir_all(&dir);
        }
        if self.made_root {
            let _ = std::fs::remove_dir_all("/var/lib/kubelet");
        }
    }
}

/// A pod's first create runs in a view without the other pods' kubelet volumes (here 34 of them,
/// enough for a view), with its own volume there; a node agent's first create, binding the
/// kubelet's pods directory, is not given that view and sees every pod's volume mounted.
#[tokio::test]
async fn a_create_view_leaves_out_other_pods_volumes_but_not_its_own_or_an_agents() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let mut volumes = KubeletVolumes::new();
    let tag = random_hex(6);
    for i in 0..34 {
        volumes.add(&format!("crishim-test-{tag}-other{i}"), "other");
    }
    let cfg = env.pod_config("kubelet-view");
    let uid = cfg.metadata.as_ref().unwrap().uid.clone();
    let own = volumes.add(&uid, "mine");
    let (pod, id) = pod_with_a_volume(
        &env,
        &cfg,
        "/var/run/secrets/token",
        &own,
        cri::MountPropagation::PropagationPrivate,
    )
    .await;
    assert!(
        created_in_a_view(d, &pod, &id),
        "the create did not use a view without the other pods' volumes"
    );
    assert_eq!(
        d.exec_ok(&id, &["cat", "/var/run/secrets/token/token"])
            .await,
        "mine"
    );

    let (agent_pod, agent) = pod_with_a_volume(
        &env,
        &env.pod_config("kubelet-agent"),
        "/host/pods",
        Path::new(KUBELET_PODS),
        cri::MountPropagation::PropagationHostToContainer,
    )
    .await;
    let seen = d
        .exec_ok(
            &agent,
            &[
                "sh",
                "-c",
                &format!("grep -c '{tag}-other' /proc/self/mountinfo"),
            ],
        )
        .await;
    assert_eq!(seen.trim(), "34", "the agent's view of the pods' volumes");
    assert_eq!(
        d.exec_ok(
            &agent,
            &[
                "cat",
                &format!("/host/pods/crishim-test-{tag}-other7/volumes/token/token")
            ]
        )
        .await,
        "other"
    );

    // A view keeps only the node's mounts near what the create reads. A file on a mount of its
    // own, and one reached through a link into another mount (as `/etc/resolv.conf` leads into
    // `/run`), are both read as on the node.
    let shared = SharedDir::new();
    let below = shared.path().join("below");
    mount_tmpfs(&below, "crishim-view-below");
    std::fs::write(below.join("data"), "below").unwrap();
    let linked = shared.path().join("linked");
    mount_tmpfs(&linked, "crishim-view-linked");
    std::fs::write(linked.join("data"), "linked").unwrap();
    let link = shared.path().join("link");
    std::os::unix::fs::symlink(linked.join("data"), &link).unwrap();
    let far_cfg = env.pod_config("kubelet-far");
    let far_pod = d.run_pod(&far_cfg).await.expect("RunPodSandbox");
    let mut c = env.container_config("main", &["sleep", "1000"]);
    let private = cri::MountPropagation::PropagationPrivate;
    c.mounts = vec![
        volume("/below", &below.join("data"), private),
        volume("/linked", &link, private),
    ];
    let far = d
        .run_container(&far_pod, &c, &far_cfg)
        .await
        .expect("run container");
    assert_eq!(
        d.exec_ok(&far, &["cat", "/below", "/linked"]).await,
        "belowlinked"
    );
    for p in [&pod, &agent_pod, &far_pod] {
        d.stop_pod(p).await.unwrap();
        d.remove_pod(p).await.unwrap();
    }
    drop(volumes);
    env.stop();
}
