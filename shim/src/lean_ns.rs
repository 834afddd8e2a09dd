//! A mount namespace without the pods' mounts, for the libcontainer calls that need none of them:
//! exec, kill and delete.
//!
//! libcgroups 0.7 finds each of its twelve cgroup v1 controllers with a scan of
//! `/proc/self/mountinfo` that stops at the first match, so for a controller that is not mounted
//! it reads the whole file: every pod's overlay, `/dev/shm` and network namespace, and the
//! kubelet's volumes. It does so in every exec, kill and delete, so those got slower as pods
//! accumulated. This namespace is a private copy of the shim's, built once (from the pod's first
//! create's view, or at the first such call), holding every mount except those below crishim's state directory and the kubelet's pod
//! volumes, and those of other runtimes' containers (overlays, pinned namespaces). A call made in
//! it sees the same files (the state directory's own files are there, its submounts are not), the
//! same cgroup hierarchies and `/proc`.
//!
//! A create runs in a view of its own ([`with_create_view`]) without the other pods' mounts and,
//! where the pod's uid is known, their kubelet volumes: the pod's first, in one the shim built
//! while the daemon ran the pod's CNI ADD, where the container's rootfs and volumes reached it
//! since; any other, in one built for it. Start stays in the shim's own namespace, as its hooks
//! run with the host's view.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crishim_sys::mountinfo::{self, Mount};
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

/// Mounts of these file system types are containers' roots and pinned namespaces, never needed by
/// the calls made in the lean namespace.
const DROPPED_TYPES: &[&str] = &["overlay", "nsfs"];

/// The kubelet's pod volumes (tmpfs for projected volumes, subpath binds).
const KUBELET_PODS: &str = "/var/lib/kubelet/pods";

/// What a pruned view of the mounts leaves out.
struct Prune<'a> {
    /// Mounts strictly below these directories go…
    drop_below: &'a [PathBuf],
    /// …except those at or below these.
    keep: &'a [PathBuf],
    /// Mounts of [`DROPPED_TYPES`] anywhere go too (other runtimes' containers).
    drop_types: bool,
    /// Where set, only mounts on the way to one of these paths, or at or below one, stay.
    near: Option<&'a [PathBuf]>,
}

/// What [`plan`] makes of the node's mounts.
struct Plan {
    /// The mount points to bind into the pruned root, parents before children.
    binds: Vec<PathBuf>,
    /// How many were left out.
    dropped: usize,
    /// Those left out for being far from every path of [`Prune::near`].
    far: Vec<PathBuf>,
}

/// Where the shim builds a namespace.
#[derive(Clone, Copy)]
pub struct Workspace<'a> {
    /// An empty directory the shim owns: the new root's mount point in a copy of its namespace.
    pub dir: &'a Path,
    /// The daemon's empty mount namespace, which the namespace is made from instead where the
    /// shim has it (see [`unshare_from_empty`]).
    pub empty: Option<&'a File>,
}

