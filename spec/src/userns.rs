//! User namespaces for pods (`hostUsers: false`, KEP-127): the kubelet's mappings, checked, and
//! the idmapped mounts that let a pod's root own its root filesystem and volumes without being
//! root on the host.
//!
//! A pod with `userns_options.mode = POD` gets one user namespace, made with the infra process
//! and holding all the pod's other namespaces, so the container's root has capabilities over
//! them only. Containers join it. Their root filesystem is an overlay whose image layers are
//! idmapped clones (a layer file owned by 0 is owned by the container's root) and whose upper
//! directory belongs to the mapped host root; their volumes are idmapped too. What crishim
//! injects of the node's (the GPU driver, the interceptor, `crishim-init`) is not: it stays
//! host root's, read-only with the flag locked (see [`stage_binds`]).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crishim_sys::idmap::{attach, idmapped_clone, restricted_clone};
use oci_spec::runtime::Spec;

use crishim_proto::cri;

/// The kernel reads at most 340 lines from `uid_map`.
const MAX_RANGES: usize = 340;

/// One range: container ids `container..container+len` are host ids `host..host+len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub container: u32,
    pub host: u32,
    pub len: u32,
}

/// A pod's uid and gid mappings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdMaps {
    pub uids: Vec<Range>,
    pub gids: Vec<Range>,
}

impl IdMaps {
    /// The `uid_map` and `gid_map` texts.
    pub fn proc_maps(&self) -> (String, String) {
        let text = |r: &[Range]| {
            r.iter()
                .map(|r| format!("{} {} {}\n", r.container, r.host, r.len))
                .collect::<String>()
        };
        (text(&self.uids), text(&self.gids))
    }

    /// The host uid and gid of the container's `uid` and `gid`, where mapped.
    pub fn to_host(&self, uid: u32, gid: u32) -> (Option<u32>, Option<u32>) {
        let map = |r: &[Range], id: u32| {
            r.iter()
                .find(|r| id >= r.container && id - r.container < r.len)
                .map(|r| r.host + (id - r.container))
        };
        (map(&self.uids, uid), map(&self.gids, gid))
    }

    /// The host uid and gid of the container's root (always mapped: [`from_pod`] checks it).
    pub fn host_root(&self) -> (u32, u32) {
        let (uid, gid) = self.to_host(0, 0);
        (uid.unwrap_or(0), gid.unwrap_or(0))
    }
}

fn ranges(what: &str, maps: &[cri::IdMapping]) -> Result<Vec<Range>, String> {
    if maps.is_empty() {
        return Err(format!("userns_options.{what} is empty"));
    }
    if maps.len() > MAX_RANGES {
        return Err(format!(
            "userns_options.{what} has {} ranges; the kernel takes at most {MAX_RANGES}",
            maps.len()
        ));
    }
    let mut out: Vec<Range> = Vec::with_capacity(maps.len());
    for m in maps {
        let r = Range {
            container: m.container_id,
            host: m.host_id,
            len: m.length,
        };
        let end = |start: u32| start.checked_add(r.len).filter(|_| r.len > 0);
        let (Some(container_end), Some(host_end)) = (end(r.container), end(r.host)) else {
            return Err(format!(
                "userns_options.{what}: range {}+{} of host {} is empty or overflows",
                r.container, r.len, r.host
            ));
        };
        if r.host == 0 {
            return Err(format!(
                "userns_options.{what} maps host id 0: the pod's root would be the host's"
            ));
        }
        if out.iter().any(|o| {
            r.container < o.container + o.len && o.container < container_end
                || r.host < o.host + o.len && o.host < host_end
        }) {
            return Err(format!("userns_options.{what}: ranges overlap"));
        }
        out.push(r);
    }
    if !out.iter().any(|r| r.container == 0) {
        return Err(format!(
            "userns_options.{what} must map the container's id 0 (its root)"
        ));
    }
    Ok(out)
}

