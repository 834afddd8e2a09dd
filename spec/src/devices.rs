//! Device nodes (`linux.devices`) and the device cgroup rules (`linux.resources.devices`).

use std::io;
use std::path::{Path, PathBuf};

use crishim_proto::cri;
use nix::sys::stat::{lstat, major, minor, SFlag};
use nix::sys::statfs::{self, FsType};
use oci_spec::runtime::{LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType};

use super::host::HostFacts;
use super::SpecError;

pub(super) struct Devices {
    pub nodes: Vec<LinuxDevice>,
    pub rules: Vec<LinuxDeviceCgroup>,
}

/// Deny everything, allow the standard character devices, then each CRI device with the
/// permissions asked for. A privileged container instead gets every host device and access to
/// all of them.
pub(super) fn build(
    config: &cri::ContainerConfig,
    privileged: bool,
    host: &HostFacts,
) -> Result<Devices, SpecError> {
    let mut nodes = Vec::new();
    let mut rules = vec![rule(false, None, None, None, "rwm")];
    rules.extend(default_allowed());
    for device in &config.devices {
        let permissions = permissions(device)?;
        for node in cri_device(device)? {
            rules.push(rule(
                true,
                Some(node.typ()),
                Some(node.major()),
                Some(node.minor()),
                &permissions,
            ));
            nodes.push(node);
        }
    }
    if privileged {
        rules = vec![rule(true, None, None, None, "rwm")];
        let host_devices = devices_under(&host.dev_root, None).map_err(|e| match e {
            Walked::Io(e) => SpecError::internal(
                format!("listing host devices in {}", host.dev_root.display()),
                e,
            ),
            Walked::TooMany(m) => {
                SpecError::Internal(format!("host devices in {}: {m}", host.dev_root.display()))
            }
        })?;
        for node in host_devices {
            // A CRI device at the same path wins; creating the node twice would fail.
            if !nodes.iter().any(|n| n.path() == node.path()) {
                nodes.push(node);
            }
        }
    }
    Ok(Devices { nodes, rules })
}

/// containerd's `WithDefaultUnixDevices`: null, random, full, tty, zero, urandom, console,
/// the pty slaves (136:*) and ptmx.
fn default_allowed() -> Vec<LinuxDeviceCgroup> {
    [
        (1, Some(3)),
        (1, Some(8)),
        (1, Some(7)),
        (5, Some(0)),
        (1, Some(5)),
        (1, Some(9)),
        (5, Some(1)),
        (136, None),
        (5, Some(2)),
    ]
    .into_iter()
    .map(|(major, minor)| rule(true, Some(LinuxDeviceType::C), Some(major), minor, "rwm"))
    .collect()
}

fn rule(
    allow: bool,
    typ: Option<LinuxDeviceType>,
    major: Option<i64>,
    minor: Option<i64>,
    access: &str,
) -> LinuxDeviceCgroup {
    let mut rule = LinuxDeviceCgroup::default();
    rule.set_allow(allow)
        .set_typ(typ)
        .set_major(major)
        .set_minor(minor)
        .set_access(Some(access.to_string()));
    rule
}

/// Cgroup permissions: some of r, w, m; empty means all, as in Docker.
fn permissions(device: &cri::Device) -> Result<String, SpecError> {
    if device.permissions.is_empty() {
        return Ok("rwm".to_string());
    }
    if !device
        .permissions
        .chars()
        .all(|c| matches!(c, 'r' | 'w' | 'm'))
    {
        return Err(SpecError::Invalid(format!(
            "device {}: invalid permissions {:?} (expected some of \"rwm\")",
            device.host_path, device.permissions
        )));
    }
    Ok(device.permissions.clone())
}

/// The node(s) for one CRI device: the host path (symlinks resolved) is a device, or a
/// directory whose devices are all passed, as containerd's `WithDevices`.
fn cri_device(device: &cri::Device) -> Result<Vec<LinuxDevice>, SpecError> {
    super::mounts::check_container_path("device", &device.container_path)?;
    let host_path = std::fs::canonicalize(&device.host_path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => SpecError::Invalid(format!(
            "device host path {:?} does not exist",
            device.host_path
        )),
        _ => SpecError::internal(
            format!("resolving device host path {:?}", device.host_path),
            e,
        ),
    })?;
    let container_path = PathBuf::from(&device.container_path);
    let failed =
        |e: io::Error| SpecError::internal(format!("reading device {}", host_path.display()), e);
    if host_path.is_dir() {
        return devices_under(&host_path, Some(&container_path)).map_err(|e| match e {
            Walked::Io(e) => failed(e),
            Walked::TooMany(m) => {
                SpecError::Invalid(format!("device host path {:?}: {m}", device.host_path))
            }
        });
    }
    match device_at(&host_path).map_err(failed)? {
        Some(mut node) => {
            node.set_path(container_path);
            Ok(vec![node])
        }
        None => Err(SpecError::Invalid(format!(
            "device host path {:?} is not a device",
            device.host_path
        ))),
    }
}

