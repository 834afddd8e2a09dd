//! Tests of the spec builder, one section per concern. Each builds a spec from a small pod with
//! a temporary rootfs and node facts pinned by `Fixture`, changes one input and checks the
//! outcome the test is named after.

use std::collections::HashSet;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use oci_spec::image::{Config as ImageConfig, ImageConfiguration};
use oci_spec::runtime::{
    Capability, LinuxDeviceType, LinuxNamespaceType, LinuxSeccompAction, LinuxSeccompOperator,
    Mount, Spec,
};

use super::host::HostFacts;
use super::security::{caps_from_mask, DEFAULT_CAPS, DEFAULT_MASKED_PATHS, DEFAULT_READONLY_PATHS};
use super::*;

const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1::/:/sbin/nologin
# a comment line
app:x:1000:1000::/home/app:/bin/sh
other:x:1001:1001::/home/other:/bin/sh
";

const GROUP: &str = "\
root:x:0:
daemon:x:1:
wheel:x:10:root,app
audio:x:29:app
video:x:44:app,other
staff:x:50:root
app:x:1000:app
other:x:1001:
";

struct Fixture {
    config: cri::ContainerConfig,
    sandbox: cri::PodSandboxConfig,
    image: ImageConfig,
    rootfs: tempfile::TempDir,
    namespaces: PodNamespaces,
    files: PodFiles,
    cgroups_path: String,
    min_oom_score_adj: Option<i32>,
    privileged_host_devices: bool,
    host: HostFacts,
}

impl Fixture {
    /// Container "app" of pod "web" (hostname "web-0", in its own namespaces), image with
    /// `Cmd ["sh"]`, a rootfs holding PASSWD and GROUP, on a cgroup v1 node with swap and hugetlb
    /// accounting whose daemon has every capability.
    fn new() -> Self {
        let rootfs = tempfile::tempdir().unwrap();
        write(rootfs.path(), "etc/passwd", PASSWD);
        write(rootfs.path(), "etc/group", GROUP);
        let mut image = ImageConfig::default();
        image.set_cmd(Some(vec!["sh".to_string()]));
        Fixture {
            config: cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "app".to_string(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: "docker.io/library/busybox:1.36".to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            sandbox: cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: "web".to_string(),
                    uid: "uid-1".to_string(),
                    namespace: "default".to_string(),
                    attempt: 0,
                }),
                hostname: "web-0".to_string(),
                ..Default::default()
            },
            image,
            rootfs,
            namespaces: PodNamespaces {
                net: Some("/proc/100/ns/net".into()),
                ipc: Some("/proc/100/ns/ipc".into()),
                uts: Some("/proc/100/ns/uts".into()),
                pid: None,
                host_pid: false,
                user: None,
            },
            files: PodFiles::default(),
            cgroups_path: "/kubepods/besteffort/poduid-1/c1".to_string(),
            min_oom_score_adj: None,
            privileged_host_devices: true,
            host: HostFacts {
                cgroup_v2: false,
                swap_controller: true,
                hugetlb_controller: true,
                current_caps: caps_from_mask(u64::MAX),
                hostname: "node-1".to_string(),
                dev_root: PathBuf::from("/dev"),
                nofile_hard: None,
                cgroup_v1_dirs: vec![
                    ("cpu,cpuacct".into(), vec!["cpu".into(), "cpuacct".into()]),
                    ("memory".into(), vec![]),
                ],
            },
        }
    }

    fn build(&self) -> Result<Spec, SpecError> {
        let mut image = ImageConfiguration::default();
        image.set_config(Some(self.image.clone()));
        let inputs = SpecInputs {
            image_volumes: &[],
            container_id: "c1",
            config: &self.config,
            sandbox: &self.sandbox,
            image: &image,
            rootfs: self.rootfs.path().to_path_buf(),
            namespaces: self.namespaces.clone(),
            files: self.files.clone(),
            cgroups_path: self.cgroups_path.clone(),
            min_oom_score_adj: self.min_oom_score_adj,
            privileged_host_devices: self.privileged_host_devices,
        };
        build_with(&inputs, &self.host)
    }

    fn spec(&self) -> Spec {
        self.build().expect("spec builds")
    }

    fn invalid(&self) -> String {
        match self.build() {
            Err(SpecError::Invalid(msg)) => msg,
            other => panic!("expected SpecError::Invalid, got {other:?}"),
        }
    }

    fn sc(&mut self) -> &mut cri::LinuxContainerSecurityContext {
        self.config
            .linux
            .get_or_insert_with(Default::default)
            .security_context
            .get_or_insert_with(Default::default)
    }

    fn resources(&mut self) -> &mut cri::LinuxContainerResources {
        self.config
            .linux
            .get_or_insert_with(Default::default)
            .resources
            .get_or_insert_with(Default::default)
    }

    fn privileged_pod(&mut self) {
        self.sandbox
            .linux
            .get_or_insert_with(Default::default)
            .security_context
            .get_or_insert_with(Default::default)
            .privileged = true;
    }

    fn add_mount(&mut self, container_path: &str, host_path: &Path) -> &mut cri::Mount {
        self.config.mounts.push(cri::Mount {
            container_path: container_path.to_string(),
            host_path: host_path.to_string_lossy().into_owned(),
            ..Default::default()
        });
        self.config.mounts.last_mut().unwrap()
    }
}

fn write(root: &Path, rel: &str, content: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn process(spec: &Spec) -> &oci_spec::runtime::Process {
    spec.process().as_ref().unwrap()
}

fn linux(spec: &Spec) -> &oci_spec::runtime::Linux {
    spec.linux().as_ref().unwrap()
}

fn args(spec: &Spec) -> Vec<String> {
    process(spec).args().clone().unwrap()
}

fn env(spec: &Spec) -> Vec<String> {
    process(spec).env().clone().unwrap()
}

fn uid_gid_groups(spec: &Spec) -> (u32, u32, Vec<u32>) {
    let user = process(spec).user();
    (
        user.uid(),
        user.gid(),
        user.additional_gids().clone().unwrap(),
    )
}

fn mounts(spec: &Spec) -> &[Mount] {
    spec.mounts().as_deref().unwrap()
}

fn mount_at<'a>(spec: &'a Spec, destination: &str) -> &'a Mount {
    mounts(spec)
        .iter()
        .find(|m| m.destination() == Path::new(destination))
        .unwrap_or_else(|| panic!("no mount at {destination}"))
}

fn options(mount: &Mount) -> Vec<String> {
    mount.options().clone().unwrap_or_default()
}

fn destinations(spec: &Spec) -> Vec<String> {
    mounts(spec)
        .iter()
        .map(|m| m.destination().display().to_string())
        .collect()
}

fn namespaces(spec: &Spec) -> Vec<(LinuxNamespaceType, Option<PathBuf>)> {
    linux(spec)
        .namespaces()
        .clone()
        .unwrap()
        .iter()
        .map(|n| (n.typ(), n.path().clone()))
        .collect()
}

fn bounding(spec: &Spec) -> HashSet<Capability> {
    process(spec)
        .capabilities()
        .as_ref()
        .unwrap()
        .bounding()
        .clone()
        .unwrap()
}

fn resources(spec: &Spec) -> &oci_spec::runtime::LinuxResources {
    linux(spec).resources().as_ref().unwrap()
}

// ---------------------------------------------------------------------------------------------
// 1. Process args

#[test]
fn args_default_to_image_entrypoint_then_cmd() {
    let mut f = Fixture::new();
    f.image.set_entrypoint(Some(strings(&["/entry.sh"])));
    f.image.set_cmd(Some(strings(&["serve", "--port=80"])));
    assert_eq!(
        args(&f.spec()),
        strings(&["/entry.sh", "serve", "--port=80"])
    );
}