/// Whether `a` and `b` are one path, or one lies below the other.
fn related(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The node's paths any create's view keeps as they are (with the mounts on the way to them and
/// below them): libcontainer's `/proc` and cgroup lookups, the `/dev/null` it masks paths with,
/// and the LSMs' files.
pub const CREATE_NEEDS: [&str; 5] = [
    "/proc",
    "/sys/fs/cgroup",
    "/dev/null",
    "/sys/fs/selinux",
    "/sys/kernel/security",
];

/// The mount points to bind into the pruned root, parents before children: every mount but `/`
/// (the root is bound first) and those dropped (see [`Prune`]), with what lies at or below a
/// dropped one.
fn plan(mounts: &[Mount], prune: &Prune) -> Plan {
    let mut ordered: Vec<&Mount> = mounts.iter().collect();
    // Stable: mounts stacked on one point keep their order.
    ordered.sort_by_key(|m| m.mount_point.components().count());
    // A set, looked up by each mount point and its ancestors: a node has hundreds of pods' mounts.
    let mut dropped: std::collections::HashSet<&Path> = std::collections::HashSet::new();
    let mut keep = Vec::new();
    let mut far = Vec::new();
    for m in ordered {
        let mp = m.mount_point.as_path();
        if mp == Path::new("/") {
            continue;
        }
        let kept = prune.keep.iter().any(|k| mp.starts_with(k));
        let drop = !kept
            && (prune
                .drop_below
                .iter()
                .any(|d| mp != d.as_path() && mp.starts_with(d))
                || (prune.drop_types && DROPPED_TYPES.contains(&m.fs_type.as_str())))
            || mp.ancestors().any(|a| dropped.contains(a));
        // A mount unrelated to every near path has no submount related to one either.
        let is_far = prune
            .near
            .is_some_and(|near| !near.iter().any(|n| related(n, mp)));
        if drop || is_far {
            dropped.insert(mp);
            if is_far && !drop {
                far.push(m.mount_point.clone());
            }
        } else {
            keep.push(m.mount_point.clone());
        }
    }
    Plan {
        binds: keep,
        dropped: dropped.len(),
        far,
    }
}

/// crishim's state directory, the parent of the pods' directories (`<state_dir>/pods/<id>`);
/// `None` for a shim outside that layout (`crishim bundle`).
pub fn state_dir(pod_dir: &Path) -> Option<PathBuf> {
    pod_dir
        .parent()
        .filter(|p| p.file_name().is_some_and(|n| n == "pods"))
        .and_then(Path::parent)
        .map(Path::to_path_buf)
}

/// The directories a lean namespace leaves out: crishim's state directory and the kubelet's pod
/// volumes.
pub fn drop_roots(pod_dir: &Path) -> Vec<PathBuf> {
    let mut roots = vec![PathBuf::from(KUBELET_PODS)];
    roots.extend(state_dir(pod_dir));
    roots
}

pub struct LeanNs {
    host: File,
    lean: File,
}

impl LeanNs {
    /// Build the namespace in `work` (see [`Workspace`]); the host's namespace is left
    /// untouched. `must_see` are paths the calls made in it need; a namespace without one of
    /// them is refused.
    pub fn build(
        drop_below: &[PathBuf],
        work: Workspace,
        must_see: &[&Path],
    ) -> Result<Self, String> {
        let host = File::open("/proc/thread-self/ns/mnt")
            .map_err(|e| format!("opening the shim's mount namespace: {e}"))?;
        let lean = build_here(drop_below, work, must_see, &host)?;
        Ok(LeanNs { lean, host })
    }

    /// Build it from `view`, a create's view (`with_create_view`), which holds far fewer mounts
    /// than the node: a cheaper copy and a shorter mountinfo. Ends in `host`, the shim's own
    /// namespace, which [`enter`](Self::enter) returns to.
    pub fn build_from(
        view: &File,
        host: File,
        drop_below: &[PathBuf],
        work: Workspace,
        must_see: &[&Path],
    ) -> Result<Self, String> {
        setns(view.as_fd(), CloneFlags::CLONE_NEWNS)
            .map_err(|e| format!("entering a create's view: {e}"))?;
        let lean = build_here(drop_below, work, must_see, &host)?;
        Ok(LeanNs { lean, host })
    }

    /// Run `f` in the lean namespace. `f` must not yield to the event loop: the whole process
    /// (one thread) is in the lean namespace until it returns.
    pub fn enter<T>(&self, f: impl FnOnce() -> T) -> T {
        if let Err(e) = setns(self.lean.as_fd(), CloneFlags::CLONE_NEWNS) {
            eprintln!(
                "crishim-shim: entering the lean mount namespace ({e}); staying in the shim's"
            );
            return f();
        }
        let out = f();
        return_to(&self.host);
        out
    }
}

/// From the namespace this thread is in: plan, unshare, populate and keep the result; back to
/// `back` in every case.
fn build_here(
    drop_below: &[PathBuf],
    work: Workspace,
    must_see: &[&Path],
    back: &File,
) -> Result<File, String> {
    let built = (|| {
        // As a create's view does: the pods' mounts below the state directory are left out
        // unread where the kernel can (this namespace drops them all), not read from mountinfo,
        // which formats each overlay's layers (0.3 ms of a shim's CPU per pod at 110 pods).
        let (mounts, _) =
            mountinfo::read_outside(drop_below).map_err(|e| format!("reading mountinfo: {e}"))?;
        let prune = Prune {
            drop_below,
            keep: &[],
            drop_types: true,
            near: None,
        };
        let plan = plan(&mounts, &prune);
        unshare_pruned(work, &plan.binds, must_see, MsFlags::MS_PRIVATE)?;
        File::open("/proc/thread-self/ns/mnt").map_err(|e| e.to_string())
    })();
    return_to(back);
    built.map_err(|e| format!("building the lean mount namespace: {e}"))
}

/// Below this many dropped mounts a create keeps the shim's namespace: building the view costs
/// about what the saved scans would.
const CREATE_VIEW_MIN_DROPPED: usize = 32;

/// A view built ahead of a create is used only this young: it is a slave of the node's mounts,
/// so it gains those made since (other pods' too), and a fresh one drops them.
pub const SPARE_VIEW_MAX_AGE: Duration = Duration::from_secs(10);

/// What a create's view leaves out of the node's mounts.
#[derive(Clone, Copy)]
pub struct ViewScope<'a> {
    /// Mounts strictly below these roots (from [`create_view_drops`]) go…
    pub drop_below: &'a [PathBuf],
    /// …except those at or below these: the pod's and the container's directories.
    pub keep: &'a [PathBuf],
    /// Where set, only mounts on the way to one of these paths, or at or below one, stay: what
    /// the create reads on the node (its bundle, the sources of its binds, [`CREATE_NEEDS`]).
    /// `None` for a create that runs hooks, which may read anything.
    pub near: Option<&'a [PathBuf]>,
}

/// A pruned view of the node's mounts for a container's create (see [`with_create_view`]): a
/// mount namespace, held by its descriptor.
pub struct CreateView {
    ns: File,
    built: Instant,
    /// The roots below which it dropped mounts.
    dropped_below: Vec<PathBuf>,
    /// The node's mounts it left out for being far from what a create needs (see [`Prune::near`]).
    far: Vec<PathBuf>,
}

/// The kubelet's directory for the pod with this uid (its volumes are below it); `None` for a
/// uid that cannot name one.
pub fn kubelet_pod_dir(uid: &str) -> Option<PathBuf> {
    crishim_proto::shim::is_dir_safe_uid(uid).then(|| Path::new(KUBELET_PODS).join(uid))
}

/// Below which roots a create's view drops the node's mounts: the state directory (the other
/// pods' rootfs, /dev/shm and network namespaces) and, with `kubelet` (the pod's own kubelet
/// directory is kept), the kubelet's pod volumes. A root at or below one of `sources` (what the
/// container binds: a node agent may bind `/var/lib/kubelet`) is not dropped, so that the
/// container gets all that lies below what it binds, as on the node.
pub fn create_view_drops(state_dir: &Path, kubelet: bool, sources: &[PathBuf]) -> Vec<PathBuf> {
    let mut roots = vec![state_dir.to_path_buf()];
    if kubelet {
        roots.push(PathBuf::from(KUBELET_PODS));
    }
    roots.retain(|r| !sources.iter().any(|s| r.starts_with(s)));
    roots
}

impl CreateView {
    /// Build a view of the node's mounts as `scope` says, in `work` (see [`Workspace`]), from this
    /// thread's namespace, which it ends in again. `None` where it would drop fewer than
    /// [`CREATE_VIEW_MIN_DROPPED`] mounts or cannot be built. Built ahead of the create (a spare),
    /// it lacks the rootfs the daemon mounts after where the state directory is private (as the
    /// daemon keeps it): [`with_create_view`] attaches it then.
    pub fn build(scope: ViewScope, work: Workspace) -> Option<CreateView> {
        let host = File::open("/proc/thread-self/ns/mnt").ok()?;
        // The mounts below a dropped root that is a mount of its own (the state directory: every
        // pod's) are left out unread where the kernel can; the create's own there (its rootfs,
        // `/dev/shm`) are attached by `with_create_view`, as to a spare.
        let (mounts, unread) = mountinfo::read_outside(scope.drop_below).unwrap_or_default();
        let prune = Prune {
            drop_below: scope.drop_below,
            keep: scope.keep,
            drop_types: false,
            near: scope.near,
        };
        let plan = plan(&mounts, &prune);
        if plan.dropped + unread < CREATE_VIEW_MIN_DROPPED {
            return None;
        }
        let built = unshare_pruned(work, &plan.binds, &[], MsFlags::MS_SLAVE).and_then(|()| {
            File::open("/proc/thread-self/ns/mnt").map_err(|e| format!("opening it: {e}"))
        });
        return_to(&host);
        match built {
            Ok(ns) => Some(CreateView {
                ns,
                built: Instant::now(),
                dropped_below: scope.drop_below.to_vec(),
                far: plan.far,
            }),
            Err(e) => {
                eprintln!("crishim-shim: building a create's mount view ({e})");
                None
            }
        }
    }

    /// Whether this view, built ahead, hides nothing a create of `scope` needs: it dropped no
    /// root the create keeps (a container may bind one from above), and no mount it left out
    /// for being far is on the way to or below one of the create's near paths.
    fn serves(&self, scope: ViewScope) -> bool {
        self.dropped_below
            .iter()
            .all(|r| scope.drop_below.contains(r))
            && self.far.iter().all(|d| {
                scope
                    .near
                    .is_some_and(|near| !near.iter().any(|n| related(n, d)))
            })
    }

    /// Enter the view if each of `same` exists in the shim's namespace (`ids`, from
    /// [`identities`]) and is the same file there: a mount made on the node since the view was
    /// built reaches it only where the node's mount above it propagates. Each of `same` that is
    /// a mount's root in the shim's namespace but another file in the view is attached to it
    /// first, as a clone of the node's mount. Back in `host` otherwise.
    fn enter_if_same(&self, host: &File, same: &[PathBuf], ids: &[Option<(u64, u64)>]) -> bool {
        if ids.iter().any(Option::is_none) {
            return false;
        }
        let clones: Vec<_> = same
            .iter()
            .zip(ids)
            .filter(|(p, _)| mountinfo::is_mount_root(p) == Some(true))
            .filter_map(|(p, id)| Some((p, id, crishim_sys::idmap::clone_tree(p).ok()?)))
            .collect();
        if setns(self.ns.as_fd(), CloneFlags::CLONE_NEWNS).is_err() {
            return false;
        }
        for (path, id, tree) in &clones {
            if identities(std::slice::from_ref(*path)).pop().as_ref() != Some(*id) {
                // A failure shows in the check below.
                let _ = crishim_sys::idmap::attach(tree, path);
            }
        }
        if identities(same) == ids {
            return true;
        }
        return_to(host);
        false
    }
}

/// Each path's device and inode, following links (as libcontainer will); `None` for one that
/// cannot be read.
fn identities(paths: &[PathBuf]) -> Vec<Option<(u64, u64)>> {
    use std::os::unix::fs::MetadataExt as _;
    paths
        .iter()
        .map(|p| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino())))
        .collect()
}