/// The pod's user namespace mappings: `None` for the node's user namespace (mode `NODE`, or no
/// options, as before). Mode `POD` needs mappings that leave host root out; `CONTAINER` and
/// `TARGET` are refused, as are host namespaces alongside a user namespace.
pub fn from_pod(config: &cri::PodSandboxConfig) -> Result<Option<IdMaps>, String> {
    let Some(ns) = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
    else {
        return Ok(None);
    };
    let Some(opts) = ns.userns_options.as_ref() else {
        return Ok(None);
    };
    match cri::NamespaceMode::try_from(opts.mode) {
        Ok(cri::NamespaceMode::Node) => return Ok(None),
        Ok(cri::NamespaceMode::Pod) => {}
        Ok(other) => {
            return Err(format!(
                "userns_options.mode {} is not supported: a pod has its own user namespace (POD) \
                 or the node's (NODE)",
                other.as_str_name()
            ))
        }
        Err(_) => return Err(format!("userns_options.mode {} is unknown", opts.mode)),
    }
    let node = cri::NamespaceMode::Node as i32;
    for (what, mode) in [("network", ns.network), ("pid", ns.pid), ("ipc", ns.ipc)] {
        if mode == node {
            return Err(format!(
                "a pod with its own user namespace cannot use the node's {what} namespace"
            ));
        }
    }
    Ok(Some(IdMaps {
        uids: ranges("uids", &opts.uids)?,
        gids: ranges("gids", &opts.gids)?,
    }))
}

/// A user namespace to idmap mounts with: the one of a running process.
pub fn open(pid: u32) -> io::Result<File> {
    File::open(format!("/proc/{pid}/ns/user"))
}

/// Let the pod's root (host gid `gid`) reach `bundle`, where its root filesystem is mounted
/// and its binds are staged: the state directories above it get search permission for others
/// (0711, as containerd's have; nothing there can be listed), and the bundle search permission
/// for `gid` alone (root:`gid`, 0710). Its files keep their own modes (config.json is 0600).
pub fn open_path(ancestors: &[&Path], bundle: &Path, gid: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for dir in ancestors {
        let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
        if mode & 0o001 == 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o011))?;
        }
    }
    private_to_group(bundle, gid)
}

/// root:`gid`, 0710.
fn private_to_group(dir: &Path, gid: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::os::unix::fs::chown(dir, Some(0), Some(gid))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710))
}

/// Whether idmapped mounts work on the filesystem holding `dir`: tried once, with a throwaway
/// user namespace (a `sleep` that unshared one, mapped by us).
pub fn idmap_supported(dir: &Path) -> bool {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("10")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: unshare is async-signal-safe; the child does nothing else before exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let Ok(mut child) = cmd.spawn() else {
        return false;
    };
    let pid = child.id();
    let works = ["uid_map", "gid_map"]
        .iter()
        .all(|f| std::fs::write(format!("/proc/{pid}/{f}"), "0 65534 1\n").is_ok())
        && open(pid).is_ok_and(|ns| idmapped_clone(dir, &ns).is_ok());
    let _ = child.kill();
    let _ = child.wait();
    works
}

/// Mounts staged for a container's create under a directory (idmapped binds, or the devices'
/// tmpfs); detached again on drop.
#[must_use]
pub struct Staged {
    dir: PathBuf,
    release: fn(&Path),
}

impl Drop for Staged {
    fn drop(&mut self) {
        (self.release)(&self.dir);
    }
}

fn is_bind(m: &oci_spec::runtime::Mount) -> bool {
    m.typ().as_deref() == Some("bind")
        || m.options()
            .as_ref()
            .is_some_and(|o| o.iter().any(|o| o == "bind" || o == "rbind"))
}

/// The bind mounts that are the pod's own, by destination and source: the CRI volumes and what
/// the spec builder adds for the pod (its `/etc/hosts`, `resolv.conf`, `hostname`, `/dev/shm`,
/// image volumes). Taken before crishim injects anything of the node's (`crishim-init`, the GPU
/// driver, the interceptor, CDI's mounts), so a mount injected at a volume's destination, which
/// replaces it, is not taken for it.
#[derive(Debug, Default)]
pub struct PodBinds(Vec<(PathBuf, PathBuf)>);

