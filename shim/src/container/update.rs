//! Update: new cgroup limits for a live container (`UpdateContainerResources`).

use std::path::PathBuf;

use crishim_proto::cgroups_path;
use crishim_proto::shim::{ErrorKind, Response, Status};

use crate::bus::closing_leaked_connections;

use super::{not_found, Shim};

impl Shim {
    /// New cgroup limits for a live container (`UpdateContainerResources`).
    pub fn update(&mut self, id: &str, resources: &oci_spec::runtime::LinuxResources) -> Response {
        use libcgroups::common::{
            create_cgroup_manager, AnyManagerError, CgroupConfig, CgroupManager, ControllerOpt,
            CreateCgroupSetupError,
        };
        let Some(c) = self.containers.get(id) else {
            return not_found(id);
        };
        if c.state.status == Status::Exited {
            return Response::error(
                ErrorKind::FailedPrecondition,
                format!("container {id} has exited"),
            );
        }
        let config = CgroupConfig {
            cgroup_path: PathBuf::from(&c.cgroup),
            systemd_cgroup: cgroups_path::is_systemd(&c.cgroup),
            container_name: id.to_string(),
        };
        let opt = ControllerOpt {
            resources,
            disable_oom_killer: false,
            oom_score_adj: None,
            freezer_state: None,
        };
        let applied = self.in_lean_ns(|| {
            closing_leaked_connections(|| match create_cgroup_manager(config) {
                Ok(m) => m.apply(&opt).map_err(|e| {
                    let kind = match &e {
                        AnyManagerError::Systemd(e) => systemd_error_kind(e),
                        _ => ErrorKind::InvalidArgument,
                    };
                    (kind, e.to_string())
                }),
                Err(e) => Err((
                    match &e {
                        CreateCgroupSetupError::Systemd(e) => systemd_error_kind(e),
                        _ => ErrorKind::InvalidArgument,
                    },
                    e.to_string(),
                )),
            })
        });
        match applied {
            Ok(()) => Response::Ok,
            Err((kind, e)) => Response::error(kind, format!("updating resources of {id}: {e}")),
        }
    }
}

/// systemd's D-Bus API failing or slow is transient (the kubelet retries `Unavailable`); the
/// rest of the systemd driver's errors are about the request.
fn systemd_error_kind(e: &libcgroups::systemd::manager::SystemdManagerError) -> ErrorKind {
    use libcgroups::systemd::manager::SystemdManagerError as E;
    match e {
        E::SystemdClient(_) | E::WaitForProcessInCgroupTimeout(_) => ErrorKind::Unavailable,
        _ => ErrorKind::InvalidArgument,
    }
}