#[test]
fn command_replaces_image_entrypoint_and_drops_image_cmd() {
    let mut f = Fixture::new();
    f.image.set_entrypoint(Some(strings(&["/entry.sh"])));
    f.image.set_cmd(Some(strings(&["serve"])));
    f.config.command = strings(&["/bin/echo"]);
    assert_eq!(args(&f.spec()), strings(&["/bin/echo"]));
}

#[test]
fn args_replace_image_cmd_and_keep_image_entrypoint() {
    let mut f = Fixture::new();
    f.image.set_entrypoint(Some(strings(&["/entry.sh"])));
    f.image.set_cmd(Some(strings(&["serve"])));
    f.config.args = strings(&["migrate", "--dry-run"]);
    assert_eq!(
        args(&f.spec()),
        strings(&["/entry.sh", "migrate", "--dry-run"])
    );
}

#[test]
fn command_and_args_are_joined() {
    let mut f = Fixture::new();
    f.image.set_entrypoint(Some(strings(&["/entry.sh"])));
    f.config.command = strings(&["/bin/sh", "-c"]);
    f.config.args = strings(&["echo hi"]);
    assert_eq!(args(&f.spec()), strings(&["/bin/sh", "-c", "echo hi"]));
}

#[test]
fn empty_string_image_entrypoint_is_no_entrypoint() {
    let mut f = Fixture::new();
    f.image.set_entrypoint(Some(strings(&[""])));
    f.image.set_cmd(Some(strings(&["/bin/app"])));
    assert_eq!(args(&f.spec()), strings(&["/bin/app"]));
}

