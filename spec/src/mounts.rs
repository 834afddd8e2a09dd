//! Mounts: containerd's default filesystems, the pod's files (/etc/hostname, /etc/hosts,
//! /etc/resolv.conf, /dev/shm) and the CRI volume mounts, as containerd's `WithMounts`.

use std::path::{Path, PathBuf};

use crishim_proto::cri;
pub(crate) use crishim_sys::path::clean;
use oci_spec::runtime::Mount;

use super::{ImageVolume, PodFiles, SpecError};

pub(super) struct Mounts {
    pub mounts: Vec<Mount>,
    /// `linux.rootfsPropagation`: a shared or slave volume only propagates if the rootfs mount
    /// it sits on does too.
    pub rootfs_propagation: Option<String>,
}

/// A bind mount asked for by the CRI caller or the pod.
struct Bind {
    container_path: String,
    host_path: PathBuf,
    readonly: bool,
    recursive_readonly: bool,
    propagation: i32,
    /// Options that only take away: `nosuid`, `nodev`, `noexec` (an image volume's, or the
    /// CRI mount's `mount_options`).
    hardening: Vec<&'static str>,
}

/// The `Mount.mount_options` a caller may add: each only takes something away from the mount.
/// `ro` makes it read-only, as `readonly` does.
const MOUNT_OPTIONS: [&str; 4] = ["nosuid", "nodev", "noexec", "ro"];

/// More options than [`MOUNT_OPTIONS`] holds can only repeat one.
const MAX_MOUNT_OPTIONS: usize = 16;

/// `m.mount_options`, checked: `(hardening options, read-only)`. Anything else (an unknown
/// option, or one that would weaken the mount, such as `exec`, `suid`, `dev` or `rw`) is
/// refused rather than dropped.
fn mount_options(m: &cri::Mount) -> Result<(Vec<&'static str>, bool), SpecError> {
    if m.mount_options.len() > MAX_MOUNT_OPTIONS {
        return Err(SpecError::Invalid(format!(
            "mount at {}: {} mount options, over the limit of {MAX_MOUNT_OPTIONS}",
            m.container_path,
            m.mount_options.len()
        )));
    }
    let mut hardening = Vec::new();
    let mut readonly = false;
    for o in &m.mount_options {
        match MOUNT_OPTIONS.iter().find(|known| **known == o.as_str()) {
            Some(&"ro") => readonly = true,
            Some(known) if !hardening.contains(known) => hardening.push(*known),
            Some(_) => {}
            None => {
                return Err(SpecError::Invalid(format!(
                    "mount at {}: mount option {:?} is not allowed; only {} can be added",
                    m.container_path,
                    crishim_sys::shown::shown(o),
                    MOUNT_OPTIONS.join(", ")
                )))
            }
        }
    }
    Ok((hardening, readonly))
}

pub(super) fn build(
    config: &cri::ContainerConfig,
    files: &PodFiles,
    image_volumes: &[ImageVolume],
    privileged: bool,
) -> Result<Mounts, SpecError> {
    let readonly_rootfs = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .is_some_and(|sc| sc.readonly_rootfs);

    // The NVIDIA device plugin's device-list mounts request GPUs (`gpu::request`); they are
    // not mounted themselves.
    let mut binds = Vec::new();
    for m in &config.mounts {
        let device_list =
            crishim_gpu::request::device_list_request(m).map_err(SpecError::Invalid)?;
        if device_list.is_none() {
            binds.push(cri_bind(m, image_volumes)?);
        }
    }
    let requested = |path: &str| binds.iter().any(|b| clean(&b.container_path) == path);
    // The pod's files, unless the container mounts something there itself. Like the rootfs,
    // they are read-only for a read-only-rootfs container; /dev/shm stays writable.
    let pod_files = [
        ("/etc/hostname", &files.hostname, readonly_rootfs),
        ("/etc/hosts", &files.hosts, readonly_rootfs),
        ("/etc/resolv.conf", &files.resolv_conf, readonly_rootfs),
        ("/dev/shm", &files.shm, false),
    ];
    let mut pod_binds = Vec::new();
    for (container_path, host_path, readonly) in pod_files {
        let Some(host_path) = host_path else { continue };
        if requested(container_path) {
            continue;
        }
        let host_path = std::fs::canonicalize(host_path).map_err(|e| {
            SpecError::internal(
                format!("pod file {} for {container_path}", host_path.display()),
                e,
            )
        })?;
        pod_binds.push(Bind {
            container_path: container_path.to_string(),
            host_path,
            readonly,
            recursive_readonly: false,
            propagation: cri::MountPropagation::PropagationPrivate as i32,
            hardening: Vec::new(),
        });
    }
    binds.extend(pod_binds);
    // Parents before children, so a volume at /a does not hide one at /a/b. Stable, so equal
    // depths keep the CRI order.
    binds.sort_by_key(|b| depth(&b.container_path));

    let mut mounts = default_mounts(privileged, &binds);
    let mut rootfs_propagation: Option<String> = None;
    for bind in &binds {
        let (mount, propagation) = bind_mount(bind)?;
        mounts.push(mount);
        // containerd writes "rshared"/"rslave" here; libcontainer accepts only the plain words
        // (and applies them recursively itself), so the rootfs gets those.
        match propagation {
            "rshared" => rootfs_propagation = Some("shared".to_string()),
            "rslave" if rootfs_propagation.is_none() => {
                rootfs_propagation = Some("slave".to_string())
            }
            _ => {}
        }
    }
    Ok(Mounts {
        mounts,
        rootfs_propagation,
    })
}

