//! Delete: stop a container and remove its runtime state, cgroup and record.

use std::time::Duration;

use crishim_proto::shim::{paths, Response, Status};
use libcontainer::container::Container;

use crate::bus::closing_leaked_connections;

use super::{internal, wait_exited, Shared};

/// Stop (SIGKILL every process) and remove a container's runtime state and cgroup. Idempotent.
pub async fn delete(shim: &Shared, id: &str) -> Response {
    let running = match shim.borrow().containers.get(id) {
        None => return Response::Ok,
        Some(c) => c.state.status != Status::Exited && c.state.pid != 0,
    };
    if running {
        let _ = shim.borrow_mut().kill(id, libc::SIGKILL, true);
        wait_exited(shim, id, Duration::from_secs(10)).await;
    }
    {
        let s = shim.borrow();
        if let Some(oci) = &s.oci {
            if let Err(e) = oci.delete(id) {
                if oci.knows(id) {
                    return internal(&format!("deleting container {id}"), e);
                }
            }
        }
    }
    let root = shim.borrow().lc_root.join(id);
    if root.exists() {
        let delete = || {
            closing_leaked_connections(|| {
                Container::load(root.clone()).and_then(|mut lc| lc.delete(true))
            })
        };
        // Poststop hooks run with the shim's own view of the mounts.
        let hooks = libcontainer::config::YoukiConfig::load(&root)
            .map_or(true, |c| c.hooks.is_some_and(|h| h.poststop().is_some()));
        let deleted = if hooks {
            delete()
        } else {
            shim.borrow().in_lean_ns(delete)
        };
        if let Err(e) = deleted {
            eprintln!("crishim-shim: libcontainer delete {id}: {e}");
            let _ = std::fs::remove_dir_all(&root);
        }
    }
    let mut s = shim.borrow_mut();
    let _ = std::fs::remove_file(s.dir.join(paths::state_file(id)));
    s.containers.remove(id);
    Response::Ok
}
