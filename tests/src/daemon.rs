//! The `crishim` daemon under test, run as `crishim serve --config FILE` with everything in a
//! temporary directory, and a CRI client connected over its unix socket.

use std::fmt::Write as _;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use crishim_proto::cri::image_service_client::ImageServiceClient;
use crishim_proto::cri::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::registry::tail;

/// The workspace root (`tests/..`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests crate has a parent directory")
        .to_path_buf()
}

/// The daemon binary: `$CRISHIM_BIN`; else `crishim` next to this test binary's profile
/// directory (`target/<profile>/crishim`, which follows `CARGO_TARGET_DIR`); else
/// `<workspace>/target/debug/crishim`.
pub fn daemon_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CRISHIM_BIN") {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/deps/<test binary>
        if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
            let p = profile_dir.join("crishim");
            if p.is_file() {
                return p;
            }
        }
    }
    workspace_root().join("target/debug/crishim")
}

fn toml_str(s: &str) -> String {
    // A JSON string is a valid TOML basic string for everything we write.
    serde_json::to_string(s).expect("string to json")
}

/// How to configure the daemon. Socket, root and state directories always live in the
/// daemon's own temporary directory.
#[derive(Clone, Debug, Default)]
pub struct DaemonOptions {
    /// `[registry.mirrors."HOST"] endpoint = [...]`
    pub mirrors: Vec<(String, Vec<String>)>,
    /// `[registry.configs."HOST".auth] username, password`
    pub auths: Vec<(String, String, String)>,
    /// `[registry.configs."HOST".tls] insecure_skip_verify = true`
    pub insecure_hosts: Vec<String>,
    /// Raw TOML put after the top-level keys and before the generated tables.
    pub extra_toml: String,
    /// Extra arguments after `serve --config FILE`.
    pub args: Vec<String>,
    /// Extra environment variables for the daemon.
    pub env: Vec<(String, String)>,
    /// `[images]` keys (`max_unpacked_bytes = 1048576`, …). Unless one sets `min_free_percent`,
    /// it is 0 (off) rather than the default 5, so the suite does not depend on how full the test
    /// machine's disk is (CI's has been under 5 % free).
    pub images: Vec<String>,
    /// A command the daemon runs under (`nsenter … --`); it then gets its own process group, and
    /// stopping signals the whole group, since such a wrapper does not pass signals on.
    pub wrapper: Vec<String>,
    /// The state directory on a tmpfs of its own, as `/run/crishim` is on a node (the benchmark
    /// measures that; elsewhere it is a plain directory of the temporary one).
    pub state_on_tmpfs: bool,
    /// `shim_binary`; else `CRISHIM_SHIM_BIN` when set, else the one next to `crishim`.
    pub shim_binary: Option<PathBuf>,
}