/// Run `f`, a container's create, in a view of the node's mounts without the other pods' and,
/// where `scope` names what the create reads, without the node's mounts far from it (see
/// [`ViewScope`]). libcontainer's create reads
/// `/proc/self/mountinfo` about fifteen times (its cgroup lookups and rootfs checks), copies the
/// namespace into the container's and detaches the copy at `pivot_root`, all in proportion to the
/// mounts it sees; the node's other mounts (devices, driver libraries, the pod's own volumes)
/// stay, and stay slaves of the node's, so mounts made on the node later still reach the
/// container.
///
/// The view is `spare`, built ahead of time by [`CreateView::build`], where it is young,
/// dropped nothing this create needs, and each of `same` (the rootfs, the bind mounts' sources,
/// the bundle) is the same file in it as in the shim's namespace, once each of them that is a
/// mount on the node and that it lacks is attached to it (the rootfs, mounted after a spare was
/// built; the create's mounts below the state directory, which a view leaves out unread);
/// otherwise one built now in `work`, attached to likewise. Where none can be built, or it would
/// drop few mounts, `f` runs in the shim's namespace. Returns the view too, when one was used,
/// for [`LeanNs::build_from`].
pub fn with_create_view<T>(
    spare: Option<CreateView>,
    scope: ViewScope,
    work: Workspace,
    same: &[PathBuf],
    f: impl FnOnce() -> T,
) -> (T, Option<File>) {
    let Ok(host) = File::open("/proc/thread-self/ns/mnt") else {
        return (f(), None);
    };
    let ids = identities(same);
    let entered = spare
        .filter(|v| v.built.elapsed() < SPARE_VIEW_MAX_AGE)
        .filter(|v| v.serves(scope))
        .filter(|v| v.enter_if_same(&host, same, &ids))
        .or_else(|| CreateView::build(scope, work).filter(|v| v.enter_if_same(&host, same, &ids)));
    let Some(view) = entered else {
        return (f(), None);
    };
    let out = f();
    return_to(&host);
    (out, Some(view.ns))
}

