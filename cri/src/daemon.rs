//! `crishim serve`: open the stores, bind the socket, serve CRI until SIGTERM or SIGINT.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use crishim_images::ImageStore;
use crishim_proto::cri::image_service_server::ImageServiceServer;
use crishim_proto::cri::runtime_service_server::RuntimeServiceServer;
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::StreamExt;
use tracing::info;

use crate::authority::AuthorityFix;
use crate::config::Config;
use crate::server::{ImageService, RuntimeService};

/// How long SIGTERM waits for in-flight calls and open streams.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// The kubelet's own CRI message limit.
const MAX_MESSAGE: usize = 16 << 20;

/// Serve until SIGTERM or SIGINT.
pub async fn serve(config: Config) -> Result<()> {
    serve_until(config, shutdown()).await
}

/// The store serving eStargz and zstd:chunked layers lazily, where `[images] lazy` is on and
/// `crishim-lazyfs` is installed beside the daemon.
async fn with_lazy_layers(store: ImageStore, config: &Config) -> Result<ImageStore> {
    if !config.images.lazy {
        return Ok(store);
    }
    let server = crate::server::sibling_binary("crishim-lazyfs");
    if !server.is_file() {
        tracing::warn!(
            path = %server.display(),
            "crishim-lazyfs is not installed: lazy layers are pulled whole"
        );
        return Ok(store);
    }
    let settings = crishim_lazy::snapshotter::Settings {
        read_timeout: config.images.lazy_read_timeout,
        prefetch_bandwidth: config.images.lazy_prefetch_bandwidth,
        prefetch_concurrency: config.images.lazy_prefetch_concurrency,
    };
    let lazy = crishim_lazy::snapshotter::Snapshotter::new(
        store.root(),
        server,
        config.registry.clone(),
        config.images.clone(),
        settings,
    )
    .context("finding the lazy layers")?;
    store
        .with_lazy(Arc::new(lazy))
        .await
        .context("collecting lazy layers")
}

/// Serve until `stop` completes (`crishim run` serves in process this way).
pub async fn serve_until(
    config: Config,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    // Shims daemonize; as their subreaper we collect them (and infra processes whose shim died)
    // when they exit instead of leaving zombies to an init that may not reap. They outlive us all
    // the same: on our exit they move to init.
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "PR_SET_CHILD_SUBREAPER");
    }
    crishim_spec::cgroups::check_host(config.cgroup_driver).map_err(anyhow::Error::msg)?;
    crate::host_files::prepare(&config).context("preparing the root and state directories")?;
    let store = ImageStore::open(
        &config.root_dir.join("images"),
        config.registry.clone(),
        config.images.clone(),
    )
    .await
    .context("opening the image store")?
    .with_mounts_elsewhere(pods_mounts_root(&config));
    let store = with_lazy_layers(store, &config).await?;
    let store = Arc::new(store);
    let images = ImageService::new(store.clone(), config.pinned_images.clone())
        .with_handlers(crate::runtimes::Handlers::new(&config.runtimes));
    let runtime =
        RuntimeService::new(config.clone(), store).context("loading pod and container records")?;
    match crate::empty_mnt::start() {
        Ok(path) => runtime.set_empty_mnt(path),
        Err(e) => {
            tracing::warn!(error = %e, "making the empty mount namespace; infra processes copy the node's")
        }
    }
    runtime.recover().await;
    // Plugins are synchronized with the recovered pods before the first CRI request.
    runtime
        .start_nri()
        .await
        .map_err(|e| anyhow::anyhow!("[nri]: {e}"))?;
    runtime
        .start_streaming()
        .await
        .context("starting the streaming server")?;
    if let Some(address) = &config.metrics.address {
        let metrics = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("[metrics] address {address:?}: binding"))?;
        info!(address = %metrics.local_addr().map_or(address.clone(), |a| a.to_string()), "serving /metrics");
        let source = runtime.clone();
        tokio::spawn(crate::metrics::serve(metrics, move || source.gauges()));
    }

    let network = runtime.pod_network();
    let nri = runtime.clone();
    let listener = bind(&config.socket)?;
    info!(socket = %config.socket.display(), root_dir = %config.root_dir.display(), "crishim serving CRI");
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .add_service(
            ImageServiceServer::new(images)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
        .add_service(
            RuntimeServiceServer::new(runtime)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityFix::new)),
            async {
                stop.await;
                let _ = stopping_tx.send(());
            },
        );
    // Graceful shutdown waits for open streams (a kubelet's GetContainerEvents never ends), so it
    // gets a bound: containers and shims run on regardless, nothing is lost by leaving.
    let result = tokio::select! {
        r = server => r,
        _ = async {
            let _ = stopping_rx.await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            info!("clients still connected after {SHUTDOWN_GRACE:?}; stopping anyway");
            Ok(())
        }
    };
    let _ = std::fs::remove_file(&config.socket);
    nri.stop_nri();
    network.close();
    crate::host_files::release_private_mount(&config.state_dir);
    result.context("serving CRI")?;
    info!("crishim stopped");
    Ok(())
}

/// Bind the socket with mode 0660, replacing a stale socket file but never a live daemon's.
fn bind(path: &Path) -> Result<UnixListener> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    if let Ok(md) = std::fs::symlink_metadata(path) {
        if !md.file_type().is_socket() {
            bail!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("another process is already serving on {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("chmod 0660 {}", path.display()))?;
    Ok(listener)
}

async fn shutdown() {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: shutting down"),
        _ = int.recv() => info!("SIGINT: shutting down"),
    }
}

/// The state directory, which holds the pods' rootfs, /dev/shm and netns mounts (none is ever
/// below a container's writable layer), as the image store's cleanup may skip it: resolved as
/// `host_files` mounted it, and only where it and the root directory do not nest.
fn pods_mounts_root(config: &Config) -> Vec<PathBuf> {
    match (
        std::fs::canonicalize(&config.state_dir),
        std::fs::canonicalize(&config.root_dir),
    ) {
        (Ok(state), Ok(root)) if !state.starts_with(&root) && !root.starts_with(&state) => {
            vec![state]
        }
        _ => Vec::new(),
    }
}
