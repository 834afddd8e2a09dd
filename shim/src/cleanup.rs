//! `crishim-shim cleanup --dir DIR`: what is left when a pod's shim died. Kills every container of
//! the pod (through libcontainer, so cgroups go too) and its infra process, and records the
//! containers as exited with the reason, so no process, cgroup or stale "running" record remains.

use std::path::{Path, PathBuf};

use crishim_proto::shim::{paths, ContainerState, Status};
use libcontainer::container::Container;

use crate::oci_runtime::OciRuntime;
use crate::record::{now_nanos, write_atomic};

pub fn run(args: &[String]) -> ! {
    let dir = match args {
        [flag, dir] if flag == "--dir" => PathBuf::from(dir),
        _ => {
            eprintln!("usage: crishim-shim cleanup --dir DIR");
            std::process::exit(2);
        }
    };
    let failures = cleanup(&dir);
    std::process::exit(if failures == 0 { 0 } else { 1 })
}

fn cleanup(dir: &Path) -> usize {
    let mut failures = 0;
    if let Some(oci) = oci_runtime(dir) {
        // The runtime's state is shared by every pod that uses it: only this pod's containers,
        // which have state files here, are deleted.
        for id in recorded_containers(dir) {
            if let Err(e) = oci.delete(&id) {
                if oci.knows(&id) {
                    eprintln!("crishim-shim cleanup: {id}: {e}");
                    failures += 1;
                }
            }
            mark_exited(dir, &id);
        }
    }
    let lc_root = dir.join("runc");
    for entry in std::fs::read_dir(&lc_root).into_iter().flatten().flatten() {
        let id = entry.file_name().to_string_lossy().into_owned();
        let deleted = crate::bus::closing_leaked_connections(|| {
            Container::load(entry.path()).and_then(|mut c| c.delete(true))
        });
        match deleted {
            Ok(()) => {}
            Err(e) => {
                eprintln!("crishim-shim cleanup: {id}: {e}");
                failures += 1;
            }
        }
        mark_exited(dir, &id);
    }
    if let Some(infra) = crishim_proto::shim::pid_file::read(&dir.join(paths::INFRA_PID)) {
        crishim_proto::shim::kill_if_ours(&infra);
    }
    failures
}

/// The pod's external runtime, if its shim was started with one.
fn oci_runtime(dir: &Path) -> Option<OciRuntime> {
    let raw = std::fs::read(dir.join(paths::OCI_RUNTIME)).ok()?;
    let spec = serde_json::from_slice(&raw)
        .map_err(|e| eprintln!("crishim-shim cleanup: {}: {e}", paths::OCI_RUNTIME))
        .ok()?;
    OciRuntime::new(spec, dir)
        .map_err(|e| eprintln!("crishim-shim cleanup: {e}"))
        .ok()
}

/// The ids of the containers with a state file in `dir`.
fn recorded_containers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".state.json")
                .map(str::to_owned)
        })
        .collect()
}

/// A container that was still running when its shim died ends with SIGKILL, and says why.
fn mark_exited(dir: &Path, id: &str) {
    let path = dir.join(paths::state_file(id));
    let Ok(raw) = std::fs::read(&path) else {
        return;
    };
    let Ok(mut state) = serde_json::from_slice::<ContainerState>(&raw) else {
        return;
    };
    if state.status == Status::Exited {
        return;
    }
    state.status = Status::Exited;
    state.exit_code = 128 + libc::SIGKILL;
    state.finished_at = now_nanos();
    state.message = "the pod's shim died; the container was killed".into();
    if let Ok(json) = serde_json::to_vec(&state) {
        let _ = write_atomic(&path, &json);
    }
}