/// Back to the shim's own namespace. A shim that cannot return would create containers without
/// their rootfs: it stops instead, and the daemon's recovery takes over.
fn return_to(host: &File) {
    if let Err(e) = setns(host.as_fd(), CloneFlags::CLONE_NEWNS) {
        eprintln!("crishim-shim: returning to the shim's mount namespace: {e}");
        std::process::abort();
    }
}

/// `path` (under `dir`) as an `O_PATH` descriptor, resolved without following any link.
fn open_path(dir: RawFd, path: &Path, extra: ResolveFlag) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | extra);
    // SAFETY: openat2 returned a fresh descriptor that nothing else owns.
    openat2(dir, path, how).map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new mount namespace for this thread holding `/` and `binds` only, each mount made
/// `propagation` (private or slave: nothing done in it reaches the node): from the daemon's empty
/// namespace where `work` has it ([`unshare_from_empty`]), else from a copy of this thread's,
/// rooted at `work.dir`, which is created first ([`populate`]). One without each of `must_see`
/// is refused.
fn unshare_pruned(
    work: Workspace,
    binds: &[PathBuf],
    must_see: &[&Path],
    propagation: MsFlags,
) -> Result<(), String> {
    match work.empty {
        Some(empty) => unshare_from_empty(empty, binds, propagation)?,
        None => {
            crishim_sys::hostfs::create_private_dir(work.dir)
                .map_err(|e| format!("creating {}: {e}", work.dir.display()))?;
            unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare: {e}"))?;
            populate(work.dir, binds, propagation)?;
        }
    }
    match must_see.iter().find(|p| !p.exists()) {
        Some(p) => Err(format!("{} is not visible in it", p.display())),
        None => Ok(()),
    }
}

/// A new mount namespace for this thread holding `/` and `binds` only, as [`unshare_pruned`]
/// makes, but from `empty` (the daemon's empty mount namespace) rather than from a copy of the
/// node's: the node's namespace holds every pod's mounts, and copying then detaching them cost
/// each view in proportion to the pods on the node (1.1 % of a 110-pod burst's CPU). Here each
/// kept mount is cloned alone, made `propagation` (nothing attached to a clone reaches the node),
/// and attached in a private copy of `empty`; `/` is stacked on its root, which entering the
/// namespace resolves to.
fn unshare_from_empty(empty: &File, binds: &[PathBuf], propagation: MsFlags) -> Result<(), String> {
    use crishim_sys::idmap::{attach_at, clone_one};
    let clone = |dir: RawFd, path: &Path| {
        open_path(dir, path, ResolveFlag::empty())
            .map_err(std::io::Error::from)
            .and_then(|at| clone_one(at.as_fd(), propagation.bits()))
    };
    // In the shim's namespace: the clones, each point resolved without following links.
    let root = clone(libc::AT_FDCWD, Path::new("/")).map_err(|e| format!("cloning /: {e}"))?;
    let clones: Vec<_> = binds
        .iter()
        .filter_map(|mp| Some((mp, clone(libc::AT_FDCWD, mp).ok()?)))
        .collect();
    setns(empty.as_fd(), CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("entering the empty mount namespace: {e}"))?;
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare: {e}"))?;
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(|e| format!("making the copy private: {e}"))?;
    crishim_sys::idmap::attach(&root, Path::new("/"))
        .map_err(|e| format!("attaching / to it: {e}"))?;
    for (mp, tree) in &clones {
        // Beneath the new root and without links, as `populate` binds; one that cannot be
        // attached is left out.
        let rel = mp.strip_prefix("/").unwrap_or(mp);
        if let Ok(target) = open_path(root.as_raw_fd(), rel, ResolveFlag::RESOLVE_BENEATH) {
            let _ = attach_at(tree, target.as_fd());
        }
    }
    // Into the stacked root, which this thread's root still lies under (entering the namespace
    // later lands on it by itself).
    nix::unistd::fchdir(root.as_raw_fd())
        .and_then(|()| nix::unistd::chroot("."))
        .map_err(|e| format!("entering its root: {e}"))
}

