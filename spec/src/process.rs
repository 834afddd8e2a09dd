//! The process: command line, environment, working directory and rlimits.

use std::path::PathBuf;

use crishim_proto::cri;
use oci_spec::image::Config as ImageConfig;
use oci_spec::runtime::{PosixRlimit, PosixRlimitBuilder, PosixRlimitType};

use super::SpecError;

/// containerd's `defaultUnixEnv`: the PATH every container starts with, unless the image sets one.
pub(super) const DEFAULT_PATH_ENV: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// RLIMIT_NOFILE, soft and hard; the limit the common base runtime specs (kind's, for one) give
/// containers, rather than 1024 which breaks many servers.
pub(super) const NOFILE_LIMIT: u64 = 1_048_576;

/// Kubernetes' (and Docker's) merge: `command` replaces the image's Entrypoint and then the
/// image's Cmd is dropped too; `args` alone replaces Cmd and keeps Entrypoint.
pub(super) fn args(
    config: &cri::ContainerConfig,
    image: Option<&ImageConfig>,
) -> Result<Vec<String>, SpecError> {
    let mut command = config.command.clone();
    let mut args = config.args.clone();
    if command.is_empty() {
        if args.is_empty() {
            args = image.and_then(|c| c.cmd().clone()).unwrap_or_default();
        }
        let entrypoint = image
            .and_then(|c| c.entrypoint().clone())
            .unwrap_or_default();
        // `ENTRYPOINT [""]` is how Dockerfiles clear an inherited entrypoint.
        if entrypoint != [""] {
            command = entrypoint;
        }
    }
    command.extend(args);
    if command.is_empty() {
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.as_str())
            .unwrap_or_default();
        return Err(SpecError::Invalid(format!(
            "no command specified for container {name:?}: neither the container config nor the image \
             sets a command"
        )));
    }
    Ok(command)
}

/// PATH default, `TERM` for a tty, `HOSTNAME`, then the image's Env, then the container's env;
/// a later value replaces an earlier one for the same key in place, as containerd's `WithEnv`.
pub(super) fn env(
    config: &cri::ContainerConfig,
    image: Option<&ImageConfig>,
    hostname: &str,
) -> Result<Vec<String>, SpecError> {
    let mut env = vec![DEFAULT_PATH_ENV.to_string()];
    if config.tty {
        env.push("TERM=xterm".to_string());
    }
    merge_env(&mut env, [format!("HOSTNAME={hostname}")]);
    merge_env(
        &mut env,
        image.and_then(|c| c.env().clone()).unwrap_or_default(),
    );
    // The CRI carries values as bytes (1.36 and later); an OCI environment holds strings. A value
    // that is not UTF-8 goes, exactly, in the one entry that crishim-init decodes.
    if config
        .envs
        .iter()
        .map(|kv| kv.key.as_str())
        .chain(
            env.iter()
                .map(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k)),
        )
        .any(|k| k == crishim_proto::init::RAW_ENV)
    {
        return Err(SpecError::Invalid(format!(
            "environment variable {} is reserved: crishim-init reads it",
            crishim_proto::init::RAW_ENV
        )));
    }
    let mut ours = Vec::with_capacity(config.envs.len());
    let mut raw: Vec<Vec<u8>> = Vec::new();
    for kv in &config.envs {
        match std::str::from_utf8(&kv.value) {
            Ok(value) => {
                raw.retain(|e| !e.starts_with(format!("{}=", kv.key).as_bytes()));
                ours.push(format!("{}={value}", kv.key));
            }
            Err(_) => {
                if kv.key.is_empty() || kv.key.contains(['=', '\0']) || kv.value.contains(&0) {
                    return Err(SpecError::Invalid(format!(
                        "environment variable {:?}: an empty name, '=' in the name or a NUL \
                         byte, which no process can be given",
                        crishim_sys::shown::shown(&kv.key)
                    )));
                }
                // A bare name unsets what the image or an earlier entry set.
                ours.push(kv.key.clone());
                raw.retain(|e| !e.starts_with(format!("{}=", kv.key).as_bytes()));
                let mut entry = format!("{}=", kv.key).into_bytes();
                entry.extend_from_slice(&kv.value);
                raw.push(entry);
            }
        }
    }
    merge_env(&mut env, ours);
    if !raw.is_empty() {
        env.push(format!(
            "{}={}",
            crishim_proto::init::RAW_ENV,
            crishim_proto::init::encode_raw_env(&raw)
        ));
    }
    // What the runtime's init cannot set (it aborts the create, its error unread until the
    // create returns): an empty name, or a NUL anywhere. From the request or from the image.
    if let Some(bad) = env.iter().find(|e| {
        let (k, _) = e.split_once('=').unwrap_or((e.as_str(), ""));
        k.is_empty() || e.contains('\0')
    }) {
        return Err(SpecError::Invalid(format!(
            "environment entry {:?} has an empty name or a NUL byte, which no process can be \
             given",
            crishim_sys::shown::shown(bad)
        )));
    }
    Ok(env)
}

/// Whether `entry` is the one that carries the values that are not UTF-8.
pub(super) fn is_raw_env(entry: &str) -> bool {
    entry
        .strip_prefix(crishim_proto::init::RAW_ENV)
        .is_some_and(|rest| rest.starts_with('='))
}

/// Sets or replaces `KEY=value` entries; a bare `KEY` (possible in an image's Env) unsets it.
fn merge_env(env: &mut Vec<String>, overrides: impl IntoIterator<Item = String>) {
    fn key(entry: &str) -> &str {
        entry.split_once('=').map_or(entry, |(k, _)| k)
    }
    for entry in overrides {
        if !entry.contains('=') {
            env.retain(|e| key(e) != entry);
            continue;
        }
        match env.iter_mut().find(|e| key(e) == key(&entry)) {
            Some(slot) => *slot = entry,
            None => env.push(entry),
        }
    }
}

pub(super) fn cwd(config: &cri::ContainerConfig, image: Option<&ImageConfig>) -> PathBuf {
    let image_dir = image
        .and_then(|c| c.working_dir().as_deref())
        .unwrap_or_default();
    match (config.working_dir.as_str(), image_dir) {
        ("", "") => PathBuf::from("/"),
        ("", dir) | (dir, _) => PathBuf::from(dir),
    }
}

pub(super) fn rlimits(ceiling: Option<u64>) -> Vec<PosixRlimit> {
    let limit = ceiling.map_or(NOFILE_LIMIT, |c| c.min(NOFILE_LIMIT));
    let nofile = PosixRlimitBuilder::default()
        .typ(PosixRlimitType::RlimitNofile)
        .hard(limit)
        .soft(limit)
        .build()
        .expect("all fields set");
    vec![nofile]
}
