//! Security contexts, checked from inside real busybox containers: users and groups, privileged
//! mode, capabilities, no_new_privs, read-only rootfs and masked/read-only paths, sysctls,
//! seccomp, AppArmor/SELinux options on a host without them, CRI devices, and the infra process
//! as seen from a container. Every test ends with a leak check.

use crishim_proto::cri;
use crishim_tests::image::{busybox_layer, Image, LayerBuilder, GROUP, PASSWD};
use crishim_tests::pods::{
    container_security, marker, namespaces, set_container_privileged, set_pod_namespaces,
    set_pod_privileged, sh_container, PodEnv, PodTraces, LOOP_UNTIL_TERM, NS_CONTAINER, NS_NODE,
    NS_POD,
};
use crishim_tests::Compression;

/// containerd's default capability set (CHOWN, DAC_OVERRIDE, FSETID, FOWNER, MKNOD, NET_RAW,
/// SETGID, SETUID, SETFCAP, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, KILL, AUDIT_WRITE).
const DEFAULT_CAPS: u64 = 0x0000_0000_a804_25fb;
const CAP_SYS_ADMIN: u64 = 1 << 21;

/// A running `sh` container named `name`, after `f` adjusted its config.
async fn start(
    env: &PodEnv,
    pod: &str,
    pod_cfg: &cri::PodSandboxConfig,
    traces: &mut PodTraces,
    name: &str,
    f: impl FnOnce(&mut cri::ContainerConfig),
) -> String {
    let mut c = sh_container(env, name, LOOP_UNTIL_TERM, &marker(name));
    f(&mut c);
    let id = env
        .d
        .run_container(pod, &c, pod_cfg)
        .await
        .unwrap_or_else(|e| panic!("running container {name}: {e:?}"));
    traces.add_container(&id);
    id
}

/// ExecSync: (exit code, stdout, stderr).
async fn exec(env: &PodEnv, id: &str, cmd: &[&str]) -> (i32, String, String) {
    let r = env
        .d
        .exec_sync(id, cmd, 30)
        .await
        .unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e:?}"));
    (
        r.exit_code,
        String::from_utf8_lossy(&r.stdout).into_owned(),
        String::from_utf8_lossy(&r.stderr).into_owned(),
    )
}

/// The hex value of `field` (e.g. "CapEff") in a /proc/<pid>/status text.
fn status_field(status: &str, field: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {status}"))
        .trim()
        .to_string()
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s, 16).unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

/// CapEff of the container's exec'd process.
async fn cap_eff(env: &PodEnv, id: &str) -> u64 {
    let st = env.d.exec_ok(id, &["cat", "/proc/self/status"]).await;
    hex(&status_field(&st, "CapEff"))
}

