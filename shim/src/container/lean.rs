//! The lean mount namespace (`crate::lean_ns`) that exec, kill, update and delete run their
//! libcontainer calls in, built from a create's view when one is left, else from the shim's own.

use std::path::{Path, PathBuf};

use crate::lean_ns::{self, LeanNs, Workspace};

use super::Shim;

impl Shim {
    /// Run a libcontainer call that needs none of the pods' mounts (exec, kill, delete) in the
    /// lean mount namespace (`lean_ns`), where its cgroup lookups do not read every pod's mounts.
    /// Where that namespace cannot be built, the call runs in the shim's own.
    pub(super) fn in_lean_ns<T>(&self, f: impl FnOnce() -> T) -> T {
        let lean = self.lean.get_or_init(|| {
            let (drop, work) = self.lean_paths();
            match LeanNs::build(&drop, self.workspace(&work), &self.lean_must_see()) {
                Ok(ns) => Some(ns),
                Err(e) => {
                    eprintln!(
                        "crishim-shim: {e}; exec, kill and delete stay in the shim's namespace"
                    );
                    None
                }
            }
        });
        match lean {
            Some(ns) => ns.enter(f),
            None => f(),
        }
    }

    /// Build the lean namespace from a create's view, if a create left one and none is built
    /// yet: the server calls this once a reply is on its way, when the shim would be idle.
    pub fn build_lean_from_view(&self) {
        let Some(view) = self.pending_view.borrow_mut().take() else {
            return;
        };
        if self.lean.get().is_some() {
            return;
        }
        let Ok(host) = std::fs::File::open("/proc/thread-self/ns/mnt") else {
            return;
        };
        let (drop, work) = self.lean_paths();
        let must_see = self.lean_must_see();
        match LeanNs::build_from(&view, host, &drop, self.workspace(&work), &must_see) {
            Ok(ns) => {
                let _ = self.lean.set(Some(ns));
            }
            // The first exec, kill or delete builds it from the shim's own namespace instead.
            Err(e) => eprintln!("crishim-shim: {e}"),
        }
    }

    fn lean_paths(&self) -> (Vec<PathBuf>, PathBuf) {
        (lean_ns::drop_roots(&self.dir), self.dir.join("lean"))
    }

    fn lean_must_see(&self) -> [&Path; 3] {
        [
            self.dir.as_path(),
            Path::new("/proc/self"),
            Path::new("/sys/fs/cgroup"),
        ]
    }

    /// Where the shim builds a namespace in `dir` (see [`Workspace`]).
    pub(super) fn workspace<'a>(&'a self, dir: &'a Path) -> Workspace<'a> {
        Workspace {
            dir,
            empty: self.empty_mnt.as_ref(),
        }
    }
}
