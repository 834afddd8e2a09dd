//! The driver's user-space files, by capability (the names follow libnvidia-container's lists),
//! found under `driver_root` through its `ld.so.cache` and the standard library directories.

use std::collections::BTreeSet;
use std::io;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::debug;

use super::error::GpuError;
use super::{elf, ldcache};

/// `NVIDIA_DRIVER_CAPABILITIES` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    Compute,
    Utility,
    Video,
    Graphics,
    Display,
    Ngx,
    Compat32,
}

impl Capability {
    pub const ALL: [Capability; 7] = [
        Capability::Compute,
        Capability::Utility,
        Capability::Video,
        Capability::Graphics,
        Capability::Display,
        Capability::Ngx,
        Capability::Compat32,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Capability::Compute => "compute",
            Capability::Utility => "utility",
            Capability::Video => "video",
            Capability::Graphics => "graphics",
            Capability::Display => "display",
            Capability::Ngx => "ngx",
            Capability::Compat32 => "compat32",
        }
    }

    fn parse(s: &str) -> Option<Capability> {
        Capability::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Library soname prefixes (`libcuda.so` matches `libcuda.so.1`) and binaries.
    fn files(self) -> (&'static [&'static str], &'static [&'static str]) {
        match self {
            Capability::Utility => (
                &["libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"],
                &["nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"],
            ),
            Capability::Compute => (
                &[
                    "libcuda.so",
                    "libcudadebugger.so",
                    "libnvidia-opencl.so",
                    "libnvidia-gpucomp.so",
                    "libnvidia-ptxjitcompiler.so",
                    "libnvidia-fatbinaryloader.so",
                    "libnvidia-allocator.so",
                    "libnvidia-compiler.so",
                    "libnvidia-pkcs11.so",
                    "libnvidia-pkcs11-openssl3.so",
                    "libnvidia-nvvm.so",
                ],
                &["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"],
            ),
            Capability::Video => (
                &[
                    "libvdpau_nvidia.so",
                    "libnvidia-encode.so",
                    "libnvidia-opticalflow.so",
                    "libnvcuvid.so",
                ],
                &[],
            ),
            Capability::Graphics => (
                &[
                    "libnvidia-eglcore.so",
                    "libnvidia-glcore.so",
                    "libnvidia-tls.so",
                    "libnvidia-glsi.so",
                    "libnvidia-fbc.so",
                    "libnvidia-ifr.so",
                    "libnvidia-rtcore.so",
                    "libnvoptix.so",
                    "libGLX_nvidia.so",
                    "libEGL_nvidia.so",
                    "libGLESv2_nvidia.so",
                    "libGLESv1_CM_nvidia.so",
                    "libnvidia-glvkspirv.so",
                    "libnvidia-cbl.so",
                ],
                &[],
            ),
            Capability::Ngx => (&["libnvidia-ngx.so"], &[]),
            // Xorg modules and 32-bit libraries are not mirrored.
            Capability::Display | Capability::Compat32 => (&[], &[]),
        }
    }
}

/// The default set, widened by `NVIDIA_DRIVER_CAPABILITIES`.
pub const DEFAULT_CAPABILITIES: [Capability; 2] = [Capability::Compute, Capability::Utility];

/// `compute,utility`, `all`, ... Unknown names are refused by name.
pub fn parse_capabilities(value: &str) -> Result<BTreeSet<Capability>, String> {
    let mut out: BTreeSet<Capability> = DEFAULT_CAPABILITIES.into_iter().collect();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part == "all" {
            out.extend(Capability::ALL);
            continue;
        }
        out.insert(Capability::parse(part).ok_or_else(|| {
            format!(
                "NVIDIA_DRIVER_CAPABILITIES: unknown capability {part:?} (known: all, {})",
                Capability::ALL.map(Capability::name).join(", ")
            )
        })?);
    }
    Ok(out)
}

/// A file of the driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverFile {
    pub capability: Capability,
    /// The real file on the host (symlinks resolved within the driver root).
    pub source: PathBuf,
    /// Its file name (`libcuda.so.550.54.14`, `nvidia-smi`).
    pub name: String,
    /// Libraries only: the soname (`libcuda.so.1`), linked to `name` in the mirror.
    pub soname: Option<String>,
}

impl DriverFile {
    pub fn is_library(&self) -> bool {
        self.soname.is_some()
    }
}

/// The driver's files and version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    /// From `libcuda.so.<version>`.
    pub version: String,
    pub files: Vec<DriverFile>,
}