#[tokio::test]
async fn users_and_groups_reach_the_process() {
    let env = PodEnv::start().await;
    // An image whose config names a user: used when the container gives none.
    let app_image = env
        .push_and_pull(
            "busybox-app",
            &Image::new(vec![busybox_layer()]).user("app"),
        )
        .await;
    let pod_cfg = env.pod_config("users");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);

    let by_id = start(&env, &pod, &pod_cfg, &mut traces, "by-id", |c| {
        let sc = container_security(c);
        sc.run_as_user = Some(cri::Int64Value { value: 1234 });
        sc.run_as_group = Some(cri::Int64Value { value: 2345 });
        sc.supplemental_groups = vec![3456, 4567];
    })
    .await;
    assert_eq!(env.d.exec_ok(&by_id, &["id", "-u"]).await.trim(), "1234");
    assert_eq!(env.d.exec_ok(&by_id, &["id", "-g"]).await.trim(), "2345");
    let groups = env.d.exec_ok(&by_id, &["id", "-G"]).await;
    let groups: Vec<&str> = groups.split_whitespace().collect();
    for g in ["2345", "3456", "4567"] {
        assert!(groups.contains(&g), "id -G {groups:?} lacks {g}");
    }
    // The container's main process too, not only exec'd ones.
    let st = env.d.exec_ok(&by_id, &["cat", "/proc/1/status"]).await;
    assert!(status_field(&st, "Uid").starts_with("1234"), "pid 1: {st}");
    // ContainerStatus.user (KEP-3619) says the same as the kernel does of pid 1.
    let user = env
        .d
        .container_status(&by_id)
        .await
        .unwrap()
        .user
        .and_then(|u| u.linux)
        .expect("ContainerStatus.user");
    assert_eq!((user.uid, user.gid), (1234, 2345));
    let mut kernel: Vec<i64> = status_field(&st, "Groups")
        .split_whitespace()
        .map(|g| g.parse().unwrap())
        .collect();
    let mut reported = user.supplemental_groups.clone();
    kernel.sort();
    reported.sort();
    reported.dedup();
    kernel.retain(|g| *g != 2345);
    reported.retain(|g| *g != 2345);
    assert_eq!(reported, kernel, "supplementary groups");

    let by_name = start(&env, &pod, &pod_cfg, &mut traces, "by-name", |c| {
        container_security(c).run_as_username = "app".to_string();
    })
    .await;
    assert_eq!(env.d.exec_ok(&by_name, &["id", "-u"]).await.trim(), "1000");
    assert_eq!(env.d.exec_ok(&by_name, &["id", "-g"]).await.trim(), "1000");

    // The busybox test image names no user: root.
    let default = start(&env, &pod, &pod_cfg, &mut traces, "default", |_| {}).await;
    assert_eq!(env.d.exec_ok(&default, &["id", "-u"]).await.trim(), "0");

    let image_user = start(&env, &pod, &pod_cfg, &mut traces, "image-user", |c| {
        c.image = Some(crishim_tests::cri::spec(&app_image.tag_ref()));
    })
    .await;
    assert_eq!(
        env.d.exec_ok(&image_user, &["id", "-u"]).await.trim(),
        "1000"
    );
    assert_eq!(
        env.d.exec_ok(&image_user, &["id", "-g"]).await.trim(),
        "1000"
    );

    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn privileged_container_gets_all_capabilities_writable_sys_and_host_devices() {
    let env = PodEnv::start().await;
    let mut pod_cfg = env.pod_config("priv");
    set_pod_privileged(&mut pod_cfg);
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);
    let id = start(
        &env,
        &pod,
        &pod_cfg,
        &mut traces,
        "priv",
        set_container_privileged,
    )
    .await;

    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    assert_eq!(
        cap_eff(&env, &id).await,
        hex(&status_field(&own, "CapEff")),
        "a privileged container has the daemon's full capability set"
    );

    let mounts = env.d.exec_ok(&id, &["busybox", "mount"]).await;
    let sys = mounts
        .lines()
        .find(|l| l.contains(" on /sys type sysfs "))
        .unwrap_or_else(|| panic!("no sysfs at /sys: {mounts}"));
    assert!(sys.contains("(rw"), "/sys not read-write: {sys}");

    // Host devices are there: whatever /dev/loop0 (or another host-only device) is.
    let host_dev = ["loop0", "loop-control", "kmsg", "tty0"]
        .into_iter()
        .find(|d| std::path::Path::new("/dev").join(d).exists());
    if let Some(dev) = host_dev {
        let path = format!("/dev/{dev}");
        env.d.exec_ok(&id, &["test", "-e", &path]).await;
    } else {
        eprintln!("no host-only device in /dev to look for");
    }

    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn capabilities_default_add_drop_and_their_effect() {
    let env = PodEnv::start().await;
    let pod_cfg = env.pod_config("caps");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);

    let default = start(&env, &pod, &pod_cfg, &mut traces, "default", |_| {}).await;
    assert_eq!(
        cap_eff(&env, &default).await,
        DEFAULT_CAPS,
        "default CapEff"
    );
    let admin = start(&env, &pod, &pod_cfg, &mut traces, "admin", |c| {
        container_security(c).capabilities = Some(cri::Capability {
            add_capabilities: vec!["SYS_ADMIN".to_string()],
            ..Default::default()
        });
    })
    .await;
    assert_eq!(cap_eff(&env, &admin).await, DEFAULT_CAPS | CAP_SYS_ADMIN);
    let none = start(&env, &pod, &pod_cfg, &mut traces, "none", |c| {
        container_security(c).capabilities = Some(cri::Capability {
            drop_capabilities: vec!["ALL".to_string()],
            ..Default::default()
        });
    })
    .await;
    assert_eq!(cap_eff(&env, &none).await, 0);

    // sethostname needs CAP_SYS_ADMIN (in the pod's own UTS namespace).
    let (code, _, err) = exec(&env, &default, &["busybox", "hostname", "foo"]).await;
    assert_ne!(code, 0, "hostname without CAP_SYS_ADMIN succeeded");
    assert!(err.contains("Operation not permitted"), "stderr: {err}");
    env.d
        .exec_ok(&admin, &["busybox", "hostname", "crishim-foo"])
        .await;
    assert_eq!(
        env.d.exec_ok(&admin, &["busybox", "hostname"]).await.trim(),
        "crishim-foo"
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_ne!(host.trim(), "crishim-foo", "the host's hostname changed");

    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn no_new_privs_is_set_on_the_process() {
    // Only the NoNewPrivs flag is asserted: a setuid probe would need a setuid-root binary that
    // does not drop privileges by itself, and busybox does.
    let env = PodEnv::start().await;
    let pod_cfg = env.pod_config("nnp");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);

    let nnp = start(&env, &pod, &pod_cfg, &mut traces, "nnp", |c| {
        let sc = container_security(c);
        sc.no_new_privs = true;
        sc.run_as_user = Some(cri::Int64Value { value: 1000 });
    })
    .await;
    let st = env.d.exec_ok(&nnp, &["cat", "/proc/self/status"]).await;
    assert_eq!(status_field(&st, "NoNewPrivs"), "1");
    let st = env.d.exec_ok(&nnp, &["cat", "/proc/1/status"]).await;
    assert_eq!(status_field(&st, "NoNewPrivs"), "1", "pid 1");

    let plain = start(&env, &pod, &pod_cfg, &mut traces, "plain", |_| {}).await;
    let st = env.d.exec_ok(&plain, &["cat", "/proc/self/status"]).await;
    assert_eq!(status_field(&st, "NoNewPrivs"), "0");

    env.finish_pod(&pod, traces).await;
}