#[test]
fn no_command_anywhere_is_invalid() {
    let mut f = Fixture::new();
    f.image.set_cmd(None);
    let msg = f.invalid();
    assert!(msg.starts_with("no command specified"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// 2. Env and working dir

/// The CRI carries env values as bytes (1.36); one that is not UTF-8 cannot reach an OCI process
/// and is refused by name, not mangled.
#[test]
fn an_env_value_that_is_not_utf8_is_refused() {
    let mut f = Fixture::new();
    f.config.envs = vec![cri::KeyValue {
        key: "BLOB".to_string(),
        value: vec![b'a', 0xff, 0xfe],
    }];
    let msg = f.invalid();
    assert!(msg.contains("BLOB") && msg.contains("UTF-8"), "{msg}");
}

/// An env entry with an empty name or a NUL byte made the runtime's init abort the create with a
/// panic whose message (the whole value) could fill its stderr pipe before the shim read it: the
/// create never returned. Such entries are refused, from the request and from the image alike.
#[test]
fn env_entries_no_process_can_get_are_refused() {
    for (key, value) in [
        ("", "x".repeat(100_000)),
        ("K\0", "v".into()),
        ("K", "v\0".into()),
    ] {
        let mut f = Fixture::new();
        f.config.envs = vec![cri::KeyValue {
            key: key.to_string(),
            value: value.into_bytes(),
        }];
        let msg = f.invalid();
        assert!(
            msg.contains("empty name or a NUL") && msg.len() < 1024,
            "{key:?}: {msg}"
        );
    }
    let mut f = Fixture::new();
    f.image.set_env(Some(strings(&["=from-the-image"])));
    assert!(f.invalid().contains("empty name or a NUL"));
}

#[test]
fn env_is_image_env_then_config_env_later_value_wins_in_place() {
    let mut f = Fixture::new();
    f.image.set_env(Some(strings(&[
        "PATH=/opt/bin:/bin",
        "LANG=C",
        "MODE=image",
    ])));
    f.config.envs = vec![
        cri::KeyValue {
            key: "MODE".to_string(),
            value: "pod".to_string().into(),
        },
        cri::KeyValue {
            key: "EXTRA".to_string(),
            value: "a=b".to_string().into(),
        },
    ];
    assert_eq!(
        env(&f.spec()),
        strings(&[
            "PATH=/opt/bin:/bin",
            "HOSTNAME=web-0",
            "LANG=C",
            "MODE=pod",
            "EXTRA=a=b"
        ])
    );
}

#[test]
fn image_env_entry_without_a_value_unsets_the_key() {
    let mut f = Fixture::new();
    f.image
        .set_env(Some(strings(&["LANG=C", "TZ=UTC", "LANG"])));
    let env = env(&f.spec());
    assert!(env.contains(&"TZ=UTC".to_string()));
    assert!(!env.iter().any(|e| e.starts_with("LANG")));
}

#[test]
fn env_has_the_default_path_when_the_image_sets_none() {
    let f = Fixture::new();
    let env = env(&f.spec());
    assert_eq!(
        env[0],
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    );
    assert_eq!(env.iter().filter(|e| e.starts_with("PATH=")).count(), 1);
}

#[test]
fn hostname_env_is_the_pod_hostname_and_a_config_env_can_override_it() {
    let mut f = Fixture::new();
    assert!(env(&f.spec()).contains(&"HOSTNAME=web-0".to_string()));
    f.config.envs = vec![cri::KeyValue {
        key: "HOSTNAME".to_string(),
        value: "custom".to_string().into(),
    }];
    let env = env(&f.spec());
    assert!(env.contains(&"HOSTNAME=custom".to_string()));
    assert!(!env.contains(&"HOSTNAME=web-0".to_string()));
}

#[test]
fn hostname_env_falls_back_to_the_node_name_when_the_pod_has_none() {
    let mut f = Fixture::new();
    f.sandbox.hostname.clear();
    assert!(env(&f.spec()).contains(&"HOSTNAME=node-1".to_string()));
}

#[test]
fn working_dir_is_config_then_image_then_root() {
    let mut f = Fixture::new();
    assert_eq!(process(&f.spec()).cwd(), Path::new("/"));
    f.image.set_working_dir(Some("/srv".to_string()));
    assert_eq!(process(&f.spec()).cwd(), Path::new("/srv"));
    f.config.working_dir = "/work".to_string();
    assert_eq!(process(&f.spec()).cwd(), Path::new("/work"));
}

// ---------------------------------------------------------------------------------------------
// 8. tty

#[test]
fn tty_sets_terminal_and_term() {
    let mut f = Fixture::new();
    assert_eq!(process(&f.spec()).terminal(), Some(false));
    f.config.tty = true;
    let spec = f.spec();
    assert_eq!(process(&spec).terminal(), Some(true));
    assert!(env(&spec).contains(&"TERM=xterm".to_string()));
}

// ---------------------------------------------------------------------------------------------
// 3. User

#[test]
fn no_user_anywhere_is_root_with_roots_groups_from_etc_group() {
    let f = Fixture::new();
    assert_eq!(uid_gid_groups(&f.spec()), (0, 0, vec![0, 10, 50]));
}

#[test]
fn image_user_name_resolves_uid_gid_and_member_groups() {
    let mut f = Fixture::new();
    f.image.set_user(Some("app".to_string()));
    // The primary group plus wheel, audio and video, where "app" is listed; its own "app" group
    // is the primary one.
    assert_eq!(
        uid_gid_groups(&f.spec()),
        (1000, 1000, vec![10, 29, 44, 1000])
    );
}

#[test]
fn image_user_uid_finds_its_passwd_entry() {
    let mut f = Fixture::new();
    f.image.set_user(Some("1001".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()), (1001, 1001, vec![44, 1001]));
}

#[test]
fn image_user_uid_without_passwd_entry_has_gid_0() {
    let mut f = Fixture::new();
    f.image.set_user(Some("4242".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()), (4242, 0, vec![0]));
}

#[test]
fn image_user_with_group_forms() {
    let mut f = Fixture::new();
    f.image.set_user(Some("1000:video".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()).0, 1000);
    assert_eq!(uid_gid_groups(&f.spec()).1, 44);
    f.image.set_user(Some("app:5".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()).0, 1000);
    assert_eq!(uid_gid_groups(&f.spec()).1, 5);
    f.image.set_user(Some("other:audio".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()).0, 1001);
    assert_eq!(uid_gid_groups(&f.spec()).1, 29);
    f.image.set_user(Some("7:8".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()), (7, 8, vec![8]));
}

#[test]
fn run_as_user_overrides_the_image_user() {
    let mut f = Fixture::new();
    f.image.set_user(Some("app".to_string()));
    f.sc().run_as_user = Some(cri::Int64Value { value: 1001 });
    assert_eq!(uid_gid_groups(&f.spec()), (1001, 1001, vec![44, 1001]));
}

#[test]
fn run_as_username_is_resolved_in_the_image() {
    let mut f = Fixture::new();
    f.sc().run_as_username = "app".to_string();
    assert_eq!(uid_gid_groups(&f.spec()).0, 1000);
}

#[test]
fn run_as_group_sets_the_primary_gid() {
    let mut f = Fixture::new();
    f.sc().run_as_user = Some(cri::Int64Value { value: 1000 });
    f.sc().run_as_group = Some(cri::Int64Value { value: 3000 });
    assert_eq!(
        uid_gid_groups(&f.spec()),
        (1000, 3000, vec![10, 29, 44, 3000])
    );
}

#[test]
fn run_as_group_without_a_user_is_invalid() {
    let mut f = Fixture::new();
    f.sc().run_as_group = Some(cri::Int64Value { value: 3000 });
    assert!(f.invalid().contains("run_as_group"));
}

#[test]
fn supplemental_groups_are_added_sorted_and_deduplicated() {
    let mut f = Fixture::new();
    f.sc().run_as_user = Some(cri::Int64Value { value: 1000 });
    f.sc().supplemental_groups = vec![2000, 44, 1000];
    assert_eq!(uid_gid_groups(&f.spec()).2, vec![10, 29, 44, 1000, 2000]);
}

#[test]
fn strict_supplemental_groups_policy_ignores_etc_group() {
    let mut f = Fixture::new();
    f.sc().run_as_user = Some(cri::Int64Value { value: 1000 });
    f.sc().supplemental_groups = vec![2000];
    f.sc().supplemental_groups_policy = cri::SupplementalGroupsPolicy::Strict as i32;
    assert_eq!(uid_gid_groups(&f.spec()), (1000, 1000, vec![1000, 2000]));
}

#[test]
fn unknown_user_or_group_name_is_invalid_and_named() {
    let mut f = Fixture::new();
    f.image.set_user(Some("nobody".to_string()));
    assert!(f.invalid().contains("\"nobody\""));
    f.image.set_user(Some("app:nogroup".to_string()));
    assert!(f.invalid().contains("\"nogroup\""));
}

#[test]
fn out_of_range_uid_is_invalid() {
    let mut f = Fixture::new();
    f.sc().run_as_user = Some(cri::Int64Value { value: -1 });
    assert!(f.invalid().contains("out of range"));
    f.sc().run_as_user = Some(cri::Int64Value { value: 1 << 40 });
    assert!(f.invalid().contains("out of range"));
}

/// 4294967295 is -1 to setresuid/setresgid, which then leave the process root: an image's
/// passwd or group entry with such an id is refused wherever it would be used.
#[test]
fn image_ids_of_u32_max_are_invalid() {
    let mut f = Fixture::new();
    let etc = f.rootfs.path().join("etc");
    let mut passwd = std::fs::read_to_string(etc.join("passwd")).unwrap();
    passwd.push_str("ghost:x:4294967295:1000::/:/bin/sh\nshade:x:3000:4294967295::/:/bin/sh\n");
    passwd.push_str("numb:x:3001:4294967294::/:/bin/sh\n");
    std::fs::write(etc.join("passwd"), passwd).unwrap();
    let mut group = std::fs::read_to_string(etc.join("group")).unwrap();
    group.push_str("ghosts:x:4294967295:app\n");
    std::fs::write(etc.join("group"), group).unwrap();
    for user in [
        "ghost",
        "shade",
        "3000",
        "numb",
        "ghost:1000",
        "1000:ghosts",
    ] {
        f.image.set_user(Some(user.to_string()));
        let msg = f.invalid();
        assert!(msg.contains("out of range"), "{user}: {msg}");
    }
    // As a supplementary group (app is a member of ghosts).
    f.image.set_user(Some("app".to_string()));
    assert!(f.invalid().contains("4294967295"));
    f.image.set_user(None);
    f.sc().run_as_username = "ghost".to_string();
    assert!(f.invalid().contains("4294967295"));
    f.sc().run_as_username = String::new();
    f.sc().run_as_user = Some(cri::Int64Value { value: 4294967295 });
    assert!(f.invalid().contains("out of range"));
}

#[test]
fn missing_passwd_is_fine_for_a_numeric_uid() {
    let mut f = Fixture::new();
    std::fs::remove_dir_all(f.rootfs.path().join("etc")).unwrap();
    f.image.set_user(Some("1000".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()), (1000, 0, vec![0]));
    f.image.set_user(Some("app".to_string()));
    assert!(f.invalid().contains("\"app\""));
}

/// A host file the image's symlinks try to reach: it has a user "escapee".
fn host_passwd() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "passwd", "escapee:x:4321:4321::/:/bin/sh\n");
    dir
}

#[test]
fn absolute_passwd_symlink_cannot_reach_a_host_file() {
    let outside = host_passwd();
    let mut f = Fixture::new();
    let passwd = f.rootfs.path().join("etc/passwd");
    std::fs::remove_file(&passwd).unwrap();
    // Resolved on the host, this names `outside`'s file; in the rootfs it names nothing.
    symlink(outside.path().join("passwd"), &passwd).unwrap();
    f.image.set_user(Some("escapee".to_string()));
    assert!(f.invalid().contains("\"escapee\""));
    // And a numeric uid gets no gid from it either.
    f.image.set_user(Some("4321".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()).1, 0);
}

#[test]
fn relative_passwd_symlink_cannot_climb_out_of_the_rootfs() {
    let outside = host_passwd();
    let mut f = Fixture::new();
    let passwd = f.rootfs.path().join("etc/passwd");
    std::fs::remove_file(&passwd).unwrap();
    let climb = "../".repeat(f.rootfs.path().components().count() + 2);
    let target = format!("{climb}{}", outside.path().join("passwd").display());
    symlink(target, &passwd).unwrap();
    f.image.set_user(Some("escapee".to_string()));
    assert!(f.invalid().contains("\"escapee\""));
}

#[test]
fn passwd_symlink_inside_the_rootfs_is_followed_there() {
    let mut f = Fixture::new();
    let etc = f.rootfs.path().join("etc");
    std::fs::rename(etc.join("passwd"), etc.join("passwd.real")).unwrap();
    // Absolute, as images have them: relative to the rootfs, not the host.
    symlink("/etc/passwd.real", etc.join("passwd")).unwrap();
    f.image.set_user(Some("app".to_string()));
    assert_eq!(uid_gid_groups(&f.spec()).0, 1000);
}

#[test]
fn passwd_that_is_not_a_regular_file_is_refused() {
    let mut f = Fixture::new();
    let passwd = f.rootfs.path().join("etc/passwd");
    std::fs::remove_file(&passwd).unwrap();
    // A FIFO would block a plain open forever.
    nix::unistd::mkfifo(&passwd, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    f.image.set_user(Some("app".to_string()));
    assert!(f.invalid().contains("not a regular file"));
}

// ---------------------------------------------------------------------------------------------
// 4. Mounts

#[test]
fn default_mounts_are_containerds() {
    let spec = Fixture::new().spec();
    assert_eq!(
        destinations(&spec),
        strings(&[
            "/proc",
            "/dev",
            "/dev/pts",
            "/dev/shm",
            "/dev/mqueue",
            "/sys",
            "/sys/fs/cgroup"
        ])
    );
    let shm = mount_at(&spec, "/dev/shm");
    assert_eq!(shm.typ().as_deref(), Some("tmpfs"));
    assert_eq!(
        options(mount_at(&spec, "/sys")),
        strings(&["nosuid", "noexec", "nodev", "ro"])
    );
    let cgroup = mount_at(&spec, "/sys/fs/cgroup");
    assert_eq!(cgroup.typ().as_deref(), Some("cgroup"));
    assert!(options(cgroup).contains(&"ro".to_string()));
    assert_eq!(
        options(mount_at(&spec, "/dev/pts")).last().unwrap(),
        "gid=5"
    );
}

fn pod_files(dir: &Path) -> PodFiles {
    for name in ["hostname", "hosts", "resolv.conf"] {
        write(dir, name, "x\n");
    }
    std::fs::create_dir_all(dir.join("shm")).unwrap();
    PodFiles {
        hostname: Some(dir.join("hostname")),
        resolv_conf: Some(dir.join("resolv.conf")),
        hosts: Some(dir.join("hosts")),
        shm: Some(dir.join("shm")),
    }
}

#[test]
fn pod_files_are_bind_mounted_and_replace_the_shm_tmpfs() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.files = pod_files(dir.path());
    let spec = f.spec();
    for (dest, file) in [
        ("/etc/hostname", "hostname"),
        ("/etc/hosts", "hosts"),
        ("/etc/resolv.conf", "resolv.conf"),
        ("/dev/shm", "shm"),
    ] {
        let m = mount_at(&spec, dest);
        assert_eq!(m.typ().as_deref(), Some("bind"));
        assert_eq!(
            m.source().as_deref(),
            Some(dir.path().canonicalize().unwrap().join(file).as_path())
        );
        assert_eq!(options(m), strings(&["rbind", "rprivate", "rw"]), "{dest}");
    }
    assert_eq!(
        mounts(&spec)
            .iter()
            .filter(|m| m.destination() == Path::new("/dev/shm"))
            .count(),
        1
    );
}

#[test]
fn pod_etc_files_are_read_only_with_a_read_only_rootfs_but_shm_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.files = pod_files(dir.path());
    f.sc().readonly_rootfs = true;
    let spec = f.spec();
    assert_eq!(options(mount_at(&spec, "/etc/hosts")).last().unwrap(), "ro");
    assert_eq!(
        options(mount_at(&spec, "/etc/resolv.conf")).last().unwrap(),
        "ro"
    );
    assert_eq!(options(mount_at(&spec, "/dev/shm")).last().unwrap(), "rw");
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
}

