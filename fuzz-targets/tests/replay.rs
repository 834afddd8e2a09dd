//! Replays the committed fuzz inputs on stable: every file of `fuzz/corpus/<target>/` and
//! `fuzz/regressions/<target>/` goes through its target, which must return, without a panic,
//! within a second. (`hack/fuzz.sh` runs the targets themselves, on nightly.)

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(1);

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn inputs(target: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for kind in ["corpus", "regressions"] {
        if let Ok(entries) = std::fs::read_dir(fuzz_dir().join(kind).join(target)) {
            out.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_file()));
        }
    }
    out.sort();
    out
}

#[test]
fn every_committed_input_passes_its_target_within_a_second() {
    let mut failures = Vec::new();
    for (target, run) in crishim_fuzz::TARGETS {
        let files = inputs(target);
        assert!(
            !files.is_empty(),
            "fuzz/corpus/{target}/ has no seed inputs"
        );
        for file in files {
            let data = std::fs::read(&file).unwrap();
            // On its own thread, so that a hang is reported (and left behind) rather than
            // hanging the test.
            let (done, outcome) = std::sync::mpsc::channel();
            let run = *run;
            let started = Instant::now();
            std::thread::spawn(move || {
                let ok = std::panic::catch_unwind(|| run(&data)).is_ok();
                let _ = done.send(ok);
            });
            match outcome.recv_timeout(LIMIT) {
                Ok(true) => {}
                Ok(false) => failures.push(format!("{}: panicked", file.display())),
                Err(_) => failures.push(format!(
                    "{}: still running after {:?}",
                    file.display(),
                    started.elapsed()
                )),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_target_has_a_cargo_fuzz_entry_point() {
    for (target, _) in crishim_fuzz::TARGETS {
        let src = fuzz_dir().join("fuzz_targets").join(format!("{target}.rs"));
        let text =
            std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        assert!(
            text.contains(&format!("crishim_fuzz::{target}(")),
            "{} does not call crishim_fuzz::{target}",
            src.display()
        );
    }
}