/// Issue 13's `/proc/1/root` experiment: in a pod sharing its pid namespace, PID 1 is the infra
/// process. A container given CAP_SYS_PTRACE (as `kubectl debug --profile=general` does) looks
/// through it and finds an empty root, no descriptors, and a process with no privileges.
#[tokio::test]
async fn infra_process_shows_an_empty_root_and_holds_no_privileges() {
    let env = PodEnv::start().await;
    let mut pod_cfg = env.pod_config("infra-door");
    set_pod_namespaces(&mut pod_cfg, namespaces(NS_POD, NS_POD, NS_POD));
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);
    let debug = start(&env, &pod, &pod_cfg, &mut traces, "debug", |c| {
        container_security(c).capabilities = Some(cri::Capability {
            add_capabilities: vec!["SYS_PTRACE".to_string()],
            ..Default::default()
        });
    })
    .await;
    let pid1 = env.d.exec_ok(&debug, &["cat", "/proc/1/cmdline"]).await;
    assert_eq!(pid1.trim_end_matches('\0'), "crishim-pause");

    let (code, out, err) = exec(&env, &debug, &["head", "-2", "/proc/1/root/etc/shadow"]).await;
    assert!(
        code != 0 && !out.contains("root:"),
        "the host's /etc/shadow through /proc/1/root: exit {code}\n{out}{err}"
    );
    // Reachable (CAP_SYS_PTRACE), and empty.
    let (code, out, err) = exec(&env, &debug, &["ls", "-A", "/proc/1/root/"]).await;
    assert_eq!((code, out.trim()), (0, ""), "ls /proc/1/root/: {err}");
    let (code, out, err) = exec(&env, &debug, &["ls", "/proc/1/fd/"]).await;
    assert_eq!((code, out.trim()), (0, ""), "ls /proc/1/fd/: {err}");
    // The pod's namespaces still work: the container shares the infra's network namespace.
    let (ctr_net, infra_net) = (
        env.d
            .exec_ok(&debug, &["readlink", "/proc/self/ns/net"])
            .await,
        env.d.exec_ok(&debug, &["readlink", "/proc/1/ns/net"]).await,
    );
    assert_eq!(ctr_net, infra_net);

    let infra = env.d.infra_pid(&pod).await.unwrap();
    let st = std::fs::read_to_string(format!("/proc/{infra}/status")).unwrap();
    for field in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(hex(&status_field(&st, field)), 0, "infra {field}: {st}");
    }
    assert_eq!(status_field(&st, "NoNewPrivs"), "1", "{st}");
    assert_eq!(status_field(&st, "Seccomp"), "2", "{st}");
    let root: Vec<_> = std::fs::read_dir(format!("/proc/{infra}/root"))
        .unwrap()
        .collect();
    assert!(root.is_empty(), "the infra's root is not empty: {root:?}");
    let mnt = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    assert_ne!(
        mnt(&infra.to_string()),
        mnt("self"),
        "infra in the host's mount namespace"
    );

    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn readonly_rootfs_and_masked_and_readonly_paths() {
    let env = PodEnv::start().await;
    let pod_cfg = env.pod_config("ro");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);

    let ro = start(&env, &pod, &pod_cfg, &mut traces, "ro", |c| {
        container_security(c).readonly_rootfs = true;
    })
    .await;
    let (code, _, err) = exec(&env, &ro, &["touch", "/x"]).await;
    assert_ne!(code, 0, "touch / on a read-only rootfs succeeded");
    assert!(err.contains("Read-only file system"), "stderr: {err}");

    // Defaults: /proc/kcore (or, on a kernel without it, another default-masked /proc file)
    // masked with /dev/null over it; /proc/sys read-only.
    let masked = ["/proc/kcore", "/proc/keys", "/proc/timer_list"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("a default-masked /proc file on the host");
    let dflt = start(&env, &pod, &pod_cfg, &mut traces, "defaults", |_| {}).await;
    env.d.exec_ok(&dflt, &["touch", "/x"]).await;
    assert_eq!(
        env.d
            .exec_ok(&dflt, &["stat", "-c", "%F", masked])
            .await
            .trim(),
        "character special file"
    );
    assert_eq!(
        env.d
            .exec_ok(&dflt, &["busybox", "wc", "-c", masked])
            .await
            .split_whitespace()
            .next(),
        Some("0")
    );
    let (code, _, err) = exec(
        &env,
        &dflt,
        &["sh", "-c", "echo x > /proc/sys/kernel/domainname"],
    )
    .await;
    assert_ne!(code, 0, "writing /proc/sys succeeded");
    assert!(err.contains("Read-only file system"), "stderr: {err}");

    // Custom lists replace the defaults.
    let custom = start(&env, &pod, &pod_cfg, &mut traces, "custom", |c| {
        let sc = container_security(c);
        sc.masked_paths = vec!["/etc/group".to_string()];
        sc.readonly_paths = vec!["/tmp".to_string()];
    })
    .await;
    assert_eq!(env.d.exec_ok(&custom, &["cat", "/etc/group"]).await, "");
    assert_eq!(
        env.d
            .exec_ok(&custom, &["stat", "-c", "%F", masked])
            .await
            .trim(),
        "regular empty file",
        "{masked} still masked although masked_paths replaced the defaults"
    );
    let (code, _, err) = exec(&env, &custom, &["touch", "/tmp/x"]).await;
    assert_ne!(code, 0, "touch in a read-only path succeeded");
    assert!(err.contains("Read-only file system"), "stderr: {err}");

    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn pod_sysctls_are_visible_in_containers() {
    let env = PodEnv::start().await;
    let mut pod_cfg = env.pod_config("sysctl");
    let linux = pod_cfg.linux.get_or_insert_with(Default::default);
    linux.sysctls.insert(
        "net.ipv4.ip_unprivileged_port_start".to_string(),
        "0".to_string(),
    );
    linux
        .sysctls
        .insert("kernel.msgmax".to_string(), "12345".to_string());
    // Refused where they would change the node: a sysctl no namespace scopes, and a net.* one
    // in a pod on the node's network.
    let mut node_wide = pod_cfg.clone();
    let sysctls = &mut node_wide.linux.as_mut().unwrap().sysctls;
    sysctls.insert("kernel.panic".to_string(), "1".to_string());
    let mut host_net = pod_cfg.clone();
    host_net
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options = Some(namespaces(NS_NODE, NS_CONTAINER, NS_POD));
    host_net.hostname.clear();
    for (what, cfg) in [
        ("kernel.panic", node_wide),
        ("net.* with host network", host_net),
    ] {
        let e = env.d.run_pod(&cfg).await.expect_err(what);
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
        assert!(e.message().contains("is refused"), "{what}: {e:?}");
    }

    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);
    let id = start(&env, &pod, &pod_cfg, &mut traces, "c", |_| {}).await;

    assert_eq!(
        env.d
            .exec_ok(
                &id,
                &["cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"]
            )
            .await
            .trim(),
        "0"
    );
    assert_eq!(
        env.d
            .exec_ok(&id, &["cat", "/proc/sys/kernel/msgmax"])
            .await
            .trim(),
        "12345"
    );
    // The host's own values are untouched.
    assert_ne!(
        std::fs::read_to_string("/proc/sys/kernel/msgmax")
            .unwrap()
            .trim(),
        "12345"
    );

    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn seccomp_unconfined_and_missing_localhost_profile() {
    let env = PodEnv::start().await;
    let pod_cfg = env.pod_config("seccomp");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);
    let profile = |t: cri::security_profile::ProfileType, r: &str| {
        Some(cri::SecurityProfile {
            profile_type: t as i32,
            localhost_ref: r.to_string(),
        })
    };
    use cri::security_profile::ProfileType;

    let probe = ["busybox", "unshare", "-U", "true"];
    let unconfined = start(&env, &pod, &pod_cfg, &mut traces, "unconfined", |c| {
        container_security(c).seccomp = profile(ProfileType::Unconfined, "");
    })
    .await;
    let (code, _, err) = exec(&env, &unconfined, &probe).await;
    assert!(
        code == 0 || !err.contains("Operation not permitted"),
        "unshare unconfined: exit {code}, stderr {err}"
    );

    // A missing localhost profile: InvalidArgument.
    let mut c = sh_container(&env, "missing", LOOP_UNTIL_TERM, &marker("missing"));
    container_security(&mut c).seccomp = profile(
        ProfileType::Localhost,
        "/nonexistent/crishim-seccomp-profile.json",
    );
    let e = env
        .d
        .create_container(&pod, &c, &pod_cfg)
        .await
        .expect_err("CreateContainer with a missing seccomp profile");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");

    env.finish_pod(&pod, traces).await;
}

