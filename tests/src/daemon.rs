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

    pub fn insecure_skip_verify(mut self, host: &str) -> Self {
        self.insecure_hosts.push(host.to_string());
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
            "daemon binary {} not found: build it with `cargo build -p crishim-runtime` or set CRISHIM_BIN",
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
                "info,crishim=debug,crishim_runtime=debug,crishim_images=debug",
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
    Ok(crishim_runtime::cri_client::connect_unix(socket, RPC_TIMEOUT).await?)
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

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.terminate();
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