#[test]
fn pod_file_is_skipped_when_the_container_mounts_that_path() {
    let dir = tempfile::tempdir().unwrap();
    let own = tempfile::tempdir().unwrap();
    write(own.path(), "hosts", "127.0.0.1 mine\n");
    let mut f = Fixture::new();
    f.files = pod_files(dir.path());
    f.add_mount("/etc/hosts", &own.path().join("hosts"));
    let spec = f.spec();
    let hosts: Vec<_> = mounts(&spec)
        .iter()
        .filter(|m| m.destination() == Path::new("/etc/hosts"))
        .collect();
    assert_eq!(hosts.len(), 1);
    assert_eq!(
        hosts[0].source().as_deref(),
        Some(own.path().canonicalize().unwrap().join("hosts").as_path())
    );
}

#[test]
fn cri_bind_mounts_get_rbind_access_and_propagation() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.add_mount("/data", dir.path()).readonly = true;
    f.add_mount("/logs", dir.path());
    let spec = f.spec();
    assert_eq!(
        options(mount_at(&spec, "/data")),
        strings(&["rbind", "rprivate", "ro"])
    );
    assert_eq!(
        options(mount_at(&spec, "/logs")),
        strings(&["rbind", "rprivate", "rw"])
    );
    assert_eq!(
        mount_at(&spec, "/data").source().as_deref(),
        Some(dir.path().canonicalize().unwrap().as_path())
    );
    assert_eq!(linux(&spec).rootfs_propagation(), &None);
}

#[test]
fn propagation_modes_map_to_rslave_and_rshared_and_set_rootfs_propagation() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.add_mount("/slave", dir.path()).propagation =
        cri::MountPropagation::PropagationHostToContainer as i32;
    let spec = f.spec();
    assert_eq!(
        options(mount_at(&spec, "/slave")),
        strings(&["rbind", "rslave", "rw"])
    );
    assert_eq!(linux(&spec).rootfs_propagation().as_deref(), Some("slave"));

    // A bidirectional mount makes the rootfs shared, whatever order the mounts come in.
    f.add_mount("/shared", dir.path()).propagation =
        cri::MountPropagation::PropagationBidirectional as i32;
    f.add_mount("/slave2", dir.path()).propagation =
        cri::MountPropagation::PropagationHostToContainer as i32;
    let spec = f.spec();
    assert_eq!(
        options(mount_at(&spec, "/shared")),
        strings(&["rbind", "rshared", "rw"])
    );
    assert_eq!(linux(&spec).rootfs_propagation().as_deref(), Some("shared"));
}

#[test]
fn recursive_read_only_mounts_use_rro() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    let m = f.add_mount("/data", dir.path());
    m.readonly = true;
    m.recursive_read_only = true;
    assert_eq!(
        options(mount_at(&f.spec(), "/data")),
        strings(&["rbind", "rprivate", "rro"])
    );
    f.config.mounts[0].readonly = false;
    assert!(f.invalid().contains("recursive read-only"));
}

#[test]
fn relative_container_path_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.add_mount("data", dir.path());
    assert!(f.invalid().contains("\"data\" is not absolute"));
}

#[test]
fn missing_host_path_is_invalid_and_named() {
    let mut f = Fixture::new();
    f.add_mount("/data", Path::new("/nonexistent/crishim-volume"));
    assert!(f.invalid().contains("/nonexistent/crishim-volume"));
}

#[test]
fn host_path_symlinks_are_resolved() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("real")).unwrap();
    symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
    let mut f = Fixture::new();
    f.add_mount("/data", &dir.path().join("link"));
    let real = dir.path().canonicalize().unwrap().join("real");
    assert_eq!(
        mount_at(&f.spec(), "/data").source().as_deref(),
        Some(real.as_path())
    );
}

#[test]
fn user_mounts_are_sorted_parents_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.add_mount("/a/b/c", dir.path());
    f.add_mount("/a/b", dir.path());
    f.add_mount("/z", dir.path());
    f.add_mount("/a", dir.path());
    let dests = destinations(&f.spec());
    let user: Vec<_> = dests.iter().skip(7).map(String::as_str).collect();
    assert_eq!(user, ["/z", "/a", "/a/b", "/a/b/c"]);
}

#[test]
fn mounting_dev_drops_the_default_mounts_under_dev() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::new();
    f.add_mount("/dev", dir.path());
    let dests = destinations(&f.spec());
    assert_eq!(dests, strings(&["/proc", "/sys", "/sys/fs/cgroup", "/dev"]));
}

// ---------------------------------------------------------------------------------------------
// 5 & 6. Namespaces and hostname