/// Run `probe` as the container's own program (a filter covers it and its children), keep its
/// exit code and stderr in /tmp, then sleep.
fn probed(probe: &str) -> Vec<String> {
    let script = format!("{probe} 2>/tmp/err; echo $? > /tmp/rc; sleep 3600");
    vec!["sh".into(), "-c".into(), script]
}

/// The probe's recorded exit code and stderr.
async fn probe_result(env: &PodEnv, id: &str) -> (i32, String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (code, out, _) = exec(env, id, &["cat", "/tmp/rc"]).await;
        if code == 0 && !out.trim().is_empty() {
            let (_, err, _) = exec(env, id, &["cat", "/tmp/err"]).await;
            return (out.trim().parse().unwrap(), err);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the probe never finished"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn seccomp_filters_runtime_default_and_localhost_file() {
    use cri::security_profile::ProfileType;
    let env = PodEnv::start().await;
    let pod_cfg = env.pod_config("seccomp-default");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);
    // unshare(CLONE_NEWUSER) needs no capability, but RuntimeDefault only allows unshare with
    // CAP_SYS_ADMIN.
    let probe = ["busybox", "unshare", "-U", "true"];
    let dflt = start(&env, &pod, &pod_cfg, &mut traces, "runtime-default", |c| {
        c.command = probed(&probe.join(" "));
        container_security(c).seccomp = Some(cri::SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            ..Default::default()
        });
    })
    .await;
    let (_, status, _) = exec(&env, &dflt, &["grep", "Seccomp:", "/proc/1/status"]).await;
    assert!(
        status.contains('2'),
        "the container's process is filtered: {status}"
    );
    let (code, err) = probe_result(&env, &dflt).await;
    assert_ne!(code, 0, "unshare under RuntimeDefault succeeded");
    assert!(err.contains("Operation not permitted"), "stderr: {err}");

    // A localhost profile that denies mkdir.
    let path = env.d.dir().join("deny-mkdir.json");
    std::fs::write(
        &path,
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir","mkdirat"],"action":"SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    let local = start(&env, &pod, &pod_cfg, &mut traces, "localhost", |c| {
        c.command = probed("mkdir /tmp/x");
        container_security(c).seccomp = Some(cri::SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: path.to_string_lossy().into_owned(),
        });
    })
    .await;
    let (code, err) = probe_result(&env, &local).await;
    assert_ne!(code, 0, "mkdir under a deny-mkdir profile succeeded");
    assert!(err.contains("Operation not permitted"), "stderr: {err}");

    env.finish_pod(&pod, traces).await;
}

