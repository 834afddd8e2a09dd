//! What the spec is built from, and what building it gives.

use std::collections::HashMap;
use std::path::PathBuf;

use crishim_proto::cri;
use oci_spec::image::ImageConfiguration;
use oci_spec::runtime::Spec;

use crate::{selinux, userns};

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
    /// The AppArmor profile the process runs under (the caller has checked that it is loaded).
    pub apparmor_profile: Option<String>,
    /// The process's label, and the file label that goes to `linux.mountLabel`.
    pub selinux: Option<&'a selinux::Labels>,
    /// Run the program under crishim's init: this host binary, bind-mounted read-only at
    /// [`INIT_PATH`](crate::INIT_PATH).
    pub init: Option<PathBuf>,
    /// `crishim-init`, for what only it can do when `init` is not asked for: give the process an
    /// environment value that is not UTF-8.
    pub init_binary: Option<PathBuf>,
    /// What the GPUs give the container, prepared on the host; its edits are made after init's.
    pub gpu: Option<&'a crishim_gpu::Plan>,
    /// Annotations added last, where the spec has no such key: a runtime handler's pod
    /// annotations, never over crishim's own.
    pub passed_annotations: HashMap<String, String>,
    /// The value of [`ANNOTATION_SANDBOX_ID`](crate::ANNOTATION_SANDBOX_ID).
    pub sandbox_id: Option<&'a str>,
}

/// A built spec.
#[derive(Debug)]
pub struct Built {
    pub spec: Spec,
    /// Its binds from the pod (volumes, the pod's files), which in a user namespace are
    /// idmapped; init's and the GPU's are the node's.
    pub pod_binds: userns::PodBinds,
}