/// How deep a device directory is walked, and how many entries and devices it may hold: a host
/// path such as `/` is a whole file system, not a device directory.
const MAX_DEPTH: usize = 16;
const MAX_ENTRIES: usize = 65536;
const MAX_DEVICES: usize = 4096;

/// Kernel file systems, never walked for devices (they hold none, and `/proc` and `/sys` are vast).
const PSEUDO_FS: [FsType; 16] = [
    statfs::PROC_SUPER_MAGIC,
    statfs::SYSFS_MAGIC,
    statfs::CGROUP_SUPER_MAGIC,
    statfs::CGROUP2_SUPER_MAGIC,
    statfs::DEBUGFS_MAGIC,
    statfs::TRACEFS_MAGIC,
    statfs::SECURITYFS_MAGIC,
    statfs::SELINUX_MAGIC,
    statfs::SMACK_MAGIC,
    statfs::BPF_FS_MAGIC,
    statfs::DEVPTS_SUPER_MAGIC,
    statfs::HUGETLBFS_MAGIC,
    statfs::NSFS_MAGIC,
    statfs::RDTGROUP_SUPER_MAGIC,
    statfs::USBDEVICE_SUPER_MAGIC,
    statfs::OPENPROM_SUPER_MAGIC,
];

/// Why a walk for devices stopped.
#[derive(Debug)]
enum Walked {
    Io(io::Error),
    /// Over one of the walk's limits; the message says which.
    TooMany(String),
}

impl From<io::Error> for Walked {
    fn from(e: io::Error) -> Self {
        Walked::Io(e)
    }
}

/// Whether `dir` is on a kernel file system ([`PSEUDO_FS`]).
fn is_pseudo_fs(dir: &Path) -> bool {
    statfs::statfs(dir).is_ok_and(|fs| PSEUDO_FS.contains(&fs.filesystem_type()))
}

/// The block and character devices under `dir`, recursively, skipping what containerd's
/// `getDevices` skips (pts, shm, mqueue, the console, FIFOs, symlinks, which are never followed)
/// and kernel file systems (`/proc`, `/sys`, …), at most [`MAX_DEPTH`] levels down, [`MAX_ENTRIES`]
/// entries and [`MAX_DEVICES`] devices. With `container_dir`, their paths are rebased there.
fn devices_under(dir: &Path, container_dir: Option<&Path>) -> Result<Vec<LinuxDevice>, Walked> {
    let mut out = Vec::new();
    let mut entries = 0;
    walk_devices(dir, container_dir, 0, &mut entries, &mut out)?;
    Ok(out)
}

fn walk_devices(
    dir: &Path,
    container_dir: Option<&Path>,
    depth: usize,
    entries: &mut usize,
    out: &mut Vec<LinuxDevice>,
) -> Result<(), Walked> {
    if is_pseudo_fs(dir) {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        *entries += 1;
        if *entries > MAX_ENTRIES {
            return Err(Walked::TooMany(format!(
                "more than {MAX_ENTRIES} entries to look through for devices"
            )));
        }
        let name = entry.file_name();
        let path = entry.path();
        let container_path = container_dir.map(|d| d.join(&name));
        // The entry's own type: a symlink to a directory is a symlink, and is skipped.
        if entry.file_type()?.is_dir() {
            if matches!(
                name.to_str(),
                Some("pts" | "shm" | "fd" | "mqueue" | ".lxc" | ".lxd-mounts" | ".udev")
            ) {
                continue;
            }
            if depth + 1 >= MAX_DEPTH {
                return Err(Walked::TooMany(format!(
                    "{} is more than {MAX_DEPTH} directories deep",
                    path.display()
                )));
            }
            walk_devices(&path, container_path.as_deref(), depth + 1, entries, out)?;
            continue;
        }
        if name == "console" {
            continue;
        }
        let node = match device_at(&path) {
            Ok(Some(node)) if node.typ() != LinuxDeviceType::P => node,
            Ok(_) => continue,
            // Gone between listing and stat.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        if out.len() >= MAX_DEVICES {
            return Err(Walked::TooMany(format!("more than {MAX_DEVICES} devices")));
        }
        out.push(match container_path {
            Some(p) => {
                let mut node = node;
                node.set_path(p);
                node
            }
            None => node,
        });
    }
    Ok(())
}

