//! `RunPodSandbox`: reserve the name, write the pod's files (hostname, resolv.conf, hosts), mount its
//! /dev/shm, start its shim and infra process, record it. Any failure undoes what was done.

use std::path::Path;

use super::errors::Error;
use crishim_proto::cri::{self, NamespaceMode, RunPodSandboxRequest, RunPodSandboxResponse};
use crishim_proto::shim::InfraSpec;
use crishim_state::records::{now_nanos, pod_name, PodRecord, PodState};
use tracing::{info, warn};

use super::errors::new_id;
use super::lsm::{check_selinux, selinux_labels, Lsm};
use super::runtime_service::{Inner, RuntimeService};
use crishim_spec::cgroups::CgroupDriver;
use crishim_sys::shown::shown;

pub(super) const DEFAULT_CGROUP_PARENT: &str = "/crishim";

impl RuntimeService {
    pub(super) async fn do_run_pod_sandbox(
        &self,
        req: RunPodSandboxRequest,
    ) -> Result<RunPodSandboxResponse, Error> {
        let inner = &self.inner;
        let config = req
            .config
            .ok_or_else(|| Error::invalid_argument("RunPodSandbox: config is required"))?;
        let meta = config
            .metadata
            .clone()
            .ok_or_else(|| Error::invalid_argument("RunPodSandbox: metadata is required"))?;
        if meta.name.is_empty() || meta.namespace.is_empty() || meta.uid.is_empty() {
            return Err(Error::invalid_argument(
                "RunPodSandbox: metadata needs name, namespace and uid",
            ));
        }
        if !config.log_directory.is_empty() && !Path::new(&config.log_directory).is_absolute() {
            return Err(Error::invalid_argument(format!(
                "RunPodSandbox: log_directory {:?} must be an absolute path",
                config.log_directory
            )));
        }
        check_hostname(&config.hostname)?;
        crate::bounds::check_metadata("RunPodSandbox", &config.labels, &config.annotations)?;
        check_host_network_hostname(&config)?;
        inner.handler("RunPodSandbox", &req.runtime_handler)?;
        let pod_selinux = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|sc| sc.selinux_options.as_ref());
        check_selinux("RunPodSandbox", pod_selinux, Lsm::of_host())?;
        check_sysctls(&config)?;
        let userns = crishim_spec::userns::from_pod(&config)
            .map_err(|m| Error::invalid_argument(format!("RunPodSandbox: {m}")))?;
        let id = new_id()?;
        let name = pod_name(&meta);
        inner.store.reserve_pod_name(&name, &id)?;
        let _guard = inner.store.lock(&id).await;
        let mut nri_saw = false;
        let created = match inner
            .create_pod(&id, config, userns, req.runtime_handler)
            .await
        {
            // Plugins hear of the pod once it is ready; one that fails it undoes it.
            Ok(()) => match inner.store.pod(&id) {
                Ok(pod) => {
                    nri_saw = true;
                    inner.nri_run_pod(&pod).await
                }
                Err(e) => Err(e.into()),
            },
            Err(e) => Err(e),
        };
        match created {
            Ok(()) => {
                inner.emit_pod(&id, cri::ContainerEventType::ContainerCreatedEvent);
                inner.emit_pod(&id, cri::ContainerEventType::ContainerStartedEvent);
                info!(pod = %id, name = %name, "pod sandbox ready");
                Ok(RunPodSandboxResponse { pod_sandbox_id: id })
            }
            Err(e) => {
                if let (true, Ok(pod)) = (nri_saw, inner.store.pod(&id)) {
                    inner.nri_stop_pod(&pod).await;
                    inner.nri_remove_pod(&pod).await;
                }
                inner.teardown_pod(&id).await;
                if let Ok(pod) = inner.store.pod(&id) {
                    if let Err(net) = inner.teardown_network(&pod).await {
                        warn!(pod = %id, error = %net, "undoing the pod network");
                    }
                }
                if let Ok(pod) = inner.store.pod(&id) {
                    let _ = inner.store.delete_pod(&pod);
                }
                inner.drop_spare_netns_if_idle();
                // After the teardown unmounted its /dev/shm, what RemovePodSandbox would remove:
                // each failed start (the kubelet retries) would leave a shim directory otherwise.
                for dir in inner.pod_dirs(&id) {
                    let _ = inner.pod_files.remove_dir(&dir);
                }
                inner.store.release_name(&name, &id);
                Err(e)
            }
        }
    }
}

