//! The driver mirror in `vdriver_dir`, which containers get mounted at `/usr/local/nvidia`:
//!
//! ```text
//! manifest.json          what it was built from; a different driver (or interceptor) rebuilds it
//! origin/lib64, bin      the driver's files untouched (hardlinked, else copied), soname links
//! shared/lib64, bin      the same, but libcuda.so.1 and libnvidia-ml.so.1 are forwarders that
//!                        load the interceptor, then the real library from origin/ (see `elf`);
//!                        plus the interceptor itself
//! views/<gen>/<caps>/…   origin/ and shared/ cut down to one capability set (hardlinks), per
//!                        generation of the mirror: containers mount these
//! ```
//!
//! A rebuild happens in a scratch directory that is swapped in by rename, under an exclusive
//! lock on `.lock` (several daemons may share the directory). Containers mount views, whose files
//! are hardlinks: a rebuild never touches the views of an older generation, and those are only
//! collected once no container's grant names them (see [`Mirror::collect_garbage`]), so an
//! upgrade never pulls libraries from under a running container.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::config::INTERCEPTOR_NAME;
use super::elf;
use super::error::GpuError;
use super::libraries::{Capability, Driver, DriverFile};

/// Where containers see the mirror, and where the forwarders find the interceptor and the real
/// libraries.
pub const CONTAINER_ROOT: &str = "/usr/local/nvidia";
pub const CONTAINER_LIB: &str = "/usr/local/nvidia/lib64";
pub const CONTAINER_BIN: &str = "/usr/local/nvidia/bin";
pub const CONTAINER_ORIGIN_LIB: &str = "/usr/local/nvidia/origin/lib64";

/// The libraries the `shared/` tree replaces by forwarders.
pub const REPLACED: &[&str] = &["libcuda.so.1", "libnvidia-ml.so.1"];

/// Which tree a container gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tree {
    Origin,
    Shared,
}

impl Tree {
    fn dir(self) -> &'static str {
        match self {
            Tree::Origin => "origin",
            Tree::Shared => "shared",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Manifest {
    driver_version: String,
    files: Vec<Source>,
    interceptor: Option<Source>,
}

/// A source file as it was when mirrored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Source {
    path: PathBuf,
    size: u64,
    mtime_ns: i128,
    capability: Option<Capability>,
    soname: Option<String>,
}

impl Source {
    fn of(path: &Path, file: Option<&DriverFile>) -> Result<Source, GpuError> {
        let md = std::fs::metadata(path)
            .map_err(|e| GpuError::io(format!("reading {}", path.display()), e))?;
        Ok(Source {
            path: path.to_path_buf(),
            size: md.len(),
            mtime_ns: i128::from(md.mtime()) * 1_000_000_000 + i128::from(md.mtime_nsec()),
            capability: file.map(|f| f.capability),
            soname: file.and_then(|f| f.soname.clone()),
        })
    }
}

/// A built mirror.
#[derive(Debug)]
pub struct Mirror {
    dir: PathBuf,
    pub driver: Driver,
    /// Whether `shared/` exists (it needs the interceptor).
    pub has_shared: bool,
    /// Names this build's views: a digest of its manifest.
    generation: String,
    views: Mutex<()>,
}

impl Mirror {
    /// Build `dir` for `driver` unless it already mirrors exactly these files.
    pub fn build(dir: &Path, driver: Driver, interceptor: &Path) -> Result<Mirror, GpuError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| GpuError::io(format!("creating {}", dir.display()), e))?;
        let _lock = DirLock::take(dir)?;
        let interceptor = match Source::of(interceptor, None) {
            Ok(s) => Some(s),
            Err(_) => {
                warn!(path = %interceptor.display(), "interceptor not found: GPU limits cannot be enforced until it is installed");
                None
            }
        };
        let wanted = Manifest {
            driver_version: driver.version.clone(),
            files: driver
                .files
                .iter()
                .map(|f| Source::of(&f.source, Some(f)))
                .collect::<Result<_, _>>()?,
            interceptor,
        };
        let manifest_path = dir.join("manifest.json");
        let current: Option<Manifest> = std::fs::read(&manifest_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let has_shared = wanted.interceptor.is_some();
        let generation = serde_json::to_vec(&wanted)
            .map(|b| format!("{:016x}", fnv1a(&b)))
            .map_err(|e| GpuError::Internal(e.to_string()))?;
        if current.as_ref() != Some(&wanted) || !dir.join("origin").is_dir() {
            info!(dir = %dir.display(), version = %driver.version, previous = ?current.map(|m| m.driver_version), "building the GPU driver mirror");
            rebuild(
                dir,
                &driver,
                wanted.interceptor.as_ref().map(|s| s.path.as_path()),
            )?;
            let json = serde_json::to_vec_pretty(&wanted)
                .map_err(|e| GpuError::Internal(e.to_string()))?;
            crishim_sys::record::write_atomic(&manifest_path, &json)
                .map_err(|e| GpuError::io(format!("writing {}", manifest_path.display()), e))?;
        }
        Ok(Mirror {
            dir: dir.to_path_buf(),
            driver,
            has_shared,
            generation,
            views: Mutex::new(()),
        })
    }

