//! Pods with their own user namespace (`hostUsers: false`, KEP-127), with the real kernel: the
//! kubelet's mapping is in force, the container's root owns its root filesystem and volumes
//! through idmapped mounts without being root on the host, and what cannot work is refused.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use crishim_proto::cri;
use crishim_tests::pods::{
    marker, namespaces, processes_with_command, set_pod_namespaces, set_pod_userns, sh_container,
    PodEnv, PodTraces, LOOP_UNTIL_TERM, NS_NODE, NS_POD,
};
use crishim_tests::random_hex;
use tonic::Code;

/// A host id range of 65536 as the kubelet allots them: a multiple of 65536, above host root's.
fn host_base() -> u32 {
    65536 * (2 + u32::from_str_radix(&random_hex(2), 16).unwrap() % 200)
}

fn with_userns(cfg: &mut cri::PodSandboxConfig, mode: cri::NamespaceMode, base: u32) {
    set_pod_userns(cfg, mode, base);
}

#[tokio::test]
async fn a_pod_with_its_own_user_namespace_owns_its_files_but_is_not_host_root() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let status = d.runtime_status().await.expect("Status");
    assert!(status.runtime_handlers[0].features.unwrap().user_namespaces);
    let base = host_base();
    let mut cfg = env.pod_config("userns");
    set_pod_namespaces(&mut cfg, namespaces(NS_POD, NS_POD, NS_POD));
    with_userns(&mut cfg, cri::NamespaceMode::Pod, base);
    let pod = d
        .run_pod(&cfg)
        .await
        .expect("RunPodSandbox with a user namespace");
    let mut traces = PodTraces::new(&pod, &cfg);

    // An emptyDir as the kubelet makes it: root's, 0777.
    let volume = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        volume.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let m = marker("userns");
    let mut c = sh_container(&env, "c", LOOP_UNTIL_TERM, &m);
    c.mounts.push(cri::Mount {
        container_path: "/data".into(),
        host_path: volume.path().to_string_lossy().into_owned(),
        ..Default::default()
    });
    let id = d
        .run_container(&pod, &c, &cfg)
        .await
        .expect("a container in it");
    traces.add_container(&id);

    // The kubelet's mapping, and root inside.
    let maps = d
        .exec_ok(
            &id,
            &[
                "sh",
                "-c",
                "cat /proc/self/uid_map /proc/self/gid_map; id -u",
            ],
        )
        .await;
    let words: Vec<&str> = maps.split_whitespace().collect();
    assert_eq!(
        words,
        [
            "0",
            &base.to_string(),
            "65536",
            "0",
            &base.to_string(),
            "65536",
            "0"
        ],
        "{maps}"
    );
    // The image's files are its root's; what it writes into its root filesystem belongs to the
    // mapped host root on the host.
    assert_eq!(
        d.exec_ok(&id, &["stat", "-c", "%u %g", "/bin/busybox", "/"])
            .await,
        "0 0\n0 0\n"
    );
    d.exec_ok(
        &id,
        &["sh", "-c", "echo hi > /written && echo v > /data/file"],
    )
    .await;
    let upper = walk_for(d.dir(), "written");
    let meta = std::fs::metadata(&upper).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (base, base),
        "{}",
        upper.display()
    );
    // The volume is idmapped: root's on the host is the pod root's inside, and back.
    assert_eq!(
        d.exec_ok(&id, &["stat", "-c", "%u", "/data", "/data/file"])
            .await,
        "0\n0\n"
    );
    assert_eq!(
        std::fs::metadata(volume.path().join("file")).unwrap().uid(),
        0,
        "written through the idmapped volume as the pod's root"
    );

    // Not root on the host: the container's processes run as the mapped uid there, and a user
    // namespace made inside maps onto the pod's ids, never host root.
    let ps = processes_with_command(&m);
    assert!(!ps.is_empty());
    let status = std::fs::read_to_string(format!("/proc/{}/status", ps[0].pid)).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid_line
            .split_whitespace()
            .skip(1)
            .all(|u| u == base.to_string()),
        "{uid_line}"
    );
    let inner = marker("inner");
    let r = d
        .exec_sync(
            &id,
            &[
                "busybox",
                "unshare",
                "-U",
                "-r",
                "cat",
                "/proc/self/uid_map",
            ],
            30,
        )
        .await
        .unwrap();
    assert_eq!(
        (
            r.exit_code,
            String::from_utf8_lossy(&r.stdout)
                .split_whitespace()
                .collect::<Vec<_>>()
        ),
        (0, vec!["0", "0", "1"]),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    d.exec_ok(
        &id,
        &[
            "sh",
            "-c",
            &format!("busybox unshare -U -r sh -c 'sleep 30; true' {inner} >/dev/null 2>&1 &"),
        ],
    )
    .await;
    let mut nested = Vec::new();
    for _ in 0..50 {
        // The shell the nested namespace runs, not the exec'd one that started it.
        nested = processes_with_command(&inner);
        nested.retain(|p| p.cmdline.get(2).is_some_and(|c| c == "sleep 30; true"));
        if !nested.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!nested.is_empty(), "the nested user namespace's process");
    let seen = std::fs::read_to_string(format!("/proc/{}/uid_map", nested[0].pid)).unwrap();
    assert_eq!(
        seen.split_whitespace().collect::<Vec<_>>(),
        ["0", &base.to_string(), "1"],
        "nested root is the pod's root on the host"
    );
    // Mounting proc over a path, or loading a kernel module, takes host root: refused.
    let r = d
        .exec_sync(
            &id,
            &["sh", "-c", "echo 1 > /proc/sys/kernel/ns_last_pid"],
            30,
        )
        .await
        .unwrap();
    assert_ne!(r.exit_code, 0, "a host kernel knob written from the pod");

    // A container running as a user other than root: an exec'd process is that user in the
    // pod's namespace, with no capabilities left.
    let mut user = sh_container(&env, "user", LOOP_UNTIL_TERM, &marker("user"));
    user.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .run_as_user = Some(cri::Int64Value { value: 1000 });
    let uid = d
        .run_container(&pod, &user, &cfg)
        .await
        .expect("a non-root container");
    traces.add_container(&uid);
    let out = d
        .exec_ok(
            &uid,
            &[
                "sh",
                "-c",
                "id -u; grep CapEff /proc/self/status; head -1 /proc/self/uid_map",
            ],
        )
        .await;
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(
        words,
        [
            "1000",
            "CapEff:",
            "0000000000000000",
            "0",
            &base.to_string(),
            "65536"
        ],
        "{out}"
    );

    // What cannot work is refused by name, before anything runs.
    let mut privileged = sh_container(&env, "priv", LOOP_UNTIL_TERM, &marker("priv"));
    privileged
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .privileged = true;
    let e = d
        .create_container(&pod, &privileged, &cfg)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("privileged"), "{}", e.message());
    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn user_namespace_modes_and_mappings_that_cannot_work_are_refused() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let base = host_base();
    for (name, mode, host_ns, needle) in [
        ("target", cri::NamespaceMode::Target, false, "TARGET"),
        (
            "container",
            cri::NamespaceMode::Container,
            false,
            "CONTAINER",
        ),
        ("hostnet", cri::NamespaceMode::Pod, true, "network"),
    ] {
        let mut cfg = env.pod_config(name);
        if host_ns {
            set_pod_namespaces(&mut cfg, namespaces(NS_NODE, NS_POD, NS_POD));
        }
        with_userns(&mut cfg, mode, base);
        let e = d.run_pod(&cfg).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{name}: {e:?}");
        assert!(e.message().contains(needle), "{name}: {}", e.message());
    }
    let mut root = env.pod_config("host-root");
    with_userns(&mut root, cri::NamespaceMode::Pod, 0);
    let e = d.run_pod(&root).await.unwrap_err();
    assert!(e.message().contains("host id 0"), "{}", e.message());
    env.stop();
}

