//! The socket external plugins connect to. It is root's alone: the file is 0600 in a
//! directory crishim makes 0700 when it makes it, and a peer that is not uid 0 is refused
//! even if it got through.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::{Inner, NriError};

/// Connections registering at once; more are closed at once.
const MAX_REGISTERING: usize = 8;

pub(super) fn listen(inner: Arc<Inner>) -> Result<JoinHandle<()>, NriError> {
    let path = inner.config.socket_path.clone();
    let setup =
        |what: &str, e: std::io::Error| NriError::Setup(format!("{what} {}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(|e| setup("creating the directory of", e))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| setup("securing the directory of", e))?;
        }
    }
    // A socket left by an earlier run is replaced; anything else at the path is not ours.
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(&path).map_err(|e| setup("removing the old", e))?
        }
        Ok(_) => {
            return Err(NriError::Setup(format!(
                "{} exists and is not a socket",
                path.display()
            )))
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(&path).map_err(|e| setup("listening on", e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| setup("securing", e))?;
    info!(socket = %path.display(), "NRI: listening for plugins");
    let registering = Arc::new(Semaphore::new(MAX_REGISTERING));
    Ok(tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "NRI: accepting a plugin");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            match stream.peer_cred() {
                Ok(cred) if cred.uid() == 0 => {}
                other => {
                    warn!(peer = ?other, "NRI: refused a plugin connection that is not root's");
                    continue;
                }
            }
            let Ok(permit) = registering.clone().try_acquire_owned() else {
                warn!("NRI: too many plugins registering at once, connection refused");
                continue;
            };
            let inner = inner.clone();
            tokio::spawn(async move {
                if let Err(e) = inner.register(stream, None).await {
                    warn!(error = %e, "NRI: plugin not registered");
                }
                drop(permit);
            });
        }
    }))
}