#[test]
fn pod_namespaces_are_joined_with_a_new_mount_and_pid_namespace() {
    let spec = Fixture::new().spec();
    assert_eq!(
        namespaces(&spec),
        vec![
            (LinuxNamespaceType::Pid, None),
            (LinuxNamespaceType::Ipc, Some("/proc/100/ns/ipc".into())),
            (LinuxNamespaceType::Uts, Some("/proc/100/ns/uts".into())),
            (LinuxNamespaceType::Mount, None),
            (LinuxNamespaceType::Network, Some("/proc/100/ns/net".into())),
        ]
    );
    assert_eq!(spec.hostname().as_deref(), Some("web-0"));
}

#[test]
fn host_namespaces_have_no_entry_and_keep_the_host_hostname() {
    let mut f = Fixture::new();
    f.namespaces = PodNamespaces {
        host_pid: true,
        ..Default::default()
    };
    let spec = f.spec();
    assert_eq!(namespaces(&spec), vec![(LinuxNamespaceType::Mount, None)]);
    assert_eq!(spec.hostname(), &None);
}

#[test]
fn pod_pid_namespace_is_joined() {
    let mut f = Fixture::new();
    f.namespaces.pid = Some("/proc/100/ns/pid".into());
    assert_eq!(
        namespaces(&f.spec())[0],
        (LinuxNamespaceType::Pid, Some("/proc/100/ns/pid".into()))
    );
}

#[test]
fn joining_the_pods_pid_namespace_on_cgroup_v1_binds_the_containers_own_cgroups() {
    let cgroup_mounts = |spec: &Spec| -> Vec<(String, String, String)> {
        spec.mounts()
            .as_ref()
            .unwrap()
            .iter()
            .filter(|m| m.destination().starts_with("/sys/fs/cgroup"))
            .map(|m| {
                (
                    m.destination().display().to_string(),
                    m.typ().clone().unwrap_or_default(),
                    m.source()
                        .as_ref()
                        .map(|s| s.display().to_string())
                        .unwrap_or_default(),
                )
            })
            .collect()
    };
    let mut f = Fixture::new();
    let plain = vec![("/sys/fs/cgroup".into(), "cgroup".into(), "cgroup".into())];
    assert_eq!(cgroup_mounts(&f.spec()), plain, "own pid namespace");
    f.namespaces.pid = Some("/proc/100/ns/pid".into());
    let own = "/kubepods/besteffort/poduid-1/c1";
    let bind = |dest: &str, dir: &str| {
        (
            format!("/sys/fs/cgroup/{dest}"),
            "bind".to_string(),
            format!("/sys/fs/cgroup/{dir}{own}"),
        )
    };
    let spec = f.spec();
    assert_eq!(
        cgroup_mounts(&spec),
        vec![
            ("/sys/fs/cgroup".into(), "tmpfs".into(), "tmpfs".into()),
            bind("cpu,cpuacct", "cpu,cpuacct"),
            bind("cpu", "cpu,cpuacct"),
            bind("cpuacct", "cpu,cpuacct"),
            bind("memory", "memory"),
        ]
    );
    let opts = spec.mounts().as_ref().unwrap()[spec
        .mounts()
        .as_ref()
        .unwrap()
        .iter()
        .position(|m| m.destination() == Path::new("/sys/fs/cgroup/memory"))
        .unwrap()]
    .options()
    .clone()
    .unwrap();
    assert!(opts.contains(&"ro".to_string()), "{opts:?}");
    f.host.cgroup_v2 = true;
    assert_eq!(cgroup_mounts(&f.spec()), plain, "v2 mounts cgroup2 itself");
}

#[test]
fn cgroup_v1_hierarchies_are_the_ones_libcgroups_makes_cgroups_in() {
    let dir = tempfile::tempdir().unwrap();
    for d in [
        "cpu,cpuacct",
        "memory",
        "systemd",
        "unified",
        "rdma",
        "net_cls,net_prio",
    ] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    for (link, to) in [
        ("cpu", "cpu,cpuacct"),
        ("cpuacct", "cpu,cpuacct"),
        ("net_cls", "net_cls,net_prio"),
    ] {
        std::os::unix::fs::symlink(to, dir.path().join(link)).unwrap();
    }
    assert_eq!(
        super::host::cgroup_v1_dirs(dir.path()),
        vec![
            (
                "cpu,cpuacct".to_string(),
                vec!["cpu".to_string(), "cpuacct".to_string()]
            ),
            ("memory".to_string(), vec![]),
            ("net_cls,net_prio".to_string(), vec!["net_cls".to_string()]),
        ]
    );
}

#[test]
fn cgroup_namespace_only_on_cgroup_v2_and_not_when_privileged() {
    let mut f = Fixture::new();
    let has_cgroup_ns =
        |spec: &Spec| namespaces(spec).contains(&(LinuxNamespaceType::Cgroup, None));
    assert!(!has_cgroup_ns(&f.spec()));
    f.host.cgroup_v2 = true;
    assert!(has_cgroup_ns(&f.spec()));
    f.privileged_pod();
    f.sc().privileged = true;
    assert!(!has_cgroup_ns(&f.spec()));
}

#[test]
fn cgroup_v2_is_detected_from_the_filesystem_at_the_cgroup_root() {
    // On a v1 or hybrid node /sys/fs/cgroup is a tmpfs (cgroup2 at most at .../unified), so no
    // cgroup namespace there.
    let root_is_cgroup2 = nix::sys::statfs::statfs("/sys/fs/cgroup")
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC);
    assert_eq!(HostFacts::detect().cgroup_v2, root_is_cgroup2);
}

/// The fixed facts are read once; the hostname is read for each spec. A thread with a UTS
/// namespace of its own renames the node: it sees the new name, and the same fixed facts.
#[test]
fn the_node_hostname_is_read_for_each_spec_while_the_fixed_facts_are_kept() {
    if !nix::unistd::Uid::effective().is_root() {
        return;
    }
    let before = HostFacts::detect();
    let seen = std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUTS).ok()?;
        nix::unistd::sethostname("crishim-renamed-node").ok()?;
        Some(HostFacts::detect())
    })
    .join()
    .unwrap()
    .expect("a UTS namespace for the thread");
    assert_eq!(seen.hostname, "crishim-renamed-node");
    assert_ne!(before.hostname, seen.hostname);
    assert_eq!(
        (seen.cgroup_v2, seen.cgroup_v1_dirs, seen.nofile_hard),
        (before.cgroup_v2, before.cgroup_v1_dirs, before.nofile_hard)
    );
}

/// The NOFILE ceiling is the daemon's hard limit as it is now, unless the daemon may raise it.
#[test]
fn the_nofile_ceiling_is_the_current_hard_limit_without_cap_sys_resource() {
    let hard = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .unwrap()
        .1;
    let none = oci_spec::runtime::Capabilities::new();
    assert_eq!(super::host::nofile_ceiling(&none), Some(hard));
    let may_raise = oci_spec::runtime::Capabilities::from([Capability::SysResource]);
    assert_eq!(super::host::nofile_ceiling(&may_raise), None);
}

// ---------------------------------------------------------------------------------------------
// 7. Devices

#[test]
fn device_cgroup_denies_all_then_allows_the_standard_devices() {
    let spec = Fixture::new().spec();
    let rules = resources(&spec).devices().clone().unwrap();
    assert!(!rules[0].allow());
    assert_eq!(rules[0].typ(), None);
    assert_eq!(rules[0].access().as_deref(), Some("rwm"));
    let allowed: Vec<_> = rules[1..]
        .iter()
        .map(|r| {
            assert!(r.allow());
            assert_eq!(r.typ(), Some(LinuxDeviceType::C));
            (r.major().unwrap(), r.minor())
        })
        .collect();
    for dev in [
        (1, Some(3)),
        (1, Some(5)),
        (1, Some(7)),
        (1, Some(8)),
        (1, Some(9)),
        (5, Some(0)),
        (5, Some(2)),
        (136, None),
    ] {
        assert!(allowed.contains(&dev), "{dev:?} not allowed");
    }
    assert_eq!(linux(&spec).devices().as_deref(), Some(&[][..]));
}

