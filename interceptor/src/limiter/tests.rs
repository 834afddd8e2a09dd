//! The limiter against a simulated time-sliced GPU, in virtual time: contexts take turns in
//! time slices, a kernel is preempted when its context's slice ends, events stamp when their
//! context runs, and NVML gives each sample to the context running at its instant.

use super::*;
use std::collections::VecDeque;

const MS: u64 = 1_000_000;
const SLICE: u64 = 2 * MS;
const SAMPLE_PERIOD: u64 = 167 * MS;
/// NVML's samples reach the limiter this late (it reads them every 100 ms or so).
const SAMPLE_LAG: u64 = 300 * MS;
/// The wall clock of the simulation's start, µs since the epoch.
const EPOCH_US: u64 = 1_700_000_000_000_000;

struct Kernel {
    admission: Option<Admission>,
    left: u64,
    /// When its start event was stamped: its context first ran it.
    started: Option<u64>,
}

struct App {
    limiter: Option<Limiter>,
    kernel_ns: u64,
    /// Kernels it keeps queued at most (a real driver's queue holds ~1024).
    depth: usize,
    queue: VecDeque<Kernel>,
    /// It sleeps in a launch until then.
    wake: u64,
    /// What it has waited for the launch it is making.
    waited: Duration,
    own: u64,
    /// Own GPU time per second of simulated time.
    seconds: Vec<u64>,
}

/// A GPU of `sms` SMs whose wave of blocks takes 10 µs.
fn kernel_ns(blocks: u64, sms: u64) -> u64 {
    blocks.div_ceil(sms) * 10_000
}

/// (limit percent or none, kernel duration ns)
fn run(apps: &[(Option<u32>, u64)], seconds: u64) -> Vec<Vec<f64>> {
    let t0 = Instant::now();
    let at = |ns: u64| t0 + Duration::from_nanos(ns);
    let mut apps: Vec<App> = apps
        .iter()
        .map(|&(limit, kernel_ns)| App {
            limiter: limit.map(|p| Limiter::new(p, t0)),
            kernel_ns,
            depth: if limit.is_some() { 64 } else { 1024 },
            queue: VecDeque::new(),
            wake: 0,
            waited: Duration::ZERO,
            own: 0,
            seconds: vec![0; seconds as usize],
        })
        .collect();
    let end = seconds * 1_000 * MS;
    let (mut t, mut current, mut slice_end, mut next_sample) = (0u64, None::<usize>, 0u64, 0u64);
    let mut samples: VecDeque<(u64, Option<usize>)> = VecDeque::new();
    while t < end {
        // Launches due now.
        for app in apps.iter_mut() {
            while app.queue.len() < app.depth && app.wake <= t {
                let key = (1, app.kernel_ns);
                let admission = match &mut app.limiter {
                    None => None,
                    Some(l) => match l.admit(key, at(t), app.waited) {
                        Ok(a) => Some(a),
                        Err(w) => {
                            app.wake = t + w.as_nanos() as u64;
                            app.waited += w;
                            break;
                        }
                    },
                };
                app.waited = Duration::ZERO;
                app.queue.push_back(Kernel {
                    admission,
                    left: app.kernel_ns,
                    started: None,
                });
            }
        }
        // The scheduler: the running context keeps the GPU while it has work and its slice lasts.
        if current.is_some_and(|c| apps[c].queue.is_empty() || t >= slice_end) {
            let from = current.unwrap_or(0);
            current = (1..=apps.len())
                .map(|i| (from + i) % apps.len())
                .find(|&i| !apps[i].queue.is_empty());
            slice_end = t + SLICE;
        } else if current.is_none() {
            current = (0..apps.len()).find(|&i| !apps[i].queue.is_empty());
            slice_end = t + SLICE;
        }
        let wake = apps
            .iter()
            .filter(|a| a.wake > t)
            .map(|a| a.wake)
            .min()
            .unwrap_or(u64::MAX);
        if t >= next_sample {
            // NVML gives the sample to the context running now; the limiter reads it later.
            samples.push_back((t, current));
            next_sample += SAMPLE_PERIOD;
        }
        while samples.front().is_some_and(|(at, _)| at + SAMPLE_LAG <= t) {
            let (at, holder) = samples.pop_front().expect("checked");
            for (i, app) in apps.iter_mut().enumerate() {
                if let (Some(l), Some(h)) = (&mut app.limiter, holder) {
                    l.sample(h as u32, h == i, EPOCH_US + at / 1000);
                }
            }
        }
        let mut step = (next_sample - t).min(wake - t).min(end - t);
        if let Some(c) = current {
            let head = apps[c].queue.front_mut().expect("ready");
            head.started.get_or_insert(t);
            step = step.min(head.left).min(slice_end - t);
        }
        let step = step.max(1);
        if let Some(c) = current {
            let app = &mut apps[c];
            let head = app.queue.front_mut().expect("ready");
            head.left -= step;
            app.own += step;
            let second = (t / (1000 * MS)) as usize;
            if second < app.seconds.len() {
                app.seconds[second] += step;
            }
            if head.left == 0 {
                let k = app.queue.pop_front().expect("ready");
                let done = t + step;
                if let (Some(l), Some(a)) = (&mut app.limiter, k.admission) {
                    let started = k.started.unwrap_or(done);
                    l.complete(
                        a,
                        (done - started) as f64,
                        EPOCH_US + done / 1000,
                        true,
                        at(done),
                    );
                }
            }
        }
        t += step;
    }
    apps.iter()
        .map(|a| {
            a.seconds
                .iter()
                .map(|ns| *ns as f64 / (10.0 * MS as f64))
                .collect()
        })
        .collect()
}

