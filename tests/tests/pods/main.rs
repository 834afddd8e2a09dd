//! The CRI RuntimeService of the `crishim` daemon: pods and containers, run for real (busybox
//! from a real `docker-registry`, pulled through the daemon), observed from the host. A module
//! per topic; the helpers that several of them use are here.
//!
//! Every test starts its own registry and daemon (tests run in parallel) and uses unique pod
//! names. Every test that runs a pod ends with
//! [`assert_no_leaks`](crishim_tests::pods::assert_no_leaks) for it: no process, mount, cgroup,
//! network namespace or state file of the pod is left. The daemon binary is `$CRISHIM_BIN` or
//! `target/<profile>/crishim` (`cargo build -p crishim -p crishim-shim`).

mod errors;
mod exec_sync;
mod lifecycle;
mod logs;
mod metrics;
mod mount_namespaces;
mod mount_propagation;
mod pid_namespace;
mod runtime_basics;
mod shims;
mod stop_remove;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crishim_proto::cri;
use crishim_tests::fsutil::walk;
use crishim_tests::pods::{host_processes, is_id, mounts_under, HostProcess, PodEnv};
use crishim_tests::Daemon;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(30);

#[track_caller]
fn assert_code<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected {code:?}, got Ok({v:?})"),
        Err(e) => assert_eq!(e.code(), code, "{what}: unexpected status {e:?}"),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The live `crishim-shim start` processes of this daemon (command line holds its state dir).
fn shims(d: &Daemon) -> Vec<HostProcess> {
    let state = d.state_dir().to_string_lossy().into_owned();
    host_processes()
        .into_iter()
        .filter(|p| {
            !p.is_zombie()
                && p.cmdline
                    .first()
                    .is_some_and(|a| a.ends_with("crishim-shim"))
                && p.cmdline.get(1).is_some_and(|a| a == "start")
                && p.command().contains(&state)
        })
        .collect()
}

/// Poll until none of `procs` is alive; returns those still alive after `timeout`.
async fn wait_gone(procs: &[HostProcess], timeout: Duration) -> Vec<HostProcess> {
    let deadline = Instant::now() + timeout;
    loop {
        let alive: Vec<_> = procs.iter().filter(|p| p.is_alive()).cloned().collect();
        if alive.is_empty() || Instant::now() > deadline {
            return alive;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A temporary host directory made a shared mount (`mount --bind D D; mount --make-shared D`);
/// everything mounted at or below it is lazily unmounted on drop.
struct SharedDir {
    dir: tempfile::TempDir,
}

impl SharedDir {
    fn new() -> Self {
        use nix::mount::{mount, MsFlags};
        let dir = tempfile::Builder::new()
            .prefix("crishim-shared-")
            .tempdir()
            .unwrap();
        let p = dir.path();
        mount(Some(p), p, None::<&str>, MsFlags::MS_BIND, None::<&str>).expect("mount --bind");
        mount(
            None::<&str>,
            p,
            None::<&str>,
            MsFlags::MS_SHARED,
            None::<&str>,
        )
        .expect("mount --make-shared");
        SharedDir { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn unmount_all(&self) {
        for _ in 0..10 {
            let mut left = mounts_under(self.path());
            if left.is_empty() {
                return;
            }
            left.sort_by_key(|m| std::cmp::Reverse(m.mount_point.len()));
            for m in left {
                let _ =
                    nix::mount::umount2(m.mount_point.as_str(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

impl Drop for SharedDir {
    fn drop(&mut self) {
        self.unmount_all();
    }
}

/// A host directory mounted into a container with `propagation`.
fn volume(container_path: &str, host: &Path, propagation: cri::MountPropagation) -> cri::Mount {
    cri::Mount {
        container_path: container_path.to_string(),
        host_path: host.to_string_lossy().into_owned(),
        propagation: propagation as i32,
        ..Default::default()
    }
}

/// Run a pod of `cfg` with one `sleep` container that mounts `host` at `container_path`;
/// returns the pod's id and the container's.
async fn pod_with_a_volume(
    env: &PodEnv,
    cfg: &cri::PodSandboxConfig,
    container_path: &str,
    host: &Path,
    propagation: cri::MountPropagation,
) -> (String, String) {
    let d = &env.d;
    let pod = d.run_pod(cfg).await.expect("RunPodSandbox");
    let mut c = env.container_config("main", &["sleep", "1000"]);
    c.mounts = vec![volume(container_path, host, propagation)];
    let id = d.run_container(&pod, &c, cfg).await.expect("run container");
    (pod, id)
}

/// A new directory `dir` with a 1 MiB tmpfs named `source` mounted on it (on the host).
fn mount_tmpfs(dir: &Path, source: &str) {
    std::fs::create_dir(dir).unwrap();
    nix::mount::mount(
        Some(source),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .expect("mounting a tmpfs on the host");
}

/// Paths under the daemon's state and root dirs with a 64-hex-character component.
fn id_named_paths(d: &Daemon) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for root in [d.state_dir(), d.root_dir()] {
        for p in walk(&root) {
            let rel = p.strip_prefix(&root).unwrap_or(&p);
            if rel
                .components()
                .any(|c| is_id(&c.as_os_str().to_string_lossy()))
            {
                out.insert(p);
            }
        }
    }
    out
}

/// The daemon's id-named files and the mounts under its directory, to compare before and after
/// something that must leave nothing.
struct Footprint {
    paths: BTreeSet<PathBuf>,
    mounts: BTreeSet<String>,
}

impl Footprint {
    fn of(d: &Daemon) -> Footprint {
        Footprint {
            paths: id_named_paths(d),
            mounts: mounts_under(d.dir()).into_iter().map(|m| m.line).collect(),
        }
    }

    /// Asserts `d` has no file or mount that was not there before; `what` names the cause.
    fn assert_nothing_new(&self, d: &Daemon, what: &str) {
        let now = Footprint::of(d);
        let paths: Vec<_> = now.paths.difference(&self.paths).collect();
        assert!(paths.is_empty(), "{what} left files: {paths:#?}");
        let mounts: Vec<_> = now.mounts.difference(&self.mounts).collect();
        assert!(mounts.is_empty(), "{what} left mounts: {mounts:#?}");
    }
}