/// The library directories searched besides the cache.
#[cfg(target_arch = "aarch64")]
const LIB_DIRS: &[&str] = &[
    "usr/lib/aarch64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib64",
    "lib64",
    "usr/lib",
    "lib",
];
#[cfg(not(target_arch = "aarch64"))]
const LIB_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "lib/x86_64-linux-gnu",
    "usr/lib64",
    "lib64",
    "usr/lib",
    "lib",
];
/// Where the driver's binaries are: the distribution's dirs, then GKE's driver dir.
const BIN_DIRS: &[&str] = &[
    "usr/bin",
    "usr/sbin",
    "bin",
    "sbin",
    "usr/local/bin",
    "usr/local/nvidia/bin",
];

/// Find the driver under `root`; `None` when it has no `libcuda`.
pub fn locate(root: &Path) -> Result<Option<Driver>, GpuError> {
    let cache_path = root.join("etc/ld.so.cache");
    let cache = match std::fs::read(&cache_path) {
        Ok(b) => ldcache::parse(&b)
            .map_err(|e| GpuError::io(format!("reading {}", cache_path.display()), e))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(GpuError::io(format!("reading {}", cache_path.display()), e)),
    };
    let mut files: Vec<DriverFile> = Vec::new();
    let add = |files: &mut Vec<DriverFile>, f: DriverFile| {
        if !files.iter().any(|g| g.name == f.name) {
            files.push(f);
        }
    };
    // The cache names each library by soname; the real file is where its link points.
    for cap in Capability::ALL {
        for prefix in cap.files().0 {
            for e in cache.iter().filter(|e| matches_prefix(&e.name, prefix)) {
                let linked = within(root, Path::new(&e.path));
                let Some(real) = resolve(root, &linked) else {
                    debug!(path = %linked.display(), "ld.so.cache entry without a file");
                    continue;
                };
                add(&mut files, library(cap, real, Some(e.name.clone()))?);
            }
        }
    }
    let version = files
        .iter()
        .find_map(|f| f.name.strip_prefix("libcuda.so.").map(str::to_string))
        .or_else(|| scan_version(root));
    let Some(version) = version else {
        return Ok(None);
    };
    // Without a cache entry, a library is found as `<prefix>.<driver version>` in a library dir.
    for cap in Capability::ALL {
        for prefix in cap.files().0 {
            let name = format!("{prefix}.{version}");
            if let Some(real) = LIB_DIRS
                .iter()
                .map(|d| root.join(d).join(&name))
                .find_map(|p| resolve(root, &p))
            {
                add(&mut files, library(cap, real, None)?);
            }
        }
        for bin in cap.files().1 {
            if let Some(real) = locate_binary(root, bin) {
                add(
                    &mut files,
                    DriverFile {
                        capability: cap,
                        source: real,
                        name: bin.to_string(),
                        soname: None,
                    },
                );
            }
        }
    }
    if !files.iter().any(|f| f.name.starts_with("libcuda.so")) {
        return Ok(None);
    }
    Ok(Some(Driver { version, files }))
}

/// The first ELF file named `bin` in [`BIN_DIRS`], else the first file of that name. A node's
/// `/usr/bin/nvidia-smi` may be a script that runs the real one elsewhere; mounted into a
/// container without its target, it only finds itself.
fn locate_binary(root: &Path, bin: &str) -> Option<PathBuf> {
    let found: Vec<PathBuf> = BIN_DIRS
        .iter()
        .filter_map(|d| resolve(root, &root.join(d).join(bin)))
        .collect();
    let is_elf = |p: &PathBuf| {
        let mut magic = [0u8; 4];
        std::fs::File::open(p)
            .and_then(|mut f| io::Read::read_exact(&mut f, &mut magic))
            .is_ok_and(|()| magic == *b"\x7fELF")
    };
    found.iter().find(|p| is_elf(p)).or(found.first()).cloned()
}

fn matches_prefix(soname: &str, prefix: &str) -> bool {
    soname
        .strip_prefix(prefix)
        .is_some_and(|rest| rest.starts_with('.'))
}

/// A library file; its soname from the cache or else its ELF header.
fn library(cap: Capability, real: PathBuf, soname: Option<String>) -> Result<DriverFile, GpuError> {
    let name = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let soname = match soname {
        Some(s) => s,
        None => {
            let bytes = std::fs::read(&real)
                .map_err(|e| GpuError::io(format!("reading {}", real.display()), e))?;
            elf::soname(&bytes)
                .map_err(|e| GpuError::io(format!("reading {}", real.display()), e))?
                .unwrap_or_else(|| name.clone())
        }
    };
    Ok(DriverFile {
        capability: cap,
        source: real,
        name,
        soname: Some(soname),
    })
}

/// The version of a `libcuda.so.<version>` in the library dirs.
fn scan_version(root: &Path) -> Option<String> {
    LIB_DIRS.iter().find_map(|d| {
        std::fs::read_dir(root.join(d))
            .ok()?
            .flatten()
            .find_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let v = name.strip_prefix("libcuda.so.")?;
                (v.contains('.') && e.file_type().ok()?.is_file()).then(|| v.to_string())
            })
    })
}

