//! GPU discovery: the `nvidia<minor>` character devices (major 195) under `device_root`, joined
//! by minor number with the driver's `<proc_root>/driver/nvidia/gpus/<bus id>/information`, and
//! the control nodes a GPU container needs.

use std::io;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use serde::Serialize;
use tracing::warn;

use super::error::GpuError;

/// The character major of NVIDIA's GPU and control nodes.
pub const NVIDIA_MAJOR: u32 = 195;

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gpu {
    /// nvidia-smi's index: the order of PCI bus ids.
    pub index: u32,
    pub minor: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// `0000:01:00.0`.
    pub bus_id: String,
    pub model: String,
    /// The host device node.
    pub path: PathBuf,
    /// Device memory in bytes, when NVML could tell.
    pub memory: Option<u64>,
    /// A MIG device: a slice of the GPU whose node `path` is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig: Option<Mig>,
}

/// Where a MIG device lives on its GPU, and the capability nodes the driver checks before it
/// lets a process use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mig {
    /// The parent GPU's UUID.
    pub parent: String,
    pub gpu_instance: u32,
    pub compute_instance: u32,
    #[serde(skip)]
    pub caps: Vec<Node>,
}

/// A device node to create in containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The host node.
    pub host: PathBuf,
    /// Where it goes in the container: `/dev/<name>`.
    pub container: PathBuf,
    pub major: u32,
    pub minor: u32,
    pub mode: u32,
}

/// What the node has.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
    /// `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset`: those present.
    pub control: Vec<Node>,
}

/// The control nodes, in the order they are created; `nvidiactl` is required by any GPU.
const CONTROL: &[&str] = &[
    "nvidiactl",
    "nvidia-uvm",
    "nvidia-uvm-tools",
    "nvidia-modeset",
];

impl Inventory {
    /// The GPU with this index, UUID (case-insensitive) or minor number.
    pub fn by_index(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.index == index)
    }

    pub fn by_uuid(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid.eq_ignore_ascii_case(uuid))
    }

    pub fn by_minor(&self, minor: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.minor == minor)
    }

    /// The node of one GPU.
    pub fn node(&self, gpu: &Gpu) -> Result<Node, GpuError> {
        node_at(&gpu.path)
            .map_err(|e| GpuError::io(format!("reading GPU node {}", gpu.path.display()), e))?
            .ok_or_else(|| {
                GpuError::Internal(format!("{} is no longer a device", gpu.path.display()))
            })
    }
}