impl DaemonOptions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn mirror(mut self, host: &str, endpoints: &[&str]) -> Self {
        self.mirrors.push((
            host.to_string(),
            endpoints.iter().map(|e| e.to_string()).collect(),
        ));
        self
    }

    pub fn auth(mut self, host: &str, username: &str, password: &str) -> Self {
        self.auths
            .push((host.to_string(), username.to_string(), password.to_string()));
        self
    }

    /// Add `key = value` to the `[images]` table.
    pub fn images(mut self, key: &str, value: u64) -> Self {
        self.images.push(format!("{key} = {value}"));
        self
    }

    /// Add `key = VALUE` to the `[images]` table, VALUE written as TOML (`true`, `"30s"`).
    pub fn images_toml(mut self, key: &str, value: &str) -> Self {
        self.images.push(format!("{key} = {value}"));
        self
    }

    pub fn insecure_skip_verify(mut self, host: &str) -> Self {
        self.insecure_hosts.push(host.to_string());
        self
    }

    pub fn shim_binary(mut self, path: &Path) -> Self {
        self.shim_binary = Some(path.to_path_buf());
        self
    }

    pub fn extra_toml(mut self, toml: &str) -> Self {
        self.extra_toml.push_str(toml);
        if !self.extra_toml.ends_with('\n') {
            self.extra_toml.push('\n');
        }
        self
    }

    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.to_string());
        self
    }

    pub fn state_on_tmpfs(mut self) -> Self {
        self.state_on_tmpfs = true;
        self
    }

    pub fn wrapper(mut self, argv: Vec<String>) -> Self {
        self.wrapper = argv;
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    /// The config file for a daemon living in `dir` (socket `dir/crishim.sock`, root
    /// `dir/root`, state `dir/state`).
    pub fn config_toml(&self, dir: &Path) -> String {
        let mut t = String::new();
        let p = |name: &str| toml_str(&dir.join(name).to_string_lossy());
        writeln!(t, "socket = {}", p("crishim.sock")).unwrap();
        writeln!(t, "root_dir = {}", p("root")).unwrap();
        writeln!(t, "state_dir = {}", p("state")).unwrap();
        // The static init that hack/test.sh builds (hack/build-init.sh), when there is one.
        if let Some(init) = std::env::var_os("CRISHIM_INIT_BIN") {
            writeln!(t, "init_binary = {}", toml_str(&init.to_string_lossy())).unwrap();
        }
        // The static shim, with the static infra beside it, as installed (hack/test.sh).
        let shim = self
            .shim_binary
            .clone()
            .or_else(|| std::env::var_os("CRISHIM_SHIM_BIN").map(PathBuf::from));
        if let Some(shim) = shim {
            writeln!(t, "shim_binary = {}", toml_str(&shim.to_string_lossy())).unwrap();
        }
        t.push_str(&self.extra_toml);
        for (host, endpoints) in &self.mirrors {
            let eps: Vec<String> = endpoints.iter().map(|e| toml_str(e)).collect();
            writeln!(t, "\n[registry.mirrors.{}]", toml_str(host)).unwrap();
            writeln!(t, "endpoint = [{}]", eps.join(", ")).unwrap();
        }
        for (host, user, pass) in &self.auths {
            writeln!(t, "\n[registry.configs.{}.auth]", toml_str(host)).unwrap();
            writeln!(t, "username = {}", toml_str(user)).unwrap();
            writeln!(t, "password = {}", toml_str(pass)).unwrap();
        }
        for host in &self.insecure_hosts {
            writeln!(t, "\n[registry.configs.{}.tls]", toml_str(host)).unwrap();
            writeln!(t, "insecure_skip_verify = true").unwrap();
        }
        writeln!(t, "\n[images]").unwrap();
        for line in &self.images {
            writeln!(t, "{line}").unwrap();
        }
        if !self
            .images
            .iter()
            .any(|l| l.starts_with("min_free_percent"))
        {
            writeln!(t, "min_free_percent = 0").unwrap();
        }
        // A private, empty CNI config dir (`<dir>/cni`), so the host's configs never leak in;
        // network tests write theirs there.
        if !self.extra_toml.contains("[cni]") {
            writeln!(t, "\n[cni]\nconf_dir = {}", p("cni")).unwrap();
        }
        t
    }

    fn command(&self, config: &Path, log: &Path) -> Result<Command> {
        self.command_logging(config, fs::File::create(log)?)
    }

    fn command_logging(&self, config: &Path, logf: fs::File) -> Result<Command> {
        let bin = daemon_bin();
        ensure!(
            bin.is_file(),
            "daemon binary {} not found: build it with `cargo build -p crishim` or set CRISHIM_BIN",
            bin.display()
        );
        let mut cmd = match self.wrapper.split_first() {
            None => Command::new(&bin),
            Some((first, rest)) => {
                let mut cmd = Command::new(first);
                cmd.args(rest).arg(&bin).process_group(0);
                cmd
            }
        };
        cmd.arg("serve")
            .arg("--config")
            .arg(config)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env(
                "RUST_LOG",
                "info,crishim=debug,crishim_cri=debug,crishim_spec=debug,crishim_cni=debug,crishim_images=debug",
            );
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        Ok(cmd)
    }
}

/// A tokio runtime that may be dropped from async code (it is shut down in the background).
struct BackgroundRuntime(Option<tokio::runtime::Runtime>);

impl BackgroundRuntime {
    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("runtime present").handle()
    }
}

impl Drop for BackgroundRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A running daemon. Dropping it sends SIGTERM, waits up to 10 s, then SIGKILLs.
pub struct Daemon {
    opts: DaemonOptions,
    child: Option<Child>,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
    channel: Option<Channel>,
    /// Runs the client connections, so they keep working (answer the server's GOAWAY on
    /// shutdown, close) while a test's own runtime is blocked waiting for the daemon to exit.
    client_rt: Option<BackgroundRuntime>,
    // Dropped last.
    dir: tempfile::TempDir,
}

