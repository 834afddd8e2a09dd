//! Running one plugin binary: its config on stdin, the `CNI_*` variables in its own
//! environment only, a timeout, and the CNI error JSON on failure.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::io::AsyncWriteExt as _;

use super::pidfd::PidFd;
use super::CniError;
use crishim_sys::blocking::read_capped;

/// PATH directories a plugin needs (iptables lives in sbin), added to the daemon's PATH.
const STANDARD_PATH: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// `GOMAXPROCS` for every plugin. The standard plugins are Go programs that live for a few
/// milliseconds and do one thing at a time; left alone, the Go runtime sizes its scheduler and
/// its garbage collector's workers to every CPU of the node. With one, bridge + portmap took 6 %
/// less CPU time for an ADD and 13 % less for a DEL on this repository's 2-core machines (more is
/// to be had on a node with many cores). Blocking system calls still get threads of their own.
pub const PLUGIN_GOMAXPROCS: &str = "1";

/// The environment of one plugin call, besides the config.
#[derive(Debug, Clone)]
pub struct Invocation<'a> {
    /// `CNI_COMMAND`: ADD, DEL, CHECK (or VERSION).
    pub command: &'a str,
    pub container_id: &'a str,
    /// `CNI_NETNS`; may be empty for DEL.
    pub netns: &'a str,
    pub ifname: &'a str,
    /// `CNI_ARGS`.
    pub args: &'a str,
}

/// Finds and runs plugins.
#[derive(Debug, Clone)]
pub struct Exec {
    pub bin_dirs: Vec<PathBuf>,
    pub timeout: Duration,
    path_env: String,
}

/// The CNI error object a failing plugin prints on stdout.
#[derive(Debug, Deserialize)]
struct ErrorJson {
    code: Option<u32>,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    details: String,
}

impl Exec {
    pub fn new(bin_dirs: Vec<PathBuf>, timeout: Duration) -> Self {
        let mut path: Vec<String> = std::env::var("PATH")
            .unwrap_or_default()
            .split(':')
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect();
        for p in STANDARD_PATH {
            if !path.iter().any(|q| q == p) {
                path.push(p.to_string());
            }
        }
        Exec {
            bin_dirs,
            timeout,
            path_env: path.join(":"),
        }
    }

    /// The first executable file named `plugin_type` in the bin dirs.
    pub fn find(&self, plugin_type: &str) -> Result<PathBuf, CniError> {
        use std::os::unix::fs::PermissionsExt as _;
        if !plugin_type.contains('/') && !plugin_type.is_empty() {
            for dir in &self.bin_dirs {
                let path = dir.join(plugin_type);
                if std::fs::metadata(&path)
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                {
                    return Ok(path);
                }
            }
        }
        Err(CniError::PluginNotFound {
            plugin: plugin_type.to_string(),
            dirs: self.bin_dirs.clone(),
        })
    }