impl PodBinds {
    pub fn of(spec: &Spec) -> PodBinds {
        PodBinds(
            spec.mounts()
                .iter()
                .flatten()
                .filter(|m| is_bind(m))
                .filter_map(|m| Some((m.destination().clone(), m.source().clone()?)))
                .collect(),
        )
    }

    fn contains(&self, m: &oci_spec::runtime::Mount) -> bool {
        m.source().as_ref().is_some_and(|s| {
            self.0
                .iter()
                .any(|(d, src)| d == m.destination() && src == s)
        })
    }
}

/// The `mount_setattr` flags a bind's options ask for (`ro`, `nosuid`, `nodev`, `noexec`): set
/// on a node's mount before the container's namespace copies it, they are locked there, and
/// libcontainer's own remount asks for them again.
fn restricting_attrs(m: &oci_spec::runtime::Mount) -> u64 {
    use crishim_sys::idmap::{
        MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
    };
    let mut attrs = 0;
    for o in m.options().iter().flatten() {
        attrs = match o.as_str() {
            "ro" => attrs | MOUNT_ATTR_RDONLY,
            "rw" => attrs & !MOUNT_ATTR_RDONLY,
            "nosuid" => attrs | MOUNT_ATTR_NOSUID,
            "nodev" => attrs | MOUNT_ATTR_NODEV,
            "noexec" => attrs | MOUNT_ATTR_NOEXEC,
            _ => attrs,
        };
    }
    attrs
}

/// Stage every bind mount of `spec` under `dir` (reachable by the pod's root, host gid `gid`,
/// only), and point the mount at it:
/// - the pod's own (`own`: its volumes, pod files, `/dev/shm`) as idmapped clones, so the pod's
///   root owns what host root owns there;
/// - everything crishim injects of the node's (the GPU driver mirror, whose files are the node's
///   driver files, hardlinked; the interceptor; `crishim-init`; CDI's and the toolkit's mounts)
///   as plain clones that keep host root as the owner (nobody inside, as containerd gives) with
///   their `ro`, `nosuid`, `nodev` and `noexec` set here, by host root: the container's mount
///   namespace, owned by the pod's user namespace, gets them locked, so its root cannot remount
///   them writable even with `CAP_SYS_ADMIN`.
///
/// The container's cgroup binds are left as they are: cgroupfs cannot be idmapped, and they are
/// read-only. A source on a filesystem that cannot be idmapped is an error naming it.
pub fn stage_binds(
    spec: &mut Spec,
    dir: &Path,
    userns: &File,
    gid: u32,
    own: &PodBinds,
) -> Result<Staged, String> {
    crishim_sys::hostfs::create_private_dir(dir)
        .and_then(|()| private_to_group(dir, gid))
        .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let staged = Staged {
        dir: dir.to_path_buf(),
        release: release_staged,
    };
    let Some(mounts) = spec.mounts_mut() else {
        return Ok(staged);
    };
    for (i, m) in mounts.iter_mut().enumerate() {
        let Some(source) = m.source().clone() else {
            continue;
        };
        if !is_bind(m) || source.starts_with("/sys/fs/cgroup") {
            continue;
        }
        let meta = std::fs::metadata(&source)
            .map_err(|e| format!("mount source {}: {e}", source.display()))?;
        // Device nodes (see `stage_devices`) keep their own owners: no filesystem of devices
        // can be idmapped.
        {
            use std::os::unix::fs::FileTypeExt as _;
            if meta.file_type().is_char_device() || meta.file_type().is_block_device() {
                continue;
            }
        }
        let target = dir.join(i.to_string());
        let made = if meta.is_dir() {
            std::fs::create_dir(&target)
        } else {
            File::create(&target).map(drop)
        };
        made.map_err(|e| format!("creating {}: {e}", target.display()))?;
        let tree = if own.contains(m) {
            idmapped_clone(&source, userns).map_err(|e| {
                format!(
                    "idmapping {} for the pod's user namespace: {e} (its filesystem may not \
                     support idmapped mounts)",
                    source.display()
                )
            })?
        } else {
            restricted_clone(&source, restricting_attrs(m))
                .map_err(|e| format!("cloning {}: {e}", source.display()))?
        };
        attach(&tree, &target).map_err(|e| format!("attaching {}: {e}", target.display()))?;
        m.set_source(Some(target));
    }
    Ok(staged)
}

