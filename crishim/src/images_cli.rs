//! `crishim images`: the daemon's images and how much of each is local (a lazily pulled image
//! is served while its prefetch runs), through the CRI socket as `crictl images` lists them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use crishim_images::{LazyState, LazySummary};
use crishim_proto::cri::image_service_client::ImageServiceClient;
use crishim_proto::cri::{ImageSpec, ImageStatusRequest, ListImagesRequest};

#[derive(Args)]
pub struct ImagesArgs {
    /// The daemon's CRI socket.
    #[arg(long, default_value = crishim_cri::config::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// One JSON object per image: its ID, tags, size and lazy layers.
    #[arg(long)]
    json: bool,
}

pub fn main(args: ImagesArgs) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(list(args))
}

async fn list(args: ImagesArgs) -> Result<i32> {
    let channel = crishim_cri::cri_client::connect_unix(&args.socket, Duration::from_secs(30))
        .await
        .with_context(|| format!("connecting to {}", args.socket.display()))?;
    let mut client = ImageServiceClient::new(channel);
    let images = client
        .list_images(ListImagesRequest::default())
        .await
        .context("ListImages")?
        .into_inner()
        .images;
    if !args.json {
        println!("{:<13} {:<48} {:>10}  LOCAL", "IMAGE ID", "TAG", "SIZE");
    }
    for image in images {
        let status = client
            .image_status(ImageStatusRequest {
                image: Some(ImageSpec {
                    image: image.id.clone(),
                    ..Default::default()
                }),
                verbose: true,
            })
            .await
            .with_context(|| format!("ImageStatus {}", image.id))?
            .into_inner();
        let lazy: Option<LazySummary> = status
            .info
            .get("lazy")
            .and_then(|s| serde_json::from_str(s).ok());
        let tag = image
            .repo_tags
            .first()
            .or(image.repo_digests.first())
            .cloned()
            .unwrap_or_else(|| "<none>".into());
        if args.json {
            let line = serde_json::json!({
                "id": image.id,
                "repo_tags": image.repo_tags,
                "size": image.size,
                "lazy": lazy,
            });
            println!("{line}");
            continue;
        }
        let id = image.id.trim_start_matches("sha256:");
        println!(
            "{:<13} {:<48} {:>10}  {}",
            &id[..id.len().min(13)],
            tag,
            shown_size(image.size),
            lazy.as_ref().map_or("100%".into(), local)
        );
    }
    Ok(0)
}

/// `37% (lazy)`, `100%`, or `quarantined: <why>`.
fn local(s: &LazySummary) -> String {
    let percent = s
        .local_bytes
        .min(s.size_bytes)
        .saturating_mul(100)
        .checked_div(s.size_bytes)
        .unwrap_or(100);
    match s.state {
        LazyState::Local => "100%".into(),
        LazyState::Lazy => format!("{percent}% (lazy)"),
        LazyState::Quarantined => {
            let why = s
                .layers
                .iter()
                .find_map(|l| l.status.reason.clone())
                .unwrap_or_default();
            format!("{percent}% quarantined: {why}")
        }
    }
}

fn shown_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crishim_images::LazyStatus;

    #[test]
    fn the_local_column_says_how_much_is_local_and_why_a_layer_is_quarantined() {
        let layer = |state, local, reason: Option<&str>| {
            (
                crishim_images::Digest::parse(&format!("sha256:{}", "a".repeat(64))).unwrap(),
                LazyStatus {
                    state,
                    local_bytes: local,
                    size_bytes: 100,
                    fetched_bytes: 0,
                    chunk_errors: 0,
                    reason: reason.map(String::from),
                },
            )
        };
        let s = LazySummary::of(400, vec![layer(LazyState::Lazy, 50, None)]);
        assert_eq!(local(&s), "87% (lazy)");
        assert_eq!(local(&LazySummary::of(400, vec![])), "100%");
        let q = LazySummary::of(
            400,
            vec![layer(LazyState::Quarantined, 100, Some("digest mismatch"))],
        );
        assert_eq!(local(&q), "100% quarantined: digest mismatch");
        assert_eq!(shown_size(1536), "1.5 KiB");
    }
}