/// Every window after `warm` seconds within `window` points of `limit`, and their mean within
/// `mean` points.
fn holds(name: &str, windows: &[f64], warm: usize, limit: f64, window: f64, mean: f64) {
    let w = &windows[warm..];
    let avg = w.iter().sum::<f64>() / w.len() as f64;
    let (lo, hi) = w
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
    assert!(
        (avg - limit).abs() <= mean && lo >= limit - window && hi <= limit + window,
        "{name}: mean {avg:.1}, windows {lo:.1}..{hi:.1} against {limit}: {w:.1?}"
    );
}

#[test]
fn thirty_percent_alone() {
    let s = run(&[(Some(30), kernel_ns(1000, 132))], 12);
    holds("alone", &s[0], 2, 30.0, 5.0, 2.0);
}

#[test]
fn thirty_percent_beside_an_unlimited_neighbour_on_gpus_of_16_132_and_188_sms() {
    for sms in [16, 132, 188] {
        let s = run(
            &[
                (Some(30), kernel_ns(1000, sms)),
                (None, kernel_ns(1000, sms)),
            ],
            12,
        );
        holds(&format!("{sms} SMs"), &s[0], 2, 30.0, 5.0, 2.0);
        holds(
            &format!("{sms} SMs, the neighbour"),
            &s[1],
            2,
            70.0,
            5.0,
            2.0,
        );
    }
}

#[test]
fn ten_beside_ninety() {
    let k = kernel_ns(1000, 132);
    let s = run(&[(Some(10), k), (Some(90), k)], 12);
    holds("10%", &s[0], 2, 10.0, 3.0, 2.0);
    holds("90%", &s[1], 2, 90.0, 3.0, 2.0);
}

#[test]
fn twenty_thirty_fifty() {
    let k = kernel_ns(1000, 132);
    let s = run(&[(Some(20), k), (Some(30), k), (Some(50), k)], 12);
    for (app, limit) in [(0, 20.0), (1, 30.0), (2, 50.0)] {
        holds(&format!("{limit}%"), &s[app], 2, limit, 5.0, 2.0);
    }
}

#[test]
fn many_tiny_kernels() {
    // One block each: 10 µs.
    let s = run(
        &[(Some(30), kernel_ns(1, 132)), (None, kernel_ns(1000, 132))],
        12,
    );
    holds("tiny", &s[0], 2, 30.0, 5.0, 2.0);
}

#[test]
fn few_huge_kernels_alone() {
    // 20 ms each: ten time slices.
    let s = run(&[(Some(30), 20 * MS)], 12);
    holds("huge, alone", &s[0], 2, 30.0, 5.0, 2.0);
}

#[test]
fn few_huge_kernels_beside_a_neighbour_are_charged_their_own_time() {
    // Each is preempted ten times: its events' elapsed time is about twice its own. NVML's
    // samples while it is in flight tell the limiter so.
    let s = run(&[(Some(30), 20 * MS), (None, kernel_ns(1000, 132))], 40);
    holds("huge, beside a neighbour", &s[0], 20, 30.0, 6.0, 2.5);
}

