//! The daemon's host directories are root's alone. `root_dir` and `state_dir` and every directory
//! under them that holds image content, root filesystems, bundles, records or shim sockets are
//! 0700; records, `config.json` files and exec specs (they carry containers' environments) are
//! 0600. No directory needs 0711: a container's process never walks these paths by name, since
//! its root filesystem, volumes and pod files reach it as mounts made by root before it runs.
//!
//! New paths get their modes as they are created (`crishim_sys::hostfs`). At start-up,
//! [`prepare`] also tightens a tree that an older daemon or a person left looser. It walks only
//! the runtime's own directories: never into a snapshot, a writable layer, a root filesystem or a
//! volume, whose modes are the image's and the container's.

use std::path::Path;

use crishim_sys::hostfs::{self, DIR_MODE};

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
pub const POD_FILES: &str = crishim_proto::shim::paths::POD_FILES;
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

/// Create `root_dir` and `state_dir` (0700) and tighten what is already under them; keep
/// `state_dir` a private mount (see [`private_mount`]).
pub fn prepare(config: &Config) -> std::io::Result<()> {
    for dir in [&config.root_dir, &config.state_dir] {
        hostfs::create_private_dir(dir).map_err(|e| annotate(dir, e))?;
    }
    if let Err(e) = private_mount(&config.state_dir) {
        tracing::warn!(dir = %config.state_dir.display(), error = %e, "making the state directory a private mount; the pods' mounts propagate as its parent's do");
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

/// Make `dir` a mount of its own (a bind of itself) and private, as containers/storage keeps its
/// layers: the pods' mounts made below it (rootfs, `/dev/shm`, network namespaces) then reach no
/// other mount namespace. Below a shared mount (`/run` under systemd) each would be copied into
/// every namespace that is a slave of the node's (a shim's view for a create, a sandboxed
/// service's), and those namespaces' mount tables, and every read of them, would grow with
/// the pods started meanwhile. A directory that already has mounts below it and is not a mount
/// itself (a daemon upgraded under running pods) is left as it is: a bind over it would hide
/// them.
pub fn private_mount(dir: &Path) -> std::io::Result<()> {
    use nix::mount::{mount, MsFlags};
    let dir = std::fs::canonicalize(dir)?;
    let (own, below) = mounts_at_and_below(&dir);
    if !own {
        if below {
            return Err(std::io::Error::other(
                "it is not a mount and has mounts below it (pods of an earlier daemon)",
            ));
        }
        mount(
            Some(&dir),
            &dir,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )?;
        BOUND.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    mount(
        None::<&str>,
        &dir,
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    Ok(())
}

/// Whether this daemon made the state directory's bind ([`private_mount`]).
static BOUND: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// At shutdown: undo the bind [`private_mount`] made at this daemon's start where no mount is
/// left below `dir` (no pod outlives the daemon), so that a stopped daemon leaves no mount behind.
/// With pods left it stays, for the next daemon. A mount this daemon did not make (an operator's,
/// a tmpfs, a previous daemon's) stays, and so does one in use.
pub fn release_private_mount(dir: &Path) {
    if !BOUND.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return;
    };
    if mounts_at_and_below(&dir) == (true, false) {
        if let Err(e) = nix::mount::umount(&dir) {
            tracing::debug!(dir = %dir.display(), error = %e, "leaving the state directory's mount");
        }
    }
}

/// Whether `dir` is a mount point, and whether any mount lies below it.
fn mounts_at_and_below(dir: &Path) -> (bool, bool) {
    let mounts = crishim_images::mounts_under(dir);
    (
        mounts.iter().any(|m| m == dir),
        mounts.iter().any(|m| m != dir),
    )
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
    use std::path::PathBuf;

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
        // `prepare` made the state directory a mount of its own in the test's namespace: undone
        // at once (the modes checked are the directories'), so no run leaves a mount behind.
        let state_mount = std::fs::canonicalize(state).unwrap();
        nix::mount::umount2(&state_mount, nix::mount::MntFlags::MNT_DETACH).unwrap();
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

    /// In a forked child with a mount namespace of its own (unshare needs one thread), below a
    /// shared tmpfs as `/run` is: the state directory becomes a private mount of its own, once
    /// however often the daemon starts, and a mount made below it no longer reaches the parent's
    /// peer (a bind of the parent elsewhere), as one made below it before did. A directory with
    /// mounts below it that is not a mount itself is refused and left alone.
    #[test]
    fn the_state_directory_becomes_a_private_mount_of_its_own() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let seen = crishim_sys::testing::in_child_mount_ns(|| {
            use nix::mount::{mount, MsFlags};
            let none: Option<&str> = None;
            let top = tempfile::tempdir().ok()?;
            let (run, peer) = (top.path().join("run"), top.path().join("peer"));
            for d in [&run, &peer] {
                std::fs::create_dir(d).ok()?;
            }
            mount(Some("tmpfs"), &run, Some("tmpfs"), MsFlags::empty(), none).ok()?;
            mount(none, &run, none, MsFlags::MS_SHARED, none).ok()?;
            mount(Some(&run), &peer, none, MsFlags::MS_BIND, none).ok()?;
            let state = run.join("crishim");
            let tmpfs_at = |p: &Path| {
                std::fs::create_dir_all(p).ok()?;
                mount(Some("tmpfs"), p, Some("tmpfs"), MsFlags::empty(), none).ok()
            };
            tmpfs_at(&state.join("before"))?;
            let mounted = |p: PathBuf| {
                crishim_sys::mountinfo::read()
                    .iter()
                    .any(|m| m.mount_point == p)
            };
            let reached_before = mounted(peer.join("crishim/before"));
            let busy = private_mount(&state).is_err();
            nix::mount::umount(&state.join("before")).ok()?;
            private_mount(&state).ok()?;
            private_mount(&state).ok()?;
            tmpfs_at(&state.join("after"))?;
            let mounts = crishim_sys::mountinfo::read();
            let at_state: Vec<_> = mounts.iter().filter(|m| m.mount_point == state).collect();

            Some(vec![
                reached_before,
                busy,
                at_state.len() == 1,
                at_state.iter().all(|m| !m.shared),
                mounted(peer.join("crishim/after")),
            ])
        });
        assert_eq!(
            seen,
            Some(vec![true, true, true, true, false]),
            "(a mount before reached the peer, refused over it, one mount at the state dir, \
             private, a mount after reached the peer)"
        );
    }
}