/// The lines of /proc/<pid>/status that say how a process is confined.
const CONFINEMENT: [&str; 8] = [
    "Seccomp",
    "Seccomp_filters",
    "NoNewPrivs",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
];

/// libcontainer's exec path drops the filter, so the shim loads it; without no_new_privs that
/// needs capabilities the process must give back before it runs.
#[tokio::test]
async fn exec_sync_processes_get_the_containers_seccomp_filter_and_capabilities() {
    use cri::security_profile::ProfileType;
    let env = PodEnv::start().await;
    let pod_cfg = env.pod_config("seccomp-exec");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);
    let runtime_default = || {
        Some(cri::SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            ..Default::default()
        })
    };
    let root = start(&env, &pod, &pod_cfg, &mut traces, "root", |c| {
        container_security(c).seccomp = runtime_default();
    })
    .await;
    let nnp = start(&env, &pod, &pod_cfg, &mut traces, "nnp-user", |c| {
        let sc = container_security(c);
        sc.seccomp = runtime_default();
        sc.no_new_privs = true;
        sc.run_as_user = Some(cri::Int64Value { value: 1000 });
    })
    .await;
    // A Localhost profile with an argument comparison and an errno action.
    let profile = env.d.dir().join("args-errno.json");
    std::fs::write(
        &profile,
        r#"{"defaultAction":"SCMP_ACT_ALLOW","architectures":["SCMP_ARCH_X86_64"],
            "syscalls":[{"names":["personality"],"action":"SCMP_ACT_ERRNO","errnoRet":18,
                         "args":[{"index":0,"value":8,"op":"SCMP_CMP_EQ"}]},
                        {"names":["unshare"],"action":"SCMP_ACT_ERRNO","errnoRet":1}]}"#,
    )
    .unwrap();
    let local = start(&env, &pod, &pod_cfg, &mut traces, "local", |c| {
        container_security(c).seccomp = Some(cri::SecurityProfile {
            profile_type: ProfileType::Localhost as i32,
            localhost_ref: profile.to_string_lossy().into_owned(),
        });
    })
    .await;
    // A pod's container init and its exec'd processes load a program compiled once per node
    // (`seccomp_program`). The reference is libcontainer's own path, which compiles the profile
    // in the process with libseccomp: `crishim bundle run` of the same config. The kernel must
    // hold the same program for all three, and the same confinement.
    for (n, id) in [&root, &nnp, &local].into_iter().enumerate() {
        let bundle = env.d.state_dir().join("containers").join(id);
        let shadow: serde_json::Value = serde_json::from_slice(
            &std::fs::read(bundle.join("init-config/config.json"))
                .expect("the init took the compiled-once path"),
        )
        .unwrap();
        assert!(shadow["linux"]["seccomp"].is_null(), "{shadow}");
        let init = env.d.container_pid(id).await;
        let marker = format!("77{n}2");
        let mut reference = ReferenceRun::start(&bundle, &marker);
        let (ours, theirs) = (seccomp_program(init), seccomp_program(reference.pid));
        assert_same_program(&theirs, &ours, "the container init", "libcontainer's own");
        let (ours, theirs) = (
            std::fs::read_to_string(format!("/proc/{init}/status")).unwrap(),
            std::fs::read_to_string(format!("/proc/{}/status", reference.pid)).unwrap(),
        );
        for field in CONFINEMENT {
            assert_eq!(
                status_field(&ours, field),
                status_field(&theirs, field),
                "{field} of the container init against libcontainer's own path"
            );
        }
        reference.stop();
    }
    for (n, id) in [&root, &nnp, &local].into_iter().enumerate() {
        let init = env.d.container_pid(id).await;
        let marker = format!("77{n}1");
        let bg = format!("sleep {marker} </dev/null >/dev/null 2>&1 &");
        env.d.exec_ok(id, &["sh", "-c", &bg]).await;
        let execd = host_pid_with_cmdline(&["sleep", &marker]);
        let (a, b) = (seccomp_program(init), seccomp_program(execd));
        assert_same_program(&a, &b, "the exec'd process", "the container init's");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(execd),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    for id in [&root, &nnp] {
        let main = env.d.exec_ok(id, &["cat", "/proc/1/status"]).await;
        let execd = env.d.exec_ok(id, &["cat", "/proc/self/status"]).await;
        assert_eq!(status_field(&execd, "Seccomp"), "2", "{execd}");
        for field in CONFINEMENT {
            assert_eq!(
                status_field(&execd, field),
                status_field(&main, field),
                "{field} of an exec'd process against the container's own"
            );
        }
        // unshare(CLONE_NEWUSER) needs no capability; RuntimeDefault refuses it.
        let (code, _, err) = exec(&env, id, &["busybox", "unshare", "-U", "true"]).await;
        assert_ne!(code, 0, "unshare in an exec'd process succeeded");
        assert!(err.contains("Operation not permitted"), "stderr: {err}");
    }
    env.finish_pod(&pod, traces).await;
}

