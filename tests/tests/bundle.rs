//! `crishim bundle`: plain OCI bundles run like `runc` does, through the shim and libcontainer.
//!
//! Bundles are made the way a user would: the busybox test image is pushed to a real
//! `docker-registry`, copied into an OCI layout with `skopeo copy`, and unpacked with
//! `umoci unpack`. Each test has its own state root (`--root`) and container ids, and checks that
//! nothing is left behind: no state directory, process, cgroup or mount. Whatever a failing test
//! leaves is force-deleted and killed when its [`BundleEnv`] drops.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crishim_tests::daemon::daemon_bin;
use crishim_tests::pods::{cgroup_dirs_where, host_processes, mounts_under, HostProcess};
use crishim_tests::{busybox_image, random_hex, Registry, RegistryOptions};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

/// One test's state root, bundles and OCI layout, all in temporary directories.
struct BundleEnv {
    root: tempfile::TempDir,
    work: tempfile::TempDir,
    /// An empty config file, so that the host's /etc/crishim/config.toml does not apply.
    config: PathBuf,
    /// `oci:LAYOUT:TAG` of the busybox image.
    image: String,
}

impl BundleEnv {
    /// Push busybox to a fresh registry and copy it into an OCI layout with skopeo.
    fn new() -> BundleEnv {
        let root = tempfile::Builder::new()
            .prefix("crishim-bundle-root-")
            .tempdir()
            .unwrap();
        let work = tempfile::Builder::new()
            .prefix("crishim-bundle-work-")
            .tempdir()
            .unwrap();
        let config = root.path().join("config.toml");
        std::fs::write(&config, "").unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let reference = rt.block_on(async {
            let registry = Registry::start(RegistryOptions::default())
                .await
                .expect("starting docker-registry");
            let pushed = registry
                .push("busybox", "latest", &busybox_image())
                .await
                .expect("pushing busybox");
            let image = format!("oci:{}:latest", work.path().join("layout").display());
            tool(
                "skopeo",
                &[
                    "--insecure-policy",
                    "copy",
                    "--src-tls-verify=false",
                    &format!("docker://{}", pushed.tag_ref()),
                    &image,
                ],
            );
            image
        });
        BundleEnv {
            image: reference.trim_start_matches("oci:").to_string(),
            root,
            work,
            config,
        }
    }

    /// `umoci unpack` the image into a new bundle `name`, then let `edit` change its config.
    fn bundle(&self, name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
        let dir = self.work.path().join(name);
        tool(
            "umoci",
            &["unpack", "--image", &self.image, dir.to_str().unwrap()],
        );
        edit_config(&dir, edit);
        dir
    }

    /// `crishim bundle --config … --root … ARGS`
    fn crishim(&self, args: &[&str]) -> Command {
        let mut c = Command::new(daemon_bin());
        c.arg("bundle")
            .arg("--config")
            .arg(&self.config)
            .arg("--root")
            .arg(self.root.path())
            .args(args);
        c
    }

    /// Run to completion with `stdin` as input.
    fn output(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = self
            .crishim(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning crishim");
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin).unwrap();
        drop(input);
        let out = Killed(Some(child)).wait_output();
        eprintln!(
            "crishim bundle {args:?}: {:?}\n  stdout: {:?}\n  stderr: {:?}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
        out
    }

    /// Run; it must succeed. Returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.output(args, b"");
        assert!(out.status.success(), "crishim bundle {args:?} failed");
        text(&out.stdout)
    }

    /// Run; it must fail with a one-line error. Returns that line.
    fn refused(&self, args: &[&str]) -> String {
        let out = self.output(args, b"");
        assert!(
            !out.status.success(),
            "crishim bundle {args:?} should have failed"
        );
        let err = text(&out.stderr);
        let line = err.trim_end();
        assert!(
            line.starts_with("crishim bundle ") && !line.contains('\n'),
            "not one clear line: {err:?}"
        );
        line.to_string()
    }

    fn state(&self, id: &str) -> Value {
        serde_json::from_str(&self.ok(&["state", id])).expect("state is JSON")
    }

    fn state_dir(&self, id: &str) -> PathBuf {
        self.root.path().join("bundles").join(id)
    }

