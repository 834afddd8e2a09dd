//! What a CNI operation can fail with.

use std::path::PathBuf;
use std::time::Duration;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// No usable network config (the reason).
    #[error("CNI network not ready: {0}")]
    NoConfig(String),
    #[error("CNI plugin {plugin:?} not found in {}", join_paths(.dirs))]
    PluginNotFound { plugin: String, dirs: Vec<PathBuf> },
    /// A plugin exited non-zero: its CNI error (`code`, `msg`, `details`), or its stderr as
    /// `msg`.
    #[error("CNI plugin {plugin} {command} failed{}: {msg}{}", fmt_code(.code), fmt_details(.details))]
    Plugin {
        plugin: String,
        command: String,
        code: Option<u32>,
        msg: String,
        details: String,
    },
    #[error("CNI plugin {plugin} {command} timed out after {after:?} and was killed")]
    Timeout {
        plugin: String,
        command: String,
        after: Duration,
    },
    #[error("{0}")]
    Io(String),
    /// A plugin printed something that is not a valid result.
    #[error("bad CNI result: {0}")]
    BadResult(String),
    #[error("invalid CNI request: {0}")]
    InvalidRequest(String),
    /// Several errors (DEL runs every plugin).
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Multiple(Vec<CniError>),
}

fn fmt_code(code: &Option<u32>) -> String {
    code.map(|c| format!(" (code {c})")).unwrap_or_default()
}

fn fmt_details(details: &str) -> String {
    if details.is_empty() {
        String::new()
    } else {
        format!(": {details}")
    }
}

fn join_paths(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl CniError {
    pub(crate) fn from_many(mut errors: Vec<CniError>) -> Result<(), CniError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(CniError::Multiple(errors)),
        }
    }
}