    /// `CNI_PATH`: the bin dirs, `:`-separated.
    fn cni_path(&self) -> String {
        self.bin_dirs
            .iter()
            .map(|d| d.to_string_lossy())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// Runs `binary` (plugin `plugin_type`) with `config` on stdin. Returns its stdout on
    /// success; a non-zero exit is [`CniError::Plugin`] with the plugin's error message.
    pub async fn run(
        &self,
        plugin_type: &str,
        binary: &Path,
        config: &Value,
        inv: &Invocation<'_>,
    ) -> Result<Vec<u8>, CniError> {
        let stdin_data = serde_json::to_vec(config).expect("serializing a JSON value");
        tracing::debug!(
            plugin = plugin_type,
            command = inv.command,
            container = inv.container_id,
            netns = inv.netns,
            config = %String::from_utf8_lossy(&stdin_data),
            "running CNI plugin"
        );
        let mut cmd = tokio::process::Command::new(binary);
        cmd.env_clear()
            .env("PATH", &self.path_env)
            .env("CNI_COMMAND", inv.command)
            .env("CNI_CONTAINERID", inv.container_id)
            .env("CNI_NETNS", inv.netns)
            .env("CNI_IFNAME", inv.ifname)
            .env("CNI_ARGS", inv.args)
            .env("CNI_PATH", self.cni_path())
            .env("GOMAXPROCS", PLUGIN_GOMAXPROCS)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut attempt = 0;
        let mut child = loop {
            match cmd.spawn() {
                Ok(c) => break c,
                // A binary being installed, or a write fd briefly inherited by a sibling
                // fork: retry a few times.
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 10 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => {
                    return Err(CniError::Io(format!(
                        "cannot run CNI plugin {}: {e}",
                        binary.display()
                    )))
                }
            }
        };
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let write = async move {
            // A plugin that exits without reading its stdin is judged by its exit status.
            let _ = stdin.write_all(&stdin_data).await;
            drop(stdin);
        };
        // On timeout the child is dropped with this call: kill_on_drop kills it and tokio reaps
        // it in the background.
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        // Its status read through a pidfd, the plugin is reaped a moment later (see `pidfd`);
        // where pidfds are missing, tokio reaps it at once.
        let pidfd = child.id().and_then(|pid| PidFd::open(pid).ok());
        let output = tokio::time::timeout(self.timeout, async {
            let ((), stdout, stderr) = tokio::join!(
                write,
                read_capped(stdout, MAX_PLUGIN_STDOUT),
                read_capped(stderr, MAX_PLUGIN_STDERR)
            );
            let status = match &pidfd {
                Some(fd) => match fd.exited().await {
                    Ok(status) => status,
                    // `waitid(P_PIDFD)` is Linux 5.4, a year after `pidfd_open`: tokio reaps.
                    Err(_) => child.wait().await?,
                },
                None => child.wait().await?,
            };
            Ok::<_, std::io::Error>(std::process::Output {
                status,
                stdout: stdout?,
                stderr: stderr?,
            })
        })
        .await;
        if output.is_ok() && pidfd.is_some() {
            super::pidfd::reap_later(child);
        }
        let output = output
            .map_err(|_| CniError::Timeout {
                plugin: plugin_type.to_string(),
                command: inv.command.to_string(),
                after: self.timeout,
            })?
            .map_err(|e| CniError::Io(format!("waiting for CNI plugin {plugin_type}: {e}")))?;
        if output.status.success() {
            tracing::debug!(
                plugin = plugin_type,
                command = inv.command,
                stdout = %String::from_utf8_lossy(&output.stdout),
                "CNI plugin succeeded"
            );
            return Ok(output.stdout);
        }
        let err = plugin_error(
            plugin_type,
            inv.command,
            &output.status.to_string(),
            &output.stdout,
            &output.stderr,
        );
        tracing::debug!(stderr = %String::from_utf8_lossy(&output.stderr), "{err}");
        Err(err)
    }
}

/// A CNI result is a few KiB; a plugin's output past these caps is read and dropped, so a
/// runaway plugin neither blocks on a full pipe nor makes the daemon buffer it.
const MAX_PLUGIN_STDOUT: u64 = 1 << 20;
const MAX_PLUGIN_STDERR: u64 = 64 << 10;

/// The error of a plugin that exited with `status`: its CNI error JSON from stdout, else its
/// stderr, else its stdout, else the exit status.
pub fn plugin_error(
    plugin_type: &str,
    command: &str,
    status: &str,
    stdout: &[u8],
    stderr: &[u8],
) -> CniError {
    let (code, msg, details) = match serde_json::from_slice::<ErrorJson>(stdout) {
        Ok(e) if e.code.is_some() || !e.msg.is_empty() => (e.code, e.msg, e.details),
        _ => {
            let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
            let msg = [text(stderr), text(stdout)]
                .into_iter()
                .find(|s| !s.is_empty())
                .unwrap_or_else(|| format!("{status} with no output"));
            (None, msg, String::new())
        }
    };
    CniError::Plugin {
        plugin: plugin_type.to_string(),
        command: command.to_string(),
        code,
        msg,
        details,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn plugin_output_is_capped_and_the_rest_drained() {
        // A "plugin" writing 8 MiB: the first 1 MiB is kept, and it is not left blocked.
        let mut child = tokio::process::Command::new("head")
            .args(["-c", "8388608", "/dev/zero"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = read_capped(child.stdout.take().unwrap(), MAX_PLUGIN_STDOUT)
            .await
            .unwrap();
        assert_eq!(out.len() as u64, MAX_PLUGIN_STDOUT);
        assert!(child.wait().await.unwrap().success());
    }

    #[test]
    fn error_json_is_parsed() {
        let out =
            br#"{"cniVersion":"1.0.0","code":7,"msg":"failed to allocate","details":"range full"}"#;
        let e = plugin_error("bridge", "ADD", "exit status: 1", out, b"noise");
        let CniError::Plugin {
            plugin,
            command,
            code,
            msg,
            details,
        } = &e
        else {
            panic!("{e:?}")
        };
        assert_eq!(
            (plugin.as_str(), command.as_str(), *code),
            ("bridge", "ADD", Some(7))
        );
        assert_eq!(
            (msg.as_str(), details.as_str()),
            ("failed to allocate", "range full")
        );
        let text = e.to_string();
        assert!(text.contains("bridge"), "{text}");
        assert!(text.contains("failed to allocate"), "{text}");
        assert!(text.contains("range full"), "{text}");
        assert!(text.contains("code 7"), "{text}");
    }

    #[test]
    fn error_falls_back_to_stderr_then_stdout_then_status() {
        let msg = |stdout: &[u8], stderr: &[u8]| match plugin_error(
            "p",
            "DEL",
            "exit status: 2",
            stdout,
            stderr,
        ) {
            CniError::Plugin { msg, code, .. } => (code, msg),
            e => panic!("{e:?}"),
        };
        assert_eq!(msg(b"not json", b" boom \n"), (None, "boom".to_string()));
        assert_eq!(msg(b"{}", b""), (None, "{}".to_string()));
        assert_eq!(
            msg(b"plain failure\n", b""),
            (None, "plain failure".to_string())
        );
        assert_eq!(
            msg(b"", b""),
            (None, "exit status: 2 with no output".to_string())
        );
        assert_eq!(msg(br#"{"msg":"m"}"#, b"x"), (None, "m".to_string()));
    }

    #[test]
    fn path_has_sbin() {
        let e = Exec::new(vec!["/a".into(), "/b".into()], Duration::from_secs(1));
        assert!(e.path_env.split(':').any(|p| p == "/usr/sbin"));
        assert_eq!(e.cni_path(), "/a:/b");
    }
}