const START_TIMEOUT: Duration = Duration::from_secs(30);
const RPC_TIMEOUT: Duration = Duration::from_secs(90);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A tonic channel over a unix socket.
pub async fn connect_unix(socket: &Path) -> Result<Channel> {
    Ok(crishim_cri::cri_client::connect_unix(socket, RPC_TIMEOUT).await?)
}

impl Daemon {
    /// Write the config, start `crishim serve --config`, wait for the socket and connect.
    pub async fn start(opts: DaemonOptions) -> Result<Daemon> {
        remember_panics();
        let dir = tempfile::Builder::new()
            .prefix("crishim-daemon-")
            .tempdir()?;
        let config = dir.path().join("config.toml");
        fs::write(&config, opts.config_toml(dir.path()))?;
        if opts.state_on_tmpfs {
            let state = dir.path().join("state");
            fs::create_dir(&state)?;
            mount_state_tmpfs(&state)
                .with_context(|| format!("mounting a tmpfs on {}", state.display()))?;
        }
        let socket = dir.path().join("crishim.sock");
        let log = dir.path().join("daemon.log");
        let mut d = Daemon {
            opts,
            child: None,
            socket,
            config,
            log,
            channel: None,
            client_rt: None,
            dir,
        };
        d.launch(fs::File::create(&d.log)?).await?;
        Ok(d)
    }

    /// Spawn the daemon on this directory and connect to it.
    async fn launch(&mut self, logf: fs::File) -> Result<()> {
        let mut child = self
            .opts
            .command_logging(&self.config, logf)?
            .spawn()
            .with_context(|| format!("spawning {}", daemon_bin().display()))?;
        let client_rt = BackgroundRuntime(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("crishim-test-client")
                .enable_all()
                .build()?,
        ));
        let socket = self.socket.clone();
        let log = self.log.clone();
        let deadline = Instant::now() + START_TIMEOUT;
        let channel = loop {
            if let Some(status) = child.try_wait()? {
                let text = fs::read_to_string(&log).unwrap_or_default();
                bail!(
                    "crishim serve exited early with {status}; its output:\n{}",
                    tail(&text, 8000)
                );
            }
            if socket.exists() && tokio::net::UnixStream::connect(&socket).await.is_ok() {
                let s = socket.clone();
                match client_rt
                    .handle()
                    .spawn(async move { connect_unix(&s).await })
                    .await?
                {
                    Ok(c) => break c,
                    Err(e) if Instant::now() > deadline => return Err(e),
                    Err(_) => {}
                }
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let text = fs::read_to_string(&log).unwrap_or_default();
                bail!(
                    "crishim serve did not listen on {} within {START_TIMEOUT:?}; its output:\n{}",
                    socket.display(),
                    tail(&text, 8000)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        self.child = Some(child);
        self.channel = Some(channel);
        self.client_rt = Some(client_rt);
        Ok(())
    }

    /// SIGKILL the daemon at once, as a crash would; its shims and containers keep running.
    pub fn kill(&mut self) {
        self.channel = None;
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.client_rt = None;
    }

    /// Start the daemon again on the same directories and config (after [`Self::kill`] or a stop),
    /// appending to the same log.
    pub async fn restart(&mut self) -> Result<()> {
        let _ = self.terminate();
        let logf = fs::OpenOptions::new().append(true).open(&self.log)?;
        self.launch(logf).await
    }

    fn channel(&self) -> Channel {
        self.channel.clone().expect("daemon already stopped")
    }

    pub fn image_client(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel())
    }

    pub fn runtime_client(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel())
    }

    /// The daemon's temporary directory (holds config, socket, root, state and log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn root_dir(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn config_path(&self) -> &Path {
        &self.config
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything the daemon wrote to stdout and stderr so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn terminate(&mut self) -> Option<std::io::Result<ExitStatus>> {
        let status = self.terminate_child();
        self.channel = None;
        self.client_rt = None;
        status
    }