/// `path` (absolute within `root`) as a host path.
fn within(root: &Path, path: &Path) -> PathBuf {
    let rel: PathBuf = path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    root.join(rel)
}

/// Follow symlinks of a host path inside `root` (absolute targets are taken within it) to a
/// regular file.
fn resolve(root: &Path, path: &Path) -> Option<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..16 {
        let md = std::fs::symlink_metadata(&p).ok()?;
        if md.file_type().is_file() {
            return Some(p);
        }
        if !md.file_type().is_symlink() {
            return None;
        }
        let target = std::fs::read_link(&p).ok()?;
        p = if target.is_absolute() {
            within(root, &target)
        } else {
            p.parent()?.join(target)
        };
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A driver root with libcuda and libnvidia-ml (as soname links to versioned files, the way
    /// the driver installs them), nvidia-smi, and a video library: any ELF shared object with
    /// the right soname does, so they are built with the linker-less [`elf::forwarder`].
    pub fn fake_driver(root: &Path) {
        let lib = root.join(LIB_DIRS[0]);
        std::fs::create_dir_all(&lib).unwrap();
        for (file, soname) in [
            ("libcuda.so.550.54.14", "libcuda.so.1"),
            ("libnvidia-ml.so.550.54.14", "libnvidia-ml.so.1"),
            (
                "libnvidia-ptxjitcompiler.so.550.54.14",
                "libnvidia-ptxjitcompiler.so.1",
            ),
            ("libnvcuvid.so.550.54.14", "libnvcuvid.so.1"),
        ] {
            std::fs::write(lib.join(file), elf::forwarder(soname, &[])).unwrap();
            std::os::unix::fs::symlink(file, lib.join(soname)).unwrap();
        }
        let bin = root.join("usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("nvidia-smi"), "#!/bin/sh\n").unwrap();
    }

    #[test]
    fn capabilities_widen_the_default() {
        let c = parse_capabilities("").unwrap();
        assert_eq!(c, DEFAULT_CAPABILITIES.into_iter().collect());
        let c = parse_capabilities("video, compute").unwrap();
        assert!(c.contains(&Capability::Video) && c.contains(&Capability::Utility));
        assert_eq!(
            parse_capabilities("all").unwrap().len(),
            Capability::ALL.len()
        );
        let e = parse_capabilities("compute,gpus").unwrap_err();
        assert!(e.contains("\"gpus\""), "{e}");
    }

    #[test]
    fn a_driver_is_found_without_a_cache_by_version() {
        let dir = tempfile::tempdir().unwrap();
        fake_driver(dir.path());
        let d = locate(dir.path()).unwrap().unwrap();
        assert_eq!(d.version, "550.54.14");
        let by = |n: &str| d.files.iter().find(|f| f.name == n).cloned();
        let cuda = by("libcuda.so.550.54.14").unwrap();
        assert_eq!(cuda.soname.as_deref(), Some("libcuda.so.1"));
        assert_eq!(cuda.capability, Capability::Compute);
        assert_eq!(by("nvidia-smi").unwrap().capability, Capability::Utility);
        assert_eq!(
            by("libnvcuvid.so.550.54.14").unwrap().capability,
            Capability::Video
        );
    }

    #[test]
    fn a_wrapper_script_gives_way_to_the_real_binary() {
        let d = tempfile::tempdir().unwrap();
        fake_driver(d.path());
        let smi = |d: &Path| {
            locate(d)
                .unwrap()
                .unwrap()
                .files
                .into_iter()
                .find(|f| f.name == "nvidia-smi")
                .unwrap()
                .source
        };
        // Only the script: it is what there is.
        assert_eq!(smi(d.path()), d.path().join("usr/bin/nvidia-smi"));
        // The real one in GKE's driver dir wins over the script in /usr/bin.
        let real = d.path().join("usr/local/nvidia/bin/nvidia-smi");
        std::fs::create_dir_all(real.parent().unwrap()).unwrap();
        std::fs::write(&real, elf::forwarder("nvidia-smi", &[])).unwrap();
        assert_eq!(smi(d.path()), real);
    }

    #[test]
    fn no_libcuda_no_driver() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(locate(dir.path()).unwrap(), None);
    }

    #[test]
    fn absolute_links_stay_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("real"), "x").unwrap();
        std::os::unix::fs::symlink("/lib/real", lib.join("link")).unwrap();
        assert_eq!(
            resolve(dir.path(), &lib.join("link")),
            Some(lib.join("real"))
        );
        std::os::unix::fs::symlink("/etc/passwd", lib.join("out")).unwrap();
        assert_eq!(resolve(dir.path(), &lib.join("out")), None);
    }
}