#[test]
fn a_launch_never_waits_more_than_a_second() {
    let t0 = Instant::now();
    let mut l = Limiter::new(1, t0);
    let key = (1, 1);
    let a = l.admit(key, t0, Duration::ZERO).unwrap();
    // A kernel of 5 s: 500 s of wall clock at 1%.
    l.complete(a, 5e9, EPOCH_US, true, t0);
    assert_eq!(l.admit(key, t0, Duration::ZERO), Err(MAX_WAIT));
    assert!(
        l.admit(key, t0 + MAX_WAIT, MAX_WAIT).is_ok(),
        "admitted after one wait"
    );
}

#[test]
fn estimates_are_charged_at_launch_and_settled_at_completion() {
    let t0 = Instant::now();
    let mut l = Limiter::new(50, t0);
    let key = (7, 100);
    let first = l.admit(key, t0, Duration::ZERO).unwrap();
    assert!(first.unknown && first.estimate == 0.0, "nothing known yet");
    // A second launch of a kernel nothing is known of waits for the first to say what it takes.
    assert_eq!(
        l.admit(key, t0, Duration::ZERO),
        Err(UNKNOWN_POLL),
        "one unknown in flight"
    );
    assert!(l.admit(key, t0, MAX_WAIT).is_ok(), "but not past MAX_WAIT");
    l.complete(first, 10.0 * MS as f64, EPOCH_US, true, t0);
    let t = t0 + Duration::from_millis(20);
    let second = l.admit(key, t, Duration::ZERO).unwrap();
    assert!(
        (second.estimate - 10.0 * MS as f64).abs() < 1.0,
        "{second:?}"
    );
    // 10 ms at 50% plus 10 ms estimated: the clock is 40 ms on, less the 20 ms gone.
    let wait = l.pacer.wait(t);
    assert!(wait > Duration::from_millis(15), "{wait:?}");
    l.abandon(second, false, t);
    assert!(l.pacer.wait(t) < wait, "a refused launch is given back");
}

#[test]
fn dilation_needs_evidence_and_is_bounded() {
    let mut d = Dilation::default();
    assert_eq!(d.factor(), 1.0, "no samples: charge the whole elapsed time");
    d.observe(false);
    assert!(d.factor() > 0.75, "one foreign sample does not swing it");
    let mut d = Dilation::default();
    d.held(7, true, 1_000_000);
    assert_eq!(
        d.factor(),
        0.5,
        "beside one neighbour, time-slicing halves it"
    );
    d.held(8, true, 1_000_000);
    assert!((d.factor() - 1.0 / 3.0).abs() < 1e-9, "beside two, a third");
    d.held(8, true, 4_000_000);
    assert_eq!(d.factor(), 0.5, "one went quiet");
    d.held(1, false, 6_100_000);
    assert_eq!(d.factor(), 1.0, "both went quiet: alone again");
    d.held(8, true, 6_200_000);
    for _ in 0..1000 {
        d.observe(false);
    }
    assert_eq!(d.factor(), 0.125);
    for _ in 0..1000 {
        d.observe(true);
    }
    assert!(d.factor() > 0.95, "samples outweigh the guess");
}

#[test]
fn windows_report_the_last_whole_second() {
    let mut w = Windows::default();
    w.add(10, 300.0 * MS as f64);
    assert_eq!(w.last(10), None);
    assert_eq!(w.last(11), Some((10, 300)));
    w.add(11, 2000.0 * MS as f64);
    assert_eq!(w.last(12), Some((11, 1000)), "capped at one GPU");
    assert_eq!(w.last(14), Some((13, 0)), "an idle second");
}

#[test]
fn in_flight_spans_merge_and_expire() {
    let mut f = InFlight::default();
    f.add(10_000, 20_000);
    f.add(15_000, 30_000);
    f.add(40_000, 41_500);
    assert!(f.contains(25_000) && !f.contains(35_000));
    assert!(
        !f.contains(29_500),
        "near the end, which may be placed late"
    );
    assert!(
        f.contains(10_000),
        "the start is placed late too: what follows it is inside"
    );
    assert!(!f.contains(40_750), "a span shorter than the edge");
    f.add(10_000_000, 10_000_001);
    assert!(!f.contains(25_000), "older than the horizon");
}