/// No device node can be made in a user namespace, and libcontainer would bind each device
/// from the host path that is its path in the container, which may hold another node or none.
/// So each of `spec`'s devices is made here (by the host's root) on a tmpfs at `dir` (without
/// `nodev`, unlike `/run`), owned by its owner's host ids under `maps`, and bound at its path;
/// the device cgroup rules stay as they are.
pub fn stage_devices(spec: &mut Spec, dir: &Path, maps: &IdMaps) -> Result<Staged, String> {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    let devices = spec
        .linux()
        .as_ref()
        .and_then(|l| l.devices().clone())
        .unwrap_or_default();
    crishim_sys::hostfs::create_private_dir(dir)
        .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NOEXEC,
        Some("mode=755,size=64k"),
    )
    .map_err(|e| format!("mounting a tmpfs for devices at {}: {e}", dir.display()))?;
    let staged = Staged {
        dir: dir.to_path_buf(),
        release: release_staged_devices,
    };
    let mut binds = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        let node = dir.join(i.to_string());
        let kind = match d.typ() {
            oci_spec::runtime::LinuxDeviceType::B => SFlag::S_IFBLK,
            oci_spec::runtime::LinuxDeviceType::C | oci_spec::runtime::LinuxDeviceType::U => {
                SFlag::S_IFCHR
            }
            other => {
                return Err(format!(
                    "device {}: type {other:?} cannot be bound",
                    d.path().display()
                ))
            }
        };
        let mode = Mode::from_bits_truncate(d.file_mode().unwrap_or(0o666) & 0o777);
        mknod(
            &node,
            kind,
            mode,
            makedev(d.major() as u64, d.minor() as u64),
        )
        .map_err(|e| format!("making device {}: {e}", d.path().display()))?;
        let (uid, gid) = (d.uid().unwrap_or(0), d.gid().unwrap_or(0));
        let (Some(host_uid), Some(host_gid)) = maps.to_host(uid, gid) else {
            return Err(format!(
                "device {}: owner {uid}:{gid} is not mapped in the pod's user namespace",
                d.path().display()
            ));
        };
        std::os::unix::fs::chown(&node, Some(host_uid), Some(host_gid))
            .map_err(|e| format!("owning device {}: {e}", d.path().display()))?;
        let mut m = oci_spec::runtime::Mount::default();
        m.set_destination(d.path().clone())
            .set_typ(Some("bind".into()))
            .set_source(Some(node))
            .set_options(Some(vec!["bind".into(), "nosuid".into(), "noexec".into()]));
        binds.push(m);
    }
    if let Some(linux) = spec.linux_mut() {
        linux.set_devices(None);
    }
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    mounts.extend(binds);
    spec.set_mounts(Some(mounts));
    Ok(staged)
}

/// Detach the devices' tmpfs at `dir` and remove it. Idempotent.
pub fn release_staged_devices(dir: &Path) {
    let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir_all(dir);
}