/// Which namespace a sysctl belongs to, as the kernel scopes them (None: not namespaced, so it
/// would change the whole node).
fn sysctl_namespace(key: &str) -> Option<&'static str> {
    let k = key.replace('/', ".");
    if k.starts_with("net.") {
        Some("network")
    } else if k.starts_with("kernel.shm")
        || k.starts_with("kernel.msg")
        || k == "kernel.sem"
        || k.starts_with("fs.mqueue.")
    {
        Some("IPC")
    } else if k == "kernel.hostname" || k == "kernel.domainname" {
        Some("UTS")
    } else {
        None
    }
}

/// The hostname goes to `sethostname` (64 bytes at most) and into the pod's `/etc/hostname` and
/// `/etc/hosts`, where a newline would add entries: a DNS name, as Kubernetes validates it.
fn check_hostname(hostname: &str) -> Result<(), Error> {
    let ok = hostname.len() <= 64
        && hostname
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if ok {
        return Ok(());
    }
    let shown: String = hostname.chars().take(80).collect();
    Err(Error::invalid_argument(format!(
        "RunPodSandbox: hostname {shown:?} must be at most 64 characters of [A-Za-z0-9._-]"
    )))
}

impl Inner {
    /// A runtime handler this node has (`rpc` names the request in the refusal). A pod that asks
    /// for one the node lacks (a sandboxed one, say) is refused rather than run without the
    /// isolation it asked for.
    pub(super) fn handler(
        &self,
        rpc: &str,
        name: &str,
    ) -> Result<&crate::runtimes::RuntimeHandlerConfig, Error> {
        known_handler(&self.handlers, rpc, name)
    }
}

/// The handler `name` of `handlers`, or the refusal naming those there are.
pub(super) fn known_handler<'a>(
    handlers: &'a crate::runtimes::Handlers,
    rpc: &str,
    name: &str,
) -> Result<&'a crate::runtimes::RuntimeHandlerConfig, Error> {
    handlers.get(name).ok_or_else(|| {
        Error::invalid_argument(format!(
            "{rpc}: runtime handler {:?} is not configured on this node; its handlers are {}",
            shown(name),
            handlers.names()
        ))
    })
}

/// A pod in the node's network namespace is in its UTS namespace too, so it cannot have a name
/// of its own: refused, as containerd does, rather than a `HOSTNAME=` that differs from
/// `hostname`.
fn check_host_network_hostname(config: &cri::PodSandboxConfig) -> Result<(), Error> {
    let ns = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref());
    if mode(ns, |o| o.network) == NamespaceMode::Node && !config.hostname.is_empty() {
        return Err(Error::invalid_argument(format!(
            "RunPodSandbox: a pod on the host network cannot set hostname {:?}: it shares the \
             node's name; leave hostname empty",
            config.hostname
        )));
    }
    Ok(())
}

/// Longest sysctl name the kubelet accepts, and a value well over any the kernel takes.
const MAX_SYSCTL_KEY: usize = 253;
const MAX_SYSCTL_VALUE: usize = 4096;

/// A sysctl name becomes a path under `/proc/sys`: only `[A-Za-z0-9_-]` components, split by `.`
/// or `/`, none empty (so no `..`, no leading `/`). A value is text without control characters
/// but tabs (`net.ipv4.ip_local_port_range = "1024\t65000"`).
fn check_sysctl_text(key: &str, value: &str) -> Result<(), Error> {
    let shown = |s: &str| s.chars().take(80).collect::<String>();
    let key_ok = key.len() <= MAX_SYSCTL_KEY
        && key.split(['.', '/']).all(|c| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
        });
    if !key_ok {
        return Err(Error::invalid_argument(format!(
            "RunPodSandbox: sysctl name {:?} must be at most {MAX_SYSCTL_KEY} characters of \
             [A-Za-z0-9_-] components split by '.' or '/'",
            shown(key)
        )));
    }
    if value.len() > MAX_SYSCTL_VALUE || value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(Error::invalid_argument(format!(
            "RunPodSandbox: the value of sysctl {key:?} must be at most {MAX_SYSCTL_VALUE} bytes \
             without control characters, got {:?}",
            shown(value)
        )));
    }
    Ok(())
}