/// `theirs` (the reference) and `ours` are the same, non-trivial BPF program.
fn assert_same_program(reference: &[u8], ours: &[u8], who: &str, against: &str) {
    assert!(
        reference.len() > 8,
        "{} bytes of BPF in the reference",
        reference.len()
    );
    if reference != ours {
        let at = reference
            .iter()
            .zip(ours)
            .position(|(x, y)| x != y)
            .unwrap_or(reference.len().min(ours.len()));
        panic!(
            "{who}'s filter differs from {against}: {} against {} bytes, first at byte {at}",
            ours.len(),
            reference.len()
        );
    }
}

/// `crishim bundle run` of a pod container's config with its seccomp profile, capabilities,
/// user and mounts, in namespaces and a cgroup of its own, running `sleep <marker>` on the same
/// root filesystem: libcontainer sets the filter up itself there.
struct ReferenceRun {
    child: std::process::Child,
    pid: i32,
    _dir: tempfile::TempDir,
}

impl ReferenceRun {
    fn start(bundle: &std::path::Path, marker: &str) -> ReferenceRun {
        let dir = tempfile::tempdir().unwrap();
        let mut config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
        config["root"]["path"] = bundle.join("rootfs").to_string_lossy().into();
        config["process"]["args"] = serde_json::json!(["sleep", marker]);
        config["process"]["terminal"] = false.into();
        let linux = &mut config["linux"];
        linux["cgroupsPath"] = format!("/crishim-test-reference-{marker}").into();
        for ns in linux["namespaces"].as_array_mut().unwrap() {
            ns.as_object_mut().unwrap().remove("path");
        }
        config.as_object_mut().unwrap().remove("hooks");
        let run = dir.path().join("bundle");
        std::fs::create_dir(&run).unwrap();
        std::fs::write(run.join("config.json"), config.to_string()).unwrap();
        std::fs::write(dir.path().join("config.toml"), "").unwrap();
        let child = std::process::Command::new(crishim_tests::daemon::daemon_bin())
            .arg("bundle")
            .arg("--config")
            .arg(dir.path().join("config.toml"))
            .arg("--root")
            .arg(dir.path().join("state"))
            .arg("run")
            .arg("--id")
            .arg(format!("reference-{marker}"))
            .arg(&run)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        ReferenceRun {
            child,
            pid: host_pid_with_cmdline(&["sleep", marker]),
            _dir: dir,
        }
    }

    fn stop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let status = self.child.wait().unwrap();
        assert_eq!(status.code(), Some(137), "the reference run ends as killed");
    }
}

impl Drop for ReferenceRun {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The host pid of the one process whose argv is `argv` (waits up to 5 s for it).
fn host_pid_with_cmdline(argv: &[&str]) -> i32 {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    for _ in 0..500 {
        let found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            (std::fs::read(format!("/proc/{pid}/cmdline")).ok()? == want).then_some(pid)
        });
        if let Some(pid) = found {
            return pid;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("no process runs {argv:?}");
}

/// The BPF program of the process's newest seccomp filter, as the kernel holds it
/// (`PTRACE_SECCOMP_GET_FILTER`, while attached).
fn seccomp_program(pid: i32) -> Vec<u8> {
    const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: attach to a process of the test's own container, stop, read, detach.
    unsafe {
        assert_eq!(
            libc::ptrace(libc::PTRACE_ATTACH, pid, null, null),
            0,
            "PTRACE_ATTACH {pid}: {}",
            std::io::Error::last_os_error()
        );
        let mut status = 0;
        libc::waitpid(pid, &mut status, libc::__WALL);
    }
    let mut prog = vec![0u8; 8 * 4096];
    // SAFETY: the kernel writes at most BPF_MAXINSNS instructions of 8 bytes into `prog`.
    let n = unsafe {
        libc::ptrace(
            PTRACE_SECCOMP_GET_FILTER,
            pid,
            0usize,
            prog.as_mut_ptr() as *mut libc::c_void,
        )
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: detaching lets the process run on.
    unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, null, null) };
    assert!(n > 0, "PTRACE_SECCOMP_GET_FILTER on {pid}: {err}");
    prog.truncate(n as usize * 8);
    prog
}