    fn terminate_child(&mut self) -> Option<std::io::Result<ExitStatus>> {
        self.channel = None;
        let mut child = self.child.take()?;
        if let Ok(Some(status)) = child.try_wait() {
            return Some(Ok(status));
        }
        let pid = child.id() as i32;
        let target = if self.opts.wrapper.is_empty() {
            pid
        } else {
            -pid
        };
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(target),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(Ok(status)),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = child.kill();
                    return Some(child.wait());
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// SIGTERM the daemon and assert that it exits with status 0 within 10 s.
    pub fn stop(mut self) {
        let status = self
            .terminate()
            .expect("daemon already stopped")
            .expect("waiting for the daemon");
        assert!(
            status.success(),
            "crishim serve exited with {status} on SIGTERM; its output:\n{}",
            tail(&self.log_text(), 8000)
        );
    }
}

/// A tmpfs for a runtime's state directory, as `/run` is on a node: shared, as systemd makes
/// every mount (this machine's `/` is private), so mounts made in it later reach the mount
/// namespaces copied from it.
pub fn mount_state_tmpfs(dir: &Path) -> nix::Result<()> {
    use nix::mount::{mount, MsFlags};
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0711"),
    )?;
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.terminate();
        // The tmpfs, or the private bind the daemon keeps there while pods are left.
        let _ = nix::mount::umount2(&self.state_dir(), nix::mount::MntFlags::MNT_DETACH);
        // Lazy layers' mounts outlive a daemon by design; a test's go with it (their servers
        // exit once the kernel drops them).
        if let Ok(layers) = fs::read_dir(self.root_dir().join("images/lazy")) {
            for layer in layers.flatten() {
                let _ = nix::mount::umount2(
                    &layer.path().join("mnt"),
                    nix::mount::MntFlags::MNT_DETACH,
                );
            }
        }
        if std::thread::panicking() && std::env::var_os("CRISHIM_TEST_QUIET").is_none() {
            eprintln!(
                "---- crishim log ({}) ----\n{}",
                self.dir.path().display(),
                tail(&self.log_text(), 12000)
            );
            // CI shows the end of the output: repeat why the test failed after the log.
            if let Some(msg) = LAST_PANIC.with(|p| p.borrow_mut().take()) {
                eprintln!("---- the test failed with ----\n{msg}");
            }
        }
    }
}

thread_local! {
    /// This thread's latest panic, for [`Daemon`]'s drop to repeat after the daemon's log.
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Keep each panic's location and message in [`LAST_PANIC`], then report it as before.
fn remember_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let at = info.location().map(|l| l.to_string()).unwrap_or_default();
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{at}: {msg}")));
            previous(info);
        }));
    });
}

/// Run `crishim serve --config FILE` with `opts` (in a fresh temporary directory) when it is
/// expected to exit by itself, e.g. on a bad config. Fails if it is still running after
/// `timeout` (it is then killed).
pub async fn serve_expecting_exit(
    opts: &DaemonOptions,
    timeout: Duration,
) -> Result<std::process::Output> {
    let dir = tempfile::Builder::new()
        .prefix("crishim-daemon-")
        .tempdir()?;
    let config = dir.path().join("config.toml");
    fs::write(&config, opts.config_toml(dir.path()))?;
    let log = dir.path().join("unused.log");
    let mut cmd: tokio::process::Command = opts.command(&config, &log)?.into();
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn()?;
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(out) => Ok(out?),
        Err(_) => bail!(
            "crishim serve was still running after {timeout:?} with config:\n{}",
            opts.config_toml(dir.path())
        ),
    }
}

/// A free loopback `host:port` for `[metrics] address`.
pub fn metrics_address() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// The `[metrics]` table serving at `addr`.
pub fn metrics_toml(addr: &str) -> String {
    format!("[metrics]\naddress = \"{addr}\"\n")
}

