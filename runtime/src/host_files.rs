//! The daemon's host directories are root's alone. `root_dir` and `state_dir` and every directory
//! under them that holds image content, root filesystems, bundles, records or shim sockets are
//! 0700; records, `config.json` files and exec specs (they carry containers' environments) are
//! 0600. No directory needs 0711: a container's process never walks these paths by name, since
//! its root filesystem, volumes and pod files reach it as mounts made by root before it runs.
//!
//! New paths get their modes as they are created (`crishim_proto::hostfs`). At start-up,
//! [`prepare`] also tightens a tree that an older daemon or a person left looser. It walks only
//! the runtime's own directories: never into a snapshot, a writable layer, a root filesystem or a
//! volume, whose modes are the image's and the container's.

use std::path::Path;

use crishim_proto::hostfs::{self, DIR_MODE};

use crate::config::Config;

/// Under `root_dir`: directories of records and of the CNI result cache (0700, files 0600).
const ROOT_RECORD_DIRS: [&str; 4] = [
    "records/pods",
    "records/containers",
    "records/quarantine",
    "cni-cache",
];

/// Per-pod directories of hostname, hosts and resolv.conf, bind-mounted into the containers:
/// their files keep 0644 so a non-root process there can read them. Under `state_dir`; under
/// `root_dir` for pods made by older daemons.
pub const POD_FILES: &str = "pod-files";
const ROOT_POD_FILES: &str = "pods";

/// Under `state_dir`: directories of one subdirectory per pod, container, bundle, network
/// namespace or `crishim run`, and whether their regular files are tightened to 0600.
const STATE_DIRS: [(&str, bool); 6] = [
    // shim.sock, shim.pid, infra.pid, shim.log, <container>.state.json; libcontainer's root `runc/`;
    // `lean/` and `create-view/`, empty: the roots of the shim's own mount namespaces (lean_ns.rs)
    ("pods", true),
    // bundles: config.json, exec-<n>.json; `rootfs/` is a mount point, never entered
    ("containers", true),
    // `crishim bundle`: the record and the default log
    ("bundles", true),
    // hostname, hosts and resolv.conf, which the containers read (see POD_FILES)
    (POD_FILES, false),
    // pinned network namespaces: bind mounts, left as they are
    ("netns", false),
    // `crishim run`: emptyDir volumes and logs, whose content is the containers'
    ("runs", false),
];

/// Create `root_dir` and `state_dir` (0700) and tighten what is already under them.
pub fn prepare(config: &Config) -> std::io::Result<()> {
    for dir in [&config.root_dir, &config.state_dir] {
        hostfs::create_private_dir(dir).map_err(|e| annotate(dir, e))?;
    }
    let root = &config.root_dir;
    tighten(&root.join("records"), DIR_MODE);
    for d in ROOT_RECORD_DIRS {
        tighten_dir_and_files(&root.join(d));
    }
    tighten(&root.join(ROOT_POD_FILES), DIR_MODE);
    for pod in subdirs(&root.join(ROOT_POD_FILES)) {
        tighten(&pod, DIR_MODE);
    }
    for (d, files) in STATE_DIRS {
        let dir = config.state_dir.join(d);
        tighten(&dir, DIR_MODE);
        for sub in subdirs(&dir) {
            if files {
                tighten_dir_and_files(&sub);
            } else {
                tighten(&sub, DIR_MODE);
            }
        }
    }
    // libcontainer's state directories inside each pod's.
    for pod in subdirs(&config.state_dir.join("pods")) {
        let lc_root = pod.join("runc");
        tighten(&lc_root, DIR_MODE);
        for c in subdirs(&lc_root) {
            tighten_dir_and_files(&c);
        }
    }
    Ok(())
}

fn annotate(p: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("creating {}: {e}", p.display()))
}

fn tighten_dir_and_files(dir: &Path) {
    hostfs::tighten_dir_and_files(dir, report);
}

/// The directories (not symlinks) directly in `dir`.
fn subdirs(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

fn tighten(p: &Path, mode: u32) {
    report(p, hostfs::tighten(p, mode))
}

fn report(p: &Path, result: std::io::Result<bool>) {
    match result {
        Ok(true) => tracing::info!(path = %p.display(), "tightened the mode of a root-only path"),
        Ok(false) => {}
        Err(e) => tracing::warn!(path = %p.display(), error = %e, "tightening a root-only path"),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    fn loose(p: &Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    #[test]
    fn a_loose_tree_is_tightened_but_content_is_left_alone() {
        let t = tempfile::tempdir().unwrap();
        let config = Config {
            root_dir: t.path().join("root"),
            state_dir: t.path().join("state"),
            ..Config::default()
        };
        let (root, state) = (&config.root_dir, &config.state_dir);
        let mk = |p: &Path| {
            std::fs::create_dir_all(p).unwrap();
            loose(p, 0o755);
        };
        for d in ["records/pods", "pods/p1", "cni-cache"] {
            mk(&root.join(d));
        }
        for d in [
            "pods/p1/runc/c1",
            "containers/c1/rootfs/etc",
            "runs/u1/vol",
            "bundles/b1",
            "pod-files/p2",
        ] {
            mk(&state.join(d));
        }
        loose(root, 0o755);
        loose(state, 0o755);
        let files = [
            (root.join("records/pods/p1.json"), 0o644),
            (root.join("pods/p1/resolv.conf"), 0o644),
            (state.join("pod-files/p2/hosts"), 0o644),
            (state.join("containers/c1/config.json"), 0o644),
            (state.join("containers/c1/exec-1.json"), 0o666),
            (state.join("containers/c1/rootfs/etc/passwd"), 0o644),
            (state.join("pods/p1/c1.state.json"), 0o644),
            (state.join("runs/u1/vol/data"), 0o666),
        ];
        for (f, m) in &files {
            std::fs::write(f, b"").unwrap();
            loose(f, *m);
        }
        prepare(&config).unwrap();
        for d in [
            root.clone(),
            state.clone(),
            root.join("records"),
            root.join("records/pods"),
            root.join("pods"),
            root.join("pods/p1"),
            root.join("cni-cache"),
            state.join("pods/p1"),
            state.join("pods/p1/runc"),
            state.join("pods/p1/runc/c1"),
            state.join("containers/c1"),
            state.join("runs/u1"),
            state.join("bundles/b1"),
            state.join("pod-files"),
            state.join("pod-files/p2"),
        ] {
            assert_eq!(mode(&d), 0o700, "{}", d.display());
        }
        for f in [
            root.join("records/pods/p1.json"),
            state.join("containers/c1/config.json"),
            state.join("containers/c1/exec-1.json"),
            state.join("pods/p1/c1.state.json"),
        ] {
            assert_eq!(mode(&f), 0o600, "{}", f.display());
        }
        // What containers see through mounts keeps its mode.
        assert_eq!(mode(&root.join("pods/p1/resolv.conf")), 0o644);
        assert_eq!(mode(&state.join("pod-files/p2/hosts")), 0o644);
        assert_eq!(mode(&state.join("containers/c1/rootfs/etc")), 0o755);
        assert_eq!(mode(&state.join("containers/c1/rootfs/etc/passwd")), 0o644);
        assert_eq!(mode(&state.join("runs/u1/vol")), 0o755);
        assert_eq!(mode(&state.join("runs/u1/vol/data")), 0o666);
    }
}