/// No silent no: on this kernel (no AppArmor, no SELinux) a `Localhost` AppArmor profile and an
/// SELinux label are refused by name, while `RuntimeDefault` AppArmor (nothing to apply) runs.
#[tokio::test]
async fn lsm_options_are_refused_where_the_kernel_lacks_them() {
    let env = PodEnv::start().await;
    let apparmor_on = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|v| v.trim() == "Y");
    if apparmor_on || std::path::Path::new("/sys/fs/selinux/enforce").exists() {
        eprintln!("this kernel has AppArmor or SELinux; the refusals are for kernels without");
        return;
    }
    let mut pod_cfg = env.pod_config("lsm");
    // A pod-level label is refused at RunPodSandbox.
    pod_cfg
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .selinux_options = Some(cri::SeLinuxOption {
        r#type: "spc_t".to_string(),
        ..Default::default()
    });
    let e = env.d.run_pod(&pod_cfg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("SELinux"), "{e:?}");
    pod_cfg
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .selinux_options = None;

    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);
    let refused = |f: fn(&mut cri::LinuxContainerSecurityContext)| {
        let mut c = env.container_config("lsm", &["sleep", "1000"]);
        f(container_security(&mut c));
        c
    };
    for c in [
        refused(|sc| {
            sc.apparmor = Some(cri::SecurityProfile {
                profile_type: cri::security_profile::ProfileType::Localhost as i32,
                localhost_ref: "crishim-test".to_string(),
            })
        }),
        refused(|sc| {
            sc.selinux_options = Some(cri::SeLinuxOption {
                level: "s0:c1,c2".to_string(),
                ..Default::default()
            })
        }),
    ] {
        let e = env
            .d
            .create_container(&pod, &c, &pod_cfg)
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message().contains("AppArmor") || e.message().contains("SELinux"),
            "{e:?}"
        );
    }
    let id = start(&env, &pod, &pod_cfg, &mut traces, "lsm", |c| {
        container_security(c).apparmor = Some(cri::SecurityProfile {
            profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
            ..Default::default()
        });
    })
    .await;
    assert_eq!(env.d.exec_ok(&id, &["echo", "ok"]).await.trim(), "ok");
    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn devices_are_created_and_others_are_denied() {
    let env = PodEnv::start().await;
    let pod_cfg = env.pod_config("dev");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);
    let id = start(&env, &pod, &pod_cfg, &mut traces, "dev", |c| {
        c.devices = vec![cri::Device {
            container_path: "/dev/mynull".to_string(),
            host_path: "/dev/null".to_string(),
            permissions: "rw".to_string(),
        }];
    })
    .await;
    assert_eq!(
        env.d
            .exec_ok(&id, &["stat", "-c", "%F %t:%T", "/dev/mynull"])
            .await
            .trim(),
        "character special file 1:3"
    );
    env.d
        .exec_ok(&id, &["sh", "-c", "echo hi > /dev/mynull"])
        .await;

    // A block device the container may create (CAP_MKNOD) but not open: the v1 devices cgroup,
    // or on cgroup v2 the eBPF device filter.
    if std::path::Path::new("/dev/loop0").exists() {
        env.d
            .exec_ok(&id, &["busybox", "mknod", "/tmp/loop0", "b", "7", "0"])
            .await;
        let (code, _, err) = exec(
            &env,
            &id,
            &["busybox", "dd", "if=/tmp/loop0", "of=/dev/null", "count=1"],
        )
        .await;
        assert_ne!(code, 0, "reading a loop device succeeded");
        assert!(err.contains("Operation not permitted"), "stderr: {err}");
    } else {
        eprintln!("skipped the loop device part: no /dev/loop0 on this host");
    }

    env.finish_pod(&pod, traces).await;
}

