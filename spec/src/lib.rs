//! Building a container's OCI runtime spec (`config.json`) from the image config, the CRI
//! `ContainerConfig` and its pod, the way containerd's CRI plugin does.
//!
//! The inputs are plain data, so the whole translation is unit-tested without a kernel. The few
//! facts read from the node (cgroup version, the daemon's capabilities, ...) are gathered in
//! [`HostFacts`] so tests can pin them.
//!
//! Each concern lives in its own module: `process` (args, env, cwd, rlimits), `user` (uid, gids
//! from the image's /etc/passwd and /etc/group), `mounts`, `namespaces`, `devices`, `security`
//! (capabilities, privileged, masked paths, seccomp), `seccomp` (the RuntimeDefault profile) and
//! `resources` (cgroup limits, oom score, sysctls).

use std::collections::HashMap;
use std::path::PathBuf;

use crishim_proto::cri;
use oci_spec::image::ImageConfiguration;
use oci_spec::runtime::{Linux, Process, Root, Spec};

pub mod apparmor;
pub mod cgroups;
pub mod selinux;
pub mod userns;

mod devices;
mod host;
mod kernel_mounts;
mod mounts;
pub use mounts::is_image_volume;
mod namespaces;
mod process;
mod resources;
mod seccomp;
mod security;
pub(crate) mod user;

#[cfg(test)]
mod tests;

pub(crate) use host::is_cgroup_v2;
use host::HostFacts;

/// Namespace paths a container joins (usually the infra process's `/proc/<pid>/ns/*`).
/// `None` means: for net/ipc/uts, the host's (host-network pods etc.); for pid, a new namespace
/// unless `host_pid` is set.
#[derive(Debug, Clone, Default)]
pub struct PodNamespaces {
    pub net: Option<PathBuf>,
    pub ipc: Option<PathBuf>,
    pub uts: Option<PathBuf>,
    /// Pod-shared (`NamespaceMode::Pod`) or target (`NamespaceMode::Target`) pid namespace.
    pub pid: Option<PathBuf>,
    pub host_pid: bool,
    /// The pod's user namespace (`hostUsers: false`), joined.
    pub user: Option<PathBuf>,
}

/// Files and directories the pod provides to each of its containers.
#[derive(Debug, Clone, Default)]
pub struct PodFiles {
    pub hostname: Option<PathBuf>,
    pub resolv_conf: Option<PathBuf>,
    pub hosts: Option<PathBuf>,
    /// A pod-wide tmpfs, bind-mounted at /dev/shm.
    pub shm: Option<PathBuf>,
}

/// An image volume (KEP-4639) the daemon has mounted: what to bind, read-only and `noexec`, at
/// a `Mount`'s container path.
#[derive(Debug, Clone)]
pub struct ImageVolume {
    pub container_path: String,
    /// Inside the mounted image (its `image_sub_path` already resolved there).
    pub source: PathBuf,
}

/// Everything the spec depends on.
pub struct SpecInputs<'a> {
    pub container_id: &'a str,
    pub config: &'a cri::ContainerConfig,
    pub sandbox: &'a cri::PodSandboxConfig,
    pub image: &'a ImageConfiguration,
    /// The container's mounted root filesystem: `root.path`, and where /etc/passwd and /etc/group
    /// are read from (always resolved inside it, never through a symlink out of it).
    pub rootfs: PathBuf,
    pub namespaces: PodNamespaces,
    pub files: PodFiles,
    /// The config's image mounts, mounted.
    pub image_volumes: &'a [ImageVolume],
    /// cgroupfs-style path, e.g. `/kubepods/besteffort/pod<uid>/<container-id>`.
    pub cgroups_path: String,
    /// The daemon's own `oom_score_adj`: a container's is never set below it, as containerd's
    /// `restrict_oom_score_adj` does, because lowering it needs privileges the node may not give.
    pub min_oom_score_adj: Option<i32>,
    /// A privileged container gets every host device, and access to all devices; a handler with
    /// `privileged_without_host_devices` turns this off.
    pub privileged_host_devices: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Bad input from the CRI caller; maps to `InvalidArgument`.
    #[error("{0}")]
    Invalid(String),
    /// A local failure reading the rootfs etc.; maps to `Internal`.
    #[error("{0}")]
    Internal(String),
}

impl SpecError {
    fn internal(what: impl std::fmt::Display, err: impl std::fmt::Display) -> Self {
        SpecError::Internal(format!("{what}: {err}"))
    }
}

/// Annotation keys containerd's CRI plugin sets on every container's spec.
pub const ANNOTATION_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub const ANNOTATION_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
pub const ANNOTATION_IMAGE_NAME: &str = "io.kubernetes.cri.image-name";
pub const ANNOTATION_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
pub const ANNOTATION_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub const ANNOTATION_SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";

/// Builds the OCI runtime spec for one container.
/// `noNewPrivileges` as libcontainer needs it: absent unless set. libcontainer installs a seccomp
/// filter early, while still privileged, only when the field is absent; an explicit `false` takes
/// the late path, after capabilities are dropped, where loading the filter fails with EPERM.
fn no_new_privileges(set: bool) -> Option<bool> {
    set.then_some(true)
}

