//! Device nodes (`linux.devices`) and the device cgroup rules (`linux.resources.devices`).

use std::io;
use std::path::{Path, PathBuf};

use crishim_proto::cri;
use nix::sys::stat::{lstat, major, minor, SFlag};
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
        let host_devices = devices_under(&host.dev_root, None).map_err(|e| {
            SpecError::internal(
                format!("listing host devices in {}", host.dev_root.display()),
                e,
            )
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
    if !device.container_path.starts_with('/') {
        return Err(SpecError::Invalid(format!(
            "device container path {:?} is not absolute",
            device.container_path
        )));
    }
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
        return devices_under(&host_path, Some(&container_path)).map_err(failed);
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

/// The block and character devices under `dir`, recursively, skipping what containerd's
/// `getDevices` skips (pts, shm, mqueue, the console, FIFOs, symlinks). With `container_dir`,
/// their paths are rebased there.
fn devices_under(dir: &Path, container_dir: Option<&Path>) -> io::Result<Vec<LinuxDevice>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let path = entry.path();
        let container_path = container_dir.map(|d| d.join(&name));
        if entry.file_type()?.is_dir() {
            if matches!(
                name.to_str(),
                Some("pts" | "shm" | "fd" | "mqueue" | ".lxc" | ".lxd-mounts" | ".udev")
            ) {
                continue;
            }
            out.extend(devices_under(&path, container_path.as_deref())?);
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
            Err(e) => return Err(e),
        };
        out.push(match container_path {
            Some(p) => {
                let mut node = node;
                node.set_path(p);
                node
            }
            None => node,
        });
    }
    Ok(out)
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
