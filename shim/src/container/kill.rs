//! Kill: signal a container's init, or all its processes.

use crishim_proto::shim::{ErrorKind, Response, Status};
use libcontainer::container::Container;

use crate::bus::closing_leaked_connections;

use super::{internal, not_found, Shim};

impl Shim {
    pub fn kill(&mut self, id: &str, signal: i32, all: bool) -> Response {
        let Some(c) = self.containers.get(id) else {
            return not_found(id);
        };
        // Created with no process (see `start_error`): signalled, it will never run, so it is
        // recorded exited now (else a stop would wait for an exit that cannot come).
        if let Some(e) = c.start_error.clone() {
            self.fail_start(id, e);
            return Response::Ok;
        }
        if c.state.status == Status::Exited || c.state.pid == 0 {
            return Response::Ok;
        }
        if let Some(oci) = &self.oci {
            if !(1..=64).contains(&signal) {
                return Response::error(
                    ErrorKind::InvalidArgument,
                    format!("signal {signal} is not a signal number"),
                );
            }
            return match oci.kill(id, signal, all) {
                Ok(()) => Response::Ok,
                // Exited between our check and the kill: nothing left to signal.
                Err(_) if !oci.knows(id) || !pid_alive(c.state.pid) => Response::Ok,
                Err(e) => internal(&format!("signalling container {id}"), e),
            };
        }
        let sig = match libcontainer::signal::Signal::try_from(signal) {
            Ok(s) => s,
            Err(e) => {
                return Response::error(ErrorKind::InvalidArgument, format!("signal {signal}: {e}"))
            }
        };
        let kill = || {
            closing_leaked_connections(|| {
                Container::load(self.lc_root.join(id)).and_then(|mut lc| lc.kill(sig, all))
            })
        };
        // Only a kill of all processes looks up the cgroups.
        let killed = if all { self.in_lean_ns(kill) } else { kill() };
        match killed {
            Ok(()) => Response::Ok,
            // Exited between our check and the kill: nothing left to signal.
            Err(libcontainer::error::LibcontainerError::IncorrectStatus(_)) => Response::Ok,
            Err(e) => internal(&format!("signalling container {id}"), e),
        }
    }
}

/// Whether `pid` is a live (not yet reaped, not zombie) process.
fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}
