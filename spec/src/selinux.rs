//! SELinux labels for containers, where the node has SELinux enabled (as containerd's
//! `label.InitLabels` does): a process label and a file (mount) label, from the policy's
//! `lxc_contexts` defaults with the fields a pod or container asks for put in, and a level (MCS
//! category pair) of the pod's own, so pods cannot read each other's files.
//!
//! libcontainer 0.7 applies no process label: the shim's executor writes it to
//! `/proc/thread-self/attr/exec` just before `execve`. The file label goes to the spec's
//! `mountLabel` (libcontainer puts it on the tmpfs mounts) and to the root filesystem's overlay
//! as its `context=` option.

use crishim_proto::cri;

/// The policy's defaults when `lxc_contexts` cannot be read (those of Fedora's and RHEL's
/// `container-selinux`).
const DEFAULT_PROCESS: &str = "system_u:system_r:container_t:s0";
const DEFAULT_FILE: &str = "system_u:object_r:container_file_t:s0";
/// Longest field or label taken from a request.
const MAX_FIELD: usize = 255;
/// MCS categories a pod's pair is drawn from (`c0`..`c1023`).
const CATEGORIES: u64 = 1024;

/// A container's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels {
    pub process: String,
    pub file: String,
}

/// The process and file contexts of the node's policy: `/etc/selinux/<SELINUXTYPE>/contexts/
/// lxc_contexts`, else the usual defaults.
pub fn policy_defaults(root: &std::path::Path) -> (String, String) {
    let policy = std::fs::read_to_string(root.join("etc/selinux/config"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.trim().strip_prefix("SELINUXTYPE="))
                .map(|v| v.trim().to_string())
        })
        .filter(|p| !p.is_empty() && !p.contains('/'))
        .unwrap_or_else(|| "targeted".into());
    let text = std::fs::read_to_string(
        root.join("etc/selinux")
            .join(policy)
            .join("contexts/lxc_contexts"),
    )
    .unwrap_or_default();
    let value = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
        })
    };
    (
        value("process").unwrap_or_else(|| DEFAULT_PROCESS.into()),
        value("file").unwrap_or_else(|| DEFAULT_FILE.into()),
    )
}

fn check_field(what: &str, v: &str, level: bool) -> Result<(), String> {
    let ok_char = |c: char| {
        c.is_ascii_alphanumeric()
            || matches!(c, '_' | '-' | '.')
            || (level && matches!(c, ':' | ','))
    };
    if v.len() > MAX_FIELD || !v.chars().all(ok_char) {
        return Err(format!(
            "SELinux {what} {:?} is not a label field",
            crishim_sys::shown::shown(v)
        ));
    }
    Ok(())
}