/// `GET /metrics` on `addr`: the body.
pub async fn scrape(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(addr)
        .await
        .expect("metrics endpoint");
    sock.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    sock.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    reply.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// The value of the sample `name{labels}` (`0` when absent).
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Check `text` against the Prometheus text exposition format (0.0.4): every sample line is
/// `name{label="value",...} number` with a legal name and escaped values, its family declared
/// by a `# TYPE` line first (a histogram's `_bucket`, `_sum` and `_count` series belong to it),
/// no family declared twice, and each histogram's buckets rise to a `+Inf` bucket equal to its
/// `_count`.
pub fn check_prometheus_text(text: &str) -> std::result::Result<(), String> {
    use std::collections::{BTreeMap, HashMap};
    let name_ok = |n: &str| {
        !n.is_empty()
            && !n.starts_with(|c: char| c.is_ascii_digit())
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut types: HashMap<String, String> = HashMap::new();
    // (family, labels without le) -> (buckets as (bound, value) in order, count)
    type Buckets = (Vec<(f64, f64)>, Option<f64>);
    let mut histograms: BTreeMap<(String, String), Buckets> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let at = |m: &str| format!("line {}: {m}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or_else(|| at("bad TYPE"))?;
            if !name_ok(name)
                || !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind)
            {
                return Err(at("bad TYPE"));
            }
            if types.insert(name.to_string(), kind.to_string()).is_some() {
                return Err(at("family declared twice"));
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').ok_or_else(|| at("no value"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| at("value is not a number"))?,
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (
                name,
                rest.strip_suffix('}')
                    .ok_or_else(|| at("unclosed labels"))?,
            ),
            None => (series, ""),
        };
        if !name_ok(name) {
            return Err(at("bad metric name"));
        }
        let mut pairs = Vec::new();
        let mut rest = labels;
        while !rest.is_empty() {
            let (key, after) = rest.split_once("=\"").ok_or_else(|| at("bad label"))?;
            if !name_ok(key) {
                return Err(at("bad label name"));
            }
            let mut end = None;
            let mut escaped = false;
            for (i, c) in after.char_indices() {
                match (escaped, c) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => {
                        end = Some(i);
                        break;
                    }
                    (false, '\n') => return Err(at("newline in a label value")),
                    _ => {}
                }
            }
            let end = end.ok_or_else(|| at("unterminated label value"))?;
            pairs.push((key.to_string(), after[..end].to_string()));
            rest = after[end + 1..]
                .strip_prefix(',')
                .unwrap_or(&after[end + 1..]);
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                let base = name.strip_suffix(s)?;
                (types.get(base).map(String::as_str) == Some("histogram")).then_some(base)
            })
            .unwrap_or(name);
        if !types.contains_key(family) {
            return Err(at("sample before its # TYPE"));
        }
        if family != name {
            let key_labels: Vec<String> = pairs
                .iter()
                .filter(|(k, _)| k != "le")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let entry = histograms
                .entry((family.to_string(), key_labels.join(",")))
                .or_default();
            if name.ends_with("_bucket") {
                let le = pairs
                    .iter()
                    .find(|(k, _)| k == "le")
                    .ok_or_else(|| at("bucket without le"))?;
                let bound = if le.1 == "+Inf" {
                    f64::INFINITY
                } else {
                    le.1.parse().map_err(|_| at("bad le"))?
                };
                entry.0.push((bound, value));
            } else if name.ends_with("_count") {
                entry.1 = Some(value);
            }
        }
    }
    for ((family, labels), (buckets, count)) in histograms {
        let what = format!("histogram {family}{{{labels}}}");
        if !buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
        {
            return Err(format!("{what}: buckets do not rise"));
        }
        match (buckets.last(), count) {
            (Some((b, v)), Some(c)) if b.is_infinite() && *v == c => {}
            _ => return Err(format!("{what}: no +Inf bucket equal to its _count")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod prometheus_text_tests {
    use super::check_prometheus_text;

    #[test]
    fn the_checker_takes_good_text_and_names_what_is_wrong() {
        let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{m=\"x\\\"y\"} 3\n\
                    # TYPE h histogram\nh_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 2\n\
                    h_sum 0.3\nh_count 2\n";
        check_prometheus_text(good).unwrap();
        for (bad, why) in [
            ("a_total 3\n", "before its # TYPE"),
            ("# TYPE a counter\na{m=\"x} 1\n", "unterminated"),
            ("# TYPE a counter\na one\n", "not a number"),
            ("# TYPE a counter\n# TYPE a counter\n", "twice"),
            (
                "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",
                "rise",
            ),
            (
                "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_count 2\n",
                "+Inf",
            ),
        ] {
            let e = check_prometheus_text(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
