//! An exec'd process of a container in a pod with its own user namespace.
//!
//! libcontainer 0.7's exec (tenant) path joins the container's namespaces but not its user
//! namespace, so such a process would run as the host's root in them. The shim gives it the
//! host's root to start with (the user namespace's owner, which may join it), and the executor
//! joins the pod's user namespace as its last steps before `execve`: it checks that the
//! namespace at `/proc/1/ns/user` (the container's pid 1, or the pod's infra process) is the
//! pod's, joins it, takes the container's user there, and the caller then loads the seccomp
//! filter and drops to the container's capabilities (joining grants every capability there).

use std::os::unix::fs::MetadataExt as _;

use nix::unistd::{Gid, Uid};

/// The pod's user namespace, and the user the exec'd process runs as in it.
#[derive(Clone, Debug)]
pub struct UsernsJoin {
    /// The namespace's (device, inode), as the shim saw it.
    pub expected: (u64, u64),
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl UsernsJoin {
    /// For a container whose spec joins the user namespace at `path`: the process's user is
    /// taken out of `process` (which starts as the host's root) and kept for [`Self::enter`].
    pub fn prepare(
        path: &std::path::Path,
        process: &mut oci_spec::runtime::Process,
    ) -> std::io::Result<Self> {
        let meta = std::fs::metadata(path)?;
        let user = process.user().clone();
        let join = UsernsJoin {
            expected: (meta.dev(), meta.ino()),
            uid: user.uid(),
            gid: user.gid(),
            groups: user.additional_gids().clone().unwrap_or_default(),
        };
        let mut root = user;
        root.set_uid(0).set_gid(0).set_additional_gids(None);
        process.set_user(root);
        Ok(join)
    }

    /// Join the namespace and become the process's user in it, with every capability there
    /// still effective (the caller drops to the container's own).
    pub fn enter(&self) -> Result<(), String> {
        let ns = std::fs::File::open("/proc/1/ns/user")
            .map_err(|e| format!("opening the pod's user namespace: {e}"))?;
        let meta = ns
            .metadata()
            .map_err(|e| format!("reading the pod's user namespace: {e}"))?;
        if (meta.dev(), meta.ino()) != self.expected {
            return Err("/proc/1/ns/user is not the pod's user namespace".into());
        }
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWUSER)
            .map_err(|e| format!("joining the pod's user namespace: {e}"))?;
        drop(ns);
        let groups: Vec<Gid> = self.groups.iter().map(|g| Gid::from_raw(*g)).collect();
        let gid = Gid::from_raw(self.gid);
        let uid = Uid::from_raw(self.uid);
        nix::unistd::setgroups(&groups)
            .and_then(|()| nix::unistd::setresgid(gid, gid, gid))
            .map_err(|e| format!("taking gid {} in the pod's user namespace: {e}", self.gid))?;
        // Keep the permitted set across the uid change; the effective one is raised again.
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) };
        nix::unistd::setresuid(uid, uid, uid)
            .map_err(|e| format!("taking uid {} in the pod's user namespace: {e}", self.uid))?;
        let permitted = caps::read(None, caps::CapSet::Permitted)
            .map_err(|e| format!("reading capabilities: {e}"))?;
        caps::set(None, caps::CapSet::Effective, &permitted)
            .map_err(|e| format!("raising capabilities: {e}"))?;
        Ok(())
    }
}