/// Detach whatever is staged under `dir` and remove it. Idempotent.
pub fn release_staged(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let _ = nix::mount::umount2(&e.path(), nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(mode: cri::NamespaceMode, uids: &[(u32, u32, u32)], net: i32) -> cri::PodSandboxConfig {
        let m = |v: &[(u32, u32, u32)]| {
            v.iter()
                .map(|&(container_id, host_id, length)| cri::IdMapping {
                    container_id,
                    host_id,
                    length,
                })
                .collect::<Vec<_>>()
        };
        cri::PodSandboxConfig {
            linux: Some(cri::LinuxPodSandboxConfig {
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: net,
                        userns_options: Some(cri::UserNamespace {
                            mode: mode as i32,
                            uids: m(uids),
                            gids: m(uids),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn bind(destination: &str, source: &str, options: &[&str]) -> oci_spec::runtime::Mount {
        let mut m = oci_spec::runtime::Mount::default();
        m.set_destination(destination.into())
            .set_typ(Some("bind".into()))
            .set_source(Some(source.into()))
            .set_options(Some(options.iter().map(|o| o.to_string()).collect()));
        m
    }

    #[test]
    fn only_the_pods_own_binds_are_idmapped_and_the_nodes_keep_their_flags() {
        let mut spec = Spec::default();
        spec.set_mounts(Some(vec![
            bind(
                "/data",
                "/var/lib/kubelet/pods/p/volumes/v",
                &["rbind", "rw"],
            ),
            bind("/usr/local/nvidia/lib64", "/srv/volume", &["rbind", "rw"]),
        ]));
        let own = PodBinds::of(&spec);
        assert!(own.contains(&bind("/data", "/var/lib/kubelet/pods/p/volumes/v", &[])));
        // The GPU driver injected over a volume's destination is not the volume.
        let mirror = bind(
            "/usr/local/nvidia/lib64",
            "/var/lib/crishim/gpu/vdriver/views/g/c/origin/lib64",
            &["rbind", "ro", "nosuid", "nodev"],
        );
        assert!(!own.contains(&mirror));
        use crishim_sys::idmap::{
            MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
        };
        assert_eq!(
            restricting_attrs(&mirror),
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
        );
        assert_eq!(
            restricting_attrs(&bind("/x", "/y", &["ro", "rw", "noexec"])),
            MOUNT_ATTR_NOEXEC
        );
    }

    #[test]
    fn the_kubelets_mapping_is_taken_and_bad_ones_are_refused_by_reason() {
        let ok = from_pod(&pod(cri::NamespaceMode::Pod, &[(0, 65536, 65536)], 0))
            .unwrap()
            .unwrap();
        assert_eq!(ok.host_root(), (65536, 65536));
        assert_eq!(ok.to_host(1000, 65535), (Some(66536), Some(131071)));
        assert_eq!(ok.to_host(65536, 0), (None, Some(65536)), "past the range");
        assert_eq!(ok.proc_maps().0, "0 65536 65536\n");
        assert_eq!(
            from_pod(&pod(cri::NamespaceMode::Node, &[], 0)).unwrap(),
            None
        );
        for (p, needle) in [
            (
                pod(cri::NamespaceMode::Target, &[(0, 65536, 1)], 0),
                "TARGET",
            ),
            (
                pod(cri::NamespaceMode::Container, &[(0, 65536, 1)], 0),
                "CONTAINER",
            ),
            (pod(cri::NamespaceMode::Pod, &[], 0), "empty"),
            (
                pod(cri::NamespaceMode::Pod, &[(0, 0, 65536)], 0),
                "host id 0",
            ),
            (pod(cri::NamespaceMode::Pod, &[(1, 65536, 10)], 0), "id 0"),
            (
                pod(cri::NamespaceMode::Pod, &[(0, u32::MAX, 2)], 0),
                "overflows",
            ),
            (pod(cri::NamespaceMode::Pod, &[(0, 65536, 0)], 0), "empty"),
            (
                pod(
                    cri::NamespaceMode::Pod,
                    &[(0, 65536, 100), (50, 200000, 10)],
                    0,
                ),
                "overlap",
            ),
            (
                pod(
                    cri::NamespaceMode::Pod,
                    &[(0, 65536, 65536)],
                    cri::NamespaceMode::Node as i32,
                ),
                "network",
            ),
        ] {
            let e = from_pod(&p).unwrap_err();
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }
}
