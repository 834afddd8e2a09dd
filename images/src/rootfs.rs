//! Container root filesystems: an overlayfs of the image's snapshots plus a per-container upper dir.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use crate::error::{ImageError, Result};

/// The mount options string must fit in one page (the kernel copies at most that much).
fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |v| v as usize)
}

/// Kernel mount calls, behind a trait so option building can be tested without privileges.
pub trait Mounter: Send + Sync {
    fn mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        flags: MsFlags,
        data: &str,
    ) -> nix::Result<()>;
    fn unmount(&self, target: &Path) -> nix::Result<()>;
}

/// The real kernel.
pub struct LinuxMounter;

impl Mounter for LinuxMounter {
    fn mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        flags: MsFlags,
        data: &str,
    ) -> nix::Result<()> {
        let data = (!data.is_empty()).then_some(data);
        nix::mount::mount(Some(source), target, Some(fstype), flags, data)
    }

    fn unmount(&self, target: &Path) -> nix::Result<()> {
        nix::mount::umount2(target, MntFlags::MNT_DETACH)
    }
}

/// How a pod with its own user namespace sees a root filesystem: its layers idmapped through
/// `userns`, and its writable layer owned by `root`, the (uid, gid) of the pod's root on the
/// host.
#[derive(Debug)]
pub struct Idmap {
    pub userns: std::fs::File,
    pub root: (u32, u32),
}

/// A root filesystem to mount, in containerd's `Mount` shape.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RootfsMount {
    /// `overlay`, or `bind` for a read-only single-layer image.
    pub fstype: String,
    pub source: String,
    pub options: Vec<String>,
    /// Snapshot directories, top layer first (the order overlayfs wants).
    pub lowerdirs: Vec<PathBuf>,
    pub upperdir: Option<PathBuf>,
    pub workdir: Option<PathBuf>,
    pub readonly: bool,
}

impl RootfsMount {
    pub(crate) fn overlay(lowerdirs: Vec<PathBuf>, upper: Option<(PathBuf, PathBuf)>) -> Self {
        let readonly = upper.is_none();
        if readonly && lowerdirs.len() == 1 {
            // overlayfs needs two lower layers without an upper; a read-only bind does the same job.
            return RootfsMount {
                fstype: "bind".into(),
                source: lowerdirs[0].display().to_string(),
                options: vec!["rbind".into(), "ro".into()],
                lowerdirs,
                upperdir: None,
                workdir: None,
                readonly,
            };
        }
        let (upperdir, workdir) = upper.map_or((None, None), |(u, w)| (Some(u), Some(w)));
        let mut m = RootfsMount {
            fstype: "overlay".into(),
            source: "overlay".into(),
            options: Vec::new(),
            lowerdirs,
            upperdir,
            workdir,
            readonly,
        };
        m.options = m.overlay_options(
            &m.lowerdirs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>(),
        );
        if readonly {
            m.options.push("ro".into());
        }
        m
    }

    fn overlay_options(&self, lower: &[String]) -> Vec<String> {
        let mut opts = vec![format!("lowerdir={}", lower.join(":"))];
        if let (Some(u), Some(w)) = (&self.upperdir, &self.workdir) {
            opts.push(format!("upperdir={}", u.display()));
            opts.push(format!("workdir={}", w.display()));
        }
        opts.extend(
            self.options
                .iter()
                .filter(|o| o.starts_with("context="))
                .cloned(),
        );
        opts
    }

    /// Label every file of the mount `context` for SELinux (`context="…"`, quoted: a level
    /// holds commas). Only for an overlay; a read-only bind keeps its labels.
    pub fn set_selinux_context(&mut self, context: &str) {
        if self.fstype == "overlay" {
            self.options.retain(|o| !o.starts_with("context="));
            self.options.push(format!("context=\"{context}\""));
        }
    }

    /// Mount at `target` with the real kernel.
    pub fn mount(&self, target: &Path) -> Result<()> {
        self.mount_with(&LinuxMounter, target)
    }