    /// Remove the views of other generations that no path in `in_use` lies in.
    pub fn collect_garbage(&self, in_use: &[PathBuf]) -> Result<(), GpuError> {
        let views = self.dir.join("views");
        let Ok(generations) = std::fs::read_dir(&views) else {
            return Ok(());
        };
        let _lock = DirLock::take(&self.dir)?;
        for generation in generations.flatten() {
            if generation.file_name() == self.generation.as_str() {
                continue;
            }
            let gen_dir = generation.path();
            for view in std::fs::read_dir(&gen_dir).into_iter().flatten().flatten() {
                let path = view.path();
                if !in_use.iter().any(|u| u.starts_with(&path)) {
                    info!(path = %path.display(), "removing an unused view of an older GPU driver mirror");
                    remove_all(&path)?;
                }
            }
            // Gone once its last view is.
            let _ = std::fs::remove_dir(&gen_dir);
        }
        Ok(())
    }

    /// The tree for one capability set, built on first use: (lib64, bin) on the host.
    pub fn view(&self, caps: &BTreeSet<Capability>, tree: Tree) -> Result<PathBuf, GpuError> {
        let name: Vec<&str> = caps.iter().map(|c| c.name()).collect();
        let generation = self.dir.join("views").join(&self.generation);
        let view = generation.join(name.join(","));
        let _guard = self.views.lock().unwrap_or_else(|e| e.into_inner());
        if !view.is_dir() {
            let _lock = DirLock::take(&self.dir)?;
            if !view.is_dir() {
                let scratch = self.dir.join(format!(".view-{}", std::process::id()));
                remove_all(&scratch)?;
                for t in [Tree::Origin, Tree::Shared] {
                    if t == Tree::Shared && !self.has_shared {
                        continue;
                    }
                    link_tree(&self.dir.join(t.dir()), &scratch.join(t.dir()), |name| {
                        self.in_view(name, caps)
                    })?;
                }
                mkdir(&generation)?;
                rename(&scratch, &view)?;
            }
        }
        Ok(view.join(tree.dir()))
    }

