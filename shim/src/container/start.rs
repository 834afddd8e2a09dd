//! Start: run a created container's process, or record why it cannot run.

use crishim_proto::shim::{ErrorKind, Response, Status, START_ERROR, START_ERROR_EXIT_CODE};
use libcontainer::container::Container;

use crate::bus::closing_leaked_connections;
use crate::record::now_nanos;

use super::{not_found, Shim};

impl Shim {
    pub fn start(&mut self, id: &str) -> Response {
        let Some(c) = self.containers.get(id) else {
            return not_found(id);
        };
        if c.state.status != Status::Created {
            return Response::error(
                ErrorKind::FailedPrecondition,
                format!(
                    "container {id} is {:?}, only a created container can start",
                    c.state.status
                ),
            );
        }
        if let Some(e) = c.start_error.clone() {
            return self.fail_start(id, e);
        }
        let started = match &self.oci {
            Some(oci) => oci.start(id),
            None => closing_leaked_connections(|| {
                Container::load(self.lc_root.join(id)).and_then(|mut lc| lc.start())
            })
            .map_err(|e| e.to_string()),
        };
        if let Err(e) = started {
            return Response::error(
                ErrorKind::FailedPrecondition,
                format!("starting container {id}: {e}"),
            );
        }
        let c = self.containers.get_mut(id).expect("checked above");
        // It may already have exited and been reaped in between; keep that.
        if c.state.status == Status::Created {
            c.state.status = Status::Running;
        }
        c.state.started_at = now_nanos();
        let state = c.state.clone();
        self.persist(&state);
        Response::State(state)
    }

    /// Record a container whose process could not start as exited, and answer with that state.
    pub(super) fn fail_start(&mut self, id: &str, message: String) -> Response {
        let Some(c) = self.containers.get_mut(id) else {
            return not_found(id);
        };
        c.start_error = None;
        c.state.status = Status::Exited;
        c.state.exit_code = START_ERROR_EXIT_CODE;
        c.state.finished_at = now_nanos();
        c.state.reason = START_ERROR.into();
        c.state.message = message;
        let state = c.state.clone();
        self.record_exit(&state);
        Response::State(state)
    }
}