    /// What is left of container `id` (run from `bundle`): its state directory, live processes
    /// of its shim (their command line names the state root), its cgroups, mounts in the bundle.
    fn leftovers(&self, id: &str, bundle: &Path) -> Vec<String> {
        let mut left = Vec::new();
        if self.state_dir(id).exists() {
            left.push(format!("state directory {}", self.state_dir(id).display()));
        }
        let root = self.root.path().to_string_lossy().into_owned();
        for p in host_processes() {
            if !p.is_zombie() && p.command().contains(&root) {
                left.push(format!("process {} {:?}", p.pid, p.command()));
            }
        }
        for c in cgroup_dirs_where(3, |name| name.contains(id)) {
            left.push(format!("cgroup {}", c.display()));
        }
        for m in mounts_under(bundle) {
            left.push(format!("mount {}", m.line));
        }
        left
    }

    #[track_caller]
    fn assert_nothing_left(&self, id: &str, bundle: &Path) {
        // A shim that has just exited may still be finishing its last removals.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut left = self.leftovers(id, bundle);
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            left = self.leftovers(id, bundle);
        }
        assert!(left.is_empty(), "container {id} left behind: {left:#?}");
    }
}

impl Drop for BundleEnv {
    /// Whatever a failed test left: force-delete every container, then kill every process that
    /// still names the state root.
    fn drop(&mut self) {
        let bundles = self.root.path().join("bundles");
        for e in std::fs::read_dir(&bundles).into_iter().flatten().flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            let _ = self
                .crishim(&["delete", "--force", &id])
                .stdin(Stdio::null())
                .output();
        }
        let root = self.root.path().to_string_lossy().into_owned();
        for p in host_processes() {
            if !p.is_zombie() && p.command().contains(&root) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// A child killed (and reaped) on drop, so a failing test leaves no `crishim bundle run`.
struct Killed(Option<Child>);

impl Killed {
    fn pid(&self) -> i32 {
        self.0.as_ref().unwrap().id() as i32
    }

    fn wait(&mut self) -> ExitStatus {
        let child = self.0.as_mut().unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.0 = None;
                return status;
            }
            assert!(Instant::now() < deadline, "crishim bundle run did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_output(mut self) -> Output {
        let mut child = self.0.take().unwrap();
        // Read both pipes while waiting, so a chatty child cannot block on a full pipe.
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = stdout.read_to_end(&mut b);
            b
        });
        let err = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = stderr.read_to_end(&mut b);
            b
        });
        self.0 = Some(child);
        let status = self.wait();
        Output {
            status,
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
        }
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn tool(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e} (hack/install-deps.sh installs it)"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        text(&out.stderr)
    );
}

fn edit_config(bundle: &Path, edit: impl FnOnce(&mut Value)) {
    let path = bundle.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
}