    /// Mount at `target` as a pod with its own user namespace sees it (see [`Idmap`]): each
    /// layer is an idmapped clone, handed to overlayfs as `/proc/self/fd/N`, and the upper and
    /// work directories are chowned to the pod's root first. A read-only bind (one layer, no
    /// upper) is attached as an idmapped clone itself.
    pub fn mount_idmapped(&self, target: &Path, idmap: &Idmap) -> Result<()> {
        let err = |source: std::io::Error| ImageError::Mount {
            target: target.to_path_buf(),
            source: nix::errno::Errno::from_raw(source.raw_os_error().unwrap_or(libc::EIO)),
        };
        if self.fstype == "bind" {
            let tree = crishim_sys::idmap::idmapped_clone(Path::new(&self.source), &idmap.userns)
                .map_err(err)?;
            return crishim_sys::idmap::attach(&tree, target).map_err(err);
        }
        for dir in self.upperdir.iter().chain(&self.workdir) {
            std::os::unix::fs::chown(dir, Some(idmap.root.0), Some(idmap.root.1)).map_err(err)?;
        }
        let trees: Vec<OwnedFd> = self
            .lowerdirs
            .iter()
            .map(|d| crishim_sys::idmap::idmapped_clone(d, &idmap.userns))
            .collect::<std::io::Result<_>>()
            .map_err(err)?;
        let data = self
            .overlay_options(
                &trees
                    .iter()
                    .map(|f| format!("/proc/self/fd/{}", f.as_raw_fd()))
                    .collect::<Vec<_>>(),
            )
            .join(",");
        if data.len() >= page_size() {
            return Err(ImageError::BadContent(format!(
                "image has too many layers ({}) for one overlay mount",
                self.lowerdirs.len()
            )));
        }
        let flags = if self.readonly {
            MsFlags::MS_RDONLY
        } else {
            MsFlags::empty()
        };
        // The clones are detached: overlayfs keeps its own references, and they go with `trees`.
        LinuxMounter
            .mount(&self.source, target, &self.fstype, flags, &data)
            .map_err(|source| ImageError::Mount {
                target: target.to_path_buf(),
                source,
            })
    }

    pub fn mount_with(&self, m: &dyn Mounter, target: &Path) -> Result<()> {
        let err = |source| ImageError::Mount {
            target: target.to_path_buf(),
            source,
        };
        if self.fstype == "bind" {
            m.mount(
                &self.source,
                target,
                "",
                MsFlags::MS_BIND | MsFlags::MS_REC,
                "",
            )
            .map_err(err)?;
            let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
            return m.mount("", target, "", flags, "").map_err(|e| {
                let _ = m.unmount(target);
                err(e)
            });
        }
        let flags = if self.readonly {
            MsFlags::MS_RDONLY
        } else {
            MsFlags::empty()
        };
        let data = self.kernel_options();
        if data.len() < page_size() {
            return m
                .mount(&self.source, target, &self.fstype, flags, &data)
                .map_err(err);
        }
        // Too long for one page: name each layer by a short /proc/self/fd path instead. The kernel
        // resolves them during mount(2), so the descriptors only need to live until it returns.
        let fds: Vec<OwnedFd> = self
            .lowerdirs
            .iter()
            .map(|d| {
                nix::fcntl::open(
                    d,
                    nix::fcntl::OFlag::O_PATH
                        | nix::fcntl::OFlag::O_DIRECTORY
                        | nix::fcntl::OFlag::O_CLOEXEC,
                    nix::sys::stat::Mode::empty(),
                )
                .map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
            })
            .collect::<nix::Result<_>>()
            .map_err(err)?;
        let short = self.overlay_options(
            &fds.iter()
                .map(|f| format!("/proc/self/fd/{}", f.as_raw_fd()))
                .collect::<Vec<_>>(),
        );
        let data = short.join(",");
        if data.len() >= page_size() {
            return Err(ImageError::BadContent(format!(
                "image has too many layers ({}) for one overlay mount",
                self.lowerdirs.len()
            )));
        }
        m.mount(&self.source, target, &self.fstype, flags, &data)
            .map_err(err)
    }