    /// Whether a mirror entry (file or link name) belongs to a capability set.
    fn in_view(&self, name: &str, caps: &BTreeSet<Capability>) -> bool {
        if name == INTERCEPTOR_NAME {
            return true;
        }
        self.driver.files.iter().any(|f| {
            caps.contains(&f.capability)
                && (f.name == name
                    || f.soname.as_deref() == Some(name)
                    || f.soname.as_deref().and_then(dev_name) == Some(name))
        })
    }
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `libcuda.so.1` → `libcuda.so`: the unversioned name frameworks link or dlopen.
fn dev_name(soname: &str) -> Option<&str> {
    let end = soname.find(".so.")? + 3;
    Some(&soname[..end])
}

fn rebuild(dir: &Path, driver: &Driver, interceptor: Option<&Path>) -> Result<(), GpuError> {
    let scratch = dir.join(format!(".build-{}", std::process::id()));
    remove_all(&scratch)?;
    let origin = scratch.join("origin");
    for f in &driver.files {
        let sub = if f.is_library() { "lib64" } else { "bin" };
        place(&f.source, &origin.join(sub).join(&f.name))?;
        if let Some(soname) = &f.soname {
            if soname != &f.name {
                symlink(&f.name, &origin.join("lib64").join(soname))?;
            }
            if let Some(dev) = dev_name(soname) {
                symlink(soname, &origin.join("lib64").join(dev))?;
            }
        }
    }
    for sub in ["lib64", "bin"] {
        mkdir(&origin.join(sub))?;
    }
    if let Some(interceptor) = interceptor {
        let shared = scratch.join("shared");
        let replaced: Vec<&DriverFile> = driver
            .files
            .iter()
            .filter(|f| f.soname.as_deref().is_some_and(|s| REPLACED.contains(&s)))
            .collect();
        link_tree(&origin, &shared, |name| {
            !replaced
                .iter()
                .any(|f| f.name == name || f.soname.as_deref() == Some(name))
        })?;
        for f in replaced {
            let soname = f.soname.as_deref().unwrap_or_default();
            let bytes = elf::forwarder(
                soname,
                &[
                    &format!("{CONTAINER_LIB}/{INTERCEPTOR_NAME}"),
                    &format!("{CONTAINER_ORIGIN_LIB}/{soname}"),
                ],
            );
            let path = shared.join("lib64").join(soname);
            std::fs::write(&path, bytes)
                .map_err(|e| GpuError::io(format!("writing {}", path.display()), e))?;
        }
        place(interceptor, &shared.join("lib64").join(INTERCEPTOR_NAME))?;
    }
    for name in ["origin", "shared"] {
        let old = dir.join(format!(".old-{}-{name}", std::process::id()));
        if dir.join(name).exists() {
            rename(&dir.join(name), &old)?;
        }
        if scratch.join(name).exists() {
            rename(&scratch.join(name), &dir.join(name))?;
        }
        remove_all(&old)?;
    }
    remove_all(&scratch)
}

/// Hardlink `src` at `dst`, or copy it when they are on different filesystems.
fn place(src: &Path, dst: &Path) -> Result<(), GpuError> {
    if let Some(parent) = dst.parent() {
        mkdir(parent)?;
    }
    match std::fs::hard_link(src, dst) {
        Ok(()) => Ok(()),
        Err(e)
            if e.raw_os_error() == Some(libc::EXDEV)
                || e.kind() == io::ErrorKind::PermissionDenied =>
        {
            std::fs::copy(src, dst).map(|_| ()).map_err(|e| {
                GpuError::io(format!("copying {} to {}", src.display(), dst.display()), e)
            })
        }
        Err(e) => Err(GpuError::io(
            format!("linking {} to {}", src.display(), dst.display()),
            e,
        )),
    }
}

/// Recreate `src`'s `lib64/` and `bin/` at `dst`: hardlinks for files, copies of symlinks, for
/// the names `keep` accepts.
fn link_tree(src: &Path, dst: &Path, keep: impl Fn(&str) -> bool) -> Result<(), GpuError> {
    for sub in ["lib64", "bin"] {
        let from = src.join(sub);
        let to = dst.join(sub);
        mkdir(&to)?;
        let entries = std::fs::read_dir(&from)
            .map_err(|e| GpuError::io(format!("listing {}", from.display()), e))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| GpuError::io(format!("listing {}", from.display()), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !keep(&name) {
                continue;
            }
            let path = entry.path();
            let md = std::fs::symlink_metadata(&path)
                .map_err(|e| GpuError::io(format!("reading {}", path.display()), e))?;
            if md.file_type().is_symlink() {
                let target = std::fs::read_link(&path)
                    .map_err(|e| GpuError::io(format!("reading {}", path.display()), e))?;
                symlink(&target, &to.join(&name))?;
            } else {
                place(&path, &to.join(&name))?;
            }
        }
    }
    Ok(())
}

fn mkdir(p: &Path) -> Result<(), GpuError> {
    std::fs::create_dir_all(p).map_err(|e| GpuError::io(format!("creating {}", p.display()), e))
}

fn symlink(target: impl AsRef<Path>, link: &Path) -> Result<(), GpuError> {
    if let Some(parent) = link.parent() {
        mkdir(parent)?;
    }
    match std::os::unix::fs::symlink(target.as_ref(), link) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            Err(GpuError::io(format!("linking {}", link.display()), e))
        }
        _ => Ok(()),
    }
}

fn rename(from: &Path, to: &Path) -> Result<(), GpuError> {
    std::fs::rename(from, to).map_err(|e| {
        GpuError::io(
            format!("renaming {} to {}", from.display(), to.display()),
            e,
        )
    })
}

fn remove_all(p: &Path) -> Result<(), GpuError> {
    match std::fs::remove_dir_all(p) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(GpuError::io(format!("removing {}", p.display()), e))
        }
        _ => Ok(()),
    }
}