/// Issue 14: ids that `setresuid` takes as -1 (a no-op that leaves the process root), and
/// `resources.unified` keys that climb out of the container's cgroup directory, are refused over
/// the wire at CreateContainer and UpdateContainerResources, and the running container is kept.
#[tokio::test]
async fn out_of_range_ids_and_climbing_unified_keys_are_invalid_argument() {
    let env = PodEnv::start().await;
    // The image's /etc/passwd names a user whose uid is 4294967295.
    let passwd = format!("{PASSWD}ghost:x:4294967295:1000::/:/bin/sh\n");
    let ids = LayerBuilder::new()
        .file("etc/passwd", passwd, 0o644)
        .file("etc/group", GROUP, 0o644)
        .build(Compression::Gzip);
    let ghost_image = env
        .push_and_pull(
            "busybox-ghost",
            &Image::new(vec![busybox_layer(), ids]).user("ghost"),
        )
        .await;
    let pod_cfg = env.pod_config("ids");
    let pod = env.d.run_pod(&pod_cfg).await.unwrap();
    let mut traces = PodTraces::new(&pod, &pod_cfg);
    let refused = |r: Result<String, tonic::Status>, what: &str, needle: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
        assert!(e.message().contains(needle), "{what}: {}", e.message());
    };

    let mut c = sh_container(&env, "ghost", LOOP_UNTIL_TERM, &marker("ghost"));
    c.image = Some(crishim_tests::cri::spec(&ghost_image.tag_ref()));
    refused(
        env.d.create_container(&pod, &c, &pod_cfg).await,
        "the image's user of uid 4294967295",
        "4294967295",
    );
    let mut c = sh_container(&env, "uid-max", LOOP_UNTIL_TERM, &marker("uid-max"));
    container_security(&mut c).run_as_user = Some(cri::Int64Value { value: 4294967295 });
    refused(
        env.d.create_container(&pod, &c, &pod_cfg).await,
        "run_as_user 4294967295",
        "out of range",
    );
    let climbing = || -> std::collections::HashMap<String, String> {
        [("../../cgroup.procs".to_string(), "1".to_string())].into()
    };
    let mut c = sh_container(&env, "unified", LOOP_UNTIL_TERM, &marker("unified"));
    c.linux
        .get_or_insert_with(Default::default)
        .resources
        .get_or_insert_with(Default::default)
        .unified = climbing();
    refused(
        env.d.create_container(&pod, &c, &pod_cfg).await,
        "a unified key with ..",
        "unified",
    );

    let running = start(&env, &pod, &pod_cfg, &mut traces, "running", |_| {}).await;
    let update = env
        .d
        .runtime_client()
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: running.clone(),
            linux: Some(cri::LinuxContainerResources {
                unified: climbing(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .map(|_| String::new());
    refused(
        update,
        "UpdateContainerResources with a unified key with ..",
        "unified",
    );
    assert_eq!(
        env.d.exec_ok(&running, &["echo", "alive"]).await.trim(),
        "alive"
    );

    env.finish_pod(&pod, traces).await;
}

/// Labels and annotations are strings in the CRI; OCI needs them so. Ones that are not UTF-8 (a
/// client that encodes bytes where the API has strings) are `InvalidArgument`, saying what
/// failed, not the `Internal` of a decoding error.
#[tokio::test]
async fn labels_and_annotations_that_are_not_utf8_are_invalid_argument() {
    use std::collections::HashMap;

    /// `PodSandboxMetadata` / `ContainerMetadata` (name 1, uid or attempt 2, namespace 3).
    #[derive(Clone, PartialEq, prost::Message)]
    struct Metadata {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(string, tag = "2")]
        uid: String,
        #[prost(string, tag = "3")]
        namespace: String,
    }
    /// `PodSandboxConfig` with labels (6) and annotations (7) as bytes on the same wire.
    #[derive(Clone, PartialEq, prost::Message)]
    struct PodConfig {
        #[prost(message, optional, tag = "1")]
        metadata: Option<Metadata>,
        #[prost(map = "string, bytes", tag = "6")]
        labels: HashMap<String, Vec<u8>>,
        #[prost(map = "string, bytes", tag = "7")]
        annotations: HashMap<String, Vec<u8>>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct RunPod {
        #[prost(message, optional, tag = "1")]
        config: Option<PodConfig>,
    }
    /// `ContainerConfig` with annotations (10) as bytes.
    #[derive(Clone, PartialEq, prost::Message)]
    struct ContainerConfig {
        #[prost(map = "string, bytes", tag = "10")]
        annotations: HashMap<String, Vec<u8>>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct CreateContainer {
        #[prost(string, tag = "1")]
        pod_sandbox_id: String,
        #[prost(message, optional, tag = "2")]
        config: Option<ContainerConfig>,
    }

    let d = crishim_tests::Daemon::start(crishim_tests::DaemonOptions::new())
        .await
        .unwrap();
    let channel = crishim_tests::daemon::connect_unix(d.socket())
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    let bad = HashMap::from([("k".to_string(), vec![b'a', 0xff])]);
    let pod = RunPod {
        config: Some(PodConfig {
            metadata: Some(Metadata {
                name: "p".into(),
                uid: "u".into(),
                namespace: "n".into(),
            }),
            labels: bad.clone(),
            annotations: HashMap::new(),
        }),
    };
    grpc.ready().await.unwrap();
    let e = grpc
        .unary::<_, cri::RunPodSandboxResponse, _>(
            tonic::Request::new(pod.clone()),
            http::uri::PathAndQuery::from_static("/runtime.v1.RuntimeService/RunPodSandbox"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("UTF-8"), "{}", e.message());

    let ctr = CreateContainer {
        pod_sandbox_id: "x".into(),
        config: Some(ContainerConfig { annotations: bad }),
    };
    grpc.ready().await.unwrap();
    let e = grpc
        .unary::<_, cri::CreateContainerResponse, _>(
            tonic::Request::new(ctr),
            http::uri::PathAndQuery::from_static("/runtime.v1.RuntimeService/CreateContainer"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // Nothing was made.
    let pods = d
        .runtime_client()
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(pods.is_empty());
    d.stop();
}
