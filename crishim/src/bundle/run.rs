//! `crishim bundle run`: reserve the id, then become the shim. The shim's foreground mode does the
//! rest (see `crishim-shim run`); exec'ing it rather than spawning it means that the caller's
//! signals, stdio, terminal and wait status all reach it directly, with no relay in between.

use std::os::unix::process::CommandExt;

use super::config::Bundle;
use super::error::BundleError;
use super::lifecycle::{record, Env};

/// Returns only on failure, having released the id.
pub fn run(env: &Env, bundle: &Bundle, id: &str) -> BundleError {
    if let Err(e) = env.check_shim() {
        return e;
    }
    let reservation = match env.store.reserve(&record(bundle, id, None)) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let source = std::process::Command::new(&env.shim)
        .arg("run")
        .arg("--dir")
        .arg(reservation.dir())
        .arg("--id")
        .arg(id)
        .arg("--bundle")
        .arg(&bundle.dir)
        .exec();
    BundleError::ShimBinary {
        path: env.shim.clone(),
        source,
    }
}
