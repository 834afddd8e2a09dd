//! Figures from the raw samples, and the crishim / containerd table (Markdown, for the README).

use serde::Serialize;

use crate::measure::{Results, Role};

/// Nearest-rank percentile (`p` in 0..=100) of unsorted samples; NaN when there are none.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// The middle sample; the mean of the two middle ones for an even count.
pub fn median(samples: &[f64]) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Every burst's pod starts, in one list.
fn burst_pods(r: &Results) -> Vec<f64> {
    r.bursts
        .iter()
        .flat_map(|b| b.pods.iter().map(|p| p.total_ms))
        .collect()
}

fn max(samples: &[f64]) -> f64 {
    samples.iter().copied().fold(f64::NAN, f64::max)
}

#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Ms,
    Kib,
}

/// One line of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub figure: String,
    pub unit: Unit,
    pub crishim: Option<f64>,
    pub containerd: Option<f64>,
    /// crishim / containerd.
    pub ratio: Option<f64>,
    /// The ratio aimed at (reported, not asserted).
    pub target: Option<f64>,
}

/// (figure, unit, target ratio (docs/benchmarks.md), how to get it from one runtime's results)
type Figure = (&'static str, Unit, Option<f64>, fn(&Results) -> f64);

fn figures() -> Vec<Figure> {
    fn col<T>(v: &[T], f: impl Fn(&T) -> f64) -> Vec<f64> {
        v.iter().map(f).collect()
    }
    vec![
        ("pod start p50", Unit::Ms, Some(0.25), |r| {
            percentile(&col(&r.pod_start, |p| p.total_ms), 50.0)
        }),
        ("pod start p90", Unit::Ms, None, |r| {
            percentile(&col(&r.pod_start, |p| p.total_ms), 90.0)
        }),
        ("pod start max", Unit::Ms, None, |r| {
            max(&col(&r.pod_start, |p| p.total_ms))
        }),
        ("· RunPodSandbox p50", Unit::Ms, None, |r| {
            percentile(&col(&r.pod_start, |p| p.run_pod_ms), 50.0)
        }),
        ("· CreateContainer p50", Unit::Ms, None, |r| {
            percentile(&col(&r.pod_start, |p| p.create_ms), 50.0)
        }),
        ("· StartContainer p50", Unit::Ms, None, |r| {
            percentile(&col(&r.pod_start, |p| p.start_ms), 50.0)
        }),
        ("burst: per pod p50", Unit::Ms, None, |r| {
            percentile(&burst_pods(r), 50.0)
        }),
        ("burst: per pod p90", Unit::Ms, None, |r| {
            percentile(&burst_pods(r), 90.0)
        }),
        (
            "burst: wall (median of the bursts)",
            Unit::Ms,
            Some(0.25),
            |r| median(&col(&r.bursts, |b| b.wall_ms)),
        ),
        ("burst: node CPU per pod", Unit::Ms, None, |r| {
            median(&col(&r.bursts, |b| b.node_cpu_ms_per_pod))
        }),
        ("ExecSync p50", Unit::Ms, Some(0.25), |r| {
            percentile(&r.exec_ms, 50.0)
        }),
        ("ExecSync p90", Unit::Ms, None, |r| {
            percentile(&r.exec_ms, 90.0)
        }),
        (
            "relist p50 (ListPodSandbox + ListContainers)",
            Unit::Ms,
            Some(1.0),
            |r| percentile(&r.relist_ms, 50.0),
        ),
        ("ListContainerStats p50", Unit::Ms, None, |r| {
            percentile(&r.list_stats_ms, 50.0)
        }),
        ("Exec stream round trip, median", Unit::Ms, None, |r| {
            percentile(&r.stream_ms, 50.0)
        }),
        ("stop + remove p50", Unit::Ms, Some(1.0 / 3.0), |r| {
            percentile(&col(&r.stop_remove, |p| p.total_ms), 50.0)
        }),
        ("stop + remove p90", Unit::Ms, None, |r| {
            percentile(&col(&r.stop_remove, |p| p.total_ms), 90.0)
        }),
        ("memory per pod", Unit::Kib, Some(0.2), |r| {
            r.memory.per_pod_kib()
        }),
        ("· shim", Unit::Kib, None, |r| per_pod(r, Role::Shim)),
        ("· infra / pause", Unit::Kib, None, |r| {
            per_pod(r, Role::Infra)
        }),
        ("· daemon growth", Unit::Kib, None, |r| {
            r.memory.daemon_growth_kib() as f64 / r.memory.pods.max(1) as f64
        }),
        ("cold pull, median", Unit::Ms, Some(1.0), |r| {
            percentile(&col(&r.pull, |p| p.ms), 50.0)
        }),
        (
            "· skopeo copy of the same image, median",
            Unit::Ms,
            None,
            |r| percentile(&col(&r.pull, |p| p.skopeo_ms), 50.0),
        ),
    ]
}

fn per_pod(r: &Results, role: Role) -> f64 {
    r.memory.sum(role) as f64 / r.memory.pods.max(1) as f64
}

pub fn rows(crishim: Option<&Results>, containerd: Option<&Results>) -> Vec<Row> {
    let finite = |v: f64| v.is_finite().then_some(v);
    figures()
        .into_iter()
        .map(|(figure, unit, target, f)| {
            let a = crishim.map(f).and_then(finite);
            let b = containerd.map(f).and_then(finite);
            let ratio = match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            };
            Row {
                figure: figure.to_string(),
                unit,
                crishim: a,
                containerd: b,
                ratio,
                target,
            }
        })
        .collect()
}

fn value(v: Option<f64>, unit: Unit) -> String {
    match (v, unit) {
        (None, _) => "–".into(),
        (Some(v), Unit::Ms) if v >= 100.0 => format!("{v:.0} ms"),
        (Some(v), Unit::Ms) => format!("{v:.1} ms"),
        (Some(v), Unit::Kib) => format!("{v:.0} KiB"),
    }
}

/// The table, as Markdown.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| figure | crishim | containerd | ratio | target |\n|---|---:|---:|---:|---|\n",
    );
    for r in rows {
        let ratio = r.ratio.map_or("–".into(), |x| format!("{x:.2}"));
        let target = match (r.target, r.ratio) {
            (Some(t), Some(x)) => {
                let mark = if x <= t { "met" } else { "missed" };
                format!("≤ {t:.2}: {mark}")
            }
            (Some(t), None) => format!("≤ {t:.2}"),
            (None, _) => String::new(),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {ratio} | {target} |\n",
            r.figure,
            value(r.crishim, r.unit),
            value(r.containerd, r.unit),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 5.0);
        assert_eq!(percentile(&v, 90.0), 9.0);
        assert_eq!(percentile(&v, 100.0), 10.0);
        assert_eq!(percentile(&[3.0], 50.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
        assert!(median(&[]).is_nan());
    }
}