/// A pod may set only sysctls of namespaces it owns: never one of the node's.
fn check_sysctls(config: &cri::PodSandboxConfig) -> Result<(), Error> {
    let linux = config.linux.clone().unwrap_or_default();
    let ns = linux
        .security_context
        .as_ref()
        .and_then(|s| s.namespace_options.as_ref());
    let host_net = mode(ns, |o| o.network) == NamespaceMode::Node;
    let host_ipc = mode(ns, |o| o.ipc) == NamespaceMode::Node;
    for (key, value) in &linux.sysctls {
        check_sysctl_text(key, value)?;
        let refuse = match sysctl_namespace(key) {
            None => Some("it is not namespaced and would change the node"),
            Some("network") | Some("UTS") if host_net => {
                Some("the pod shares the node's network and UTS namespaces")
            }
            Some("IPC") if host_ipc => Some("the pod shares the node's IPC namespace"),
            Some(_) => None,
        };
        if let Some(why) = refuse {
            return Err(Error::invalid_argument(format!(
                "RunPodSandbox: sysctl {key:?} is refused: {why}"
            )));
        }
    }
    Ok(())
}

fn mode(
    opts: Option<&cri::NamespaceOption>,
    f: impl Fn(&cri::NamespaceOption) -> i32,
) -> NamespaceMode {
    opts.map(f)
        .and_then(|m| NamespaceMode::try_from(m).ok())
        .unwrap_or(NamespaceMode::Pod)
}

impl Inner {
    /// Make the pod `config` describes, with `userns` its checked user namespace mappings.
    async fn create_pod(
        &self,
        id: &str,
        config: cri::PodSandboxConfig,
        userns: Option<crishim_spec::userns::IdMaps>,
        runtime_handler: String,
    ) -> Result<(), Error> {
        let linux = config.linux.clone().unwrap_or_default();
        let ns = linux
            .security_context
            .as_ref()
            .and_then(|s| s.namespace_options.as_ref());
        let host_network = mode(ns, |o| o.network) == NamespaceMode::Node;
        let host_pid = mode(ns, |o| o.pid) == NamespaceMode::Node;
        let host_ipc = mode(ns, |o| o.ipc) == NamespaceMode::Node;
        let files = self.pod_files_dir(id);
        let state = self.pod_state_dir(id);
        let cgroup_driver = self.config.cgroup_driver;
        let cgroup_parent = cgroup_driver
            .pod_parent(&linux.cgroup_parent, id, DEFAULT_CGROUP_PARENT)
            .map_err(|m| Error::invalid_argument(format!("RunPodSandbox: {m}")))?;
        let mut record = PodRecord {
            id: id.to_string(),
            runtime_handler,
            state: PodState::Creating,
            created_at: now_nanos(),
            infra_pid: 0,
            host_network,
            host_pid,
            host_ipc,
            shared_pid: mode(ns, |o| o.pid) == NamespaceMode::Pod,
            shm: Some(if host_ipc {
                "/dev/shm".into()
            } else {
                state.join("shm")
            }),
            // systemd makes the slices a pod names, and the kubelet removes them.
            owned_cgroups: match cgroup_driver {
                CgroupDriver::Cgroupfs => crishim_spec::cgroups::missing_prefixes(&cgroup_parent),
                CgroupDriver::Systemd => Vec::new(),
            },
            cgroup_driver,
            ips: Vec::new(),
            cgroup_parent,
            config,
        };
        let mut phases = super::sandbox_stop::Phases::new("RunPodSandbox", id);
        // Recorded before anything else happens, so a crash at any later point leaves a
        // `Creating` record that start-up recovery rolls back.
        self.store.save_pod(&record)?;
        phases.done("record");

        for d in [&files, &state] {
            crishim_sys::hostfs::create_private_dir(d)
                .map_err(|e| Error::internal(format!("creating {}: {e}", d.display())))?;
        }
        phases.done("directories");
        let hostname = if host_network {
            node_hostname()
        } else {
            record.config.hostname.clone()
        };
        // With a CNI network, the daemon makes the pod's network namespace itself, so that the
        // CNI ADD runs while the shim and infra process start (the infra process joins it).
        // A pod with its own user namespace is the exception: its network namespace must
        // belong to that user namespace (or the pod could not mount sysfs), so the infra
        // process makes it, and the CNI ADD runs after, on the namespace pinned from it.
        let cni_config = self.network.config();
        let cni_after_infra = userns.is_some()
            && !host_network
            && !matches!(cni_config, Err(crishim_cni::CniError::NoConfig(_)));
        let netns = match cni_config {
            _ if host_network || userns.is_some() => None,
            Err(crishim_cni::CniError::NoConfig(why)) => {
                warn!(pod = %id, reason = %why, "no CNI network config: the pod gets loopback only");
                None
            }
            // A broken config fails in the CNI ADD, with its reason.
            _ => Some(self.netns_path(id)),
        };
        if let Some(path) = &netns {
            self.network.take_netns(path).map_err(|e| {
                Error::internal(format!(
                    "making the pod's network namespace at {}: {e}",
                    path.display()
                ))
            })?;
            phases.done("network namespace");
        }
        let infra = InfraSpec {
            hostname,
            net: !host_network && netns.is_none(),
            ipc: !host_ipc,
            uts: !host_network,
            pid: !host_pid,
            netns: netns.clone(),
            userns: userns.as_ref().map(|u| {
                let (uid_map, gid_map) = u.proc_maps();
                crishim_proto::shim::InfraUserns { uid_map, gid_map }
            }),
            pod_uid: record
                .config
                .metadata
                .as_ref()
                .map(|m| m.uid.clone())
                .filter(|u| crishim_proto::shim::is_dir_safe_uid(u)),
            // The pod's own label, as its containers get it (the infra asks for nothing more).
            selinux_label: selinux_labels(
                &record,
                &cri::ContainerConfig::default(),
                Lsm::of_host(),
            )
            .map(|l| l.process),
            empty_mnt: self.empty_mnt.get().cloned(),
        };
        let network = async {
            match &netns {
                Some(_) => self.setup_network(&record).await,
                // The node's network, or no CNI config: loopback only.
                None => Ok(Vec::new()),
            }
        };
        // Only the containers need the pod's files and /dev/shm: they are made while the CNI
        // ADD and the shim run.
        let files_and_shm = async {
            let contents = pod_file_contents(
                &infra.hostname,
                record.config.dns_config.as_ref(),
                host_network,
            );
            self.pod_files.write(&files, &contents)?;
            if !host_ipc {
                self.pod_files.mount_shm(&state.join("shm"))?;
            }
            Ok::<(), Error>(())
        };
        // The CNI ADD is the longest: its first plugin is spawned first (a spawn blocks the
        // thread until the child has exec'd), the shim next.
        let (network, shim, files_and_shm) = tokio::join!(
            network,
            self.start_shim(id, &infra, &record.runtime_handler),
            files_and_shm
        );
        phases.done("shim, infra, network and files");
        files_and_shm?;
        record.infra_pid = shim?;
        record.ips = network?;
        if cni_after_infra {
            let path = self.netns_path(id);
            self.network
                .pin_netns(record.infra_pid as u32, &path)
                .map_err(|e| {
                    Error::internal(format!(
                        "pinning the pod's network namespace at {}: {e}",
                        path.display()
                    ))
                })?;
            record.ips = self.setup_network(&record).await?;
            phases.done("network");
        }
        record.state = PodState::Ready;
        self.store.save_pod(&record)?;
        self.watch_pod(id);
        phases.done("record ready");
        Ok(())
    }