#[test]
fn cri_device_becomes_a_node_and_an_allow_rule() {
    let mut f = Fixture::new();
    f.config.devices.push(cri::Device {
        container_path: "/dev/mynull".to_string(),
        host_path: "/dev/null".to_string(),
        permissions: "rw".to_string(),
    });
    let spec = f.spec();
    let nodes = linux(&spec).devices().clone().unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].path(), Path::new("/dev/mynull"));
    assert_eq!(
        (nodes[0].typ(), nodes[0].major(), nodes[0].minor()),
        (LinuxDeviceType::C, 1, 3)
    );
    let rule = resources(&spec).devices().clone().unwrap().pop().unwrap();
    assert!(rule.allow());
    assert_eq!(
        (rule.typ(), rule.major(), rule.minor()),
        (Some(LinuxDeviceType::C), Some(1), Some(3))
    );
    assert_eq!(rule.access().as_deref(), Some("rw"));
}

#[test]
fn missing_or_non_device_host_path_is_invalid() {
    let mut f = Fixture::new();
    f.config.devices.push(cri::Device {
        container_path: "/dev/x".to_string(),
        host_path: "/dev/crishim-missing".to_string(),
        permissions: "rwm".to_string(),
    });
    assert!(f.invalid().contains("/dev/crishim-missing"));
    let file = f.rootfs.path().join("etc/passwd");
    f.config.devices[0].host_path = file.display().to_string();
    assert!(f.invalid().contains("is not a device"));
}

#[test]
fn privileged_gets_all_host_devices_and_all_access() {
    let mut f = Fixture::new();
    f.privileged_pod();
    f.sc().privileged = true;
    let spec = f.spec();
    let rules = resources(&spec).devices().clone().unwrap();
    assert_eq!(rules.len(), 1);
    assert!(rules[0].allow());
    assert_eq!((rules[0].typ(), rules[0].major()), (None, None));
    let nodes = linux(&spec).devices().clone().unwrap();
    let null = nodes
        .iter()
        .find(|n| n.path() == Path::new("/dev/null"))
        .expect("/dev/null listed");
    assert_eq!(
        (null.typ(), null.major(), null.minor()),
        (LinuxDeviceType::C, 1, 3)
    );
    assert!(nodes.iter().all(|n| !n.path().starts_with("/dev/pts")));
}

#[test]
fn privileged_without_host_devices_keeps_the_default_rules_and_no_host_nodes() {
    let mut f = Fixture::new();
    f.privileged_pod();
    f.sc().privileged = true;
    f.privileged_host_devices = false;
    let spec = f.spec();
    let rules = resources(&spec).devices().clone().unwrap();
    assert!(!rules[0].allow(), "deny all first");
    assert!(rules.len() > 1);
    let nodes = linux(&spec).devices().clone().unwrap_or_default();
    assert!(nodes.is_empty(), "{nodes:?}");
    // Still privileged in every other way.
    let caps = process(&spec).capabilities().clone().unwrap();
    assert!(caps.effective().as_ref().unwrap().len() > 30);
}

// ---------------------------------------------------------------------------------------------
// 9. Security context

#[test]
fn default_capabilities_are_containerds_in_bounding_effective_permitted_only() {
    let spec = Fixture::new().spec();
    let caps = process(&spec).capabilities().clone().unwrap();
    let expected: HashSet<_> = DEFAULT_CAPS.into_iter().collect();
    assert_eq!(caps.bounding().as_ref(), Some(&expected));
    assert_eq!(caps.effective().as_ref(), Some(&expected));
    assert_eq!(caps.permitted().as_ref(), Some(&expected));
    assert_eq!(caps.inheritable(), &None);
    assert_eq!(caps.ambient(), &None);
}

#[test]
fn capabilities_are_added_and_dropped_with_or_without_prefix() {
    let mut f = Fixture::new();
    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: strings(&["NET_ADMIN", "CAP_SYS_TIME", "sys_ptrace"]),
        drop_capabilities: strings(&["MKNOD", "cap_net_raw"]),
        ..Default::default()
    });
    let caps = bounding(&f.spec());
    for cap in [
        Capability::NetAdmin,
        Capability::SysTime,
        Capability::SysPtrace,
        Capability::Chown,
    ] {
        assert!(caps.contains(&cap), "{cap:?}");
    }
    assert!(!caps.contains(&Capability::Mknod));
    assert!(!caps.contains(&Capability::NetRaw));
    assert_eq!(caps.len(), 14 + 3 - 2);
}

#[test]
fn all_is_every_capability_the_daemon_has_and_drop_all_keeps_only_added_ones() {
    let mut f = Fixture::new();
    f.host.current_caps = caps_from_mask(0x1f_feff_ffff); // everything but CAP_SYS_RESOURCE
    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: strings(&["ALL"]),
        drop_capabilities: strings(&["CHOWN"]),
        ..Default::default()
    });
    let caps = bounding(&f.spec());
    assert!(caps.contains(&Capability::SysAdmin));
    assert!(!caps.contains(&Capability::SysResource));
    assert!(!caps.contains(&Capability::Chown));

    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: strings(&["NET_BIND_SERVICE"]),
        drop_capabilities: strings(&["ALL"]),
        ..Default::default()
    });
    assert_eq!(
        bounding(&f.spec()),
        HashSet::from([Capability::NetBindService])
    );
}

#[test]
fn unknown_capability_is_invalid() {
    let mut f = Fixture::new();
    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: strings(&["FLY"]),
        ..Default::default()
    });
    assert!(f.invalid().contains("\"FLY\""));
}

#[test]
fn capability_bits_map_to_names() {
    assert_eq!(
        caps_from_mask(1 << 21),
        HashSet::from([Capability::SysAdmin])
    );
    assert_eq!(
        caps_from_mask(1 | 1 << 40),
        HashSet::from([Capability::Chown, Capability::CheckpointRestore])
    );
    assert_eq!(caps_from_mask(u64::MAX).len(), 41);
}

#[test]
fn privileged_container_needs_a_privileged_pod() {
    let mut f = Fixture::new();
    f.sc().privileged = true;
    assert!(f.invalid().contains("privileged"));
}

#[test]
fn privileged_gets_all_caps_writable_sys_no_masks_and_no_seccomp() {
    let mut f = Fixture::new();
    f.privileged_pod();
    f.sc().privileged = true;
    f.sc().seccomp = Some(cri::SecurityProfile::default()); // RuntimeDefault, ignored
    f.sc().capabilities = Some(cri::Capability {
        drop_capabilities: strings(&["ALL"]),
        ..Default::default()
    });
    let spec = f.spec();
    assert_eq!(bounding(&spec), caps_from_mask(u64::MAX));
    assert_eq!(linux(&spec).masked_paths().as_deref(), Some(&[][..]));
    assert_eq!(linux(&spec).readonly_paths().as_deref(), Some(&[][..]));
    assert_eq!(options(mount_at(&spec, "/sys")).last().unwrap(), "rw");
    assert_eq!(
        options(mount_at(&spec, "/sys/fs/cgroup")).last().unwrap(),
        "rw"
    );
    assert_eq!(linux(&spec).seccomp(), &None);
}

#[test]
fn no_new_privs_follows_the_security_context() {
    let mut f = Fixture::new();
    // Absent, not `false`: libcontainer loads seccomp early (privileged) only then.
    assert_eq!(process(&f.spec()).no_new_privileges(), None);
    f.sc().no_new_privs = true;
    assert_eq!(process(&f.spec()).no_new_privileges(), Some(true));
}