/// The cgroup limits of `resources` alone, for `UpdateContainerResources` on a running container:
/// device rules are left as they are.
pub fn resources(
    resources: &cri::LinuxContainerResources,
) -> Result<oci_spec::runtime::LinuxResources, SpecError> {
    let config = cri::ContainerConfig {
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources.clone()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut out = resources::build(&config, Vec::new(), &HostFacts::detect())?;
    out.set_devices(None);
    Ok(out)
}

pub fn build(inputs: &SpecInputs<'_>) -> Result<Spec, SpecError> {
    build_with(inputs, &HostFacts::detect())
}

/// [`build`] against given node facts.
fn build_with(inputs: &SpecInputs<'_>, host: &HostFacts) -> Result<Spec, SpecError> {
    let config = inputs.config;
    let image = inputs.image.config().as_ref();
    let sc = security_context(config);
    let privileged = sc.is_some_and(|sc| sc.privileged);
    security::check_privileged_allowed(privileged, inputs.sandbox)?;

    let capabilities = security::capabilities(sc, privileged, host)?;
    let seccomp = security::seccomp(sc, privileged, &capabilities)?;
    let devices = devices::build(config, privileged && inputs.privileged_host_devices, host)?;
    kernel_mounts::check(config)?;
    let mut mounts = mounts::build(config, &inputs.files, inputs.image_volumes, privileged)?;
    let joins_pid_ns = !inputs.namespaces.host_pid && inputs.namespaces.pid.is_some();
    // In a user namespace, cgroup v1 cannot be mounted at all: the binds are the only way.
    let in_userns = inputs.namespaces.user.is_some();
    if !host.cgroup_v2 && (joins_pid_ns || in_userns) && inputs.cgroups_path.starts_with('/') {
        mounts::emulate_cgroup_v1(
            &mut mounts.mounts,
            &host.cgroup_v1_dirs,
            &inputs.cgroups_path,
        );
    }

    let mut process = Process::default();
    process
        .set_terminal(Some(config.tty))
        .set_args(Some(process::args(config, image)?))
        .set_env(Some(process::env(
            config,
            image,
            &pod_hostname(inputs, host),
        )?))
        .set_cwd(process::cwd(config, image))
        .set_user(user::resolve(
            &inputs.rootfs,
            sc,
            image.and_then(|c| c.user().as_deref()),
        )?)
        .set_capabilities(Some(security::linux_capabilities(capabilities)))
        .set_rlimits(Some(process::rlimits(host.nofile_hard)))
        .set_no_new_privileges(no_new_privileges(sc.is_some_and(|sc| sc.no_new_privs)))
        .set_oom_score_adj(resources::oom_score_adj(config, inputs.min_oom_score_adj));

    let (masked_paths, readonly_paths) = security::masked_and_readonly_paths(sc, privileged);
    let cgroups_path =
        (!inputs.cgroups_path.is_empty()).then(|| inputs.cgroups_path.clone().into());
    let mut linux = Linux::default();
    linux
        .set_namespaces(Some(namespaces::build(
            &inputs.namespaces,
            host.cgroup_v2 && !privileged,
        )))
        .set_devices(Some(devices.nodes))
        .set_resources(Some(resources::build(config, devices.rules, host)?))
        .set_cgroups_path(cgroups_path)
        .set_rootfs_propagation(mounts.rootfs_propagation)
        .set_masked_paths(Some(masked_paths))
        .set_readonly_paths(Some(readonly_paths))
        .set_sysctl(resources::sysctls(inputs.sandbox))
        .set_seccomp(seccomp);

    let mut root = Root::default();
    root.set_path(inputs.rootfs.clone())
        .set_readonly(Some(sc.is_some_and(|sc| sc.readonly_rootfs)));

    // Every field `Spec::default()` fills (hostname "youki", its own mounts, ...) is set here.
    let mut spec = Spec::default();
    spec.set_version(oci_spec::runtime::VERSION.to_string())
        .set_root(Some(root))
        .set_mounts(Some(mounts.mounts))
        .set_process(Some(process))
        .set_hostname(namespaces::hostname(&inputs.namespaces, inputs.sandbox))
        .set_annotations(Some(annotations(config, inputs.sandbox)))
        .set_linux(Some(linux));
    Ok(spec)
}

fn security_context(config: &cri::ContainerConfig) -> Option<&cri::LinuxContainerSecurityContext> {
    config.linux.as_ref()?.security_context.as_ref()
}

/// The pod's hostname, for `HOSTNAME=`; a host-network pod may send none, and then, as in
/// containerd, the node's own name is what the container sees.
fn pod_hostname(inputs: &SpecInputs<'_>, host: &HostFacts) -> String {
    if inputs.sandbox.hostname.is_empty() {
        host.hostname.clone()
    } else {
        inputs.sandbox.hostname.clone()
    }
}

/// The CRI annotations are copied, then containerd's own (which win, as in containerd).
/// `io.kubernetes.cri.sandbox-id` is left to the caller, which knows the sandbox's id.
fn annotations(
    config: &cri::ContainerConfig,
    sandbox: &cri::PodSandboxConfig,
) -> HashMap<String, String> {
    let mut out = config.annotations.clone();
    let meta = sandbox.metadata.clone().unwrap_or_default();
    let image = config.image.clone().unwrap_or_default();
    let image_name = if image.user_specified_image.is_empty() {
        image.image
    } else {
        image.user_specified_image
    };
    let container_name = config
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    for (key, value) in [
        (ANNOTATION_SANDBOX_NAMESPACE, meta.namespace),
        (ANNOTATION_SANDBOX_UID, meta.uid),
        (ANNOTATION_SANDBOX_NAME, meta.name),
        (ANNOTATION_CONTAINER_NAME, container_name),
        (ANNOTATION_IMAGE_NAME, image_name),
        (ANNOTATION_CONTAINER_TYPE, "container".to_string()),
    ] {
        out.insert(key.to_string(), value);
    }
    out
}
