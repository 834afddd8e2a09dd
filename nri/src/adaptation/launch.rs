//! Pre-installed plugins: executables named `NN-name` in `plugin_path`, launched by crishim with
//! one end of a socket pair as fd 3 and NRI's environment, and configured from
//! `plugin_config_path` (`NN-name.conf`, else `name.conf`).

use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};

use super::plugin::{check_index, check_name};
use super::Inner;
use crate::api;

/// The fd the plugin's end of the socket pair has.
const PLUGIN_FD: i32 = 3;
/// A plugin's configuration file, read whole.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Plugins launched from `plugin_path`; more are ignored.
const MAX_LAUNCHED: usize = super::MAX_PLUGINS;

/// A plugin crishim launched, until it registers.
pub(super) struct Launched {
    pub(super) idx: String,
    pub(super) base: String,
    pub(super) config: String,
    pub(super) child: tokio::process::Child,
}

/// Launches every plugin in `plugin_path` at once and waits for each to register and
/// synchronize (each within the registration timeout). Failures are logged: a broken plugin
/// does not keep the runtime from starting.
pub(super) async fn launch_all(inner: &Arc<Inner>) {
    let found = match discover(&inner.config.plugin_path) {
        Ok(found) => found,
        Err(e) => {
            warn!(error = %e, "NRI: pre-installed plugins");
            return;
        }
    };
    let mut set = tokio::task::JoinSet::new();
    for (idx, base, path) in found {
        let inner = inner.clone();
        set.spawn(async move {
            let name = format!("{idx}-{base}");
            if let Err(e) = launch(&inner, idx, base, &path).await {
                warn!(plugin = %name, error = %e, "NRI: pre-installed plugin not started");
            } else {
                info!(plugin = %name, "NRI: pre-installed plugin started");
            }
        });
    }
    while set.join_next().await.is_some() {}
}

/// `(index, name, path)` of each plugin in `dir`, in index order. Only root's executables
/// that no one else may write are run.
pub(super) fn discover(dir: &Path) -> std::io::Result<Vec<(String, String, PathBuf)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let file_name = entry.file_name().to_string_lossy().into_owned();
        // symlink_metadata: a link is judged as a link, and refused.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            continue;
        }
        let Some((idx, base)) = file_name.split_once('-') else {
            warn!(file = %path.display(), "NRI: not a plugin name (NN-name), skipped");
            continue;
        };
        if check_index(idx).is_err() || check_name(base).is_err() {
            warn!(file = %path.display(), "NRI: not a plugin name (NN-name), skipped");
            continue;
        }
        if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            warn!(
                file = %path.display(),
                "NRI: plugin not owned by root or writable by others, skipped"
            );
            continue;
        }
        found.push((idx.to_string(), base.to_string(), path));
    }
    found.sort();
    found.truncate(MAX_LAUNCHED);
    Ok(found)
}

/// The plugin's configuration: `NN-name.conf`, else `name.conf`, else none.
fn config(dir: &Path, idx: &str, base: &str) -> Result<String, String> {
    for file in [format!("{idx}-{base}.conf"), format!("{base}.conf")] {
        let path = dir.join(&file);
        match crishim_sys::hostfs::read_capped(&path, MAX_CONFIG_BYTES) {
            Ok(bytes) => {
                return String::from_utf8(bytes)
                    .map_err(|_| format!("{} is not UTF-8", path.display()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    Ok(String::new())
}

async fn launch(inner: &Arc<Inner>, idx: String, base: String, path: &Path) -> Result<(), String> {
    let config = config(&inner.config.plugin_config_path, &idx, &base)?;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(|e| e.to_string())?;
    ours.set_nonblocking(true).map_err(|e| e.to_string())?;
    let fd = theirs.as_raw_fd();
    let mut cmd = tokio::process::Command::new(path);
    cmd.env_clear()
        .env(api::PLUGIN_NAME_ENV, &base)
        .env(api::PLUGIN_IDX_ENV, &idx)
        .env(api::PLUGIN_SOCKET_ENV, PLUGIN_FD.to_string())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    // SAFETY: between fork and exec only async-signal-safe calls: dup2 and fcntl.
    unsafe {
        cmd.pre_exec(move || {
            if fd == PLUGIN_FD {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, PLUGIN_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("launching {}: {e}", path.display()))?;
    drop(theirs);
    let stream = tokio::net::UnixStream::from_std(ours).map_err(|e| e.to_string())?;
    inner
        .register(
            stream,
            Some(Launched {
                idx,
                base,
                config,
                child,
            }),
        )
        .await
        .map_err(|e| e.to_string())
}
