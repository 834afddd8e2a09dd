//! Pinning a network namespace to a file (a bind mount of `/proc/<pid>/ns/net`), so that it
//! outlives its processes and CNI DEL can still enter it.
//!
//! The bind mount is made in the caller's mount namespace; other mount namespaces see it only
//! if `path` lies on a shared mount.

use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// Whether `path` is a namespace file (an nsfs bind mount or a `/proc/<pid>/ns/*` link).
pub fn is_netns(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

/// `/proc/<pid>/ns/net`.
pub fn proc_netns(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/ns/net"))
}

/// Make a new network namespace with its loopback up, and pin it at `path`: a thread of its own
/// enters it and ends, so the daemon's other threads stay in the node's namespace.
pub fn create(path: &Path) -> io::Result<()> {
    let path = path.to_path_buf();
    std::thread::Builder::new()
        .name("crishim-netns".into())
        .spawn(move || make_here(&path))?
        .join()
        .map_err(|_| io::Error::other("the network namespace thread panicked"))?
}

/// [`create`]'s work, in the calling thread, which must end right after: it is left in the new
/// namespace.
fn make_here(path: &Path) -> io::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
    crishim_proto::net::loopback_up()?;
    pin_path(Path::new("/proc/thread-self/ns/net"), path)
}

/// Names of spares in the pinning directory; no pod id starts with a dot.
const SPARE_PREFIX: &str = ".spare-";

/// One network namespace made ahead of the pod that takes it: making one (the kernel's setup of
/// a namespace, the loopback, the pin) is about a millisecond and a half of RunPodSandbox's path,
/// before the CNI ADD can start. The spare is made in the background after each pod takes one,
/// pinned in `dir` as `.spare-<n>`, and handed over by pinning it again at the pod's path.
pub struct Spares {
    dir: PathBuf,
    state: std::sync::Mutex<SpareState>,
    counter: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct SpareState {
    spare: Option<PathBuf>,
    making: Option<std::thread::JoinHandle<()>>,
    closed: bool,
}

impl Spares {
    /// Spares pinned in `dir`; those a previous daemon left there are unpinned.
    pub fn new(dir: PathBuf) -> std::sync::Arc<Spares> {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(SPARE_PREFIX)
            {
                if let Err(e) = unpin(&entry.path()) {
                    tracing::warn!(path = %entry.path().display(), error = %e, "unpinning a stale spare network namespace");
                }
            }
        }
        std::sync::Arc::new(Spares {
            dir,
            state: Default::default(),
            counter: Default::default(),
        })
    }

    /// A new network namespace pinned at `path`, as [`create`] makes: the spare if one is ready,
    /// else one made now. Either way the next spare is made in the background.
    pub fn take(self: &std::sync::Arc<Self>, path: &Path) -> io::Result<()> {
        let spare = self.lock().spare.take();
        let made = match spare {
            Some(spare) => {
                let moved = pin_path(&spare, path);
                if let Err(e) = unpin(&spare) {
                    tracing::warn!(path = %spare.display(), error = %e, "unpinning a used spare network namespace");
                }
                match moved {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "handing over a spare network namespace; making one");
                        create(path)
                    }
                }
            }
            None => create(path),
        };
        self.refill();
        made
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SpareState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Make the next spare in a thread of its own, unless one is there or on its way.
    fn refill(self: &std::sync::Arc<Self>) {
        let mut state = self.lock();
        let busy = state.making.as_ref().is_some_and(|h| !h.is_finished());
        if state.closed || state.spare.is_some() || busy {
            return;
        }
        let n = self
            .counter
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.join(format!("{SPARE_PREFIX}{n}"));
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("crishim-netns".into())
            .spawn(move || {
                if let Err(e) = make_here(&path) {
                    tracing::warn!(path = %path.display(), error = %e, "making a spare network namespace");
                    let _ = unpin(&path);
                    return;
                }
                let mut state = me.lock();
                if state.closed {
                    drop(state);
                    let _ = unpin(&path);
                } else {
                    state.spare = Some(path);
                }
            });
        state.making = spawned.ok();
    }

    /// No more spares: the one on its way is waited for, and every spare unpinned (shutdown).
    pub fn close(&self) {
        self.release(true)
    }

    /// Unpin the spare, waiting for one on its way; the next take makes spares again (a node
    /// without pods holds no network namespace).
    pub fn drain(&self) {
        self.release(false)
    }

    fn release(&self, close: bool) {
        let making = {
            let mut state = self.lock();
            state.closed |= close;
            state.making.take()
        };
        if let Some(h) = making {
            let _ = h.join();
        }
        if let Some(spare) = self.lock().spare.take() {
            if let Err(e) = unpin(&spare) {
                tracing::warn!(path = %spare.display(), error = %e, "unpinning the spare network namespace");
            }
        }
    }
}

/// Pins the network namespace of process `pid` at `path` (parent dirs are created). Pinning
/// the same namespace again is a no-op; `path` holding another namespace is `AlreadyExists`.
pub fn pin(pid: u32, path: &Path) -> io::Result<()> {
    pin_path(&proc_netns(pid), path)
}

/// Pins the namespace file `source` (e.g. `/proc/<pid>/ns/net`) at `path`; see [`pin`].
pub fn pin_path(source: &Path, path: &Path) -> io::Result<()> {
    let src = std::fs::metadata(source)?;
    if is_netns(path) {
        let cur = std::fs::metadata(path)?;
        if (cur.dev(), cur.ino()) == (src.dev(), src.ino()) {
            return Ok(());
        }
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} already holds another namespace", path.display()),
        ));
    }
    if let Some(parent) = path.parent() {
        crishim_sys::hostfs::create_private_dir(parent)?;
    }
    let created = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(e),
    };
    if let Err(e) = mount(
        Some(source),
        path,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    ) {
        if created {
            let _ = std::fs::remove_file(path);
        }
        return Err(io::Error::new(
            io::Error::from(e).kind(),
            format!(
                "bind-mounting {} on {}: {e}",
                source.display(),
                path.display()
            ),
        ));
    }
    Ok(())
}

/// Unpins `path`: detaches every namespace mount on it and removes the file. A missing file
/// is fine; a file that is not a namespace is just removed (nothing else is unmounted).
pub fn unpin(path: &Path) -> io::Result<()> {
    // Bounded, in case of stacked pins.
    for _ in 0..16 {
        if !is_netns(path) {
            break;
        }
        match umount2(path, MntFlags::MNT_DETACH) {
            Ok(()) => {}
            Err(Errno::EINVAL) | Err(Errno::ENOENT) => break,
            Err(e) => {
                return Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("unmounting {}: {e}", path.display()),
                ))
            }
        }
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