/// In the freshly unshared namespace: bind `/` and then each kept mount (without their
/// submounts) under `work`, pivot into it and drop the old tree in one detach. `propagation`
/// (private or slave) is applied to the whole copy first: nothing done here reaches the node.
fn populate(work: &Path, binds: &[PathBuf], propagation: MsFlags) -> Result<(), String> {
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | propagation, none)
        .map_err(|e| format!("setting the copy's propagation: {e}"))?;
    mount(Some("/"), work, none, MsFlags::MS_BIND, none)
        .map_err(|e| format!("binding / to {}: {e}", work.display()))?;
    // `work` is the shim's own directory, taken as configured (a link on the way is fine).
    let root = nix::fcntl::open(
        work,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    // SAFETY: open returned a fresh descriptor that nothing else owns.
    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
    .map_err(|e| format!("opening {}: {e}", work.display()))?;
    for mp in binds {
        // Mountinfo names each point by its real path, without links. Both ends are opened so:
        // where a directory on the way was replaced by a link since (a hostPath volume a
        // container writes to, say), the mount is left out rather than bound from or onto
        // wherever the link points. Left out too is one that cannot be bound (its point hidden,
        // say); `must_see` below catches one that mattered.
        let rel = mp.strip_prefix("/").unwrap_or(mp);
        let (Ok(source), Ok(target)) = (
            open_path(libc::AT_FDCWD, mp, ResolveFlag::empty()),
            open_path(root.as_raw_fd(), rel, ResolveFlag::RESOLVE_BENEATH),
        ) else {
            continue;
        };
        let fd_path = |f: &OwnedFd| format!("/proc/self/fd/{}", f.as_raw_fd());
        let _ = mount(
            Some(fd_path(&source).as_str()),
            fd_path(&target).as_str(),
            none,
            MsFlags::MS_BIND,
            none,
        );
    }
    drop(root);
    nix::unistd::chdir(work).map_err(|e| format!("chdir: {e}"))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| format!("detaching the old root: {e}"))?;
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
23 22 0:5 / /proc rw - proc proc rw
31 22 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw
32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
40 22 0:40 / /run rw - tmpfs tmpfs rw
41 40 0:41 / /run/crishim/pods/p1/shm rw - tmpfs shm rw
42 40 0:42 / /run/crishim/containers/c1/rootfs rw - overlay overlay rw
43 42 0:43 / /run/crishim/containers/c1/rootfs/proc rw - proc proc rw
44 40 0:4 net:[4026532] /run/crishim/netns/p1 rw - nsfs nsfs rw
45 40 0:4 net:[4026533] /run/netns/cni-1 rw - nsfs nsfs rw
46 22 0:46 / /var/lib/kubelet/pods/u1/volumes/token rw - tmpfs tmpfs rw
47 22 0:47 / /var/lib/containerd/x/rootfs rw - overlay overlay rw
48 47 0:48 / /var/lib/containerd/x/rootfs/dev rw - tmpfs tmpfs rw
49 22 0:49 / /mnt/with\\040space rw - tmpfs tmpfs rw
50 22 0:50 / /var/lib/kubelet/pods rw - tmpfs tmpfs rw
garbage line
";

    #[test]
    fn the_plan_keeps_the_system_and_drops_the_pods() {
        let drop = drop_roots(Path::new("/run/crishim/pods/p1"));
        assert_eq!(
            drop,
            [PathBuf::from(KUBELET_PODS), PathBuf::from("/run/crishim")]
        );
        let prune = Prune {
            drop_below: &drop,
            keep: &[],
            drop_types: true,
            near: None,
        };
        let Plan {
            binds: kept,
            dropped,
            ..
        } = plan(&mountinfo::parse(INFO), &prune);
        assert_eq!(dropped, 8);
        assert_eq!(
            kept,
            [
                "/proc",
                "/run",
                "/mnt/with space",
                "/sys/fs/cgroup",
                "/sys/fs/cgroup/cpu",
                "/var/lib/kubelet/pods",
            ]
            .map(PathBuf::from)
        );
    }

    /// In [`INFO`]'s layout: the state directory, and pod p1's and container c1's directories.
    fn state_and_own_dirs() -> ([PathBuf; 1], [PathBuf; 2]) {
        (
            [PathBuf::from("/run/crishim")],
            [
                PathBuf::from("/run/crishim/containers/c1"),
                PathBuf::from("/run/crishim/pods/p1"),
            ],
        )
    }

    /// A create's view keeps everything but the other pods' mounts: this pod's and this
    /// container's stay, and so do other runtimes' and the kubelet's (a volume may be one).
    #[test]
    fn a_create_view_keeps_its_own_pod_and_the_nodes_mounts() {
        let (drop, keep) = state_and_own_dirs();
        let prune = Prune {
            drop_below: &drop,
            keep: &keep,
            drop_types: false,
            near: None,
        };
        let Plan {
            binds: kept,
            dropped,
            ..
        } = plan(&mountinfo::parse(INFO), &prune);
        assert_eq!(
            dropped, 1,
            "only the other pod's network namespace: {kept:?}"
        );
        for p in [
            "/run/crishim/pods/p1/shm",
            "/run/crishim/containers/c1/rootfs",
            "/run/crishim/containers/c1/rootfs/proc",
            "/run/netns/cni-1",
            "/var/lib/kubelet/pods/u1/volumes/token",
            "/var/lib/containerd/x/rootfs",
        ] {
            assert!(kept.contains(&PathBuf::from(p)), "{p} dropped: {kept:?}");
        }
        assert!(!kept.contains(&PathBuf::from("/run/crishim/netns/p1")));
    }

    /// With the pod's kubelet directory known, a create's view drops the other pods' volumes
    /// and keeps its own.
    #[test]
    fn a_create_view_keeps_its_own_kubelet_volumes_and_drops_the_other_pods() {
        let drops = create_view_drops(Path::new("/run/crishim"), true, &[]);
        assert_eq!(
            drops,
            [PathBuf::from("/run/crishim"), PathBuf::from(KUBELET_PODS)]
        );
        let kept_with = |own: &str| {
            let keep = [
                PathBuf::from("/run/crishim/pods/p1"),
                kubelet_pod_dir(own).unwrap(),
            ];
            let prune = Prune {
                drop_below: &drops,
                keep: &keep,
                drop_types: false,
                near: None,
            };
            plan(&mountinfo::parse(INFO), &prune).binds
        };
        let token = PathBuf::from("/var/lib/kubelet/pods/u1/volumes/token");
        assert!(kept_with("u1").contains(&token));
        let other = kept_with("u2");
        assert!(!other.contains(&token), "{other:?}");
        // The mount at the kubelet's pods directory itself is not below it.
        assert!(other.contains(&PathBuf::from(KUBELET_PODS)));
    }

    /// A container that binds a dropped root or a directory above it (a node agent binding
    /// `/var/lib/kubelet`, or `/`) gets everything below it: that root is not dropped.
    #[test]
    fn a_view_drops_nothing_below_what_the_container_binds() {
        let state = Path::new("/run/crishim");
        let drops = |sources: &[&str]| {
            let sources: Vec<PathBuf> = sources.iter().map(PathBuf::from).collect();
            create_view_drops(state, true, &sources)
        };
        let kubelet = PathBuf::from(KUBELET_PODS);
        assert_eq!(drops(&["/var/lib/kubelet"]), [state.to_path_buf()]);
        assert_eq!(drops(&[KUBELET_PODS]), [state.to_path_buf()]);
        assert_eq!(drops(&["/run"]), std::slice::from_ref(&kubelet));
        assert!(drops(&["/"]).is_empty());
        // Its own volumes, the pod's files and the rootfs are below the roots, not above.
        assert_eq!(
            drops(&[
                "/var/lib/kubelet/pods/u1/volumes/token",
                "/run/crishim/containers/c1/rootfs",
            ]),
            [state.to_path_buf(), kubelet]
        );
        // Without the pod's uid the kubelet's volumes are never dropped.
        assert_eq!(create_view_drops(state, false, &[]), [state.to_path_buf()]);
    }

    /// A view scoped to what a create reads keeps the mounts on the way to those paths and below
    /// them (the cgroup hierarchies, the pod's own, a bound volume's submounts), and leaves out
    /// the node's others.
    #[test]
    fn a_scoped_view_keeps_what_the_create_reads_and_leaves_the_rest() {
        let (drop, keep) = state_and_own_dirs();
        let mut near: Vec<PathBuf> = keep.to_vec();
        near.extend(CREATE_NEEDS.map(PathBuf::from));
        near.push(PathBuf::from("/mnt"));
        let prune = Prune {
            drop_below: &drop,
            keep: &keep,
            drop_types: false,
            near: Some(&near),
        };
        let Plan { binds, far, .. } = plan(&mountinfo::parse(INFO), &prune);
        assert_eq!(
            binds,
            [
                "/proc",
                "/run",
                "/mnt/with space",
                "/sys/fs/cgroup",
                "/sys/fs/cgroup/cpu",
                "/run/crishim/pods/p1/shm",
                "/run/crishim/containers/c1/rootfs",
                "/run/crishim/containers/c1/rootfs/proc",
            ]
            .map(PathBuf::from)
        );
        assert_eq!(
            far,
            [
                "/run/netns/cni-1",
                "/var/lib/kubelet/pods",
                "/var/lib/containerd/x/rootfs",
            ]
            .map(PathBuf::from),
            "the mounts below a far one are dropped with it, not listed"
        );
    }

    /// A spare view scoped to the pod's first create serves a later create only where nothing it
    /// left out is on the way to, or below, what that create reads.
    #[test]
    fn a_scoped_spare_serves_only_creates_that_read_nothing_it_left_out() {
        /// Whether a spare that left out `far` serves a create reading `near`.
        fn serves(far: &[&str], near: Option<&[&str]>) -> bool {
            let paths = |p: &[&str]| p.iter().map(PathBuf::from).collect::<Vec<_>>();
            let drop = paths(&["/run/crishim"]);
            let spare = CreateView {
                ns: File::open("/").unwrap(),
                built: Instant::now(),
                dropped_below: drop.clone(),
                far: paths(far),
            };
            let near = near.map(paths);
            spare.serves(ViewScope {
                drop_below: &drop,
                keep: &[],
                near: near.as_deref(),
            })
        }
        assert!(serves(&["/run/netns"], Some(&["/proc"])));
        assert!(!serves(&["/run/netns"], Some(&["/proc", "/run"])));
        assert!(!serves(&["/run/netns"], Some(&["/run/netns/cni-1/x"])));
        // A create that runs hooks reads anything: only an unscoped spare serves it.
        assert!(!serves(&["/run/netns"], None));
        assert!(serves(&[], None));
    }

    #[test]
    fn only_a_uuid_like_uid_names_a_kubelet_directory() {
        assert_eq!(
            kubelet_pod_dir("0b1c2d3e-aaaa-bbbb-cccc-0123456789ab"),
            Some(PathBuf::from(
                "/var/lib/kubelet/pods/0b1c2d3e-aaaa-bbbb-cccc-0123456789ab"
            ))
        );
        for bad in ["", "..", "a/b", "../../etc", "u 1", &"x".repeat(65)] {
            assert_eq!(kubelet_pod_dir(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_bundle_dir_outside_the_state_layout_drops_only_the_kubelets() {
        assert_eq!(
            drop_roots(Path::new("/tmp/bundle-shim")),
            [PathBuf::from(KUBELET_PODS)]
        );
    }

    /// Both ends of a bind are opened without following links: a path through a link is
    /// refused, and the target cannot leave the new root.
    #[test]
    fn bind_ends_are_opened_without_links_and_beneath_the_root() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("real/m")).unwrap();
        std::os::unix::fs::symlink(t.path().join("real"), t.path().join("link")).unwrap();
        assert!(open_path(
            libc::AT_FDCWD,
            &t.path().join("real/m"),
            ResolveFlag::empty()
        )
        .is_ok());
        assert_eq!(
            open_path(
                libc::AT_FDCWD,
                &t.path().join("link/m"),
                ResolveFlag::empty()
            )
            .err(),
            Some(nix::errno::Errno::ELOOP)
        );
        let root = open_path(libc::AT_FDCWD, t.path(), ResolveFlag::empty()).unwrap();
        assert!(open_path(
            root.as_raw_fd(),
            Path::new("real/m"),
            ResolveFlag::RESOLVE_BENEATH
        )
        .is_ok());
        assert_eq!(
            open_path(
                root.as_raw_fd(),
                Path::new("../etc"),
                ResolveFlag::RESOLVE_BENEATH
            )
            .err(),
            Some(nix::errno::Errno::EXDEV)
        );
    }

    /// A view built ahead of the create gets the rootfs mounted since: with the state directory
    /// shared (as `/run` is under systemd) by propagation, and the view also shows another pod's
    /// mount made since (it is a slave); with it private (as the daemon keeps it) as a clone the
    /// create attaches, and no other pod's mount made since reaches it. Either way the container
    /// sees its rootfs, and not the other pods' mounts made before; and so whether the view is
    /// made from a copy of the node's namespace or from an empty one.
    #[test]
    fn a_spare_view_gets_the_rootfs_mounted_after_it() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        for from_empty in [false, true] {
            for shared in [true, false] {
                let seen =
                    crishim_sys::testing::in_child_mount_ns(|| spare_view_sees(shared, from_empty));
                assert_eq!(
                    seen,
                    Some(vec![true, shared, false, true]),
                    "(rootfs, later mount, other pod's seen, the spare used) with the state dir \
                     shared={shared}, from an empty namespace={from_empty}"
                );
            }
        }
    }

    /// What a create in a spare view sees: its rootfs, a mount made after the spare, another
    /// pod's mount made before; and whether the spare was the view used.
    fn spare_view_sees(shared: bool, from_empty: bool) -> Option<Vec<bool>> {
        let empty = match from_empty {
            true => Some(crishim_sys::testing::empty_mount_ns().ok()?),
            false => None,
        };
        let none: Option<&str> = None;
        let state = tempfile::tempdir().ok()?;
        let state = state.path();
        mount(Some("tmpfs"), state, Some("tmpfs"), MsFlags::empty(), none).ok()?;
        let propagation = if shared {
            MsFlags::MS_SHARED
        } else {
            MsFlags::MS_PRIVATE
        };
        mount(none, state, none, propagation, none).ok()?;
        // Other pods' mounts, enough for a view to be worth building.
        for i in 0..CREATE_VIEW_MIN_DROPPED {
            tmpfs_at(&state.join(format!("pods/other{i}/shm")))?;
        }
        let pod = state.join("pods/p1");
        std::fs::create_dir_all(&pod).ok()?;
        let work = pod.join("create-view");
        let drops = [state.to_path_buf()];
        let pod_scope = ViewScope {
            drop_below: &drops,
            keep: std::slice::from_ref(&pod),
            near: None,
        };
        let ws = Workspace {
            dir: &work,
            empty: empty.as_ref(),
        };
        let spare = CreateView::build(pod_scope, ws)?;
        // Held, so that a view built instead cannot get its namespace's (reused) inode number.
        let spare_ns = spare.ns.try_clone().ok()?;
        // The daemon mounts the rootfs, and another pod starts, after the spare was built.
        let bundle = state.join("containers/c1");
        let rootfs = bundle.join("rootfs");
        tmpfs_at(&rootfs)?;
        std::fs::write(rootfs.join("marker"), "").ok()?;
        let later = state.join("pods/later/shm");
        tmpfs_at(&later)?;
        let keep = [pod.clone(), bundle.clone()];
        let other = state.join("pods/other0/shm");
        let scope = ViewScope {
            drop_below: &drops,
            keep: &keep,
            near: None,
        };
        let same = std::slice::from_ref(&rootfs);
        let (mut seen, view) = with_create_view(Some(spare), scope, ws, same, || {
            vec![
                rootfs.join("marker").exists(),
                mounted(&later),
                mounted(&other),
            ]
        });
        use std::os::unix::fs::MetadataExt as _;
        seen.push(view?.metadata().ok()?.ino() == spare_ns.metadata().ok()?.ino());
        Some(seen)
    }

    /// A spare view that dropped the kubelet's volumes is not used by a create that must keep
    /// them (it binds their parent): that create gets a view with them.
    #[test]
    fn a_spare_that_dropped_what_a_create_binds_is_not_used() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let seen = crishim_sys::testing::in_child_mount_ns(spare_dropping_volumes_sees);
        assert_eq!(
            seen,
            Some(vec![false, true]),
            "(another pod's volume seen through the spare, through the create's own view)"
        );
    }

    fn spare_dropping_volumes_sees() -> Option<Vec<bool>> {
        let none: Option<&str> = None;
        let dir = tempfile::tempdir().ok()?;
        let (state, kubelet) = (dir.path().join("state"), dir.path().join("kubelet/pods"));
        tmpfs_at(&state)?;
        mount(none, &state, none, MsFlags::MS_SHARED, none).ok()?;
        for i in 0..CREATE_VIEW_MIN_DROPPED {
            tmpfs_at(&kubelet.join(format!("other{i}/volumes/token")))?;
        }
        let pod = state.join("pods/p1");
        std::fs::create_dir_all(&pod).ok()?;
        let work = pod.join("create-view");
        let keep = [pod.clone()];
        let volume = kubelet.join("other0/volumes/token");
        let both = [state.clone(), kubelet.clone()];
        let scope = ViewScope {
            drop_below: &both,
            keep: &keep,
            near: None,
        };
        let ws = Workspace {
            dir: &work,
            empty: None,
        };
        let spare = CreateView::build(scope, ws)?;
        let (through_spare, view) =
            with_create_view(Some(spare), scope, ws, &[], || mounted(&volume));
        view?;
        // The create binds the kubelet's directory: only the state directory may go.
        let spare = CreateView::build(scope, ws)?;
        let only_state = [state.clone()];
        let source = [kubelet.clone()];
        let own = ViewScope {
            drop_below: &only_state,
            ..scope
        };
        let (through_own, _) = with_create_view(Some(spare), own, ws, &source, || mounted(&volume));
        Some(vec![through_spare, through_own])
    }

    /// A fresh tmpfs at `p` (made first); `None` where that fails.
    fn tmpfs_at(p: &Path) -> Option<()> {
        std::fs::create_dir_all(p).ok()?;
        mount(
            Some("tmpfs"),
            p,
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .ok()
    }

    fn mounted(p: &Path) -> bool {
        mountinfo::read().iter().any(|m| m.mount_point == p)
    }

    /// In a forked child (unshare needs a single-threaded process), in a private namespace of
    /// its own so the host sees nothing: a tmpfs below the dropped directory is gone inside the
    /// lean namespace, and back on return; a kept directory's files stay visible. Both with the
    /// state directory a mount of its own (as the daemon keeps it: its pods' mounts are left out
    /// unread, through statmount) and as a plain directory (read from mountinfo).
    #[test]
    fn the_lean_namespace_hides_the_pods_mounts() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let state = tempfile::tempdir().unwrap();
        let pod = state.path().join("pods/p1");
        let shm = pod.join("shm");
        // SAFETY: the child only runs this test's steps and exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                // Close what the other tests' threads hold open (a script being written, whose
                // exec would see ETXTBSY while this child kept a copy of its descriptor).
                // SAFETY: close_range on descriptors this child does not use.
                unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
                let code = (|| {
                    let none: Option<&str> = None;
                    unshare(CloneFlags::CLONE_NEWNS).ok()?;
                    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).ok()?;
                    let empty = crishim_sys::testing::empty_mount_ns().ok()?;
                    let mut all = true;
                    for state_mounted in [false, true] {
                        if state_mounted {
                            nix::mount::umount(&shm).ok()?;
                            mount(
                                Some("tmpfs"),
                                state.path(),
                                Some("tmpfs"),
                                MsFlags::empty(),
                                none,
                            )
                            .ok()?;
                        }
                        std::fs::create_dir_all(&shm).ok()?;
                        std::fs::write(pod.join("state.json"), "{}").ok()?;
                        mount(Some("tmpfs"), &shm, Some("tmpfs"), MsFlags::empty(), none).ok()?;
                        // Made from a copy of this namespace, then from an empty one.
                        for empty in [None, Some(&empty)] {
                            let work = Workspace {
                                dir: &pod.join("lean"),
                                empty,
                            };
                            let lean = LeanNs::build(
                                &drop_roots(&pod),
                                work,
                                &[&pod.join("state.json"), Path::new("/proc/self")],
                            )
                            .ok()?;
                            let inside =
                                lean.enter(|| (mounted(&shm), pod.join("state.json").exists()));
                            all &= inside == (false, true) && mounted(&shm);
                        }
                    }
                    Some(if all { 0 } else { 1 })
                })()
                .unwrap_or(2);
                unsafe { libc::_exit(code) };
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
                assert!(!mounted(&shm), "the child's mounts stayed in its namespace");
            }
        }
    }
}
