//! `crishim gpu list`: the node's GPUs and the containers holding them (from the daemon's
//! per-container GPU records under `state_dir`, read through `crishim_gpu`); `crishim gpu probe`,
//! the child process `crishim_gpu::probe` runs for NVML.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;

use crishim_cri::config::Config;
use crishim_gpu::container::{grants, usage_within, GpuUsage, Grant, USAGE_DEADLINE};
use crishim_gpu::discover::{discover, Gpu};
use crishim_gpu::{containers_dir, libraries, probe};

#[derive(Args)]
pub struct GpuArgs {
    #[command(subcommand)]
    command: GpuCommand,
}

#[derive(Subcommand)]
enum GpuCommand {
    /// List the GPUs (index, UUID, minor, bus id, memory) and the containers holding them.
    List {
        /// Config file (TOML). Default: /etc/crishim/config.toml, if present.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The daemon's volatile state directory (overrides `state_dir`).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print every device's memory as JSON, through the NVML library given (used by the daemon,
    /// which keeps the driver out of its own process).
    #[command(hide = true)]
    Probe { nvml: PathBuf },
}

#[derive(Serialize)]
struct Listing {
    gpus: Vec<Entry>,
    /// Containers with the driver but no GPU (`NVIDIA_VISIBLE_DEVICES=none`).
    driver_only: Vec<Holder>,
}

#[derive(Serialize)]
struct Entry {
    #[serde(flatten)]
    gpu: Gpu,
    containers: Vec<Holder>,
}

/// A container holding GPUs: its grant and, with a memory limit, what its processes hold (from
/// its accounting file).
#[derive(Serialize, Clone)]
struct Holder {
    #[serde(flatten)]
    grant: Grant,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_used_bytes: Option<u64>,
    /// How long the core limiter has held the container's kernel launches back, with a core
    /// limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    throttled_seconds: Option<f64>,
    /// With a core limit: the share of one GPU its kernels took in the last whole second,
    /// percent, as the limiter measured it (absent while none ran in the last few seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    core_share_percent: Option<f64>,
    /// With a core limit: the GPU time its kernels took.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_seconds: Option<f64>,
}

pub fn main(args: GpuArgs) -> Result<i32> {
    match args.command {
        GpuCommand::List {
            config,
            state_dir,
            json,
        } => {
            let mut cfg = Config::load(config.as_deref())?;
            cfg.state_dir = state_dir.unwrap_or(cfg.state_dir);
            let listing = list(&cfg)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&listing)?);
            } else {
                print!("{}", table(&listing, &cfg));
            }
            Ok(0)
        }
        GpuCommand::Probe { nvml } => {
            let found = probe::probe(&nvml).map_err(anyhow::Error::msg)?;
            println!("{}", serde_json::to_string(&found)?);
            Ok(0)
        }
    }
}