/// The first file named `name` under `dir`.
fn walk_for(dir: &Path, name: &str) -> std::path::PathBuf {
    crishim_tests::fsutil::walk(dir)
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == name))
        .unwrap_or_else(|| panic!("no {name} under {}", dir.display()))
}

/// With the default pid mode (each container its own pid namespace, made inside the pod's user
/// namespace), the container runs and an exec'd process joins the user namespace too.
#[tokio::test]
async fn a_container_with_its_own_pid_namespace_runs_and_execs_in_the_pods_user_namespace() {
    let env = PodEnv::start().await;
    let d = &env.d;
    let base = host_base();
    let mut cfg = env.pod_config("userns-pid");
    with_userns(&mut cfg, cri::NamespaceMode::Pod, base);
    let pod = d.run_pod(&cfg).await.expect("RunPodSandbox");
    let mut traces = PodTraces::new(&pod, &cfg);
    let c = sh_container(&env, "c", LOOP_UNTIL_TERM, &marker("own-pid"));
    let id = d.run_container(&pod, &c, &cfg).await.expect("a container");
    traces.add_container(&id);
    let out = d
        .exec_ok(
            &id,
            &[
                "sh",
                "-c",
                "cat /proc/self/uid_map; cat /proc/1/cmdline | tr '\\0' ' '",
            ],
        )
        .await;
    let words: Vec<&str> = out.split_whitespace().take(3).collect();
    assert_eq!(words, ["0", &base.to_string(), "65536"], "{out}");
    assert!(
        out.contains("/bin/sh"),
        "pid 1 is the container's own: {out}"
    );

    // After a daemon restart: exec still joins, and a new container still gets the namespace.
    let mut env = env;
    env.d.restart().await.expect("restart");
    let d = &env.d;
    let again = d.exec_ok(&id, &["cat", "/proc/self/uid_map"]).await;
    assert_eq!(
        again.split_whitespace().nth(1),
        Some(base.to_string().as_str())
    );
    let c2 = sh_container(&env, "c2", LOOP_UNTIL_TERM, &marker("after-restart"));
    let id2 = d
        .run_container(&pod, &c2, &cfg)
        .await
        .expect("a container after restart");
    traces.add_container(&id2);
    assert_eq!(
        d.exec_ok(&id2, &["stat", "-c", "%u", "/"]).await,
        "0\n",
        "its root filesystem is its root's"
    );
    env.finish_pod(&pod, traces).await;
}