    /// Start the pod's shim (which starts the infra process); returns the infra pid.
    async fn start_shim(&self, id: &str, infra: &InfraSpec, handler: &str) -> Result<i32, Error> {
        let dir = self.pod_state_dir(id);
        let oci = self
            .handler("RunPodSandbox", handler)?
            .binary()
            .map(|binary| crishim_proto::shim::OciRuntimeSpec {
                binary: binary.to_path_buf(),
                root: crate::runtimes::state_root(&self.config.state_dir, handler),
                systemd_cgroup: self.config.cgroup_driver == CgroupDriver::Systemd,
            });
        self.pod_shims.start(id, &dir, infra, oci.as_ref()).await
    }
}

pub(super) fn node_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// hostname, resolv.conf and hosts, bind-mounted into every container of the pod: what they
/// hold.
fn pod_file_contents(
    hostname: &str,
    dns: Option<&cri::DnsConfig>,
    host_network: bool,
) -> [(&'static str, String); 3] {
    let resolv = match dns
        .filter(|d| !d.servers.is_empty() || !d.searches.is_empty() || !d.options.is_empty())
    {
        Some(d) => resolv_conf(d),
        None => std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
    };
    let hosts = if host_network {
        std::fs::read_to_string("/etc/hosts").unwrap_or_default()
    } else {
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n".to_string()
    };
    [
        ("hostname", format!("{hostname}\n")),
        ("resolv.conf", resolv),
        ("hosts", hosts),
    ]
}

fn resolv_conf(d: &cri::DnsConfig) -> String {
    let mut s = String::new();
    if !d.searches.is_empty() {
        s.push_str(&format!("search {}\n", d.searches.join(" ")));
    }
    for ns in &d.servers {
        s.push_str(&format!("nameserver {ns}\n"));
    }
    if !d.options.is_empty() {
        s.push_str(&format!("options {}\n", d.options.join(" ")));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_with(
        sysctls: &[(&str, &str)],
        network: NamespaceMode,
        ipc: NamespaceMode,
    ) -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            linux: Some(cri::LinuxPodSandboxConfig {
                sysctls: sysctls
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: network as i32,
                        ipc: ipc as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn hostnames_are_dns_names_that_fit_sethostname() {
        for ok in ["", "web-0", "a.b_c", &"h".repeat(64)] {
            assert!(check_hostname(ok).is_ok(), "{ok:?}");
        }
        for bad in [&"h".repeat(65), "a\n10.0.0.1 evil", "a b", "a/b", "é"] {
            let e = check_hostname(bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
        // A 1 MiB name is refused, and the message does not carry all of it.
        let e = check_hostname(&"h".repeat(1 << 20)).unwrap_err();
        assert!(e.message().len() < 400, "{}", e.message().len());
    }

    #[test]
    fn sysctls_only_in_namespaces_the_pod_owns() {
        use NamespaceMode::{Node, Pod};
        let ok = [
            ("net.ipv4.ip_forward", "1"),
            ("kernel.shmmax", "1"),
            ("fs.mqueue.msg_max", "9"),
        ];
        assert!(check_sysctls(&pod_with(&ok, Pod, Pod)).is_ok());
        let e = check_sysctls(&pod_with(&[("net.core.somaxconn", "1024")], Node, Pod)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(
            e.message().contains("net.core.somaxconn"),
            "{}",
            e.message()
        );
        assert!(check_sysctls(&pod_with(&[("kernel.msgmax", "1")], Pod, Node)).is_err());
        assert!(check_sysctls(&pod_with(&[("vm.swappiness", "1")], Pod, Pod)).is_err());
        assert!(
            check_sysctls(&pod_with(&[("kernel/shmmax", "1")], Pod, Pod)).is_ok(),
            "slash form"
        );
    }

    #[test]
    fn a_host_network_pod_cannot_set_a_hostname() {
        use NamespaceMode::{Node, Pod};
        let mut cfg = pod_with(&[], Node, Pod);
        assert!(check_host_network_hostname(&cfg).is_ok());
        let handlers = crate::runtimes::Handlers::new(&Default::default());
        assert!(known_handler(&handlers, "RunPodSandbox", "").is_ok());
        let e = known_handler(&handlers, "RunPodSandbox", &"kata".repeat(1000)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(
            e.message().len() < 400,
            "the message echoes at most MAX_SHOWN bytes of the handler"
        );
        cfg.hostname = "web-0".into();
        let e = check_host_network_hostname(&cfg).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("web-0"), "{}", e.message());
        let mut own = pod_with(&[], Pod, Pod);
        own.hostname = "web-0".into();
        assert!(check_host_network_hostname(&own).is_ok());
    }

    #[test]
    fn garbage_sysctl_names_and_values_are_refused() {
        use NamespaceMode::Pod;
        let ok = [
            ("net/ipv4/conf/eth0/forwarding", "1"),
            ("net.ipv4.ip_local_port_range", "1024\t65000"),
        ];
        assert!(check_sysctls(&pod_with(&ok, Pod, Pod)).is_ok());
        let long = format!("net.{}", "a".repeat(300));
        let huge = "1".repeat(MAX_SYSCTL_VALUE + 1);
        for (k, v) in [
            ("net/../kernel/core_pattern", "1"),
            ("/net/core/somaxconn", "1"),
            ("net..core", "1"),
            ("net.core.some maxconn", "1"),
            ("net.core.\nsomaxconn", "1"),
            (long.as_str(), "1"),
            ("net.core.somaxconn", "1\n2"),
            ("net.core.somaxconn", huge.as_str()),
        ] {
            let e = check_sysctls(&pod_with(&[(k, v)], Pod, Pod)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{k:?}");
            assert!(e.message().len() < 400, "{}", e.message());
        }
    }

    #[test]
    fn resolv_conf_from_dns_config() {
        let d = cri::DnsConfig {
            servers: vec!["10.0.0.10".into(), "8.8.8.8".into()],
            searches: vec!["ns.svc.cluster.local".into(), "svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        };
        assert_eq!(
            resolv_conf(&d),
            "search ns.svc.cluster.local svc.cluster.local\nnameserver 10.0.0.10\nnameserver 8.8.8.8\noptions ndots:5\n"
        );
    }
}