/// `process.args` = ARGS, and no terminal unless asked for.
fn run_args<'a>(args: &'a [&'a str]) -> impl FnOnce(&mut Value) + 'a {
    move |c| {
        c["process"]["args"] = json!(args);
        c["process"]["terminal"] = json!(false);
    }
}

/// Remove a namespace from the config: the container then shares the host's.
fn without_namespace(c: &mut Value, kind: &str) {
    c["linux"]["namespaces"]
        .as_array_mut()
        .unwrap()
        .retain(|n| n["type"] != kind);
}

fn unique_id(what: &str) -> String {
    format!("{what}-{}", random_hex(4))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Read `r` until `needle` appears (returns everything read) or the time is up (panics).
fn read_until(r: &mut impl Read, seen: &mut Vec<u8>, needle: &str) {
    let mut buf = [0u8; 4096];
    while !text(seen).contains(needle) {
        let n = r.read(&mut buf).unwrap();
        assert!(n > 0, "EOF before {needle:?}; got {:?}", text(seen));
        seen.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn run_returns_the_exit_code_of_the_container() {
    let env = BundleEnv::new();
    let id = unique_id("exit");
    let bundle = env.bundle("exit", run_args(&["sh", "-c", "exit 7"]));
    let out = env.output(&["run", bundle.to_str().unwrap(), "--id", &id], b"");
    assert_eq!(out.status.code(), Some(7));
    env.assert_nothing_left(&id, &bundle);

    // Killed by a signal: 128 + the signal, as a shell reports it. (Without a pid namespace, as
    // the init of one ignores signals it has no handler for.)
    let id = unique_id("signaled");
    let bundle = env.bundle("signaled", |c| {
        run_args(&["sh", "-c", "kill -KILL $$"])(c);
        without_namespace(c, "pid");
    });
    let out = env.output(&["run", bundle.to_str().unwrap(), "--id", &id], b"");
    assert_eq!(out.status.code(), Some(128 + libc::SIGKILL));
    env.assert_nothing_left(&id, &bundle);

    // The id defaults to the bundle directory's name.
    let bundle = env.bundle(&unique_id("default-id"), run_args(&["true"]));
    let id = bundle.file_name().unwrap().to_str().unwrap().to_string();
    let out = env.output(&["run", bundle.to_str().unwrap()], b"");
    assert!(out.status.success());
    env.assert_nothing_left(&id, &bundle);
}

#[test]
fn run_attaches_the_callers_stdio() {
    let env = BundleEnv::new();
    let id = unique_id("stdio");
    let bundle = env.bundle(
        "stdio",
        run_args(&[
            "sh",
            "-c",
            "echo to-stdout; echo to-stderr >&2; cat; echo done",
        ]),
    );
    let out = env.output(
        &["run", bundle.to_str().unwrap(), "--id", &id],
        b"from-stdin\n",
    );
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "to-stdout\nfrom-stdin\ndone\n");
    assert_eq!(text(&out.stderr), "to-stderr\n");
    env.assert_nothing_left(&id, &bundle);
}

#[test]
fn signals_sent_to_run_reach_the_container() {
    let env = BundleEnv::new();
    let id = unique_id("signals");
    let script = "trap 'echo got-usr1' USR1; trap 'echo got-term; exit 42' TERM; \
                  echo ready; while :; do sleep 0.1; done";
    let bundle = env.bundle("signals", run_args(&["sh", "-c", script]));
    let mut child = Killed(Some(
        env.crishim(&["run", bundle.to_str().unwrap(), "--id", &id])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let mut stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
    let mut seen = Vec::new();
    read_until(&mut stdout, &mut seen, "ready\n");

    // Meanwhile the container is there for the other commands too.
    let state = env.state(&id);
    assert_eq!(state["status"], "running");
    assert_eq!(
        state["bundle"],
        bundle.canonicalize().unwrap().to_str().unwrap()
    );

    let pid = nix::unistd::Pid::from_raw(child.pid());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1).unwrap();
    read_until(&mut stdout, &mut seen, "got-usr1\n");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait();
    read_until(&mut stdout, &mut seen, "got-term\n");
    assert_eq!(status.code(), Some(42), "the trap's exit code");
    env.assert_nothing_left(&id, &bundle);
}

#[test]
fn orphans_are_reaped_while_the_container_runs() {
    let env = BundleEnv::new();
    let id = unique_id("orphans");
    // Without a pid namespace the orphans' reaper is the shim (a subreaper), not the container's
    // init. Each subshell exits at once, leaving its `sleep` an orphan.
    let script = "for i in $(seq 100); do (sleep 2 &); done; echo forked; sleep 8";
    let bundle = env.bundle("orphans", |c| {
        run_args(&["sh", "-c", script])(c);
        without_namespace(c, "pid");
    });
    let mut child = Killed(Some(
        env.crishim(&["run", bundle.to_str().unwrap(), "--id", &id])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let shim = child.pid();
    let mut stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
    read_until(&mut stdout, &mut Vec::new(), "forked\n");
    let children = |p: &HostProcess| p.ppid == shim && p.command().starts_with("sleep 2");
    let adopted = host_processes().iter().filter(|p| children(p)).count();
    assert!(
        adopted >= 50,
        "only {adopted} of the 100 orphans were the shim's children"
    );

    // The orphans exit after 2 s; the shim must reap them while the container still runs.
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut left;
    loop {
        left = host_processes()
            .into_iter()
            .filter(|p| p.ppid == shim && (p.is_zombie() || p.command().starts_with("sleep 2")))
            .count();
        if left == 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(left, 0, "orphans (zombies or not) still under the shim");
    assert!(
        child.0.as_mut().unwrap().try_wait().unwrap().is_none(),
        "still running"
    );

    assert!(child.wait().success());
    let zombies: Vec<_> = host_processes()
        .into_iter()
        .filter(|p| p.ppid == shim && p.is_zombie())
        .collect();
    assert!(zombies.is_empty(), "zombies: {zombies:?}");
    env.assert_nothing_left(&id, &bundle);
}

#[test]
fn detached_lifecycle_create_start_kill_delete() {
    let env = BundleEnv::new();
    let id = unique_id("detached");
    let script = "echo started; trap 'echo stopping; exit 42' TERM; while :; do sleep 0.1; done";
    let bundle = env.bundle("detached", run_args(&["sh", "-c", script]));
    let log = env.work.path().join("detached.log");
    env.ok(&[
        "create",
        bundle.to_str().unwrap(),
        "--id",
        &id,
        "--log",
        log.to_str().unwrap(),
    ]);

    let state = env.state(&id);
    assert_eq!(state["status"], "created", "{state}");
    assert_eq!(state["id"], id.as_str());
    assert_eq!(
        state["bundle"],
        bundle.canonicalize().unwrap().to_str().unwrap()
    );
    assert!(state["ociVersion"].is_string() && state["created"].is_string());
    let pid = state["pid"].as_i64().unwrap() as i32;
    assert!(pid > 0 && host_processes().iter().any(|p| p.pid == pid));

    env.ok(&["start", &id]);
    let state = env.state(&id);
    assert_eq!(state["status"], "running", "{state}");
    assert_eq!(state["pid"], pid);
    wait_for(|| text(&std::fs::read(&log).unwrap_or_default()).contains(" stdout F started"));
    env.refused(&["delete", &id]);
    assert_eq!(
        env.state(&id)["status"],
        "running",
        "a refused delete changes nothing"
    );

    env.ok(&["kill", &id, "TERM"]);
    wait_for(|| env.state(&id)["status"] == "stopped");
    assert_eq!(env.state(&id)["pid"], 0);
    assert!(text(&std::fs::read(&log).unwrap()).contains(" stdout F stopping"));
    let e = env.refused(&["kill", &id, "KILL"]);
    assert!(e.contains("is stopped"), "{e}");

    env.ok(&["delete", &id]);
    let e = env.refused(&["state", &id]);
    assert_eq!(
        e,
        format!("crishim bundle state: container {id} does not exist")
    );
    env.assert_nothing_left(&id, &bundle);
    assert!(log.exists(), "a log given with --log is the caller's");
}

#[test]
fn delete_force_kills_a_running_container() {
    let env = BundleEnv::new();
    let id = unique_id("force");
    let bundle = env.bundle("force", run_args(&["sleep", "1000"]));
    env.ok(&["create", bundle.to_str().unwrap(), "--id", &id]);
    env.ok(&["start", &id]);
    assert_eq!(env.state(&id)["status"], "running");
    assert!(
        env.state_dir(&id).join("container.log").exists(),
        "default log"
    );
    env.ok(&["delete", "--force", &id]);
    env.assert_nothing_left(&id, &bundle);

    // And a `bundle run` container, from another terminal: its run ends with SIGKILL's code.
    let id = unique_id("force-run");
    let bundle = env.bundle("force-run", run_args(&["sh", "-c", "echo up; sleep 1000"]));
    let mut child = Killed(Some(
        env.crishim(&["run", bundle.to_str().unwrap(), "--id", &id])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let mut stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
    read_until(&mut stdout, &mut Vec::new(), "up\n");
    env.ok(&["delete", "--force", &id]);
    assert_eq!(child.wait().code(), Some(128 + libc::SIGKILL));
    env.assert_nothing_left(&id, &bundle);
}

#[test]
fn a_container_whose_shim_died_is_reported_and_deleted() {
    let env = BundleEnv::new();
    let id = unique_id("orphaned");
    let bundle = env.bundle("orphaned", run_args(&["sleep", "1000"]));
    env.ok(&["create", bundle.to_str().unwrap(), "--id", &id]);
    env.ok(&["start", &id]);
    let pid = env.state(&id)["pid"].as_i64().unwrap() as i32;
    let shim = crishim_proto::shim::pid_file::read(&env.state_dir(&id).join("shim.pid"))
        .unwrap()
        .pid;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shim),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for(|| {
        !host_processes()
            .iter()
            .any(|p| p.pid == shim && !p.is_zombie())
    });

    // The container outlives its shim: still running, and deleted only by force.
    let state = env.state(&id);
    assert_eq!(
        (state["status"].as_str(), state["pid"].as_i64()),
        (Some("running"), Some(pid.into()))
    );
    let e = env.refused(&["delete", &id]);
    assert!(e.contains("is running"), "{e}");
    env.ok(&["delete", "--force", &id]);
    assert!(!host_processes()
        .iter()
        .any(|p| p.pid == pid && !p.is_zombie()));
    env.assert_nothing_left(&id, &bundle);
}

#[test]
fn bad_input_is_refused_and_leaves_nothing() {
    let env = BundleEnv::new();
    let bundles = env.root.path().join("bundles");
    let no_containers = || std::fs::read_dir(&bundles).map(|d| d.count()).unwrap_or(0) == 0;

    let missing = env.work.path().join("missing");
    for cmd in ["run", "create"] {
        let e = env.refused(&[cmd, missing.to_str().unwrap(), "--id", "x"]);
        assert!(
            e.contains(&format!("bundle directory {}", missing.display()))
                && e.contains("No such file"),
            "{e}"
        );
    }
    assert!(no_containers());

    let broken = env.bundle("broken", |_| {});
    std::fs::write(
        broken.join("config.json"),
        "{\"ociVersion\": \"1.0.2\",\n  \"process\": {",
    )
    .unwrap();
    for cmd in ["run", "create"] {
        let e = env.refused(&[cmd, broken.to_str().unwrap(), "--id", "x"]);
        assert!(
            e.contains("config.json: not a valid OCI runtime config") && e.contains("line 2"),
            "{e}"
        );
    }
    std::fs::remove_file(broken.join("config.json")).unwrap();
    let e = env.refused(&["run", broken.to_str().unwrap(), "--id", "x"]);
    assert!(
        e.contains("config.json") && e.contains("No such file"),
        "{e}"
    );
    assert!(no_containers());

    // A program that is not in the rootfs fails in libcontainer, after the cgroup was made.
    let id = unique_id("noprog");
    let noprog = env.bundle("noprog", run_args(&["/no/such/program"]));
    let e = env.refused(&["run", noprog.to_str().unwrap(), "--id", &id]);
    assert!(e.contains("/no/such/program"), "{e}");
    env.assert_nothing_left(&id, &noprog);
    let e = env.refused(&["create", noprog.to_str().unwrap(), "--id", &id]);
    assert!(e.contains("/no/such/program"), "{e}");
    env.assert_nothing_left(&id, &noprog);

    let e = env.refused(&["run", noprog.to_str().unwrap(), "--id", "../escape"]);
    assert!(e.contains("invalid container id"), "{e}");
    assert!(no_containers());

    // An existing id: refused by create and run alike, and the existing container is untouched.
    let id = unique_id("dup");
    let dup = env.bundle("dup", run_args(&["sleep", "1000"]));
    env.ok(&["create", dup.to_str().unwrap(), "--id", &id]);
    let state = env.state(&id);
    for cmd in ["create", "run"] {
        let e = env.refused(&[cmd, dup.to_str().unwrap(), "--id", &id]);
        assert!(e.contains(&format!("container {id} already exists")), "{e}");
    }
    assert_eq!(env.state(&id), state);
    env.ok(&["delete", &id]);
    env.assert_nothing_left(&id, &dup);

    let unknown = unique_id("unknown");
    for args in [
        vec!["start", &unknown],
        vec!["state", &unknown],
        vec!["kill", &unknown],
        vec!["delete", &unknown],
        vec!["delete", "--force", &unknown],
    ] {
        let e = env.refused(&args);
        assert!(
            e.ends_with(&format!("container {unknown} does not exist")),
            "{e}"
        );
    }
    let e = env.refused(&["kill", &unknown, "NOSUCHSIGNAL"]);
    assert!(e.contains("unknown signal"), "{e}");
    assert!(no_containers());
}

#[test]
fn spec_writes_a_config_that_runs() {
    let env = BundleEnv::new();
    // A busybox rootfs with no config yet.
    let bundle = env.bundle("spec", |_| {});
    std::fs::remove_file(bundle.join("config.json")).unwrap();
    env.ok(&["spec", bundle.to_str().unwrap()]);
    let e = env.refused(&["spec", bundle.to_str().unwrap()]);
    assert!(e.contains("already exists"), "{e}");
    let config: Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["process"]["args"], json!(["sh"]));
    assert_eq!(config["process"]["terminal"], true);
    assert_eq!(config["root"]["path"], "rootfs");

    // As written: `sh` on a terminal, which crishim relays to our (non-terminal) stdin and stdout.
    let id = unique_id("spec");
    let out = env.output(
        &["run", bundle.to_str().unwrap(), "--id", &id],
        b"echo from-$((6*7)); exit 5\n",
    );
    assert_eq!(out.status.code(), Some(5));
    assert!(
        text(&out.stdout).contains("from-42\r\n"),
        "{:?}",
        text(&out.stdout)
    );
    env.assert_nothing_left(&id, &bundle);
}

#[test]
fn terminal_runs_on_the_callers_tty() {
    let env = BundleEnv::new();
    let id = unique_id("tty");
    let script = "stty size; trap 'stty size' WINCH; echo ready; \
                  while :; do if read -t 1 x; then echo got-$x; exit 6; fi; done";
    let bundle = env.bundle("tty", |c| {
        run_args(&["sh", "-c", script])(c);
        c["process"]["terminal"] = json!(true);
    });
    let pty = nix::pty::openpty(None, None).unwrap();
    set_size(&pty.master, 33, 101);
    let before = nix::sys::termios::tcgetattr(&pty.slave).unwrap();
    let mut cmd = env.crishim(&["run", bundle.to_str().unwrap(), "--id", &id]);
    cmd.stdin(pty.slave.try_clone().unwrap())
        .stdout(pty.slave.try_clone().unwrap())
        .stderr(pty.slave.try_clone().unwrap());
    // SAFETY: setsid and ioctl are async-signal-safe. The pty becomes the controlling terminal of
    // a new session, as a login shell's: resizing it sends SIGWINCH to crishim.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = Killed(Some(cmd.spawn().unwrap()));
    let mut master = std::fs::File::from(pty.master);
    let mut seen = Vec::new();
    read_until_timeout(&mut master, &mut seen, "ready");
    assert!(
        text(&seen).contains("33 101"),
        "initial size: {:?}",
        text(&seen)
    );
    let raw = nix::sys::termios::tcgetattr(&pty.slave).unwrap();
    assert!(
        !raw.local_flags
            .contains(nix::sys::termios::LocalFlags::ICANON),
        "the caller's terminal is raw while the container runs"
    );

    set_size(&master, 40, 120);
    read_until_timeout(&mut master, &mut seen, "40 120");
    master.write_all(b"q\r").unwrap();
    read_until_timeout(&mut master, &mut seen, "got-q");
    assert_eq!(child.wait().code(), Some(6));
    let after = nix::sys::termios::tcgetattr(&pty.slave).unwrap();
    assert_eq!(
        (after.local_flags, after.input_flags, after.output_flags),
        (before.local_flags, before.input_flags, before.output_flags),
        "the caller's terminal mode is restored"
    );
    env.assert_nothing_left(&id, &bundle);
}

fn set_size(fd: &impl AsRawFd, rows: u16, cols: u16) {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize struct.
    assert_eq!(
        unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &size) },
        0
    );
}

/// [`read_until`] on a pty master, which would block forever rather than end.
fn read_until_timeout(master: &mut std::fs::File, seen: &mut Vec<u8>, needle: &str) {
    let deadline = Instant::now() + WAIT;
    let mut buf = [0u8; 4096];
    while !text(seen).contains(needle) {
        let mut pfd = libc::pollfd {
            fd: master.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd that we own.
        let ready = unsafe { libc::poll(&mut pfd, 1, 100) };
        assert!(
            Instant::now() < deadline,
            "no {needle:?} on the terminal; got {:?}",
            text(seen)
        );
        if ready > 0 {
            let n = master.read(&mut buf).unwrap();
            seen.extend_from_slice(&buf[..n]);
        }
    }
}

fn wait_for(mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out");
        std::thread::sleep(Duration::from_millis(50));
    }
}