#[test]
fn masked_and_readonly_paths_default_to_containerds_when_not_given() {
    let mut f = Fixture::new();
    let spec = f.spec();
    assert_eq!(
        linux(&spec).masked_paths().clone().unwrap(),
        strings(&DEFAULT_MASKED_PATHS)
    );
    assert_eq!(
        linux(&spec).readonly_paths().clone().unwrap(),
        strings(&DEFAULT_READONLY_PATHS)
    );
    f.sc().masked_paths = strings(&["/proc/kcore"]);
    f.sc().readonly_paths = strings(&["/proc/sys"]);
    let spec = f.spec();
    assert_eq!(
        linux(&spec).masked_paths().clone().unwrap(),
        strings(&["/proc/kcore"])
    );
    assert_eq!(
        linux(&spec).readonly_paths().clone().unwrap(),
        strings(&["/proc/sys"])
    );
}

#[test]
fn pod_sysctls_are_copied() {
    let mut f = Fixture::new();
    assert_eq!(linux(&f.spec()).sysctl(), &None);
    f.sandbox.linux.get_or_insert_with(Default::default).sysctls = [(
        "net.ipv4.ip_unprivileged_port_start".to_string(),
        "0".to_string(),
    )]
    .into();
    let sysctl = linux(&f.spec()).sysctl().clone().unwrap();
    assert_eq!(sysctl["net.ipv4.ip_unprivileged_port_start"], "0");
}

#[test]
fn seccomp_is_unset_by_default_and_when_unconfined() {
    let mut f = Fixture::new();
    assert_eq!(linux(&f.spec()).seccomp(), &None);
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::Unconfined as i32,
        localhost_ref: String::new(),
    });
    assert_eq!(linux(&f.spec()).seccomp(), &None);
}

fn localhost(path: &Path) -> Option<cri::SecurityProfile> {
    Some(cri::SecurityProfile {
        profile_type: cri::security_profile::ProfileType::Localhost as i32,
        localhost_ref: path.display().to_string(),
    })
}

#[test]
fn localhost_seccomp_profile_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "profile.json",
        r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","write"],"action":"SCMP_ACT_ALLOW"}]}"#,
    );
    let mut f = Fixture::new();
    f.sc().seccomp = localhost(&dir.path().join("profile.json"));
    let seccomp = linux(&f.spec()).seccomp().clone().unwrap();
    assert_eq!(seccomp.default_action(), LinuxSeccompAction::ScmpActErrno);
    assert_eq!(
        seccomp.syscalls().as_ref().unwrap()[0].names(),
        &strings(&["read", "write"])
    );
}

#[test]
fn deprecated_localhost_profile_path_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "p.json", r#"{"defaultAction":"SCMP_ACT_LOG"}"#);
    let mut f = Fixture::new();
    #[allow(deprecated)]
    {
        f.sc().seccomp_profile_path = format!("localhost/{}", dir.path().join("p.json").display());
    }
    assert_eq!(
        linux(&f.spec()).seccomp().clone().unwrap().default_action(),
        LinuxSeccompAction::ScmpActLog
    );
}

#[test]
fn missing_invalid_or_relative_localhost_profile_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "bad.json", "{ not json");
    let mut f = Fixture::new();
    f.sc().seccomp = localhost(&dir.path().join("missing.json"));
    assert!(f.invalid().contains("missing.json"));
    f.sc().seccomp = localhost(&dir.path().join("bad.json"));
    assert!(f.invalid().contains("bad.json"));
    f.sc().seccomp = localhost(Path::new("profiles/p.json"));
    assert!(f.invalid().contains("not absolute"));
    // A device, a FIFO or a huge file named as the profile is refused unread, at once.
    f.sc().seccomp = localhost(Path::new("/dev/zero"));
    assert!(f.invalid().contains("not a regular file"));
    let fifo = dir.path().join("fifo.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    f.sc().seccomp = localhost(&fifo);
    assert!(f.invalid().contains("not a regular file"));
    let huge = dir.path().join("huge.json");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    f.sc().seccomp = localhost(&huge);
    assert!(f.invalid().contains("larger than"));
}

#[test]
fn runtime_default_seccomp_is_containerds_profile() {
    let mut f = Fixture::new();
    f.sc().seccomp = Some(cri::SecurityProfile::default());
    let seccomp = linux(&f.spec()).seccomp().clone().unwrap();
    assert_eq!(seccomp.default_action(), LinuxSeccompAction::ScmpActErrno);
    assert!(
        !seccomp
            .architectures()
            .clone()
            .unwrap_or_default()
            .is_empty()
            || !cfg!(target_arch = "x86_64")
    );
    let rules = seccomp.syscalls().clone().unwrap();
    let allowed = |name: &str| {
        rules.iter().any(|r| {
            r.action() == LinuxSeccompAction::ScmpActAllow
                && r.args().is_none()
                && r.names().iter().any(|n| n == name)
        })
    };
    for name in ["read", "write", "openat2", "execve", "chroot"] {
        assert!(allowed(name), "{name} should be allowed");
    }
    // No CAP_SYS_ADMIN: no mount, no unshare, clone only without namespace flags, clone3 ENOSYS.
    assert!(!allowed("mount") && !allowed("unshare") && !allowed("clone"));
    let clone = rules
        .iter()
        .find(|r| r.names() == &strings(&["clone"]))
        .unwrap();
    let arg = clone.args().clone().unwrap()[0];
    assert_eq!(arg.op(), LinuxSeccompOperator::ScmpCmpMaskedEq);
    // The OCI order, as runc and containerd's profile read it: value is the mask, valueTwo the
    // datum (containerd's rule: value 2114060288).
    assert_eq!((arg.value(), arg.value_two()), (0x7e02_0000, Some(0)));
    let json = serde_json::to_value(arg).unwrap();
    assert_eq!(
        (&json["value"], &json["valueTwo"]),
        (&serde_json::json!(2_114_060_288u64), &serde_json::json!(0))
    );
    let clone3 = rules
        .iter()
        .find(|r| r.names() == &strings(&["clone3"]))
        .unwrap();
    assert_eq!(
        (clone3.action(), clone3.errno_ret()),
        (LinuxSeccompAction::ScmpActErrno, Some(libc::ENOSYS as u32))
    );
    // socket: every family but AF_ALG and AF_VSOCK.
    assert_eq!(
        rules
            .iter()
            .filter(|r| r.names() == &strings(&["socket"]))
            .count(),
        3
    );
}

#[test]
fn runtime_default_seccomp_widens_with_capabilities() {
    let mut f = Fixture::new();
    f.sc().seccomp = Some(cri::SecurityProfile::default());
    f.sc().capabilities = Some(cri::Capability {
        add_capabilities: strings(&["SYS_ADMIN"]),
        ..Default::default()
    });
    let rules = linux(&f.spec())
        .seccomp()
        .clone()
        .unwrap()
        .syscalls()
        .clone()
        .unwrap();
    let unconditional = |name: &str| {
        rules
            .iter()
            .any(|r| r.args().is_none() && r.names().iter().any(|n| n == name))
    };
    assert!(unconditional("mount") && unconditional("clone") && unconditional("clone3"));
    assert!(!rules
        .iter()
        .any(|r| r.action() == LinuxSeccompAction::ScmpActErrno));
}

#[test]
fn seccomp_localhost_ref_with_another_type_is_invalid() {
    let mut f = Fixture::new();
    f.sc().seccomp = Some(cri::SecurityProfile {
        profile_type: 0,
        localhost_ref: "/p.json".to_string(),
    });
    assert!(f.invalid().contains("localhost_ref"));
}

// ---------------------------------------------------------------------------------------------
// 10. Resources