/// An exclusive `flock` on `<dir>/.lock`, held while the file is open.
struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    fn take(dir: &Path) -> Result<DirLock, GpuError> {
        let path = dir.join(".lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| GpuError::io(format!("opening {}", path.display()), e))?;
        // SAFETY: flock on a descriptor we own; released when `f` is closed.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) } != 0 {
            return Err(GpuError::io(
                format!("locking {}", path.display()),
                io::Error::last_os_error(),
            ));
        }
        Ok(DirLock { _file: f })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::libraries::{locate, tests::fake_driver};

    fn caps(c: &[Capability]) -> BTreeSet<Capability> {
        c.iter().copied().collect()
    }

    #[test]
    fn origin_shared_and_views() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fake_driver(&root);
        let interceptor = dir.path().join(INTERCEPTOR_NAME);
        std::fs::write(&interceptor, b"interceptor").unwrap();
        let vd = dir.path().join("vdriver");
        let m = Mirror::build(&vd, locate(&root).unwrap().unwrap(), &interceptor).unwrap();
        let origin = vd.join("origin/lib64");
        assert_eq!(
            std::fs::read_link(origin.join("libcuda.so.1")).unwrap(),
            Path::new("libcuda.so.550.54.14")
        );
        assert_eq!(
            std::fs::read_link(origin.join("libcuda.so")).unwrap(),
            Path::new("libcuda.so.1")
        );
        assert!(vd.join("origin/bin/nvidia-smi").is_file());
        // Hardlinked, not copied.
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(
            ino(&origin.join("libcuda.so.550.54.14")),
            ino(&root.join("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14"))
        );
        // shared/: forwarders in place of the replaced libraries, the interceptor, the rest.
        let shared = vd.join("shared/lib64");
        let fwd = std::fs::read(shared.join("libcuda.so.1")).unwrap();
        assert_eq!(elf::soname(&fwd).unwrap().as_deref(), Some("libcuda.so.1"));
        let text = String::from_utf8_lossy(&fwd);
        assert!(text.contains("/usr/local/nvidia/lib64/libcrishim_vgpu.so"));
        assert!(text.contains("/usr/local/nvidia/origin/lib64/libcuda.so.1"));
        assert!(!shared.join("libcuda.so.550.54.14").exists());
        assert!(shared.join("libnvidia-ptxjitcompiler.so.1").exists());
        assert!(shared.join(INTERCEPTOR_NAME).is_file());
        // A view keeps only its capabilities.
        let v = m
            .view(
                &caps(&[Capability::Compute, Capability::Utility]),
                Tree::Origin,
            )
            .unwrap();
        assert!(v.join("lib64/libcuda.so.1").exists());
        assert!(v.join("lib64/libnvidia-ml.so.1").exists());
        assert!(v.join("bin/nvidia-smi").exists());
        assert!(!v.join("lib64/libnvcuvid.so.1").exists());
        let v = m
            .view(
                &caps(&[Capability::Compute, Capability::Utility, Capability::Video]),
                Tree::Shared,
            )
            .unwrap();
        assert!(v.join("lib64/libnvcuvid.so.1").exists());
        assert!(v.join(format!("lib64/{INTERCEPTOR_NAME}")).exists());
    }

    #[test]
    fn a_new_driver_version_rebuilds_and_the_same_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fake_driver(&root);
        let interceptor = dir.path().join(INTERCEPTOR_NAME);
        std::fs::write(&interceptor, b"i").unwrap();
        let vd = dir.path().join("vdriver");
        let m = Mirror::build(&vd, locate(&root).unwrap().unwrap(), &interceptor).unwrap();
        let used = m.view(&caps(&[Capability::Compute]), Tree::Origin).unwrap();
        let unused = m.view(&caps(&[Capability::Utility]), Tree::Origin).unwrap();
        let marker = vd.join("origin/lib64/marker");
        std::fs::write(&marker, "").unwrap();
        Mirror::build(&vd, locate(&root).unwrap().unwrap(), &interceptor).unwrap();
        assert!(marker.exists(), "same driver: kept");
        // Upgrade: libcuda.so.1 now points at a new version.
        let lib = root.join("usr/lib/x86_64-linux-gnu");
        std::fs::write(
            lib.join("libcuda.so.560.1.2"),
            elf::forwarder("libcuda.so.1", &[]),
        )
        .unwrap();
        std::fs::remove_file(lib.join("libcuda.so.550.54.14")).unwrap();
        std::fs::remove_file(lib.join("libcuda.so.1")).unwrap();
        std::os::unix::fs::symlink("libcuda.so.560.1.2", lib.join("libcuda.so.1")).unwrap();
        let d = locate(&root).unwrap().unwrap();
        assert_eq!(d.version, "560.1.2");
        let m = Mirror::build(&vd, d, &interceptor).unwrap();
        assert!(!marker.exists(), "rebuilt");
        assert!(vd.join("origin/lib64/libcuda.so.560.1.2").exists());
        // A running container's view of the old driver stays whole until it is gone.
        assert!(used.join("lib64/libcuda.so.550.54.14").is_file());
        let new = m.view(&caps(&[Capability::Compute]), Tree::Origin).unwrap();
        assert!(new.join("lib64/libcuda.so.560.1.2").is_file());
        m.collect_garbage(std::slice::from_ref(&used)).unwrap();
        assert!(used.join("lib64/libcuda.so.550.54.14").is_file());
        assert!(!unused.exists(), "an unused old view is collected");
        assert!(new.exists(), "the current generation stays");
        m.collect_garbage(&[]).unwrap();
        assert!(!used.exists());
    }
}