/// Validates a CRI mount: an absolute container path and an existing host path, whose symlinks
/// are resolved here as the CRI asks.
fn cri_bind(m: &cri::Mount, image_volumes: &[ImageVolume]) -> Result<Bind, SpecError> {
    check_container_path("mount", &m.container_path)?;
    if is_image_volume(m) {
        let v = image_volumes
            .iter()
            .find(|v| v.container_path == m.container_path)
            .ok_or_else(|| {
                SpecError::Internal(format!(
                    "image volume at {} was not mounted",
                    m.container_path
                ))
            })?;
        return Ok(Bind {
            container_path: m.container_path.clone(),
            host_path: v.source.clone(),
            readonly: true,
            recursive_readonly: false,
            propagation: cri::MountPropagation::PropagationPrivate as i32,
            hardening: vec!["nosuid", "nodev", "noexec"],
        });
    }
    if m.host_path.is_empty() {
        return Err(SpecError::Invalid(format!(
            "mount at {}: no host path",
            m.container_path
        )));
    }
    if !m.uid_mappings.is_empty() || !m.gid_mappings.is_empty() {
        return Err(SpecError::Invalid(format!(
            "mount at {}: per-mount id mappings are not supported (in a pod with its own user \
             namespace every bind mount is idmapped with the pod's mapping)",
            m.container_path
        )));
    }
    let host_path = std::fs::canonicalize(&m.host_path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            SpecError::Invalid(format!("mount host path {:?} does not exist", m.host_path))
        }
        _ => SpecError::internal(format!("resolving mount host path {:?}", m.host_path), e),
    })?;
    let (hardening, readonly) = mount_options(m)?;
    Ok(Bind {
        container_path: m.container_path.clone(),
        host_path,
        readonly: m.readonly || readonly,
        recursive_readonly: m.recursive_read_only,
        propagation: m.propagation,
        hardening,
    })
}

/// A `Mount` naming an image (KEP-4639) rather than a host path.
pub fn is_image_volume(m: &cri::Mount) -> bool {
    m.image.as_ref().is_some_and(|i| !i.image.is_empty())
}

/// `rbind`, the propagation, then `ro`/`rro`/`rw`. `selinux_relabel` is done by `CreateContainer`, where SELinux is enabled.
/// Returns the propagation option too, for `rootfsPropagation`.
fn bind_mount(bind: &Bind) -> Result<(Mount, &'static str), SpecError> {
    use cri::MountPropagation as P;
    let propagation = match P::try_from(bind.propagation) {
        Ok(P::PropagationBidirectional) => "rshared",
        Ok(P::PropagationHostToContainer) => "rslave",
        Ok(P::PropagationPrivate) | Err(_) => "rprivate",
    };
    let access = match (bind.readonly, bind.recursive_readonly) {
        (true, true) if propagation != "rprivate" => {
            return Err(SpecError::Invalid(format!(
                "mount at {}: a recursive read-only mount needs private propagation",
                bind.container_path
            )))
        }
        (true, true) => "rro",
        (true, false) => "ro",
        (false, true) => {
            return Err(SpecError::Invalid(format!(
                "mount at {}: recursive read-only conflicts with a read-write mount",
                bind.container_path
            )))
        }
        (false, false) => "rw",
    };
    let mut mount = Mount::default();
    mount
        .set_destination(PathBuf::from(&bind.container_path))
        .set_typ(Some("bind".to_string()))
        .set_source(Some(bind.host_path.clone()))
        .set_options(Some({
            let mut options = vec![
                "rbind".to_string(),
                propagation.to_string(),
                access.to_string(),
            ];
            options.extend(bind.hardening.iter().map(|o| o.to_string()));
            options
        }));
    Ok((mount, propagation))
}

