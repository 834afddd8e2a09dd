//! Namespaces and the hostname.

use std::path::PathBuf;

use crishim_proto::cri;
use oci_spec::runtime::{LinuxNamespace, LinuxNamespaceType};

use super::PodNamespaces;

/// In containerd's order (pid, ipc, uts, mount, network, then cgroup). A namespace with a path
/// is joined, one without is new, and a missing one is the host's.
pub(super) fn build(pod: &PodNamespaces, own_cgroup_ns: bool) -> Vec<LinuxNamespace> {
    let pid = if pod.host_pid {
        None
    } else {
        // The pod's (or a target container's) pid namespace, else the container's own.
        Some(pod.pid.clone())
    };
    let entries = [
        // First: the others belong to it.
        (LinuxNamespaceType::User, pod.user.clone().map(Some)),
        (LinuxNamespaceType::Pid, pid),
        (LinuxNamespaceType::Ipc, pod.ipc.clone().map(Some)),
        (LinuxNamespaceType::Uts, pod.uts.clone().map(Some)),
        (LinuxNamespaceType::Mount, Some(None)),
        (LinuxNamespaceType::Network, pod.net.clone().map(Some)),
        // containerd gives a cgroup namespace on cgroup v2 only (and never to privileged
        // containers), so that /sys/fs/cgroup shows the container's own subtree.
        (LinuxNamespaceType::Cgroup, own_cgroup_ns.then_some(None)),
    ];
    entries
        .into_iter()
        .filter_map(
            |(typ, path): (LinuxNamespaceType, Option<Option<PathBuf>>)| {
                let path = path?;
                let mut ns = LinuxNamespace::default();
                ns.set_typ(typ).set_path(path);
                Some(ns)
            },
        )
        .collect()
}

/// The pod's hostname, set only when the container is in the pod's uts namespace: a
/// host-network pod shares the node's, whose name must not be changed.
pub(super) fn hostname(pod: &PodNamespaces, sandbox: &cri::PodSandboxConfig) -> Option<String> {
    (pod.uts.is_some() && !sandbox.hostname.is_empty()).then(|| sandbox.hostname.clone())
}