#[test]
fn cpu_and_memory_limits_are_mapped_with_swap_equal_to_memory() {
    let mut f = Fixture::new();
    let r = f.resources();
    r.cpu_period = 100_000;
    r.cpu_quota = 50_000;
    r.cpu_shares = 512;
    r.cpuset_cpus = "0-1".to_string();
    r.cpuset_mems = "0".to_string();
    r.memory_limit_in_bytes = 256 << 20;
    let spec = f.spec();
    let cpu = resources(&spec).cpu().clone().unwrap();
    assert_eq!(
        (cpu.period(), cpu.quota(), cpu.shares()),
        (Some(100_000), Some(50_000), Some(512))
    );
    assert_eq!(
        (cpu.cpus().as_deref(), cpu.mems().as_deref()),
        (Some("0-1"), Some("0"))
    );
    let memory = resources(&spec).memory().unwrap();
    assert_eq!(
        (memory.limit(), memory.swap()),
        (Some(256 << 20), Some(256 << 20))
    );
}

#[test]
fn explicit_swap_limit_wins_and_no_swap_limit_without_swap_accounting() {
    let mut f = Fixture::new();
    f.resources().memory_limit_in_bytes = 256 << 20;
    f.resources().memory_swap_limit_in_bytes = 512 << 20;
    assert_eq!(
        resources(&f.spec()).memory().unwrap().swap(),
        Some(512 << 20)
    );
    f.host.swap_controller = false;
    let spec = f.spec();
    let memory = resources(&spec).memory().unwrap();
    assert_eq!((memory.limit(), memory.swap()), (Some(256 << 20), None));
}

#[test]
fn unset_resources_leave_only_device_rules() {
    let mut f = Fixture::new();
    f.resources();
    let spec = f.spec();
    let r = resources(&spec);
    assert_eq!(
        (r.cpu(), r.memory(), r.hugepage_limits(), r.unified()),
        (&None, &None, &None, &None)
    );
    assert!(r.devices().is_some());
}

#[test]
fn hugepage_limits_need_the_hugetlb_controller() {
    let mut f = Fixture::new();
    f.resources().hugepage_limits = vec![cri::HugepageLimit {
        page_size: "2MB".to_string(),
        limit: 4 << 20,
    }];
    let limits = resources(&f.spec()).hugepage_limits().clone().unwrap();
    assert_eq!(
        (limits[0].page_size().as_str(), limits[0].limit()),
        ("2MB", 4 << 20)
    );
    f.host.hugetlb_controller = false;
    assert_eq!(resources(&f.spec()).hugepage_limits(), &None);
}

#[test]
fn unified_map_is_copied() {
    let mut f = Fixture::new();
    f.resources().unified = [("memory.high".to_string(), "1G".to_string())].into();
    assert_eq!(
        resources(&f.spec()).unified().clone().unwrap()["memory.high"],
        "1G"
    );
}

#[test]
fn unified_keys_that_leave_the_cgroup_directory_are_invalid() {
    for key in [
        "../memory.max",
        "memory.max/../../cgroup.procs",
        "memory/../x.max",
        "memory..max",
        "memory.",
        ".max",
        "memorymax",
        "memory.max\0",
        "Memory.max",
        "",
    ] {
        let mut f = Fixture::new();
        f.resources().unified = [(key.to_string(), "1".to_string())].into();
        assert!(f.invalid().contains("unified"), "{key:?} accepted");
    }
    let mut f = Fixture::new();
    f.resources().unified = [
        ("hugetlb.2MB.max".to_string(), "0".to_string()),
        ("io.max".to_string(), "8:0 rbps=1".to_string()),
        ("memory.swap.max".to_string(), "0".to_string()),
    ]
    .into();
    assert_eq!(resources(&f.spec()).unified().as_ref().unwrap().len(), 3);
    f.resources().unified = [("memory.high".to_string(), "1\0".to_string())].into();
    assert!(f.invalid().contains("NUL"));
}

#[test]
fn negative_cpu_shares_are_invalid() {
    let mut f = Fixture::new();
    f.resources().cpu_shares = -2;
    assert!(f.invalid().contains("cpu_shares"));
}

#[test]
fn oom_score_adj_is_never_below_the_daemons() {
    let mut f = Fixture::new();
    assert_eq!(process(&f.spec()).oom_score_adj(), None);
    f.resources().oom_score_adj = -997;
    assert_eq!(process(&f.spec()).oom_score_adj(), Some(-997));
    f.min_oom_score_adj = Some(-500);
    assert_eq!(process(&f.spec()).oom_score_adj(), Some(-500));
    f.resources().oom_score_adj = 1000;
    assert_eq!(process(&f.spec()).oom_score_adj(), Some(1000));
    f.resources().oom_score_adj = 5000;
    assert_eq!(process(&f.spec()).oom_score_adj(), Some(1000));
}

// ---------------------------------------------------------------------------------------------
// 11-13. Annotations, paths, rlimits, the spec as a whole

#[test]
fn annotations_are_copied_with_containerds() {
    let mut f = Fixture::new();
    f.config.annotations = [("example.com/a".to_string(), "1".to_string())].into();
    let spec = f.spec();
    let a = spec.annotations().clone().unwrap();
    assert_eq!(a["example.com/a"], "1");
    assert_eq!(a[ANNOTATION_CONTAINER_TYPE], "container");
    assert_eq!(a[ANNOTATION_CONTAINER_NAME], "app");
    assert_eq!(a[ANNOTATION_IMAGE_NAME], "docker.io/library/busybox:1.36");
    assert_eq!(a[ANNOTATION_SANDBOX_NAME], "web");
    assert_eq!(a[ANNOTATION_SANDBOX_NAMESPACE], "default");
    assert!(!a.contains_key("io.kubernetes.cri.sandbox-id"));

    f.config.image.as_mut().unwrap().user_specified_image = "busybox".to_string();
    assert_eq!(
        f.spec().annotations().clone().unwrap()[ANNOTATION_IMAGE_NAME],
        "busybox"
    );
}

#[test]
fn root_and_cgroups_path_come_from_the_inputs() {
    let f = Fixture::new();
    let spec = f.spec();
    let root = spec.root().as_ref().unwrap();
    assert_eq!(root.path(), f.rootfs.path());
    assert_eq!(root.readonly(), Some(false));
    assert_eq!(
        linux(&spec).cgroups_path().as_deref(),
        Some(Path::new("/kubepods/besteffort/poduid-1/c1"))
    );
}

#[test]
fn nofile_rlimit_is_raised() {
    let spec = Fixture::new().spec();
    let rlimits = process(&spec).rlimits().clone().unwrap();
    assert_eq!(rlimits.len(), 1);
    assert_eq!(
        rlimits[0].typ(),
        oci_spec::runtime::PosixRlimitType::RlimitNofile
    );
    assert_eq!(
        (rlimits[0].soft(), rlimits[0].hard()),
        (1_048_576, 1_048_576)
    );
}

#[test]
fn nofile_rlimit_stays_within_what_the_daemon_may_grant() {
    let mut f = Fixture::new();
    f.host.nofile_hard = Some(20_000);
    let spec = f.spec();
    let rlimits = process(&spec).rlimits().clone().unwrap();
    assert_eq!((rlimits[0].soft(), rlimits[0].hard()), (20_000, 20_000));
}

#[test]
fn spec_carries_no_library_defaults_and_round_trips_through_json() {
    let spec = Fixture::new().spec();
    let json = serde_json::to_value(&spec).unwrap();
    assert_eq!(json["ociVersion"], "1.1.0");
    assert!(json["process"]["apparmorProfile"].is_null());
    assert_eq!(json["process"]["user"]["uid"], 0);
    let back: Spec = serde_json::from_value(json).unwrap();
    assert_eq!(back, spec);
}