    /// The option string without flag words (`ro` is a mount flag, not overlay data).
    fn kernel_options(&self) -> String {
        self.options
            .iter()
            .filter(|o| *o != "ro")
            .cloned()
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<(String, String, String, MsFlags)>>);

    impl Mounter for Recorder {
        fn mount(
            &self,
            source: &str,
            _t: &Path,
            fstype: &str,
            flags: MsFlags,
            data: &str,
        ) -> nix::Result<()> {
            self.0
                .lock()
                .unwrap()
                .push((source.into(), fstype.into(), data.into(), flags));
            Ok(())
        }
        fn unmount(&self, _t: &Path) -> nix::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn short_stacks_use_plain_paths_top_first() {
        let m = RootfsMount::overlay(
            vec!["/s/top".into(), "/s/base".into()],
            Some(("/c/u".into(), "/c/w".into())),
        );
        assert_eq!(
            m.options,
            ["lowerdir=/s/top:/s/base", "upperdir=/c/u", "workdir=/c/w"]
        );
        let r = Recorder::default();
        m.mount_with(&r, Path::new("/t")).unwrap();
        assert_eq!(
            r.0.lock().unwrap()[0].2,
            "lowerdir=/s/top:/s/base,upperdir=/c/u,workdir=/c/w"
        );
    }

    #[test]
    fn an_selinux_context_labels_the_overlay_quoted_once() {
        let mut m = RootfsMount::overlay(
            vec!["/s/top".into(), "/s/base".into()],
            Some(("/c/u".into(), "/c/w".into())),
        );
        m.set_selinux_context("system_u:object_r:container_file_t:s0:c1,c2");
        m.set_selinux_context("system_u:object_r:container_file_t:s0:c3,c4");
        let r = Recorder::default();
        m.mount_with(&r, Path::new("/t")).unwrap();
        assert_eq!(
            r.0.lock().unwrap()[0].2,
            "lowerdir=/s/top:/s/base,upperdir=/c/u,workdir=/c/w,\
             context=\"system_u:object_r:container_file_t:s0:c3,c4\""
        );
        let mut ro = RootfsMount::overlay(vec!["/s/a".into()], None);
        ro.set_selinux_context("x");
        assert!(ro.options.iter().all(|o| !o.starts_with("context=")));
    }

    #[test]
    fn long_stacks_fall_back_to_fd_paths_within_a_page() {
        let dir = tempfile::tempdir().unwrap();
        let lowers: Vec<PathBuf> = (0..200)
            .map(|i| {
                let p = dir.path().join(format!("{i:0>64}"));
                std::fs::create_dir(&p).unwrap();
                p
            })
            .collect();
        let m = RootfsMount::overlay(lowers, Some((dir.path().join("u"), dir.path().join("w"))));
        assert!(m.kernel_options().len() > page_size());
        let r = Recorder::default();
        m.mount_with(&r, Path::new("/t")).unwrap();
        let data = &r.0.lock().unwrap()[0].2;
        assert!(data.len() < page_size(), "{} bytes", data.len());
        assert!(data.starts_with("lowerdir=/proc/self/fd/"));
        assert_eq!(data.matches("/proc/self/fd/").count(), 200);
    }

    #[test]
    fn read_only_variants() {
        let one = RootfsMount::overlay(vec!["/s/a".into()], None);
        assert_eq!((one.fstype.as_str(), one.readonly), ("bind", true));
        let two = RootfsMount::overlay(vec!["/s/b".into(), "/s/a".into()], None);
        assert_eq!(two.options, ["lowerdir=/s/b:/s/a", "ro"]);
        let r = Recorder::default();
        two.mount_with(&r, Path::new("/t")).unwrap();
        let calls = r.0.lock().unwrap();
        assert_eq!(calls[0].2, "lowerdir=/s/b:/s/a");
        assert!(calls[0].3.contains(MsFlags::MS_RDONLY));
    }
}
