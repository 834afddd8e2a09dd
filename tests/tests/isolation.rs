//! Host files are root's alone, tried as a host user would: `nobody` (uid 65534) walks the
//! daemon's `root_dir` and `state_dir` with a pod running, and tries to execute a setuid-root
//! binary and open a device node that a pulled layer holds. A daemon started on a loose tree
//! tightens it, and a damaged record is quarantined without costing its pod's files.
//!
//! The daemon's temporary directory is made 0755 first, so that only the daemon's own modes stand
//! between `nobody` and its files.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crishim_proto::cri;
use crishim_tests::fsutil::{snapshot_dirs, walk};
use crishim_tests::image::{busybox_layer, host_busybox, Image, LayerBuilder};
use crishim_tests::pods::{
    assert_no_leaks, container_security, marker, sh_container, wait_for_log_line, PodEnv,
    PodTraces, LOOP_UNTIL_TERM,
};
use crishim_tests::Compression;

const NOBODY: &str = "65534";

/// Run `sh -c script sh args…` as uid and gid 65534 with no supplementary groups (and so no
/// capabilities), feeding `stdin`.
fn as_nobody(script: &str, args: &[&Path], stdin: &str) -> Output {
    use std::io::Write as _;
    let mut child = Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
        .args(["/bin/sh", "-c", script, "sh"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running setpriv (util-linux)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .mode()
        & 0o7777
}

fn set_mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// Let other users traverse the daemon's temporary directory (tempfile makes it 0700).
fn open_daemon_dir(env: &PodEnv) {
    set_mode(env.d.dir(), 0o755);
}

/// The paths (of `paths`) that `nobody` can see at all: `lstat` succeeds.
fn seen_by_nobody(paths: &[PathBuf]) -> Vec<String> {
    let list: String = paths.iter().map(|p| format!("{}\n", p.display())).collect();
    let out = as_nobody(
        r#"while IFS= read -r p; do if [ -e "$p" ] || [ -L "$p" ]; then echo "$p"; fi; done"#,
        &[],
        &list,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).lines().map(str::to_string).collect()
}

/// Whether `p` lies inside content that is the image's or the container's (a snapshot, an upper
/// dir, a mounted root filesystem or /dev/shm), whose modes are theirs.
fn is_content(root_dir: &Path, state_dir: &Path, p: &Path) -> bool {
    // A snapshot's root and everything in it, but not the staging directory `tmp`.
    let snapshot = p
        .strip_prefix(root_dir.join("images/snapshots"))
        .is_ok_and(|rest| {
            rest.components()
                .next()
                .is_some_and(|c| c.as_os_str() != "tmp")
        });
    let layer = p
        .strip_prefix(root_dir.join("images/containers"))
        .is_ok_and(|rest| {
            rest.components()
                .nth(1)
                .is_some_and(|c| c.as_os_str() == "upper")
        });
    let rootfs = p
        .strip_prefix(state_dir.join("containers"))
        .is_ok_and(|rest| {
            rest.components()
                .nth(1)
                .is_some_and(|c| c.as_os_str() == "rootfs")
        });
    let shm = p.strip_prefix(state_dir.join("pods")).is_ok_and(|rest| {
        rest.components()
            .nth(1)
            .is_some_and(|c| c.as_os_str() == "shm")
    });
    snapshot || layer || rootfs || shm
}

#[tokio::test]
async fn nobody_cannot_run_a_setuid_binary_or_open_a_device_from_a_layer() {
    let env = PodEnv::start().await;
    let bb = std::fs::read(host_busybox()).expect("reading the host's static busybox");
    let hostile = LayerBuilder::new()
        .dir("opt", 0o755)
        .dir("opt/suid", 0o755)
        .file_owned("opt/suid/busybox", bb, 0o4755, 0, 0)
        .dir("opt/dev", 0o755)
        .char_device("opt/dev/null", 1, 3, 0o666)
        .build(Compression::Gzip);
    env.push_and_pull("setuid", &Image::new(vec![busybox_layer(), hostile]))
        .await;
    open_daemon_dir(&env);
    let root_dir = env.d.root_dir();

    // As root: the files are there, as the layer made them.
    let found = |name: &str| -> PathBuf {
        snapshot_dirs(&root_dir)
            .iter()
            .map(|s| s.join(name))
            .find(|p| p.symlink_metadata().is_ok())
            .unwrap_or_else(|| panic!("no {name} in any snapshot"))
    };
    let suid = found("opt/suid/busybox");
    let dev = found("opt/dev/null");
    let md = suid.symlink_metadata().unwrap();
    assert_eq!(md.uid(), 0, "the binary is root's");
    assert_eq!(md.mode() & 0o7777, 0o4755, "and setuid");
    let md = dev.symlink_metadata().unwrap();
    assert_eq!(md.mode() & libc::S_IFMT, libc::S_IFCHR, "a device node");
    assert_eq!(md.rdev(), libc::makedev(1, 3));

    let run = r#""$1" id -u; echo "rc=$?""#;
    let open = r#"if exec 3<"$1"; then echo opened; fi"#;
    let (exec, read) = (as_nobody(run, &[&suid], ""), as_nobody(open, &[&dev], ""));
    assert!(
        text(&exec.stderr).contains("Permission denied") && !text(&exec.stdout).contains("rc=0"),
        "nobody ran the setuid binary: {exec:?}"
    );
    assert!(
        text(&read.stderr).contains("Permission denied") && !text(&read.stdout).contains("opened"),
        "nobody opened the device: {read:?}"
    );
    assert_eq!(mode(&root_dir), 0o700);
    for d in ["images", "images/snapshots"] {
        assert_eq!(mode(&root_dir.join(d)), 0o700, "{d}");
    }

    // Control: with the directories above the snapshot as loose as they used to be (0755), the
    // same probes get in, so it is the modes that stop them.
    for d in [
        root_dir.clone(),
        root_dir.join("images"),
        root_dir.join("images/snapshots"),
    ] {
        set_mode(&d, 0o755);
    }
    let (exec, read) = (as_nobody(run, &[&suid], ""), as_nobody(open, &[&dev], ""));
    assert!(text(&exec.stdout).contains("rc=0"), "control: {exec:?}");
    assert!(text(&read.stdout).contains("opened"), "control: {read:?}");
    eprintln!(
        "with 0755 directories, nobody ran the setuid busybox: `id -u` printed {:?}",
        text(&exec.stdout)
    );
    set_mode(&root_dir, 0o700);
    env.stop();
}

#[tokio::test]
async fn nobody_sees_nothing_under_root_dir_and_state_dir() {
    let env = PodEnv::start().await;
    let pod_cfg = env.pod_config("walk");
    // A non-root container, with a secret in its environment.
    let script = format!("id -u; {LOOP_UNTIL_TERM}");
    let mut c = sh_container(&env, "app", &script, &marker("walk"));
    c.envs.push(cri::KeyValue {
        key: "SECRET".into(),
        value: "hunter2".into(),
    });
    container_security(&mut c).run_as_user = Some(cri::Int64Value { value: 65534 });
    let (pod, ctr, traces) = env.run_traced(&pod_cfg, &c).await;
    // It still works as that user: its root, /tmp, the pod's files, exec and logs.
    let out = env
        .d
        .exec_ok(
            &ctr,
            &[
                "sh",
                "-c",
                "id -u; ls / >/dev/null && echo x > /tmp/x && cat /tmp/x /etc/hostname",
            ],
        )
        .await;
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["65534", "x", "walk"],
        "{out}"
    );
    let log = Path::new(&pod_cfg.log_directory).join(&c.log_path);
    wait_for_log_line(&log, "stdout", "65534", Duration::from_secs(10)).await;

    open_daemon_dir(&env);
    let (root_dir, state_dir) = (env.d.root_dir(), env.d.state_dir());
    for d in [&root_dir, &state_dir] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
        let ls = as_nobody(r#"ls "$1""#, &[d], "");
        assert!(
            !ls.status.success(),
            "nobody listed {}: {ls:?}",
            d.display()
        );
    }
    let all: Vec<PathBuf> = walk(&root_dir)
        .into_iter()
        .chain(walk(&state_dir))
        .collect();
    assert!(all.len() > 20, "the walk found the pod's files: {all:?}");
    let seen = seen_by_nobody(&all);
    assert!(seen.is_empty(), "nobody can see: {seen:#?}");

    // Every directory of the runtime's own is 0700; records, config.json and exec specs 0600.
    let mut private_files = 0;
    for p in &all {
        if is_content(&root_dir, &state_dir, p) {
            continue;
        }
        let md = p.symlink_metadata().unwrap();
        let name = p.file_name().unwrap().to_string_lossy();
        if md.is_dir() {
            assert_eq!(md.mode() & 0o077, 0, "{} is open to others", p.display());
        } else if name.ends_with(".json") || name == "journal" {
            assert_eq!(md.mode() & 0o7777, 0o600, "{}", p.display());
            private_files += 1;
        }
    }
    let bundle = state_dir.join("containers").join(&ctr);
    assert_eq!(mode(&bundle.join("config.json")), 0o600);
    assert_eq!(mode(&root_dir.join("records/pods/journal")), 0o600);
    assert_eq!(mode(&root_dir.join("records/containers/journal")), 0o600);
    assert!(
        private_files >= 4,
        "the journals and config.json were checked"
    );
    // The roots of what the container sees keep their image modes.
    let upper = root_dir.join("images/containers").join(&ctr).join("upper");
    assert_eq!(
        mode(&upper),
        0o755,
        "the container's / is traversable by its user"
    );

    env.finish_pod(&pod, traces).await;
}

#[tokio::test]
async fn a_daemon_started_on_a_loose_tree_tightens_it() {
    let mut env = PodEnv::start().await;
    let pod_cfg = env.pod_config("loose");
    let c = sh_container(&env, "app", LOOP_UNTIL_TERM, &marker("loose"));
    let (pod, ctr, traces) = env.run_traced(&pod_cfg, &c).await;
    env.d.kill();

    let (root, state) = (env.d.root_dir(), env.d.state_dir());
    let dirs: Vec<PathBuf> = [
        root.clone(),
        root.join("records"),
        root.join("records/pods"),
        root.join("records/containers"),
        root.join("images"),
        root.join("images/blobs/sha256"),
        root.join("images/snapshots"),
        root.join("images/containers"),
        root.join("images/containers").join(&ctr),
        root.join("images/containers").join(&ctr).join("work"),
        state.clone(),
        state.join("pods"),
        state.join("pods").join(&pod),
        state.join("pods").join(&pod).join("runc"),
        state.join("pod-files"),
        state.join("pod-files").join(&pod),
        state.join("containers"),
        state.join("containers").join(&ctr),
    ]
    .into();
    let files: Vec<PathBuf> = [
        root.join("records/pods/journal"),
        root.join("records/containers/journal"),
        root.join("images/meta.redb"),
        state.join("containers").join(&ctr).join("config.json"),
    ]
    .into();
    for d in &dirs {
        set_mode(d, 0o755);
    }
    for f in &files {
        set_mode(f, 0o644);
    }
    let upper = root.join("images/containers").join(&ctr).join("upper");
    let snapshots = snapshot_dirs(&root);
    let content: Vec<(PathBuf, u32)> = snapshots
        .iter()
        .chain([&upper])
        .map(|p| (p.clone(), mode(p)))
        .collect();

    env.d.restart().await.expect("restarting the daemon");
    for d in &dirs {
        assert_eq!(mode(d), 0o700, "{} was not tightened", d.display());
    }
    for f in &files {
        assert_eq!(mode(f), 0o600, "{} was not tightened", f.display());
    }
    for (p, m) in &content {
        assert_eq!(mode(p), *m, "content {} was changed", p.display());
    }
    assert!(
        env.d.log_text().contains("tightened"),
        "the daemon says what it tightened"
    );
    // The pod runs on.
    assert_eq!(env.d.exec_ok(&ctr, &["echo", "ok"]).await.trim(), "ok");
    env.finish_pod(&pod, traces).await;
}

/// A pod named `name` with one `sh` container that loops until SIGTERM.
async fn run_sleeper(env: &PodEnv, name: &str) -> (String, String, PodTraces) {
    let pod_cfg = env.pod_config(name);
    let c = sh_container(env, name, LOOP_UNTIL_TERM, &marker(name));
    env.run_traced(&pod_cfg, &c).await
}

#[tokio::test]
async fn corrupt_records_are_quarantined_and_their_files_kept() {
    let mut env = PodEnv::start().await;
    let (bad_pod, _, bad_traces) = run_sleeper(&env, "bad-pod").await;
    let (good_pod, bad_ctr, good_traces) = run_sleeper(&env, "bad-ctr").await;
    let (other_pod, other_ctr, other_traces) = run_sleeper(&env, "other").await;
    env.d.kill();

    let (root, state) = (env.d.root_dir(), env.d.state_dir());
    let pod_record = root.join(format!("records/pods/{bad_pod}.json"));
    let ctr_record = root.join(format!("records/containers/{bad_ctr}.json"));
    std::fs::write(&pod_record, b"{\"id\": \"torn").unwrap();
    std::fs::write(&ctr_record, b"\0\0\0\0").unwrap();

    env.d
        .restart()
        .await
        .expect("the daemon starts despite them");
    let quarantine = root.join("records/quarantine");
    assert_eq!(mode(&quarantine), 0o700);
    let mut names = crishim_tests::fsutil::dir_entries(&quarantine);
    names.sort();
    let mut want = vec![
        format!("containers-{bad_ctr}.json"),
        format!("pods-{bad_pod}.json"),
    ];
    want.sort();
    assert_eq!(names, want);
    assert!(!pod_record.exists() && !ctr_record.exists());
    assert_eq!(
        std::fs::read(quarantine.join(format!("pods-{bad_pod}.json"))).unwrap(),
        b"{\"id\": \"torn",
        "the damaged record is kept as it was"
    );
    // Their directories are kept, not collected as strays.
    for d in [
        state.join("pods").join(&bad_pod),
        state.join("pod-files").join(&bad_pod),
        state.join("containers").join(&bad_ctr),
        root.join("images/containers").join(&bad_ctr),
    ] {
        assert!(d.is_dir(), "{} was removed", d.display());
    }
    assert!(
        state.join("pods").join(&bad_pod).join("shim.sock").exists(),
        "the pod's shim socket is kept"
    );
    let log = env.d.log_text();
    assert!(
        log.contains("quarantine") && log.contains(&format!("{bad_pod}.json")),
        "the daemon logs the quarantine"
    );

    // The daemon serves the other pods and takes new ones.
    let pods = env.d.list_pod_ids(None).await.unwrap();
    assert!(
        pods.contains(&good_pod) && pods.contains(&other_pod),
        "{pods:?}"
    );
    assert!(!pods.contains(&bad_pod));
    let ctrs = env.d.list_container_ids(None).await.unwrap();
    assert!(!ctrs.contains(&bad_ctr), "{ctrs:?}");
    assert_eq!(
        env.d.exec_ok(&other_ctr, &["echo", "ok"]).await.trim(),
        "ok"
    );
    let (new_pod, _, new_traces) = run_sleeper(&env, "after").await;

    for (pod, mut traces) in [(new_pod, new_traces), (other_pod, other_traces)] {
        traces.capture(&env.d).await;
        env.d.stop_pod(&pod).await.unwrap();
        env.d.remove_pod(&pod).await.unwrap();
        assert_no_leaks(&env.d, &traces).await;
    }
    // What the quarantined records describe stays for a person to look at; the janitor clears
    // it when the test ends.
    drop((bad_traces, good_traces));
    env.stop();
}