fn list(cfg: &Config) -> Result<Listing> {
    let g = &cfg.gpu;
    let mut inventory = discover(&g.device_root, &g.proc_root).context("discovering GPUs")?;
    let nvml = libraries::locate(&g.driver_root)
        .ok()
        .flatten()
        .and_then(|d| {
            d.files
                .into_iter()
                .find(|f| f.soname.as_deref() == Some("libnvidia-ml.so.1"))
        });
    let mut migs = Vec::new();
    if let (Some(nvml), false) = (nvml, inventory.gpus.is_empty()) {
        let view = probe::NvmlView::of(&nvml.source, &inventory, &g.device_root, &g.proc_root);
        for gpu in &mut inventory.gpus {
            gpu.memory = view.memory.get(&gpu.uuid).copied();
        }
        migs = view.migs;
    }
    // Each MIG device right after its GPU.
    let mut all = Vec::new();
    for gpu in inventory.gpus {
        let uuid = gpu.uuid.clone();
        all.push(gpu);
        all.extend(
            migs.iter()
                .filter(|m| m.mig.as_ref().is_some_and(|m| m.parent == uuid))
                .cloned(),
        );
    }
    inventory.gpus = all;
    let dir = containers_dir(&cfg.state_dir);
    // The accounting files are the containers' to write: read for at most the deadline.
    let usage: std::collections::HashMap<String, GpuUsage> = usage_within(&dir, USAGE_DEADLINE)
        .unwrap_or_else(|| {
            eprintln!(
                "crishim gpu list: the GPU accounting files took over 2 s to read; usage left out"
            );
            Vec::new()
        })
        .into_iter()
        .map(|u| (u.container_id.clone(), u))
        .collect();
    let held: Vec<Holder> = grants(&dir)
        .into_iter()
        .map(|grant| {
            let u = usage.get(&grant.container_id);
            Holder {
                memory_used_bytes: u.filter(|u| u.limit_bytes.is_some()).map(|u| u.used_bytes),
                throttled_seconds: grant
                    .core_percent
                    .map(|_| u.map_or(0.0, |u| u.throttled_us as f64 / 1e6)),
                core_share_percent: grant
                    .core_percent
                    .and_then(|_| u?.share_permille)
                    .map(|p| f64::from(p) / 10.0),
                gpu_seconds: grant
                    .core_percent
                    .map(|_| u.map_or(0.0, |u| u.gpu_ns as f64 / 1e9)),
                grant,
            }
        })
        .collect();
    let gpus = inventory
        .gpus
        .into_iter()
        .map(|gpu| Entry {
            containers: held
                .iter()
                .filter(|h| {
                    h.grant
                        .uuids
                        .iter()
                        .any(|u| u.eq_ignore_ascii_case(&gpu.uuid))
                })
                .cloned()
                .collect(),
            gpu,
        })
        .collect();
    let driver_only = held
        .into_iter()
        .filter(|h| h.grant.uuids.is_empty())
        .collect();
    Ok(Listing { gpus, driver_only })
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

fn holder(holder: &Holder) -> String {
    let h = &holder.grant;
    let mut s = format!(
        "{} ({}/{}/{}",
        &h.container_id[..h.container_id.len().min(12)],
        h.pod_namespace,
        h.pod_name,
        h.container_name
    );
    match (holder.memory_used_bytes, h.memory_limit_bytes) {
        (Some(used), Some(limit)) => {
            let _ = write!(s, ", memory {} of {}", mib(used), mib(limit));
        }
        (None, Some(limit)) => {
            let _ = write!(s, ", memory {}", mib(limit));
        }
        _ => {}
    }
    if let Some(c) = h.core_percent {
        let _ = write!(s, ", cores {c}%");
        if let Some(m) = holder.core_share_percent {
            let _ = write!(s, " (measured {m:.1}%)");
        }
    }
    if let Some(t) = holder.throttled_seconds {
        let _ = write!(s, ", throttled {t:.1} s");
    }
    s.push(')');
    s
}

fn table(l: &Listing, cfg: &Config) -> String {
    if l.gpus.is_empty() {
        return format!(
            "no GPUs found (device_root {}, proc_root {})\n",
            cfg.gpu.device_root.display(),
            cfg.gpu.proc_root.display()
        );
    }
    let rows: Vec<[String; 7]> = l
        .gpus
        .iter()
        .map(|e| {
            let holders: Vec<String> = e.containers.iter().map(holder).collect();
            [
                match &e.gpu.mig {
                    Some(m) => format!(
                        "{} gi{} ci{}",
                        e.gpu.index, m.gpu_instance, m.compute_instance
                    ),
                    None => e.gpu.index.to_string(),
                },
                e.gpu.uuid.clone(),
                e.gpu.minor.to_string(),
                e.gpu.bus_id.clone(),
                e.gpu.model.clone(),
                e.gpu.memory.map_or("-".into(), mib),
                if holders.is_empty() {
                    "-".into()
                } else {
                    holders.join(", ")
                },
            ]
        })
        .collect();
    let header = [
        "INDEX",
        "UUID",
        "MINOR",
        "BUS ID",
        "MODEL",
        "MEMORY",
        "CONTAINERS",
    ];
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for r in &rows {
        line(r.iter().map(String::as_str).collect());
    }
    for h in &l.driver_only {
        let _ = writeln!(out, "driver only (no GPU): {}", holder(h));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(cores: Option<u32>) -> Grant {
        Grant {
            container_id: "0123456789abcdef".into(),
            container_name: "c".into(),
            pod_name: "p".into(),
            pod_namespace: "n".into(),
            pod_uid: "u".into(),
            uuids: vec!["GPU-0".into()],
            memory_limit_bytes: Some(2 << 30),
            core_percent: cores,
            capabilities: vec![],
            driver_view: None,
        }
    }

    #[test]
    fn a_holder_shows_its_measured_share_beside_its_limit() {
        let h = Holder {
            grant: grant(Some(30)),
            memory_used_bytes: Some(512 << 20),
            throttled_seconds: Some(1.25),
            core_share_percent: Some(29.8),
            gpu_seconds: Some(3.0),
        };
        assert_eq!(
            holder(&h),
            "0123456789ab (n/p/c, memory 512 MiB of 2048 MiB, cores 30% (measured 29.8%), throttled 1.2 s)"
        );
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(json["core_share_percent"], 29.8);
        assert_eq!(json["gpu_seconds"], 3.0);
        let quiet = Holder {
            core_share_percent: None,
            ..h
        };
        assert!(
            holder(&quiet).contains("cores 30%, throttled"),
            "no kernels lately: no share"
        );
    }
}