/// containerd's defaults (less /run, as the CRI plugin drops it), minus any destination a bind
/// replaces and everything under /dev if /dev itself is bound. sysfs and cgroupfs are read-only
/// unless privileged.
fn default_mounts(privileged: bool, binds: &[Bind]) -> Vec<Mount> {
    let sys_access = if privileged { "rw" } else { "ro" };
    let defaults: [(&str, &str, &str, &[&str]); 7] = [
        ("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]),
        (
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        (
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        ),
        (
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        ),
        (
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        ),
        (
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", sys_access],
        ),
        (
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", sys_access],
        ),
    ];
    let bound = |path: &str| binds.iter().any(|b| clean(&b.container_path) == path);
    defaults
        .into_iter()
        .filter(|(dest, ..)| {
            let under_bound_dev = bound("/dev") && dest.starts_with("/dev/");
            !bound(dest) && !under_bound_dev
        })
        .map(|(dest, typ, source, options)| {
            let mut mount = Mount::default();
            mount
                .set_destination(PathBuf::from(dest))
                .set_typ(Some(typ.to_string()))
                .set_source(Some(PathBuf::from(source)))
                .set_options(Some(options.iter().map(|o| o.to_string()).collect()));
            mount
        })
        .collect()
}

/// Replace the `cgroup` mount at /sys/fs/cgroup by what libcontainer would emulate: a tmpfs,
/// and in it a bind of the container's own cgroup of each v1 hierarchy (`dirs`, with their
/// symlink names), read-only unless the cgroup mount was writable.
///
/// Used for a container that joins its pod's pid namespace on a cgroup v1 node. libcontainer
/// 0.7 finds the cgroup root to strip by reading `/proc/<its pid>` of the *host's* /proc with
/// its pid in the pod's namespace: that is another process, or none, and then the container
/// fails with "failed to prepare rootfs". Binds sidestep that lookup.
pub(super) fn emulate_cgroup_v1(
    mounts: &mut Vec<Mount>,
    dirs: &[(String, Vec<String>)],
    cgroups_path: &str,
) {
    let Some(i) = mounts
        .iter()
        .position(|m| m.typ().as_deref() == Some("cgroup"))
    else {
        return;
    };
    let access = if mounts[i]
        .options()
        .as_ref()
        .is_some_and(|o| o.iter().any(|o| o == "rw"))
    {
        "rw"
    } else {
        "ro"
    };
    let dest = mounts[i].destination().clone();
    let mut tmpfs = Mount::default();
    tmpfs
        .set_destination(dest.clone())
        .set_typ(Some("tmpfs".into()))
        .set_source(Some("tmpfs".into()))
        .set_options(Some(
            ["nosuid", "noexec", "nodev", "mode=755", "size=1m"]
                .map(String::from)
                .to_vec(),
        ));
    let mut replacement = vec![tmpfs];
    let own = clean(cgroups_path);
    for (dir, aliases) in dirs {
        let source = Path::new("/sys/fs/cgroup")
            .join(dir)
            .join(own.trim_start_matches('/'));
        for name in std::iter::once(dir).chain(aliases) {
            let mut bind = Mount::default();
            bind.set_destination(dest.join(name))
                .set_typ(Some("bind".into()))
                .set_source(Some(source.clone()))
                .set_options(Some(
                    ["rbind", "nosuid", "noexec", "nodev", access]
                        .map(String::from)
                        .to_vec(),
                ));
            replacement.push(bind);
        }
    }
    mounts.splice(i..=i, replacement);
}

/// Lexically cleans an absolute path, as Go's `filepath.Clean` (no symlinks involved).
/// A CRI mount's or device's path in the container (`what` says which): absolute, and without a
/// `..` component, which would climb out of where the path says it goes.
pub(super) fn check_container_path(what: &str, path: &str) -> Result<(), SpecError> {
    if !path.starts_with('/') {
        return Err(SpecError::Invalid(format!(
            "{what} container path {path:?} is not absolute"
        )));
    }
    if path.split('/').any(|c| c == "..") {
        return Err(SpecError::Invalid(format!(
            "{what} container path {path:?} has a \"..\" component"
        )));
    }
    Ok(())
}

/// Nesting depth, as containerd's `orderedMounts` counts it.
fn depth(path: &str) -> usize {
    clean(path).matches('/').count()
}

#[cfg(test)]
mod container_path_tests {
    use super::*;

    /// A mount whose container path climbs with `..` is refused before its host path is looked
    /// at, naming the path; a plain absolute one passes.
    #[test]
    fn mount_container_paths_with_dot_dot_are_refused() {
        for bad in ["/data/../../etc", "/..", "/a/.."] {
            let m = cri::Mount {
                container_path: bad.into(),
                host_path: "/tmp".into(),
                ..Default::default()
            };
            let Err(SpecError::Invalid(msg)) = cri_bind(&m, &[]) else {
                panic!("{bad} was accepted");
            };
            assert!(
                msg.contains(&format!("{bad:?}")) && msg.contains(".."),
                "{msg}"
            );
        }
        assert!(check_container_path("mount", "/data/..x/y.").is_ok());
        assert!(check_container_path("mount", "data").is_err());
    }
}