/// Find the GPUs and control nodes.
pub fn discover(device_root: &Path, proc_root: &Path) -> Result<Inventory, GpuError> {
    let info = read_information(proc_root)?;
    let mut gpus = Vec::new();
    let entries = match std::fs::read_dir(device_root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Inventory::default()),
        Err(e) => {
            return Err(GpuError::io(
                format!("listing {}", device_root.display()),
                e,
            ))
        }
    };
    for entry in entries {
        let entry =
            entry.map_err(|e| GpuError::io(format!("listing {}", device_root.display()), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(digits) = name.strip_prefix("nvidia") else {
            continue;
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let path = entry.path();
        let node = match node_at(&path) {
            Ok(Some(n)) if n.major == NVIDIA_MAJOR => n,
            Ok(_) => {
                warn!(path = %path.display(), "not an NVIDIA character device; ignored");
                continue;
            }
            Err(e) => return Err(GpuError::io(format!("reading {}", path.display()), e)),
        };
        let Some(i) = info.iter().find(|i| i.minor == node.minor) else {
            warn!(path = %path.display(), minor = node.minor, "no GPU of the driver has this minor number; ignored");
            continue;
        };
        gpus.push(Gpu {
            index: 0,
            minor: node.minor,
            uuid: i.uuid.clone(),
            bus_id: i.bus_id.clone(),
            model: i.model.clone(),
            path,
            memory: None,
            mig: None,
        });
    }
    for i in &info {
        if !gpus.iter().any(|g| g.minor == i.minor) {
            warn!(uuid = %i.uuid, minor = i.minor, "GPU has no device node (create it with nvidia-modprobe -c {})", i.minor);
        }
    }
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    for (index, g) in gpus.iter_mut().enumerate() {
        g.index = index as u32;
    }
    let mut control = Vec::new();
    for name in CONTROL {
        let path = device_root.join(name);
        match node_at(&path) {
            Ok(Some(n)) => control.push(n),
            Ok(None) => warn!(path = %path.display(), "not a character device; ignored"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(GpuError::io(format!("reading {}", path.display()), e)),
        }
    }
    if !gpus.is_empty()
        && !control
            .iter()
            .any(|n| n.container == Path::new("/dev/nvidiactl"))
    {
        return Err(GpuError::Internal(format!(
            "GPUs found but {} is missing",
            device_root.join("nvidiactl").display()
        )));
    }
    Ok(Inventory { gpus, control })
}

/// The character device at `path` (not following a symlink), if it is one.
pub(crate) fn node_at(path: &Path) -> io::Result<Option<Node>> {
    let md = std::fs::symlink_metadata(path)?;
    if !md.file_type().is_char_device() {
        return Ok(None);
    }
    let rdev = md.rdev();
    let name = path.file_name().unwrap_or_default();
    Ok(Some(Node {
        host: path.to_path_buf(),
        container: Path::new("/dev").join(name),
        major: nix::sys::stat::major(rdev) as u32,
        minor: nix::sys::stat::minor(rdev) as u32,
        mode: md.mode() & 0o7777,
    }))
}

/// The (major, minor) of a character device, following symlinks; `None` if it is none.
pub fn char_device_numbers(path: &Path) -> io::Result<Option<(u32, u32)>> {
    let md = std::fs::metadata(path)?;
    Ok(md.file_type().is_char_device().then(|| {
        (
            nix::sys::stat::major(md.rdev()) as u32,
            nix::sys::stat::minor(md.rdev()) as u32,
        )
    }))
}

#[derive(Debug, PartialEq)]
struct Information {
    minor: u32,
    uuid: String,
    bus_id: String,
    model: String,
}

/// Every `<proc_root>/driver/nvidia/gpus/<bus id>/information`.
fn read_information(proc_root: &Path) -> Result<Vec<Information>, GpuError> {
    let dir = proc_root.join("driver/nvidia/gpus");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(GpuError::io(format!("listing {}", dir.display()), e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| GpuError::io(format!("listing {}", dir.display()), e))?;
        let path = entry.path().join("information");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| GpuError::io(format!("reading {}", path.display()), e))?;
        let bus_dir = entry.file_name().to_string_lossy().into_owned();
        match parse_information(&text, &bus_dir) {
            Some(i) => out.push(i),
            None => warn!(path = %path.display(), "no GPU UUID or device minor in it; ignored"),
        }
    }
    Ok(out)
}

/// The driver's `information` file: `Key:   value` lines.
fn parse_information(text: &str, bus_dir: &str) -> Option<Information> {
    let field = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    Some(Information {
        minor: field("Device Minor")?.parse().ok()?,
        uuid: field("GPU UUID")?,
        bus_id: field("Bus Location").unwrap_or_else(|| bus_dir.to_string()),
        model: field("Model").unwrap_or_default(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub const INFO0: &str = "Model: \t\t NVIDIA A100-SXM4-40GB\nIRQ:   \t\t 42\nGPU UUID: \t GPU-c0ffee00-0000-4000-8000-000000000000\nVideo BIOS: \t 92.00.45.00.03\nBus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\nBus Location: \t 0000:07:00.0\nDevice Minor: \t 0\nGPU Excluded:\t No\n";

    pub fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// A device root and proc root with GPUs at (minor, bus id), and nvidiactl.
    pub fn fake_node(dir: &Path, gpus: &[(u32, &str)]) -> (PathBuf, PathBuf) {
        use nix::sys::stat::{makedev, mknod, Mode, SFlag};
        let dev = dir.join("dev");
        let proc = dir.join("proc");
        std::fs::create_dir_all(&dev).unwrap();
        for (minor, bus) in gpus {
            mknod(
                &dev.join(format!("nvidia{minor}")),
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o666),
                makedev(195, u64::from(*minor)),
            )
            .unwrap();
            let d = proc.join("driver/nvidia/gpus").join(bus);
            std::fs::create_dir_all(&d).unwrap();
            let text = INFO0
                .replace("000000000000\n", &format!("{minor:012x}\n"))
                .replace("0000:07:00.0", bus)
                .replace("Minor: \t 0", &format!("Minor: \t {minor}"));
            std::fs::write(d.join("information"), text).unwrap();
        }
        mknod(
            &dev.join("nvidiactl"),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(195, 255),
        )
        .unwrap();
        (dev, proc)
    }

    #[test]
    fn information_files_parse() {
        let i = parse_information(INFO0, "x").unwrap();
        assert_eq!(
            i,
            Information {
                minor: 0,
                uuid: "GPU-c0ffee00-0000-4000-8000-000000000000".into(),
                bus_id: "0000:07:00.0".into(),
                model: "NVIDIA A100-SXM4-40GB".into(),
            }
        );
        assert_eq!(parse_information("Model: x\n", "b"), None);
    }

    #[test]
    fn gpus_are_indexed_in_bus_order() {
        if !is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // Minor 0 sits on the later bus: it is index 1, as nvidia-smi numbers it.
        let (dev, proc) = fake_node(dir.path(), &[(0, "0000:81:00.0"), (1, "0000:07:00.0")]);
        std::fs::write(dev.join("nvidia-caps"), "").unwrap();
        let inv = discover(&dev, &proc).unwrap();
        assert_eq!(inv.gpus.len(), 2);
        assert_eq!((inv.gpus[0].index, inv.gpus[0].minor), (0, 1));
        assert_eq!((inv.gpus[1].index, inv.gpus[1].minor), (1, 0));
        assert_eq!(inv.gpus[1].uuid, "GPU-c0ffee00-0000-4000-8000-000000000000");
        assert!(inv
            .by_uuid("gpu-c0ffee00-0000-4000-8000-000000000001")
            .is_some());
        assert_eq!(inv.control.len(), 1);
        assert_eq!(inv.control[0].container, Path::new("/dev/nvidiactl"));
        assert_eq!((inv.control[0].major, inv.control[0].minor), (195, 255));
    }

    #[test]
    fn a_node_without_gpus_has_an_empty_inventory() {
        let dir = tempfile::tempdir().unwrap();
        let inv = discover(&dir.path().join("dev"), &dir.path().join("proc")).unwrap();
        assert!(inv.gpus.is_empty() && inv.control.is_empty());
    }
}