/// The device at `path` itself (not following a symlink), or `None` if it is not one.
fn device_at(path: &Path) -> io::Result<Option<LinuxDevice>> {
    let st = lstat(path).map_err(io::Error::from)?;
    let typ = match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFBLK => LinuxDeviceType::B,
        SFlag::S_IFCHR => LinuxDeviceType::C,
        SFlag::S_IFIFO => LinuxDeviceType::P,
        _ => return Ok(None),
    };
    let mut node = LinuxDevice::default();
    node.set_path(path.to_path_buf())
        .set_typ(typ)
        .set_major(major(st.st_rdev) as i64)
        .set_minor(minor(st.st_rdev) as i64)
        .set_file_mode(Some(st.st_mode & 0o7777))
        .set_uid(Some(st.st_uid))
        .set_gid(Some(st.st_gid));
    Ok(Some(node))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(host: &str, container: &str) -> cri::Device {
        cri::Device {
            host_path: host.into(),
            container_path: container.into(),
            permissions: "rw".into(),
        }
    }

    fn mknod_null(path: &Path) {
        nix::sys::stat::mknod(
            path,
            SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, 3),
        )
        .unwrap();
    }

    /// A container path that climbs with `..` is refused, naming it.
    #[test]
    fn device_container_paths_with_dot_dot_are_refused() {
        for bad in ["/dev/../etc/passwd", "/dev/x/..", "/.."] {
            let Err(SpecError::Invalid(m)) = cri_device(&device("/dev/null", bad)) else {
                panic!("{bad} was accepted");
            };
            assert!(m.contains(&format!("{bad:?}")) && m.contains(".."), "{m}");
        }
        let Err(SpecError::Invalid(m)) = cri_device(&device("/dev/null", "dev/null")) else {
            panic!("a relative path was accepted");
        };
        assert!(m.contains("not absolute"), "{m}");
        if Path::new("/dev/null").exists() {
            let nodes = cri_device(&device("/dev/null", "/dev/mynull")).unwrap();
            assert_eq!(nodes[0].path(), Path::new("/dev/mynull"));
        }
    }

    /// A host directory is walked without following symlinks, without entering `/proc` or
    /// `/sys`, and only so deep or so wide: beyond that the device is refused, saying why.
    #[test]
    fn device_directories_are_walked_within_bounds() {
        // Host path `/proc` (or anything on a kernel file system) holds no devices.
        assert!(devices_under(Path::new("/proc"), None).unwrap().is_empty());
        if Path::new("/sys/kernel").exists() {
            assert!(devices_under(Path::new("/sys"), None).unwrap().is_empty());
        }
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("devs");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        mknod_null(&d.join("sub/null"));
        // A symlink to a directory full of devices is not followed.
        std::os::unix::fs::symlink("/dev", d.join("hostdev")).unwrap();
        let found = devices_under(&d, Some(Path::new("/dev/x"))).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path(), Path::new("/dev/x/sub/null"));

        // Too deep.
        let mut deep = t.path().join("deep");
        for i in 0..MAX_DEPTH + 1 {
            deep = deep.join(i.to_string());
        }
        std::fs::create_dir_all(&deep).unwrap();
        let host = t.path().join("deep");
        let Err(SpecError::Invalid(m)) = cri_device(&device(host.to_str().unwrap(), "/dev/deep"))
        else {
            panic!("a directory {MAX_DEPTH}+ levels deep was walked");
        };
        assert!(m.contains("directories deep") && m.contains("deep"), "{m}");

        // Too many devices.
        let many = t.path().join("many");
        std::fs::create_dir(&many).unwrap();
        for i in 0..=MAX_DEVICES {
            mknod_null(&many.join(i.to_string()));
        }
        let Err(SpecError::Invalid(m)) = cri_device(&device(many.to_str().unwrap(), "/dev/many"))
        else {
            panic!("more than {MAX_DEVICES} devices were taken");
        };
        assert!(
            m.contains(&format!("more than {MAX_DEVICES} devices")),
            "{m}"
        );
    }
}
