//! Which CRI server a run uses: a running daemon's (`--endpoint`, or the configured socket when a
//! daemon answers there), or else one served in this process on a private socket, over the same
//! pods, containers, images and shims.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use crishim_proto::cri::image_service_client::ImageServiceClient;
use crishim_proto::cri::runtime_service_client::RuntimeServiceClient;

use super::lifecycle::Cri;
use crishim_cri::config::Config;

/// Calls can take long: pulls, and stops that wait out a grace period.
const CALL_TIMEOUT: Duration = Duration::from_secs(600);
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A CRI server this process serves; [`InProcess::stop`] shuts it down.
pub struct InProcess {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl InProcess {
    pub async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        self.task
            .await
            .context("the in-process CRI server panicked")?
    }
}

pub async fn connect(config: &Config, endpoint: Option<&str>) -> Result<(Cri, Option<InProcess>)> {
    if let Some(ep) = endpoint {
        let path = Path::new(ep.strip_prefix("unix://").unwrap_or(ep));
        let cri = client(path)
            .await
            .with_context(|| format!("connecting to the CRI server at {}", path.display()))?;
        return Ok((cri, None));
    }
    if let Ok(cri) = client(&config.socket).await {
        tracing::info!(socket = %config.socket.display(), "running through the crishim daemon");
        return Ok((cri, None));
    }
    let mut own = config.clone();
    own.socket = config
        .state_dir
        .join(format!("run-{}.sock", std::process::id()));
    let socket: PathBuf = own.socket.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(crishim_cri::daemon::serve_until(own, async {
        let _ = stopped.await;
    }));
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        if task.is_finished() {
            return match task.await {
                Ok(Err(e)) => Err(e.context("serving CRI in process")),
                _ => bail!("the in-process CRI server stopped before it was ready"),
            };
        }
        if socket.exists() {
            if let Ok(cri) = client(&socket).await {
                return Ok((cri, Some(InProcess { stop, task })));
            }
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the in-process CRI server did not start within {START_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn client(socket: &Path) -> Result<Cri> {
    let channel = crishim_cri::cri_client::connect_unix(socket, CALL_TIMEOUT).await?;
    Ok(Cri {
        rt: RuntimeServiceClient::new(channel.clone()),
        img: ImageServiceClient::new(channel),
    })
}