/// Whether the options ask for anything.
pub fn asked(o: Option<&cri::SeLinuxOption>) -> bool {
    o.is_some_and(|o| {
        !(o.user.is_empty() && o.role.is_empty() && o.r#type.is_empty() && o.level.is_empty())
    })
}

/// The options' fields, checked: a field is a name, a level a name with `:` and `,`.
pub fn check(o: &cri::SeLinuxOption) -> Result<(), String> {
    check_field("user", &o.user, false)?;
    check_field("role", &o.role, false)?;
    check_field("type", &o.r#type, false)?;
    check_field("level", &o.level, true)
}

/// The level a pod gets when it asks for none: a category pair of its own, drawn from its id
/// (so the same after a restart).
pub fn pod_level(pod_id: &str) -> String {
    let h = pod_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let a = h % CATEGORIES;
    let mut b = (h / CATEGORIES) % (CATEGORIES - 1);
    if b >= a {
        b += 1;
    }
    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
    format!("s0:c{lo},c{hi}")
}

/// `base` (`user:role:type:level`) with the non-empty fields of `o` put in, and `level` where
/// `o` names none.
fn compose(base: &str, o: Option<&cri::SeLinuxOption>, level: &str) -> String {
    let mut parts = base.splitn(4, ':');
    let mut field = |asked: Option<&String>| {
        let default = parts.next().unwrap_or_default().to_string();
        asked.filter(|a| !a.is_empty()).cloned().unwrap_or(default)
    };
    let user = field(o.map(|o| &o.user));
    let role = field(o.map(|o| &o.role));
    let typ = field(o.map(|o| &o.r#type));
    let own = o.map(|o| o.level.clone()).filter(|l| !l.is_empty());
    format!("{user}:{role}:{typ}:{}", own.as_deref().unwrap_or(level))
}

/// A container's labels: the policy's defaults, the pod's options, then the container's, at
/// the pod's level unless the container names one.
pub fn labels(
    defaults: &(String, String),
    pod: Option<&cri::SeLinuxOption>,
    container: Option<&cri::SeLinuxOption>,
    pod_level: &str,
) -> Labels {
    let level = pod
        .map(|o| o.level.clone())
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| pod_level.to_string());
    let process = compose(&compose(&defaults.0, pod, &level), container, &level);
    let file_level = container
        .map(|o| o.level.clone())
        .filter(|l| !l.is_empty())
        .unwrap_or(level);
    Labels {
        process,
        file: compose(&defaults.1, None, &file_level),
    }
}

/// Host directories never relabelled for a volume (as containerd's list): relabelling them
/// would take the host's own files from the host's processes.
const SYSTEM_PATHS: &[&str] = &[
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/media", "/opt", "/proc",
    "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var",
];
/// Most entries relabelled under one volume.
const MAX_RELABEL: u64 = 1_000_000;

/// Label everything under `path` (a volume's host path, `Mount.selinux_relabel`, resolved) with
/// `label`, through `set` (`lsetxattr("security.selinux")`; links inside are labelled, not
/// followed). A system directory is refused, also when named through a link, and so is a tree
/// of more than a million entries or [`crishim_sys::walk::MAX_DEPTH`] levels.
///
/// The volume may be written while it is relabelled (by a container already sharing it), so it
/// is walked by descriptor ([`crishim_sys::walk`]): a directory swapped for a link mid-walk
/// never takes the walk, or a label, outside it, and what is mounted inside is left as it is.
/// `set` gets each entry as `/proc/self/fd/<its directory>/<its name>`, so that only the final
/// component is looked up by name, in a directory the walk holds open.
pub fn relabel(
    path: &std::path::Path,
    label: &str,
    mut set: impl FnMut(&std::path::Path, &str) -> std::io::Result<()>,
) -> Result<(), String> {
    use crishim_sys::walk;
    // What a link names is what would be relabelled: checked as that.
    let real = std::fs::canonicalize(path)
        .map_err(|e| format!("resolving {} to relabel it: {e}", path.display()))?;
    if SYSTEM_PATHS.iter().any(|p| real == std::path::Path::new(p)) {
        return Err(format!(
            "relabelling {} for SELinux would take it from the host: refused",
            real.display()
        ));
    }
    let walked = walk::walk(&real, &walk::Limits::entries(MAX_RELABEL), |e| {
        set(&e.fd_path(), label)
    })
    .map_err(|e| format!("relabelling {e}"))?;
    match walked.stopped {
        None => Ok(()),
        Some(stop) => Err(format!(
            "relabelling {} for SELinux: refused, as {stop}",
            path.display()
        )),
    }
}

/// `lsetxattr(path, "security.selinux", label)`.
pub fn set_file_label(path: &std::path::Path, label: &str) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: lsetxattr with C strings and a buffer of the given length.
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            c"security.selinux".as_ptr(),
            label.as_ptr().cast(),
            label.len(),
            0,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(user: &str, role: &str, typ: &str, level: &str) -> cri::SeLinuxOption {
        cri::SeLinuxOption {
            user: user.into(),
            role: role.into(),
            r#type: typ.into(),
            level: level.into(),
        }
    }

    #[test]
    fn labels_take_the_defaults_the_pods_fields_then_the_containers() {
        let d = (DEFAULT_PROCESS.to_string(), DEFAULT_FILE.to_string());
        let l = labels(&d, None, None, "s0:c1,c2");
        assert_eq!(l.process, "system_u:system_r:container_t:s0:c1,c2");
        assert_eq!(l.file, "system_u:object_r:container_file_t:s0:c1,c2");
        let pod = opt("", "", "", "s0:c5,c6");
        let c = opt("", "", "spc_t", "");
        let l = labels(&d, Some(&pod), Some(&c), "s0:c1,c2");
        assert_eq!(l.process, "system_u:system_r:spc_t:s0:c5,c6");
        assert_eq!(l.file, "system_u:object_r:container_file_t:s0:c5,c6");
    }

    #[test]
    fn a_pods_level_is_its_own_and_stable() {
        let a = pod_level("pod-a");
        assert_eq!(a, pod_level("pod-a"));
        assert_ne!(a, pod_level("pod-b"));
        let cats: Vec<u64> = a
            .trim_start_matches("s0:")
            .split(',')
            .map(|c| c.trim_start_matches('c').parse().unwrap())
            .collect();
        assert!(cats[0] < cats[1] && cats[1] < CATEGORIES, "{a}");
    }

    #[test]
    fn fields_that_are_not_names_are_refused() {
        assert!(check(&opt("system_u", "system_r", "container_t", "s0:c1,c2")).is_ok());
        for bad in [
            opt("a:b", "", "", ""),
            opt("", "r\n", "", ""),
            opt("", "", &"t".repeat(300), ""),
            opt("", "", "", "s0 c1"),
        ] {
            assert!(check(&bad).is_err(), "{bad:?}");
        }
    }

    // No SELinux here: labels are recorded by a stand-in for lsetxattr.
    #[test]
    fn a_volume_is_relabelled_whole_and_system_directories_never() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("link")).unwrap();
        let mut labelled = Vec::new();
        relabel(dir.path(), "l", |p, _| {
            labelled.push(p.to_path_buf());
            Ok(())
        })
        .unwrap();
        assert_eq!(
            labelled.len(),
            4,
            "the dir, sub, sub/f and the link itself: {labelled:?}"
        );
        for sys in ["/", "/etc/", "/usr", "/var/../var"] {
            let e = relabel(std::path::Path::new(sys), "l", |_, _| Ok(())).unwrap_err();
            assert!(e.contains("refused"), "{sys}: {e}");
        }
        // A volume that is a link to a system directory is that directory.
        let e = relabel(&dir.path().join("link"), "l", |_, _| Ok(())).unwrap_err();
        assert!(e.contains("/etc") && e.contains("refused"), "{e}");
    }

    /// A container sharing the volume swaps one of its directories for a link to a host
    /// directory, as fast as it can, while the volume is relabelled 200 times: the stand-in
    /// setter, which looks at what it was handed as lsetxattr would, never reaches the host
    /// directory or anything in it.
    #[test]
    fn a_directory_swapped_for_a_link_mid_relabel_labels_nothing_outside() {
        use std::os::unix::ffi::OsStringExt;
        use std::os::unix::fs::MetadataExt;
        use std::sync::atomic::{AtomicBool, Ordering};
        let t = tempfile::tempdir().unwrap();
        let host = t.path().join("etc");
        std::fs::create_dir_all(host.join("ssh")).unwrap();
        std::fs::write(host.join("shadow"), "root:x").unwrap();
        std::fs::write(host.join("ssh/key"), "k").unwrap();
        let host_inodes: std::collections::HashSet<(u64, u64)> = ["", "ssh", "shadow", "ssh/key"]
            .iter()
            .map(|n| std::fs::symlink_metadata(host.join(n)).unwrap())
            .map(|m| (m.dev(), m.ino()))
            .collect();
        let vol = t.path().join("vol");
        for i in 0..10 {
            std::fs::create_dir_all(vol.join(format!("d/{i}/x"))).unwrap();
            std::fs::write(vol.join(format!("d/{i}/x/f")), "").unwrap();
        }
        std::os::unix::fs::symlink(&host, vol.join("l")).unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let swapper = {
            let stop = stop.clone();
            let c = |n| std::ffi::CString::new(vol.join(n).into_os_string().into_vec()).unwrap();
            let (d, l) = (c("d"), c("l"));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: renameat2 with C strings.
                    unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            d.as_ptr(),
                            libc::AT_FDCWD,
                            l.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                }
            })
        };
        let mut labelled = 0u64;
        for _ in 0..200 {
            relabel(&vol, "l", |p, _| {
                let m = std::fs::symlink_metadata(p)?;
                assert!(!host_inodes.contains(&(m.dev(), m.ino())), "{p:?}");
                labelled += 1;
                Ok(())
            })
            .unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        assert!(labelled > 200 * 3, "{labelled}");
    }

    #[test]
    fn the_policys_contexts_are_read() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("etc/selinux/mls/contexts");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(root.path().join("etc/selinux/config"), "SELINUXTYPE=mls\n").unwrap();
        std::fs::write(
            dir.join("lxc_contexts"),
            "process = \"u:r:my_container_t:s0\"\nfile = \"u:object_r:my_file_t:s0\"\n",
        )
        .unwrap();
        assert_eq!(
            policy_defaults(root.path()),
            (
                "u:r:my_container_t:s0".into(),
                "u:object_r:my_file_t:s0".into()
            )
        );
        let none = tempfile::tempdir().unwrap();
        assert_eq!(
            policy_defaults(none.path()),
            (DEFAULT_PROCESS.into(), DEFAULT_FILE.into())
        );
    }
}
